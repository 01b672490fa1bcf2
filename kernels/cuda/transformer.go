package cuda

import (
	"fmt"
	"math/bits"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/memory"
)

// The transformer operations (kernels.TransformerOps). Attention and the
// fused classifier put their products on cuBLAS a chunk of rows at a time,
// around small kernels (transformer.cu): what a chunk needs is workspace
// from the pool, freed when the call returns, so neither operation ever
// holds the whole Tq×Tk (or N×V) matrix. Every reduction runs in a fixed
// order, so results repeat bit for bit.

// defaultChunkBudget caps the workspace of one chunk of attention's scores
// (or, twice it, of the classifier's logits), in bytes (Backend.chunkBudget,
// which tests lower to run many chunks).
const defaultChunkBudget = 256 << 20

type (
	embeddingArgs struct {
		N, Dim     int32
		IDs, Table uintptr
		Y          uintptr
	}
	embeddingKeysArgs struct {
		N, P      int32
		IDs, Keys uintptr
	}
	bitonicLocalArgs struct {
		Keys  uintptr
		P, K0 int32
	}
	bitonicStepArgs struct {
		Keys    uintptr
		P, K, J int32
	}
	embeddingBwdArgs struct {
		N, Dim           int32
		Keys, Dy, Dtable uintptr
		Acc              int32
	}
	layerNormFwdArgs struct {
		Rows, Cols int32
		X, G, B    uintptr
		Eps        float32
		Y, Mean, R uintptr
	}
	layerNormBwdArgs struct {
		Rows, Cols                   int32
		X, G, Mean, R, Dy, Dx, Parts uintptr
		Acc                          int32
		Rounded                      uintptr // dx rounded to dy's dtype, or 0
		Sums                         int32   // the partial sums of dx too
	}
	layerNormGradsArgs struct {
		Rows, Cols, Splits, Sets int32
		Parts, Dg, Db, Ds        uintptr
		Stride                   int32
	}
	attnLayout struct { // a strided [B, T, H, D] operand
		B, H, Tn, D, Row int32
		Batch            int64
	}
	attnMoveArgs struct {
		attnLayout
		Src, Dst uintptr
	}
	attnSoftmaxArgs struct {
		BHRows, Rows, Kl, Q0, Tq, Tk int32
		S, P, Lse                    uintptr
	}
	attnProbsArgs struct {
		BHRows, Rows, Kl, Q0, Tq, Tk int32
		S, Lse, P                    uintptr
	}
	attnDScoresArgs struct {
		BHRows, Rows, Kl, Q0, Tq int32
		Scale                    float32
		Dp, Dvec, P              uintptr
	}
	attnRowDotArgs struct {
		attnLayout
		Do, O, Dvec uintptr
	}
	flashFwdArgs struct {
		B, H, Tq, Tk int32
		Scale        float32
		Q            uintptr
		QRow         int32
		QBatch       int64
		K            uintptr
		KRow         int32
		KBatch       int64
		V            uintptr
		VRow         int32
		VBatch       int64
		O            uintptr
		ORow         int32
		OBatch       int64
		Lse          uintptr
	}
	flashBwdKVArgs struct {
		B, H, Tn int32
		Scale    float32
		Q        uintptr
		QRow     int32
		QBatch   int64
		K        uintptr
		KRow     int32
		KBatch   int64
		V        uintptr
		VRow     int32
		VBatch   int64
		Do       uintptr
		DoRow    int32
		DoBatch  int64
		Lse      uintptr
		Dvec     uintptr
		Dk       uintptr
		DkRow    int32
		DkBatch  int64
		Dv       uintptr
		DvRow    int32
		DvBatch  int64
	}
	flashBwdQArgs struct {
		B, H, Tn int32
		Scale    float32
		Q        uintptr
		QRow     int32
		QBatch   int64
		K        uintptr
		KRow     int32
		KBatch   int64
		V        uintptr
		VRow     int32
		VBatch   int64
		Do       uintptr
		DoRow    int32
		DoBatch  int64
		O        uintptr
		ORow     int32
		OBatch   int64
		Lse      uintptr
		Dvec     uintptr // written
		Dq       uintptr
		DqRow    int32
		DqBatch  int64
	}
	clsRowsArgs struct {
		V, Ld, R0                    int32
		Z, Labels, RowLoss, RowRight uintptr
		Grad                         int32
		Dz                           uintptr
		Scale                        uintptr // kernels.ClassifierParams.GradScale, or 0
		Inv                          float32 // 1/N, which the rows take with a scale
	}
	clsFinishArgs struct {
		N                           int32
		RowLoss, RowRight, Loss, Rt uintptr
	}
	sumsqMultiArgs struct {
		L       tensorList
		Base    int32
		Partial uintptr
	}
	sumsqFinishArgs struct {
		N                           int32
		Partial, Stretch, Done, Out uintptr
	}
	clipCoefArgs struct {
		Sumsq      uintptr
		MaxNorm    float32
		Norm, Coef uintptr
	}
	unscaleClipArgs struct {
		Sumsq, Scale      uintptr
		MaxNorm           float32
		Norm, Mult, Found uintptr
	}
	scaleMultiArgs struct {
		L    tensorList
		Coef uintptr
	}
)

var (
	kEmbedding     = declareTyped[embeddingArgs]("embedding")
	kEmbeddingKeys = declareKernel[embeddingKeysArgs]("embedding_keys")
	kBitonicLocal  = declareKernel[bitonicLocalArgs]("bitonic_local")
	kBitonicStep   = declareKernel[bitonicStepArgs]("bitonic_step")
	kEmbeddingBwd  = declareTyped[embeddingBwdArgs]("embedding_bwd")
	kLayerNormFwd  = declareTyped[layerNormFwdArgs]("layernorm_fwd")
	kLayerNormBwd  = declareTyped[layerNormBwdArgs]("layernorm_bwd")
	// The mixed ones take an F32 x (and dx) with y (and dy) of their type.
	kLayerNormFwdMixed = declareTyped[layerNormFwdArgs]("layernorm_fwd_mixed")
	kLayerNormBwdMixed = declareTyped[layerNormBwdArgs]("layernorm_bwd_mixed")
	kLayerNormGrads    = declareKernel[layerNormGradsArgs]("layernorm_grads")
	kAttnGather        = declareTyped[attnMoveArgs]("attn_gather")
	kAttnScatter       = declareTyped[attnMoveArgs]("attn_scatter")
	kAttnScatterF32    = declareTyped[attnMoveArgs]("attn_scatter_f32")
	kAttnSoftmax       = declareTyped[attnSoftmaxArgs]("attn_softmax")
	kAttnProbs         = declareTyped[attnProbsArgs]("attn_probs")
	kAttnDScores       = declareTyped[attnDScoresArgs]("attn_dscores")
	kAttnRowDot        = declareTyped[attnRowDotArgs]("attn_rowdot")
	kClsRows           = declareTyped[clsRowsArgs]("cls_rows")
	kClsRowsStash      = declareTyped[clsRowsArgs]("cls_rows_stash")
	// The flash kernels exist for the tensor cores' F16 and BF16, and for
	// F32 too (three TF32 products each: flash32.cu).
	kFlashFwd    = flashKernels[flashFwdArgs]("flash_fwd")
	kFlashBwdKV  = flashKernels[flashBwdKVArgs]("flash_bwd_kv")
	kFlashBwdQ   = flashKernels[flashBwdQArgs]("flash_bwd_q")
	kClsFinish   = declareKernel[clsFinishArgs]("cls_finish")
	kSumsqMulti  = declareKernel[sumsqMultiArgs]("sumsq_multi")
	kSumsqFinish = declareKernel[sumsqFinishArgs]("sumsq_finish")
	kClipCoef    = declareKernel[clipCoefArgs]("clip_coef")
	kUnscaleClip = declareKernel[unscaleClipArgs]("unscale_clip")
	kScaleMulti  = declareKernel[scaleMultiArgs]("scale_multi")
)

// Embedding gathers the ids' rows.
func (b *Backend) Embedding(y, table, ids kernels.Buf, n, vocab, dim int) {
	kernels.CheckEmbedding("embedding", y, table, ids, n, vocab, dim)
	s := floatType("embedding", y, table)
	b.enter()
	defer b.exit()
	kEmbedding.launch(b, s, b.elems(int64(n*dim)), embeddingArgs{int32(n), int32(dim), ptrOf(ids), ptrOf(table), ptrOf(y)})
}

// EmbeddingBackward sorts (id, position) keys, then sums each id's run of
// rows in position order into its row of the table, zeroed first unless
// it accumulates.
func (b *Backend) EmbeddingBackward(dtable, dy, ids kernels.Buf, n, vocab, dim int, accumulate bool) {
	kernels.CheckEmbedding("embedding backward", dy, dtable, ids, n, vocab, dim)
	kernels.CheckF32("embedding backward table", dtable)
	s := floatType("embedding backward", dy)
	if !accumulate {
		b.Fill(dtable, 0)
	}
	b.enter()
	defer b.exit()
	p := 1 << bits.Len(uint(max(n, 2*blockSize)-1))
	ws := b.workspace(int64(p) * 8)
	defer b.alloc.Free(ws)
	keys := ws.Addr()
	kEmbeddingKeys.launch(b, 0, b.elems(int64(p)), embeddingKeysArgs{int32(n), int32(p), ptrOf(ids), keys})
	b.sortKeys(keys, p)
	kEmbeddingBwd.launch(b, s, dims{uint32(n), 1, 128}, embeddingBwdArgs{int32(n), int32(dim), keys, ptrOf(dy), ptrOf(dtable), boolInt(accumulate)})
}

// sortKeys sorts p 64-bit keys (a power of two, at least 2·blockSize)
// ascending: the runs of 2·blockSize in shared memory, then each stage's
// longer steps in global memory and its last ones in shared memory.
func (b *Backend) sortKeys(keys uintptr, p int) {
	runs := dims{uint32(p / (2 * blockSize)), 1, blockSize}
	kBitonicLocal.launch(b, 0, runs, bitonicLocalArgs{keys, int32(p), 0})
	for k := 4 * blockSize; k <= p; k <<= 1 {
		for j := k >> 1; j > blockSize; j >>= 1 {
			kBitonicStep.launch(b, 0, b.elems(int64(p)), bitonicStepArgs{keys, int32(p), int32(k), int32(j)})
		}
		kBitonicLocal.launch(b, 0, runs, bitonicLocalArgs{keys, int32(p), int32(k)})
	}
}

// lnWarps is the warps per block of the layer-norm kernels and
// lnBlocksPerSM the blocks a multiprocessor holds at once (their launch
// bounds); lnBlocks the blocks, a fixed number per device, all at once
// (the backward's partial sums are a row per block, or per warp for rows
// longer than lnRegCols, so their count, and the order of the sums,
// depends on the device alone). One wave rather
// than two halves the backward's partial sums: on the H200 at 16384×768
// the backward with its sums took 0.089 ms against 0.096
// (scripts/ln-bench.py, 2026-12-02).
const (
	lnWarps       = 8
	lnBlocksPerSM = 2
)

// lnRegCols is the longest row the layer-norm kernels keep in registers
// (32 values a lane): their backward adds its sums a block at a time for
// such rows, a warp at a time for longer ones (LN_REG_COLS).
const lnRegCols = 1024

// lnSplits is how many stretches of its rows of partial sums the
// layer-norm backward adds first, side by side.
const lnSplits = 32

func (b *Backend) lnBlocks(rows int) int {
	return max(1, min((rows+lnWarps-1)/lnWarps, lnBlocksPerSM*b.sms))
}

// LayerNorm normalises a row per warp.
func (b *Backend) LayerNorm(p kernels.LayerNormParams, x, gamma, beta, y, mean, rstd kernels.Buf) {
	kernels.CheckLayerNorm("layer norm", p, x, gamma, mean, rstd, y)
	kernels.CheckLen("layer norm bias", p.Cols, beta)
	kernels.CheckF32("layer norm bias", beta)
	k, s := kLayerNormFwd, floatType("layer norm", x)
	if y.DType != x.DType {
		k, s = kLayerNormFwdMixed, y.DType
	}
	b.enter()
	defer b.exit()
	k.launch(b, s, dims{uint32(b.lnBlocks(p.Rows)), 1, 32 * lnWarps}, layerNormFwdArgs{int32(p.Rows), int32(p.Cols),
		ptrOf(x), ptrOf(gamma), ptrOf(beta), p.Eps, ptrOf(y), ptrOf(mean), ptrOf(rstd)})
}

// LayerNormBackward computes dx a row per warp, the sums for dγ and dβ
// (and, with p.Sums, dx's column sums) in a row of a workspace for each
// block (each warp, for rows longer than lnRegCols), summed over the rows
// in order.
func (b *Backend) LayerNormBackward(p kernels.LayerNormParams, x, gamma, mean, rstd, dy, dx, dgamma, dbeta kernels.Buf) {
	kernels.CheckLayerNorm("layer norm backward", p, x, gamma, mean, rstd, dy, dx)
	kernels.CheckLike("layer norm backward dx", x, dx)
	kernels.CheckLen("layer norm backward gradients", p.Cols, dgamma, dbeta)
	kernels.CheckF32("layer norm backward gradients", dgamma, dbeta)
	kernels.CheckLayerNormRounded("layer norm backward", p, dy, dx)
	k, s := kLayerNormBwd, floatType("layer norm backward", x, dx)
	if dy.DType != x.DType {
		k, s = kLayerNormBwdMixed, dy.DType
	}
	b.enter()
	defer b.exit()
	blocks := b.lnBlocks(p.Rows)
	parts := blocks * lnWarps // rows of partial sums
	if p.Cols <= lnRegCols {
		parts = blocks
	}
	sets := int64(2) // dγ's and dβ's partial sums, and dx's for Sums
	if p.Sums.Valid() {
		sets = 3
	}
	row := sets * int64(p.Cols) // floats
	ws := b.workspace(int64(parts) * row * 4)
	defer b.alloc.Free(ws)
	k.launch(b, s, dims{uint32(blocks), 1, 32 * lnWarps}, layerNormBwdArgs{int32(p.Rows), int32(p.Cols),
		ptrOf(x), ptrOf(gamma), ptrOf(mean), ptrOf(rstd), ptrOf(dy), ptrOf(dx), ws.Addr(), boolInt(p.Accumulate), ptrOf(p.Rounded),
		boolInt(p.Sums.Valid())})
	// The rows' sums in two rounds: stretches of rows side by side, then
	// the stretches in order.
	sums, splits := ws.Addr(), parts
	if parts > 4*lnSplits {
		part := b.workspace(int64(lnSplits) * row * 4)
		defer b.alloc.Free(part)
		at := func(set int) uintptr { return part.Addr() + uintptr(set*p.Cols*4) }
		kLayerNormGrads.launch(b, 0, dims{uint32((p.Cols + 31) / 32), lnSplits, 256},
			layerNormGradsArgs{int32(parts), int32(p.Cols), lnSplits, int32(sets), ws.Addr(), at(0), at(1), at(2), int32(row)})
		sums, splits = part.Addr(), lnSplits
	}
	kLayerNormGrads.launch(b, 0, dims{uint32((p.Cols + 31) / 32), 1, 256},
		layerNormGradsArgs{int32(splits), int32(p.Cols), 1, int32(sets), sums, ptrOf(dgamma), ptrOf(dbeta), ptrOf(p.Sums), 0})
}

// attnChunk is how many query rows of each batch and head a chunk of
// attention takes: its scores (F32) and probabilities (es bytes each) over
// tk keys within budget bytes, a multiple of 64 where it is not all of them,
// so that the chunks' products have the shapes cuBLAS's tensor-core kernels
// want.
func attnChunk(budget, bh, tq, tk, es int) int {
	m := max(1, min(tq, budget/max(1, bh*tk*(4+es))))
	if m > 64 && m < tq {
		m &^= 63
	}
	return m
}

// Attention runs as cuDNN's graph (Note [cuDNN's attention]) or the flash
// kernels where they take it, else chunked: q, k and v gathered into
// [B·H, T, D]; per chunk of query rows, the scores over the keys the
// chunk sees (cuBLAS, F32, scaled), their masked softmax (the log-sum-exp
// saved, the probabilities in the operands' dtype) and their product with
// v; o scattered back.
func (b *Backend) Attention(p kernels.AttentionParams, q, k, v, o, lse kernels.Buf) {
	kernels.CheckAttention("attention", p, q, k, v, o, lse)
	s := floatType("attention", q, k, v, o)
	b.enter()
	defer b.exit()
	if b.flash(p, s, q, k, v, o) {
		if s != kernels.F32 && b.dnnAttention(p, s, q, k, v, o, lse) {
			return
		}
		grid, shared := flashGrid(p, flashFwdWarpgroups), 0
		if s == kernels.F32 {
			grid, shared = flashGrid(p, 1), flash32Shared
		}
		kFlashFwd[s].launchShared(b, 0, grid, shared, flashFwdArgs{
			int32(p.B), int32(p.H), int32(p.Tq), int32(p.Tk), p.Scale,
			ptrOf(q), int32(p.QRow), int64(p.QBatch), ptrOf(k), int32(p.KRow), int64(p.KBatch),
			ptrOf(v), int32(p.VRow), int64(p.VBatch), ptrOf(o), int32(p.ORow), int64(p.OBatch), ptrOf(lse)})
		return
	}
	bh, es := p.B*p.H, int64(q.DType.Size())
	qh, kh, vh := b.workspace(int64(bh*p.Tq*p.D)*es), b.workspace(int64(bh*p.Tk*p.D)*es), b.workspace(int64(bh*p.Tk*p.D)*es)
	defer b.alloc.Free(qh)
	defer b.alloc.Free(kh)
	defer b.alloc.Free(vh)
	oh := b.workspace(int64(bh*p.Tq*p.D) * es)
	defer b.alloc.Free(oh)
	b.attnGather(s, p, p.Tq, p.QRow, p.QBatch, q, qh.Addr())
	b.attnGather(s, p, p.Tk, p.KRow, p.KBatch, k, kh.Addr())
	b.attnGather(s, p, p.Tk, p.VRow, p.VBatch, v, vh.Addr())
	m := attnChunk(b.chunkBudget, bh, p.Tq, p.Tk, int(es))
	sc, pr := b.workspace(int64(bh*m*p.Tk)*4), b.workspace(int64(bh*m*p.Tk)*es)
	defer b.alloc.Free(sc)
	defer b.alloc.Free(pr)
	D := p.D
	for q0 := 0; q0 < p.Tq; q0 += m {
		rows := min(m, p.Tq-q0)
		kl := p.Tk - p.Tq + q0 + rows // the keys the chunk's last query sees
		b.gemm(gemmCall{transB: true, m: rows, n: kl, k: D, alpha: p.Scale, a: qh.Addr() + uintptr(int64(q0*D)*es),
			b: kh.Addr(), c: sc.Addr(), strideA: int64(p.Tq * D), strideB: int64(p.Tk * D), strideC: int64(rows * kl),
			batch: bh, ab: q.DType, cType: kernels.F32})
		kAttnSoftmax.launch(b, s, b.warpRows(bh*rows), attnSoftmaxArgs{int32(bh * rows), int32(rows), int32(kl), int32(q0),
			int32(p.Tq), int32(p.Tk), sc.Addr(), pr.Addr(), ptrOf(lse)})
		b.gemm(gemmCall{m: rows, n: D, k: kl, alpha: 1, a: pr.Addr(), b: vh.Addr(), c: oh.Addr() + uintptr(int64(q0*D)*es),
			strideA: int64(rows * kl), strideB: int64(p.Tk * D), strideC: int64(p.Tq * D), batch: bh, ab: q.DType, cType: q.DType})
	}
	kAttnScatter.launch(b, s, b.moveDims(p, p.Tq), attnMoveArgs{layout(p, p.Tq, p.ORow, p.OBatch), oh.Addr(), ptrOf(o)})
}

// flashTile is the flash kernels' tile of keys (queries in the backward's
// kv kernel) and flashD the head width they are compiled for. A block of
// the backward's kernels is flashWarpgroups warpgroups of 128 threads and
// one of the forward's flashFwdWarpgroups, each warpgroup taking 64 rows
// of queries (keys) and all sharing each tile the block copies
// (FLASH_TILE, FLASH_D, FLASH_WG and FLASH_FWD_WG in the prelude). Two
// warpgroups halve the tiles' copies; at the registers the backward's
// kernels hold they also leave fewer warpgroups on a multiprocessor. On
// the H200 at GPT-2 small's shape, blocks of two cost the backward 9%
// (2026-12-02) and took the forward from 0.148-0.149 to 0.142-0.143 ms
// (2026-12-03; scripts/flash-bench.py).
const (
	flashTile          = 64
	flashD             = 64
	flashWarpgroups    = 1
	flashFwdWarpgroups = 2
)

// flash32LD is the words of a row of the F32 flash kernels' shared tiles
// (F32_LD in the prelude): FLASH_D and four more, which keeps their
// fragments' loads free of bank conflicts. flash32Shared is the forward's
// dynamic shared memory, a big and a small tile of two operands
// (flash32.cu); flash32BwdShared flash_bwd_q_f32's, with two raw tiles of
// the block's own rows after them; flash32KVShared flash_bwd_kv_f32's,
// with its tile's log-sum-exps and Σ do·o after those.
const (
	flash32LD        = flashD + 4
	flash32Tile      = flashTile * flash32LD * 4
	flash32Shared    = 4 * flash32Tile
	flash32BwdShared = 6 * flash32Tile
	flash32KVShared  = flash32BwdShared + 2*flashTile*4
)

// flashKernels declares a flash kernel for each dtype it is compiled for:
// name_f16, name_bf16 and name_f32.
func flashKernels[A any](name string) map[kernels.DType]kernel[A] {
	return map[kernels.DType]kernel[A]{kernels.F16: declareKernel[A](name + "_f16"),
		kernels.BF16: declareKernel[A](name + "_bf16"), kernels.F32: declareKernel[A](name + "_f32")}
}

// flashGrid is the flash kernels' grid and block for p: a block for every
// 64·warpgroups queries (keys) of each head.
func flashGrid(p kernels.AttentionParams, warpgroups int) dims {
	rows := 64 * warpgroups
	return dims{uint32((p.Tq + rows - 1) / rows), uint32(p.B * p.H), uint32(128 * warpgroups)}
}

// flash reports whether the flash kernels take an attention of dtype s:
// F16, BF16 or F32 operands of head width flashD on sm_80 or later, at
// least as many keys as queries, every operand's strides a multiple of 16
// bytes' elements and its offset of 16 bytes (tiles move 16 bytes at a
// time), and not Backend.noFlash.
func (b *Backend) flash(p kernels.AttentionParams, s kernels.DType, bufs ...kernels.Buf) bool {
	dtype := s == kernels.F16 || s == kernels.BF16 || s == kernels.F32
	if b.noFlash || !b.tensorCores || !dtype || p.D != flashD || p.Tk < p.Tq {
		return false
	}
	per := 16 / s.Size()
	for _, n := range []int{p.QRow, p.KRow, p.VRow, p.ORow, p.QBatch, p.KBatch, p.VBatch, p.OBatch} {
		if n%per != 0 {
			return false
		}
	}
	for _, x := range bufs {
		if x.Off%16 != 0 {
			return false
		}
	}
	return true
}

func layout(p kernels.AttentionParams, t, row, batch int) attnLayout {
	return attnLayout{int32(p.B), int32(p.H), int32(t), int32(p.D), int32(row), int64(batch)}
}

// moveDims is the grid of attn_gather and attn_scatter for t rows of
// each head: a row of blocks a head (up to 65,535 rows, striding past
// them), enough along it for the head's elements four at a time.
func (b *Backend) moveDims(p kernels.AttentionParams, t int) dims {
	return dims{b.blocks(int64(t*p.D+3)/4, blockSize), uint32(min(p.B*p.H, 65535)), blockSize}
}

// warpRows is the grid of a kernel that runs a warp a row over rows rows
// (the attention chunks' softmax, probabilities and score gradients).
func (b *Backend) warpRows(rows int) dims {
	return dims{b.blocks(int64(rows)*32, blockSize), 1, blockSize}
}

func (b *Backend) attnGather(s kernels.DType, p kernels.AttentionParams, t, row, batch int, src kernels.Buf, dst uintptr) {
	kAttnGather.launch(b, s, b.moveDims(p, t), attnMoveArgs{layout(p, t, row, batch), ptrOf(src), dst})
}

// AttentionBackward runs as cuDNN's graph or the flash kernels where they
// take it, else it recomputes each chunk's scores and probabilities from
// the saved log-sum-exp: dv += pᵀ·do, dp = do·vᵀ, ds = p·(dp − Σdo·o)·Scale,
// dq = ds·k, dk += dsᵀ·q, with dq, dk and dv accumulated in F32 and
// scattered into the gradients' dtype at the end.
func (b *Backend) AttentionBackward(p kernels.AttentionParams, q, k, v, o, lse, do, dq, dk, dv kernels.Buf) {
	kernels.CheckAttention("attention backward", p, q, k, v, o, lse)
	kernels.CheckAttention("attention backward gradients", p, dq, dk, dv, do, lse)
	if p.Tq != p.Tk {
		panic(fmt.Sprintf("cuda: attention backward of %d queries over %d keys: want as many", p.Tq, p.Tk))
	}
	s := floatType("attention backward", q, k, v, o, do, dq, dk, dv)
	b.enter()
	defer b.exit()
	if b.flash(p, s, q, k, v, o, do, dq, dk, dv) {
		if s != kernels.F32 && b.dnnAttentionBackward(p, s, q, k, v, o, lse, do, dq, dk, dv) {
			return
		}
		// flash_bwd_q writes the rows' Σ do·o (dvec) that flash_bwd_kv,
		// after it, reads.
		dvec := b.workspace(int64(p.B*p.H*p.Tq) * 4)
		defer b.alloc.Free(dvec)
		grid, qShared, kvShared := flashGrid(p, flashWarpgroups), 0, 0
		if s == kernels.F32 {
			grid, qShared, kvShared = flashGrid(p, 1), flash32BwdShared, flash32KVShared
		}
		Q, K, V, Do := ptrOf(q), ptrOf(k), ptrOf(v), ptrOf(do)
		kFlashBwdQ[s].launchShared(b, 0, grid, qShared, flashBwdQArgs{int32(p.B), int32(p.H), int32(p.Tq), p.Scale,
			Q, int32(p.QRow), int64(p.QBatch), K, int32(p.KRow), int64(p.KBatch), V, int32(p.VRow), int64(p.VBatch),
			Do, int32(p.ORow), int64(p.OBatch), ptrOf(o), int32(p.ORow), int64(p.OBatch), ptrOf(lse), dvec.Addr(),
			ptrOf(dq), int32(p.QRow), int64(p.QBatch)})
		kFlashBwdKV[s].launchShared(b, 0, grid, kvShared, flashBwdKVArgs{int32(p.B), int32(p.H), int32(p.Tq), p.Scale,
			Q, int32(p.QRow), int64(p.QBatch), K, int32(p.KRow), int64(p.KBatch), V, int32(p.VRow), int64(p.VBatch),
			Do, int32(p.ORow), int64(p.OBatch), ptrOf(lse), dvec.Addr(),
			ptrOf(dk), int32(p.KRow), int64(p.KBatch), ptrOf(dv), int32(p.VRow), int64(p.VBatch)})
		return
	}
	T, D, bh, es := p.Tq, p.D, p.B*p.H, int64(q.DType.Size())
	n := int64(bh * T * D)
	var blocks []*memory.Block
	ws := func(bytes int64) uintptr {
		blk := b.workspace(bytes)
		blocks = append(blocks, blk)
		return blk.Addr()
	}
	defer func() {
		for _, blk := range blocks {
			b.alloc.Free(blk)
		}
	}()
	qh, kh, vh, doh := ws(n*es), ws(n*es), ws(n*es), ws(n*es)
	dqh, dkh, dvh, dvec := ws(n*4), ws(n*4), ws(n*4), ws(int64(bh*T)*4)
	b.attnGather(s, p, T, p.QRow, p.QBatch, q, qh)
	b.attnGather(s, p, T, p.KRow, p.KBatch, k, kh)
	b.attnGather(s, p, T, p.VRow, p.VBatch, v, vh)
	b.attnGather(s, p, T, p.ORow, p.OBatch, do, doh)
	kAttnRowDot.launch(b, s, b.elems(int64(bh*T)), attnRowDotArgs{layout(p, T, p.ORow, p.OBatch), ptrOf(do), ptrOf(o), dvec})
	b.memsetF32(dkh, n)
	b.memsetF32(dvh, n)
	m := attnChunk(b.chunkBudget, bh, T, T, int(es))
	sc, pr := ws(int64(bh*m*T)*4), ws(int64(bh*m*T)*es)
	for q0 := 0; q0 < T; q0 += m {
		rows := min(m, T-q0)
		kl := q0 + rows
		qc, doc := qh+uintptr(int64(q0*D)*es), doh+uintptr(int64(q0*D)*es)
		// s = Scale·q·kᵀ, p from the log-sum-exp
		b.gemm(gemmCall{transB: true, m: rows, n: kl, k: D, alpha: p.Scale, a: qc, b: kh, c: sc,
			strideA: int64(T * D), strideB: int64(T * D), strideC: int64(rows * kl), batch: bh, ab: q.DType, cType: kernels.F32})
		kAttnProbs.launch(b, s, b.warpRows(bh*rows), attnProbsArgs{int32(bh * rows), int32(rows), int32(kl), int32(q0),
			int32(T), int32(T), sc, ptrOf(lse), pr})
		// dv[:kl] += pᵀ·do
		b.gemm(gemmCall{transA: true, m: kl, n: D, k: rows, alpha: 1, beta: 1, a: pr, b: doc, c: dvh,
			strideA: int64(rows * kl), strideB: int64(T * D), strideC: int64(T * D), batch: bh, ab: q.DType, cType: kernels.F32})
		// dp = do·vᵀ (over the scores' buffer), then ds over p's
		b.gemm(gemmCall{transB: true, m: rows, n: kl, k: D, alpha: 1, a: doc, b: vh, c: sc,
			strideA: int64(T * D), strideB: int64(T * D), strideC: int64(rows * kl), batch: bh, ab: q.DType, cType: kernels.F32})
		kAttnDScores.launch(b, s, b.warpRows(bh*rows), attnDScoresArgs{int32(bh * rows), int32(rows), int32(kl), int32(q0),
			int32(T), p.Scale, sc, dvec, pr})
		// dq[q0:] = ds·k;  dk[:kl] += dsᵀ·q
		b.gemm(gemmCall{m: rows, n: D, k: kl, alpha: 1, a: pr, b: kh, c: dqh + uintptr(int64(q0*D)*4),
			strideA: int64(rows * kl), strideB: int64(T * D), strideC: int64(T * D), batch: bh, ab: q.DType, cType: kernels.F32})
		b.gemm(gemmCall{transA: true, m: kl, n: D, k: rows, alpha: 1, beta: 1, a: pr, b: qc, c: dkh,
			strideA: int64(rows * kl), strideB: int64(T * D), strideC: int64(T * D), batch: bh, ab: q.DType, cType: kernels.F32})
	}
	for _, g := range []struct {
		src        uintptr
		dst        kernels.Buf
		row, batch int
	}{{dqh, dq, p.QRow, p.QBatch}, {dkh, dk, p.KRow, p.KBatch}, {dvh, dv, p.VRow, p.VBatch}} {
		kAttnScatterF32.launch(b, s, b.moveDims(p, T), attnMoveArgs{layout(p, T, g.row, g.batch), g.src, ptrOf(g.dst)})
	}
}

// memsetF32 zeroes n float32s at p on the stream (the lock is held).
func (b *Backend) memsetF32(p uintptr, n int64) {
	b.queued("memset")
	b.d.must("cuMemsetD32Async", b.d.memsetD32Async(p, 0, uintptr(n), b.stream))
}

// ClassifierLoss: per chunk of rows, the logits (cuBLAS, in the operands'
// dtype), each row's loss, right prediction and softmax − one-hot (written
// over the logits), then dh = softmax·w/N and dw += softmaxᵀ·h/N; the mean
// loss and the right count summed at the end in one block. cuBLAS's tensor-core kernels want
// aligned shapes, and GPT-2's vocabulary of 50,257 is odd (its products
// run 6× slower than 50,240's on the H200): each product is split into the
// vocabulary's first multiple of 64 tokens and the few left, the chunks'
// rows are a multiple of 64 and padded to a multiple of 16 values.
func (b *Backend) ClassifierLoss(p kernels.ClassifierParams, h, w, labels, loss, right, dh, dw kernels.Buf) {
	kernels.CheckClassifier(p, h, w, labels, loss, right, dh, dw)
	s := floatType("classifier loss", h, w)
	b.enter()
	defer b.exit()
	es := int64(h.DType.Size())
	ld := (p.V + 15) &^ 15
	// The logits in h's dtype, their gradient written over them. Twice the
	// chunk budget: each chunk's weight-gradient product reads and writes
	// all of dw (F32, V×C), so fewer chunks move less.
	m := clsChunkRows(p.N, 2*b.chunkBudget/(ld*int(es)))
	z := b.workspace(int64(m*ld) * es)
	defer b.alloc.Free(z)
	rows := b.workspace(int64(p.N) * 8)
	defer b.alloc.Free(rows)
	rowLoss, rowRight := rows.Addr(), rows.Addr()+uintptr(p.N*4)
	// The products scale the logits' gradient by 1/N, or with a gradient
	// scale, which the host does not know, the rows kernel does, by
	// scale/N, before rounding it (cls_scale).
	inv, alpha := 1/float32(p.N), 1/float32(p.N)
	if p.GradScale.Valid() {
		alpha = 1
	}
	type part struct{ lo, n int } // a stretch of the vocabulary
	parts := []part{{0, p.V &^ 63}, {p.V &^ 63, p.V % 64}}
	wAt := func(t int) uintptr { return ptrOf(w) + uintptr(int64(t*p.C)*es) }
	stash := b.clsStash(p, int(es))
	for r0 := 0; r0 < p.N; r0 += m {
		n := min(m, p.N-r0)
		hc := ptrOf(h) + uintptr(int64(r0*p.C)*es)
		for _, v := range parts {
			if v.n > 0 {
				b.gemm(gemmCall{transB: true, m: n, n: v.n, k: p.C, alpha: 1, a: hc, b: wAt(v.lo), c: z.Addr() + uintptr(int64(v.lo)*es),
					batch: 1, ab: h.DType, cType: h.DType, ldc: ld})
			}
		}
		args := clsRowsArgs{int32(p.V), int32(ld), int32(r0), z.Addr(), ptrOf(labels), rowLoss, rowRight, boolInt(p.Grad), z.Addr(),
			ptrOf(p.GradScale), inv}
		if stash > 0 {
			kClsRowsStash.launchShared(b, s, dims{uint32(n), 1, clsThreads}, stash, args)
		} else {
			kClsRows.launch(b, s, dims{uint32(n), 1, clsThreads}, args)
		}
		if !p.Grad {
			continue
		}
		beta := float32(1) // dw accumulates over the chunks
		if r0 == 0 {
			beta = 0
		}
		dhBeta := float32(0) // dh sums the stretches
		for _, v := range parts {
			if v.n == 0 {
				continue
			}
			dzv := z.Addr() + uintptr(int64(v.lo)*es)
			b.gemm(gemmCall{m: n, n: p.C, k: v.n, alpha: alpha, beta: dhBeta, a: dzv, b: wAt(v.lo), c: ptrOf(dh) + uintptr(r0*p.C*4),
				batch: 1, ab: h.DType, cType: kernels.F32, lda: ld})
			b.gemm(gemmCall{transA: true, m: v.n, n: p.C, k: n, alpha: alpha, beta: beta, a: dzv, b: hc, c: ptrOf(dw) + uintptr(v.lo*p.C*4),
				batch: 1, ab: h.DType, cType: kernels.F32, lda: ld})
			dhBeta = 1
		}
	}
	kClsFinish.launch(b, 0, dims{1, 1, 1024}, clsFinishArgs{int32(p.N), rowLoss, rowRight, ptrOf(loss), ptrOf(right)})
}

// clsChunkRows is how many of n rows each chunk of the classifier takes,
// at most most: as few chunks as that allows, of rows as even as multiples
// of 64 let them be (where a chunk is not all the rows), so that no chunk's
// products are left with a sliver of rows (GPT-2 small at batch 16: 4096
// rows four times rather than 5312 three times and 448).
func clsChunkRows(n, most int) int {
	m := max(1, min(n, most))
	if m == n || m <= 64 {
		return m
	}
	m &^= 63
	chunks := (n + m - 1) / m
	return min(m, ((n+chunks-1)/chunks+63)&^63)
}

// clsThreads is the threads of a block of the classifier's rows.
const clsThreads = 1024

// clsStash is the shared memory a block of cls_rows_stash keeps a row's
// 16-byte groups of logits (es bytes each) in, or 0 where cls_rows reads
// the logits twice instead: for the loss alone (one pass), or where two
// blocks a multiprocessor could not keep their rows (the stash pays for
// itself by the rows in flight it keeps in the L2 cache's stead).
// ClassifierLoss's chunks' rows are 16-byte aligned, their ld a multiple
// of 16 values.
func (b *Backend) clsStash(p kernels.ClassifierParams, es int) int {
	bytes := p.V / (16 / es) * 16
	if !p.Grad || 2*(bytes+2<<10) > b.sharedPerSM || bytes > b.sharedPerBlock {
		return 0
	}
	return bytes
}

// SumSquares: each tensor's squares summed by as many blocks as fill the
// device for the largest (multiDims), the same number for every tensor of
// the call, so that the order of the sums is fixed; the partial sums in
// double, by stretches and then the stretches in order (sumsq_finish).
func (b *Backend) SumSquares(grads []kernels.Buf, sumsq kernels.Buf) {
	kernels.CheckLen("sum of squares", 1, sumsq)
	kernels.CheckF32("sum of squares", append([]kernels.Buf{sumsq}, grads...)...)
	kernels.CheckLists("sum of squares", grads)
	if len(grads) == 0 {
		b.Fill(sumsq, 0)
		return
	}
	var most int64
	for _, g := range grads {
		most = max(most, int64(g.N))
	}
	b.enter()
	defer b.exit()
	d := b.multiDims((most+3)/4, 1) // four elements a load
	ws := b.workspace(int64(len(grads)) * int64(d.gx) * 4)
	defer b.alloc.Free(ws)
	partial := ws.Addr()
	for lo := 0; lo < len(grads); lo += mtMax {
		hi := min(lo+mtMax, len(grads))
		l, _ := listOf(grads[lo:hi])
		d.gy = uint32(hi - lo)
		kSumsqMulti.launch(b, 0, d, sumsqMultiArgs{l, int32(lo), partial})
	}
	n := len(grads) * int(d.gx)
	stretches := min(b.sms, (n+4*blockSize-1)/(4*blockSize)) // four partials a thread at least
	st := b.workspace(int64(stretches) * 8)
	defer b.alloc.Free(st)
	kSumsqFinish.launch(b, 0, dims{uint32(stretches), 1, blockSize}, sumsqFinishArgs{int32(n), partial, st.Addr(), b.reduceDone.addr, ptrOf(sumsq)})
}

// ClipGradNorm: the coefficient from the sum of squares (one thread), then
// every gradient scaled by it, read on the device.
func (b *Backend) ClipGradNorm(grads []kernels.Buf, maxNorm float32, sumsq, norm kernels.Buf) {
	kernels.CheckLen("clip grad norm", 1, sumsq, norm)
	kernels.CheckF32("clip grad norm", append([]kernels.Buf{sumsq, norm}, grads...)...)
	kernels.CheckLists("clip grad norm", grads)
	b.enter()
	defer b.exit()
	ws := b.workspace(4)
	defer b.alloc.Free(ws)
	coef := ws.Addr()
	kClipCoef.launch(b, 0, dims{1, 1, 1}, clipCoefArgs{ptrOf(sumsq), maxNorm, ptrOf(norm), coef})
	for lo := 0; lo < len(grads); lo += mtMax {
		hi := min(lo+mtMax, len(grads))
		l, most := listOf(grads[lo:hi])
		kScaleMulti.launch(b, 0, b.multiDims(most, hi-lo), scaleMultiArgs{l, coef})
	}
}

// UnscaleClip computes the update's gradient multiplier, the norm and the
// inf check in one thread (kernels.Backend.UnscaleClip).
func (b *Backend) UnscaleClip(maxNorm float32, sumsq, scale, norm, mult, found kernels.Buf) {
	kernels.CheckLen("unscale and clip", 1, sumsq, norm, mult)
	kernels.CheckScalar("unscale and clip", sumsq, scale, norm, mult, found)
	b.enter()
	defer b.exit()
	kUnscaleClip.launch(b, 0, dims{1, 1, 1}, unscaleClipArgs{ptrOf(sumsq), ptrOf(scale), maxNorm, ptrOf(norm), ptrOf(mult), ptrOf(found)})
}

// listOf is a tensorList of one list of up to mtMax buffers, and the
// largest one's length.
func listOf(bufs []kernels.Buf) (l tensorList, most int64) {
	for i, buf := range bufs {
		l.n[i], l.p[0][i] = int64(buf.N), ptrOf(buf)
		most = max(most, l.n[i])
	}
	l.count = int32(len(bufs))
	return l, most
}
