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
    extern "C" __global__ void reduce_max_bwd_##S(int len, int inner, i64 n, const T* dy, const T* x,      \
                                                  const T* y, T* dx) {                                      \
        reduce_max_bwd(len, inner, n, dy, x, y, dx);                                                        \
    }                                                                                                       \
    extern "C" __global__ void argmax_##S(int outer, int len, int inner, const T* x, int* y) {              \
        argmax(outer, len, inner, x, y);                                                                    \
    }
FOR_TYPES(REDUCE)
