// Fused log-softmax + cross-entropy. The forward runs in one block: each warp
// takes rows, its lanes stride over the classes; the mean over rows is then
// reduced in the block, so the loss needs one launch and is deterministic.
// A label outside [0, k) makes the row's loss, and so the mean, NaN.

template <typename T>
__device__ void ce_fwd(int n, int k, const T* logits, const int* labels, float* lse, float* loss) {
    __shared__ float scratch[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    float total = 0.f;
    for (int row = warp; row < n; row += nwarps) {
        const T* x = logits + (i64)row * k;
        float m = -INFINITY;
        for (int j = lane; j < k; j += 32) m = fmaxf(m, ld(x, j));
        m = warp_max(m);
        float s = 0.f;
        for (int j = lane; j < k; j += 32) s += expf(ld(x, j) - m);
        s = warp_sum(s);
        float l = m + logf(s);
        int y = labels[row];
        float nll = (y >= 0 && y < k) ? l - ld(x, y) : __int_as_float(0x7fc00000);
        if (lane == 0) {
            lse[row] = l;
            total += nll;
        }
    }
    total = block_sum(total, scratch);
    if (threadIdx.x == 0) loss[0] = total / n;
}

// dlogits = (softmax − onehot)·dloss/n, dloss read on the device.
template <typename T>
__device__ void ce_bwd(int n, int k, const T* logits, const int* labels, const float* lse, const float* dloss, T* dx) {
    float g = dloss[0] / n;
    GRID_STRIDE(i, (i64)n * k) {
        int row = (int)(i / k), j = (int)(i % k);
        float p = expf(ld(logits, i) - lse[row]);
        if (j == labels[row]) p -= 1.f;
        st(dx, i, p * g);
    }
}

#define LOSS(T, S)                                                                                             \
    extern "C" __global__ void ce_fwd_##S(int n, int k, const T* logits, const int* labels, float* lse,        \
                                          float* loss) {                                                       \
        ce_fwd(n, k, logits, labels, lse, loss);                                                              \
    }                                                                                                          \
    extern "C" __global__ void ce_bwd_##S(int n, int k, const T* logits, const int* labels, const float* lse,  \
                                          const float* dloss, T* dx) {                                         \
        ce_bwd(n, k, logits, labels, lse, dloss, dx);                                                         \
    }
FOR_TYPES(LOSS)
