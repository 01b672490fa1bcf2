// Batch normalisation over the N and HW axes of an N×C×HW array. The
// statistics are reduced in two stages so that the whole GPU works even when
// C is small: a (P, C) grid of blocks each sums one slice of a channel into
// partial[(c·P + p)·2 + {0,1}] (or, channels last, P blocks each sum a
// slice of rows for every channel: bn_partial_rows), then a warp per
// channel combines its P partials. Sums are taken of x − shift, shift
// being the channel's first element, which keeps the one-pass variance
// accurate.
//
// With relu set, the output went through a ReLU, fused: y = max(0, γ·x̂ + β
// + residual), and the backward masks dy where y was not positive: y read,
// or, without y, written again from x and the residual as bn_apply writes
// it, rounded to T (passed). Inputs
// hold fewer than 2³¹ elements (checked on the host), so the indices are 32
// bits wide: 64-bit division is many instructions.

// passed is whether the ReLU let element k of channel c through.
template <typename T>
__device__ __forceinline__ bool passed(const T* x, const T* y, const T* res, i64 k, int c, const float* gamma,
                                       const float* beta, const float* mean, const float* invstd) {
    if (y) return ld(y, k) > 0.f;
    float v = (ld(x, k) - mean[c]) * invstd[c] * gamma[c] + beta[c]; // bn_apply's y, before its ReLU
    if (res) v += ld(res, k);
    T r;
    st(&r, 0, v);
    return ld(&r, 0) > 0.f;
}

template <typename T>
__device__ void bn_partial(int N, int C, int HW, int P, const T* x, const T* y, const T* res, const T* dy, const float* gamma,
                           const float* beta, int relu, const float* mean, const float* invstd, float* partial) {
    __shared__ float scratch[32];
    int c = blockIdx.y, p = blockIdx.x;
    unsigned M = (unsigned)N * HW, chunk = (M + P - 1) / P, lo = p * chunk, hi = min(M, lo + chunk);
    float s1 = 0.f, s2 = 0.f;
    if (dy == nullptr) {
        float shift = ld(x, (i64)c * HW);
        for (unsigned j = lo + threadIdx.x; j < hi; j += blockDim.x) {
            unsigned k = (j / HW * C + c) * HW + j % HW;
            float v = ld(x, k) - shift;
            s1 += v;
            s2 += v * v;
        }
    } else {
        // Backward: Σ g and Σ g·x̂, g being dy masked by the ReLU.
        float m = mean[c], is = invstd[c];
        for (unsigned j = lo + threadIdx.x; j < hi; j += blockDim.x) {
            unsigned k = (j / HW * C + c) * HW + j % HW;
            float g = ld(dy, k);
            if (relu && !passed(x, y, res, k, c, gamma, beta, mean, invstd)) g = 0.f;
            s1 += g;
            s2 += g * (ld(x, k) - m) * is;
        }
    }
    s1 = block_sum(s1, scratch);
    s2 = block_sum(s2, scratch);
    if (threadIdx.x == 0) {
        partial[((i64)c * P + p) * 2] = s1;
        partial[((i64)c * P + p) * 2 + 1] = s2;
    }
}

// bn_partial_rows is bn_partial for channels innermost (HW 1: a
// channels-last batch of N rows) with C dividing the block: thread t
// always reads channel t % C, so a warp reads whole rows, contiguous,
// where bn_partial would read one channel's elements C apart. Block p sums
// rows [lo, hi) and then the threads of each channel add theirs.
template <typename T>
__device__ void bn_partial_rows(int N, int C, int P, const T* x, const T* y, const T* res, const T* dy,
                                const float* gamma, const float* beta, int relu, const float* mean,
                                const float* invstd, float* partial) {
    __shared__ float sums[2][1024];
    int t = threadIdx.x, c = t % C, step = blockDim.x / C;
    unsigned chunk = (N + P - 1) / P, lo = blockIdx.x * chunk, hi = min((unsigned)N, lo + chunk);
    float s1 = 0.f, s2 = 0.f;
    if (dy == nullptr) {
        float shift = ld(x, c); // bn_stats' shift: channel c's first element
        for (unsigned r = lo + t / C; r < hi; r += step) {
            float v = ld(x, r * C + c) - shift;
            s1 += v;
            s2 += v * v;
        }
    } else {
        float m = mean[c], is = invstd[c];
        for (unsigned r = lo + t / C; r < hi; r += step) {
            unsigned k = r * C + c;
            float g = ld(dy, k);
            if (relu && !passed(x, y, res, k, c, gamma, beta, mean, invstd)) g = 0.f;
            s1 += g;
            s2 += g * (ld(x, k) - m) * is;
        }
    }
    sums[0][t] = s1;
    sums[1][t] = s2;
    __syncthreads();
    if (t < C) {
        for (int j = t + C; j < blockDim.x; j += C) {
            s1 += sums[0][j];
            s2 += sums[1][j];
        }
        partial[((i64)c * P + blockIdx.x) * 2] = s1;
        partial[((i64)c * P + blockIdx.x) * 2 + 1] = s2;
    }
}

// bn_stats and bn_grads run a warp per channel: lane l adds partials l,
// l+32, ..., then the warp adds its lanes' sums, in a fixed order.
template <typename T>
__device__ void bn_stats(int N, int C, int HW, int P, const T* x, const float* partial, float eps, float momentum,
                         float* mean, float* invstd, float* run_mean, float* run_var) {
    int c = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (c >= C) return; // the whole warp: c is the warp's
    double s1 = 0, s2 = 0;
    for (int p = lane; p < P; p += 32) {
        s1 += partial[((i64)c * P + p) * 2];
        s2 += partial[((i64)c * P + p) * 2 + 1];
    }
    s1 = warp_sum(s1);
    s2 = warp_sum(s2);
    if (lane != 0) return;
    double M = (double)N * HW, shift = ld(x, (i64)c * HW);
    double d = s1 / M, var = fmax(s2 / M - d * d, 0.0), mu = shift + d;
    mean[c] = (float)mu;
    invstd[c] = (float)(1.0 / sqrt(var + eps));
    double unbiased = M > 1 ? var * M / (M - 1) : var;
    run_mean[c] = (float)((1.0 - momentum) * run_mean[c] + momentum * mu);
    run_var[c] = (float)((1.0 - momentum) * run_var[c] + momentum * unbiased);
}

// y = (x − mean)·invstd·γ + β (+ residual) (through the ReLU), or with the
// running statistics in evaluation (mean, var given and invstd null).
template <typename T>
__device__ void bn_apply(int C, int HW, int n, const T* x, const T* res, const float* gamma, const float* beta,
                         const float* mean, const float* invstd, const float* var, float eps, int relu, T* y) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < (unsigned)n; i += gridDim.x * blockDim.x) {
        int c = (int)(i / HW % C);
        float is = invstd ? invstd[c] : rsqrtf(var[c] + eps);
        float v = (ld(x, i) - mean[c]) * is * gamma[c] + beta[c];
        if (res) v += ld(res, i);
        if (relu) v = fmaxf(v, 0.f);
        st(y, i, v);
    }
}

extern "C" __global__ void bn_grads(int C, int P, const float* partial, float* dgamma, float* dbeta) {
    kernel_entry();
    int c = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (c >= C) return;
    float s1 = 0.f, s2 = 0.f;
    for (int p = lane; p < P; p += 32) {
        s1 += partial[((i64)c * P + p) * 2];
        s2 += partial[((i64)c * P + p) * 2 + 1];
    }
    s1 = warp_sum(s1);
    s2 = warp_sum(s2);
    if (lane == 0) {
        dbeta[c] = s1;
        dgamma[c] = s2;
    }
}

// dx = γ·invstd/M · (M·g − dβ − x̂·dγ) and dresidual = g, g being dy masked
// by the ReLU (with relu).
template <typename T>
__device__ void bn_bwd_apply(int N, int C, int HW, int n, const T* x, const T* y, const T* res, const T* dy, const float* gamma,
                             const float* beta, int relu, const float* mean, const float* invstd, const float* dgamma,
                             const float* dbeta, T* dx, T* dres) {
    float M = (float)N * HW;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < (unsigned)n; i += gridDim.x * blockDim.x) {
        int c = (int)(i / HW % C);
        float g = ld(dy, i);
        if (relu && !passed(x, y, res, i, c, gamma, beta, mean, invstd)) g = 0.f;
        float is = invstd[c], xhat = (ld(x, i) - mean[c]) * is;
        st(dx, i, gamma[c] * is / M * (M * g - dbeta[c] - xhat * dgamma[c]));
        if (dres) st(dres, i, g);
    }
}

#define NORM(T, S)                                                                                               \
    extern "C" __global__ void bn_partial_##S(int N, int C, int HW, int P, const T* x, const T* y, const T* res, \
                                              const T* dy, const float* gamma, const float* beta, int relu,      \
                                              const float* mean, const float* invstd, float* partial) {          \
        kernel_entry();                                                                                         \
        bn_partial(N, C, HW, P, x, y, res, dy, gamma, beta, relu, mean, invstd, partial);                       \
    }                                                                                                           \
    extern "C" __global__ void bn_partial_rows_##S(int N, int C, int HW, int P, const T* x, const T* y,        \
                                                   const T* res, const T* dy, const float* gamma,              \
                                                   const float* beta, int relu, const float* mean,             \
                                                   const float* invstd, float* partial) {                      \
        kernel_entry();                                                                                        \
        bn_partial_rows(N, C, P, x, y, res, dy, gamma, beta, relu, mean, invstd, partial);                     \
    }                                                                                                           \
    extern "C" __global__ void bn_stats_##S(int N, int C, int HW, int P, const T* x, const float* partial,      \
                                            float eps, float momentum, float* mean, float* invstd,              \
                                            float* run_mean, float* run_var) {                                  \
        kernel_entry();                                                                                        \
        bn_stats(N, C, HW, P, x, partial, eps, momentum, mean, invstd, run_mean, run_var);                     \
    }                                                                                                           \
    extern "C" __global__ void bn_apply_##S(int C, int HW, int n, const T* x, const T* res, const float* gamma, \
                                            const float* beta, const float* mean, const float* invstd,          \
                                            const float* var, float eps, int relu, T* y) {                      \
        kernel_entry();                                                                                        \
        bn_apply(C, HW, n, x, res, gamma, beta, mean, invstd, var, eps, relu, y);                              \
    }                                                                                                           \
    extern "C" __global__ void bn_bwd_apply_##S(int N, int C, int HW, int n, const T* x, const T* y,           \
                                                const T* res, const T* dy, const float* gamma,                  \
                                                const float* beta, int relu, const float* mean,                 \
                                                const float* invstd, const float* dgamma, const float* dbeta,   \
                                                T* dx, T* dres) {                                               \
        kernel_entry();                                                                                        \
        bn_bwd_apply(N, C, HW, n, x, y, res, dy, gamma, beta, relu, mean, invstd, dgamma, dbeta, dx, dres);    \
    }
FOR_TYPES(NORM)
