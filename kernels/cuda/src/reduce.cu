// Reductions of an (outer, len, inner) array along its middle axis; the
// codes R_SUM, R_MEAN and R_MAX are kernels.ReduceOp's (generated).

// Rows: inner == 1. One block per row; threads stride along the row.
template <typename T>
__device__ void reduce_rows(int op, int outer, int len, const T* x, T* y) {
    __shared__ float scratch[32];
    for (int o = blockIdx.x; o < outer; o += gridDim.x) {
        const T* row = x + (i64)o * len;
        float acc = op == R_MAX ? -INFINITY : 0.f;
        for (int j = threadIdx.x; j < len; j += blockDim.x) {
            float v = ld(row, j);
            acc = op == R_MAX ? fmaxf(acc, v) : acc + v;
        }
        acc = op == R_MAX ? block_max(acc, scratch) : block_sum(acc, scratch);
        if (threadIdx.x == 0) st(y, o, op == R_MEAN ? acc / len : acc);
        __syncthreads();
    }
}

// Columns: inner > 1. One thread per output; consecutive threads read
// consecutive addresses.
template <typename T>
__device__ void reduce_cols(int op, int outer, int len, int inner, const T* x, T* y) {
    GRID_STRIDE(i, (i64)outer * inner) {
        int o = (int)(i / inner), in = (int)(i % inner);
        const T* p = x + (i64)o * len * inner + in;
        float acc = op == R_MAX ? -INFINITY : 0.f;
        for (int j = 0; j < len; j++) {
            float v = ld(p, (i64)j * inner);
            acc = op == R_MAX ? fmaxf(acc, v) : acc + v;
        }
        st(y, i, op == R_MEAN ? acc / len : acc);
    }
}

// Columns split along the axis, for few outputs over a long axis (a bias's
// gradient: 768 sums of 16384 rows): a block of 256 threads takes 32·VEC
// consecutive outputs of one outer index (blockIdx.y), each lane VEC of
// them (VEC = 4 moves 8 or 16 bytes a load; the caller checks that inner
// and x allow it), over one of `splits` stretches of the axis (blockIdx.x:
// tile + tiles·stretch), its eight warps striding the stretch, and writes
// the stretch's partial result to part[split][outer][inner] (F32);
// reduce_cols_finish combines the stretches in order, so the sum is the
// same every run.
template <int VEC, typename T>
__device__ void reduce_cols_part(int op, int outer, int len, int inner, int splits, const T* x, float* part) {
    __shared__ float acc[8][32 * VEC + 1];
    int tiles = (inner + 32 * VEC - 1) / (32 * VEC), tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    int col = blockIdx.x % tiles * 32 * VEC + VEC * tx, o = blockIdx.y, s = blockIdx.x / tiles;
    int stretch = (len + splits - 1) / splits, j0 = s * stretch, j1 = min(len, j0 + stretch);
    float a[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) a[e] = op == R_MAX ? -INFINITY : 0.f;
    if (col < inner) {
        const T* p = x + (i64)o * len * inner + col;
#pragma unroll 4
        for (int j = j0 + ty; j < j1; j += 8) {
            float v[VEC];
            if (VEC == 4)
                ld4(p, (i64)j * inner, v);
            else
                v[0] = ld(p, (i64)j * inner);
#pragma unroll
            for (int e = 0; e < VEC; e++) a[e] = op == R_MAX ? fmaxf(a[e], v[e]) : a[e] + v[e];
        }
    }
#pragma unroll
    for (int e = 0; e < VEC; e++) acc[ty][VEC * tx + e] = a[e];
    __syncthreads();
    if (ty == 0 && col < inner) {
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            for (int r = 1; r < 8; r++) a[e] = op == R_MAX ? fmaxf(a[e], acc[r][VEC * tx + e]) : a[e] + acc[r][VEC * tx + e];
            part[((i64)s * outer + o) * inner + col + e] = a[e];
        }
    }
}

template <typename T>
__device__ void reduce_cols_finish(int op, int outer, int len, int inner, int splits, const float* part, T* y) {
    i64 n = (i64)outer * inner;
    GRID_STRIDE(i, n) {
        float a = op == R_MAX ? -INFINITY : 0.f;
        for (int s = 0; s < splits; s++) {
            float v = part[s * n + i];
            a = op == R_MAX ? fmaxf(a, v) : a + v;
        }
        st(y, i, op == R_MEAN ? a / len : a);
    }
}

template <typename T>
__device__ void reduce_max_bwd(int len, int inner, i64 n, const T* dy, const T* x, const T* y, T* dx) {
    GRID_STRIDE(i, n) {
        i64 o = i / ((i64)len * inner) * inner + i % inner;
        st(dx, i, ld(x, i) == ld(y, o) ? ld(dy, o) : 0.f);
    }
}

template <typename T>
__device__ void argmax(int outer, int len, int inner, const T* x, int* y) {
    GRID_STRIDE(i, (i64)outer * inner) {
        int o = (int)(i / inner), in = (int)(i % inner);
        const T* p = x + (i64)o * len * inner + in;
        float best = -INFINITY;
        int bi = 0;
        for (int j = 0; j < len; j++) {
            float v = ld(p, (i64)j * inner);
            if (v > best) { best = v; bi = j; }
        }
        y[i] = bi;
    }
}

#define REDUCE(T, S)                                                                                         \
    extern "C" __global__ void reduce_rows_##S(int op, int outer, int len, const T* x, T* y) {              \
        reduce_rows(op, outer, len, x, y);                                                                  \
    }                                                                                                       \
    extern "C" __global__ void reduce_cols_##S(int op, int outer, int len, int inner, const T* x, T* y) {   \
        reduce_cols(op, outer, len, inner, x, y);                                                           \
    }                                                                                                       \
    extern "C" __global__ void reduce_cols_part_##S(int op, int outer, int len, int inner, int splits, const T* x,  \
                                                    float* part) {                                          \
        reduce_cols_part<1>(op, outer, len, inner, splits, x, part);                                        \
    }                                                                                                       \
    extern "C" __global__ void reduce_cols_part4_##S(int op, int outer, int len, int inner, int splits,       \
                                                     const T* x, float* part) {                             \
        reduce_cols_part<4>(op, outer, len, inner, splits, x, part);                                        \
    }                                                                                                       \
    extern "C" __global__ void reduce_cols_finish_##S(int op, int outer, int len, int inner, int splits,      \
                                                      const float* part, T* y) {                            \
        reduce_cols_finish(op, outer, len, inner, splits, part, y);                                         \
    }                                                                                                       \
    extern "C" __global__ void reduce_max_bwd_##S(int len, int inner, i64 n, const T* dy, const T* x,      \
                                                  const T* y, T* dx) {                                      \
        reduce_max_bwd(len, inner, n, dy, x, y, dx);                                                        \
    }                                                                                                       \
    extern "C" __global__ void argmax_##S(int outer, int len, int inner, const T* x, int* y) {              \
        argmax(outer, len, inner, x, y);                                                                    \
    }
FOR_TYPES(REDUCE)
