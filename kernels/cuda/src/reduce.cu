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
// gradient: 768 sums of 16384 rows), in one launch: a block of 256 threads
// takes 32·VEC consecutive outputs of one outer index (a tile: blockIdx.x
// % tiles, blockIdx.y), each lane VEC of them (VEC = 4 moves 8 or 16 bytes
// a load; the caller checks that inner and x allow it), over one of
// `splits` stretches of the axis (blockIdx.x / tiles), its eight warps
// striding the stretch, and writes the stretch's partial result to
// part[split][outer][inner] (F32). The tile's last block to finish, counted
// in done[tile] (zero between launches: that block sets it back), combines
// the tile's partials, its warps striding the stretches and their sums
// added in warp order, so that the result is the same every run, and
// writes y, of T or (out_f32) F32. The blocks are as many as the device
// holds at once, eight of 256 threads a multiprocessor (Reduce), which the
// kernels' launch bounds keep within its registers: one wave.
template <int VEC>
__device__ __forceinline__ void cols_add(int op, float* a, const float* v) {
#pragma unroll
    for (int e = 0; e < VEC; e++) a[e] = op == R_MAX ? fmaxf(a[e], v[e]) : a[e] + v[e];
}

// cols_block adds the eight warps' a (each lane's VEC columns) in warp
// order through acc, into warp 0's a; every thread passes the barrier.
template <int VEC>
__device__ __forceinline__ void cols_block(int op, float (*acc)[32 * VEC + 1], float* a, int tx, int ty, bool in) {
#pragma unroll
    for (int e = 0; e < VEC; e++) acc[ty][VEC * tx + e] = a[e];
    __syncthreads();
    if (ty == 0 && in) {
        float v[VEC];
        for (int r = 1; r < 8; r++) {
#pragma unroll
            for (int e = 0; e < VEC; e++) v[e] = acc[r][VEC * tx + e];
            cols_add<VEC>(op, a, v);
        }
    }
}

template <int VEC, typename T>
__device__ void reduce_cols_split(int op, int outer, int len, int inner, int splits, int out_f32, const T* x,
                                  float* part, unsigned* done, void* y) {
    __shared__ float acc[8][32 * VEC + 1];
    __shared__ bool last;
    int tiles = (inner + 32 * VEC - 1) / (32 * VEC), tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    int col = blockIdx.x % tiles * 32 * VEC + VEC * tx, o = blockIdx.y, s = blockIdx.x / tiles;
    int stretch = (len + splits - 1) / splits, j0 = s * stretch, j1 = min(len, j0 + stretch);
    const float init = op == R_MAX ? -INFINITY : 0.f;
    float a[VEC], v[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) a[e] = init;
    if (col < inner) {
        const T* p = x + (i64)o * len * inner + col;
#pragma unroll 4
        for (int j = j0 + ty; j < j1; j += 8) {
            if (VEC == 4)
                ld4(p, (i64)j * inner, v);
            else
                v[0] = ld(p, (i64)j * inner);
            cols_add<VEC>(op, a, v);
        }
    }
    cols_block<VEC>(op, acc, a, tx, ty, col < inner);
    if (ty == 0 && col < inner) {
#pragma unroll
        for (int e = 0; e < VEC; e++) part[((i64)s * outer + o) * inner + col + e] = a[e];
        __threadfence(); // the partials reach L2 before the count does
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* c = done + o * tiles + blockIdx.x % tiles;
        last = atomicAdd(c, 1u) == (unsigned)splits - 1;
        if (last) *c = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
#pragma unroll
    for (int e = 0; e < VEC; e++) a[e] = init;
    if (col < inner) {
#pragma unroll 4
        for (int r = ty; r < splits; r += 8) {
            const float* q = part + ((i64)r * outer + o) * inner + col;
#pragma unroll
            for (int e = 0; e < VEC; e++) v[e] = __ldcg(q + e); // L2: other blocks wrote them
            cols_add<VEC>(op, a, v);
        }
    }
    cols_block<VEC>(op, acc, a, tx, ty, col < inner);
    if (ty == 0 && col < inner) {
        i64 i = (i64)o * inner + col;
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            float r = op == R_MEAN ? a[e] / len : a[e];
            if (out_f32)
                ((float*)y)[i + e] = r;
            else
                st((T*)y, i + e, r);
        }
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
        kernel_entry();                                                                                     \
        reduce_rows(op, outer, len, x, y);                                                                  \
    }                                                                                                       \
    extern "C" __global__ void reduce_cols_##S(int op, int outer, int len, int inner, const T* x, T* y) {   \
        kernel_entry();                                                                                     \
        reduce_cols(op, outer, len, inner, x, y);                                                           \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(256, 8) reduce_cols_split_##S(                             \
        int op, int outer, int len, int inner, int splits, int out_f32, const T* x, float* part,            \
        unsigned* done, void* y) {                                                                          \
        kernel_entry();                                                                                     \
        reduce_cols_split<1>(op, outer, len, inner, splits, out_f32, x, part, done, y);                     \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(256, 8) reduce_cols_split4_##S(                            \
        int op, int outer, int len, int inner, int splits, int out_f32, const T* x, float* part,            \
        unsigned* done, void* y) {                                                                          \
        kernel_entry();                                                                                     \
        reduce_cols_split<4>(op, outer, len, inner, splits, out_f32, x, part, done, y);                     \
    }                                                                                                       \
    extern "C" __global__ void reduce_max_bwd_##S(int len, int inner, i64 n, const T* dy, const T* x,      \
                                                  const T* y, T* dx) {                                      \
        kernel_entry();                                                                                     \
        reduce_max_bwd(len, inner, n, dy, x, y, dx);                                                        \
    }                                                                                                       \
    extern "C" __global__ void argmax_##S(int outer, int len, int inner, const T* x, int* y) {              \
        kernel_entry();                                                                                     \
        argmax(outer, len, inner, x, y);                                                                    \
    }
FOR_TYPES(REDUCE)
