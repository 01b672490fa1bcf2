// Multi-tensor optimiser and AMP kernels: one launch updates up to MT_MAX
// tensors. blockIdx.y picks the tensor, blocks along x stride over it. The
// list (struct TensorList, generated from Go's tensorList: n[MT_MAX],
// p[4][MT_MAX], count) travels by value as a kernel parameter (1.3 KB,
// under the 4 KB limit).

// The learning rate, the loss scale, the skip flag and AdamW's step count are
// read on the device, so that a captured step replays with their current
// values: nothing of the update is decided on the host.

// p[0] params, p[1] grads, p[2] momentum buffers (unused when momentum is 0).
extern "C" __global__ void sgd_multi(TensorList L, const float* lr_p, float momentum, float dampening, float wd,
                                     int nesterov, int first, const float* skip) {
    kernel_entry();
    if (skip && *skip != 0.f) return;
    float lr = *lr_p;
    MT_LOOP(L, t, i) {
        float p = L.p[0][t][i], d = L.p[1][t][i] + wd * p;
        if (momentum != 0.f) {
            float* buf = L.p[2][t];
            float b = first ? d : momentum * buf[i] + (1.f - dampening) * d;
            buf[i] = b;
            d = nesterov ? d + momentum * b : b;
        }
        L.p[0][t][i] = p - lr * d;
    }
}

// p[0] params, p[1] grads, p[2] first moments, p[3] second moments. The bias
// corrections are computed in double from the step count, as the CPU does.
// adamw_step updates one element, every rounding pinned (the _rn
// intrinsics are never contracted into FMAs), so that the four-wide path
// and the one-at-a-time path give the same bits whatever the tensors'
// alignment (a sharded optimiser's pieces start anywhere), and the CPU's.
__device__ __forceinline__ void adamw_step(float& p, float g, float& m, float& v, float decay, float beta1, float beta2,
                                           float step_size, float bc2_sqrt, float eps) {
    p = __fmul_rn(p, decay);
    m = __fadd_rn(__fmul_rn(beta1, m), __fmul_rn(1.f - beta1, g));
    v = __fadd_rn(__fmul_rn(beta2, v), __fmul_rn(__fmul_rn(1.f - beta2, g), g));
    p = __fsub_rn(p, __fdiv_rn(__fmul_rn(step_size, m), __fadd_rn(__fdiv_rn(__fsqrt_rn(v), bc2_sqrt), eps)));
}

// adamw_consts are an AdamW step's constants, from the learning rate, the
// step count and the gradient multiplier read on the device, rounded as the
// CPU rounds them.
struct adamw_consts {
    bool scaled;
    float gs, step_size, bc2_sqrt, decay;
    __device__ adamw_consts(const float* lr_p, float beta1, float beta2, float wd, const long long* step, const float* gscale) {
        scaled = gscale != 0;
        gs = scaled ? *gscale : 1.f;
        float lr = *lr_p;
        double steps = (double)*step;
        step_size = (float)((double)lr / (1.0 - pow((double)beta1, steps)));
        bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, steps));
        decay = __fsub_rn(1.f, __fmul_rn(lr, wd));
    }
};

extern "C" __global__ void adamw_multi(TensorList L, const float* lr_p, float beta1, float beta2, float eps, float wd,
                                       const long long* step, const float* skip, const float* gscale) {
    kernel_entry();
    if (skip && *skip != 0.f) return;
    adamw_consts c(lr_p, beta1, beta2, wd, step, gscale);
    bool scaled = c.scaled;
    float gs = c.gs, step_size = c.step_size, bc2_sqrt = c.bc2_sqrt, decay = c.decay;
    int t = blockIdx.y;
    if (t >= L.count) return;
    float *P = L.p[0][t], *G = L.p[1][t], *M = L.p[2][t], *V = L.p[3][t];
    i64 n = L.n[t], n4 = vec4(P) && vec4(G) && vec4(M) && vec4(V) ? n / 4 : 0;
    i64 first = (i64)blockIdx.x * blockDim.x + threadIdx.x, stride = (i64)gridDim.x * blockDim.x;
    // Four elements an access where the tensors allow.
    for (i64 j = first; j < n4; j += stride) {
        float p[4], g[4], m[4], v[4];
        ld4(P, 4 * j, p), ld4(G, 4 * j, g), ld4(M, 4 * j, m), ld4(V, 4 * j, v);
        if (scaled)
            for (int e = 0; e < 4; e++) g[e] = __fmul_rn(g[e], gs);
        for (int e = 0; e < 4; e++) adamw_step(p[e], g[e], m[e], v[e], decay, beta1, beta2, step_size, bc2_sqrt, eps);
        st4(M, 4 * j, m), st4(V, 4 * j, v), st4(P, 4 * j, p);
    }
    for (i64 i = 4 * n4 + first; i < n; i += stride) {
        float p = P[i], m = M[i], v = V[i];
        adamw_step(p, scaled ? __fmul_rn(G[i], gs) : G[i], m, v, decay, beta1, beta2, step_size, bc2_sqrt, eps);
        M[i] = m, V[i] = v, P[i] = p;
    }
}

// p[0] grads: divided by the scale in place; found[0] set to 1 on any inf or NaN.
extern "C" __global__ void unscale_multi(TensorList L, const float* scale, float* found) {
    kernel_entry();
    float inv_scale = 1.f / *scale;
    MT_LOOP(L, t, i) {
        float g = L.p[0][t][i] * inv_scale;
        L.p[0][t][i] = g;
        if (!isfinite(g)) found[0] = 1.f;
    }
}

// torch's _amp_update_scale_, one thread: back off on inf/NaN (and count the
// skipped step), else grow after `interval` clean steps in a row.
extern "C" __global__ void update_scale(float* scale, int* tracker, const float* found, float* skipped, float growth,
                                        float backoff, int interval) {
    kernel_entry();
    if (*found != 0.f) {
        *scale *= backoff;
        *tracker = 0;
        *skipped += 1.f;
        return;
    }
    int t = *tracker + 1;
    if (t >= interval) {
        *scale *= growth;
        t = 0;
    }
    *tracker = t;
}

// counter += n unless the flag is set.
extern "C" __global__ void increment(long long* counter, long long n, const float* unless) {
    kernel_entry();
    if (unless && *unless != 0.f) return;
    *counter += n;
}

// ---- the gradient-norm clip ----

// partial[(base + t)·GX + blockIdx.x] = Σ g² over this block's share of
// tensor t of the list (GX = gridDim.x), four elements a load where the
// tensor allows.
extern "C" __global__ void sumsq_multi(TensorList L, int base, float* partial) {
    kernel_entry();
    __shared__ float scratch[32];
    int t = blockIdx.y;
    if (t >= L.count) return;
    const float* G = L.p[0][t];
    i64 n = L.n[t], n4 = vec4(G) ? n / 4 : 0;
    i64 first = (i64)blockIdx.x * blockDim.x + threadIdx.x, stride = (i64)gridDim.x * blockDim.x;
    float s = 0.f;
    for (i64 j = first; j < n4; j += stride) {
        float g[4];
        ld4(G, 4 * j, g);
        s += g[0] * g[0] + g[1] * g[1] + g[2] * g[2] + g[3] * g[3];
    }
    for (i64 i = 4 * n4 + first; i < n; i += stride) s += G[i] * G[i];
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) partial[(i64)(base + t) * gridDim.x + blockIdx.x] = s;
}

// out = Σ partial[0..n) in double and a fixed order: each of the
// gridDim.x blocks sums its stretch of partial into stretch[blockIdx.x],
// and the last block to finish (counted in *done, which it sets back to
// zero) adds the stretches in order.
__device__ double block_sum_double(double v, double* sd) {
    sd[threadIdx.x] = v;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) sd[threadIdx.x] += sd[threadIdx.x + o];
        __syncthreads();
    }
    return sd[0];
}

extern "C" __global__ void sumsq_finish(int n, const float* partial, double* stretch, unsigned* done, float* out) {
    kernel_entry();
    __shared__ double sd[THREADS];
    __shared__ bool last;
    int per = (n + gridDim.x - 1) / gridDim.x, lo = blockIdx.x * per, hi = min(n, lo + per);
    double s = 0.0;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) s += partial[i];
    s = block_sum_double(s, sd);
    if (threadIdx.x == 0) {
        stretch[blockIdx.x] = s;
        __threadfence();
        last = atomicAdd(done, 1u) == gridDim.x - 1;
        if (last) *done = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    s = 0.0;
    for (int b0 = 0; b0 < gridDim.x; b0 += blockDim.x) { // the stretches through shared memory, added by one thread
        int b = b0 + threadIdx.x;
        sd[threadIdx.x] = b < gridDim.x ? __ldcg(stretch + b) : 0.0;
        __syncthreads();
        if (threadIdx.x == 0)
            for (int k = 0; k < min((int)blockDim.x, (int)gridDim.x - b0); k++) s += sd[k];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = (float)s;
}

// norm = √sumsq, coef = min(1, maxnorm/(norm+1e-6)), a NaN norm giving a
// NaN coefficient as torch's (one thread).
extern "C" __global__ void clip_coef(const float* sumsq, float maxnorm, float* norm, float* coef) {
    kernel_entry();
    float nm = (float)sqrt((double)sumsq[0]);
    float c = maxnorm / (nm + 1e-6f);
    norm[0] = nm;
    coef[0] = isnan(c) ? c : fminf(c, 1.f);
}

// The norm of gradients still multiplied by the scale (null: 1), the
// multiplier an update reads them with (the clip coefficient over the
// scale, no clip for maxnorm 0), and the inf check.
extern "C" __global__ void unscale_clip(const float* sumsq, const float* scale, float maxnorm, float* norm, float* mult,
                                        float* found) {
    kernel_entry();
    float s = scale ? *scale : 1.f;
    float ss = sumsq[0];
    float nm = __fdiv_rn((float)sqrt((double)ss), s);
    float c = 1.f;
    if (maxnorm > 0.f) {
        c = maxnorm / (nm + 1e-6f);
        c = isnan(c) ? c : fminf(c, 1.f);
    }
    norm[0] = nm;
    mult[0] = __fdiv_rn(c, s);
    if (found && !isfinite(ss)) found[0] = 1.f;
}

extern "C" __global__ void scale_multi(TensorList L, const float* coef) {
    kernel_entry();
    float c = *coef;
    if (c == 1.f) return;
    int t = blockIdx.y;
    if (t >= L.count) return;
    float* P = L.p[0][t];
    i64 n = L.n[t], n4 = vec4(P) ? n / 4 : 0;
    i64 first = (i64)blockIdx.x * blockDim.x + threadIdx.x, stride = (i64)gridDim.x * blockDim.x;
    for (i64 j = first; j < n4; j += stride) {
        float p[4];
        ld4(P, 4 * j, p);
        for (int e = 0; e < 4; e++) p[e] *= c;
        st4(P, 4 * j, p);
    }
    for (i64 i = 4 * n4 + first; i < n; i += stride) P[i] *= c;
}

// Go's max of floats: NaN if either is (so a NaN moment poisons its block's
// absmax, as on the CPU), else the larger.
__device__ __forceinline__ float go_max(float a, float b) { return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b); }

// quant8_code is kernels.Quant8Code: the index of the value of the
// ascending code book m (256 values) nearest x, the lower of a tie.
__device__ __forceinline__ unsigned char quant8_code(const float* m, float x) {
    int lo = 0;
#pragma unroll
    for (int half = 128; half > 0; half >>= 1)
        if (m[lo + half] <= x) lo += half;
    return (lo == 255 || __fsub_rn(x, m[lo]) <= __fsub_rn(m[lo + 1], x)) ? lo : lo + 1;
}

// AdamW over 8-bit block-wise quantised moments (kernels.OptimOps.AdamW8):
// p[0] params, p[1] grads, p[2] codes (u8, two a value), p[3] absmax (two a
// block). A thread block of QUANT8_BLOCK threads takes one quantisation
// block at a time, a value a thread; the code books sit in shared memory.
// Every operation is rounded as the CPU rounds it, so the codes match its.
extern "C" __global__ void __launch_bounds__(QUANT8_BLOCK) adamw8_multi(TensorList L, const float* qmap, const float* lr_p, float beta1,
                                                                      float beta2, float eps, float wd, const long long* step,
                                                                      const float* skip, const float* gscale) {
    kernel_entry();
    if (skip && *skip != 0.f) return;
    int t = blockIdx.y;
    if (t >= L.count) return;
    __shared__ float maps[512];
    __shared__ float red[2][QUANT8_BLOCK / 32];
    for (int k = threadIdx.x; k < 512; k += blockDim.x) maps[k] = qmap[k];
    __syncthreads();
    const float *signd = maps, *unsignd = maps + 256;
    adamw_consts c(lr_p, beta1, beta2, wd, step, gscale);
    bool scaled = c.scaled;
    float gs = c.gs, step_size = c.step_size, bc2_sqrt = c.bc2_sqrt, decay = c.decay;
    float *P = L.p[0][t], *G = L.p[1][t], *A = L.p[3][t];
    unsigned char* C = (unsigned char*)L.p[2][t];
    i64 n = L.n[t], nb = (n + QUANT8_BLOCK - 1) / QUANT8_BLOCK;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (i64 b = blockIdx.x; b < nb; b += gridDim.x) {
        i64 i = b * QUANT8_BLOCK + threadIdx.x;
        bool in = i < n;
        float m = 0.f, s = 0.f;
        float am = A[2 * b], as = A[2 * b + 1];
        if (in) {
            m = __fmul_rn(signd[C[2 * i]], am);
            s = __fmul_rn(unsignd[C[2 * i + 1]], as);
            float g = scaled ? __fmul_rn(G[i], gs) : G[i];
            m = __fadd_rn(__fmul_rn(beta1, m), __fmul_rn(1.f - beta1, g));
            float v = __fadd_rn(__fmul_rn(beta2, __fmul_rn(s, s)), __fmul_rn(__fmul_rn(1.f - beta2, g), g));
            s = __fsqrt_rn(v);
            float p = __fmul_rn(P[i], decay);
            P[i] = __fsub_rn(p, __fdiv_rn(__fmul_rn(step_size, m), __fadd_rn(__fdiv_rn(s, bc2_sqrt), eps)));
        }
        // The block's largest |m| and s, NaN if any is.
        float mx = fabsf(m), sx = s;
        for (int o = 16; o > 0; o >>= 1) {
            mx = go_max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            sx = go_max(sx, __shfl_xor_sync(0xffffffffu, sx, o));
        }
        __syncthreads(); // the last block's readers of red are done
        if (lane == 0) red[0][warp] = mx, red[1][warp] = sx;
        __syncthreads();
        mx = red[0][0], sx = red[1][0];
        for (int w = 1; w < QUANT8_BLOCK / 32; w++) mx = go_max(mx, red[0][w]), sx = go_max(sx, red[1][w]);
        if (in) {
            C[2 * i] = quant8_code(signd, mx > 0.f ? __fdiv_rn(m, mx) : 0.f);
            C[2 * i + 1] = quant8_code(unsignd, sx > 0.f ? __fdiv_rn(s, sx) : 0.f);
        }
        if (threadIdx.x == 0) A[2 * b] = mx, A[2 * b + 1] = sx;
    }
}
