// Transformer kernels: embeddings (a gather forward; a deterministic
// backward through a bitonic sort of (id, position) keys), layer norm (a
// warp per row; γ's and β's gradients summed per warp, then over the warps
// in a fixed order), the pieces of attention around cuBLAS's products
// (gathers into and scatters from [B·H, T, D], the masked softmax, its
// backward), the fused classifier's per-row loss and gradient, and the
// gradient-norm clip (sums of squares per block, then one block).

// ---- embeddings ----

template <typename T>
__device__ void embedding(int n, int dim, const int* ids, const T* table, T* y) {
    GRID_STRIDE(i, (i64)n * dim) { y[i] = table[(i64)ids[i / dim] * dim + i % dim]; }
}

// keys[i] = id << 32 | position for i < n, all ones (after every real key)
// up to the padded length p.
extern "C" __global__ void embedding_keys(int n, int p, const int* ids, unsigned long long* keys) {
    kernel_entry();
    GRID_STRIDE(i, p) { keys[i] = i < n ? ((unsigned long long)(unsigned)ids[i] << 32) | (unsigned)i : ~0ull; }
}

// Bitonic sort of p keys (a power of two), ascending. bitonic_local sorts
// each run of 2·THREADS keys in shared memory, or, with k > 0, finishes the
// merge of stage k from j = THREADS down; bitonic_step is one global
// compare-exchange at distance j of stage k.
extern "C" __global__ void bitonic_local(unsigned long long* keys, int p, int k0) {
    kernel_entry();
    __shared__ unsigned long long s[2 * THREADS];
    int base = blockIdx.x * 2 * THREADS, t = threadIdx.x;
    s[t] = keys[base + t];
    s[t + THREADS] = keys[base + t + THREADS];
    __syncthreads();
    int kfirst = k0 > 0 ? k0 : 2, klast = k0 > 0 ? k0 : 2 * THREADS;
    for (int k = kfirst; k <= klast; k <<= 1) {
        for (int j = min(k >> 1, THREADS); j > 0; j >>= 1) {
            int i = 2 * t - (t & (j - 1)); // the lower index of this thread's pair
            int l = i + j;
            bool up = ((base + i) & k) == 0;
            unsigned long long a = s[i], b = s[l];
            if ((a > b) == up) {
                s[i] = b;
                s[l] = a;
            }
            __syncthreads();
        }
    }
    keys[base + t] = s[t];
    keys[base + t + THREADS] = s[t + THREADS];
}

extern "C" __global__ void bitonic_step(unsigned long long* keys, int p, int k, int j) {
    kernel_entry();
    GRID_STRIDE(i, p) {
        int l = (int)i ^ j;
        if (l > i) {
            bool up = ((int)i & k) == 0;
            unsigned long long a = keys[i], b = keys[l];
            if ((a > b) == up) {
                keys[i] = b;
                keys[l] = a;
            }
        }
    }
}

// One block per sorted position: the first position of each id's run sums
// the run's rows of dy (in position order, the keys' order) into the
// table's row, or adds the sum to it; the others return.
template <typename T>
__device__ void embedding_bwd(int n, int dim, const unsigned long long* keys, const T* dy, float* dtable, int accumulate) {
    int s = blockIdx.x;
    if (s >= n) return;
    unsigned id = (unsigned)(keys[s] >> 32);
    if (s > 0 && (unsigned)(keys[s - 1] >> 32) == id) return;
    int e = s + 1;
    while (e < n && (unsigned)(keys[e] >> 32) == id) e++;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        float acc = 0.f;
        for (int r = s; r < e; r++) acc += ld(dy, (i64)(unsigned)keys[r] * dim + c);
        float* d = dtable + (i64)id * dim + c;
        *d = accumulate ? __fadd_rn(*d, acc) : acc;
    }
}

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

// ---- attention: [B, T, H, D] strided rows <-> [B·H, T, D] ----

// attn_pieces copies between a strided operand (element (b, t, h, d) at
// b·batch + t·row + h·D + d) and its packed [B·H, T, D] copy: to the
// packed one with GATHER, back otherwise, converting S to T. blockIdx.y
// strides over the B·H heads, the threads over each head's T·D elements V
// at a time, so that the index arithmetic is 32-bit and once per V.
template <int V, bool GATHER, typename S, typename T>
__device__ void attn_pieces(int B, int H, int Tn, int D, int row, i64 batch, const S* src, T* dst) {
    int per = D / V, n = Tn * per;
    for (int bh = blockIdx.y; bh < B * H; bh += gridDim.y) {
        i64 strided = (bh / H) * batch + (bh % H) * D, packed = (i64)bh * Tn * D;
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
            int t = i / per, d = (i - t * per) * V;
            i64 si = strided + (i64)t * row + d, pi = packed + (i64)t * D + d;
            float v[V];
            ldv<V>(src, GATHER ? si : pi, v);
            stv<V>(dst, GATHER ? pi : si, v);
        }
    }
}

// attn_move is attn_pieces four elements at a time where every stride and
// pointer allows it, one otherwise.
template <bool GATHER, typename S, typename T>
__device__ void attn_move(int B, int H, int Tn, int D, int row, i64 batch, const S* src, T* dst) {
    if (D % 4 == 0 && row % 4 == 0 && batch % 4 == 0 && vec4(src) && vec4(dst))
        attn_pieces<4, GATHER>(B, H, Tn, D, row, batch, src, dst);
    else
        attn_pieces<1, GATHER>(B, H, Tn, D, row, batch, src, dst);
}

// The kernels over a chunk's scores (BH·rows rows of kl: row i of head bh
// is row bh·rows + i, query q0 + i of Tq, which sees the keys up to
// Tk − Tq + q0 + i) run a warp a row, each lane V values at a time from
// column V·lane (V = 4 where kl and the pointers allow it, the wrappers'
// choice).

// warp_row is the calling warp's first row, warp_rows the stride between
// its rows: a warp per row over the grid.
__device__ __forceinline__ int warp_row() { return (blockIdx.x * blockDim.x + threadIdx.x) >> 5; }
__device__ __forceinline__ int warp_rows() { return (gridDim.x * blockDim.x) >> 5; }

// attn_softmax: scores s (F32, already scaled) to p = exp(s − lse) (0
// where masked), each row's log-sum-exp into lse[bh·Tq + q0+i]. Each lane
// keeps a running maximum and the sum of its exponentials over its keys,
// which the warp combines: one read of the row for the sums, one to
// write p.
template <int V, typename T>
__device__ void attn_softmax(int bhrows, int rows, int kl, int q0, int Tq, int Tk, const float* s, T* p, float* lse) {
    int lane = threadIdx.x & 31;
    for (int r = warp_row(); r < bhrows; r += warp_rows()) {
        int bh = r / rows, i = r - bh * rows, seen = min(kl, Tk - Tq + q0 + i + 1);
        const float* sr = s + (i64)r * kl;
        float m = -INFINITY, z = 0.f;
        for (int j = V * lane; j < seen; j += 32 * V) {
            float v[V];
            ldv<V>(sr, j, v);
#pragma unroll
            for (int e = 0; e < V; e++) {
                if (j + e < seen && v[e] > m) {
                    z = z * expf(m - v[e]) + 1.f;
                    m = v[e];
                } else if (j + e < seen) {
                    z += expf(v[e] - m);
                }
            }
        }
        float M = warp_max(m);
        z = warp_sum(m == -INFINITY ? 0.f : z * expf(m - M));
        float l = M + logf(z);
        if (lane == 0) lse[(i64)bh * Tq + q0 + i] = l;
        for (int j = V * lane; j < kl; j += 32 * V) {
            float v[V];
            ldv<V>(sr, j, v);
#pragma unroll
            for (int e = 0; e < V; e++) v[e] = j + e < seen ? expf(v[e] - l) : 0.f;
            stv<V>(p, (i64)r * kl + j, v);
        }
    }
}

// attn_probs: the backward's probabilities from the saved log-sum-exp (s
// F32, scaled).
template <int V, typename T>
__device__ void attn_probs(int bhrows, int rows, int kl, int q0, int Tq, int Tk, const float* s, const float* lse, T* p) {
    int lane = threadIdx.x & 31;
    for (int r = warp_row(); r < bhrows; r += warp_rows()) {
        int bh = r / rows, i = r - bh * rows, seen = min(kl, Tk - Tq + q0 + i + 1);
        float l = lse[(i64)bh * Tq + q0 + i];
        for (int j = V * lane; j < kl; j += 32 * V) {
            float v[V];
            ldv<V>(s, (i64)r * kl + j, v);
#pragma unroll
            for (int e = 0; e < V; e++) v[e] = j + e < seen ? expf(v[e] - l) : 0.f;
            stv<V>(p, (i64)r * kl + j, v);
        }
    }
}

// attn_dscores: ds = p·(dp − D_i)·scale in place over p, D_i = Σ do·o of
// the row (p is 0 where masked, and so is ds).
template <int V, typename T>
__device__ void attn_dscores(int bhrows, int rows, int kl, int q0, int Tq, float scale, const float* dp, const float* dvec,
                             T* p) {
    int lane = threadIdx.x & 31;
    for (int r = warp_row(); r < bhrows; r += warp_rows()) {
        int bh = r / rows;
        float dv = dvec[(i64)bh * Tq + q0 + r - bh * rows];
        for (int j = V * lane; j < kl; j += 32 * V) {
            float pv[V], d[V];
            ldv<V>(p, (i64)r * kl + j, pv);
            ldv<V>(dp, (i64)r * kl + j, d);
#pragma unroll
            for (int e = 0; e < V; e++) pv[e] = pv[e] * (d[e] - dv) * scale;
            stv<V>(p, (i64)r * kl + j, pv);
        }
    }
}

// dvec[bh·T + t] = Σ_d do·o, do and o strided as o. Rows of a multiple of
// 32 elements (aligned for it) go to 8 lanes each, every lane adding a
// quarter of four-element pieces, and the lanes' sums are added by
// shuffles in a fixed order; other rows to a thread each.
template <typename T>
__device__ void attn_rowdot(int B, int H, int Tn, int D, int row, i64 batch, const T* dout, const T* o, float* dvec) {
    if (D % 32 == 0 && row % 4 == 0 && batch % 4 == 0 && vec4(dout) && vec4(o)) {
        i64 rows = (i64)B * H * Tn;
        for (i64 x0 = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 8; x0 < (rows + 3) / 4 * 4; x0 += (i64)gridDim.x * blockDim.x / 8) {
            int l = threadIdx.x & 7;
            float acc = 0.f;
            if (x0 < rows) {
                int t = (int)(x0 % Tn), h = (int)(x0 / Tn % H), b = (int)(x0 / ((i64)Tn * H));
                i64 base = b * batch + (i64)t * row + h * D;
                for (int d = 4 * l; d < D; d += 32) {
                    float u[4], w[4];
                    ld4(dout, base + d, u);
                    ld4(o, base + d, w);
                    acc += u[0] * w[0] + u[1] * w[1] + u[2] * w[2] + u[3] * w[3];
                }
            }
            for (int s = 4; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
            if (l == 0 && x0 < rows) dvec[x0] = acc;
        }
        return;
    }
    GRID_STRIDE(x, (i64)B * H * Tn) {
        int t = (int)(x % Tn), h = (int)(x / Tn % H), b = (int)(x / ((i64)Tn * H));
        i64 base = b * batch + (i64)t * row + h * D;
        float acc = 0.f;
        for (int d = 0; d < D; d++) acc += ld(dout, base + d) * ld(o, base + d);
        dvec[((i64)b * H + h) * Tn + t] = acc;
    }
}

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

#define TRANSFORMER(T, S)                                                                                        \
    extern "C" __global__ void embedding_##S(int n, int dim, const int* ids, const T* table, T* y) {            \
        kernel_entry();                                                                                         \
        embedding(n, dim, ids, table, y);                                                                       \
    }                                                                                                           \
    extern "C" __global__ void embedding_bwd_##S(int n, int dim, const unsigned long long* keys, const T* dy,   \
                                                 float* dtable, int accumulate) {                               \
        kernel_entry();                                                                                         \
        embedding_bwd(n, dim, keys, dy, dtable, accumulate);                                                    \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * LN_WARPS, LN_FWD_BLOCKS) layernorm_fwd_##S(int rows, int cols, const T* x, const float* g, const float* b, \
                                                 float eps, T* y, float* mean, float* rstd) {                   \
        kernel_entry();                                                                                         \
        layernorm_fwd(rows, cols, x, g, b, eps, y, mean, rstd);                                                 \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * LN_WARPS, LN_BWD_BLOCKS) layernorm_bwd_##S(int rows, int cols, const T* x, const float* g,                \
                                                 const float* mean, const float* rstd, const T* dy, T* dx,      \
                                                 float* partial, int acc, T* rnd, int sums) {                   \
        kernel_entry();                                                                                         \
        layernorm_bwd(rows, cols, x, g, mean, rstd, dy, dx, partial, acc, rnd, sums);                           \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * LN_WARPS, LN_FWD_BLOCKS) layernorm_fwd_mixed_##S(int rows, int cols, const float* x, const float* g,      \
                                                       const float* b, float eps, T* y, float* mean, float* rstd) { \
        kernel_entry();                                                                                         \
        layernorm_fwd(rows, cols, x, g, b, eps, y, mean, rstd);                                                 \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * LN_WARPS, LN_BWD_BLOCKS) layernorm_bwd_mixed_##S(int rows, int cols, const float* x, const float* g,      \
                                                       const float* mean, const float* rstd, const T* dy,       \
                                                       float* dx, float* partial, int acc, T* rnd, int sums) {  \
        kernel_entry();                                                                                         \
        layernorm_bwd(rows, cols, x, g, mean, rstd, dy, dx, partial, acc, rnd, sums);                           \
    }                                                                                                           \
    extern "C" __global__ void attn_gather_##S(int B, int H, int Tn, int D, int row, i64 batch, const T* src,   \
                                               T* dst) {                                                        \
        kernel_entry();                                                                                         \
        attn_move<true>(B, H, Tn, D, row, batch, src, dst);                                                     \
    }                                                                                                           \
    extern "C" __global__ void attn_scatter_##S(int B, int H, int Tn, int D, int row, i64 batch, const T* src,  \
                                                T* dst) {                                                       \
        kernel_entry();                                                                                         \
        attn_move<false>(B, H, Tn, D, row, batch, src, dst);                                                    \
    }                                                                                                           \
    extern "C" __global__ void attn_scatter_f32_##S(int B, int H, int Tn, int D, int row, i64 batch,            \
                                                    const float* src, T* dst) {                                 \
        kernel_entry();                                                                                         \
        attn_move<false>(B, H, Tn, D, row, batch, src, dst);                                                    \
    }                                                                                                           \
    extern "C" __global__ void attn_softmax_##S(int bhrows, int rows, int kl, int q0, int Tq, int Tk,           \
                                                const float* s, T* p, float* lse) {                             \
        kernel_entry();                                                                                         \
        if (kl % 4 == 0 && vec4(s) && vec4(p))                                                                  \
            attn_softmax<4>(bhrows, rows, kl, q0, Tq, Tk, s, p, lse);                                           \
        else                                                                                                    \
            attn_softmax<1>(bhrows, rows, kl, q0, Tq, Tk, s, p, lse);                                           \
    }                                                                                                           \
    extern "C" __global__ void attn_probs_##S(int bhrows, int rows, int kl, int q0, int Tq, int Tk,             \
                                              const float* s, const float* lse, T* p) {                         \
        kernel_entry();                                                                                         \
        if (kl % 4 == 0 && vec4(s) && vec4(p))                                                                  \
            attn_probs<4>(bhrows, rows, kl, q0, Tq, Tk, s, lse, p);                                             \
        else                                                                                                    \
            attn_probs<1>(bhrows, rows, kl, q0, Tq, Tk, s, lse, p);                                             \
    }                                                                                                           \
    extern "C" __global__ void attn_dscores_##S(int bhrows, int rows, int kl, int q0, int Tq, float scale,      \
                                                const float* dp, const float* dvec, T* p) {                     \
        kernel_entry();                                                                                         \
        if (kl % 4 == 0 && vec4(dp) && vec4(p))                                                                 \
            attn_dscores<4>(bhrows, rows, kl, q0, Tq, scale, dp, dvec, p);                                      \
        else                                                                                                    \
            attn_dscores<1>(bhrows, rows, kl, q0, Tq, scale, dp, dvec, p);                                      \
    }                                                                                                           \
    extern "C" __global__ void attn_rowdot_##S(int B, int H, int Tn, int D, int row, i64 batch, const T* dout,  \
                                               const T* o, float* dvec) {                                       \
        kernel_entry();                                                                                         \
        attn_rowdot(B, H, Tn, D, row, batch, dout, o, dvec);                                                    \
    }                                                                                                           \
    extern "C" __global__ void cls_rows_##S(int V, int ldz, int r0, const T* z, const int* labels,              \
                                            float* rowloss, float* rowright, int grad, T* dz, const float* gs,  \
                                            float inv) {                                                        \
        kernel_entry();                                                                                         \
        cls_rows(V, ldz, r0, z, labels, rowloss, rowright, grad, dz, gs, inv);                                  \
    }                                                                                                           \
    extern "C" __global__ void cls_rows_stash_##S(int V, int ldz, int r0, const T* z, const int* labels,        \
                                                  float* rowloss, float* rowright, int grad, T* dz,             \
                                                  const float* gs, float inv) {                                 \
        kernel_entry();                                                                                         \
        cls_rows_stash(V, ldz, r0, z, labels, rowloss, rowright, grad, dz, gs, inv);                            \
    }
FOR_TYPES(TRANSFORMER)
