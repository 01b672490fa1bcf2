// F32 causal attention on tensor cores at F32's accuracy: transformer_flash.cu's
// algorithms (flash_fwd: the key tiles in turn, online softmax, o and the
// log-sum-exp written; flash_bwd_q and flash_bwd_kv: dq, then dk and dv,
// each accumulated in registers over the tiles its rows meet and written
// once, the probabilities recomputed from the log-sum-exp; no score matrix
// stored, no atomics) for F32 operands of head width FLASH_D, with each
// product run as three TF32 products (3xTF32): an F32 x is big + small,
// big = x rounded to TF32 and small = x − big, truncated to TF32 by the
// tensor cores (tf32_split), and a·b is taken as big_a·small_b +
// small_a·big_b + big_a·big_b, the small·small term (at most 2^-22 of the
// product) dropped: close to F32's 24 bits, where
// TF32 alone keeps 11 (TestCUDAFlashF32Accuracy measures it against
// float64 and the strict F32 path). CUTLASS's OpMultiplyAddFastF32
// multiplies F32 so, and PyTorch's memory-efficient attention runs its F32
// products so on compute capability 8.0 and later, whatever its TF32
// settings. Each tile's product into an accumulator that runs across the
// tiles (o, dq, dk, dv) is summed from zero and then added to it, as
// CUTLASS stages 3xTF32's sums: the tensor cores' additions do not round
// to nearest, and into one running accumulator a row of 1024 keys loses
// more bits (scripts/flash32-bench.py on the H200 at GPT-2 small's shape:
// relative errors of o and dk 2.4e-6 and 1.1e-5 unstaged,
// 7.2e-7 and 1.3e-6 staged; PyTorch's memory-efficient kernel 4.6e-7 and
// 7.7e-7, its strict-F32 math path 3.3e-7 and 7.7e-7).
//
// A block is four warps, 64 rows (queries; keys in flash_bwd_kv_f32) of
// one (batch, head), each warp 16 rows, running mma.sync.m16n8k8 on TF32.
// The tiles the block steps through are split as it copies them into
// shared memory (dynamic: a big and a small tile of each operand, rows of
// FLASH_D + 4 words, which keeps the fragments' loads free of bank
// conflicts), B fragments read from there. The block's own rows, the A
// fragments, are F32, split as each product uses them: in registers in
// the forward (q), in raw shared tiles in the backward (q and do, k and
// v), whose accumulators leave no registers for them. The scores'
// accumulator fragments become the next product's A fragments without a
// move: an m16n8k8 A fragment holds columns t and t+4 of the thread's
// rows where the accumulator holds columns 2t and 2t+1, so a product with
// the scores on the left takes the keys (queries) of each step of eight
// in that order, reading the tile's rows 2t and 2t+1 for B's rows t and
// t+4.

// F32_LD (from Go: flash32LD) is the words of a shared tile's row.
// F32_FWD_BLOCKS, F32_BWD_Q_BLOCKS and F32_BWD_KV_BLOCKS are the blocks of
// each kernel a multiprocessor should hold, a bound on the registers: more
// blocks hide more of the kernels' waits, which cost them more than their
// products. On the H200 at GPT-2 small's shape (scripts/flash32-bench.py)
// the forward took 0.97 ms with three blocks (168 registers,
// 96 bytes spilled) and 1.20 with two (250, none); the backward's shared
// memory leaves room for two (q 213 registers, kv 255 and 184 bytes
// spilled: 2.94 ms for both kernels; PyTorch's memory-efficient
// kernels 0.93 and 2.45 ms).
#define F32_FWD_BLOCKS 3
#define F32_BWD_Q_BLOCKS 2
#define F32_BWD_KV_BLOCKS 2

// F32_TILE is the words of one shared tile; the forward's dynamic shared
// memory holds four, the backward's six (Go's flash32Shared and
// flash32BwdShared), flash_bwd_kv_f32's the tile's log-sum-exps and
// Σ do·o after them.
#define F32_TILE (FLASH_TILE * F32_LD)

// load_tile_f32 copies rows t0 .. t0+FLASH_TILE−1 of head (b, h) of x
// into shared tiles, 16 bytes a thread at a time, zeros past Tn: split
// into big and small (SPLIT), or as they are into big.
template <bool SPLIT>
__device__ __forceinline__ void load_tile_f32(unsigned* big, unsigned* small, const float* x, int row, i64 batch, int b, int h,
                                              int t0, int Tn) {
    for (int i = threadIdx.x; i < FLASH_TILE * FLASH_D / 4; i += blockDim.x) {
        int r = i / (FLASH_D / 4), c = 4 * (i % (FLASH_D / 4));
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t0 + r < Tn) v = *(const float4*)(x + b * batch + (i64)(t0 + r) * row + h * FLASH_D + c);
        if (!SPLIT) {
            *(float4*)(big + r * F32_LD + c) = v;
            continue;
        }
        uint4 vb, vs;
        tf32_split(v.x, vb.x, vs.x);
        tf32_split(v.y, vb.y, vs.y);
        tf32_split(v.z, vb.z, vs.z);
        tf32_split(v.w, vb.w, vs.w);
        *(uint4*)(big + r * F32_LD + c) = vb;
        *(uint4*)(small + r * F32_LD + c) = vs;
    }
}

// frag_a_f32 loads the F32 A fragments of the warp's 16 rows r0.. of head
// (b, h) of x, FLASH_D / 8 steps of eight columns: a[s][e] is row r0 + g +
// 8(e&1), column 8s + t + 4(e>>1); 0 past Tn.
__device__ __forceinline__ void frag_a_f32(float (&a)[FLASH_D / 8][4], const float* x, int row, i64 batch, int b, int h, int r0,
                                           int Tn) {
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const float* xh = x + b * batch + h * FLASH_D;
#pragma unroll
    for (int s = 0; s < FLASH_D / 8; s++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int r = r0 + g + 8 * (e & 1), c = 8 * s + t + 4 * (e >> 1);
            a[s][e] = r < Tn ? xh[(i64)r * row + c] : 0.f;
        }
}

// a_at is element e of the warp's A fragment of step st (frag_a_f32's
// order): from the fragments in registers, or from the warp's 16 rows of
// a raw shared tile.
__device__ __forceinline__ float a_at(const float (&a)[FLASH_D / 8][4], int st, int e) { return a[st][e]; }
__device__ __forceinline__ float a_at(const float* rows, int st, int e) {
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    return rows[(g + 8 * (e & 1)) * F32_LD + 8 * st + t + 4 * (e >> 1)];
}

// scores_f32 is s = a·tileᵀ for the warp's 16 rows: a (16 × FLASH_D, as
// a_at reads it, split step by step) times the transposed FLASH_TILE ×
// FLASH_D tile held as big and small, whose rows are s's columns.
template <typename A>
__device__ __forceinline__ void scores_f32(float (&s)[NT][4], const A& a, const unsigned* big, const unsigned* small) {
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    int kr = g * F32_LD + t; // B = tileᵀ: row t of the step, column g of each 8 rows
#pragma unroll
    for (int st = 0; st < FLASH_D / 8; st++) {
        unsigned ab[4], as[4];
#pragma unroll
        for (int e = 0; e < 4; e++) tf32_split(a_at(a, st, e), ab[e], as[e]);
        unsigned bb[NT][2], bs[NT][2];
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int i = kr + 8 * n * F32_LD + 8 * st + 4 * e;
                bb[n][e] = big[i], bs[n][e] = small[i];
            }
        mma3(s, ab, as, bb, bs);
    }
}

// scores_times is acc += p·tile for the warp's 16 rows: p a tile of scores
// (16 × FLASH_TILE, as the accumulators hold them, split as they are
// used) times the FLASH_TILE × FLASH_D tile held as big and small, staged
// (the Note above); the columns 2t and 2t+1 of each step of eight are the
// step's t and t+4.
__device__ __forceinline__ void scores_times(float (&acc)[DT][4], const float (&p)[NT][4], const unsigned* big,
                                             const unsigned* small) {
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    float tile[DT][4];
#pragma unroll
    for (int j = 0; j < DT; j++) tile[j][0] = tile[j][1] = tile[j][2] = tile[j][3] = 0.f;
#pragma unroll
    for (int n = 0; n < NT; n++) {
        unsigned pb[4], ps[4];
        tf32_split(p[n][0], pb[0], ps[0]);
        tf32_split(p[n][2], pb[1], ps[1]);
        tf32_split(p[n][1], pb[2], ps[2]);
        tf32_split(p[n][3], pb[3], ps[3]);
        int vr = (8 * n + 2 * t) * F32_LD + g;
        unsigned bb[DT][2], bs[DT][2];
#pragma unroll
        for (int j = 0; j < DT; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int i = vr + e * F32_LD + 8 * j;
                bb[j][e] = big[i], bs[j][e] = small[i];
            }
        mma3(tile, pb, ps, bb, bs);
    }
#pragma unroll
    for (int j = 0; j < DT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] += tile[j][e];
}

// store_rows_f32 writes the warp's 16 rows r0.. of head (b, h) of x from
// accumulators acc (16 × FLASH_D) times scale[r] (the thread's two rows),
// those before Tn.
__device__ __forceinline__ void store_rows_f32(float* x, int row, i64 batch, int b, int h, int r0, int Tn, const float (&acc)[DT][4],
                                               const float (&scale)[2]) {
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int rr = r0 + g + 8 * r;
        if (rr >= Tn) continue;
        float* xr = x + b * batch + (i64)rr * row + h * FLASH_D + 2 * t;
#pragma unroll
        for (int j = 0; j < DT; j++) *(float2*)(xr + 8 * j) = make_float2(acc[j][2 * r] * scale[r], acc[j][2 * r + 1] * scale[r]);
    }
}

// flash_fwd_f32: o = softmax(scale·q·kᵀ, causal)·v and lse its
// log-sum-exp, as flash_fwd. Grid (⌈Tq/64⌉, B·H), 128 threads. Query i
// sees keys 0..Tk−Tq+i; operands strided as flash_fwd's (element (b, t, h,
// d) at b·batch + t·row + h·D + d), their strides multiples of 4 and their
// addresses of 16 bytes (the Go side checks).
__device__ void flash_fwd_f32(int H, int Tq, int Tk, float scale, const float* q, int qrow, i64 qbatch, const float* k, int krow,
                              i64 kbatch, const float* v, int vrow, i64 vbatch, float* o, int orow, i64 obatch, float* lse) {
    extern __shared__ uint4 f32_tiles[];
    unsigned *kb = (unsigned*)f32_tiles, *ks = kb + F32_TILE, *vb = ks + F32_TILE, *vs = vb + F32_TILE;
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int q0 = (gridDim.x - 1 - blockIdx.x) * 64; // the costliest blocks first
    int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    int r0 = q0 + warp * 16;
    int shift = Tk - Tq;
    int last = shift + min(q0 + 64, Tq) - 1; // the block's last visible key
    int mine = shift + min(r0 + 16, Tq) - 1; // the warp's
    float sl2 = scale * LOG2E;
    float qa[FLASH_D / 8][4];
    frag_a_f32(qa, q, qrow, qbatch, b, h, r0, Tq);
    float acc[DT][4];
#pragma unroll
    for (int j = 0; j < DT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    for (int k0 = 0; k0 <= last; k0 += FLASH_TILE) {
        __syncthreads(); // the tiles before are read
        load_tile_f32<true>(kb, ks, k, krow, kbatch, b, h, k0, Tk);
        load_tile_f32<true>(vb, vs, v, vrow, vbatch, b, h, k0, Tk);
        __syncthreads();
        if (k0 > mine) continue;
        float s[NT][4], alpha[2];
        scores_f32(s, qa, kb, ks);
        if (k0 + FLASH_TILE - 1 > shift + r0 || k0 + FLASH_TILE > Tk) // the warp's first row sees fewer keys
            fwd_softmax<true>(s, alpha, m, l, sl2, r0 + g, k0 + 2 * t, shift, Tk);
        else
            fwd_softmax<false>(s, alpha, m, l, sl2, r0 + g, k0 + 2 * t, shift, Tk);
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int j = 0; j < DT; j++) acc[j][2 * r] *= alpha[r], acc[j][2 * r + 1] *= alpha[r];
        scores_times(acc, s, vb, vs);
    }
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float lr = quad_sum(l[r]);
        int row = r0 + g + 8 * r;
        inv[r] = 1.f / lr;
        if (t == 0 && row < Tq) lse[(i64)bh * Tq + row] = (m[r] + log2f(lr)) / LOG2E;
    }
    store_rows_f32(o, orow, obatch, b, h, r0, Tq, acc, inv);
}

// flash_bwd_q_f32: dq = ds·k·scale for a block of 64 queries over the key
// tiles they see (Tq == Tk), as flash_bwd_q: first the rows' Σ do·o,
// written to dvec for flash_bwd_kv_f32. Grid (⌈T/64⌉, B·H), 128 threads.
__device__ void flash_bwd_q_f32(int H, int Tn, float scale, const float* q, int qrow, i64 qbatch, const float* k, int krow,
                                i64 kbatch, const float* v, int vrow, i64 vbatch, const float* dout, int dorow, i64 dobatch,
                                const float* o, int orow, i64 obatch, const float* lse, float* dvec, float* dq, int dqrow,
                                i64 dqbatch) {
    extern __shared__ uint4 f32_tiles[];
    unsigned *kb = (unsigned*)f32_tiles, *ks = kb + F32_TILE, *vb = ks + F32_TILE, *vs = vb + F32_TILE;
    float *qt = (float*)(vs + F32_TILE), *dt = qt + F32_TILE; // the block's q and do, raw
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int q0 = (gridDim.x - 1 - blockIdx.x) * 64; // the costliest blocks first
    int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    int r0 = q0 + warp * 16;
    int last = min(q0 + 64, Tn) - 1, mine = min(r0 + 16, Tn) - 1; // the block's and the warp's last visible key
    float sl2 = scale * LOG2E;
    load_tile_f32<false>((unsigned*)qt, nullptr, q, qrow, qbatch, b, h, q0, Tn);
    load_tile_f32<false>((unsigned*)dt, nullptr, dout, dorow, dobatch, b, h, q0, Tn);
    const float *qa = qt + warp * 16 * F32_LD, *da = dt + warp * 16 * F32_LD;
    float rl[2], rd[2] = {0.f, 0.f};
    {
        float oa[FLASH_D / 8][4], doa[FLASH_D / 8][4];
        frag_a_f32(oa, o, orow, obatch, b, h, r0, Tn);
        frag_a_f32(doa, dout, dorow, dobatch, b, h, r0, Tn);
#pragma unroll
        for (int s = 0; s < FLASH_D / 8; s++)
#pragma unroll
            for (int e = 0; e < 4; e++) rd[e & 1] += doa[s][e] * oa[s][e];
    }
    q_rows(rl, rd, lse, dvec, bh, r0, Tn);
    float acc[DT][4];
#pragma unroll
    for (int j = 0; j < DT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (int k0 = 0; k0 <= last; k0 += FLASH_TILE) {
        __syncthreads(); // the tiles before are read
        load_tile_f32<true>(kb, ks, k, krow, kbatch, b, h, k0, Tn);
        load_tile_f32<true>(vb, vs, v, vrow, vbatch, b, h, k0, Tn);
        __syncthreads();
        if (k0 > mine) continue;
        float s[NT][4], dp[NT][4];
        scores_f32(s, qa, kb, ks);
        if (k0 + FLASH_TILE - 1 > r0 || k0 + FLASH_TILE > Tn) // the warp's first row sees fewer keys
            q_probs<true>(s, rl, sl2, r0 + g, k0 + 2 * t, Tn);
        else
            q_probs<false>(s, rl, sl2, r0 + g, k0 + 2 * t, Tn);
        scores_f32(dp, da, vb, vs);
        q_ds(s, dp, rd);
        scores_times(acc, s, kb, ks);
    }
    store_rows_f32(dq, dqrow, dqbatch, b, h, r0, Tn, acc, {scale, scale});
}

// flash_bwd_kv_f32: dv = pᵀ·do and dk = dsᵀ·q·scale for a block of 64 keys
// over the query tiles that see them (Tq == Tk), as flash_bwd_kv, after
// flash_bwd_q_f32 (which writes dvec). Grid (⌈T/64⌉, B·H), 128 threads.
__device__ void flash_bwd_kv_f32(int H, int Tn, float scale, const float* q, int qrow, i64 qbatch, const float* k, int krow,
                                 i64 kbatch, const float* v, int vrow, i64 vbatch, const float* dout, int dorow, i64 dobatch,
                                 const float* lse, const float* dvec, float* dk, int dkrow, i64 dkbatch, float* dv, int dvrow,
                                 i64 dvbatch) {
    extern __shared__ uint4 f32_tiles[];
    unsigned *qb = (unsigned*)f32_tiles, *qs = qb + F32_TILE, *db = qs + F32_TILE, *ds = db + F32_TILE;
    float *kt = (float*)(ds + F32_TILE), *vt = kt + F32_TILE; // the block's k and v, raw
    float *slse = vt + F32_TILE, *sdvec = slse + FLASH_TILE;
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int k0 = blockIdx.x * 64; // the costliest blocks first
    int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    int r0 = k0 + warp * 16; // this warp's keys
    float sl2 = scale * LOG2E;
    load_tile_f32<false>((unsigned*)kt, nullptr, k, krow, kbatch, b, h, k0, Tn);
    load_tile_f32<false>((unsigned*)vt, nullptr, v, vrow, vbatch, b, h, k0, Tn);
    const float *ka = kt + warp * 16 * F32_LD, *va = vt + warp * 16 * F32_LD;
    float dka[DT][4], dva[DT][4];
#pragma unroll
    for (int j = 0; j < DT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[j][e] = dva[j][e] = 0.f;
    for (int t0 = k0; t0 < Tn; t0 += FLASH_TILE) {
        __syncthreads(); // the tiles before are read
        load_tile_f32<true>(qb, qs, q, qrow, qbatch, b, h, t0, Tn);
        load_tile_f32<true>(db, ds, dout, dorow, dobatch, b, h, t0, Tn);
        for (int i = threadIdx.x; i < FLASH_TILE; i += blockDim.x) {
            bool in = t0 + i < Tn;
            slse[i] = in ? lse[(i64)bh * Tn + t0 + i] : 0.f;
            sdvec[i] = in ? dvec[(i64)bh * Tn + t0 + i] : 0.f;
        }
        __syncthreads();
        if (t0 + FLASH_TILE <= r0) continue; // every query of the tile precedes the warp's keys
        // pᵀ = exp(k·qᵀ − lse), dpᵀ = v·doᵀ: 16 keys × 64 queries.
        float p[NT][4], dp[NT][4];
        scores_f32(p, ka, qb, qs);
        if (t0 < r0 + 15 || t0 + FLASH_TILE > Tn) // some query of the tile is before some key of the warp
            kv_probs<true>(p, slse, sl2, r0 + g, t0 + 2 * t, Tn);
        else
            kv_probs<false>(p, slse, sl2, r0 + g, t0 + 2 * t, Tn);
        scores_f32(dp, va, db, ds);
        kv_ds(p, dp, sdvec);
        scores_times(dva, p, db, ds);
        scores_times(dka, dp, qb, qs);
    }
    store_rows_f32(dk, dkrow, dkbatch, b, h, r0, Tn, dka, {scale, scale});
    store_rows_f32(dv, dvrow, dvbatch, b, h, r0, Tn, dva, {1.f, 1.f});
}

extern "C" __global__ void __launch_bounds__(128, F32_FWD_BLOCKS) flash_fwd_f32(int B, int H, int Tq, int Tk, float scale,
                                                                                const float* q, int qrow, i64 qbatch,
                                                                                const float* k, int krow, i64 kbatch,
                                                                                const float* v, int vrow, i64 vbatch, float* o,
                                                                                int orow, i64 obatch, float* lse) {
    kernel_entry();
    (void)B;
    flash_fwd_f32(H, Tq, Tk, scale, q, qrow, qbatch, k, krow, kbatch, v, vrow, vbatch, o, orow, obatch, lse);
}

extern "C" __global__ void __launch_bounds__(128, F32_BWD_Q_BLOCKS)
    flash_bwd_q_f32(int B, int H, int Tn, float scale, const float* q, int qrow, i64 qbatch, const float* k, int krow, i64 kbatch,
                    const float* v, int vrow, i64 vbatch, const float* dout, int dorow, i64 dobatch, const float* o, int orow,
                    i64 obatch, const float* lse, float* dvec, float* dq, int dqrow, i64 dqbatch) {
    kernel_entry();
    (void)B;
    flash_bwd_q_f32(H, Tn, scale, q, qrow, qbatch, k, krow, kbatch, v, vrow, vbatch, dout, dorow, dobatch, o, orow, obatch, lse,
                    dvec, dq, dqrow, dqbatch);
}

extern "C" __global__ void __launch_bounds__(128, F32_BWD_KV_BLOCKS)
    flash_bwd_kv_f32(int B, int H, int Tn, float scale, const float* q, int qrow, i64 qbatch, const float* k, int krow,
                     i64 kbatch, const float* v, int vrow, i64 vbatch, const float* dout, int dorow, i64 dobatch,
                     const float* lse, const float* dvec, float* dk, int dkrow, i64 dkbatch, float* dv, int dvrow, i64 dvbatch) {
    kernel_entry();
    (void)B;
    flash_bwd_kv_f32(H, Tn, scale, q, qrow, qbatch, k, krow, kbatch, v, vrow, vbatch, dout, dorow, dobatch, lse, dvec, dk, dkrow,
                     dkbatch, dv, dvrow, dvbatch);
}
