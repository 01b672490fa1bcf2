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
