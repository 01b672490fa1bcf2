package cpu

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/leangrad/leangrad/kernels"
)

// Embedding copies the table's row of each id.
func (c *Backend) Embedding(y, table, ids kernels.Buf, n, vocab, dim int) {
	kernels.CheckEmbedding("embedding", y, table, ids, n, vocab, dim)
	if y.DType != table.DType {
		panic(fmt.Sprintf("cpu: embedding of a %v table into %v rows", table.DType, y.DType))
	}
	id := i32s(ids)
	checkIDs("embedding", id, vocab)
	yb, tb, es := raw(y), raw(table), table.DType.Size()
	parallel(n, max(1, elemGrain/dim), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			copy(yb[i*dim*es:(i+1)*dim*es], tb[int(id[i])*dim*es:(int(id[i])+1)*dim*es])
		}
	})
}

// EmbeddingBackward sums dy's rows into their ids' rows, in position
// order; the cores split the columns, so each column is one sequential sum.
// Accumulating, each id's sum is made apart (the positions sorted by id)
// and then added to its row.
func (c *Backend) EmbeddingBackward(dtable, dy, ids kernels.Buf, n, vocab, dim int, accumulate bool) {
	kernels.CheckEmbedding("embedding backward", dy, dtable, ids, n, vocab, dim)
	kernels.CheckF32("embedding backward table", dtable)
	id := i32s(ids)
	checkIDs("embedding backward", id, vocab)
	dt, dv := f32s(dtable), valuesOf(dy)
	const cols = 64
	if !accumulate {
		clear(dt)
		parallel((dim+cols-1)/cols, 1, func(lo, hi int) {
			var buf [cols]float32
			for j0 := lo * cols; j0 < min(dim, hi*cols); j0 += cols {
				w := min(cols, dim-j0)
				for i, v := range id {
					row := dv.span(i*dim+j0, w, buf[:])
					d := dt[int(v)*dim+j0:][:w]
					for j, x := range row {
						d[j] += x
					}
				}
			}
		})
		return
	}
	order := make([]int, n) // positions by id, then position
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(id[a], id[b]) })
	parallel((dim+cols-1)/cols, 1, func(lo, hi int) {
		var buf, sum [cols]float32
		for j0 := lo * cols; j0 < min(dim, hi*cols); j0 += cols {
			w := min(cols, dim-j0)
			for s := 0; s < n; {
				v := id[order[s]]
				clear(sum[:w])
				for ; s < n && id[order[s]] == v; s++ {
					for j, x := range dv.span(order[s]*dim+j0, w, buf[:]) {
						sum[j] += x
					}
				}
				d := dt[int(v)*dim+j0:][:w]
				for j := range d {
					d[j] += sum[j]
				}
			}
		}
	})
}

// Attention runs each batch and head on its own: each query's scores are
// one row of Tk values, computed, normalised and used at once.
func (c *Backend) Attention(p kernels.AttentionParams, q, k, v, o, lse kernels.Buf) {
	kernels.CheckAttention("attention", p, q, k, v, o, lse)
	attention(p, q, k, v, o, lse, nil)
}

// AttentionStoppable is Attention that stops part way once stop is closed
// (see kernels.Stoppable): each batch and head looks at stop before each
// query. It reports whether it ran whole; when it did not, o and lse are
// partly written.
func (c *Backend) AttentionStoppable(p kernels.AttentionParams, q, k, v, o, lse kernels.Buf, stop <-chan struct{}) bool {
	kernels.CheckAttention("attention", p, q, k, v, o, lse)
	st := c.mm.WithStop(stop)
	attention(p, q, k, v, o, lse, st.Stopped)
	return !st.Stopped()
}

// attention is Attention, stopping before a query once stopped (if not
// nil) says so. A head's keys and values are read once, into F32 rows of
// their own, which every query then reads in place.
func attention(p kernels.AttentionParams, q, k, v, o, lse kernels.Buf, stopped func() bool) {
	qv, kv, vv, ov, ls := valuesOf(q), valuesOf(k), valuesOf(v), valuesOf(o), f32s(lse)
	D := p.D
	row := func(j int) int { return j * D }
	parallel(p.B*p.H, 1, func(lo, hi int) {
		s := make([]float32, p.Tk)
		kh, vh := getScratch(p.Tk*D), getScratch(p.Tk*D)
		defer putScratch(kh)
		defer putScratch(vh)
		keys, vals := values{f32: kh}, values{f32: vh} // the head's, read once
		qb, kb, vb, ob := make([]float32, D), make([]float32, D), make([]float32, D), make([]float32, D)
		for bh := lo; bh < hi; bh++ {
			b, h := bh/p.H, bh%p.H
			for j := 0; j < p.Tk; j++ {
				kv.read(kh[j*D:(j+1)*D], b*p.KBatch+j*p.KRow+h*D)
				vv.read(vh[j*D:(j+1)*D], b*p.VBatch+j*p.VRow+h*D)
			}
			for i := 0; i < p.Tq; i++ {
				if stopped != nil && stopped() {
					return
				}
				qi := qv.span(b*p.QBatch+i*p.QRow+h*D, D, qb)
				last := p.Tk - p.Tq + i // the last key this query sees
				ls[bh*p.Tq+i] = attendRow(qi, last+1, p.Scale, keys, vals, ov, b*p.OBatch+i*p.ORow+h*D, row, row, s, kb, vb, ob)
			}
		}
	})
}

// attendRow is one query qi's attention over its first n keys, the key
// and the value of position j at key(j) and value(j) of kv and vv: it
// writes the output row at out of ov and returns the scores' log-sum-exp.
// s (n long), kb, vb and ob (a head's width) are scratch.
func attendRow(qi []float32, n int, scale float32, kv, vv, ov values, out int, key, value func(j int) int, s, kb, vb, ob []float32) float32 {
	D := len(qi)
	m := float32(math.Inf(-1))
	for j := range n {
		s[j] = dot(qi, kv.span(key(j), D, kb)) * scale
		m = max(m, s[j])
	}
	var sum float64
	for j := range n {
		s[j] = expf(s[j] - m)
		sum += float64(s[j])
	}
	inv := float32(1 / sum)
	clear(ob)
	for j := range n {
		axpy(ob, s[j]*inv, vv.span(value(j), D, vb))
	}
	t := ov.target(out, D, kb)
	copy(t, ob)
	ov.commit(out, t)
	return m + float32(math.Log(sum))
}

// dot is Σ a[i]·b[i] over a's length as dotLanes sums it: the AVX-512
// pass (dotVec) and Go give the same bits.
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	if s, ok := dotVec(a, b); ok {
		return s
	}
	return dotLanes(a, b)
}

// dotLanes is Σ a[i]·b[i] in sixteen lanes: lane l adds the products of
// the indices ≡ l mod 16 in order, each product rounded before it is
// added; then lane l adds lane l+8, l+4, l+2 and l+1 in turn (four
// halvings), as a vector pass sums its lanes.
func dotLanes(a, b []float32) float32 {
	b = b[:len(a)]
	var l [16]float32
	i := 0
	for ; i+16 <= len(a); i += 16 {
		x, y := a[i:i+16:i+16], b[i:i+16:i+16]
		for j := range l {
			l[j] += x[j] * y[j]
		}
	}
	for j := range len(a) - i {
		l[j] += a[i+j] * b[i+j]
	}
	for w := 8; w > 0; w /= 2 {
		for j := range w {
			l[j] += l[j+w]
		}
	}
	return l[0]
}

// axpy adds w·x into y, over y's length, each product rounded before it
// is added (the AVX-512 pass, axpyVec, gives the same bits).
func axpy(y []float32, w float32, x []float32) {
	x = x[:len(y)]
	if axpyVec(y, w, x) {
		return
	}
	for i := range y {
		y[i] += w * x[i]
	}
}

// AttentionBackward recomputes each query's probabilities from its
// log-sum-exp: dv += p·do, ds = p·(do·v − do·o), dq = Scale·Σ ds·k,
// dk += Scale·ds·q; each batch and head on its own, queries in order.
func (c *Backend) AttentionBackward(p kernels.AttentionParams, q, k, v, o, lse, do, dq, dk, dv kernels.Buf) {
	checkAttentionBackward(p, q, k, v, o, lse, do, dq, dk, dv)
	attentionBackward(p, q, k, v, o, lse, do, dq, dk, dv, nil)
}

// AttentionBackwardStoppable is AttentionBackward that stops part way once
// stop is closed (see kernels.Stoppable): each batch and head looks at
// stop before each query. It reports whether it ran whole; when it did
// not, the gradients are partly written.
func (c *Backend) AttentionBackwardStoppable(p kernels.AttentionParams, q, k, v, o, lse, do, dq, dk, dv kernels.Buf, stop <-chan struct{}) bool {
	checkAttentionBackward(p, q, k, v, o, lse, do, dq, dk, dv)
	st := c.mm.WithStop(stop)
	attentionBackward(p, q, k, v, o, lse, do, dq, dk, dv, st.Stopped)
	return !st.Stopped()
}

// checkAttentionBackward checks AttentionBackward's buffers.
func checkAttentionBackward(p kernels.AttentionParams, q, k, v, o, lse, do, dq, dk, dv kernels.Buf) {
	kernels.CheckAttention("attention backward", p, q, k, v, o, lse)
	kernels.CheckAttention("attention backward gradients", p, dq, dk, dv, do, lse)
	if p.Tq != p.Tk {
		panic(fmt.Sprintf("cpu: attention backward of %d queries over %d keys: want as many", p.Tq, p.Tk))
	}
}

// attentionBackward is AttentionBackward, stopping before a query once
// stopped (if not nil) says so.
func attentionBackward(p kernels.AttentionParams, q, k, v, o, lse, do, dq, dk, dv kernels.Buf, stopped func() bool) {
	qv, kv, vv, ov, dov := valuesOf(q), valuesOf(k), valuesOf(v), valuesOf(o), valuesOf(do)
	dqv, dkv, dvv, ls := valuesOf(dq), valuesOf(dk), valuesOf(dv), f32s(lse)
	T, D := p.Tq, p.D
	parallel(p.B*p.H, 1, func(lo, hi int) {
		kh, vh, dk32, dv32 := getScratch(T*D), getScratch(T*D), getScratch(T*D), getScratch(T*D) // each written whole, or cleared, a head
		for _, b := range [][]float32{kh, vh, dk32, dv32} {
			defer putScratch(b)
		}
		qb, dob, ob, dq32 := make([]float32, D), make([]float32, D), make([]float32, D), make([]float32, D)
		for bh := lo; bh < hi; bh++ {
			b, h := bh/p.H, bh%p.H
			for j := 0; j < T; j++ {
				kv.read(kh[j*D:(j+1)*D], b*p.KBatch+j*p.KRow+h*D)
				vv.read(vh[j*D:(j+1)*D], b*p.VBatch+j*p.VRow+h*D)
			}
			clear(dk32)
			clear(dv32)
			for i := 0; i < T; i++ {
				if stopped != nil && stopped() {
					return
				}
				qi := qv.span(b*p.QBatch+i*p.QRow+h*D, D, qb)
				doi := dov.span(b*p.OBatch+i*p.ORow+h*D, D, dob)
				oi := ov.span(b*p.OBatch+i*p.ORow+h*D, D, ob)
				di := dot(doi, oi)
				l := ls[bh*T+i]
				clear(dq32)
				for j := 0; j <= i; j++ {
					kj, vj := kh[j*D:(j+1)*D], vh[j*D:(j+1)*D]
					pij := expf(dot(qi, kj)*p.Scale - l) // the forward's score, to the bit
					ds := pij * (dot(doi, vj) - di) * p.Scale
					axpy(dv32[j*D:(j+1)*D], pij, doi)
					axpy(dk32[j*D:(j+1)*D], ds, qi)
					axpy(dq32, ds, kj)
				}
				at := b*p.QBatch + i*p.QRow + h*D
				t := dqv.target(at, D, qb)
				copy(t, dq32)
				dqv.commit(at, t)
			}
			for j := 0; j < T; j++ {
				at := b*p.KBatch + j*p.KRow + h*D
				dkv.write(at, dk32[j*D:(j+1)*D])
				at = b*p.VBatch + j*p.VRow + h*D
				dvv.write(at, dv32[j*D:(j+1)*D])
			}
		}
	})
}

// WritePaged copies each row's key and value bytes into their slot.
func (c *Backend) WritePaged(p kernels.PagedParams, k, v, kcache, vcache, slots kernels.Buf) {
	kernels.CheckPaged("write paged", p, k, kcache, vcache)
	kernels.CheckPaged("write paged", p, v, kcache, vcache)
	kernels.CheckLen("write paged slots", p.Rows, slots)
	sl := i32s(slots)
	C, es := p.H*p.D, k.DType.Size()
	kb, vb, kc, vc := raw(k), raw(v), raw(kcache), raw(vcache)
	for r, s := range sl {
		if s < 0 {
			continue
		}
		if int(s) >= p.Blocks*p.BlockSize {
			panic(fmt.Sprintf("cpu: write paged: row %d's slot %d is outside the %d of the cache", r, s, p.Blocks*p.BlockSize))
		}
		copy(kc[int(s)*C*es:(int(s)+1)*C*es], kb[r*p.QRow*es:(r*p.QRow+C)*es])
		copy(vc[int(s)*C*es:(int(s)+1)*C*es], vb[r*p.QRow*es:(r*p.QRow+C)*es])
	}
}

// PagedAttention attends each query row to its sequence's positions up
// to its own, gathered through the sequence's block table: the scores in
// float32, their softmax's sum in float64, as Attention's.
func (c *Backend) PagedAttention(p kernels.PagedParams, q, kcache, vcache, tables, rowSeq, rowPos, o kernels.Buf) {
	kernels.CheckPaged("paged attention", p, q, kcache, vcache)
	C := p.H * p.D
	kernels.CheckLen("paged attention output", p.Rows*C, o)
	kernels.CheckLen("paged attention tables", p.Seqs*p.MaxBlocks, tables)
	kernels.CheckLen("paged attention rows", p.Rows, rowSeq, rowPos)
	if o.DType != q.DType {
		panic(fmt.Sprintf("cpu: paged attention of %v queries into %v", q.DType, o.DType))
	}
	tb, seqs, pos := i32s(tables), i32s(rowSeq), i32s(rowPos)
	qv, kv, vv, ov := valuesOf(q), valuesOf(kcache), valuesOf(vcache), valuesOf(o)
	slot := func(r, j int) int { // the cache row of position j of row r's sequence
		b := tb[int(seqs[r])*p.MaxBlocks+j/p.BlockSize]
		if b < 0 || int(b) >= p.Blocks {
			panic(fmt.Sprintf("cpu: paged attention: row %d's position %d is in block %d, outside the %d of the cache", r, j, b, p.Blocks))
		}
		return int(b)*p.BlockSize + j%p.BlockSize
	}
	for r := range p.Rows {
		if s, n := int(seqs[r]), int(pos[r])+1; s < 0 || s >= p.Seqs || n < 1 || n > p.MaxLen {
			panic(fmt.Sprintf("cpu: paged attention: row %d of sequence %d at position %d: want a sequence below %d and a position below %d", r, s, n-1, p.Seqs, p.MaxLen))
		}
	}
	parallel(p.Rows*p.H, 1, func(lo, hi int) {
		s := make([]float32, p.MaxLen)
		qb, kb, vb, ob := make([]float32, p.D), make([]float32, p.D), make([]float32, p.D), make([]float32, p.D)
		for rh := lo; rh < hi; rh++ {
			r, h := rh/p.H, rh%p.H
			n := int(pos[r]) + 1
			qi := qv.span(r*p.QRow+h*p.D, p.D, qb)
			at := func(j int) int { return slot(r, j)*C + h*p.D }
			attendRow(qi, n, p.Scale, kv, vv, ov, r*C+h*p.D, at, at, s, kb, vb, ob)
		}
	})
}
