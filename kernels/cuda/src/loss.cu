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

// ---- the fused classifier ----

// A block per row of a chunk's logits z (T, as the product rounded them,
// rows × V, ldz apart): the row's loss (lse − z[label]) and whether its first
// maximum is its label, and with grad its softmax − one-hot into dz (T),
// which may be z itself: z[label] is read before the barrier after which dz
// is written.
//
// The rows are as bound by instruction issue as by memory on the H200, so
// each element costs few instructions: the exponentials are ex2 of a fused
// multiply-add in log2 units, the running maximum is tested a group at a
// time, and the label's −1 is written once, after the row.
//
// online adds the group v (indices j..j+N−1, N a power of two) to a
// running maximum m (first at arg) and sum s of 2^((· − m)·log2 e).
template <int N> __device__ __forceinline__ void online(const float* v, int j, float& m, float& s, int& arg) {
    float mn = v[0];
#pragma unroll
    for (int e = 1; e < N; e++) mn = fmaxf(mn, v[e]);
    if (mn > m) {
        s *= ex2((m - mn) * LOG2E);
        m = mn;
        int first = N - 1;
#pragma unroll
        for (int e = N - 2; e >= 0; e--) first = v[e] == mn ? e : first;
        arg = j + first;
    }
    float ml = m * LOG2E, t[N];
#pragma unroll
    for (int e = 0; e < N; e++) t[e] = ex2(fmaf(v[e], LOG2E, -ml));
#pragma unroll
    for (int w = 1; w < N; w *= 2) // pairwise: (t0 + t1) + (t2 + t3) ...
#pragma unroll
        for (int e = 0; e + w < N; e += 2 * w) t[e] += t[e + w];
    s += t[0];
}

// merge combines two running (maximum, sum, first index of the maximum).
__device__ __forceinline__ void merge(float& m, float& s, int& arg, float m2, float s2, int a2) {
    if (m2 > m || (m2 == m && a2 < arg)) {
        s = (m == -INFINITY ? 0.f : s * ex2((m - m2) * LOG2E)) + s2;
        m = m2;
        arg = a2;
    } else if (m2 != -INFINITY) {
        s += s2 * ex2((m2 - m) * LOG2E);
    }
}

// cls_row_end adds the row's values from j0 on (a value at a time, as a
// group padded with −∞) to the thread's running (m, s, arg), combines the
// block's threads' over the row, writes its loss and right count for
// label y and returns its log-sum-exp to every thread; thread 0 reads the
// label's logit zy before the first barrier (dz may overwrite z).
template <typename T>
__device__ float cls_row_end(int V, int j0, const T* zr, int y, float m, float s, int arg, float& zy, float* rowloss,
                             float* rowright) {
    __shared__ float sm[32], ss[32];
    __shared__ int si[32];
    for (int j = j0 + threadIdx.x; j < V; j += blockDim.x) {
        float v[4] = {ld(zr, j), -INFINITY, -INFINITY, -INFINITY};
        online<4>(v, j, m, s, arg);
    }
    bool labelled = y >= 0 && y < V;
    zy = (threadIdx.x == 0 && labelled) ? ld(zr, y) : 0.f;
    for (int o = 16; o > 0; o >>= 1)
        merge(m, s, arg, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o), __shfl_xor_sync(0xffffffffu, arg, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    if (lane == 0) {
        sm[warp] = m;
        ss[warp] = s;
        si[warp] = arg;
    }
    __syncthreads();
    if (warp == 0) {
        m = lane < nwarps ? sm[lane] : -INFINITY;
        s = lane < nwarps ? ss[lane] : 0.f;
        arg = lane < nwarps ? si[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1)
            merge(m, s, arg, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o), __shfl_xor_sync(0xffffffffu, arg, o));
        if (lane == 0) {
            sm[0] = m;
            ss[0] = s;
            si[0] = arg;
        }
    }
    __syncthreads();
    float lse = sm[0] + logf(ss[0]);
    if (threadIdx.x == 0) {
        *rowloss = labelled ? lse - zy : __int_as_float(0x7fc00000);
        *rowright = si[0] == y ? 1.f : 0.f;
    }
    return lse;
}

// cls_grad_end writes the softmax of the row's values from j0 on, a value
// at a time, then the label's −1 once every thread has written its part,
// each times k (1, or a GradScaler's scale over the rows: cls_scale).
template <typename T> __device__ void cls_grad_end(int V, int j0, const T* zr, T* dr, int y, float zy, float ll, float k) {
    for (int j = j0 + threadIdx.x; j < V; j += blockDim.x) st(dr, j, k * ex2(fmaf(ld(zr, j), LOG2E, -ll)));
    if (y >= 0 && y < V) {
        __syncthreads();
        if (threadIdx.x == 0) st(dr, y, k * (ex2(fmaf(zy, LOG2E, -ll)) - 1.f));
    }
}

// cls_scale is what the logits' gradient is multiplied by before it is
// rounded: 1, or with a gradient scale gs (kernels.ClassifierParams) gs/N,
// the products then taking α = 1 instead of 1/N.
__device__ __forceinline__ float cls_scale(const float* gs, float inv) { return gs ? gs[0] * inv : 1.f; }

template <typename T>
__device__ void cls_rows(int V, int ldz, int r0, const T* z, const int* labels, float* rowloss, float* rowright, int grad,
                         T* dz, const float* gs, float inv) {
    int r = blockIdx.x;
    const T* zr = z + (i64)r * ldz;
    // One pass for the maximum, its first index and the sum of exponentials
    // (each thread's running sum rescaled as its maximum grows), four
    // values a load where the rows allow; the tail a value at a time, as a
    // group padded with −∞.
    float m = -INFINITY, s = 0.f;
    int arg = 0x7fffffff;
    int j0 = 0;
    bool vec = ldz % 4 == 0 && vec4(zr);
    if (vec) {
        j0 = V / 4 * 4;
        for (int j = 4 * threadIdx.x; j < j0; j += 4 * blockDim.x) {
            float v[4];
            ld4(zr, j, v);
            online<4>(v, j, m, s, arg);
        }
    }
    int y = labels[r0 + r];
    float zy, lse = cls_row_end(V, j0, zr, y, m, s, arg, zy, rowloss + r0 + r, rowright + r0 + r);
    if (!grad) return;
    // The softmax, 2^(z·log2 e − lse·log2 e); then the label's −1.
    T* dr = dz + (i64)r * ldz;
    float ll = lse * LOG2E, k = cls_scale(gs, inv);
    j0 = 0;
    if (vec && vec4(dr)) {
        j0 = V / 4 * 4;
        for (int j = 4 * threadIdx.x; j < j0; j += 4 * blockDim.x) {
            float v[4];
            ld4(zr, j, v);
            for (int e = 0; e < 4; e++) v[e] = k * ex2(fmaf(v[e], LOG2E, -ll));
            st4(dr, j, v);
        }
    }
    cls_grad_end(V, j0, zr, dr, y, zy, ll, k);
}

// Sixteen bytes of T: Vec16<T>::E values, unpacked to float and packed back
// (rounded as st rounds).
template <typename T> struct Vec16;
template <> struct Vec16<float> {
    static constexpr int E = 4;
    static __device__ __forceinline__ void unpack(uint4 u, float* v) {
        v[0] = __uint_as_float(u.x), v[1] = __uint_as_float(u.y), v[2] = __uint_as_float(u.z), v[3] = __uint_as_float(u.w);
    }
    static __device__ __forceinline__ uint4 pack(const float* v) {
        return make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
    }
};
template <> struct Vec16<bf16> {
    static constexpr int E = 8;
    static __device__ __forceinline__ void unpack(uint4 u, float* v) {
        unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) v[2 * i] = __uint_as_float(w[i] << 16), v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
    static __device__ __forceinline__ uint4 pack(const float* v) {
        unsigned w[4];
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = (unsigned)f2bf(v[2 * i]).x | ((unsigned)f2bf(v[2 * i + 1]).x << 16);
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
};
template <> struct Vec16<f16> {
    static constexpr int E = 8;
    static __device__ __forceinline__ void unpack(uint4 u, float* v) {
        unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) v[2 * i] = h2f((f16)(w[i] & 0xffffu)), v[2 * i + 1] = h2f((f16)(w[i] >> 16));
    }
    static __device__ __forceinline__ uint4 pack(const float* v) {
        unsigned w[4];
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = (unsigned)f2h(v[2 * i]) | ((unsigned)f2h(v[2 * i + 1]) << 16);
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
};

// cls_rows_stash is cls_rows for rows whose 16-byte groups fit in the
// block's dynamic shared memory (z and dz 16-byte aligned, ldz a multiple
// of a group): the first pass keeps each group it reads where the same
// thread finds it again for the softmax, so that the logits are read from
// memory once. Read twice, as cls_rows reads them, the second reading of a
// row missed the L2 cache once the rows in flight (four blocks a
// multiprocessor) outgrew it.
template <typename T>
__device__ void cls_rows_stash(int V, int ldz, int r0, const T* z, const int* labels, float* rowloss, float* rowright, int grad,
                               T* dz, const float* gs, float inv) {
    extern __shared__ uint4 stash[];
    typedef Vec16<T> W;
    int r = blockIdx.x, groups = V / W::E;
    const T* zr = z + (i64)r * ldz;
    float m = -INFINITY, s = 0.f;
    int arg = 0x7fffffff;
#pragma unroll 4
    for (int i = threadIdx.x; i < groups; i += blockDim.x) {
        uint4 u = ((const uint4*)zr)[i];
        stash[i] = u;
        float v[W::E];
        W::unpack(u, v);
        online<W::E>(v, i * W::E, m, s, arg);
    }
    int y = labels[r0 + r];
    float zy, lse = cls_row_end(V, groups * W::E, zr, y, m, s, arg, zy, rowloss + r0 + r, rowright + r0 + r);
    if (!grad) return;
    T* dr = dz + (i64)r * ldz;
    float ll = lse * LOG2E, k = cls_scale(gs, inv);
#pragma unroll 4
    for (int i = threadIdx.x; i < groups; i += blockDim.x) {
        float v[W::E];
        W::unpack(stash[i], v);
#pragma unroll
        for (int e = 0; e < W::E; e++) v[e] = k * ex2(fmaf(v[e], LOG2E, -ll));
        ((uint4*)dr)[i] = W::pack(v);
    }
    cls_grad_end(V, groups * W::E, zr, dr, y, zy, ll, k);
}

// The mean loss and the right count, summed in one block in a fixed order.
extern "C" __global__ void cls_finish(int n, const float* rowloss, const float* rowright, float* loss, float* right) {
    kernel_entry();
    __shared__ float scratch[32];
    float l = 0.f, c = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        l += rowloss[i];
        c += rowright[i];
    }
    l = block_sum(l, scratch);
    c = block_sum(c, scratch);
    if (threadIdx.x == 0) {
        loss[0] = l / n;
        right[0] = c;
    }
}

#define CLASSIFIER(T, S)                                                                                       \
    extern "C" __global__ void cls_rows_##S(int V, int ldz, int r0, const T* z, const int* labels,             \
                                            float* rowloss, float* rowright, int grad, T* dz, const float* gs, \
                                            float inv) {                                                       \
        kernel_entry();                                                                                        \
        cls_rows(V, ldz, r0, z, labels, rowloss, rowright, grad, dz, gs, inv);                                 \
    }                                                                                                          \
    extern "C" __global__ void cls_rows_stash_##S(int V, int ldz, int r0, const T* z, const int* labels,       \
                                                  float* rowloss, float* rowright, int grad, T* dz,            \
                                                  const float* gs, float inv) {                                \
        kernel_entry();                                                                                        \
        cls_rows_stash(V, ldz, r0, z, labels, rowloss, rowright, grad, dz, gs, inv);                           \
    }
FOR_TYPES(CLASSIFIER)
