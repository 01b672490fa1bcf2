// Philox4x32-10, the same function as kernels.PhiloxBlock: element i of an
// operation at state (seed, offset) uses word i%4 of block offset + i/4. One
// thread makes one block of four numbers.

struct u4 {
    unsigned x, y, z, w;
};

__device__ __forceinline__ u4 philox(unsigned long long seed, unsigned long long ctr) {
    unsigned c0 = (unsigned)ctr, c1 = (unsigned)(ctr >> 32), c2 = 0, c3 = 0;
    unsigned k0 = (unsigned)seed, k1 = (unsigned)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        unsigned hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        unsigned hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        unsigned n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return u4{c0, c1, c2, c3};
}

__device__ __forceinline__ float to_uniform(unsigned u) { return (float)(u >> 8) * (1.0f / 16777216.0f); }

__device__ __forceinline__ void box_muller(unsigned u0, unsigned u1, float& z0, float& z1) {
    float a = ((float)u0 + 1.0f) * 2.3283064365386963e-10f; // (u+1)/2^32 in (0, 1]
    float b = (float)u1 * 2.3283064365386963e-10f;
    float r = sqrtf(-2.0f * logf(a)), s, c;
    sincospif(2.0f * b, &s, &c);
    z0 = r * c;
    z1 = r * s;
}

template <typename T>
__device__ void uniform(i64 n, unsigned long long seed, unsigned long long offset, float lo, float hi, T* y) {
    GRID_STRIDE(b, (n + 3) / 4) {
        u4 w = philox(seed, offset + b);
        unsigned ws[4] = {w.x, w.y, w.z, w.w};
        for (int j = 0; j < 4 && 4 * b + j < n; j++) st(y, 4 * b + j, lo + (hi - lo) * to_uniform(ws[j]));
    }
}

template <typename T>
__device__ void normal(i64 n, unsigned long long seed, unsigned long long offset, float mean, float std, T* y) {
    GRID_STRIDE(b, (n + 3) / 4) {
        u4 w = philox(seed, offset + b);
        float z[4];
        box_muller(w.x, w.y, z[0], z[1]);
        box_muller(w.z, w.w, z[2], z[3]);
        for (int j = 0; j < 4 && 4 * b + j < n; j++) st(y, 4 * b + j, mean + std * z[j]);
    }
}

template <typename T>
__device__ void dropout(i64 n, unsigned long long seed, unsigned long long offset, float p, const T* x, T* y) {
    float scale = 1.f / (1.f - p);
    GRID_STRIDE(b, (n + 3) / 4) {
        u4 w = philox(seed, offset + b);
        unsigned ws[4] = {w.x, w.y, w.z, w.w};
        for (int j = 0; j < 4 && 4 * b + j < n; j++) {
            i64 i = 4 * b + j;
            st(y, i, to_uniform(ws[j]) >= p ? ld(x, i) * scale : 0.f);
        }
    }
}

// base, when not null, is a device counter added to the offset when the
// kernel runs (a captured step's generator position).
#define RANDOM(T, S)                                                                                            \
    extern "C" __global__ void uniform_##S(i64 n, unsigned long long seed, unsigned long long offset,            \
                                           const long long* base, float lo, float hi, T* y) {                   \
        kernel_entry();                                                                                        \
        uniform(n, seed, offset + (base ? *base : 0), lo, hi, y);                                              \
    }                                                                                                           \
    extern "C" __global__ void normal_##S(i64 n, unsigned long long seed, unsigned long long offset,             \
                                          const long long* base, float mean, float std, T* y) {                 \
        kernel_entry();                                                                                        \
        normal(n, seed, offset + (base ? *base : 0), mean, std, y);                                            \
    }                                                                                                           \
    extern "C" __global__ void dropout_##S(i64 n, unsigned long long seed, unsigned long long offset,            \
                                           const long long* base, float p, const T* x, T* y) {                  \
        kernel_entry();                                                                                        \
        dropout(n, seed, offset + (base ? *base : 0), p, x, y);                                                \
    }
FOR_TYPES(RANDOM)

// ---- sampling: a block a row (kernels.SampleParams) ----

// argmax_pair keeps the larger value, the lower index on ties.
__device__ __forceinline__ void argmax_pair(float& v, int& i, float ov, int oi) {
    if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
}

// block_argmax reduces (v, i) over the block; every thread gets the result.
__device__ void block_argmax(float& v, int& i, float* sv, int* si) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    for (int o = 16; o > 0; o >>= 1) argmax_pair(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
    __syncthreads();
    if (lane == 0) sv[warp] = v, si[warp] = i;
    __syncthreads();
    v = lane < nwarps ? sv[lane] : -INFINITY;
    i = lane < nwarps ? si[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) argmax_pair(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
}

// sample_row draws row blockIdx.x's token as the CPU's sampleRow does:
// w = (z − max)·(1/t), the top-k cut and the top-p floor by
// SAMPLE_ROUNDS halvings, then the kept tokens' weights walked in index
// order, each thread a contiguous stretch, to the uniform draw.
template <typename T>
__device__ void sample_row(int V, int topN, const T* logits, const float* temperature, const int* topK, const float* topP,
                           const int* seeds, const int* steps, int* tokens, float* logprobs, int* topTokens,
                           float* topLogprobs) {
    __shared__ float sv[32];
    __shared__ int si[32];
    __shared__ float scratch[32];
    __shared__ float prefix[1024];
    __shared__ int picked[1];
    int r = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
    const T* z = logits + (i64)r * V;
    float m = -INFINITY, lo = INFINITY;
    int best = 0x7fffffff;
    for (int i = tid; i < V; i += nt) {
        float x = ld(z, i);
        argmax_pair(m, best, x, i);
        lo = fminf(lo, x);
    }
    block_argmax(m, best, sv, si);
    lo = -block_max(-lo, scratch);
    float sum = 0.f;
    for (int i = tid; i < V; i += nt) sum += __expf(ld(z, i) - m);
    float logZ = m + __logf(block_sum(sum, scratch));
    int pick = best;
    float t = temperature[r];
    if (t > 0.f) {
        float inv = __frcp_rn(t);
        lo = fminf(0.f, (lo - m) * inv);
        float cut = -INFINITY;
        int k = topK[r];
        if (k > 0 && k < V) {
            float hi = 0.f;
            for (int round = 0; round < SAMPLE_ROUNDS; round++) {
                float mid = (lo + hi) * 0.5f, n = 0.f;
                for (int i = tid; i < V; i += nt) n += (ld(z, i) - m) * inv >= mid ? 1.f : 0.f;
                if (block_sum(n, scratch) >= (float)k) lo = mid; else hi = mid;
            }
            cut = lo;
        }
        // e(i): the weight of token i, 0 where it is cut.
        auto e = [&](int i) { float w = (ld(z, i) - m) * inv; return w >= cut ? __expf(w) : 0.f; };
        float floor = 0.f, p = topP[r];
        if (p < 1.f) {
            float total = 0.f;
            for (int i = tid; i < V; i += nt) total += e(i);
            float need = p * block_sum(total, scratch), flo = 0.f, fhi = 1.f;
            for (int round = 0; round < SAMPLE_ROUNDS; round++) {
                float mid = (flo + fhi) * 0.5f, s = 0.f;
                for (int i = tid; i < V; i += nt) {
                    float x = e(i);
                    s += x >= mid ? x : 0.f;
                }
                if (block_sum(s, scratch) >= need) flo = mid; else fhi = mid;
            }
            floor = flo;
        }
        int chunk = (V + nt - 1) / nt, a = min(V, tid * chunk), b = min(V, a + chunk), last = -1;
        float own = 0.f;
        for (int i = a; i < b; i++) {
            float x = e(i);
            if (x > 0.f && x >= floor) own += x, last = i;
        }
        prefix[tid] = own;
        __syncthreads();
        if (tid == 0) {
            float acc = 0.f;
            for (int j = 0; j < nt; j++) {
                float o = prefix[j];
                prefix[j] = acc;
                acc += o;
            }
            prefix[nt] = acc;
            picked[0] = -1;
        }
        __syncthreads();
        unsigned long long seed = (unsigned)seeds[2 * r] | (unsigned long long)(unsigned)seeds[2 * r + 1] << 32;
        float u = to_uniform(philox(seed, (unsigned)steps[r]).x) * prefix[nt];
        float acc = prefix[tid];
        if (acc <= u && u < acc + own) {
            int found = last;
            for (int i = a; i < b; i++) {
                float x = e(i);
                if (x > 0.f && x >= floor && (acc += x) > u) {
                    found = i;
                    break;
                }
            }
            picked[0] = found;
        }
        __syncthreads();
        pick = picked[0];
        if (pick < 0) { // the draw fell past the sum's rounding: the last kept token
            int l = last;
            l = (int)block_max((float)l, scratch);
            pick = l;
        }
    }
    if (tid == 0) tokens[r] = pick, logprobs[r] = ld(z, pick) - logZ;
    for (int n = 0; n < topN; n++) {
        float v = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = tid; i < V; i += nt) {
            bool taken = false;
            for (int j = 0; j < n; j++) taken |= topTokens[(i64)r * topN + j] == i;
            if (!taken) argmax_pair(v, bi, ld(z, i), i);
        }
        block_argmax(v, bi, sv, si);
        if (tid == 0) topTokens[(i64)r * topN + n] = bi, topLogprobs[(i64)r * topN + n] = v - logZ;
        __syncthreads();
    }
}

#define SAMPLE(T, S)                                                                                              \
    extern "C" __global__ void sample_##S(int V, int topN, const T* logits, const float* temperature,             \
                                          const int* topK, const float* topP, const int* seeds, const int* steps, \
                                          int* tokens, float* logprobs, int* topTokens, float* topLogprobs) {     \
        kernel_entry();                                                                                           \
        sample_row(V, topN, logits, temperature, topK, topP, seeds, steps, tokens, logprobs, topTokens,          \
                   topLogprobs);                                                                                  \
    }
FOR_TYPES(SAMPLE)
