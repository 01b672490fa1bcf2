// Fused causal attention on tensor cores (flash attention, in the manner of
// FlashAttention-2), for F16 and BF16 operands with F32 accumulation and a
// head width of FLASH_D. No kernel stores a score matrix: scores live in
// registers a tile at a time.
//
//   flash_fwd     a block per FLASH_ROWS queries of one (batch, head): the
//                 key tiles in turn, online softmax; o and the log-sum-exp
//                 written.
//   flash_bwd     a block per 64 keys: the query tiles that see them in
//                 turn, p recomputed from the log-sum-exp; dk and dv
//                 accumulated in registers and written once, each tile's
//                 share of dq added to the others' in turn.
//
// Each reduction runs in a fixed order (no atomics; Note [dq in turn]), so
// results repeat bit for bit. Operands are strided [B, T, H, D] as attn_gather reads them;
// lse and dvec (Σ do·o, attn_rowdot's) are [B·H, T] F32. A warp owns 16
// of its block's rows and runs mma.sync.m16n8k16; its A fragments come
// from global memory as 32-bit pairs, the tiles it shares into shared
// memory 16 bytes at a time and its B fragments from there by ldmatrix, so
// the strides and offsets must be multiples of 8 elements (the Go side
// checks). The tiles' rows are FLASH_D + 8 halves (144 bytes), which keeps
// ldmatrix free of bank conflicts. Scores are kept in log2 units
// (scale·log2 e folded in) for exp2.
//
// The kernels are bound by issued instructions more than by the tensor
// cores, so the per-score work is kept to the least: only the tiles that
// cross the diagonal (or the end of the keys) test each score (the MASK
// instances of fwd_softmax and kv_probs), probabilities round in
// pairs with one cvt, 2^x is one MUFU.EX2, the backward applies the
// scale to dk and dq once, and ldmatrix addresses are a base plus
// constants. FLASH_D, FLASH_TILE and FLASH_WG come from Go (source.go's prelude).
//
// On Hopper (sm_90a, the target the backend compiles for on compute
// capability 9.0) the same kernels run their products as warpgroup MMAs
// (wgmma.mma_async m64n64k16): each four warps of a block are a
// warpgroup, each warp's 16 rows of the accumulators are where mma.sync
// puts them, A stays in registers (q, k, v, do loaded as before; p and ds
// as the scores become them; dsᵀ's transpose, for dq, is read from its
// shared tile) and B is read by the tensor cores straight from the shared
// tiles, whose rows are then 128 bytes, unpadded, in the 128-byte swizzle
// wgmma's descriptors name. One instruction a warpgroup does a 64×64×16
// product, for 32 mma.sync and 16 ldmatrix (the issue slots the mma.sync
// kernels are bound by). The products' helpers (mma_abt, mma_ab, mma_atb,
// and mma_wait and mma_done after them) hide which of the two runs;
// everything else is shared.

// A forward block is FLASH_WG warpgroups (from Go), FLASH_ROWS rows of
// queries, 64 a warpgroup, sharing each tile it copies; a backward block
// is one warpgroup.
// The warpgroups of each kernel a multiprocessor should hold at once: a
// bound on its registers (measured on the H200 with scripts/flash-bench.py).
#define FLASH_ROWS (64 * FLASH_WG)
#define FLASH_THREADS (128 * FLASH_WG)
#define FLASH_FWD_WARPGROUPS 4
#define FLASH_BWD_WARPGROUPS 2
#define FLASH_BWD_PROBE 0
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASH_WGMMA 1
#define FLASH_LD FLASH_D // 128-byte rows, swizzled (tile_at)
static_assert(FLASH_D == 64 && FLASH_TILE == 64, "the wgmma path's tiles are 64 rows of 128 bytes");
#else
#define FLASH_WGMMA 0
#define FLASH_LD (FLASH_D + 8)
#endif

// pack2 rounds two floats to T (to nearest even) and packs them, lo in the
// low half: one cvt of both on sm_80 and later, where the kernels run.
template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<f16>(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (unsigned)f2h(lo) | ((unsigned)f2h(hi) << 16);
#endif
}
template <> __device__ __forceinline__ unsigned pack2<bf16>(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (unsigned)f2bf(lo).x | ((unsigned)f2bf(hi).x << 16);
#endif
}

// mma16816 is c += a·b for a 16×16 A (row-major fragment, 4 registers), a
// 16×8 B (column fragment, 2 registers) and a 16×8 F32 C.
template <typename T> __device__ __forceinline__ void mma16816(float* c, const unsigned* a, const unsigned* b);
template <> __device__ __forceinline__ void mma16816<f16>(float* c, const unsigned* a, const unsigned* b) {
#if __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}
template <> __device__ __forceinline__ void mma16816<bf16>(float* c, const unsigned* a, const unsigned* b) {
#if __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// A strided operand: element (b, t, h, d) at b·batch + t·row + h·D + d.
struct FlashOperand {
    const unsigned short* p;
    int row;
    i64 batch;
};

// load32 is the pair of elements (t, d), (t, d+1) of head (b, h), or 0
// past the T rows.
__device__ __forceinline__ unsigned load32(FlashOperand x, int b, int h, int t, int d, int T) {
    if (t >= T) return 0u;
    return *(const unsigned*)(x.p + b * x.batch + (i64)t * x.row + h * FLASH_D + d);
}

// smem_addr is a shared-memory pointer as the 32-bit address ldmatrix and
// cp.async take.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// tile_at is where a tile keeps the 16 bytes (8 elements) c of its row r:
// on the wgmma path the 128-byte swizzle (the chunk's index XOR the row's
// within its group of 8: Swizzle<3,4,3> on the address, so tiles start on
// 1024 bytes), else a padded row.
__device__ __forceinline__ int tile_at(int r, int c) {
#if FLASH_WGMMA
    return r * FLASH_LD + 8 * (c ^ (r & 7));
#else
    return r * FLASH_LD + 8 * c;
#endif
}

// load_tile_async copies rows t0.. of a head into a FLASH_TILE × FLASH_LD
// shared tile, 16 bytes at a time with cp.async (the copies run while the
// block computes, until cp_wait), zeros past T.
__device__ __forceinline__ void load_tile_async(unsigned short* tile, FlashOperand x, int b, int h, int t0, int T) {
    const int per = FLASH_D / 8;
    for (int i = threadIdx.x; i < FLASH_TILE * per; i += blockDim.x) {
        int r = i / per, c = i % per;
        int t = min(t0 + r, T - 1); // a valid address; nothing is read past T
        const unsigned short* src = x.p + b * x.batch + (i64)t * x.row + h * FLASH_D + 8 * c;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(tile + tile_at(r, c))), "l"(src),
                     "r"(t0 + r < T ? 16 : 0));
    }
}

// load_rows_async copies FLASH_TILE floats v[i0..] into shared s with
// cp.async, 4 bytes at a time, zeros past T.
__device__ __forceinline__ void load_rows_async(float* s, const float* v, int i0, int T) {
    for (int i = threadIdx.x; i < FLASH_TILE; i += blockDim.x) {
        int t = min(i0 + i, T - 1);
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(s + i)), "l"(v + t), "r"(i0 + i < T ? 4 : 0));
    }
}

__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
// cp_wait waits until at most n of this thread's groups are in flight; on
// the wgmma path it also orders this thread's copies before the tensor
// cores' reads (which go through the async proxy), so that a barrier after
// it publishes the tiles to wgmma as to ldmatrix.
// async_fence orders this thread's writes to shared memory before the
// tensor cores' reads of them on the wgmma path (which go through the
// async proxy): a barrier after it publishes them to wgmma.
__device__ __forceinline__ void async_fence() {
#if FLASH_WGMMA
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
template <int n> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(n));
    async_fence();
}

// The A fragment (16×16, rows r0.., columns k0..) of a strided operand, from
// global memory.
__device__ __forceinline__ void frag_a_global(unsigned* a, FlashOperand x, int b, int h, int r0, int k0, int T) {
    int g = (threadIdx.x & 31) >> 2, q = threadIdx.x & 3;
    a[0] = load32(x, b, h, r0 + g, k0 + 2 * q, T);
    a[1] = load32(x, b, h, r0 + g + 8, k0 + 2 * q, T);
    a[2] = load32(x, b, h, r0 + g, k0 + 2 * q + 8, T);
    a[3] = load32(x, b, h, r0 + g + 8, k0 + 2 * q + 8, T);
}

// A tile's ldmatrix addresses are the shared-memory address of its element
// (0, 0) plus this lane's offset, in bytes: lane l gives the address of row
// l%8 of matrix l/8. lane_bt is the offset for frag_bt, lane_b for frag_b.
// The fragments' own offsets are constants once the loops unroll, which
// the assembler folds into the ldmatrix instructions.
__device__ __forceinline__ unsigned lane_bt() {
    int l = threadIdx.x & 31, m = l >> 3, r = l & 7;
    return 2u * (((m >> 1) * 8 + r) * FLASH_LD + (m & 1) * 8);
}
__device__ __forceinline__ unsigned lane_b() {
    int l = threadIdx.x & 31, m = l >> 3, r = l & 7;
    return 2u * (((m & 1) * 8 + r) * FLASH_LD + (m >> 1) * 8);
}
#define TILE_BYTES (2 * FLASH_TILE * FLASH_LD)

// frag_bt loads the B fragments (16×8 each) of tileᵀ for the columns n0..
// and n0+8..: B[k][n] = tile[n0+n][k0+k], with one ldmatrix of four 8×8
// matrices; bf[0..1] is n0's fragment, bf[2..3] n0+8's. at is the tile's
// address plus lane_bt().
__device__ __forceinline__ void frag_bt(unsigned* bf, unsigned at, int n0, int k0) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(bf[0]), "=r"(bf[1]), "=r"(bf[2]), "=r"(bf[3]) : "r"(at + 2u * (n0 * FLASH_LD + k0)));
}

// frag_b loads the B fragments of the tile itself for the columns n0.. and
// n0+8..: B[k][n] = tile[k0+k][n0+n], with one transposing ldmatrix. at is
// the tile's address plus lane_b().
__device__ __forceinline__ void frag_b(unsigned* bf, unsigned at, int k0, int n0) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(bf[0]), "=r"(bf[1]), "=r"(bf[2]), "=r"(bf[3]) : "r"(at + 2u * (k0 * FLASH_LD + n0)));
}

// c_to_a packs two C fragments (16×8 each: columns 16j.. and 16j+8..) into
// the A fragment (16×16) of the next product, in T.
template <typename T> __device__ __forceinline__ void c_to_a(unsigned* a, const float* c0, const float* c1) {
    a[0] = pack2<T>(c0[0], c0[1]);
    a[1] = pack2<T>(c0[2], c0[3]);
    a[2] = pack2<T>(c1[0], c1[1]);
    a[3] = pack2<T>(c1[2], c1[3]);
}

#define NT (FLASH_TILE / 8) // 8-column tiles of a 64-wide score tile
#define DT (FLASH_D / 8)    // 8-column tiles of a row of o
#define KS (FLASH_D / 16)   // 16-deep steps over a head
#define PS (FLASH_TILE / 16) // 16-deep steps over a tile of scores

#if FLASH_WGMMA
// wg_desc is the wgmma descriptor of a 128-byte-swizzled operand at shared
// address a: the start address, the leading and stride byte offsets (in
// 16-byte units) and the swizzle mode. A tile's groups of 8 rows are 1024
// bytes apart, the stride for a K-major operand and for an N-major one
// alike; the other offset (between swizzle atoms along N, or unused for
// K-major) has nothing to step over, a tile's row being one atom wide, and
// holds the same 1024. The tiles start on 1024 bytes: the base offset is 0.
__device__ __forceinline__ unsigned long long wg_desc(unsigned a) {
    return (unsigned long long)((a & 0x3FFFF) >> 4) | (64ull << 16) | (64ull << 32) | (1ull << 62);
}

// wgmma is d (64×64, F32) = a·b + (ACC ? d : 0) for the warpgroup: a 64×16
// A from registers (each warp's 16 rows as mma.sync's A fragment) and a
// 16×64 B from shared memory, K-major (TRANS 0: b[k][n] at row n, column k
// of a tile) or N-major (TRANS 1: b[k][n] at row k, column n).
#define WGMMA_D                                                                                                   \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),        \
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),    \
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),    \
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),    \
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define WGMMA_ASM(TY)                                                                                             \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                                  \
    "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " "                                                   \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,"  \
    "%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"
template <typename T, int TRANS, int ACC> __device__ __forceinline__ void wgmma(float (&d)[8][4], const unsigned* a, unsigned long long b);
#define WGMMA(T, TRANS, ACC)                                                                                      \
    template <> __device__ __forceinline__ void wgmma<T, TRANS, ACC>(float (&d)[8][4], const unsigned* a, unsigned long long b) { \
        asm volatile(WGMMA_ASM(#T) : WGMMA_D : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(ACC), "n"(TRANS));     \
    }
WGMMA(f16, 0, 0)
WGMMA(f16, 0, 1)
WGMMA(f16, 1, 1)
WGMMA(bf16, 0, 0)
WGMMA(bf16, 0, 1)
WGMMA(bf16, 1, 1)

// wgmma_ss is d (64×64, F32) = a·b + (ACC ? d : 0) with both operands in
// shared memory, M-major and N-major (a[m][k] at row k, column m of a
// tile; b[k][n] at row k, column n): the product of a tile's transpose.
#define WGMMA_SS_ASM(TY)                                                                                          \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                                  \
    "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " "                                                   \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,"  \
    "%29,%30,%31}, %32, %33, p, 1, 1, 1, 1;\n}\n"
template <typename T, int ACC> __device__ __forceinline__ void wgmma_ss(float (&d)[8][4], unsigned long long a, unsigned long long b);
#define WGMMA_SS(T, ACC)                                                                                          \
    template <> __device__ __forceinline__ void wgmma_ss<T, ACC>(float (&d)[8][4], unsigned long long a, unsigned long long b) { \
        asm volatile(WGMMA_SS_ASM(#T) : WGMMA_D : "l"(a), "l"(b), "r"(ACC));                                      \
    }
WGMMA_SS(f16, 0)
WGMMA_SS(f16, 1)
WGMMA_SS(bf16, 0)
WGMMA_SS(bf16, 1)
#endif

// Each product (mma_abt, mma_ab) is a group of wgmma: the fence that
// orders the registers' earlier writes before the tensor cores read them,
// the instructions, the commit. mma_wait<n> returns when at most the last
// n groups are still running; then mma_done on each accumulator a finished
// group wrote, before anything reads it, and on each A fragment it read,
// before anything writes it: the compiler does not see the products run on
// after they are issued, and ptxas serializes them where a register they
// use is touched between their fence and their wait. On the mma.sync path
// the products are complete as they return and these are empty.
__device__ __forceinline__ void mma_begin() {
#if FLASH_WGMMA
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void mma_commit() {
#if FLASH_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int n> __device__ __forceinline__ void mma_wait() {
#if FLASH_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(n) : "memory");
#endif
}
__device__ __forceinline__ void mma_done(float (&d)[8][4]) {
#if FLASH_WGMMA
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[n][e])::"memory");
#endif
}
__device__ __forceinline__ void mma_done(unsigned (&a)[4][4]) {
#if FLASH_WGMMA
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+r"(a[n][e])::"memory");
#endif
}

// mma_abt is s = a·tileᵀ for the warp's 16 rows: a (16 × FLASH_D, KS A
// fragments) times the transposed FLASH_TILE × FLASH_D shared tile at
// shared address tile, whose rows are s's columns.
template <typename T> __device__ __forceinline__ void mma_abt(float (&s)[NT][4], unsigned (&a)[KS][4], unsigned tile) {
#if FLASH_WGMMA
    mma_done(a);
    mma_begin();
    wgmma<T, 0, 0>(s, a[0], wg_desc(tile));
#pragma unroll
    for (int d = 1; d < KS; d++) wgmma<T, 0, 1>(s, a[d], wg_desc(tile + 32 * d)); // 16 elements along the row
    mma_commit();
    mma_done(s), mma_done(a);
#else
    unsigned at = tile + lane_bt();
#pragma unroll
    for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int d = 0; d < KS; d++)
#pragma unroll
        for (int n = 0; n < NT; n += 2) {
            unsigned bf[4];
            frag_bt(bf, at, 8 * n, 16 * d);
            mma16816<T>(s[n], a[d], bf);
            mma16816<T>(s[n + 1], a[d], bf + 2);
        }
#endif
}

// mma_ab is acc += a·tile for the warp's 16 rows: a (16 × FLASH_TILE, PS A
// fragments, c_to_a's of a score tile) times the FLASH_TILE × FLASH_D
// shared tile at shared address tile.
template <typename T> __device__ __forceinline__ void mma_ab(float (&acc)[DT][4], unsigned (&a)[PS][4], unsigned tile) {
#if FLASH_WGMMA
    mma_done(acc), mma_done(a);
    mma_begin();
#pragma unroll
    for (int kk = 0; kk < PS; kk++) wgmma<T, 1, 1>(acc, a[kk], wg_desc(tile + 2 * 16 * FLASH_LD * kk)); // 16 rows on
    mma_commit();
    mma_done(acc), mma_done(a);
#else
    unsigned at = tile + lane_b();
#pragma unroll
    for (int kk = 0; kk < PS; kk++)
#pragma unroll
        for (int j = 0; j < DT; j += 2) {
            unsigned bf[4];
            frag_b(bf, at, 16 * kk, 8 * j);
            mma16816<T>(acc[j], a[kk], bf);
            mma16816<T>(acc[j + 1], a[kk], bf + 2);
        }
#endif
}

// frag_at loads the A fragment (16×16) of a tile's transpose for the rows
// m0.. and columns k0..: A[m][k] = tile[k0+k][m0+m], with one transposing
// ldmatrix. at is the tile's address plus lane_bt().
__device__ __forceinline__ void frag_at(unsigned* a, unsigned at, int k0, int m0) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(at + 2u * (k0 * FLASH_LD + m0)));
}

// mma_atb is acc = tᵀ·tile for the warpgroup's 64 rows (a warp's 16 as
// everywhere): t (FLASH_TILE × 64, its columns acc's rows) and tile
// (FLASH_TILE × FLASH_D) both shared, at shared addresses t and tile.
template <typename T> __device__ __forceinline__ void mma_atb(float (&acc)[DT][4], unsigned t, unsigned tile) {
#if FLASH_WGMMA
    mma_done(acc);
    mma_begin();
    wgmma_ss<T, 0>(acc, wg_desc(t), wg_desc(tile));
#pragma unroll
    for (int kk = 1; kk < PS; kk++) wgmma_ss<T, 1>(acc, wg_desc(t + 2 * 16 * FLASH_LD * kk), wg_desc(tile + 2 * 16 * FLASH_LD * kk));
    mma_commit();
    mma_done(acc);
#else
    unsigned at = t + lane_bt(), bt = tile + lane_b();
    int m0 = 16 * ((threadIdx.x >> 5) & 3);
#pragma unroll
    for (int j = 0; j < DT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < PS; kk++) {
        unsigned a[4];
        frag_at(a, at, 16 * kk, m0);
#pragma unroll
        for (int j = 0; j < DT; j += 2) {
            unsigned bf[4];
            frag_b(bf, bt, 16 * kk, 8 * j);
            mma16816<T>(acc[j], a, bf);
            mma16816<T>(acc[j + 1], a, bf + 2);
        }
    }
#endif
}

// scores_to_a turns a score tile into the A fragments of the next product, in T.
template <typename T> __device__ __forceinline__ void scores_to_a(unsigned (&a)[PS][4], const float (&s)[NT][4]) {
#pragma unroll
    for (int kk = 0; kk < PS; kk++) c_to_a<T>(a[kk], s[2 * kk], s[2 * kk + 1]);
}

// check_tiles traps when a block's shared tiles are not where the wgmma
// descriptors assume (1024-byte aligned): a wrong layout must not compute.
__device__ __forceinline__ void check_tiles(const void* t) {
#if FLASH_WGMMA
    if (smem_addr(t) & 1023) __trap();
#endif
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// store32 writes the pair (t, d), (t, d+1) of head (b, h) of a strided T
// operand, if t < T.
template <typename T>
__device__ __forceinline__ void store32(unsigned short* p, int row, i64 batch, int b, int h, int t, int d, int Tn, float x, float y) {
    if (t < Tn) *(unsigned*)(p + b * batch + (i64)t * row + h * FLASH_D + d) = pack2<T>(x, y);
}

// fwd_softmax folds a tile of scores s (16 rows × 64 keys of a warp; this
// thread's first row and key are row and key) into the running maxima m
// and sums l, leaves the tile's probabilities in s and the factor by which
// each of the thread's two rows of the output must shrink in alpha. MASK
// (the tiles that cross the diagonal or the end of the keys) hides the
// keys a row does not see; the other tiles carry no test.
template <bool MASK>
__device__ __forceinline__ void fwd_softmax(float (&s)[NT][4], float (&alpha)[2], float (&m)[2], float (&l)[2], float sl2,
                                            int row, int key, int shift, int Tk) {
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float x = s[n][e] * sl2;
            if (MASK) {
                int r = row + (e >> 1) * 8, c = key + 8 * n + (e & 1);
                if (c > shift + r || c >= Tk) x = -INFINITY;
            }
            s[n][e] = x;
            mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = quad_max(mx[r]);
        alpha[r] = ex2(m[r] - mx[r]); // 0 the first time
        m[r] = mx[r];
        l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float p = ex2(s[n][e] - m[e >> 1]);
            s[n][e] = p;
            l[e >> 1] += p;
        }
}

// flash_fwd: o = softmax(scale·q·kᵀ, causal)·v, lse its log-sum-exp.
// Grid (⌈Tq/FLASH_ROWS⌉, B·H), FLASH_THREADS threads. Query i sees keys
// 0..Tk−Tq+i. The key and value tiles are double-buffered: the next pair's
// copy runs during the current pair's products. The block's warpgroups
// share the tiles; each skips those its 64 rows all precede.
template <typename T>
__device__ void flash_fwd(int B, int H, int Tq, int Tk, float scale, FlashOperand q, FlashOperand k, FlashOperand v,
                          unsigned short* o, int orow, i64 obatch, float* lse) {
    __shared__ __align__(1024) unsigned short sk[2][FLASH_TILE * FLASH_LD];
    __shared__ __align__(1024) unsigned short sv[2][FLASH_TILE * FLASH_LD];
    check_tiles(sk), check_tiles(sv);
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int q0 = (gridDim.x - 1 - blockIdx.x) * FLASH_ROWS; // the costliest blocks first
    int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, qd = threadIdx.x & 3;
    int r0 = q0 + warp * 16;
    float sl2 = scale * LOG2E;
    int shift = Tk - Tq;
    int last = shift + min(q0 + FLASH_ROWS, Tq) - 1;                   // the block's last visible key
    int mine = shift + min(q0 + 64 * ((threadIdx.x >> 7) + 1), Tq) - 1; // its warpgroup's
    unsigned ka = smem_addr(sk[0]), va = smem_addr(sv[0]);
    load_tile_async(sk[0], k, b, h, 0, Tk);
    load_tile_async(sv[0], v, b, h, 0, Tk);
    cp_commit();
    unsigned qa[KS][4];
#pragma unroll
    for (int s = 0; s < KS; s++) frag_a_global(qa[s], q, b, h, r0, 16 * s, Tq);
    float acc[DT][4];
#pragma unroll
    for (int j = 0; j < DT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    for (int k0 = 0, buf = 0; k0 <= last; k0 += FLASH_TILE, buf ^= 1) {
        if (k0 + FLASH_TILE <= last) {
            load_tile_async(sk[buf ^ 1], k, b, h, k0 + FLASH_TILE, Tk);
            load_tile_async(sv[buf ^ 1], v, b, h, k0 + FLASH_TILE, Tk);
        }
        cp_commit();
        cp_wait<1>();
        __syncthreads();
        if (k0 <= mine) {
            float s[NT][4], alpha[2];
            mma_abt<T>(s, qa, ka + buf * TILE_BYTES);
            mma_wait<0>();
            mma_done(s);
            if (k0 + FLASH_TILE - 1 > shift + r0 || k0 + FLASH_TILE > Tk) // the warp's first row sees fewer keys
                fwd_softmax<true>(s, alpha, m, l, sl2, r0 + g, k0 + 2 * qd, shift, Tk);
            else
                fwd_softmax<false>(s, alpha, m, l, sl2, r0 + g, k0 + 2 * qd, shift, Tk);
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int j = 0; j < DT; j++) acc[j][2 * r] *= alpha[r], acc[j][2 * r + 1] *= alpha[r];
            unsigned pa[PS][4];
            scores_to_a<T>(pa, s);
            mma_ab<T>(acc, pa, va + buf * TILE_BYTES);
            mma_wait<0>();
            mma_done(acc);
        }
        __syncthreads(); // the next iteration's copy writes this buffer
    }
    cp_wait<0>();
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float lr = quad_sum(l[r]);
        int row = r0 + g + 8 * r;
        float inv = 1.f / lr;
#pragma unroll
        for (int j = 0; j < DT; j++) store32<T>(o, orow, obatch, b, h, row, 8 * j + 2 * qd, Tq, acc[j][2 * r] * inv, acc[j][2 * r + 1] * inv);
        if (qd == 0 && row < Tq) lse[(i64)bh * Tq + row] = (m[r] + log2f(lr)) / LOG2E;
    }
}

// kv_probs turns a tile of transposed scores p = k·qᵀ (16 keys × 64
// queries of a warp; this thread's first key and query are key and query)
// into pᵀ's probabilities; MASK hides the queries that do not see a key.
// kv_ds then turns dp = v·doᵀ into dsᵀ = pᵀ·(dpᵀ − Σdo·o), less the scale,
// which the caller applies to dk once. The two are apart so that the first
// runs while the tensor cores still compute dp.
template <bool MASK>
__device__ __forceinline__ void kv_probs(float (&p)[NT][4], const float* slse, float sl2, int key, int query, int Tn) {
    int qd = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float x = ex2(p[n][e] * sl2 - slse[8 * n + 2 * qd + (e & 1)] * LOG2E);
            if (MASK) {
                int c = key + (e >> 1) * 8, r = query + 8 * n + (e & 1);
                if (c > r || r >= Tn) x = 0.f;
            }
            p[n][e] = x;
        }
}
__device__ __forceinline__ void kv_ds(const float (&p)[NT][4], float (&dp)[NT][4], const float* sdvec) {
    int qd = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dp[n][e] = p[n][e] * (dp[n][e] - sdvec[8 * n + 2 * qd + (e & 1)]);
}


// store_ds writes a warp's 16 rows of dsᵀ (its A fragments da, in T) into
// the shared tile t at rows row.. (this thread's first), in tile_at's layout.
__device__ __forceinline__ void store_ds(unsigned short* t, const unsigned (&da)[PS][4], int row) {
    int qd = threadIdx.x & 3;
#pragma unroll
    for (int kk = 0; kk < PS; kk++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            int c = 2 * kk + half; // the 8-column chunk
            *(unsigned*)(t + tile_at(row, c) + 2 * qd) = da[kk][2 * half];
            *(unsigned*)(t + tile_at(row + 8, c) + 2 * qd) = da[kk][2 * half + 1];
        }
}

// ld_acquire and st_release load and store a flag at the GPU's scope,
// ordered after and before the memory operations around them.
__device__ __forceinline__ int ld_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release(int* p, int v) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Note [dq in turn]: dq = ds·k·scale sums over keys, which flash_bwd's
// blocks (64 keys each) share out: each makes every query tile's share of
// its keys, and the shares of a tile are added in one fixed order, so that
// dq repeats bit for bit without a second pass over the scores. Tile i's
// shares come from key blocks j = i, i−1, …, 0 in that order: the
// diagonal's block writes its share into an F32 accumulator, the others
// add theirs, and block 0, the last, rounds the sum into dq. Each warp
// adds the 16 rows it holds when their counter (turn, [B·H, tiles, 4]
// ints, zero at the launch) says i−j shares are in, then raises it: no
// barrier of the block waits on another block. Key block j+1 reaches tile
// i one tile before block j, and a block adds a tile's share only after it
// has started the next tile's products (add_share), so the add overlaps
// the tensor cores' work and seldom waits; blocks start in the order
// blockIdx.x runs, key blocks from the last, so the one a warp waits for
// has started before it.

// add_share adds this warp's share of dq for query tile i, dqa (16 rows
// from row0), in its turn (Note [dq in turn]); key block j makes it.
template <typename T>
__device__ __forceinline__ void add_share(const float (&dqa)[DT][4], int i, int j, int row0, int Tn, float scale, int b,
                                          int h, int bh, float* dqacc, int* turns, unsigned short* dq, int dqrow,
                                          i64 dqbatch) {
    int lane = threadIdx.x & 31, g = lane >> 2, qd = lane & 3;
    int* turn = turns + 4 * i + ((threadIdx.x >> 5) & 3);
    if (j < i && !(FLASH_BWD_PROBE & 1)) { // wait for the shares before this one
        if (lane == 0)
            while (ld_acquire(turn) != i - j) {
            }
        __syncwarp();
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row0 + g + 8 * r;
        if (row >= Tn) continue;
        float* acc = dqacc + ((i64)bh * Tn + row) * FLASH_D + 2 * qd;
#pragma unroll
        for (int c = 0; c < DT; c++) {
            float x = dqa[c][2 * r], y = dqa[c][2 * r + 1];
            if (j < i) {
                float2 in = __ldcg((const float2*)(acc + 8 * c));
                x += in.x, y += in.y;
            }
            if (j > 0)
                __stcg((float2*)(acc + 8 * c), make_float2(x, y));
            else
                store32<T>(dq, dqrow, dqbatch, b, h, row, 8 * c + 2 * qd, Tn, x * scale, y * scale);
        }
    }
    if (j > 0 && !(FLASH_BWD_PROBE & 1)) { // the next share's turn
        __syncwarp();
        if (lane == 0) st_release(turn, i - j + 1);
    }
}

// flash_bwd: dv = pᵀ·do and dk = dsᵀ·q·scale for a block of 64 keys over
// the query tiles that see them (Tq == Tk), double-buffered, and each
// tile's share of dq (Note [dq in turn]); dsᵀ goes through a shared tile
// to be transposed. Grid (⌈T/64⌉, B·H), 128 threads, flashBwdShared bytes
// of dynamic shared memory. dqacc is [B·H, T, FLASH_D] F32.
template <typename T>
__device__ void flash_bwd(int B, int H, int Tn, float scale, FlashOperand q, FlashOperand k, FlashOperand v,
                          FlashOperand dout, const float* lse, const float* dvec, unsigned short* dq, int dqrow,
                          i64 dqbatch, unsigned short* dk, int dkrow, i64 dkbatch, unsigned short* dv, int dvrow,
                          i64 dvbatch, float* dqacc, int* turn) {
    static_assert(FLASH_TILE == 64, "a block's keys are one tile");
    extern __shared__ unsigned char flash_shared[];
    // Six tiles (q and do twice, k, dsᵀ) from the first 1024-byte boundary,
    // then the log-sum-exps and row dots twice.
    unsigned short* sq = (unsigned short*)(flash_shared + ((1024 - (smem_addr(flash_shared) & 1023)) & 1023));
    unsigned short* sdo = sq + 2 * FLASH_TILE * FLASH_LD;
    unsigned short* sk = sdo + 2 * FLASH_TILE * FLASH_LD;
    unsigned short* sds = sk + FLASH_TILE * FLASH_LD;
    float* slse = (float*)(sds + FLASH_TILE * FLASH_LD);
    float* sdvec = slse + 2 * FLASH_TILE;
    check_tiles(sq);
    int bh = blockIdx.y, j = (FLASH_BWD_PROBE & 8) ? blockIdx.x : gridDim.x - 1 - blockIdx.x;
    if (FLASH_BWD_PROBE & 16) { // blocks numbered in the order they start
        __shared__ int ticket;
        if (threadIdx.x == 0) ticket = atomicAdd(turn + 4 * gridDim.x * gridDim.y, 1);
        __syncthreads();
        bh = ticket / gridDim.x, j = gridDim.x - 1 - ticket % gridDim.x;
    }
    int b = bh / H, h = bh % H, k0 = j * FLASH_TILE;
    int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, qd = threadIdx.x & 3;
    int r0 = k0 + warp * 16; // this warp's keys
    float sl2 = scale * LOG2E;
    const float* lser = lse + (i64)bh * Tn;
    const float* dvr = dvec + (i64)bh * Tn;
    int* turns = turn + 4 * bh * gridDim.x;
    unsigned qs = smem_addr(sq), dos = smem_addr(sdo), ks = smem_addr(sk), dss = smem_addr(sds);
    load_tile_async(sk, k, b, h, k0, Tn);
    load_tile_async(sq, q, b, h, k0, Tn);
    load_tile_async(sdo, dout, b, h, k0, Tn);
    load_rows_async(slse, lser, k0, Tn);
    load_rows_async(sdvec, dvr, k0, Tn);
    cp_commit();
    unsigned ka[KS][4], va[KS][4];
#pragma unroll
    for (int s = 0; s < KS; s++) {
        frag_a_global(ka[s], k, b, h, r0, 16 * s, Tn);
        frag_a_global(va[s], v, b, h, r0, 16 * s, Tn);
    }
    float dka[DT][4], dva[DT][4], dqa[DT][4];
#pragma unroll
    for (int c = 0; c < DT; c++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[c][e] = dva[c][e] = 0.f;
    for (int t0 = k0, buf = 0; t0 < Tn; t0 += FLASH_TILE, buf ^= 1) {
        int i = t0 / FLASH_TILE;
        if (t0 + FLASH_TILE < Tn) {
            load_tile_async(sq + (buf ^ 1) * FLASH_TILE * FLASH_LD, q, b, h, t0 + FLASH_TILE, Tn);
            load_tile_async(sdo + (buf ^ 1) * FLASH_TILE * FLASH_LD, dout, b, h, t0 + FLASH_TILE, Tn);
            load_rows_async(slse + (buf ^ 1) * FLASH_TILE, lser, t0 + FLASH_TILE, Tn);
            load_rows_async(sdvec + (buf ^ 1) * FLASH_TILE, dvr, t0 + FLASH_TILE, Tn);
        }
        cp_commit();
        cp_wait<1>();
        __syncthreads();
        unsigned qt = qs + buf * TILE_BYTES, dot = dos + buf * TILE_BYTES;
        // sᵀ = k·qᵀ, pᵀ = exp(sᵀ − lse), dpᵀ = v·doᵀ: 16 keys × 64 queries.
        float p[NT][4], dp[NT][4];
        mma_abt<T>(p, ka, qt);
        mma_abt<T>(dp, va, dot);
        if (t0 > k0 && !(FLASH_BWD_PROBE & 2)) // the last tile's share, while the tensor cores work
            add_share<T>(dqa, i - 1, j, t0 - FLASH_TILE + warp * 16, Tn, scale, b, h, bh, dqacc, turns, dq, dqrow, dqbatch);
        mma_wait<1>(); // pᵀ; dpᵀ may still run
        mma_done(p);
        if (t0 < r0 + 15 || t0 + FLASH_TILE > Tn) // some query of the tile is before some key of the warp
            kv_probs<true>(p, slse + buf * FLASH_TILE, sl2, r0 + g, t0 + 2 * qd, Tn);
        else
            kv_probs<false>(p, slse + buf * FLASH_TILE, sl2, r0 + g, t0 + 2 * qd, Tn);
        mma_wait<0>();
        mma_done(dp);
        kv_ds(p, dp, sdvec + buf * FLASH_TILE);
        // dv += pᵀ·do, dk += dsᵀ·q; dsᵀ shared for the tile's share of dq.
        unsigned pa[PS][4], da[PS][4];
        scores_to_a<T>(pa, p);
        scores_to_a<T>(da, dp);
        store_ds(sds, da, warp * 16 + g);
        mma_ab<T>(dva, pa, dot);
        mma_ab<T>(dka, da, qt);
        async_fence();
        __syncthreads();
        if (!(FLASH_BWD_PROBE & 4)) mma_atb<T>(dqa, dss, ks);
        mma_wait<0>();
        mma_done(dqa);
        __syncthreads(); // the next iteration's copy writes this buffer, and its dsᵀ the shared tile
    }
    int last = (Tn - 1) / FLASH_TILE;
    add_share<T>(dqa, last, j, last * FLASH_TILE + warp * 16, Tn, scale, b, h, bh, dqacc, turns, dq, dqrow, dqbatch);
    cp_wait<0>();
    mma_done(dka), mma_done(dva);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int key = r0 + g + 8 * r;
#pragma unroll
        for (int c = 0; c < DT; c++) {
            store32<T>(dk, dkrow, dkbatch, b, h, key, 8 * c + 2 * qd, Tn, dka[c][2 * r] * scale, dka[c][2 * r + 1] * scale);
            store32<T>(dv, dvrow, dvbatch, b, h, key, 8 * c + 2 * qd, Tn, dva[c][2 * r], dva[c][2 * r + 1]);
        }
    }
}

#define FLASH(T, S)                                                                                               \
    extern "C" __global__ void __launch_bounds__(FLASH_THREADS, FLASH_FWD_WARPGROUPS / FLASH_WG) flash_fwd_##S(  \
        int B, int H, int Tq, int Tk, float scale, const T* q, int qrow, i64 qbatch, const T* k, int krow,       \
        i64 kbatch, const T* v, int vrow, i64 vbatch, T* o, int orow, i64 obatch, float* lse) {                  \
        flash_fwd<T>(B, H, Tq, Tk, scale, FlashOperand{(const unsigned short*)q, qrow, qbatch},                 \
                     FlashOperand{(const unsigned short*)k, krow, kbatch},                                       \
                     FlashOperand{(const unsigned short*)v, vrow, vbatch}, (unsigned short*)o, orow, obatch, lse); \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(128, FLASH_BWD_WARPGROUPS) flash_bwd_##S(                       \
        int B, int H, int Tn, float scale, const T* q, int qrow, i64 qbatch, const T* k, int krow, i64 kbatch,  \
        const T* v, int vrow, i64 vbatch, const T* dout, int dorow, i64 dobatch, const float* lse,              \
        const float* dvec, T* dq, int dqrow, i64 dqbatch, T* dk, int dkrow, i64 dkbatch, T* dv, int dvrow,      \
        i64 dvbatch, float* dqacc, int* turn) {                                                                  \
        flash_bwd<T>(B, H, Tn, scale, FlashOperand{(const unsigned short*)q, qrow, qbatch},                     \
                     FlashOperand{(const unsigned short*)k, krow, kbatch},                                       \
                     FlashOperand{(const unsigned short*)v, vrow, vbatch},                                       \
                     FlashOperand{(const unsigned short*)dout, dorow, dobatch}, lse, dvec, (unsigned short*)dq,  \
                     dqrow, dqbatch, (unsigned short*)dk, dkrow, dkbatch, (unsigned short*)dv, dvrow, dvbatch,   \
                     dqacc, turn);                                                                               \
    }
FLASH(f16, f16)
FLASH(bf16, bf16)
