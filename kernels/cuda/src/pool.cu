// Max and average pooling over N·C planes. Backwards are gathers (each input
// element collects from the windows that contain it), so they need no atomics
// and no index tensor: max pooling recomputes each window's first maximum.

// struct Pool (generated from Go's poolArgs): N, C, H, W, KH, KW, SH, SW,
// PH, PW, OH, OW.

template <typename T>
__device__ __forceinline__ int window_argmax(const Pool& p, const T* plane, int oh, int ow) {
    float best = -INFINITY;
    int bi = -1;
    for (int r = 0; r < p.KH; r++) {
        int ih = oh * p.SH - p.PH + r;
        if (ih < 0 || ih >= p.H) continue;
        for (int s = 0; s < p.KW; s++) {
            int iw = ow * p.SW - p.PW + s;
            if (iw < 0 || iw >= p.W) continue;
            float v = ld(plane, ih * p.W + iw);
            if (v > best || bi < 0) { best = v; bi = ih * p.W + iw; }
        }
    }
    return bi;
}

template <typename T>
__device__ void maxpool(Pool p, const T* x, T* y) {
    GRID_STRIDE(i, (i64)p.N * p.C * p.OH * p.OW) {
        int ow = (int)(i % p.OW), oh = (int)((i / p.OW) % p.OH);
        i64 plane = i / ((i64)p.OH * p.OW);
        const T* xp = x + plane * p.H * p.W;
        y[i] = xp[window_argmax(p, xp, oh, ow)];
    }
}

// The output windows that can contain input row ih are oh in [lo, hi].
__device__ __forceinline__ void covering(int i, int k, int s, int pad, int out, int& lo, int& hi) {
    int a = i + pad - k + 1;
    lo = a <= 0 ? 0 : (a + s - 1) / s;
    hi = min((i + pad) / s, out - 1);
}

template <typename T>
__device__ void maxpool_bwd(Pool p, const T* x, const T* dy, T* dx) {
    GRID_STRIDE(i, (i64)p.N * p.C * p.H * p.W) {
        int iw = (int)(i % p.W), ih = (int)((i / p.W) % p.H);
        i64 plane = i / ((i64)p.H * p.W);
        const T* xp = x + plane * p.H * p.W;
        int me = ih * p.W + iw, h0, h1, w0, w1;
        covering(ih, p.KH, p.SH, p.PH, p.OH, h0, h1);
        covering(iw, p.KW, p.SW, p.PW, p.OW, w0, w1);
        float acc = 0.f;
        for (int oh = h0; oh <= h1; oh++)
            for (int ow = w0; ow <= w1; ow++)
                if (window_argmax(p, xp, oh, ow) == me) acc += ld(dy, (plane * p.OH + oh) * p.OW + ow);
        st(dx, i, acc);
    }
}

template <typename T>
__device__ void avgpool(Pool p, const T* x, T* y) {
    float inv = 1.f / (p.KH * p.KW);
    GRID_STRIDE(i, (i64)p.N * p.C * p.OH * p.OW) {
        int ow = (int)(i % p.OW), oh = (int)((i / p.OW) % p.OH);
        const T* xp = x + i / ((i64)p.OH * p.OW) * p.H * p.W;
        float s = 0.f;
        for (int r = 0; r < p.KH; r++) {
            int ih = oh * p.SH - p.PH + r;
            if (ih < 0 || ih >= p.H) continue;
            for (int q = 0; q < p.KW; q++) {
                int iw = ow * p.SW - p.PW + q;
                if (iw >= 0 && iw < p.W) s += ld(xp, ih * p.W + iw);
            }
        }
        st(y, i, s * inv);
    }
}

template <typename T>
__device__ void avgpool_bwd(Pool p, const T* dy, T* dx) {
    float inv = 1.f / (p.KH * p.KW);
    GRID_STRIDE(i, (i64)p.N * p.C * p.H * p.W) {
        int iw = (int)(i % p.W), ih = (int)((i / p.W) % p.H);
        i64 plane = i / ((i64)p.H * p.W);
        int h0, h1, w0, w1;
        covering(ih, p.KH, p.SH, p.PH, p.OH, h0, h1);
        covering(iw, p.KW, p.SW, p.PW, p.OW, w0, w1);
        float acc = 0.f;
        for (int oh = h0; oh <= h1; oh++)
            for (int ow = w0; ow <= w1; ow++) acc += ld(dy, (plane * p.OH + oh) * p.OW + ow);
        st(dx, i, acc * inv);
    }
}

#define POOL(T, S)                                                                   \
    extern "C" __global__ void maxpool_##S(Pool p, const T* x, T* y) {              \
        kernel_entry();                                                              \
        maxpool(p, x, y);                                                            \
    }                                                                                \
    extern "C" __global__ void maxpool_bwd_##S(Pool p, const T* x, const T* dy, T* dx) { \
        kernel_entry();                                                              \
        maxpool_bwd(p, x, dy, dx);                                                   \
    }                                                                                \
    extern "C" __global__ void avgpool_##S(Pool p, const T* x, T* y) {              \
        kernel_entry();                                                              \
        avgpool(p, x, y);                                                            \
    }                                                                                \
    extern "C" __global__ void avgpool_bwd_##S(Pool p, const T* dy, T* dx) {        \
        kernel_entry();                                                              \
        avgpool_bwd(p, dy, dx);                                                      \
    }
FOR_TYPES(POOL)
