package cuda

import (
	"fmt"
	"math/bits"

	"github.com/leangrad/leangrad/kernels"
)

// The transformer operations (kernels.TransformerOps): embeddings and
// attention. Attention runs the fused kernels (transformer_flash.cu,
// transformer_flash32.cu) or cuDNN's (sdpa.go) where they apply; otherwise
// it and the fused classifier (loss.go) put their products on cuBLAS a
// chunk of rows at a time, around small kernels (transformer.cu, loss.cu):
// what a chunk needs is workspace from the pool, freed when the call
// returns, so neither operation ever holds the whole Tq×Tk (or N×V) matrix.
// Every reduction runs in a fixed order, so results repeat bit for bit.

// defaultChunkBudget caps the workspace of one chunk of attention's scores
// (or, twice it, of the classifier's logits), in bytes (Backend.chunkBudget,
// which tests lower to run many chunks).
const defaultChunkBudget = 256 << 20

type embeddingArgs struct {
	N, Dim     int32
	IDs, Table uintptr
	Y          uintptr
}

type embeddingKeysArgs struct {
	N, P      int32
	IDs, Keys uintptr
}

type bitonicLocalArgs struct {
	Keys  uintptr
	P, K0 int32
}

type bitonicStepArgs struct {
	Keys    uintptr
	P, K, J int32
}

type embeddingBwdArgs struct {
	N, Dim           int32
	Keys, Dy, Dtable uintptr
	Acc              int32
}

type attnLayout struct { // a strided [B, T, H, D] operand
	B, H, Tn, D, Row int32
	Batch            int64
}

type attnMoveArgs struct {
	attnLayout
	Src, Dst uintptr
}

type attnSoftmaxArgs struct {
	BHRows, Rows, Kl, Q0, Tq, Tk int32
	S, P, Lse                    uintptr
}

type attnProbsArgs struct {
	BHRows, Rows, Kl, Q0, Tq, Tk int32
	S, Lse, P                    uintptr
}

type attnDScoresArgs struct {
	BHRows, Rows, Kl, Q0, Tq int32
	Scale                    float32
	Dp, Dvec, P              uintptr
}

type attnRowDotArgs struct {
	attnLayout
	Do, O, Dvec uintptr
}

type flashFwdArgs struct {
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

type flashBwdKVArgs struct {
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

type flashBwdQArgs struct {
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

var (
	kEmbedding      = declareTyped[embeddingArgs]("embedding")
	kEmbeddingKeys  = declareKernel[embeddingKeysArgs]("embedding_keys")
	kBitonicLocal   = declareKernel[bitonicLocalArgs]("bitonic_local")
	kBitonicStep    = declareKernel[bitonicStepArgs]("bitonic_step")
	kEmbeddingBwd   = declareTyped[embeddingBwdArgs]("embedding_bwd")
	kAttnGather     = declareTyped[attnMoveArgs]("attn_gather")
	kAttnScatter    = declareTyped[attnMoveArgs]("attn_scatter")
	kAttnScatterF32 = declareTyped[attnMoveArgs]("attn_scatter_f32")
	kAttnSoftmax    = declareTyped[attnSoftmaxArgs]("attn_softmax")
	kAttnProbs      = declareTyped[attnProbsArgs]("attn_probs")
	kAttnDScores    = declareTyped[attnDScoresArgs]("attn_dscores")
	kAttnRowDot     = declareTyped[attnRowDotArgs]("attn_rowdot")
)

// The flash kernels exist for the tensor cores' F16 and BF16, and for
// F32 too (three TF32 products each: transformer_flash32.cu).
var kFlashFwd = flashKernels[flashFwdArgs]("flash_fwd")

var kFlashBwdKV = flashKernels[flashBwdKVArgs]("flash_bwd_kv")

var kFlashBwdQ = flashKernels[flashBwdQArgs]("flash_bwd_q")

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
	ws := &scratch{b: b}
	defer ws.release()
	bh, es := p.B*p.H, int64(q.DType.Size())
	qh, kh := ws.take(int64(bh*p.Tq*p.D)*es), ws.take(int64(bh*p.Tk*p.D)*es)
	vh, oh := ws.take(int64(bh*p.Tk*p.D)*es), ws.take(int64(bh*p.Tq*p.D)*es)
	b.attnGather(s, p, p.Tq, p.QRow, p.QBatch, q, qh.Addr())
	b.attnGather(s, p, p.Tk, p.KRow, p.KBatch, k, kh.Addr())
	b.attnGather(s, p, p.Tk, p.VRow, p.VBatch, v, vh.Addr())
	m := attnChunk(b.chunkBudget, bh, p.Tq, p.Tk, int(es))
	sc, pr := ws.take(int64(bh*m*p.Tk)*4), ws.take(int64(bh*m*p.Tk)*es)
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
// the H200 at GPT-2 small's shape, blocks of two cost the backward 9% and
// took the forward from 0.148-0.149 to 0.142-0.143 ms
// (scripts/flash-bench.py).
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
// (transformer_flash32.cu); flash32BwdShared flash_bwd_q_f32's, with two raw tiles of
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
	w := &scratch{b: b}
	defer w.release()
	ws := w.addr
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

// The paged key-value memory's kernels (transformer.cu): write_paged over
// rows × H·D elements; paged_attention a block of pagedThreads threads a
// (head, row), the row's query and its scores in dynamic shared memory;
// paged_tiles a block a (head, pagedTileRows rows), which reads a
// sequence's keys and values once for all of its rows in the tile.
type writePagedArgs struct {
	Rows, C, QRow int32
	K, V, Slots   uintptr
	KC, VC        uintptr
}

type pagedAttentionArgs struct {
	H, D, BlockSize, MaxBlocks, MaxLen, QRow int32
	Scale                                    float32
	Q, KC, VC, Tables, RowSeq, RowPos, O     uintptr
}

type pagedTilesArgs struct {
	Rows, H, D, BlockSize, MaxBlocks, MaxLen, QRow int32
	Scale                                          float32
	Q, KC, VC, Tables, RowSeq, RowPos, O           uintptr
}

// pagedFlashArgs are paged_flash's (transformer_flash.cu): PagedAttention's
// prefill on the tensor cores, F16 and BF16 of head width flashD.
type pagedFlashArgs struct {
	Rows, H, Slots, BlockSize, MaxBlocks, QRow int32
	Scale                                      float32
	Q, KC, VC, Tables, RowSeq, RowPos, O       uintptr
}

var kPagedFlash = map[kernels.DType]kernel[pagedFlashArgs]{kernels.F16: declareKernel[pagedFlashArgs]("paged_flash_f16"),
	kernels.BF16: declareKernel[pagedFlashArgs]("paged_flash_bf16")}

var (
	kWritePaged     = declareTyped[writePagedArgs]("write_paged")
	kPagedAttention = declareTyped[pagedAttentionArgs]("paged_attention")
	kPagedTiles     = declareTyped[pagedTilesArgs]("paged_tiles")
	kPagedDecode    = declareTyped[pagedAttentionArgs]("paged_decode")
)

// paged_decode's shape (PAGED_EL): each thread reads pagedDecodeElems
// elements of a key or value row, a group of D/pagedDecodeElems threads a
// position; a block of pagedDecodeThreads threads a (head, row).
const (
	pagedDecodeElems   = 8
	pagedDecodeThreads = 128
)

// pagedDecodes says whether paged_decode takes a decoding step of p: its
// groups (D/pagedDecodeElems threads) are a power of two within a warp and
// the query, keys and values are aligned for its vector loads.
func pagedDecodes(p kernels.PagedParams, q, kcache, vcache kernels.Buf) bool {
	g := p.D / pagedDecodeElems
	if p.D%pagedDecodeElems != 0 || g > 32 || g&(g-1) != 0 || p.QRow%4 != 0 {
		return false
	}
	align := uintptr(4 * q.DType.Size())
	return ptrOf(q)%align == 0 && ptrOf(kcache)%align == 0 && ptrOf(vcache)%align == 0
}

// pagedFlashSlots is how many blocks share each of paged_flash's tiles of
// 64 rows, each taking every pagedFlashSlots-th of the tile's runs: the 64
// rows of four prompts of 16 after a shared prefix attend in parallel.
const pagedFlashSlots = 4

// pagedFlashes says whether paged_flash takes a prefill of p: F16 or BF16
// on the tensor cores, head width flashD, the queries and output in 32-bit
// pairs and the caches at offsets of the 16 bytes its tiles move at a time
// (their rows, H·flashD values, are multiples of it); and not
// Backend.noFlash.
func (b *Backend) pagedFlashes(p kernels.PagedParams, s kernels.DType, q, kcache, vcache, o kernels.Buf) bool {
	if b.noFlash || !b.tensorCores || (s != kernels.F16 && s != kernels.BF16) || p.D != flashD {
		return false
	}
	return p.QRow%2 == 0 && q.Off%4 == 0 && o.Off%4 == 0 && kcache.Off%16 == 0 && vcache.Off%16 == 0
}

// paged_tiles' tile: pagedTileRows query rows (PAGED_TQ) against
// pagedTileKeys positions at a time (PAGED_KT, a warp's width).
const (
	pagedTileRows = 16
	pagedTileKeys = 32
)

// pagedThreads is paged_attention's block: its warps take turns over a
// row's positions for the scores, its threads over the values' columns.
// A decoding step of a few sequences has only heads × sequences blocks,
// each a chain of dependent loads per warp, so the block is wide.
const pagedThreads = 256

// WritePaged scatters each row's key and value into its slot.
func (b *Backend) WritePaged(p kernels.PagedParams, k, v, kcache, vcache, slots kernels.Buf) {
	kernels.CheckPaged("write paged", p, k, kcache, vcache)
	kernels.CheckPaged("write paged", p, v, kcache, vcache)
	kernels.CheckLen("write paged slots", p.Rows, slots)
	s := floatType("write paged", k, v, kcache, vcache)
	b.enter()
	defer b.exit()
	C := p.H * p.D
	kWritePaged.launch(b, s, b.elems(int64(p.Rows*C)), writePagedArgs{int32(p.Rows), int32(C), int32(p.QRow),
		ptrOf(k), ptrOf(v), ptrOf(slots), ptrOf(kcache), ptrOf(vcache)})
}

// PagedAttention attends each (head, row) in a block of its own when every
// sequence has one row (a decoding step; paged_decode's vector loads where
// the head size and alignment allow), else each (head, tile of rows), so
// that a prefill's rows share their sequence's keys and values: on the
// tensor cores (paged_flash, 64 rows a tile) where pagedFlashes allows,
// else on the CUDA cores (paged_tiles, pagedTileRows).
func (b *Backend) PagedAttention(p kernels.PagedParams, q, kcache, vcache, tables, rowSeq, rowPos, o kernels.Buf) {
	kernels.CheckPaged("paged attention", p, q, kcache, vcache)
	kernels.CheckLen("paged attention output", p.Rows*p.H*p.D, o)
	kernels.CheckLen("paged attention tables", p.Seqs*p.MaxBlocks, tables)
	kernels.CheckLen("paged attention rows", p.Rows, rowSeq, rowPos)
	s := floatType("paged attention", q, kcache, vcache, o)
	shared := 4 * (p.D + p.MaxLen + max(pagedThreads, p.D))
	b.enter()
	defer b.exit()
	if p.Rows > p.Seqs && b.pagedFlashes(p, s, q, kcache, vcache, o) {
		kPagedFlash[s].launch(b, 0, dims{gx: uint32(p.H * pagedFlashSlots), gy: uint32((p.Rows + 63) / 64), block: 128},
			pagedFlashArgs{int32(p.Rows), int32(p.H), pagedFlashSlots, int32(p.BlockSize), int32(p.MaxBlocks), int32(p.QRow), p.Scale,
				ptrOf(q), ptrOf(kcache), ptrOf(vcache), ptrOf(tables), ptrOf(rowSeq), ptrOf(rowPos), ptrOf(o)})
		return
	}
	if p.Rows > p.Seqs {
		tiles := 4 * (2*pagedTileRows*p.D + 2*pagedTileKeys*(p.D+1) + pagedTileRows*pagedTileKeys + 3*pagedTileRows)
		kPagedTiles.launchShared(b, s, dims{gx: uint32(p.H), gy: uint32((p.Rows + pagedTileRows - 1) / pagedTileRows), block: pagedThreads},
			max(shared, tiles), pagedTilesArgs{int32(p.Rows), int32(p.H), int32(p.D), int32(p.BlockSize), int32(p.MaxBlocks), int32(p.MaxLen),
				int32(p.QRow), p.Scale, ptrOf(q), ptrOf(kcache), ptrOf(vcache), ptrOf(tables), ptrOf(rowSeq), ptrOf(rowPos), ptrOf(o)})
		return
	}
	args := pagedAttentionArgs{int32(p.H), int32(p.D), int32(p.BlockSize), int32(p.MaxBlocks), int32(p.MaxLen), int32(p.QRow), p.Scale,
		ptrOf(q), ptrOf(kcache), ptrOf(vcache), ptrOf(tables), ptrOf(rowSeq), ptrOf(rowPos), ptrOf(o)}
	if pagedDecodes(p, q, kcache, vcache) {
		kPagedDecode.launchShared(b, s, dims{gx: uint32(p.H), gy: uint32(p.Rows), block: pagedDecodeThreads},
			4*(p.MaxLen+pagedDecodeThreads*pagedDecodeElems), args)
		return
	}
	kPagedAttention.launchShared(b, s, dims{gx: uint32(p.H), gy: uint32(p.Rows), block: pagedThreads}, shared, args)
}
