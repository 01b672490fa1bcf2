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

// ---- layer norm: a warp per row ----

// Rows of up to LN_REG_COLS columns (the prelude's, Go's lnRegCols) the
// layer-norm kernels keep in registers: 32 values a lane at most.
// Blocks of LN_WARPS warps each multiprocessor should hold, the registers
// each kernel may take following from them: both the prelude's (Go's
// lnWarps and lnBlocksPerSM, which size the grid).
#define LN_FWD_BLOCKS LN_BLOCKS
#define LN_BWD_BLOCKS LN_BLOCKS

// LN_REG runs CALL(VEC, PER) for a row of cols ≤ LN_REG_COLS held in
// registers, PER groups of VEC columns a lane: VEC = 4 where vec allows
// it, with PER the least of 2, 4, 6 or 8 that holds the row, so that a
// shorter row takes fewer registers (GPT-2 small's 768 columns: 6).
#define LN_REG(cols, vec, CALL)         \
    do {                                \
        if (!(vec))                     \
            CALL(1, LN_REG_COLS / 32);  \
        else if ((cols) <= 256)         \
            CALL(4, 2);                 \
        else if ((cols) <= 512)         \
            CALL(4, 4);                 \
        else if ((cols) <= 768)         \
            CALL(4, 6);                 \
        else                            \
            CALL(4, 8);                 \
    } while (0)

// ldv and stv move VEC (1 or 4) consecutive elements, as ld/st or ld4/st4.
template <int VEC, typename T> __device__ __forceinline__ void ldv(const T* p, i64 i, float* v) {
    if (VEC == 4)
        ld4(p, i, v);
    else
        v[0] = ld(p, i);
}
template <int VEC, typename T> __device__ __forceinline__ void stv(T* p, i64 i, const float* v) {
    if (VEC == 4)
        st4(p, i, v);
    else
        st(p, i, v[0]);
}

// The row in registers, read once: lane l holds the columns VEC·(l + 32k)
// .. +VEC−1, k < PER (LN_REG). VEC = 4 moves 16 bytes of F32 a load where
// the rows allow (the caller checks); VEC = 1 adds in the same order as
// the longer rows' loop.
template <int VEC, int PER, typename T, typename O>
__device__ void layernorm_fwd_reg(int rows, int cols, const T* x, const float* g, const float* b, float eps, O* y,
                                  float* mean, float* rstd) {
    int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int r = blockIdx.x * warps + (threadIdx.x >> 5); r < rows; r += gridDim.x * warps) {
        const T* xr = x + (i64)r * cols;
        float v[PER][VEC], s = 0.f;
#pragma unroll
        for (int k = 0; k < PER; k++) {
            int j = VEC * (lane + 32 * k);
            if (j < cols) {
                ldv<VEC>(xr, j, v[k]);
#pragma unroll
                for (int e = 0; e < VEC; e++) s += v[k][e];
            }
        }
        float m = warp_sum(s) / cols, q = 0.f;
#pragma unroll
        for (int k = 0; k < PER; k++)
            if (VEC * (lane + 32 * k) < cols)
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    float d = v[k][e] - m;
                    q += d * d;
                }
        float is = rsqrtf(warp_sum(q) / cols + eps);
#pragma unroll
        for (int k = 0; k < PER; k++) {
            int j = VEC * (lane + 32 * k);
            if (j < cols) {
                float gg[VEC], bb[VEC], o[VEC];
                ldv<VEC>(g, j, gg);
                ldv<VEC>(b, j, bb);
#pragma unroll
                for (int e = 0; e < VEC; e++) o[e] = (v[k][e] - m) * is * gg[e] + bb[e];
                stv<VEC>(y, (i64)r * cols + j, o);
            }
        }
        if (lane == 0) {
            mean[r] = m;
            rstd[r] = is;
        }
    }
}

// y may be of a narrower type O than x (an F32 x normalised for a product
// that reads F16 or BF16): one rounding of the F32 result, as a cast of it.
template <typename T, typename O>
__device__ void layernorm_fwd(int rows, int cols, const T* x, const float* g, const float* b, float eps, O* y,
                              float* mean, float* rstd) {
    if (cols <= LN_REG_COLS) {
#define LN_FWD(VEC, PER) layernorm_fwd_reg<VEC, PER>(rows, cols, x, g, b, eps, y, mean, rstd)
        LN_REG(cols, cols % 4 == 0 && vec4(x) && vec4(y) && vec4(g) && vec4(b), LN_FWD);
#undef LN_FWD
        return;
    }
    int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int r = blockIdx.x * warps + (threadIdx.x >> 5); r < rows; r += gridDim.x * warps) {
        const T* xr = x + (i64)r * cols;
        float s = 0.f;
        for (int j = lane; j < cols; j += 32) s += ld(xr, j);
        float m = warp_sum(s) / cols;
        float v = 0.f;
        for (int j = lane; j < cols; j += 32) {
            float d = ld(xr, j) - m;
            v += d * d;
        }
        float is = rsqrtf(warp_sum(v) / cols + eps);
        for (int j = lane; j < cols; j += 32) st(y, (i64)r * cols + j, (ld(xr, j) - m) * is * g[j] + b[j]);
        if (lane == 0) {
            mean[r] = m;
            rstd[r] = is;
        }
    }
}

// block_rows writes to out the sums of the block's n rows of cols floats
// in red (shared), each column's added in order.
__device__ __forceinline__ void block_rows(const float* red, int n, int cols, float* out) {
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float s = 0.f;
        for (int w = 0; w < n; w++) s += red[w * cols + j];
        out[j] = s;
    }
}

// dx = rstd·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂)), ĝ = dy·γ; each warp adds its rows'
// dy·x̂ and dy (and, with SUMS, kernels.LayerNormParams.Sums, dx as
// written) into sums of its own, which layernorm_grads adds up in order.
// Rows of up to LN_REG_COLS columns keep a warp's sums in registers (the
// columns as layernorm_fwd_reg's; dx's in shared memory, red, the
// registers being taken), and the block adds its warps' in order in red
// into its own row of partial (2·cols floats, 3·cols with SUMS). Longer
// rows add into a row of partial a warp, row by row. dy is of the
// forward's output type O. With acc (an F32 dx,
// kernels.LayerNormParams.Accumulate) dx becomes dx + the row's gradient,
// rounded as that separate addition would be (__fadd_rn: no multiply-add
// contracted into it); with four columns a load, the row's dx is loaded
// before its sums, so that the load waits beside the row's own (a value a
// load, PER is 32, and the row's dx is loaded where it is added). With rnd
// (kernels.LayerNormParams.Rounded) dx as written is also written rounded
// to O.
template <int VEC, int PER, bool SUMS, typename T, typename O>
__device__ void layernorm_bwd_reg(int rows, int cols, const T* x, const float* g, const float* mean, const float* rstd,
                                  const O* dy, T* dx, float* partial, int acc, O* rnd, float* red) {
    int lane = threadIdx.x & 31, warps = blockDim.x >> 5, warp = threadIdx.x >> 5;
    int w = blockIdx.x * warps + warp;
    float* pd = red + warp * cols; // the warp's sums of dx
    float pg[PER][VEC], pb[PER][VEC];
#pragma unroll
    for (int k = 0; k < PER; k++) {
        int j = VEC * (lane + 32 * k);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            pg[k][e] = pb[k][e] = 0.f;
            if (SUMS && j < cols) pd[j + e] = 0.f;
        }
    }
    for (int r = w; r < rows; r += gridDim.x * warps) {
        const T* xr = x + (i64)r * cols;
        const O* gr = dy + (i64)r * cols;
        float m = mean[r], is = rstd[r];
        float sg = 0.f, sgx = 0.f;
        constexpr bool early = VEC == 4;
        float prev[early ? PER : 1][VEC];
        if (early && acc) {
#pragma unroll
            for (int k = 0; k < PER; k++) {
                int j = VEC * (lane + 32 * k);
                if (j < cols) ldv<VEC>(dx, (i64)r * cols + j, prev[k]);
            }
        }
#pragma unroll
        for (int k = 0; k < PER; k++) {
            int j = VEC * (lane + 32 * k);
            if (j < cols) {
                float xv[VEC], d[VEC], gg[VEC];
                ldv<VEC>(xr, j, xv);
                ldv<VEC>(gr, j, d);
                ldv<VEC>(g, j, gg);
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    float xh = (xv[e] - m) * is, gh = d[e] * gg[e];
                    sg += gh;
                    sgx += gh * xh;
                    pg[k][e] += d[e] * xh;
                    pb[k][e] += d[e];
                }
            }
        }
        float mg = warp_sum(sg) / cols, mgx = warp_sum(sgx) / cols;
        // The row again (from the cache): keeping it would cost the
        // registers that let two blocks share a multiprocessor.
#pragma unroll
        for (int k = 0; k < PER; k++) {
            int j = VEC * (lane + 32 * k);
            if (j < cols) {
                float xv[VEC], d[VEC], gg[VEC], o[VEC];
                ldv<VEC>(xr, j, xv);
                ldv<VEC>(gr, j, d);
                ldv<VEC>(g, j, gg);
#pragma unroll
                for (int e = 0; e < VEC; e++) o[e] = is * (d[e] * gg[e] - mg - (xv[e] - m) * is * mgx);
                if (acc) {
                    float* pv = prev[early ? k : 0];
                    if (!early) ldv<VEC>(dx, (i64)r * cols + j, pv);
#pragma unroll
                    for (int e = 0; e < VEC; e++) o[e] = __fadd_rn(pv[e], o[e]);
                }
                stv<VEC>(dx, (i64)r * cols + j, o);
                if (rnd) stv<VEC>(rnd, (i64)r * cols + j, o);
                if (SUMS)
#pragma unroll
                    for (int e = 0; e < VEC; e++) pd[j + e] += o[e];
            }
        }
    }
    // The block's sums: dx's already in red, then dy·x̂'s and dy's put
    // there in turn, each added over the warps in order.
    float* pw = partial + (i64)blockIdx.x * (SUMS ? 3 : 2) * cols;
    if (SUMS) {
        __syncthreads();
        block_rows(red, warps, cols, pw + 2 * cols);
    }
#pragma unroll
    for (int set = 0; set < 2; set++) {
        __syncthreads(); // red's rows are read
#pragma unroll
        for (int k = 0; k < PER; k++) {
            int j = VEC * (lane + 32 * k);
            if (j < cols)
#pragma unroll
                for (int e = 0; e < VEC; e++) pd[j + e] = set == 0 ? pg[k][e] : pb[k][e];
        }
        __syncthreads();
        block_rows(red, warps, cols, pw + set * cols);
    }
}

template <typename T, typename O>
__device__ void layernorm_bwd(int rows, int cols, const T* x, const float* g, const float* mean, const float* rstd,
                              const O* dy, T* dx, float* partial, int acc, O* rnd, int sums) {
    if (cols <= LN_REG_COLS) {
        __shared__ float red[LN_WARPS * LN_REG_COLS]; // a row of cols a warp (layernorm_bwd_reg)
#define LN_BWD(VEC, PER)                                                                                       \
    do {                                                                                                       \
        if (sums)                                                                                              \
            layernorm_bwd_reg<VEC, PER, true>(rows, cols, x, g, mean, rstd, dy, dx, partial, acc, rnd, red);  \
        else                                                                                                    \
            layernorm_bwd_reg<VEC, PER, false>(rows, cols, x, g, mean, rstd, dy, dx, partial, acc, rnd, red); \
    } while (0)
        LN_REG(cols, cols % 4 == 0 && vec4(x) && vec4(dy) && vec4(dx) && vec4(g) && (!rnd || vec4(rnd)), LN_BWD);
#undef LN_BWD
        return;
    }
    int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    int w = blockIdx.x * warps + (threadIdx.x >> 5);
    float* pg = partial + (i64)w * (sums ? 3 : 2) * cols;
    float* pb = pg + cols;
    float* pd = pb + cols;
    for (int j = lane; j < cols; j += 32) {
        pg[j] = pb[j] = 0.f;
        if (sums) pd[j] = 0.f;
    }
    for (int r = w; r < rows; r += gridDim.x * warps) {
        const T* xr = x + (i64)r * cols;
        const O* gr = dy + (i64)r * cols;
        float m = mean[r], is = rstd[r];
        float sg = 0.f, sgx = 0.f;
        for (int j = lane; j < cols; j += 32) {
            float xh = (ld(xr, j) - m) * is, d = ld(gr, j), gh = d * g[j];
            sg += gh;
            sgx += gh * xh;
            pg[j] += d * xh;
            pb[j] += d;
        }
        float mg = warp_sum(sg) / cols, mgx = warp_sum(sgx) / cols;
        for (int j = lane; j < cols; j += 32) {
            float xh = (ld(xr, j) - m) * is, o = is * (ld(gr, j) * g[j] - mg - xh * mgx);
            i64 at = (i64)r * cols + j;
            o = acc ? __fadd_rn(ld(dx, at), o) : o;
            st(dx, at, o);
            if (rnd) st(rnd, at, o);
            if (sums) pd[j] += o;
        }
    }
}

// layernorm_grads adds the rows of partial sums (partial: sets·cols floats
// a row, dγ's, dβ's and, with three sets, dx's; rows of them) a stretch at
// a time: block (x, y) sums 32 columns over the rows y·rows/splits.. into
// row y of dg, db and ds (stride floats apart): the stretches' sums side by
// side (dg, db and ds the parts of rows of sets·cols), or with one stretch
// the gradients themselves. Its eight warps take every eighth row, then the
// eight sums are added in order.
extern "C" __global__ void layernorm_grads(int rows, int cols, int splits, int sets, const float* partial, float* dg,
                                           float* db, float* ds, int stride) {
    kernel_entry();
    __shared__ float acc[3][8][33];
    int tx = threadIdx.x % 32, ty = threadIdx.x / 32, j = blockIdx.x * 32 + tx, y = blockIdx.y;
    int w0 = (int)((i64)y * rows / splits), w1 = (int)((i64)(y + 1) * rows / splits);
    float sg = 0.f, sb = 0.f, sd = 0.f;
    if (j < cols) {
        for (int w = w0 + ty; w < w1; w += 8) {
            const float* pw = partial + (i64)w * sets * cols + j;
            sg += pw[0];
            sb += pw[cols];
            if (sets == 3) sd += pw[2 * cols];
        }
    }
    acc[0][ty][tx] = sg;
    acc[1][ty][tx] = sb;
    acc[2][ty][tx] = sd;
    __syncthreads();
    if (ty == 0 && j < cols) {
        for (int r = 1; r < 8; r++) {
            sg += acc[0][r][tx];
            sb += acc[1][r][tx];
            sd += acc[2][r][tx];
        }
        dg[(i64)y * stride + j] = sg;
        db[(i64)y * stride + j] = sb;
        if (sets == 3) ds[(i64)y * stride + j] = sd;
    }
}

#define LAYERNORM(T, S)                                                                                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * LN_WARPS, LN_FWD_BLOCKS) layernorm_fwd_##S(int rows, int cols, const T* x, const float* g, const float* b, \
                                                 float eps, T* y, float* mean, float* rstd) {                                                                    \
        kernel_entry();                                                                                                                                          \
        layernorm_fwd(rows, cols, x, g, b, eps, y, mean, rstd);                                                                                                  \
    }                                                                                                                                                            \
    extern "C" __global__ void __launch_bounds__(32 * LN_WARPS, LN_BWD_BLOCKS) layernorm_bwd_##S(int rows, int cols, const T* x, const float* g,                 \
                                                 const float* mean, const float* rstd, const T* dy, T* dx,                                                       \
                                                 float* partial, int acc, T* rnd, int sums) {                                                                    \
        kernel_entry();                                                                                                                                          \
        layernorm_bwd(rows, cols, x, g, mean, rstd, dy, dx, partial, acc, rnd, sums);                                                                            \
    }                                                                                                                                                            \
    extern "C" __global__ void __launch_bounds__(32 * LN_WARPS, LN_FWD_BLOCKS) layernorm_fwd_mixed_##S(int rows, int cols, const float* x, const float* g,       \
                                                       const float* b, float eps, T* y, float* mean, float* rstd) {                                              \
        kernel_entry();                                                                                                                                          \
        layernorm_fwd(rows, cols, x, g, b, eps, y, mean, rstd);                                                                                                  \
    }                                                                                                                                                            \
    extern "C" __global__ void __launch_bounds__(32 * LN_WARPS, LN_BWD_BLOCKS) layernorm_bwd_mixed_##S(int rows, int cols, const float* x, const float* g,       \
                                                       const float* mean, const float* rstd, const T* dy,                                                        \
                                                       float* dx, float* partial, int acc, T* rnd, int sums) {                                                   \
        kernel_entry();                                                                                                                                          \
        layernorm_bwd(rows, cols, x, g, mean, rstd, dy, dx, partial, acc, rnd, sums);                                                                            \
    }
FOR_TYPES(LAYERNORM)
