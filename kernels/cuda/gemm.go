package cuda

import (
	"fmt"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
)

// gemmCall describes one row-major (batched) product on raw device pointers.
type gemmCall struct {
	transA, transB bool
	m, n, k        int
	alpha, beta    float32
	a, b, c        uintptr
	strideA        int64
	strideB        int64
	strideC        int64
	batch          int
	ab, cType      kernels.DType // A and B share a dtype
	// lda, ldb and ldc, when set, are the operands' row strides, for
	// matrices inside wider ones (0: their own widths).
	lda, ldb, ldc int
}

// tf32 says whether g's product runs on TF32 tensor cores.
func (b *Backend) tf32(g gemmCall) bool {
	return g.ab == kernels.F32 && b.opts.MatmulF32 == kernels.F32TF32
}

// lds returns the operands' row strides: as set, or their own widths.
func (g gemmCall) lds() (lda, ldb, ldc int) {
	lda, ldb, ldc = g.k, g.n, g.n
	if g.transA {
		lda = g.m
	}
	if g.transB {
		ldb = g.k
	}
	if g.lda > 0 {
		lda = g.lda
	}
	if g.ldb > 0 {
		ldb = g.ldb
	}
	if g.ldc > 0 {
		ldc = g.ldc
	}
	return lda, ldb, ldc
}

func cudaType(dt kernels.DType) int32 {
	switch dt {
	case kernels.F32:
		return cudaR32F
	case kernels.F16:
		return cudaR16F
	case kernels.BF16:
		return cudaR16BF
	}
	panic(fmt.Sprintf("cuda: gemm of %v data", dt))
}

// gemm runs g with cuBLAS (the caller holds the lock): one 16-bit or TF32
// product with cuBLASLt and its timed algorithm (Note [products'
// algorithms timed]), the rest with cublasGemmEx; F32 operands as three
// TF32 products where the backend was opened with F32TF32x3 (gemmX3,
// leangrad's own kernels).
// cuBLAS is column major: a row-major C = A·B is the column-major Cᵀ =
// Bᵀ·Aᵀ, so the operands are passed swapped, with the row-major leading
// dimensions.
func (b *Backend) gemm(g gemmCall) {
	if b.x3 && g.ab == kernels.F32 {
		b.gemmX3(g, kernels.Epilogue{})
		return
	}
	if g.batch <= 1 && (g.ab != kernels.F32 || b.tf32(g)) {
		if ran, _ := b.gemmLt(g, kernels.Epilogue{}); ran {
			return
		}
	}
	opA, opB := int32(cublasOpN), int32(cublasOpN)
	if g.transA {
		opA = cublasOpT
	}
	if g.transB {
		opB = cublasOpT
	}
	lda, ldb, ldc := g.lds()
	compute := int32(cublasComputeF32)
	if b.tf32(g) {
		compute = cublasComputeF32FastTF32
	}
	b.alpha, b.beta = g.alpha, g.beta
	if b.prof != nil { // a profile tells the products apart by dtype and shape
		b.queued(fmt.Sprintf("cublas gemm %v→%v %d×%d×%d×%d%s", g.ab, g.cType, g.batch, g.m, g.n, g.k, map[bool]string{true: " (β=1)"}[g.beta != 0]))
	} else {
		b.queued("cublas gemm")
	}
	ta, tc := cudaType(g.ab), cudaType(g.cType)
	if g.batch <= 1 {
		b.cb.must("cublasGemmEx", b.cb.gemmEx(b.blas, opB, opA, int32(g.n), int32(g.m), int32(g.k), unsafe.Pointer(&b.alpha),
			g.b, ta, int32(ldb), g.a, ta, int32(lda), unsafe.Pointer(&b.beta), g.c, tc, int32(ldc), compute, cublasGemmDefault))
		return
	}
	b.cb.must("cublasGemmStridedBatchedEx", b.cb.gemmStridedBatchedEx(b.blas, opB, opA, int32(g.n), int32(g.m), int32(g.k),
		unsafe.Pointer(&b.alpha), g.b, ta, int32(ldb), g.strideB, g.a, ta, int32(lda), g.strideA,
		unsafe.Pointer(&b.beta), g.c, tc, int32(ldc), g.strideC, int32(g.batch), compute, cublasGemmDefault))
}

// Gemm computes a (batched) matrix product: F16 and BF16 operands by
// cuBLAS on tensor cores with F32 accumulation, F32 ones as the backend's
// Options.MatmulF32 says.
func (b *Backend) Gemm(p kernels.GemmParams, a, bb, c kernels.Buf) {
	kernels.CheckGemm(p, a, bb, c)
	batch := max(p.Batch, 1)
	b.enter()
	defer b.exit()
	b.gemm(gemmCall{transA: p.TransA, transB: p.TransB, m: p.M, n: p.N, k: p.K, alpha: p.Alpha, beta: p.Beta,
		a: ptrOf(a), b: ptrOf(bb), c: ptrOf(c), strideA: int64(p.StrideA), strideB: int64(p.StrideB),
		strideC: int64(p.StrideC), batch: batch, ab: a.DType, cType: c.DType})
}

type gemmEpilogueArgs struct {
	Rows, Cols, Stride int32
	C, Bias, Aux       uintptr
	Op, Grad           int32
}

var kGemmEpilogue = declareTyped[gemmEpilogueArgs]("gemm_epilogue")

// GemmEpilogue computes a product and its epilogue: the bias, GELU (or
// its derivative) and the residual in one cuBLASLt call where it fuses
// them, otherwise the residual copied into C, cublasGemmEx adding to it
// and one pass of gemm_epilogue over C; the bias gradients as column sums
// after it (Note [the fused epilogues]). F32 operands under F32TF32x3 run
// as gemmX3 says.
func (b *Backend) GemmEpilogue(p kernels.GemmParams, e kernels.Epilogue, a, bb, c kernels.Buf) {
	kernels.CheckGemmEpilogue(p, e, a, bb, c)
	b.enter()
	defer b.exit()
	g := gemmCall{transA: p.TransA, transB: p.TransB, m: p.M, n: p.N, k: p.K, alpha: p.Alpha,
		a: ptrOf(a), b: ptrOf(bb), c: ptrOf(c), batch: 1, ab: a.DType, cType: c.DType}
	var sums bool
	if b.x3 && g.ab == kernels.F32 {
		b.gemmX3(g, e)
	} else {
		sums = b.gemmEpilogue(g, e)
	}
	if sums {
		return
	}
	// The F32 bias gradients, summed from 16-bit C or A straight into F32
	// where the reduction splits its axis (reduce).
	if e.BiasGrad.Valid() {
		b.reduce(kernels.Sum, e.BiasGrad, c, kernels.Reduction{Outer: 1, Len: p.M, Inner: p.N})
	}
	if e.BiasGradA.Valid() {
		r := kernels.Reduction{Outer: p.M, Len: p.K, Inner: 1} // A stored M×K
		if p.TransA {
			r = kernels.Reduction{Outer: 1, Len: p.K, Inner: p.M} // A stored K×M
		}
		b.reduce(kernels.Sum, e.BiasGradA, a.Slice(0, p.M*p.K), r)
	}
}

// gemmEpilogue runs the product g (one, not a batch; C at g.c with row
// stride g.ldc, as the epilogue's Aux and Residual) with its epilogue e,
// reporting whether that included e's bias gradients (the caller holds the
// lock, and sums them otherwise).
func (b *Backend) gemmEpilogue(g gemmCall, e kernels.Epilogue) (sums bool) {
	ran, sums := b.gemmLt(g, e)
	if ran {
		return sums
	}
	_, _, ldc := g.lds()
	if r := e.Residual; r.Valid() { // C starts as the residual, and the product adds to it
		if ldc != g.n {
			panic(fmt.Sprintf("cuda: gemm epilogue with a residual into C of %d columns at a row stride of %d", g.n, ldc))
		}
		b.queued("memcpy device to device")
		b.d.must("cuMemcpyDtoDAsync", b.d.memcpyDtoDAsync(g.c, ptrOf(r), uintptr(g.m*g.n*g.cType.Size()), b.stream))
		g.beta = 1
	}
	b.gemm(g)
	b.epiloguePass(g, e)
	return false
}

// epiloguePass applies e's bias and activation (or its derivative) to the
// product g has stored in C, in one pass of gemm_epilogue (the caller holds
// the lock).
func (b *Backend) epiloguePass(g gemmCall, e kernels.Epilogue) {
	if !e.Bias.Valid() && e.Act == 0 {
		return
	}
	bias := e.Bias // the kernel reads an F32 bias: a 16-bit one widened, exactly
	if bias.Valid() && bias.DType != kernels.F32 {
		blk := b.workspace(int64(bias.N * 4))
		defer b.alloc.Free(blk)
		bias = kernels.Buf{Block: blk, N: bias.N, DType: kernels.F32}
		b.cast(bias, e.Bias)
	}
	_, _, ldc := g.lds()
	kGemmEpilogue.launch(b, g.cType, dims{uint32(min(g.m, b.sms*32)), 1, uint32(min(blockSize, (g.n+31)/32*32))},
		gemmEpilogueArgs{int32(g.m), int32(g.n), int32(ldc), g.c, ptrOf(bias), ptrOf(e.Aux), int32(e.Act), boolInt(e.Grad)})
}
