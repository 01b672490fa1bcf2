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

// right[0] = rows whose first maximum is at the label. One block; a thread
// per row.
template <typename T>
__device__ void count_correct(int n, int k, const T* logits, const int* labels, float* right) {
    __shared__ float scratch[32];
    float count = 0.f;
    for (int row = threadIdx.x; row < n; row += blockDim.x) {
        const T* x = logits + (i64)row * k;
        float best = -INFINITY;
        int bi = 0;
        for (int j = 0; j < k; j++) {
            float v = ld(x, j);
            if (v > best) {
                best = v;
                bi = j;
            }
        }
        if (bi == labels[row]) count += 1.f;
    }
    count = block_sum(count, scratch);
    if (threadIdx.x == 0) right[0] = count;
}

// sums += (loss·n, right, n): a run's loss and accuracy, accumulated on the
// device and read once per progress update.
extern "C" __global__ void metrics(int n, const float* loss, const float* right, float* sums) {
    kernel_entry();
    sums[0] += loss[0] * n;
    sums[1] += right[0];
    sums[2] += (float)n;
}

#define LOSS(T, S)                                                                                             \
    extern "C" __global__ void ce_fwd_##S(int n, int k, const T* logits, const int* labels, float* lse,        \
                                          float* loss) {                                                       \
        kernel_entry();                                                                                       \
        ce_fwd(n, k, logits, labels, lse, loss);                                                              \
    }                                                                                                          \
    extern "C" __global__ void ce_bwd_##S(int n, int k, const T* logits, const int* labels, const float* lse,  \
                                          const float* dloss, T* dx) {                                         \
        kernel_entry();                                                                                       \
        ce_bwd(n, k, logits, labels, lse, dloss, dx);                                                         \
    }                                                                                                          \
    extern "C" __global__ void count_correct_##S(int n, int k, const T* logits, const int* labels,          \
                                                 float* right) {                                              \
        kernel_entry();                                                                                       \
        count_correct(n, k, logits, labels, right);                                                           \
    }
FOR_TYPES(LOSS)
