package cuda

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels"
)

// Note [F32 products as three TF32 ones]: under Options.MatmulF32 =
// F32TF32x3, the default, an F32 product C = A·B runs on TF32 tensor
// cores at F32's accuracy, in leangrad's own kernels (x3_gemm,
// gemm_tf32x3.cu). Each operand x is split into big = tf32(x), rounded to
// nearest, and small = x − big, which the tensor cores truncate to TF32,
// so that x = big + small to at most 2⁻²¹ of x (tf32_split, common.cuh),
// and C = As·Bb + Ab·Bs + Ab·Bb (As·Bs, at most 2⁻²² of each term, is
// below F32's rounding), as CUTLASS's 3xTF32 and transformer_flash32.cu do. The
// kernels split the operands on their way from shared memory to the
// tensor cores: they are read once, raw, and nothing is written but C.
//
// The tensor cores' F32 additions do not round to nearest, and the error
// of one accumulator grows linearly with the stretch of K it sums, where
// an FMA sum's grows about as its square root: through cuBLAS (PyTorch's,
// the same split, scripts/tf32x3-accuracy.py on the H200) a
// 768×3,072×16,384 product's relative error against float64 was 3.8e-5
// summed whole, 2.4e-6 in stretches of 1,024 and 6.5e-7 of 256, strict
// F32's 7.7e-7. So the kernels sum each short stretch of K from zero on
// the tensor cores (a stage of x3BK on sm_90a, a step of eight elsewhere)
// and add it into accumulators of their own, in F32 rounded to nearest:
// TestCUDAMatmulF32Accuracy measured 2.6e-7 at K 768 and at 3,072,
// strict F32's 3.5e-7 and 5.0e-7.
//
// Speed, on the H200 (scripts/x3gemm-bench.py):
// GPT-2 small's products at 59-62 TFLOP/s (33 for a weight gradient
// whose K is not split), strict F32's (cuBLAS) at 48-51. The
// mma.sync kernel (sm_80 on) stops near 50: the legacy tensor-core path
// is throttled (47% of the tensor pipe busy, warps waiting on the pipe and
// on their products; scripts/x3gemm-bench.py), so Hopper runs warpgroup
// MMAs, B split into a second pair of tiles while the tensor cores
// multiply the first.
//
// Products with fewer tiles than two waves of the device's
// multiprocessors (the weight gradients: 768×768 summed over 16,384
// tokens) split K among more blocks (x3Splits), and the splits of a tile
// add their sums into C in turn, in K's order, each block waiting at the
// tile's counter (kept in reduceDone) for the splits before it: results
// do not depend on scheduling, and no workspace holds partial sums (at
// GPT-2 small's largest fp32 batch they would take 100 MiB a product
// among the step's blocks: 64 windows fitted 24 GiB with them, 73
// without). An epilogue's residual is the β term of the
// product; its bias and activation (an F32 bias, one matrix) are applied
// as C is stored. Where they apply, and where K is split, the finished
// tile is staged in shared memory and stored in a rolled loop (by the
// last split, with the epilogue; x3_gemm_epi are the kernels that have
// it): in the plain kernels' store, unrolled over the accumulators, the
// epilogue's code cost the products their registers (GPT-2 small's step
// 358.7 ms against 279.4).

// The x3_gemm kernels' shape (gemm_tf32x3.cu): a block computes an x3Tile ×
// x3Tile tile of C with x3Threads threads, moving x3BK of the inner
// dimension at a time through x3Stages shared stages, a block a
// multiprocessor, and blocks are placed x3Group rows of tiles at a time.
// x3Shared is a block's dynamic shared memory: each stage an A and a B
// tile of x3Tile rows of x3BK + 4 words (the larger of a tile's two
// layouts).
const (
	x3Tile    = 128
	x3BK      = 32
	x3Stages  = 3
	x3Threads = 256
	x3Group   = 8
	x3Shared  = x3Stages * 2 * x3Tile * (x3BK + 4) * 4
	// x3WGShared is the warpgroup path's (sm_90a): two buffers of split B
	// tiles, big and small, on 1024 bytes, before the stages.
	x3WGShared = 4*x3Tile*x3BK*4 + 1024 + x3Shared
	// x3EpiShared is what x3_gemm_epi uses of it after the products: the
	// tile of C staged at x3Tile + 8 words a row (X3_STAGED_LD), and a tile
	// of R or Aux.
	x3EpiShared = (x3Tile*(x3Tile+8) + x3Tile*x3Tile) * 4
)

// x3MinChunk is the least of K one split of a product sums: a product
// with fewer blocks than two waves splits K into chunks of at least this
// many (x3Splits); x3MaxSplits caps the splits.
const (
	x3MinChunk  = 256
	x3MaxSplits = 16
)

// x3Gemm is the x3_gemm kernels' parameters (X3Gemm): C = α·op(A)·op(B) +
// β·R for each of a batch of matrices (blockIdx.y / Splits), R at C's
// strides, then gemm_epilogue's Bias, Op (Grad) and Aux (x3_gemm_epi; one
// matrix); where Splits > 1 each block sums KChunk of K and adds it into
// C in turn, Flags (zero between launches) counting each tile's splits
// done, a word a tile of each matrix. VecA and VecB say an operand
// moves 16 bytes at a time, VecC that C's pairs of columns are stored as
// one, VecC4 that C, R, Aux and Bias move 16 bytes at a time.
type x3Gemm struct {
	M, N, K, Lda, Ldb, Ldc    int32
	StrideA, StrideB, StrideC int64
	A                         uintptr `c:"const float*"`
	B                         uintptr `c:"const float*"`
	R                         uintptr `c:"const float*"`
	C                         uintptr `c:"float*"`
	Flags                     uintptr `c:"int*"`
	Bias                      uintptr `c:"const float*"`
	Aux                       uintptr `c:"float*"`
	Alpha, Beta               float32
	Op, Grad                  int32
	Splits, KChunk            int32
	TilesM, TilesN            int32
	VecA, VecB, VecC, VecC4   int32
}

type x3GemmArgs struct{ P x3Gemm }

// kX3Gemm are the product's kernels by A's and B's transposes, and
// kX3GemmEpi by B's those that apply the bias and activation too, A not
// transposed.
var (
	kX3Gemm = [2][2]kernel[x3GemmArgs]{
		{declareKernel[x3GemmArgs]("x3_gemm_nn"), declareKernel[x3GemmArgs]("x3_gemm_nt")},
		{declareKernel[x3GemmArgs]("x3_gemm_tn"), declareKernel[x3GemmArgs]("x3_gemm_tt")},
	}
	kX3GemmEpi = [2]kernel[x3GemmArgs]{declareKernel[x3GemmArgs]("x3_gemm_epi_nn"), declareKernel[x3GemmArgs]("x3_gemm_epi_nt")}
)

// x3Splits is how many chunks of K, each a multiple of x3BK, the product
// of tiles blocks a matrix (batch of them) sums apart, and the chunk, for
// a device that runs slots blocks at once: where the product has fewer
// blocks than two waves, the number of splits, within x3MaxSplits and
// chunks of x3MinChunk, that keeps the most slots busy over the product's
// waves, the fewest of the ties.
func x3Splits(m, n, k, batch, slots int) (splits, chunk int) {
	tiles := ((m + x3Tile - 1) / x3Tile) * ((n + x3Tile - 1) / x3Tile) * batch
	best, busy := 1, 0.0
	for s := 1; s <= x3MaxSplits; s++ {
		if s > 1 && k < s*x3MinChunk {
			break
		}
		waves := (tiles*s + slots - 1) / slots
		if u := float64(tiles*s) / float64(waves*slots); u > busy+0.02 {
			best, busy = s, u
		}
		if tiles >= 2*slots {
			break // two waves or more: the last one's idle slots cost less than the splits' additions
		}
	}
	if best == 1 {
		return 1, k
	}
	chunk = ((k+best-1)/best + x3BK - 1) / x3BK * x3BK
	return (k + chunk - 1) / chunk, chunk
}

// gemmX3 runs the F32 product g with e's residual, bias and activation
// (its bias gradients the caller sums) as x3_gemm's three TF32 products,
// the bias and activation as C is stored where they apply to one matrix,
// the bias is F32 and A is not transposed, else in a pass over C after it
// (the caller holds the lock).
func (b *Backend) gemmX3(g gemmCall, e kernels.Epilogue) {
	if g.ab != kernels.F32 || g.cType != kernels.F32 {
		panic(fmt.Sprintf("cuda: a TF32x3 product of %v operands into %v", g.ab, g.cType))
	}
	lda, ldb, ldc := g.lds()
	batch := max(g.batch, 1)
	p := x3Gemm{M: int32(g.m), N: int32(g.n), K: int32(g.k), Lda: int32(lda), Ldb: int32(ldb), Ldc: int32(ldc),
		StrideA: g.strideA, StrideB: g.strideB, StrideC: g.strideC, A: g.a, B: g.b, R: g.c, C: g.c,
		Alpha: g.alpha, Beta: g.beta,
		TilesM: int32((g.m + x3Tile - 1) / x3Tile), TilesN: int32((g.n + x3Tile - 1) / x3Tile)}
	if r := e.Residual; r.Valid() { // C = α·A·B + the residual
		if ldc != g.n || batch > 1 {
			panic(fmt.Sprintf("cuda: a TF32x3 product with a residual into %d matrices of %d columns at a row stride of %d", batch, g.n, ldc))
		}
		p.R, p.Beta = ptrOf(r), 1
	}
	splits, chunk := x3Splits(g.m, g.n, g.k, batch, b.sms)
	p.Splits, p.KChunk, p.Flags = int32(splits), int32(chunk), b.reduceDone.addr
	if tiles := int(p.TilesM*p.TilesN) * batch; splits > 1 && tiles > b.reduceDone.n {
		panic(fmt.Sprintf("cuda: a TF32x3 product of %d tiles split %d ways: %d counters", tiles, splits, b.reduceDone.n))
	}
	ta, tb := boolInt(g.transA), boolInt(g.transB)
	products := kX3Gemm[ta][tb]
	// The bias and activation as C is stored, by x3_gemm_epi, which A
	// transposed has none of.
	fused := (e.Bias.Valid() || e.Act != 0) && batch == 1 && (!e.Bias.Valid() || e.Bias.DType == kernels.F32) && !g.transA
	if fused {
		p.Bias, p.Aux, p.Op, p.Grad = ptrOf(e.Bias), ptrOf(e.Aux), int32(e.Act), boolInt(e.Grad)
		products = kX3GemmEpi[tb]
	}
	vec := func(ld int, stride int64, ptr uintptr) int32 {
		return boolInt(ld%4 == 0 && stride%4 == 0 && ptr%16 == 0)
	}
	p.VecA, p.VecB = vec(lda, g.strideA, g.a), vec(ldb, g.strideB, g.b)
	p.VecC = boolInt(ldc%2 == 0 && g.strideC%2 == 0 && p.C%8 == 0 && p.R%8 == 0)
	p.VecC4 = boolInt(ldc%4 == 0 && (p.C|p.R|p.Aux|p.Bias)%16 == 0)
	// At most 65,535 matrices (and their splits) a launch.
	per := max(1, 65535/splits)
	for b0 := 0; b0 < batch; b0 += per {
		nb := min(per, batch-b0)
		q := p
		q.A += uintptr(int64(b0) * g.strideA * 4)
		q.B += uintptr(int64(b0) * g.strideB * 4)
		q.C += uintptr(int64(b0) * g.strideC * 4)
		q.R += uintptr(int64(b0) * g.strideC * 4)
		products.launchShared(b, 0, dims{uint32(p.TilesM * p.TilesN), uint32(nb * splits), x3Threads}, b.x3Shared, x3GemmArgs{q})
	}
	if !fused {
		b.epiloguePass(g, e)
	}
}
