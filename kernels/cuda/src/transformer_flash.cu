// Fused causal attention on tensor cores (flash attention, in the manner of
// FlashAttention-2), for F16 and BF16 operands with F32 accumulation and a
// head width of FLASH_D. No kernel stores a score matrix: scores live in
// registers a tile at a time.
//
//   flash_fwd     a block per FWD_ROWS queries of one (batch, head): the
//                 key tiles in turn, online softmax; o and the log-sum-exp
//                 written.
//   flash_bwd_q   a block per FLASH_ROWS queries: its rows' Σ do·o (dvec)
//                 first, then the key tiles in turn; dq accumulated in
//                 registers and written once.
//   flash_bwd_kv  a block per FLASH_ROWS keys, launched after flash_bwd_q:
//                 the query tiles that see them in turn, p recomputed from
//                 the log-sum-exp; dk and dv accumulated in registers and
//                 written once.
//
// Each reduction runs in a fixed order (no atomics), so results repeat bit
// for bit. Operands are strided [B, T, H, D] as attn_gather reads them;
// lse and dvec (Σ do·o, flash_bwd_q's) are [B·H, T] F32. A warp owns 16
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
// instances of fwd_softmax, kv_probs and q_probs), probabilities round in
// pairs with one cvt, 2^x is one MUFU.EX2, the backward kernels apply the
// scale to dk and dq once, and ldmatrix addresses are a base plus
// constants. FLASH_D, FLASH_TILE, FLASH_WG and FLASH_FWD_WG come from Go
// (source.go's prelude).
//
// On Hopper (sm_90a, the target the backend compiles for on compute
// capability 9.0) the same kernels run their products as warpgroup MMAs
// (wgmma.mma_async m64n64k16): each four warps of a block are a
// warpgroup, each warp's 16 rows of the accumulators are where mma.sync
// puts them, A stays in registers (q, k, v, do loaded as before; p and ds
// as the scores become them) and B is read by the tensor cores straight
// from the shared tiles, whose rows are then 128 bytes, unpadded, in the
// 128-byte swizzle wgmma's descriptors name. One instruction a warpgroup
// does a 64×64×16 product, for 32 mma.sync and 16 ldmatrix (the issue
// slots the mma.sync kernels are bound by). The products' helpers
// (mma_abt, mma_ab, and mma_wait and mma_done after them) hide which of
// the two runs; everything else is shared.

// A block of the backward's kernels is FLASH_WG warpgroups, FLASH_ROWS
// rows of queries (keys in flash_bwd_kv), and one of the forward's
// FLASH_FWD_WG, FWD_ROWS queries (both from Go): 64 rows a warpgroup, all
// sharing each tile the block copies. The warpgroups of each kernel a
// multiprocessor should hold at once: a bound on its registers (measured
// on the H200 with scripts/flash-bench.py).
#define FLASH_ROWS (64 * FLASH_WG)
#define FLASH_THREADS (128 * FLASH_WG)
#define FWD_ROWS (64 * FLASH_FWD_WG)
#define FWD_THREADS (128 * FLASH_FWD_WG)
#define FLASH_FWD_WARPGROUPS 4
#define FLASH_BWD_KV_WARPGROUPS 2
#define FLASH_BWD_Q_WARPGROUPS 3
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
template <int n> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(n));
#if FLASH_WGMMA
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
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

// unpack2 is the two T elements of a 32-bit pair, lo first, as floats.
template <typename T> __device__ __forceinline__ float2 unpack2(unsigned u);
template <> __device__ __forceinline__ float2 unpack2<f16>(unsigned u) {
    return make_float2(h2f((f16)(u & 0xffffu)), h2f((f16)(u >> 16)));
}
template <> __device__ __forceinline__ float2 unpack2<bf16>(unsigned u) {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}

// dot2 is the dot product of two pairs of T elements, in F32.
template <typename T> __device__ __forceinline__ float dot2(unsigned a, unsigned b) {
    float2 x = unpack2<T>(a), y = unpack2<T>(b);
    return x.x * y.x + x.y * y.y;
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
// Grid (⌈Tq/FWD_ROWS⌉, B·H), FWD_THREADS threads. Query i sees keys
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
    int q0 = (gridDim.x - 1 - blockIdx.x) * FWD_ROWS; // the costliest blocks first
    int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, qd = threadIdx.x & 3;
    int r0 = q0 + warp * 16;
    float sl2 = scale * LOG2E;
    int shift = Tk - Tq;
    int last = shift + min(q0 + FWD_ROWS, Tq) - 1;                   // the block's last visible key
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

// flash_bwd_kv: dv = pᵀ·do and dk = dsᵀ·q·scale for a block of FLASH_ROWS
// keys, over the query tiles that see them (Tq == Tk), double-buffered and
// shared by the block's warpgroups; each skips the tiles that precede all
// of its 64 keys. Grid (⌈T/FLASH_ROWS⌉, B·H).
template <typename T>
__device__ void flash_bwd_kv(int B, int H, int Tn, float scale, FlashOperand q, FlashOperand k, FlashOperand v,
                             FlashOperand dout, const float* lse, const float* dvec, unsigned short* dk, int dkrow,
                             i64 dkbatch, unsigned short* dv, int dvrow, i64 dvbatch) {
    __shared__ __align__(1024) unsigned short sq[2][FLASH_TILE * FLASH_LD];
    __shared__ __align__(1024) unsigned short sdo[2][FLASH_TILE * FLASH_LD];
    __shared__ float slse[2][FLASH_TILE], sdvec[2][FLASH_TILE];
    check_tiles(sq), check_tiles(sdo);
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int k0 = blockIdx.x * FLASH_ROWS;
    int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, qd = threadIdx.x & 3;
    int r0 = k0 + warp * 16;                  // this warp's keys
    int first = k0 + 64 * (threadIdx.x >> 7); // its warpgroup's
    float sl2 = scale * LOG2E;
    const float* lser = lse + (i64)bh * Tn;
    const float* dvr = dvec + (i64)bh * Tn;
    unsigned qs = smem_addr(sq[0]), dos = smem_addr(sdo[0]);
    load_tile_async(sq[0], q, b, h, k0, Tn);
    load_tile_async(sdo[0], dout, b, h, k0, Tn);
    load_rows_async(slse[0], lser, k0, Tn);
    load_rows_async(sdvec[0], dvr, k0, Tn);
    cp_commit();
    unsigned ka[KS][4], va[KS][4];
#pragma unroll
    for (int s = 0; s < KS; s++) {
        frag_a_global(ka[s], k, b, h, r0, 16 * s, Tn);
        frag_a_global(va[s], v, b, h, r0, 16 * s, Tn);
    }
    float dka[DT][4], dva[DT][4];
#pragma unroll
    for (int j = 0; j < DT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[j][e] = dva[j][e] = 0.f;
    for (int t0 = k0, buf = 0; t0 < Tn; t0 += FLASH_TILE, buf ^= 1) {
        if (t0 + FLASH_TILE < Tn) {
            load_tile_async(sq[buf ^ 1], q, b, h, t0 + FLASH_TILE, Tn);
            load_tile_async(sdo[buf ^ 1], dout, b, h, t0 + FLASH_TILE, Tn);
            load_rows_async(slse[buf ^ 1], lser, t0 + FLASH_TILE, Tn);
            load_rows_async(sdvec[buf ^ 1], dvr, t0 + FLASH_TILE, Tn);
        }
        cp_commit();
        cp_wait<1>();
        __syncthreads();
        if (t0 + FLASH_TILE > first) {
            unsigned qt = qs + buf * TILE_BYTES, dot = dos + buf * TILE_BYTES;
            // sᵀ = k·qᵀ, pᵀ = exp(sᵀ − lse), dpᵀ = v·doᵀ: 16 keys × 64 queries.
            float p[NT][4], dp[NT][4];
            mma_abt<T>(p, ka, qt);
            mma_abt<T>(dp, va, dot);
            mma_wait<1>(); // pᵀ; dpᵀ may still run
            mma_done(p);
            if (t0 < r0 + 15 || t0 + FLASH_TILE > Tn) // some query of the tile is before some key of the warp
                kv_probs<true>(p, slse[buf], sl2, r0 + g, t0 + 2 * qd, Tn);
            else
                kv_probs<false>(p, slse[buf], sl2, r0 + g, t0 + 2 * qd, Tn);
            mma_wait<0>();
            mma_done(dp);
            kv_ds(p, dp, sdvec[buf]);
            // dv += pᵀ·do, dk += dsᵀ·q
            unsigned pa[PS][4], da[PS][4];
            scores_to_a<T>(pa, p);
            scores_to_a<T>(da, dp);
            mma_ab<T>(dva, pa, dot);
            mma_ab<T>(dka, da, qt);
            mma_wait<0>();
        }
        __syncthreads();
    }
    cp_wait<0>();
    mma_done(dka), mma_done(dva);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int key = r0 + g + 8 * r;
#pragma unroll
        for (int j = 0; j < DT; j++) {
            store32<T>(dk, dkrow, dkbatch, b, h, key, 8 * j + 2 * qd, Tn, dka[j][2 * r] * scale, dka[j][2 * r + 1] * scale);
            store32<T>(dv, dvrow, dvbatch, b, h, key, 8 * j + 2 * qd, Tn, dva[j][2 * r], dva[j][2 * r + 1]);
        }
    }
}

// q_probs turns a tile of scores s = q·kᵀ (16 queries × 64 keys of a
// warp; this thread's first query and key are row and key) into p; rl are
// the thread's rows' log-sum-exps (log2 units); MASK hides the keys a
// query does not see. q_ds then makes it ds = p·(dp − Σdo·o) from dp =
// do·vᵀ and the rows' Σdo·o rd, less the scale, which the caller applies
// to dq once; apart, as kv_probs and kv_ds, so that q_probs runs while dp
// is computed.
template <bool MASK>
__device__ __forceinline__ void q_probs(float (&s)[NT][4], const float (&rl)[2], float sl2, int row, int key, int Tn) {
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float p = ex2(s[n][e] * sl2 - rl[e >> 1]);
            if (MASK) {
                int r = row + (e >> 1) * 8, c = key + 8 * n + (e & 1);
                if (c > r || c >= Tn) p = 0.f;
            }
            s[n][e] = p;
        }
}
__device__ __forceinline__ void q_ds(float (&s)[NT][4], const float (&dp)[NT][4], const float (&rd)[2]) {
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[n][e] = s[n][e] * (dp[n][e] - rd[e >> 1]);
}

// q_rows readies the thread's two rows (r0 + g and r0 + g + 8) for the
// dq kernels: rl their log-sum-exps from lse in log2 units (∞ past Tn,
// where every probability is 0), and rd, the thread's shares of their
// Σ do·o, summed over the quad and written to dvec.
__device__ __forceinline__ void q_rows(float (&rl)[2], float (&rd)[2], const float* lse, float* dvec, int bh, int r0, int Tn) {
    int g = (threadIdx.x & 31) >> 2, qd = threadIdx.x & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = r0 + g + 8 * r;
        rl[r] = row < Tn ? lse[(i64)bh * Tn + row] * LOG2E : INFINITY;
        rd[r] = quad_sum(rd[r]);
        if (qd == 0 && row < Tn) dvec[(i64)bh * Tn + row] = rd[r];
    }
}

// flash_bwd_q: dq = ds·k·scale for a block of FLASH_ROWS queries, over the
// key tiles they see (Tq == Tk), double-buffered and shared by the block's
// warpgroups; each skips the tiles that follow all of its 64 queries.
// First it writes its rows' Σ do·o to dvec, for flash_bwd_kv: o is read
// once, beside do, and no pass of its own goes over the two. Grid
// (⌈T/FLASH_ROWS⌉, B·H).
template <typename T>
__device__ void flash_bwd_q(int B, int H, int Tn, float scale, FlashOperand q, FlashOperand k, FlashOperand v,
                            FlashOperand dout, FlashOperand o, const float* lse, float* dvec, unsigned short* dq,
                            int dqrow, i64 dqbatch) {
    __shared__ __align__(1024) unsigned short sk[2][FLASH_TILE * FLASH_LD];
    __shared__ __align__(1024) unsigned short sv[2][FLASH_TILE * FLASH_LD];
    check_tiles(sk), check_tiles(sv);
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int q0 = (gridDim.x - 1 - blockIdx.x) * FLASH_ROWS;
    int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, qd = threadIdx.x & 3;
    int r0 = q0 + warp * 16;
    float sl2 = scale * LOG2E;
    int last = min(q0 + FLASH_ROWS, Tn) - 1;                   // the block's last visible key
    int mine = min(q0 + 64 * ((threadIdx.x >> 7) + 1), Tn) - 1; // its warpgroup's
    unsigned ks = smem_addr(sk[0]), vs = smem_addr(sv[0]);
    load_tile_async(sk[0], k, b, h, 0, Tn);
    load_tile_async(sv[0], v, b, h, 0, Tn);
    cp_commit();
    // Σ do·o of the thread's two rows, from do's A fragments and o's pairs
    // at the same places (0 past Tn), before q's are loaded.
    unsigned qa[KS][4], da[KS][4];
    float rl[2], rd[2] = {0.f, 0.f};
#pragma unroll
    for (int s = 0; s < KS; s++) {
        unsigned oa[4];
        frag_a_global(da[s], dout, b, h, r0, 16 * s, Tn);
        frag_a_global(oa, o, b, h, r0, 16 * s, Tn);
        rd[0] += dot2<T>(da[s][0], oa[0]) + dot2<T>(da[s][2], oa[2]);
        rd[1] += dot2<T>(da[s][1], oa[1]) + dot2<T>(da[s][3], oa[3]);
    }
#pragma unroll
    for (int s = 0; s < KS; s++) frag_a_global(qa[s], q, b, h, r0, 16 * s, Tn);
    q_rows(rl, rd, lse, dvec, bh, r0, Tn);
    float acc[DT][4];
#pragma unroll
    for (int j = 0; j < DT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (int k0 = 0, buf = 0; k0 <= last; k0 += FLASH_TILE, buf ^= 1) {
        if (k0 + FLASH_TILE <= last) {
            load_tile_async(sk[buf ^ 1], k, b, h, k0 + FLASH_TILE, Tn);
            load_tile_async(sv[buf ^ 1], v, b, h, k0 + FLASH_TILE, Tn);
        }
        cp_commit();
        cp_wait<1>();
        __syncthreads();
        if (k0 <= mine) {
            unsigned kt = ks + buf * TILE_BYTES;
            float s[NT][4], dp[NT][4];
            mma_abt<T>(s, qa, kt);
            mma_abt<T>(dp, da, vs + buf * TILE_BYTES);
            mma_wait<1>(); // s; dp may still run
            mma_done(s);
            if (k0 + FLASH_TILE - 1 > r0 || k0 + FLASH_TILE > Tn)
                q_probs<true>(s, rl, sl2, r0 + g, k0 + 2 * qd, Tn);
            else
                q_probs<false>(s, rl, sl2, r0 + g, k0 + 2 * qd, Tn);
            mma_wait<0>();
            mma_done(dp);
            q_ds(s, dp, rd);
            unsigned a[PS][4];
            scores_to_a<T>(a, s);
            mma_ab<T>(acc, a, kt);
            mma_wait<0>();
        }
        __syncthreads();
    }
    cp_wait<0>();
    mma_done(acc);
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int j = 0; j < DT; j++)
            store32<T>(dq, dqrow, dqbatch, b, h, r0 + g + 8 * r, 8 * j + 2 * qd, Tn, acc[j][2 * r] * scale, acc[j][2 * r + 1] * scale);
}

// load_paged_tile_async copies the keys (or values) at positions k0.. of
// head h of a sequence whose block table is table into a FLASH_TILE ×
// FLASH_LD shared tile, as load_tile_async does a strided operand's rows:
// each position's row is found through the table (a block of bs
// positions, C values a position), zeros past len.
__device__ __forceinline__ void load_paged_tile_async(unsigned short* tile, const unsigned short* cache, const int* table,
                                                      int bs, int C, int h, int k0, int len) {
    const int per = FLASH_D / 8;
    for (int i = threadIdx.x; i < FLASH_TILE * per; i += blockDim.x) {
        int r = i / per, c = i % per;
        int pos = min(k0 + r, len - 1); // a valid address; nothing is read past len
        const unsigned short* src = cache + ((i64)table[pos / bs] * bs + pos % bs) * C + h * FLASH_D + 8 * c;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(tile + tile_at(r, c))), "l"(src),
                     "r"(k0 + r < len ? 16 : 0));
    }
}

// paged_softmax is fwd_softmax for paged_flash: each of the thread's two
// rows sees the keys up to lim (its position, or −1 where the row is not
// in the run the tile belongs to), every score tested. A row that has seen
// no key yet keeps m = −∞, its factor 1 and its probabilities 0.
__device__ __forceinline__ void paged_softmax(float (&s)[NT][4], float (&alpha)[2], float (&m)[2], float (&l)[2], float sl2,
                                              const int (&lim)[2], int key) {
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float x = key + 8 * n + (e & 1) > lim[e >> 1] ? -INFINITY : s[n][e] * sl2;
            s[n][e] = x;
            mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = quad_max(mx[r]);
        alpha[r] = mx[r] == -INFINITY ? 1.f : ex2(m[r] - mx[r]); // m[r] is −∞ too in the first case
        base[r] = mx[r] == -INFINITY ? 0.f : mx[r];
        m[r] = mx[r];
        l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float p = ex2(s[n][e] - base[e >> 1]);
            s[n][e] = p;
            l[e >> 1] += p;
        }
}

// paged_flash is PagedAttention's prefill on the tensor cores: a block (a
// warpgroup, 128 threads) attends a head of the 64 query rows from
// blockIdx.y·64 (fewer at the end of rows), each row r to the positions
// 0..rowPos[r] of its sequence rowSeq[r] through the block tables, as
// flash_fwd attends a strided operand (its tiles, products and online
// softmax). The rows fall in runs, a run being rows of one sequence one
// after another (a prompt's chunk; a padding row), and blockIdx.x is the
// head times slots plus the block's slot: the block takes the runs whose
// index is its slot modulo slots (a prompt of its own in each of a tile's
// runs, as after a shared prefix, runs in parallel), in turn: the
// sequence's keys and values in tiles of FLASH_TILE positions up to the
// run's last, double-buffered, every row of the block in each product and
// those outside the run masked, so that each row's maximum, sum and output
// gather only its own run's tiles; it writes its runs' rows. Queries are
// rows of qrow elements, the output rows of C = H·FLASH_D; the caches hold
// a position's C values at slot·C, a slot being block·bs + offset.
template <typename T>
__device__ void paged_flash(int rows, int H, int slots, int bs, int maxBlocks, int qrow, float scale, const unsigned short* q,
                            const unsigned short* kc, const unsigned short* vc, const int* tables, const int* rowSeq,
                            const int* rowPos, unsigned short* o) {
    __shared__ __align__(1024) unsigned short sk[2][FLASH_TILE * FLASH_LD];
    __shared__ __align__(1024) unsigned short sv[2][FLASH_TILE * FLASH_LD];
    __shared__ int sseq[64], spos[64];
    check_tiles(sk), check_tiles(sv);
    int h = blockIdx.x / slots, slot = blockIdx.x % slots, r0 = blockIdx.y * 64, n = min(64, rows - r0), C = H * FLASH_D;
    int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, qd = threadIdx.x & 3;
    for (int i = threadIdx.x; i < 64; i += blockDim.x) {
        sseq[i] = i < n ? rowSeq[r0 + i] : -1;
        spos[i] = i < n ? rowPos[r0 + i] : -1;
    }
    unsigned qa[KS][4];
#pragma unroll
    for (int s = 0; s < KS; s++) frag_a_global(qa[s], FlashOperand{q, qrow, 0}, 0, h, r0 + warp * 16, 16 * s, rows);
    float acc[DT][4];
#pragma unroll
    for (int j = 0; j < DT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, sl2 = scale * LOG2E;
    unsigned ka = smem_addr(sk[0]), va = smem_addr(sv[0]);
    __syncthreads();
    int mine[2] = {warp * 16 + g, warp * 16 + g + 8}; // the thread's rows in the block
    bool done[2] = {false, false};                     // attended by this block
    for (int rs = 0, re, run = 0; rs < n; rs = re, run++) {
        int seq = sseq[rs], last = spos[rs];
        for (re = rs + 1; re < n && sseq[re] == seq; re++) last = max(last, spos[re]);
        if (run % slots != slot) continue;
        int len = last + 1, lim[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            bool in = mine[r] >= rs && mine[r] < re;
            lim[r] = in ? spos[mine[r]] : -1;
            done[r] |= in;
        }
        const int* table = tables + (i64)seq * maxBlocks;
        load_paged_tile_async(sk[0], kc, table, bs, C, h, 0, len);
        load_paged_tile_async(sv[0], vc, table, bs, C, h, 0, len);
        cp_commit();
        for (int k0 = 0, buf = 0; k0 < len; k0 += FLASH_TILE, buf ^= 1) {
            if (k0 + FLASH_TILE < len) {
                load_paged_tile_async(sk[buf ^ 1], kc, table, bs, C, h, k0 + FLASH_TILE, len);
                load_paged_tile_async(sv[buf ^ 1], vc, table, bs, C, h, k0 + FLASH_TILE, len);
            }
            cp_commit();
            cp_wait<1>();
            __syncthreads();
            float s[NT][4], alpha[2];
            mma_abt<T>(s, qa, ka + buf * TILE_BYTES);
            mma_wait<0>();
            mma_done(s);
            paged_softmax(s, alpha, m, l, sl2, lim, k0 + 2 * qd);
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int j = 0; j < DT; j++) acc[j][2 * r] *= alpha[r], acc[j][2 * r + 1] *= alpha[r];
            unsigned pa[PS][4];
            scores_to_a<T>(pa, s);
            mma_ab<T>(acc, pa, va + buf * TILE_BYTES);
            mma_wait<0>();
            mma_done(acc);
            __syncthreads(); // the next copy writes this buffer
        }
        cp_wait<0>();
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float inv = 1.f / quad_sum(l[r]);
        if (done[r])
#pragma unroll
            for (int j = 0; j < DT; j++)
                store32<T>(o, C, 0, 0, h, r0 + mine[r], 8 * j + 2 * qd, rows, acc[j][2 * r] * inv, acc[j][2 * r + 1] * inv);
    }
}

#define FLASH(T, S)                                                                                               \
    extern "C" __global__ void __launch_bounds__(FWD_THREADS, FLASH_FWD_WARPGROUPS / FLASH_FWD_WG) flash_fwd_##S(                                             \
        int B, int H, int Tq, int Tk, float scale, const T* q, int qrow, i64 qbatch, const T* k, int krow,       \
        i64 kbatch, const T* v, int vrow, i64 vbatch, T* o, int orow, i64 obatch, float* lse) {                  \
        kernel_entry();                                                                                         \
        flash_fwd<T>(B, H, Tq, Tk, scale, FlashOperand{(const unsigned short*)q, qrow, qbatch},                 \
                     FlashOperand{(const unsigned short*)k, krow, kbatch},                                       \
                     FlashOperand{(const unsigned short*)v, vrow, vbatch}, (unsigned short*)o, orow, obatch, lse); \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(128) paged_flash_##S(                                           \
        int rows, int H, int slots, int bs, int maxBlocks, int qrow, float scale, const T* q, const T* kc,       \
        const T* vc, const int* tables, const int* rowSeq, const int* rowPos, T* o) {                            \
        kernel_entry();                                                                                         \
        paged_flash<T>(rows, H, slots, bs, maxBlocks, qrow, scale, (const unsigned short*)q, (const unsigned short*)kc, \
                       (const unsigned short*)vc, tables, rowSeq, rowPos, (unsigned short*)o);                   \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(FLASH_THREADS, FLASH_BWD_KV_WARPGROUPS / FLASH_WG) flash_bwd_kv_##S(                                          \
        int B, int H, int Tn, float scale, const T* q, int qrow, i64 qbatch, const T* k, int krow, i64 kbatch,  \
        const T* v, int vrow, i64 vbatch, const T* dout, int dorow, i64 dobatch, const float* lse,              \
        const float* dvec, T* dk, int dkrow, i64 dkbatch, T* dv, int dvrow, i64 dvbatch) {                      \
        kernel_entry();                                                                                         \
        flash_bwd_kv<T>(B, H, Tn, scale, FlashOperand{(const unsigned short*)q, qrow, qbatch},                  \
                        FlashOperand{(const unsigned short*)k, krow, kbatch},                                    \
                        FlashOperand{(const unsigned short*)v, vrow, vbatch},                                    \
                        FlashOperand{(const unsigned short*)dout, dorow, dobatch}, lse, dvec,                    \
                        (unsigned short*)dk, dkrow, dkbatch, (unsigned short*)dv, dvrow, dvbatch);               \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(FLASH_THREADS, FLASH_BWD_Q_WARPGROUPS / FLASH_WG) flash_bwd_q_##S(                                           \
        int B, int H, int Tn, float scale, const T* q, int qrow, i64 qbatch, const T* k, int krow, i64 kbatch,  \
        const T* v, int vrow, i64 vbatch, const T* dout, int dorow, i64 dobatch, const T* o, int orow,          \
        i64 obatch, const float* lse, float* dvec, T* dq, int dqrow, i64 dqbatch) {                              \
        kernel_entry();                                                                                         \
        flash_bwd_q<T>(B, H, Tn, scale, FlashOperand{(const unsigned short*)q, qrow, qbatch},                   \
                       FlashOperand{(const unsigned short*)k, krow, kbatch},                                     \
                       FlashOperand{(const unsigned short*)v, vrow, vbatch},                                     \
                       FlashOperand{(const unsigned short*)dout, dorow, dobatch},                                \
                       FlashOperand{(const unsigned short*)o, orow, obatch}, lse, dvec, (unsigned short*)dq,     \
                       dqrow, dqbatch);                                                                          \
    }
FLASH(f16, f16)
FLASH(bf16, bf16)
