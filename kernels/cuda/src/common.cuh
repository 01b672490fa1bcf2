// leangrad CUDA kernels: shared definitions. Source (source.go) compiles
// these files after a prelude generated from Go (THREADS, FOR_TYPES, the
// reduction codes, the by-value structs) in its sourceOrder, as one module,
// with NVRTC for the device in hand; they include no header, so any NVRTC
// from CUDA 11.2 on compiles them.
//
// Storage types: float (F32), f16 (IEEE binary16 bits, converted with PTX
// cvt instructions), bf16 (bfloat16 bits in a struct of their own, so that
// its loads and stores overload apart from f16's; rounded to nearest even
// by cvt on sm_80 and later, in integer arithmetic before), int (I32).
// Arithmetic is always in float.

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

__device__ __forceinline__ float h2f(f16 h) {
    float f;
    asm("{cvt.f32.f16 %0, %1;}" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ f16 f2h(float f) {
    f16 h;
    asm("{cvt.rn.f16.f32 %0, %1;}" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf2f(bf16 h) { return __uint_as_float((unsigned)h.x << 16); }
__device__ __forceinline__ bf16 f2bf(float f) {
#if __CUDA_ARCH__ >= 800 // one cvt (a NaN becomes the canonical one)
    unsigned short h;
    asm("{cvt.rn.bf16.f32 %0, %1;}" : "=h"(h) : "f"(f));
    return bf16{h};
#else
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{(unsigned short)((u >> 16) | 0x40u)}; // NaN: quiet
    u += 0x7fffu + ((u >> 16) & 1u);
    return bf16{(unsigned short)(u >> 16)};
#endif
}

__device__ __forceinline__ float ld(const float* p, i64 i) { return p[i]; }
__device__ __forceinline__ float ld(const f16* p, i64 i) { return h2f(p[i]); }
__device__ __forceinline__ float ld(const bf16* p, i64 i) { return bf2f(p[i]); }
__device__ __forceinline__ void st(float* p, i64 i, float v) { p[i] = v; }
__device__ __forceinline__ void st(f16* p, i64 i, float v) { p[i] = f2h(v); }
__device__ __forceinline__ void st(bf16* p, i64 i, float v) { p[i] = f2bf(v); }

// tf32_split is x as big + small for TF32 products: big is x rounded to
// TF32 (the bits of F32 values whose last 13 mantissa bits are 0) to
// nearest, ties away, by adding half of the dropped bits' weight to the
// magnitude's bits; small is the remainder x − big, exact in F32, whose
// last bits the tensor cores ignore (truncated: its error is at most 2⁻²¹
// of x, where rounding it too gave 2⁻²²). A NaN's big part may be −0
// (the addition carries into the sign) but its small part is NaN, as is
// an infinity's, so that non-finite operands reach the products. Three
// operations: the mma.sync product kernel ran 11% faster with the
// integer rounding than with cvt.rna.tf32.f32 (scripts/x3gemm-bench.py).
__device__ __forceinline__ void tf32_split(float x, unsigned& big, unsigned& small) {
    big = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    small = __float_as_uint(x - __uint_as_float(big));
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

// mma1688_zero is c = a·b, the sum from zero.
__device__ __forceinline__ void mma1688_zero(float* c, const unsigned* a, const unsigned* b) {
#if __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
        : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.f));
#endif
}

// mma3 is c[n] += a·b[n] for each of N accumulators at F32's accuracy from
// the split fragments (tf32_split): the small terms first, each term over all N before
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

// ld4 and st4 move the four elements i..i+3 (i a multiple of 4) in one
// access: 16 bytes of float, 8 of f16 or bf16. vec4 says whether a pointer
// is aligned for them.
__device__ __forceinline__ void ld4(const float* p, i64 i, float* v) {
    float4 x = *(const float4*)(p + i);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
}
__device__ __forceinline__ void ld4(const f16* p, i64 i, float* v) {
    uint2 x = *(const uint2*)(p + i);
    v[0] = h2f((f16)(x.x & 0xffffu)), v[1] = h2f((f16)(x.x >> 16)), v[2] = h2f((f16)(x.y & 0xffffu)), v[3] = h2f((f16)(x.y >> 16));
}
__device__ __forceinline__ void ld4(const bf16* p, i64 i, float* v) {
    uint2 x = *(const uint2*)(p + i);
    v[0] = __uint_as_float(x.x << 16), v[1] = __uint_as_float(x.x & 0xffff0000u);
    v[2] = __uint_as_float(x.y << 16), v[3] = __uint_as_float(x.y & 0xffff0000u);
}
__device__ __forceinline__ void st4(float* p, i64 i, const float* v) { *(float4*)(p + i) = make_float4(v[0], v[1], v[2], v[3]); }
__device__ __forceinline__ void st4(f16* p, i64 i, const float* v) {
    *(uint2*)(p + i) = make_uint2((unsigned)f2h(v[0]) | ((unsigned)f2h(v[1]) << 16), (unsigned)f2h(v[2]) | ((unsigned)f2h(v[3]) << 16));
}
__device__ __forceinline__ void st4(bf16* p, i64 i, const float* v) {
    *(uint2*)(p + i) = make_uint2((unsigned)f2bf(v[0]).x | ((unsigned)f2bf(v[1]).x << 16),
                                  (unsigned)f2bf(v[2]).x | ((unsigned)f2bf(v[3]).x << 16));
}
template <typename T> __device__ __forceinline__ bool vec4(const T* p) { return ((unsigned long long)p & (4 * sizeof(T) - 1)) == 0; }

// ex2 is 2^x with subnormal results flushed to zero: the MUFU.EX2 alone,
// without the instructions exp2f (and expf) wrap around it. The softmax
// kernels (flash attention, the classifier's rows) work in log2 units
// (LOG2E folded into their scales): a probability under 2^-126 changes no
// row's sum, which is at least 1, and next to nothing of its products.
#define LOG2E 1.4426950408889634f
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Note [programmatic dependent launch]: on compute capability 9.0 and
// later the backend launches every kernel of this module as a programmatic
// dependent of the kernel before it in its stream (launch.go), so that the
// driver can place its blocks while that kernel's last blocks still run,
// rather than after it has finished. kernel_entry, every kernel's first
// statement, waits until the grids before it have finished and their
// writes are visible (griddepcontrol.wait: nothing of the kernel touches
// memory before it), then lets the kernel after it be placed
// (griddepcontrol.launch_dependents), whose blocks wait in their turn.
// Stream order is kept; only the launch overlaps. Elsewhere both are
// absent and launches are ordinary. TestKernelsWaitFirst checks every
// kernel's PTX.
__device__ __forceinline__ void kernel_entry() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#define GRID_STRIDE(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// block_sum reduces v over a block of at most 1024 threads; every thread gets
// the total. scratch holds 32 floats.
__device__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.f;
    return warp_sum(v);
}
__device__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : -INFINITY;
    return warp_max(v);
}

// MT_LOOP runs a multi-tensor kernel's loop: blockIdx.y picks tensor t of
// the TensorList L (generated), blocks along x stride over its elements i.
#define MT_LOOP(L, t, i)                                                                                        \
    int t = blockIdx.y;                                                                                        \
    if (t >= (L).count) return;                                                                                \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (L).n[t]; i += (i64)gridDim.x * blockDim.x)

// FOR_TYPES(M) (generated) instantiates a kernel template for each float
// storage type as extern "C" symbols name_f32, name_f16.
