// x3_gemm_{nn,nt,tn,tt}: F32 products C = α·op(A)·op(B) + β·R on TF32
// tensor cores at F32's accuracy (Note [F32 products as three TF32 ones],
// gemm_tf32x3.go). A block computes an X3_TILE × X3_TILE tile of C with
// X3_THREADS threads; the inner dimension moves through shared memory
// X3_BK at a time in X3_STAGES stages of cp.async copies, raw F32. Each
// operand is split into big and small TF32 parts (tf32_split) on its way to
// the tensor cores, which sum small·big, big·small and big·big into
// accumulators that start from zero for each stretch of K and are then
// added to running F32 accumulators: the tensor cores' additions, which
// do not round to nearest, never sum a long stretch.
//
// On Hopper (sm_90a) the block is two warpgroups, 64 rows of the tile
// each, running wgmma.mma_async m64n128k8: A from registers, each
// fragment split as the warp loads it, and B from two 128-byte-swizzled
// K-major tiles (big and small) that the block splits B's stage into, the
// next stage's into a second pair while the tensor cores multiply this
// one's; a stage (X3_BK of K, twelve instructions) is summed from zero.
// Elsewhere (sm_80 on) eight warps, two along M and four along N, each 64
// × 32 of C in 4 × 4 mma.sync.m16n8k8 accumulators, split both fragments
// as they load them and sum each step of eight of K from zero.
//
// Raw tiles are stored as their rows run in memory: K along the row (A, or
// Bᵀ) in rows of X3_BK + 4 words, else across it in rows of X3_TILE + 8,
// which keeps the fragments' loads free of bank conflicts (a thread (g, t)
// of the warp reads word 4g + t or 8t + g, modulo 32).
//
// Blocks are placed X3_GROUP rows of tiles at a time, column after column
// within a group, so that the blocks a wave holds share their A and B
// tiles in L2. Where p.Splits > 1 each block sums p.KChunk of K, and the
// splits of a tile add their sums into C in turn, split 0 first (α·sums +
// β·R), each waiting at the tile's word of p.Flags for the count of
// splits done to reach its own (x3_split_wait): the result does not depend
// on scheduling, and no workspace holds partial sums. A split waits only
// for blocks placed before it (blockIdx.y orders the splits), which are
// running or done.
//
// x3_gemm_epi_nn and _nt also apply gemm_epilogue's bias and activation
// (or its derivative) as they store C (the last split, where K is split):
// the finished tile is staged in shared memory and stored a row at a time
// by a loop the compiler keeps rolled, so that the epilogue's code costs
// the products no registers. Every kernel stores a split tile so, which
// leaves the store from the accumulators (K whole) a plain α·v + β·R.

#define X3_KC_LD (X3_BK + 4)     // words of a tile's row with K along it
#define X3_MN_LD (X3_TILE + 8)   // with K across it
#define X3_OPERAND (X3_TILE * X3_KC_LD) // words of one operand's tile (the larger layout)

__device__ __forceinline__ void cp_async16(float* dst, const float* src, int bytes) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async4(float* dst, const float* src, int bytes) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// x3_word is the shared word of a tile's element (r, k): r along M (A) or
// N (B), k along the stage's X3_BK.
template <bool KC> __device__ __forceinline__ int x3_word(int r, int k) { return KC ? r * X3_KC_LD + k : k * X3_MN_LD + r; }

// x3_load copies the tile of rows r0.. (of R) and k0.. (of K) of an
// operand at p (element (r, k) at r·ld + k where KC, else k·ld + r) into
// the shared tile s, zeros past its ends: 16 bytes a copy where vec (ld, p
// and the batch's stride multiples of four floats), else 4.
template <bool KC>
__device__ __forceinline__ void x3_load(float* s, const float* p, int ld, int R, int K, int r0, int k0, bool vec) {
    if (vec) {
        for (int i = threadIdx.x; i < X3_TILE * X3_BK / 4; i += X3_THREADS) {
            // KC: 8 copies along a row's X3_BK; else 32 along X3_TILE.
            int r = KC ? i / (X3_BK / 4) : 4 * (i % (X3_TILE / 4)), k = KC ? 4 * (i % (X3_BK / 4)) : i / (X3_TILE / 4);
            int gr = r0 + r, gk = k0 + k;
            int inner = KC ? K - gk : R - gr;
            bool outer = KC ? gr < R : gk < K;
            int bytes = outer ? 4 * max(0, min(4, inner)) : 0;
            cp_async16(s + x3_word<KC>(r, k), bytes ? p + (KC ? (i64)gr * ld + gk : (i64)gk * ld + gr) : p, bytes);
        }
        return;
    }
    for (int i = threadIdx.x; i < X3_TILE * X3_BK; i += X3_THREADS) {
        int r = KC ? i / X3_BK : i % X3_TILE, k = KC ? i % X3_BK : i / X3_TILE;
        int gr = r0 + r, gk = k0 + k;
        int bytes = gr < R && gk < K ? 4 : 0;
        cp_async4(s + x3_word<KC>(r, k), bytes ? p + (KC ? (i64)gr * ld + gk : (i64)gk * ld + gr) : p, bytes);
    }
}


#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define X3_WGMMA 1
#else
#define X3_WGMMA 0
#endif

#if X3_WGMMA
// x3_wgmma is d (64×128, F32) = a·b + (ACC ? d : 0) for the warpgroup on
// TF32: a 64×8 A from registers (each warp's 16 rows as mma.sync's A
// fragment) and an 8×128 B, K-major in shared memory at descriptor b.
template <int ACC> __device__ __forceinline__ void x3_wgmma(float (&d)[16][4], const unsigned* a, unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(ACC));
}
#endif

#if X3_WGMMA
// x3_swizzled is the word of element (n, k) of a K-major tile of 128-byte
// rows (X3_BK floats) in wgmma's 128-byte swizzle: the row's 16-byte
// chunk k/4 XOR the row's index within its group of 8.
__device__ __forceinline__ int x3_swizzled(int n, int k) { return n * X3_BK + 4 * ((k >> 2) ^ (n & 7)) + (k & 3); }

// x3_desc is the wgmma descriptor of a 128-byte-swizzled K-major tile at
// shared address a (1024-aligned): groups of 8 rows 1024 bytes apart.
__device__ __forceinline__ unsigned long long x3_desc(unsigned a) {
    return (unsigned long long)((a & 0x3FFFF) >> 4) | (64ull << 16) | (64ull << 32) | (1ull << 62);
}

template <int N> __device__ __forceinline__ void x3_fence(float (&d)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[n][e])::"memory");
}
#endif

// x3_store writes the two sums v of row r, columns c and c + 1, of a
// product's tile whose K is whole into C (out): α·v + β·R (res).
__device__ __forceinline__ void x3_store(const X3Gemm& p, float* out, const float* res, int r, int c, float v0, float v1) {
    if (r >= p.M || c >= p.N) return;
    float v[2] = {v0, v1};
    i64 o = (i64)r * p.Ldc + c;
    int n = min(2, p.N - c);
    for (int e = 0; e < n; e++) v[e] = p.Alpha * v[e] + (p.Beta != 0.f ? p.Beta * res[o + e] : 0.f);
    if (p.VecC && n == 2) {
        *(float2*)(out + o) = make_float2(v[0], v[1]);
    } else {
        for (int e = 0; e < n; e++) out[o + e] = v[e];
    }
}

// x3_split_wait waits, where K is split, until the part splits before the
// block's have added theirs into its tile: the tile's flag counts them.
__device__ __forceinline__ void x3_split_wait(const int* flag, int part) {
    if (part > 0 && threadIdx.x == 0) {
        int done;
        for (;;) {
            asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(done) : "l"(flag) : "memory");
            if (done == part) break;
            __nanosleep(64);
        }
    }
    __syncthreads();
}

// x3_split_done counts the block's split done once its stores are in L2:
// the flag is part + 1, or zero after the last, as the next launch
// expects.
__device__ __forceinline__ void x3_split_done(const X3Gemm& p, int* flag, int part) {
    if (p.Splits == 1) return;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int next = part + 1 == p.Splits ? 0 : part + 1;
        asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(flag), "r"(next) : "memory");
    }
}

// The epilogue's tile, staged in shared memory (x3_gemm_epi): X3_TILE
// rows of X3_STAGED_LD words, whose 8 past X3_TILE keep the accumulators'
// 8-byte writes (a half-warp's four rows, eight words of each) free of
// bank conflicts; then, where the epilogue reads R or Aux 16 bytes at a
// time, the tile of it, copied in while the accumulators are staged, at
// X3_TILE words a row (Go's x3EpiShared: both).
#define X3_STAGED_LD (X3_TILE + 8)

// x3_epilogue stores the n ≤ 4 sums v of C's row, elements o.. and
// columns col.., into c: α·v + β·R (R's at r) from K's first split (or
// only one), else α·v added to what the splits before it stored in c;
// then, from the last split, gemm_epilogue's (gemm.cu) bias and
// activation, its input kept in p.Aux, or the activation's derivative at
// Aux's (at aux); 16 bytes an access where vec (n is 4). r and aux are
// generic pointers: global memory, or the tile staged in shared memory.
__device__ __forceinline__ void x3_epilogue(const X3Gemm& p, int part, float* c, i64 o, int col, int n, bool vec,
                                            float (&v)[4], const float* r, const float* aux) {
    float w[4] = {0.f, 0.f, 0.f, 0.f};
    auto load = [&](const float* a) {
        if (vec) {
            ld4(a, 0, w);
        } else {
            for (int e = 0; e < n; e++) w[e] = a[e];
        }
    };
    auto store = [&](float* a) {
        if (vec) {
            st4(a, 0, v);
        } else {
            for (int e = 0; e < n; e++) a[e] = v[e];
        }
    };
    float beta = part == 0 ? p.Beta : 1.f;
    if (part > 0) { // L2's: an earlier split's block stored it
        if (vec) {
            float4 t = __ldcg((const float4*)(c + o));
            w[0] = t.x, w[1] = t.y, w[2] = t.z, w[3] = t.w;
        } else {
            for (int e = 0; e < n; e++) w[e] = __ldcg(c + o + e);
        }
    } else if (beta != 0.f) {
        load(r);
    }
#pragma unroll
    for (int e = 0; e < 4; e++) v[e] = p.Alpha * v[e] + beta * w[e];
    if (part + 1 < p.Splits) {
        store(c + o);
        return;
    }
    if (p.Grad) {
        load(aux);
#pragma unroll
        for (int e = 0; e < 4; e++) v[e] = unary_grad(p.Op, v[e], w[e], 0.f);
    } else {
        if (p.Bias) {
            load(p.Bias + col);
#pragma unroll
            for (int e = 0; e < 4; e++) v[e] += w[e];
        }
        if (p.Op) {
            store(p.Aux + o);
#pragma unroll
            for (int e = 0; e < 4; e++) v[e] = unary_f(p.Op, v[e]);
        }
    }
    store(c + o);
}

// x3_chunk is the i-th chunk of four columns of the tile (i < X3_TILE² /
// 4): a warp's 32 threads cover a row.
__device__ __forceinline__ void x3_chunk(int i, int& r, int& c) { r = i / (X3_TILE / 4), c = 4 * (i % (X3_TILE / 4)); }

// x3_prefetch_epi copies the thread's chunks of the tile at (r0, c0) of
// what the epilogue of K's part-th split reads (Aux where p.Grad and the
// split is the last, else the matrix's R, res, where it is the first) into
// the shared tile in, 16 bytes a copy (zeros past C's ends): where
// p.VecC4 and the epilogue reads one of them; it says whether it did.
__device__ __forceinline__ bool x3_prefetch_epi(const X3Gemm& p, const float* res, float* in, int r0, int c0, int part) {
    bool aux = p.Grad && part + 1 == p.Splits, beta = part == 0 && p.Beta != 0.f;
    if (!p.VecC4 || !(aux || beta)) return false;
    const float* src = aux ? p.Aux : res;
    for (int i = threadIdx.x; i < X3_TILE * X3_TILE / 4; i += X3_THREADS) {
        int r, c;
        x3_chunk(i, r, c);
        int bytes = r0 + r < p.M ? 4 * max(0, min(4, p.N - c0 - c)) : 0;
        cp_async16(in + r * X3_TILE + c, bytes ? src + (i64)(r0 + r) * p.Ldc + c0 + c : src, bytes);
    }
    cp_async_commit();
    return true;
}

// x3_store_staged stores the tile at (r0, c0) of the matrix's C (out, R at
// res), staged in shared memory, through x3_epilogue as K's part-th
// split: a warp a row at a time, four columns a thread, in a loop the
// compiler keeps rolled. in: the prefetched tile of R or Aux
// (x3_prefetch_epi), or null.
__device__ void x3_store_staged(const X3Gemm& p, int part, float* out, const float* res, const float* staged, const float* in,
                                int r0, int c0) {
#pragma unroll 1
    for (int i = threadIdx.x; i < X3_TILE * X3_TILE / 4; i += X3_THREADS) {
        int r, c;
        x3_chunk(i, r, c);
        if (r0 + r >= p.M || c0 + c >= p.N) continue;
        float4 s = *(const float4*)(staged + r * X3_STAGED_LD + c);
        float v[4] = {s.x, s.y, s.z, s.w};
        int n = min(4, p.N - c0 - c);
        i64 o = (i64)(r0 + r) * p.Ldc + c0 + c;
        const float* pre = in ? in + r * X3_TILE + c : nullptr;
        bool aux = p.Grad && part + 1 == p.Splits;
        x3_epilogue(p, part, out, o, c0 + c, n, p.VecC4 && n == 4, v, pre && !aux ? pre : res + o, pre && aux ? pre : p.Aux + o);
    }
}

// x3_store_epi stores the block's tile at (r0, c0) of the matrix's C (out,
// R at res) through the epilogue as K's part-th split (its flag: the
// tile's), from the dynamic shared memory at shared once every warp is
// done with the stages: stage(staged) writes the thread's accumulators
// into the staged tile, as the prefetch of R or Aux runs.
template <typename Stage>
__device__ __forceinline__ void x3_store_epi(const X3Gemm& p, int part, int* flag, float* out, const float* res, float* shared,
                                             int r0, int c0, Stage stage) {
    float *staged = shared, *in = staged + X3_TILE * X3_STAGED_LD;
    __syncthreads();
    bool pre = x3_prefetch_epi(p, res, in, r0, c0, part);
    stage(staged);
    cp_async_wait<0>();
    x3_split_wait(flag, part); // and every thread's part of the tile is staged
    x3_store_staged(p, part, out, res, staged, pre ? in : nullptr, r0, c0);
    x3_split_done(p, flag, part);
}

// x3_gemm is the product's kernel; EPI: x3_gemm_epi's. The tile is stored
// through the staged epilogue where EPI or K is split, else from the
// accumulators.
template <bool TA, bool TB, bool EPI> __device__ __forceinline__ void x3_gemm(X3Gemm p) {
    kernel_entry();
    extern __shared__ uint4 x3_shared[];
#if X3_WGMMA
    // Two buffers of split B tiles, each big then small, on 1024 bytes,
    // then the stages.
    unsigned* split = (unsigned*)(((unsigned long long)x3_shared + 1023) & ~1023ull);
    float* tiles = (float*)(split + 4 * X3_TILE * X3_BK);
#else
    float* tiles = (float*)x3_shared; // per stage: A's tile, then B's
#endif
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;

    // The tile: X3_GROUP rows of tiles at a time, down each column of the group.
    int pid = blockIdx.x, per_group = X3_GROUP * p.TilesN;
    int first = pid / per_group * X3_GROUP, rows = min(p.TilesM - first, X3_GROUP);
    int tm = first + pid % per_group % rows, tn = pid % per_group / rows;
    int item = blockIdx.y / p.Splits, part_k = blockIdx.y % p.Splits;
    const float* A = p.A + item * p.StrideA;
    const float* B = p.B + item * p.StrideB;
    int k0 = part_k * p.KChunk, k1 = min(p.K, k0 + p.KChunk);
    int steps = max(0, (k1 - k0 + X3_BK - 1) / X3_BK);

    // load_stage copies the stage-th tiles of K (from k0) into buffer s.
    auto load_stage = [&](int s, int step) {
        float* sa = tiles + s * 2 * X3_OPERAND;
        int k = k0 + step * X3_BK;
        // Past k1 (the split's end) rows read as zeros: K here is k1.
        x3_load<!TA>(sa, A, p.Lda, p.M, k1, tm * X3_TILE, k, p.VecA);
        x3_load<TB>(sa + X3_OPERAND, B, p.Ldb, p.N, k1, tn * X3_TILE, k, p.VecB);
    };
    for (int s = 0; s < X3_STAGES - 1; s++) {
        if (s < steps) load_stage(s, s);
        cp_async_commit();
    }
    float* out = p.C + item * p.StrideC;
    const float* res = p.R + item * p.StrideC;
    int* flag = p.Flags + item * gridDim.x + blockIdx.x; // the tile's count of splits done

#if X3_WGMMA
    // Two warpgroups, 64 rows each, all X3_TILE columns; a warp's 16 rows.
    const int row0 = (warp >> 2) * 64 + (warp & 3) * 16;
    float acc[16][4];
#pragma unroll
    for (int j = 0; j < 16; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.f;
    // convert splits B's tile in stage s into the swizzled big and small
    // tiles of buffer buf, four of K a thread at a time: a warp's threads
    // along K's rows where B's tile has them (TB), else along N, which
    // keeps the reads free of bank conflicts.
    auto convert = [&](int s, int buf) {
        const float* sb = tiles + s * 2 * X3_OPERAND + X3_OPERAND;
        unsigned* big = split + buf * 2 * X3_TILE * X3_BK;
        for (int i = threadIdx.x; i < X3_TILE * X3_BK / 4; i += X3_THREADS) {
            int n = TB ? i / (X3_BK / 4) : i % X3_TILE, k = 4 * (TB ? i % (X3_BK / 4) : i / X3_TILE);
            uint4 vb, vs;
            tf32_split(sb[x3_word<TB>(n, k)], vb.x, vs.x);
            tf32_split(sb[x3_word<TB>(n, k + 1)], vb.y, vs.y);
            tf32_split(sb[x3_word<TB>(n, k + 2)], vb.z, vs.z);
            tf32_split(sb[x3_word<TB>(n, k + 3)], vb.w, vs.w);
            *(uint4*)(big + x3_swizzled(n, k)) = vb;
            *(uint4*)(big + X3_TILE * X3_BK + x3_swizzled(n, k)) = vs;
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); // before wgmma reads them
    };
    unsigned tiles0 = (unsigned)__cvta_generic_to_shared(split);
    if (steps > 0) {
        cp_async_wait<X3_STAGES - 2>();
        __syncthreads();
        convert(0, 0);
        __syncthreads();
    }
    // Each step multiplies its stage while B's next tile is split into the
    // other buffer; the copy of a later stage goes into the one before.
    for (int step = 0; step < steps; step++) {
        const float* sa = tiles + (step % X3_STAGES) * 2 * X3_OPERAND;
        unsigned ab[X3_BK / 8][4], as[X3_BK / 8][4];
#pragma unroll
        for (int q = 0; q < X3_BK / 8; q++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                tf32_split(sa[x3_word<!TA>(row0 + g + 8 * (e & 1), 8 * q + t + 4 * (e >> 1))], ab[q][e], as[q][e]);
        unsigned big_tile = tiles0 + (step & 1) * 2 * X3_TILE * X3_BK * 4, small_tile = big_tile + X3_TILE * X3_BK * 4;
        float part[16][4]; // this stage's sums, from zero
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int q = 0; q < X3_BK / 8; q++) {
            if (q == 0) {
                x3_wgmma<0>(part, as[q], x3_desc(big_tile));
            } else {
                x3_wgmma<1>(part, as[q], x3_desc(big_tile + 32 * q));
            }
            x3_wgmma<1>(part, ab[q], x3_desc(small_tile + 32 * q));
            x3_wgmma<1>(part, ab[q], x3_desc(big_tile + 32 * q));
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        if (step + 1 < steps) {
            cp_async_wait<X3_STAGES - 3>();
            __syncthreads(); // the next stage is in
            convert((step + 1) % X3_STAGES, (step + 1) & 1);
        }
        int next = step + X3_STAGES - 1;
        if (next < steps) load_stage(next % X3_STAGES, next);
        cp_async_commit();
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        x3_fence(part);
#pragma unroll
        for (int j = 0; j < 16; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[j][e] += part[j][e];
        __syncthreads(); // the next tiles are split; this step's are free
    }
    cp_async_wait<0>();
    if (EPI || p.Splits > 1) {
        x3_store_epi(p, part_k, flag, out, res, (float*)x3_shared, tm * X3_TILE, tn * X3_TILE, [&](float* staged) {
#pragma unroll
            for (int j = 0; j < 16; j++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    *(float2*)(staged + (row0 + g + 8 * h) * X3_STAGED_LD + 8 * j + 2 * t) = make_float2(acc[j][2 * h], acc[j][2 * h + 1]);
        });
        return;
    }
#pragma unroll
    for (int j = 0; j < 16; j++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            x3_store(p, out, res, tm * X3_TILE + row0 + g + 8 * h, tn * X3_TILE + 8 * j + 2 * t, acc[j][2 * h], acc[j][2 * h + 1]);
#else
    const int wm = warp >> 2, wn = warp & 3; // the warp's 64 rows and 32 columns of the tile
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;

    for (int step = 0; step < steps; step++) {
        cp_async_wait<X3_STAGES - 2>();
        __syncthreads(); // the stage is in; every warp is done with the one the next copy reuses
        int next = step + X3_STAGES - 1;
        if (next < steps) load_stage(next % X3_STAGES, next);
        cp_async_commit();

        const float* sa = tiles + (step % X3_STAGES) * 2 * X3_OPERAND;
        const float* sb = sa + X3_OPERAND;
#pragma unroll 1
        for (int ks = 0; ks < X3_BK; ks += 8) {
            unsigned bb[4][2], bs[4][2];
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    tf32_split(sb[x3_word<TB>(wn * 32 + j * 8 + g, ks + t + 4 * e)], bb[j][e], bs[j][e]);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                unsigned ab[4], as[4];
#pragma unroll
                for (int e = 0; e < 4; e++)
                    tf32_split(sa[x3_word<!TA>(wm * 64 + i * 16 + g + 8 * (e & 1), ks + t + 4 * (e >> 1))], ab[e], as[e]);
                float part[4][4]; // this step's sums, from zero
#pragma unroll
                for (int j = 0; j < 4; j++) mma1688_zero(part[j], ab, bs[j]);
#pragma unroll
                for (int j = 0; j < 4; j++) mma1688(part[j], as, bb[j]);
#pragma unroll
                for (int j = 0; j < 4; j++) mma1688(part[j], ab, bb[j]);
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[i][j][e] += part[j][e];
            }
        }
    }
    cp_async_wait<0>();
    if (EPI || p.Splits > 1) {
        x3_store_epi(p, part_k, flag, out, res, (float*)x3_shared, tm * X3_TILE, tn * X3_TILE, [&](float* staged) {
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        *(float2*)(staged + (wm * 64 + i * 16 + g + 8 * h) * X3_STAGED_LD + wn * 32 + j * 8 + 2 * t) =
                            make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        });
        return;
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                x3_store(p, out, res, tm * X3_TILE + wm * 64 + i * 16 + g + 8 * h, tn * X3_TILE + wn * 32 + j * 8 + 2 * t,
                         acc[i][j][2 * h], acc[i][j][2 * h + 1]);
#endif
}

#define X3_KERNEL(NAME, TA, TB, EPI) \
    extern "C" __global__ void __launch_bounds__(X3_THREADS, 1) NAME(X3Gemm p) { x3_gemm<TA, TB, EPI>(p); }
X3_KERNEL(x3_gemm_nn, false, false, false)
X3_KERNEL(x3_gemm_nt, false, true, false)
X3_KERNEL(x3_gemm_tn, true, false, false)
X3_KERNEL(x3_gemm_tt, true, true, false)
// The epilogue's only where A is not transposed, as in a layer's forward
// (nt) and its input's gradient (nn); gemmX3 applies a transposed A's in
// a pass after the product.
X3_KERNEL(x3_gemm_epi_nn, false, false, true)
X3_KERNEL(x3_gemm_epi_nt, false, true, true)
