// Transformer kernels: embeddings (a gather forward; a deterministic
// backward through a bitonic sort of (id, position) keys) and the pieces of
// attention around cuBLAS's products (gathers into and scatters from
// [B·H, T, D], the masked softmax, its backward); the fused attention
// kernels are transformer_flash.cu's (F16, BF16) and
// transformer_flash32.cu's (F32).

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

// ---- paged key-value memory ----

// write_paged copies row r's key and value (C values at r·qrow) into slot
// slots[r] of the caches; a negative slot skips the row.
template <typename T>
__device__ void write_paged(int rows, int C, int qrow, const T* k, const T* v, const int* slots, T* kc, T* vc) {
    GRID_STRIDE(i, (i64)rows * C) {
        int r = (int)(i / C), c = (int)(i % C), s = slots[r];
        if (s < 0) continue;
        kc[(i64)s * C + c] = k[(i64)r * qrow + c];
        vc[(i64)s * C + c] = v[(i64)r * qrow + c];
    }
}

// scores_to_weights turns a block's scores s[0, len) into their softmax's
// numerators exp(s − max) in place and returns their sum to every thread;
// m is each thread's share of the maximum (the block's is found here, its
// barriers publishing s). Every thread of the block calls it.
__device__ float scores_to_weights(float* s, int len, float m, float* scratch) {
    int tid = threadIdx.x, nt = blockDim.x;
    m = block_max(m, scratch);
    float sum = 0.f;
    for (int j = tid; j < len; j += nt) {
        float e = __expf(s[j] - m);
        s[j] = e;
        sum += e;
    }
    return block_sum(sum, scratch);
}

// paged_row attends head h of query row r over its sequence's positions 0
// to rowPos[r] (the block's warps take turns over the positions for the
// scores, which shared memory holds beside the query: D + maxLen +
// max(blockDim.x, D) floats at smem), then its threads, in groups of D,
// over the positions again for the values, each thread a column; the
// groups' sums meet in shared memory. Every thread of the block calls it.
template <typename T>
__device__ void paged_row(int h, int r, int H, int D, int bs, int maxBlocks, int maxLen, int qrow, float scale,
                          const T* q, const T* kc, const T* vc, const int* tables, const int* rowSeq,
                          const int* rowPos, T* o, float* smem, float* scratch) {
    int tid = threadIdx.x, nt = blockDim.x;
    int C = H * D, len = rowPos[r] + 1;
    const int* table = tables + (i64)rowSeq[r] * maxBlocks;
    float *qs = smem, *s = qs + D, *part = s + maxLen;
    __syncthreads(); // the block's previous use of smem is over
    for (int d = tid; d < D; d += nt) qs[d] = ld(q, (i64)r * qrow + h * D + d) * scale;
    __syncthreads();
    int warp = tid >> 5, lane = tid & 31, warps = nt >> 5;
    for (int j = warp; j < len; j += warps) {
        i64 at = ((i64)table[j / bs] * bs + j % bs) * C + h * D;
        float acc = 0.f;
        for (int d = lane; d < D; d += 32) acc += qs[d] * ld(kc, at + d);
        acc = warp_sum(acc);
        if (lane == 0) s[j] = acc;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int j = tid; j < len; j += nt) m = fmaxf(m, s[j]);
    float sum = scores_to_weights(s, len, m, scratch);
    int groups = D >= nt ? 1 : nt / D, g = D >= nt ? 0 : tid / D;
    if (g < groups)
        for (int d = D >= nt ? tid : tid % D; d < D; d += D >= nt ? nt : D) {
            float acc = 0.f;
            for (int j = g; j < len; j += groups) acc += s[j] * ld(vc, ((i64)table[j / bs] * bs + j % bs) * C + h * D + d);
            part[g * D + d] = acc;
        }
    __syncthreads();
    float inv = 1.f / sum;
    for (int d = tid; d < D; d += nt) {
        float acc = 0.f;
        for (int k = 0; k < groups; k++) acc += part[k * D + d];
        st(o, (i64)r * C + h * D + d, acc * inv);
    }
}

// paged_attention attends head blockIdx.x of query row blockIdx.y
// (paged_row): a decoding step's rows, one a sequence.
template <typename T>
__device__ void paged_attention(int H, int D, int bs, int maxBlocks, int maxLen, int qrow, float scale, const T* q,
                                const T* kc, const T* vc, const int* tables, const int* rowSeq, const int* rowPos,
                                T* o) {
    extern __shared__ float pa_smem[];
    __shared__ float scratch[32];
    paged_row(blockIdx.x, blockIdx.y, H, D, bs, maxBlocks, maxLen, qrow, scale, q, kc, vc, tables, rowSeq, rowPos, o,
              pa_smem, scratch);
}

// PAGED_EL elements of a key or value row a thread (two ld4s), PAGED_UNROLL
// positions in flight a group of threads: paged_decode's shape (Go's
// pagedDecodeElems).
#define PAGED_EL 8
#define PAGED_UNROLL 4

// paged_decode attends head blockIdx.x of query row blockIdx.y over its
// sequence's positions, as paged_row does, for head sizes D whose groups of
// G = D/PAGED_EL threads (a power of two up to 32) each read a position's
// key or value in vector loads: the query's slice in registers, each group
// PAGED_UNROLL positions at a time (its scores summed by shuffles within the
// group), the scores and then the groups' partial sums of the values in
// shared memory (maxLen + blockDim.x·PAGED_EL floats). The pointers and
// qrow are aligned for ld4 (Go checks).
template <typename T>
__device__ void paged_decode(int H, int D, int bs, int maxBlocks, int maxLen, int qrow, float scale, const T* q,
                             const T* kc, const T* vc, const int* tables, const int* rowSeq, const int* rowPos,
                             T* o) {
    extern __shared__ float pd_smem[];
    __shared__ float scratch[32];
    int h = blockIdx.x, r = blockIdx.y, tid = threadIdx.x, nt = blockDim.x;
    int G = D / PAGED_EL, lane = tid % G, grp = tid / G, groups = nt / G, step = groups * PAGED_UNROLL;
    int C = H * D, len = rowPos[r] + 1, col = h * D + lane * PAGED_EL;
    const int* table = tables + (i64)rowSeq[r] * maxBlocks;
    float *s = pd_smem, *part = s + maxLen;
    float qv[PAGED_EL];
    ld4(q, (i64)r * qrow + col, qv);
    ld4(q, (i64)r * qrow + col + 4, qv + 4);
#pragma unroll
    for (int e = 0; e < PAGED_EL; e++) qv[e] *= scale;
    // The scores. Every group runs the same iterations, so that the
    // shuffles find all of a warp's lanes.
    float m = -INFINITY;
    for (int j0 = 0; j0 < len; j0 += step) {
        float kv[PAGED_UNROLL][PAGED_EL];
#pragma unroll
        for (int u = 0; u < PAGED_UNROLL; u++) {
            int j = j0 + u * groups + grp;
            if (j < len) {
                i64 at = ((i64)table[j / bs] * bs + j % bs) * C + col;
                ld4(kc, at, kv[u]);
                ld4(kc, at + 4, kv[u] + 4);
            } else {
#pragma unroll
                for (int e = 0; e < PAGED_EL; e++) kv[u][e] = 0.f;
            }
        }
#pragma unroll
        for (int u = 0; u < PAGED_UNROLL; u++) {
            float acc = 0.f;
#pragma unroll
            for (int e = 0; e < PAGED_EL; e++) acc += qv[e] * kv[u][e];
            for (int off = G >> 1; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
            int j = j0 + u * groups + grp;
            if (j < len) {
                if (lane == 0) s[j] = acc;
                m = fmaxf(m, acc);
            }
        }
    }
    float sum = scores_to_weights(s, len, m, scratch);
    __syncthreads(); // the weights in s, for every group
    float acc[PAGED_EL];
#pragma unroll
    for (int e = 0; e < PAGED_EL; e++) acc[e] = 0.f;
    for (int j0 = 0; j0 < len; j0 += step) {
        float vv[PAGED_UNROLL][PAGED_EL], w[PAGED_UNROLL];
#pragma unroll
        for (int u = 0; u < PAGED_UNROLL; u++) {
            int j = j0 + u * groups + grp;
            w[u] = 0.f;
            if (j < len) {
                i64 at = ((i64)table[j / bs] * bs + j % bs) * C + col;
                ld4(vc, at, vv[u]);
                ld4(vc, at + 4, vv[u] + 4);
                w[u] = s[j];
            } else {
#pragma unroll
                for (int e = 0; e < PAGED_EL; e++) vv[u][e] = 0.f;
            }
        }
#pragma unroll
        for (int u = 0; u < PAGED_UNROLL; u++)
#pragma unroll
            for (int e = 0; e < PAGED_EL; e++) acc[e] += w[u] * vv[u][e];
    }
#pragma unroll
    for (int e = 0; e < PAGED_EL; e++) part[grp * D + lane * PAGED_EL + e] = acc[e];
    __syncthreads();
    float inv = 1.f / sum;
    for (int d = tid; d < D; d += nt) {
        float a = 0.f;
        for (int k = 0; k < groups; k++) a += part[k * D + d];
        st(o, (i64)r * C + h * D + d, a * inv);
    }
}

// PAGED_TQ rows of queries and PAGED_KT positions of keys make a tile of
// paged_tiles (Go's pagedTileRows and pagedTileKeys).
#define PAGED_TQ 16
#define PAGED_KT 32

// paged_tiles attends head blockIdx.x of the query rows blockIdx.y·PAGED_TQ
// onwards (at most PAGED_TQ, below rows): a prefill's rows, many of one
// sequence at consecutive positions. The block splits its rows into runs of
// one sequence's consecutive positions. A run of one row is paged_row's; a
// longer one reads each key and value of its sequence once for all its rows,
// PAGED_KT positions at a time into shared memory (flash attention's
// online softmax: each row's running maximum m, sum l and output acc, which
// a tile's new maximum rescales), where paged_row would read them once per
// row. Shared memory: as paged_row needs, or the run's queries and outputs
// (2·PAGED_TQ·D), a tile of keys and of values (2·PAGED_KT·(D+1): a row
// padded so that a warp's threads, each a position, read distinct banks),
// the scores (PAGED_TQ·PAGED_KT) and three floats a row, whichever is more.
template <typename T>
__device__ void paged_tiles(int rows, int H, int D, int bs, int maxBlocks, int maxLen, int qrow, float scale,
                            const T* q, const T* kc, const T* vc, const int* tables, const int* rowSeq,
                            const int* rowPos, T* o) {
    extern __shared__ float pa_smem[];
    __shared__ float scratch[32];
    int h = blockIdx.x, r0 = blockIdx.y * PAGED_TQ, r1 = min(r0 + PAGED_TQ, rows);
    int tid = threadIdx.x, nt = blockDim.x, warp = tid >> 5, lane = tid & 31, warps = nt >> 5;
    int C = H * D, Dp = D + 1;
    float *qs = pa_smem, *acc = qs + PAGED_TQ * D, *ks = acc + PAGED_TQ * D, *vs = ks + PAGED_KT * Dp;
    float *sc = vs + PAGED_KT * Dp, *rm = sc + PAGED_TQ * PAGED_KT, *rl = rm + PAGED_TQ, *rc = rl + PAGED_TQ;
    for (int rs = r0, re; rs < r1; rs = re) {
        int seq = rowSeq[rs], p0 = rowPos[rs];
        for (re = rs + 1; re < r1 && rowSeq[re] == seq && rowPos[re] == p0 + (re - rs);) re++;
        int nr = re - rs;
        if (nr == 1) {
            paged_row(h, rs, H, D, bs, maxBlocks, maxLen, qrow, scale, q, kc, vc, tables, rowSeq, rowPos, o, pa_smem,
                      scratch);
            continue;
        }
        const int* table = tables + (i64)seq * maxBlocks;
        int len = p0 + nr; // the last row sees positions 0 to p0 + nr - 1
        __syncthreads();   // the block's previous use of shared memory is over
        for (int i = tid; i < nr * D; i += nt) {
            int rr = i / D, d = i % D;
            qs[i] = ld(q, (i64)(rs + rr) * qrow + h * D + d) * scale;
            acc[i] = 0.f;
        }
        for (int rr = tid; rr < nr; rr += nt) {
            rm[rr] = -INFINITY;
            rl[rr] = 0.f;
        }
        for (int k0 = 0; k0 < len; k0 += PAGED_KT) {
            int kn = min(PAGED_KT, len - k0);
            __syncthreads(); // the last tile's keys, values and scores are read
            for (int j = warp; j < kn; j += warps) { // a warp a position: its slot found once for its D values
                int pos = k0 + j;
                i64 at = ((i64)table[pos / bs] * bs + pos % bs) * C + h * D;
                for (int d = lane; d < D; d += 32) {
                    ks[j * Dp + d] = ld(kc, at + d);
                    vs[j * Dp + d] = ld(vc, at + d);
                }
            }
            __syncthreads();
            for (int i = tid; i < nr * PAGED_KT; i += nt) { // the scores, a position a thread of a warp
                int rr = i / PAGED_KT, j = i % PAGED_KT;
                float v = -INFINITY;
                if (j < kn && k0 + j <= p0 + rr) {
                    v = 0.f;
                    for (int d = 0; d < D; d++) v += qs[rr * D + d] * ks[j * Dp + d];
                }
                sc[i] = v;
            }
            __syncthreads();
            for (int rr = warp; rr < nr; rr += warps) { // each row's softmax over the tile, a warp a row
                float v = sc[rr * PAGED_KT + lane], mt = warp_max(v), mn = fmaxf(rm[rr], mt);
                float e = v == -INFINITY ? 0.f : __expf(v - mn), sum = warp_sum(e);
                sc[rr * PAGED_KT + lane] = e;
                if (lane == 0) {
                    float c = __expf(rm[rr] - mn); // 0 for the first tile: rm is -inf, mn is not (position 0 is seen)
                    rc[rr] = c;
                    rl[rr] = rl[rr] * c + sum;
                    rm[rr] = mn;
                }
            }
            __syncthreads();
            for (int i = tid; i < nr * D; i += nt) {
                int rr = i / D, d = i % D;
                float a = acc[i] * rc[rr];
                for (int j = 0; j < kn; j++) a += sc[rr * PAGED_KT + j] * vs[j * Dp + d];
                acc[i] = a;
            }
        }
        __syncthreads();
        for (int i = tid; i < nr * D; i += nt) {
            int rr = i / D, d = i % D;
            st(o, (i64)(rs + rr) * C + h * D + d, acc[i] / rl[rr]);
        }
    }
}

#define PAGED(T, S)                                                                                              \
    extern "C" __global__ void write_paged_##S(int rows, int C, int qrow, const T* k, const T* v, const int* slots, \
                                               T* kc, T* vc) {                                                   \
        kernel_entry();                                                                                         \
        write_paged(rows, C, qrow, k, v, slots, kc, vc);                                                        \
    }                                                                                                           \
    extern "C" __global__ void paged_attention_##S(int H, int D, int bs, int maxBlocks, int maxLen, int qrow,   \
                                                   float scale, const T* q, const T* kc, const T* vc,            \
                                                   const int* tables, const int* rowSeq, const int* rowPos, T* o) { \
        kernel_entry();                                                                                         \
        paged_attention(H, D, bs, maxBlocks, maxLen, qrow, scale, q, kc, vc, tables, rowSeq, rowPos, o);       \
    }                                                                                                           \
    extern "C" __global__ void paged_decode_##S(int H, int D, int bs, int maxBlocks, int maxLen, int qrow,      \
                                                float scale, const T* q, const T* kc, const T* vc,               \
                                                const int* tables, const int* rowSeq, const int* rowPos, T* o) { \
        kernel_entry();                                                                                         \
        paged_decode(H, D, bs, maxBlocks, maxLen, qrow, scale, q, kc, vc, tables, rowSeq, rowPos, o);          \
    }                                                                                                           \
    extern "C" __global__ void paged_tiles_##S(int rows, int H, int D, int bs, int maxBlocks, int maxLen,      \
                                               int qrow, float scale, const T* q, const T* kc, const T* vc,     \
                                               const int* tables, const int* rowSeq, const int* rowPos, T* o) { \
        kernel_entry();                                                                                         \
        paged_tiles(rows, H, D, bs, maxBlocks, maxLen, qrow, scale, q, kc, vc, tables, rowSeq, rowPos, o);     \
    }
FOR_TYPES(PAGED)

#define TRANSFORMER(T, S)                                                                                      \
    extern "C" __global__ void embedding_##S(int n, int dim, const int* ids, const T* table, T* y) {           \
        kernel_entry();                                                                                        \
        embedding(n, dim, ids, table, y);                                                                      \
    }                                                                                                          \
    extern "C" __global__ void embedding_bwd_##S(int n, int dim, const unsigned long long* keys, const T* dy,  \
                                                 float* dtable, int accumulate) {                              \
        kernel_entry();                                                                                        \
        embedding_bwd(n, dim, keys, dy, dtable, accumulate);                                                   \
    }                                                                                                          \
    extern "C" __global__ void attn_gather_##S(int B, int H, int Tn, int D, int row, i64 batch, const T* src,  \
                                               T* dst) {                                                       \
        kernel_entry();                                                                                        \
        attn_move<true>(B, H, Tn, D, row, batch, src, dst);                                                    \
    }                                                                                                          \
    extern "C" __global__ void attn_scatter_##S(int B, int H, int Tn, int D, int row, i64 batch, const T* src, \
                                                T* dst) {                                                      \
        kernel_entry();                                                                                        \
        attn_move<false>(B, H, Tn, D, row, batch, src, dst);                                                   \
    }                                                                                                          \
    extern "C" __global__ void attn_scatter_f32_##S(int B, int H, int Tn, int D, int row, i64 batch,           \
                                                    const float* src, T* dst) {                                \
        kernel_entry();                                                                                        \
        attn_move<false>(B, H, Tn, D, row, batch, src, dst);                                                   \
    }                                                                                                          \
    extern "C" __global__ void attn_softmax_##S(int bhrows, int rows, int kl, int q0, int Tq, int Tk,          \
                                                const float* s, T* p, float* lse) {                            \
        kernel_entry();                                                                                        \
        if (kl % 4 == 0 && vec4(s) && vec4(p))                                                                 \
            attn_softmax<4>(bhrows, rows, kl, q0, Tq, Tk, s, p, lse);                                          \
        else                                                                                                   \
            attn_softmax<1>(bhrows, rows, kl, q0, Tq, Tk, s, p, lse);                                          \
    }                                                                                                          \
    extern "C" __global__ void attn_probs_##S(int bhrows, int rows, int kl, int q0, int Tq, int Tk,            \
                                              const float* s, const float* lse, T* p) {                        \
        kernel_entry();                                                                                        \
        if (kl % 4 == 0 && vec4(s) && vec4(p))                                                                 \
            attn_probs<4>(bhrows, rows, kl, q0, Tq, Tk, s, lse, p);                                            \
        else                                                                                                   \
            attn_probs<1>(bhrows, rows, kl, q0, Tq, Tk, s, lse, p);                                            \
    }                                                                                                          \
    extern "C" __global__ void attn_dscores_##S(int bhrows, int rows, int kl, int q0, int Tq, float scale,     \
                                                const float* dp, const float* dvec, T* p) {                    \
        kernel_entry();                                                                                        \
        if (kl % 4 == 0 && vec4(dp) && vec4(p))                                                                \
            attn_dscores<4>(bhrows, rows, kl, q0, Tq, scale, dp, dvec, p);                                     \
        else                                                                                                   \
            attn_dscores<1>(bhrows, rows, kl, q0, Tq, scale, dp, dvec, p);                                     \
    }                                                                                                          \
    extern "C" __global__ void attn_rowdot_##S(int B, int H, int Tn, int D, int row, i64 batch, const T* dout, \
                                               const T* o, float* dvec) {                                      \
        kernel_entry();                                                                                        \
        attn_rowdot(B, H, Tn, D, row, batch, dout, o, dvec);                                                   \
    }
FOR_TYPES(TRANSFORMER)
