// F32 causal attention's forward on tensor cores at F32's accuracy
// (flash_fwd_f32): flash_fwd's algorithm (flash.cu: the key tiles in turn,
// online softmax, o and the log-sum-exp written, no score matrix stored)
// for F32 operands of head width FLASH_D, with each product run as three
// TF32 products (3xTF32): an F32 x is big + small, big = x rounded to TF32
// and small = (x − big) rounded to TF32, and a·b is taken as
// big_a·small_b + small_a·big_b + big_a·big_b, the small·small term (about
// 2^-22 of the product) dropped: close to F32's 24 bits, where TF32 alone
// keeps 11 (TestCUDAFlashF32Accuracy measures it against float64 and the
// strict F32 path). CUTLASS's OpMultiplyAddFastF32 multiplies F32 so, and
// PyTorch's memory-efficient attention runs its F32 products so on
// compute capability 8.0 and later, whatever its TF32 settings.
//
// A block is four warps, 64 queries of one (batch, head), each warp 16
// rows, running mma.sync.m16n8k8 on TF32. The key and value tiles are
// split as the block copies them into shared memory (dynamic: a big and a
// small tile of each, rows of FLASH_D + 4 words, which keeps the
// fragments' loads free of bank conflicts), B fragments read from there;
// q's fragments are split once, the probabilities as they are made. The
// scores' accumulator fragments become the next product's A fragments
// without a move: an m16n8k8 A fragment holds columns t and t+4 of the
// thread's rows where the accumulator holds columns 2t and 2t+1, so the
// product with v takes the keys of each step of eight in that order,
// reading v's rows 2t and 2t+1 for B's rows t and t+4.

// F32_LD (from Go: flash32LD) is the words of a shared tile's row.
// F32_FWD_BLOCKS is the blocks a multiprocessor should hold, a bound on
// the registers: more blocks hide more of the kernel's waits, which cost
// it more than its products (on the H200 at GPT-2 small's shape,
// scripts/flash32-bench.py, 2026-12-03: 1.16 ms with two blocks, 0.90
// with three at 168 registers and 40 bytes spilled, 1.19 with four;
// keeping only the big·big products, 0.74 ms).
#define F32_FWD_BLOCKS 3

// tf32_split is x as big + small, both TF32 (the bits of F32 values
// whose last 13 mantissa bits are 0), each rounded to nearest, ties away.
__device__ __forceinline__ void tf32_split(float x, unsigned& big, unsigned& small) {
#if __CUDA_ARCH__ >= 800
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(big) : "f"(x));
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(small) : "f"(x - __uint_as_float(big)));
#endif
}

// mma1688 is c += a·b for a 16×8 TF32 A (4 registers), an 8×8 B (2) and a
// 16×8 F32 C. Not volatile, so that the compiler may schedule the
// products of different accumulators, which mma3 issues in turn, around
// each other.
__device__ __forceinline__ void mma1688(float* c, const unsigned* a, const unsigned* b) {
#if __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// mma3 is c[n] += a·b[n] for each of N accumulators at F32's accuracy from
// the split fragments: the small terms first, each term over all N before
// the next.
template <int N>
__device__ __forceinline__ void mma3(float (&c)[N][4], const unsigned* ab, const unsigned* as, const unsigned (&bb)[N][2],
                                     const unsigned (&bs)[N][2]) {
#pragma unroll
    for (int n = 0; n < N; n++) mma1688(c[n], ab, bs[n]);
#pragma unroll
    for (int n = 0; n < N; n++) mma1688(c[n], as, bb[n]);
#pragma unroll
    for (int n = 0; n < N; n++) mma1688(c[n], ab, bb[n]);
}

// F32_TILE is the words of one shared tile; flash_fwd_f32's dynamic shared
// memory holds four (Go's flash32Shared).
#define F32_TILE (FLASH_TILE * F32_LD)

// load_tile_split copies keys (or values) t0 .. t0+FLASH_TILE−1 of head (b,
// h) into a big and a small shared tile, split, 16 bytes a thread at a
// time, zeros past Tn.
__device__ __forceinline__ void load_tile_split(unsigned* big, unsigned* small, const float* x, int row, i64 batch, int b, int h,
                                                int t0, int Tn) {
    for (int i = threadIdx.x; i < FLASH_TILE * FLASH_D / 4; i += blockDim.x) {
        int r = i / (FLASH_D / 4), c = 4 * (i % (FLASH_D / 4));
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t0 + r < Tn) v = *(const float4*)(x + b * batch + (i64)(t0 + r) * row + h * FLASH_D + c);
        uint4 vb, vs;
        tf32_split(v.x, vb.x, vs.x);
        tf32_split(v.y, vb.y, vs.y);
        tf32_split(v.z, vb.z, vs.z);
        tf32_split(v.w, vb.w, vs.w);
        *(uint4*)(big + r * F32_LD + c) = vb;
        *(uint4*)(small + r * F32_LD + c) = vs;
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
    // q's A fragments, split: rows r0+g and r0+g+8, columns 8s+t and 8s+t+4.
    unsigned qb[FLASH_D / 8][4], qs[FLASH_D / 8][4];
    const float* qh = q + b * qbatch + h * FLASH_D;
#pragma unroll
    for (int s = 0; s < FLASH_D / 8; s++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int row = r0 + g + 8 * (e & 1), col = 8 * s + t + 4 * (e >> 1);
            tf32_split(row < Tq ? qh[(i64)row * qrow + col] : 0.f, qb[s][e], qs[s][e]);
        }
    float acc[DT][4];
#pragma unroll
    for (int j = 0; j < DT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    for (int k0 = 0; k0 <= last; k0 += FLASH_TILE) {
        __syncthreads(); // the tiles before are read
        load_tile_split(kb, ks, k, krow, kbatch, b, h, k0, Tk);
        load_tile_split(vb, vs, v, vrow, vbatch, b, h, k0, Tk);
        __syncthreads();
        if (k0 > mine) continue;
        float s[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
        int kr = g * F32_LD + t; // B = kᵀ: row t of the step, column g of each 8 keys
#pragma unroll
        for (int st = 0; st < FLASH_D / 8; st++) {
            unsigned bb[NT][2], bs[NT][2];
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int i = kr + 8 * n * F32_LD + 8 * st + 4 * e;
                    bb[n][e] = kb[i], bs[n][e] = ks[i];
                }
            mma3(s, qb[st], qs[st], bb, bs);
        }
        float alpha[2];
        if (k0 + FLASH_TILE - 1 > shift + r0 || k0 + FLASH_TILE > Tk) // the warp's first row sees fewer keys
            fwd_softmax<true>(s, alpha, m, l, sl2, r0 + g, k0 + 2 * t, shift, Tk);
        else
            fwd_softmax<false>(s, alpha, m, l, sl2, r0 + g, k0 + 2 * t, shift, Tk);
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int j = 0; j < DT; j++) acc[j][2 * r] *= alpha[r], acc[j][2 * r + 1] *= alpha[r];
#pragma unroll
        for (int n = 0; n < NT; n++) { // keys 8n + 2t and 8n + 2t + 1 as the step's t and t + 4
            unsigned pb[4], ps[4];
            tf32_split(s[n][0], pb[0], ps[0]);
            tf32_split(s[n][2], pb[1], ps[1]);
            tf32_split(s[n][1], pb[2], ps[2]);
            tf32_split(s[n][3], pb[3], ps[3]);
            int vr = (8 * n + 2 * t) * F32_LD + g;
            unsigned bb[DT][2], bs[DT][2];
#pragma unroll
            for (int j = 0; j < DT; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int i = vr + e * F32_LD + 8 * j;
                    bb[j][e] = vb[i], bs[j][e] = vs[i];
                }
            mma3(acc, pb, ps, bb, bs);
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float lr = quad_sum(l[r]);
        int row = r0 + g + 8 * r;
        if (row >= Tq) continue;
        float inv = 1.f / lr;
        float* orr = o + b * obatch + (i64)row * orow + h * FLASH_D + 2 * t;
#pragma unroll
        for (int j = 0; j < DT; j++) *(float2*)(orr + 8 * j) = make_float2(acc[j][2 * r] * inv, acc[j][2 * r + 1] * inv);
        if (t == 0) lse[(i64)bh * Tq + row] = (m[r] + log2f(lr)) / LOG2E;
    }
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
