// Elementwise kernels: unary functions and their backwards, affine, and
// binary operations with broadcasting.

// unary_f, unary_grad and binary_f are generated from package kernels'
// tables (source.go).

template <typename T>
__device__ void unary(int op, i64 n, const T* x, T* y) {
    if (n % 4 == 0 && vec4(x) && vec4(y)) {
        GRID_STRIDE(j, n / 4) {
            float v[4];
            ld4(x, 4 * j, v);
            for (int e = 0; e < 4; e++) v[e] = unary_f(op, v[e]);
            st4(y, 4 * j, v);
        }
        return;
    }
    GRID_STRIDE(i, n) st(y, i, unary_f(op, ld(x, i)));
}

// x or y may be null when op's derivative does not use it.
template <typename T>
__device__ void unary_bwd(int op, i64 n, const T* dy, const T* x, const T* y, T* dx) {
    if (n % 4 == 0 && vec4(dy) && vec4(dx) && (!x || vec4(x)) && (!y || vec4(y))) {
        GRID_STRIDE(j, n / 4) {
            float d[4], xv[4] = {0.f, 0.f, 0.f, 0.f}, yv[4] = {0.f, 0.f, 0.f, 0.f};
            ld4(dy, 4 * j, d);
            if (x) ld4(x, 4 * j, xv);
            if (y) ld4(y, 4 * j, yv);
            for (int e = 0; e < 4; e++) d[e] = unary_grad(op, d[e], xv[e], yv[e]);
            st4(dx, 4 * j, d);
        }
        return;
    }
    GRID_STRIDE(i, n) {
        float xv = x ? ld(x, i) : 0.f, yv = y ? ld(y, i) : 0.f;
        st(dx, i, unary_grad(op, ld(dy, i), xv, yv));
    }
}

template <typename T>
__device__ void affine(i64 n, const T* x, T* y, float alpha, float beta) {
    GRID_STRIDE(i, n) st(y, i, alpha * ld(x, i) + beta);
}

// Bcast (generated from Go's bcast) is kernels.Broadcast: output shape and
// per-input element strides (0 along broadcast dimensions), at most
// MAX_DIMS collapsed dimensions.

// bcast_offsets is where output element i reads a and b under bc.
__device__ __forceinline__ void bcast_offsets(const Bcast& bc, int i, int& oa, int& ob) {
    oa = ob = 0;
    for (int d = bc.ndim - 1; d >= 0; d--) {
        int k = i % bc.shape[d];
        i /= bc.shape[d];
        oa += k * bc.sa[d];
        ob += k * bc.sb[d];
    }
}

template <typename T>
__device__ void binary(int op, i64 n, Bcast bc, const T* a, const T* b, T* y) {
    if (bc.ndim == 1 && bc.sa[0] == 1 && bc.sb[0] == 1) {
        if (n % 4 == 0 && vec4(a) && vec4(b) && vec4(y)) {
            GRID_STRIDE(j, n / 4) {
                float va[4], vb[4];
                ld4(a, 4 * j, va);
                ld4(b, 4 * j, vb);
                for (int e = 0; e < 4; e++) va[e] = binary_f(op, va[e], vb[e]);
                st4(y, 4 * j, va);
            }
            return;
        }
        GRID_STRIDE(i, n) st(y, i, binary_f(op, ld(a, i), ld(b, i)));
        return;
    }
    if (bc.ndim == 2) { // a linear layer's bias, a row's scale, a position embedding over the batch
        // Blocks stride over tiles of a row (a block's threads along one
        // tile), so that a few long rows (the batch of a broadcast [T, C])
        // spread over the whole grid as many short ones do; one division a
        // tile.
        int rows = bc.shape[0], cols = bc.shape[1];
        if (cols % 4 == 0 && bc.sa[1] == 1 && bc.sb[1] == 1 && bc.sa[0] % 4 == 0 && bc.sb[0] % 4 == 0 && vec4(a) && vec4(b) && vec4(y)) {
            int span = 4 * blockDim.x, tiles = (cols + span - 1) / span;
            for (i64 t = blockIdx.x; t < (i64)rows * tiles; t += gridDim.x) {
                int r = (int)(t / tiles), c = (int)(t % tiles) * span + 4 * threadIdx.x;
                if (c < cols) {
                    float va[4], vb[4];
                    ld4(a, (i64)r * bc.sa[0] + c, va);
                    ld4(b, (i64)r * bc.sb[0] + c, vb);
                    for (int e = 0; e < 4; e++) va[e] = binary_f(op, va[e], vb[e]);
                    st4(y, (i64)r * cols + c, va);
                }
            }
            return;
        }
        int span = blockDim.x, tiles = (cols + span - 1) / span;
        for (i64 t = blockIdx.x; t < (i64)rows * tiles; t += gridDim.x) {
            int r = (int)(t / tiles), c = (int)(t % tiles) * span + threadIdx.x;
            if (c < cols)
                st(y, (i64)r * cols + c,
                   binary_f(op, ld(a, (i64)r * bc.sa[0] + (i64)c * bc.sa[1]), ld(b, (i64)r * bc.sb[0] + (i64)c * bc.sb[1])));
        }
        return;
    }
    GRID_STRIDE(i, n) {
        int oa, ob;
        bcast_offsets(bc, (int)i, oa, ob);
        st(y, i, binary_f(op, ld(a, oa), ld(b, ob)));
    }
}

// binary_mixed is binary for an F32 a and y and a b of T, read as stored
// (no F32 copy of it first); with swap, y = b op a. A 16-bit residual
// branch added to an F32 stream is one pass.
template <typename T>
__device__ void binary_mixed(int op, int swap, i64 n, Bcast bc, const float* a, const T* b, float* y) {
    if (bc.ndim == 1 && bc.sa[0] == 1 && bc.sb[0] == 1 && n % 4 == 0 && vec4(a) && vec4(b) && vec4(y)) {
        GRID_STRIDE(j, n / 4) {
            float va[4], vb[4];
            ld4(a, 4 * j, va);
            ld4(b, 4 * j, vb);
            for (int e = 0; e < 4; e++) va[e] = swap ? binary_f(op, vb[e], va[e]) : binary_f(op, va[e], vb[e]);
            st4(y, 4 * j, va);
        }
        return;
    }
    GRID_STRIDE(i, n) {
        int oa, ob;
        bcast_offsets(bc, (int)i, oa, ob);
        float x = a[oa], z = ld(b, ob);
        y[i] = swap ? binary_f(op, z, x) : binary_f(op, x, z);
    }
}

#define ELEMENTWISE(T, S)                                                                                   \
    extern "C" __global__ void unary_##S(int op, i64 n, const T* x, T* y) {                                 \
        kernel_entry();                                                                                     \
        unary(op, n, x, y);                                                                                 \
    }                                                                                                       \
    extern "C" __global__ void unary_bwd_##S(int op, i64 n, const T* dy, const T* x, const T* y, T* dx) {   \
        kernel_entry();                                                                                     \
        unary_bwd(op, n, dy, x, y, dx);                                                                     \
    }                                                                                                       \
    extern "C" __global__ void affine_##S(i64 n, const T* x, T* y, float alpha, float beta) {               \
        kernel_entry();                                                                                     \
        affine(n, x, y, alpha, beta);                                                                       \
    }                                                                                                       \
    extern "C" __global__ void binary_##S(int op, i64 n, Bcast bc, const T* a, const T* b, T* y) {          \
        kernel_entry();                                                                                     \
        binary(op, n, bc, a, b, y);                                                                         \
    }                                                                                                       \
    extern "C" __global__ void binary_mixed_##S(int op, int swap, i64 n, Bcast bc, const float* a, const T* b, \
                                                float* y) {                                                 \
        kernel_entry();                                                                                     \
        binary_mixed(op, swap, n, bc, a, b, y);                                                             \
    }
FOR_TYPES(ELEMENTWISE)
