package cuda

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels"
)

// Note [F32 products as three TF32 ones]: under Options.MatmulF32 =
// F32TF32x3 an F32 product C = A·B runs on TF32 tensor cores, near F32's
// accuracy. Each operand x is split into big = tf32(x) and small =
// tf32(x − big), both rounded to nearest, so that x = big + small to about
// 2⁻²² of x, and C = As·Bb + Ab·Bs + Ab·Bb (As·Bs, about 2⁻²² of C, is
// below F32's rounding): one cuBLASLt TF32 product over three times the
// inner size, of A' = [As Ab Ab] and B' = [Bb; Bs; Bb], which
// tf32x3_split writes into a workspace, the small terms first, all summed
// in the product's F32 accumulators; the epilogues fuse as into any TF32
// product.
//
// Those accumulators lose more than an FMA sum as the stretch of K they
// sum grows: linearly, where an FMA sum's error grows about as its square
// root. On the H200 (scripts/tf32x3-accuracy.py, PyTorch's cuBLAS, the
// same split; 2026-12-04) a 16,384×768×3,072 product's relative error
// against float64 was 7.2e-6 summed whole, 2.4e-6 in stretches of 1,024
// and 6.4e-7 of 256, strict F32's 9.9e-7; a 768×3,072×16,384 one's
// 3.8e-5 whole, 2.4e-6 and 6.5e-7, strict 7.7e-7. So a product sums at
// most x3MaxK of K at a time, each stretch added into C (β = 1): a pass
// over C a stretch, which costs GPT-2 small's fp32 step about 9% (228.6
// against 250.0 ms) for errors two to five times strict F32's (against
// one TF32 product's 2.9e-4; TestCUDAMatmulF32Accuracy).
//
// The workspace holds three times the operands: past the chunk budget the
// product is cut along the batch, or along M, N or K (x3Cut), each chunk
// split and multiplied in turn; an operand a cut leaves whole (B along M,
// A along N) is split once. A cut along K has the residual added with its
// first stretch and the rest of the epilogue as a pass over C after the
// last.

// x3Dim is the dimension a TF32x3 product is cut along.
type x3Dim uint8

const (
	x3Whole x3Dim = iota
	x3Batch
	x3M
	x3N
	x3K
)

// x3Chunk is the alignment of chunks along M, N and K: tensor-core tiles'
// multiples, and the split's four-float accesses.
const x3Chunk = 64

// x3MaxK is the longest stretch of the inner dimension one TF32x3 product
// sums (Note [F32 products as three TF32 ones]).
const x3MaxK = 1024

// x3PerChunk is what x3Cut counts another chunk as, in floats moved: its
// launches and a smaller product's tail, taken as 16 MiB of traffic.
const x3PerChunk = 4 << 20

// x3Cut says how g (its epilogue non-empty when epi) is cut, and the
// chunks' extent along that dimension, as even as multiples of x3Chunk
// make them: along K in chunks of at most x3MaxK, and so that each chunk's
// split operands fit budget bytes. Of the cuts whose chunks fit, it takes
// the one that moves the fewest extra floats: K's add their partial C into
// C, M's and N's cost only their launches; N is not cut under an epilogue
// (its Aux and Residual would be strided). Where none fits, chunks of
// x3Chunk along K.
func x3Cut(g gemmCall, epi bool, budget int) (x3Dim, int) {
	floats := int64(budget / 4 / 3) // of A's and B's chunks, each stored three times
	m, n, k := int64(g.m), int64(g.n), int64(g.k)
	even := func(extent, c int64) int { // c or less, the chunks as even as x3Chunk allows
		chunks := (extent + c - 1) / c
		return int(min(extent, ((extent+chunks-1)/chunks+x3Chunk-1)/x3Chunk*x3Chunk))
	}
	per := m*k + k*n
	switch {
	case k > x3MaxK && g.batch > 1:
		return x3Batch, 1 // each matrix on its own, cut along K
	case k > x3MaxK:
		return x3K, even(k, max(x3Chunk, min(x3MaxK, floats/(m+n)/x3Chunk*x3Chunk)))
	case per*int64(max(g.batch, 1)) <= floats:
		return x3Whole, 0
	case g.batch > 1:
		return x3Batch, int(max(1, floats/per))
	}
	best, size, cost := x3K, x3Chunk, int64(-1)
	try := func(d x3Dim, extent, fixed, per, extra int64) {
		c := (floats - fixed) / per / x3Chunk * x3Chunk
		if c < x3Chunk {
			return
		}
		chunks := (extent + c - 1) / c
		if x := (chunks-1)*extra + chunks*x3PerChunk; cost < 0 || x < cost {
			best, size, cost = d, even(extent, c), x
		}
	}
	try(x3M, m, k*n, k, 0)
	if !epi {
		try(x3N, n, m*k, k, 0)
	}
	try(x3K, k, 0, m+n, 2*m*n)
	return best, size
}

// x3Part is one operand's split as tf32x3_split takes it (X3Part).
type x3Part struct {
	Batch, Rows, Cols, Ld int32
	Stride                int64
	X                     uintptr `c:"const float*"`
	Out                   uintptr `c:"float*"`
	Stacked, SmallMask    int32
	Vec4                  int32
}

type tf32x3SplitArgs struct{ A, B x3Part }

var kTF32x3Split = declareKernel[tf32x3SplitArgs]("tf32x3_split")

// x3Operand is a stretch of an operand to split: rows × cols floats at a
// row stride of ld from ptr, batch of them stride apart, written stacked
// (K along the stored rows) or side by side, the small part where small
// has its bit.
type x3Operand struct {
	ptr            uintptr
	rows, cols, ld int
	batch          int
	stride         int64
	stacked        bool
	small          int32
}

// items is how many matrices o's split holds: one where the batch shares
// it (stride 0).
func (o x3Operand) items() int {
	if o.stride == 0 {
		return 1
	}
	return o.batch
}

// floats is the size of o's parts: three floats for each of its own.
func (o x3Operand) floats() int64 { return 3 * int64(o.items()*o.rows*o.cols) }

// x3Split writes the parts of the operands (one or two; the rest zero
// values) into a new workspace block, returning their addresses and a func
// that frees the block (the caller holds the lock).
func (b *Backend) x3Split(ops ...x3Operand) (addrs [2]uintptr, free func()) {
	var parts [2]x3Part
	var offs [2]int64
	var bytes int64
	for i, o := range ops {
		offs[i] = bytes
		bytes += (o.floats()*4 + 255) &^ 255 // each operand's parts 256-byte aligned
	}
	blk := b.workspace(bytes)
	for i, o := range ops {
		addrs[i] = blk.Addr() + uintptr(offs[i])
		parts[i] = x3Part{int32(o.items()), int32(o.rows), int32(o.cols), int32(o.ld), o.stride, o.ptr, addrs[i],
			boolInt(o.stacked), o.small, boolInt(o.cols%4 == 0 && o.ld%4 == 0 && o.stride%4 == 0 && o.ptr%16 == 0)}
	}
	rows, threads := int64(0), 0 // a block a row, a thread for each four floats (or one) of the widest
	for _, p := range parts {
		rows += int64(p.Batch) * int64(p.Rows)
		threads = max(threads, int(p.Cols)>>(2*p.Vec4))
	}
	kTF32x3Split.launch(b, 0, dims{uint32(min(rows, int64(b.sms)*32)), 1, uint32(min(blockSize, (threads+31)/32*32))},
		tf32x3SplitArgs{parts[0], parts[1]})
	return addrs, func() { b.alloc.Free(blk) }
}

// gemmX3 runs the F32 product g, and e but its bias gradients, which the
// caller sums, as TF32x3 products (Note [F32 products as three TF32 ones];
// the caller holds the lock).
func (b *Backend) gemmX3(g gemmCall, e kernels.Epilogue) {
	if g.ab != kernels.F32 || g.cType != kernels.F32 {
		panic(fmt.Sprintf("cuda: a TF32x3 product of %v operands into %v", g.ab, g.cType))
	}
	e.BiasGrad, e.BiasGradA = kernels.Buf{}, kernels.Buf{}
	epi := e.Bias.Valid() || e.Act != 0 || e.Residual.Valid()
	batch := max(g.batch, 1)
	cut, size := x3Cut(g, epi, b.chunkBudget)
	lda, ldb, ldc := g.lds()
	// a and bOp are the chunk [b0, b0+nb) × [m0, m0+mc) × [k0, k0+kc) of
	// A and [k0, k0+kc) × [n0, n0+nc) of B, in their stored layouts.
	a := func(b0, nb, m0, mc, k0, kc int) x3Operand {
		o := x3Operand{rows: mc, cols: kc, ld: lda, batch: nb, stride: g.strideA, small: 0b001}
		off := m0*lda + k0
		if g.transA {
			o.rows, o.cols, o.stacked, off = kc, mc, true, k0*lda+m0
		}
		o.ptr = g.a + uintptr((int64(b0)*g.strideA+int64(off))*4)
		return o
	}
	bOp := func(b0, nb, k0, kc, n0, nc int) x3Operand {
		o := x3Operand{rows: kc, cols: nc, ld: ldb, batch: nb, stride: g.strideB, stacked: true, small: 0b010}
		off := k0*ldb + n0
		if g.transB {
			o.rows, o.cols, o.stacked, off = nc, kc, false, n0*ldb+k0
		}
		o.ptr = g.b + uintptr((int64(b0)*g.strideB+int64(off))*4)
		return o
	}
	// product multiplies split chunks: pa and pb at addresses wa and wb.
	product := func(b0, nb, m0, mc, n0, nc, k0, kc int, pa, pb x3Operand, wa, wb uintptr, e kernels.Epilogue) {
		call := gemmCall{transA: g.transA, transB: g.transB, m: mc, n: nc, k: 3 * kc, alpha: g.alpha, beta: g.beta,
			a: wa, b: wb, c: g.c + uintptr((int64(b0)*g.strideC+int64(m0*ldc+n0))*4), batch: nb,
			ab: kernels.F32, cType: kernels.F32, ldc: ldc, x3: true}
		if k0 > 0 {
			call.beta = 1 // adding to the earlier chunks along K
		}
		call.lda, call.ldb = 3*kc, nc
		if g.transA {
			call.lda = mc
		}
		if g.transB {
			call.ldb = 3 * kc
		}
		if pa.stride != 0 {
			call.strideA = int64(3 * pa.rows * pa.cols)
		}
		if pb.stride != 0 {
			call.strideB = int64(3 * pb.rows * pb.cols)
		}
		call.strideC = g.strideC
		if nb > 1 || !epi {
			b.gemm(call)
		} else {
			b.gemmEpilogue(call, e)
		}
	}
	// both splits both operands' chunks and multiplies them.
	both := func(b0, nb, m0, mc, n0, nc, k0, kc int, e kernels.Epilogue) {
		pa, pb := a(b0, nb, m0, mc, k0, kc), bOp(b0, nb, k0, kc, n0, nc)
		w, free := b.x3Split(pa, pb)
		defer free()
		product(b0, nb, m0, mc, n0, nc, k0, kc, pa, pb, w[0], w[1], e)
	}
	switch cut {
	case x3Whole:
		both(0, batch, 0, g.m, 0, g.n, 0, g.k, e)
	case x3Batch:
		for b0 := 0; b0 < batch; b0 += size {
			if size > 1 {
				both(b0, min(size, batch-b0), 0, g.m, 0, g.n, 0, g.k, e)
				continue
			}
			one := g // a matrix on its own, cut as it needs
			one.batch, one.strideA, one.strideB, one.strideC = 1, 0, 0, 0
			one.a += uintptr(int64(b0) * g.strideA * 4)
			one.b += uintptr(int64(b0) * g.strideB * 4)
			one.c += uintptr(int64(b0) * g.strideC * 4)
			b.gemmX3(one, e)
		}
	case x3M: // B split once
		pb := bOp(0, 1, 0, g.k, 0, g.n)
		wb, freeB := b.x3Split(pb)
		defer freeB()
		for m0 := 0; m0 < g.m; m0 += size {
			mc := min(size, g.m-m0)
			ec := e
			if ec.Aux.Valid() {
				ec.Aux = ec.Aux.Slice(m0*ldc, mc*ldc)
			}
			if ec.Residual.Valid() {
				ec.Residual = ec.Residual.Slice(m0*ldc, mc*ldc)
			}
			pa := a(0, 1, m0, mc, 0, g.k)
			wa, freeA := b.x3Split(pa)
			product(0, 1, m0, mc, 0, g.n, 0, g.k, pa, pb, wa[0], wb[0], ec)
			freeA()
		}
	case x3N: // A split once; no epilogue
		pa := a(0, 1, 0, g.m, 0, g.k)
		wa, freeA := b.x3Split(pa)
		defer freeA()
		for n0 := 0; n0 < g.n; n0 += size {
			nc := min(size, g.n-n0)
			pb := bOp(0, 1, 0, g.k, n0, nc)
			wb, freeB := b.x3Split(pb)
			product(0, 1, 0, g.m, n0, nc, 0, g.k, pa, pb, wa[0], wb[0], e)
			freeB()
		}
	case x3K: // the residual with the first chunk, the rest of e after the last
		for k0 := 0; k0 < g.k; k0 += size {
			ec := kernels.Epilogue{}
			if k0 == 0 {
				ec.Residual = e.Residual
			}
			both(0, 1, 0, g.m, 0, g.n, k0, min(size, g.k-k0), ec)
		}
		b.epiloguePass(g, e)
	}
}
