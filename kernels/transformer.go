package kernels

import "fmt"

// The operations of transformers: token embeddings, layer norm, causal
// scaled dot-product attention, the fused classifier (the output
// projection and its cross-entropy, chunk by chunk) and the clipping of
// gradients by their global norm.

// TransformerOps are the transformer operations every Backend runs.
type TransformerOps interface {
	// Embedding gathers rows of table (vocab×dim) for the I32 ids (n) into
	// y (n×dim, table's dtype): y[i] = table[ids[i]]. An id outside [0,
	// vocab) panics on the CPU and leaves its row unspecified on a GPU.
	Embedding(y, table, ids Buf, n, vocab, dim int)
	// EmbeddingBackward writes into dtable (vocab×dim, F32) the sum of the
	// rows of dy (n×dim) at each id, in the order of the positions (the
	// same bits every run), and zero in the rows of ids that do not occur;
	// with accumulate it adds each id's sum to what its row holds (one
	// addition an element, as adding the tables would) and leaves the other
	// rows be: a tied embedding's gradient added to the classifier's.
	EmbeddingBackward(dtable, dy, ids Buf, n, vocab, dim int, accumulate bool)

	// LayerNorm normalises each row of x: y = (x−μ)·rstd·γ + β (γ, β F32
	// of Cols), and writes each row's μ and rstd = 1/√(σ²+ε) (F32 of Rows)
	// for the backward. y is in x's dtype, or F16 or BF16 for an F32 x:
	// the F32 result rounded once, as a cast of it would be.
	LayerNorm(p LayerNormParams, x, gamma, beta, y, mean, rstd Buf)
	// LayerNormBackward computes dx (x's dtype) and writes dgamma and dbeta
	// (F32 of Cols, summed over the rows in a fixed order) from dy (the
	// forward's y's dtype) and what the forward saved. With p.Accumulate,
	// dx (F32) holds a gradient and x's is added to it: prev + dx, as a
	// separate F32 addition would round it, in one pass.
	LayerNormBackward(p LayerNormParams, x, gamma, mean, rstd, dy, dx, dgamma, dbeta Buf)

	// Attention computes causal scaled dot-product attention, softmax(q·kᵀ
	// ·Scale + mask)·v, into o, and each query's log-sum-exp of its scaled
	// scores into lse (F32, B×H×Tq) for the backward, which recomputes the
	// scores from it: the Tq×Tk matrix is never kept. q, k, v and o share a
	// float dtype.
	Attention(p AttentionParams, q, k, v, o, lse Buf)
	// AttentionBackward writes dq, dk and dv (the strides of q, k, v) from
	// do and what the forward computed; p.Tq must equal p.Tk.
	AttentionBackward(p AttentionParams, q, k, v, o, lse, do, dq, dk, dv Buf)

	// ClassifierLoss computes the logits h·wᵀ (h: N×C, w: V×C, one dtype;
	// the logits rounded to it, as a product into that dtype stores them and
	// as PyTorch's autocast classifier holds them) a chunk of rows at a
	// time, never all at once, and from each chunk the
	// mean over all rows of −log softmax[label] into loss (F32, 1), the
	// rows whose first maximum is at their I32 label into right (F32, 1)
	// and, with p.Grad, the gradients of the mean loss: dh (F32, N×C) and
	// dw (F32, V×C).
	ClassifierLoss(p ClassifierParams, h, w, labels, loss, right, dh, dw Buf)

	// SumSquares writes the sum of the squares of all of grads together
	// (F32) into sumsq (F32, 1), summed in a fixed order (0 for no grads).
	SumSquares(grads []Buf, sumsq Buf)
	// ClipGradNorm writes the L2 norm √sumsq into norm (F32, 1) and
	// multiplies every grad (F32) in place by min(1, maxNorm/(norm+1e-6)),
	// as torch.nn.utils.clip_grad_norm_ once SumSquares has summed the
	// squares (of one rank's gradients, or of a sharded job's ranks' shards
	// after an all-reduce): on the device, without the host.
	ClipGradNorm(grads []Buf, maxNorm float32, sumsq, norm Buf)
}

// LayerNormParams describes layer normalisation of a Rows×Cols array over
// its rows. Accumulate (backward, F32 x only) adds dx to what dx holds
// instead of overwriting it: a residual stream's two gradients summed by
// the norm's backward, without a pass of their own. Rounded (backward, an
// F32 x with a 16-bit dy; or invalid) is a buffer of dx's length in dy's
// dtype into which the backward also writes dx, as it leaves it, rounded
// as Cast would: the copy of the gradient a 16-bit product reads, with no
// pass of its own. Sums (backward, an F32 dx; or invalid), F32 of Cols,
// receives the column sums of dx as the backward leaves it: the bias
// gradient of the product whose result dx is the gradient of, with no
// pass of its own.
type LayerNormParams struct {
	Rows, Cols int
	Eps        float32
	Accumulate bool
	Rounded    Buf
	Sums       Buf
}

// AttentionParams describes causal attention of B batches of Tq queries
// over Tk keys and values, H heads of D values each. Query i of a batch
// sits at position Tk−Tq+i and sees the keys at positions up to its own
// (decoding a new token: Tq = 1 over a cache of Tk). The buffers are
// strided: a position (row) of q is QRow elements after the previous one,
// a batch QBatch after the previous one, and head h's values lie at
// [h·D, h·D+D) of a row; likewise for k, v and o. A packed [B, T, 3, H, D]
// qkv gives q, k and v as views of one buffer, C = H·D and 2C elements
// apart, all with row stride 3C.
type AttentionParams struct {
	B, H, D, Tq, Tk                int
	Scale                          float32
	QRow, KRow, VRow, ORow         int
	QBatch, KBatch, VBatch, OBatch int
}

// ClassifierParams describes the fused classifier: N rows of width C
// against a vocabulary of V, with the gradients when Grad is set. With
// GradScale (F32, one value; or invalid) the gradients are those of the
// loss multiplied by GradScale[0], read on the device (a GradScaler's
// scale): the logits' gradient is scaled (and divided by N) before a
// backend rounds it to the logits' dtype, as an autocast loss's scaled
// gradient reaches a 16-bit head.
type ClassifierParams struct {
	N, C, V   int
	Grad      bool
	GradScale Buf
}

// Slice is the view of n elements of b from element off on.
func (b Buf) Slice(off, n int) Buf {
	if off < 0 || n < 0 || off+n > b.N {
		panic(fmt.Sprintf("kernels: Slice(%d, %d) of a buffer of %d elements", off, n, b.N))
	}
	return Buf{Block: b.Block, Off: b.Off + int64(off)*int64(b.DType.Size()), N: n, DType: b.DType}
}

// CheckEmbedding checks an embedding's table (vocab×dim), I32 ids (n) and
// output or gradient (n×dim).
func CheckEmbedding(op string, rows, table, ids Buf, n, vocab, dim int) {
	if n <= 0 || vocab <= 0 || dim <= 0 {
		panic(fmt.Sprintf("kernels: %s of %d ids into a table of %d×%d", op, n, vocab, dim))
	}
	CheckLen(op+" table", vocab*dim, table)
	CheckLen(op+" ids", n, ids)
	CheckLen(op+" rows", n*dim, rows)
	if ids.DType != I32 {
		panic(fmt.Sprintf("kernels: %s ids are %v, want i32", op, ids.DType))
	}
}

// CheckLayerNorm checks a layer norm's operands against p: x and out (y,
// or dy and dx) of Rows×Cols, each out in x's dtype or, for an F32 x, F16
// or BF16; γ and β (and their gradients) F32 of Cols, the statistics F32
// of Rows.
func CheckLayerNorm(op string, p LayerNormParams, x, gamma, mean, rstd Buf, rows ...Buf) {
	for _, y := range rows {
		if y.DType != x.DType && (x.DType != F32 || (y.DType != F16 && y.DType != BF16)) {
			panic(fmt.Sprintf("kernels: %s of %v rows into %v: want %v, or f16 or bf16 from f32", op, x.DType, y.DType, x.DType))
		}
	}
	if p.Rows <= 0 || p.Cols <= 0 || !(p.Eps > 0) {
		panic(fmt.Sprintf("kernels: %s: invalid parameters %+v", op, p))
	}
	if p.Accumulate && x.DType != F32 {
		panic(fmt.Sprintf("kernels: %s accumulating into a %v gradient: want f32", op, x.DType))
	}
	CheckLen(op+" input", p.Rows*p.Cols, append([]Buf{x}, rows...)...)
	CheckLen(op+" gain", p.Cols, gamma)
	CheckLen(op+" statistics", p.Rows, mean, rstd)
	CheckF32(op, gamma, mean, rstd)
}

// CheckLayerNormRounded panics unless p.Rounded is invalid or fits a
// backward of F32 dx from the 16-bit dy, and p.Sums is invalid or F32 of
// p.Cols for an F32 dx (LayerNormParams).
func CheckLayerNormRounded(op string, p LayerNormParams, dy, dx Buf) {
	if s := p.Sums; s.Valid() {
		if dx.DType != F32 {
			panic(fmt.Sprintf("kernels: %s: column sums of a %v dx: want f32", op, dx.DType))
		}
		CheckF32(op+" column sums", s)
		CheckLen(op+" column sums", p.Cols, s)
	}
	r := p.Rounded
	if !r.Valid() {
		return
	}
	if dx.DType != F32 || dy.DType == F32 || r.DType != dy.DType {
		panic(fmt.Sprintf("kernels: %s: %v dx rounded into %v from a %v dy: want f32 dx rounded into dy's 16-bit dtype", op, dx.DType, r.DType, dy.DType))
	}
	CheckLen(op+" rounded dx", dx.N, r)
}

// CheckAttention checks p and that every buffer holds the extent its
// strides reach: lse F32 of B·H·Tq, the others of one float dtype.
func CheckAttention(op string, p AttentionParams, q, k, v, o, lse Buf) {
	if p.B <= 0 || p.H <= 0 || p.D <= 0 || p.Tq <= 0 || p.Tk < p.Tq || !(p.Scale > 0) {
		panic(fmt.Sprintf("kernels: %s: invalid parameters %+v", op, p))
	}
	extent := func(name string, b Buf, row, batch, rows int) {
		if row < p.H*p.D || (p.B > 1 && batch < (rows-1)*row+p.H*p.D) {
			panic(fmt.Sprintf("kernels: %s: %s strides (row %d, batch %d) overlap rows of %d heads of %d", op, name, row, batch, p.H, p.D))
		}
		if need := (p.B-1)*batch + (rows-1)*row + p.H*p.D; b.N < need {
			panic(fmt.Sprintf("kernels: %s: %s holds %d elements, its strides reach %d (%+v)", op, name, b.N, need, p))
		}
		if b.DType != q.DType || !q.DType.Float() {
			panic(fmt.Sprintf("kernels: %s: %s is %v beside %v q", op, name, b.DType, q.DType))
		}
	}
	extent("q", q, p.QRow, p.QBatch, p.Tq)
	extent("k", k, p.KRow, p.KBatch, p.Tk)
	extent("v", v, p.VRow, p.VBatch, p.Tk)
	extent("o", o, p.ORow, p.OBatch, p.Tq)
	CheckLen(op+" log-sum-exp", p.B*p.H*p.Tq, lse)
	CheckF32(op+" log-sum-exp", lse)
}

// CheckClassifier checks the fused classifier's operands against p.
func CheckClassifier(p ClassifierParams, h, w, labels, loss, right, dh, dw Buf) {
	if p.N <= 0 || p.C <= 0 || p.V <= 0 {
		panic(fmt.Sprintf("kernels: classifier loss: invalid parameters %+v", p))
	}
	CheckLen("classifier input", p.N*p.C, h)
	CheckLen("classifier weight", p.V*p.C, w)
	CheckLen("classifier labels", p.N, labels)
	CheckLen("classifier loss", 1, loss, right)
	CheckF32("classifier loss", loss, right)
	if labels.DType != I32 || h.DType != w.DType || !h.DType.Float() {
		panic(fmt.Sprintf("kernels: classifier loss of %v input, %v weight, %v labels", h.DType, w.DType, labels.DType))
	}
	if p.Grad {
		CheckLen("classifier input gradient", p.N*p.C, dh)
		CheckLen("classifier weight gradient", p.V*p.C, dw)
		CheckF32("classifier gradients", dh, dw)
	}
	if p.GradScale.Valid() {
		CheckLen("classifier gradient scale", 1, p.GradScale)
		CheckF32("classifier gradient scale", p.GradScale)
	}
}

// Float reports whether d is a float type (F32, F16, BF16).
func (d DType) Float() bool { return d == F32 || d.Half() }
