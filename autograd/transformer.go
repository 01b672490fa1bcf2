package autograd

import (
	"fmt"
	"math"
	"slices"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// The transformer operations: token embeddings, layer norm, causal
// self-attention and the fused classifier, each saving only what its
// backward needs.

// Embedding returns the rows of table (V×D) at the I32 ids, of shape
// ids.Shape()+[D] and table's dtype. Its backward sums the gradient's rows
// into the table's, in position order (the same bits every run), and saves
// only the ids. An F32 table tied to a classifier (ClassifierLoss) has its
// other gradient already gathered when this backward runs, and the sums are
// added to it in place (folder): no table of their own, no addition.
func Embedding(table, ids *T) *T {
	required("Embedding", table, ids)
	ts := table.Shape()
	if len(ts) != 2 || ids.DType() != tensor.I32 || ids.Numel() == 0 {
		panic(fmt.Sprintf("autograd: embedding of a %v table %v by %v ids %v: want V×D and non-empty i32 ids", table.DType(), ts, ids.DType(), ids.Shape()))
	}
	sameDevice("embedding", table, ids)
	vocab, dim, n := ts[0], ts[1], ids.Numel()
	dev := ModeOf(table, ids)
	y := tensor.Empty(dev, table.DType(), append(ids.Shape(), dim)...)
	be := table.Backend()
	be.Embedding(y.Buf(), table.Buf(), ids.Buf(), n, vocab, dim)
	if rec := begin("embedding", table, ids); rec != nil {
		idSaved := rec.save(ids)
		dt := table.DType()
		backward := func(g, acc *T, _ *finished) []*T {
			if acc != nil { // added to it
				be.EmbeddingBackward(acc.Buf(), g.Buf(), idSaved.Buf(), n, vocab, dim, true)
				return []*T{nil, nil}
			}
			d := tensor.Empty(g.Device(), tensor.F32, vocab, dim)
			be.EmbeddingBackward(d.Buf(), g.Buf(), idSaved.Buf(), n, vocab, dim, false)
			if dt != tensor.F32 {
				c := castRaw(d, dt)
				d.Release()
				d = c
			}
			return []*T{d, nil}
		}
		if dt == tensor.F32 { // a tied table: its other gradient (the classifier's) is summed in the backward's pass
			rec.finishFolding(y, table, 0, backward)
		} else {
			rec.finish(y, func(g *T) []*T { return backward(g, nil, nil) })
		}
	}
	return y
}

// LayerNorm normalises x over its last dimension: (x−μ)/√(σ²+eps)·gamma +
// beta, gamma and beta F32 of that size. It computes in float32 and keeps
// x's dtype; it saves x and each row's μ and 1/√(σ²+eps), nothing else.
func LayerNorm(x, gamma, beta *T, eps float32) *T { return LayerNormTo(x, gamma, beta, eps, x.DType()) }

// LayerNormTo is LayerNorm with its output in dt: x's dtype, or F16 or
// BF16 for an F32 x. That is what a matrix product under Autocast reads:
// the F32 result is rounded once, as the product's cast of it would be,
// and no F32 copy is written and read back. The gradient reaches x in x's
// dtype; for an F32 x (a residual stream) the backward adds it into the
// gradient the pass already gathered for x, when there is one (folder),
// and with a 16-bit dt also writes it rounded to dt for a product that
// reads it so, with its column sums for that product's bias where it sums
// them (Note [a gradient rounded where it is finished]).
func LayerNormTo(x, gamma, beta *T, eps float32, dt tensor.DType) *T {
	required("LayerNorm", x, gamma, beta)
	xs := x.Shape()
	cols := xs[len(xs)-1]
	if gamma.NDim() != 1 || gamma.Dim(0) != cols || !beta.SameShape(gamma) || gamma.DType() != tensor.F32 || beta.DType() != tensor.F32 {
		panic(fmt.Sprintf("autograd: layer norm of %v with %v gain %v and %v bias %v: want f32 gain and bias of %d",
			xs, gamma.DType(), gamma.Shape(), beta.DType(), beta.Shape(), cols))
	}
	if dt != x.DType() && (x.DType() != tensor.F32 || (dt != tensor.F16 && dt != tensor.BF16)) {
		panic(fmt.Sprintf("autograd: layer norm of %v %v into %v: want %v, or f16 or bf16 from f32", x.DType(), xs, dt, x.DType()))
	}
	sameDevice("layer norm", x, gamma)
	p := kernels.LayerNormParams{Rows: x.Numel() / cols, Cols: cols, Eps: eps}
	dev := ModeOf(x, gamma, beta)
	y := tensor.Empty(dev, dt, xs...)
	mean, rstd := tensor.Empty(dev, tensor.F32, p.Rows), tensor.Empty(dev, tensor.F32, p.Rows)
	be := x.Backend()
	be.LayerNorm(p, x.Buf(), gamma.Buf(), beta.Buf(), y.Buf(), mean.Buf(), rstd.Buf())
	rec := begin("layer_norm", x, gamma, beta)
	if rec == nil {
		mean.Release()
		rstd.Release()
		return y
	}
	xSaved, gSaved := rec.save(x), rec.save(gamma)
	rec.keep(mean)
	rec.keep(rstd)
	backward := func(g, acc *T, round *finished) []*T {
		dg, db := tensor.Empty(g.Device(), tensor.F32, cols), tensor.Empty(g.Device(), tensor.F32, cols)
		gc := asDType(g.Device(), g, dt)
		defer gc.Release()
		pb, dx := p, acc
		if acc == nil {
			dx = emptyLike(xSaved)
		} else {
			pb.Accumulate = true
		}
		if round != nil {
			pb.Rounded = round.rounded.Buf()
			if round.sums != nil {
				pb.Sums = round.sums.Buf()
			}
		}
		be.LayerNormBackward(pb, xSaved.Buf(), gSaved.Buf(), mean.Buf(), rstd.Buf(), gc.Buf(), dx.Buf(), dg.Buf(), db.Buf())
		if acc != nil {
			dx = nil // added to acc
		}
		return []*T{dx, dg, db}
	}
	if x.DType() == tensor.F32 { // a residual stream: its other gradient is summed in the backward's pass
		var rounds tensor.DType // and rounded where the output is 16-bit, for a product that reads it so
		if dt != x.DType() {
			rounds = dt
		}
		rec.finishFolding(y, x, rounds, backward)
	} else {
		rec.finish(y, func(g *T) []*T { return backward(g, nil, nil) })
	}
	return y
}

// CausalAttention is the multi-head causal self-attention of a packed qkv
// of shape [B, T, 3·C] (each position's queries, keys and values, C = heads
// × head size, as a GPT's c_attn makes them), scaled by 1/√(head size):
// the result is [B, T, C]. Under Autocast it runs in its dtype. Its
// backward recomputes the attention weights from each query's saved
// log-sum-exp: no T×T matrix is kept.
func CausalAttention(qkv *T, heads int) *T {
	if dev := ModeOf(qkv); AutocastEnabled(dev) {
		defer autocastIn(dev, AutocastDType(dev), &qkv)()
	}
	s := qkv.Shape()
	if len(s) != 3 || s[2]%3 != 0 || heads < 1 || (s[2]/3)%heads != 0 {
		panic(fmt.Sprintf("autograd: causal attention of %v with %d heads: want [B, T, 3·C] with C a multiple of the heads", s, heads))
	}
	B, Tn, C := s[0], s[1], s[2]/3
	D := C / heads
	p := kernels.AttentionParams{B: B, H: heads, D: D, Tq: Tn, Tk: Tn, Scale: float32(1 / math.Sqrt(float64(D))),
		QRow: 3 * C, KRow: 3 * C, VRow: 3 * C, ORow: C, QBatch: Tn * 3 * C, KBatch: Tn * 3 * C, VBatch: Tn * 3 * C, OBatch: Tn * C}
	dev := ModeOf(qkv)
	be := qkv.Backend()
	var y, lse *T
	if r := recall(dev, 2); r != nil { // a checkpoint's recomputation: the first run's (Note [what a checkpoint keeps])
		y, lse = r[0], r[1]
		if !slices.Equal(y.Shape(), []int{B, Tn, C}) || lse.Numel() != B*heads*Tn {
			panic(fmt.Sprintf("autograd: a checkpoint's recomputation of causal attention of %v found a kept output of %v: it must run the same ops", s, y.Shape()))
		}
	} else {
		y = tensor.Empty(dev, qkv.DType(), B, Tn, C)
		lse = tensor.Empty(dev, tensor.F32, B*heads*Tn)
		q, k, v := packed(qkv.Buf(), C)
		if sb, ok := be.(kernels.Stoppable); ok && dev.Stopping() != nil {
			if !sb.AttentionStoppable(p, q, k, v, y.Buf(), lse.Buf(), dev.Stopping()) {
				releaseAll(y, lse)
				panic(fmt.Errorf("autograd: causal attention of %v stopped part way: %w", s, tensor.ErrInterrupted))
			}
		} else {
			be.Attention(p, q, k, v, y.Buf(), lse.Buf())
		}
		keep(dev, y, lse)
	}
	rec := begin("causal_attention", qkv)
	if rec == nil {
		lse.Release()
		return y
	}
	qkvSaved, ySaved := rec.save(qkv), rec.save(y)
	rec.keep(lse)
	rec.finish(y, func(g *T) []*T {
		gc := asDType(g.Device(), g, qkvSaved.DType())
		defer gc.Release()
		d := emptyLike(qkvSaved)
		q, k, v := packed(qkvSaved.Buf(), C)
		dq, dk, dv := packed(d.Buf(), C)
		if sb, ok := be.(kernels.Stoppable); ok && dev.Stopping() != nil {
			if !sb.AttentionBackwardStoppable(p, q, k, v, ySaved.Buf(), lse.Buf(), gc.Buf(), dq, dk, dv, dev.Stopping()) {
				d.Release()
				panic(fmt.Errorf("autograd: the gradient of causal attention of %v stopped part way: %w", s, tensor.ErrInterrupted))
			}
		} else {
			be.AttentionBackward(p, q, k, v, ySaved.Buf(), lse.Buf(), gc.Buf(), dq, dk, dv)
		}
		return []*T{d}
	})
	return y
}

// packed is the q, k and v views of a packed [B, T, 3·C] buffer.
func packed(b kernels.Buf, c int) (q, k, v kernels.Buf) {
	return b, b.Slice(c, b.N-c), b.Slice(2*c, b.N-2*c)
}

// ClassifierLoss is a language model's head and loss in one: the mean over
// rows of −log softmax(h·wᵀ)[label] for h of N×C (any shape whose last
// dimension is C), w of V×C (PyTorch's layout; a tied embedding) and I32
// labels of N, and how many rows had their first maximum at their label
// (not recorded). The logits are consumed a chunk of rows at a time and
// never exist whole; with recording on, the forward pass computes the
// gradients of the loss with respect to h and w as it goes (the logits are
// there), keeps them, and the backward scales them by the incoming
// gradient, or hands them on as they are when that is Backward's implied
// one (the loss itself the root). Inside LossScaled the forward makes
// them for the loss times the scale (the logits' gradient scaled before
// it is rounded, as a GradScaler's scaled loss gives it), and a pass
// whose gradient for the loss is that scale (the loss times it the root)
// hands them on too. Under Autocast the products run in its dtype on copies of h
// and w, and the logits are rounded to it (as PyTorch's autocast head
// holds them); w's gradient is computed in F32, not rounded.
func ClassifierLoss(h, w, labels *T) (loss, right *T) {
	wc := w
	if dev := ModeOf(h, w, labels); AutocastEnabled(dev) {
		dt := AutocastDType(dev)
		defer autocastIn(dev, dt, &h)()
		wc = asDType(dev, w, dt)
		defer wc.Release()
	}
	hs, ws := h.Shape(), w.Shape()
	C := hs[len(hs)-1]
	N := h.Numel() / C
	if len(ws) != 2 || ws[1] != C || labels.Numel() != N || labels.DType() != tensor.I32 || h.DType() != wc.DType() {
		panic(fmt.Sprintf("autograd: classifier of %v input %v, %v weight %v, %v labels %v: want N×C, V×C and i32 N",
			h.DType(), hs, wc.DType(), ws, labels.DType(), labels.Shape()))
	}
	sameDevice("classifier", h, w)
	dev := ModeOf(h, w, labels)
	rec := begin("classifier_loss", h, w, labels)
	p := kernels.ClassifierParams{N: N, C: C, V: ws[0], Grad: rec != nil}
	scale := dev.Modes().LossScale // the gradients made for the loss times it
	if scale != nil && p.Grad {
		p.GradScale = scale.Buf()
	}
	loss, right = tensor.Empty(dev, tensor.F32, 1), tensor.Empty(dev, tensor.F32, 1)
	var dh, dw *T
	var dhb, dwb kernels.Buf
	if p.Grad {
		dh, dw = tensor.Empty(dev, tensor.F32, hs...), tensor.Empty(dev, tensor.F32, ws...)
		dhb, dwb = dh.Buf(), dw.Buf()
	}
	be := h.Backend()
	if sb, ok := be.(kernels.Stoppable); ok && dev.Stopping() != nil {
		if !sb.ClassifierLossStoppable(p, h.Buf(), wc.Buf(), labels.Buf(), loss.Buf(), right.Buf(), dhb, dwb, dev.Stopping()) {
			releaseAll(loss, right, dh, dw)
			panic(fmt.Errorf("autograd: the classifier loss of %v input %v stopped part way: %w", h.DType(), hs, tensor.ErrInterrupted))
		}
	} else {
		be.ClassifierLoss(p, h.Buf(), wc.Buf(), labels.Buf(), loss.Buf(), right.Buf(), dhb, dwb)
	}
	if rec == nil {
		return loss, right
	}
	rec.keep(dh)
	rec.keep(dw)
	hType := h.DType()
	var scaledBy *T // the loss gradient the forward made the gradients for: one, or the loss scale
	if p.GradScale.Valid() {
		scaledBy = rec.save(scale)
	}
	rec.finish(loss, func(g *T) []*T {
		grads := make([]*T, 3)
		// The gradients were made for a loss gradient of one (or the loss
		// scale): scaled by g (over the scale), or handed on as they are
		// when g is Backward's implied one (or, in a pass so seeded, the
		// scale itself).
		f := g
		switch {
		case scaledBy == nil && rec.isSeed(g), scaledBy != nil && g.Buf() == scaledBy.Buf() && g.Device().Modes().Seed != nil:
			f = nil
		case scaledBy != nil:
			f = binaryRaw(kernels.Div, g, scaledBy)
			defer f.Release()
		}
		scaled := func(d *T) *T {
			if f == nil {
				return rec.takeKept(d)
			}
			return binaryRaw(kernels.Mul, d, f)
		}
		done := false
		defer func() {
			if !done { // out of memory: the gradients made so far are no one's
				releaseAll(grads...)
			}
		}()
		if rec.needs(0) {
			s := scaled(dh)
			func() {
				defer s.Release() // taken from the node: its own, whether the cast is made or not
				grads[0] = asDType(s.Device(), s, hType)
			}()
		}
		if rec.needs(1) {
			grads[1] = scaled(dw)
		}
		done = true
		return grads
	})
	return loss, right
}

// CachedAttention is causal attention for decoding, recording nothing: the
// cache (Ctx×3·C, each row one position's packed queries, keys and values,
// as CausalAttention takes them) holds positions [0, pos+n), and the
// queries are its rows [pos, pos+n), each seeing the keys up to its own
// position. The result is n×C, in the cache's dtype.
func CachedAttention(cache *T, pos, n, heads int) *T {
	s := cache.Shape()
	if len(s) != 2 || s[1]%3 != 0 || (s[1]/3)%heads != 0 || pos < 0 || n < 1 || pos+n > s[0] {
		panic(fmt.Sprintf("autograd: cached attention of a %v cache at positions [%d, %d) with %d heads", s, pos, pos+n, heads))
	}
	C := s[1] / 3
	D := C / heads
	p := kernels.AttentionParams{B: 1, H: heads, D: D, Tq: n, Tk: pos + n, Scale: float32(1 / math.Sqrt(float64(D))),
		QRow: 3 * C, KRow: 3 * C, VRow: 3 * C, ORow: C, QBatch: s[0] * 3 * C, KBatch: s[0] * 3 * C, VBatch: s[0] * 3 * C, OBatch: n * C}
	dev := ModeOf(cache)
	y := tensor.Empty(dev, cache.DType(), n, C)
	lse := tensor.Empty(dev, tensor.F32, heads*n)
	defer lse.Release()
	b := cache.Buf()
	q := b.Slice(pos*3*C, b.N-pos*3*C)
	cache.Backend().Attention(p, q, b.Slice(C, b.N-C), b.Slice(2*C, b.N-2*C), y.Buf(), lse.Buf())
	return y
}
