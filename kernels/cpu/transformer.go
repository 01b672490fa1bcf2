package cpu

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu/internal/half"
	"github.com/leangrad/leangrad/kernels/cpu/sgemm"
)

// The transformer operations (kernels.TransformerOps). Every reduction runs
// in a fixed order that does not depend on the number of cores, so the
// results are the same bits on any machine: sums over rows are taken in
// blocks of a fixed number of rows, in float64, and added in block order.

// rowBlock is how many rows a partial sum over rows covers.
const rowBlock = 64

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

func checkIDs(op string, ids []int32, vocab int) {
	for i, v := range ids {
		if v < 0 || int(v) >= vocab {
			panic(fmt.Sprintf("cpu: %s: id %d at position %d is outside a vocabulary of %d", op, v, i, vocab))
		}
	}
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

// LayerNorm normalises each row, with its statistics in float64.
func (c *Backend) LayerNorm(p kernels.LayerNormParams, x, gamma, beta, y, mean, rstd kernels.Buf) {
	kernels.CheckLayerNorm("layer norm", p, x, gamma, mean, rstd, y)
	kernels.CheckLen("layer norm bias", p.Cols, beta)
	kernels.CheckF32("layer norm bias", beta)
	xv, yv, g, b := valuesOf(x), valuesOf(y), f32s(gamma), f32s(beta)
	mu, rs := f32s(mean), f32s(rstd)
	parallel(p.Rows, max(1, elemGrain/p.Cols), func(lo, hi int) {
		xb, yb := getScratch(p.Cols), getScratch(p.Cols)
		defer putScratch(xb)
		defer putScratch(yb)
		for r := lo; r < hi; r++ {
			xs := xv.span(r*p.Cols, p.Cols, xb)
			var s float64
			for _, v := range xs {
				s += float64(v)
			}
			m := s / float64(p.Cols)
			var ss float64
			for _, v := range xs {
				d := float64(v) - m
				ss += d * d
			}
			inv := 1 / math.Sqrt(ss/float64(p.Cols)+float64(p.Eps))
			mu[r], rs[r] = float32(m), float32(inv)
			mf, is := float32(m), float32(inv)
			ys := yv.target(r*p.Cols, p.Cols, yb)
			for j, v := range xs {
				ys[j] = (v-mf)*is*g[j] + b[j]
			}
			yv.commit(r*p.Cols, ys)
		}
	})
}

// LayerNormBackward: dx = rstd·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂)) with ĝ = dy·γ
// (added to dx's values with p.Accumulate), per row; dγ = Σ dy·x̂ and dβ =
// Σ dy over the rows (and p.Sums = Σ dx), in blocks of rowBlock rows
// added in order.
func (c *Backend) LayerNormBackward(p kernels.LayerNormParams, x, gamma, mean, rstd, dy, dx, dgamma, dbeta kernels.Buf) {
	kernels.CheckLayerNorm("layer norm backward", p, x, gamma, mean, rstd, dy, dx)
	kernels.CheckLike("layer norm backward dx", x, dx)
	kernels.CheckLen("layer norm backward gradients", p.Cols, dgamma, dbeta)
	kernels.CheckF32("layer norm backward gradients", dgamma, dbeta)
	kernels.CheckLayerNormRounded("layer norm backward", p, dy, dx)
	xv, dyv, dxv, g := valuesOf(x), valuesOf(dy), valuesOf(dx), f32s(gamma)
	rv := optValuesOf(p.Rounded)
	mu, rs := f32s(mean), f32s(rstd)
	blocks := (p.Rows + rowBlock - 1) / rowBlock
	sets := 2
	if p.Sums.Valid() {
		sets = 3
	}
	partial := make([]float64, blocks*sets*p.Cols) // per block: dγ, dβ, then Σ dx
	parallel(blocks, 1, func(lo, hi int) {
		xb, gb, db := getScratch(p.Cols), getScratch(p.Cols), getScratch(p.Cols)
		defer putScratch(xb)
		defer putScratch(gb)
		defer putScratch(db)
		for blk := lo; blk < hi; blk++ {
			pg, pb := partial[blk*sets*p.Cols:][:p.Cols], partial[(blk*sets+1)*p.Cols:][:p.Cols]
			var pd []float64
			if sets == 3 {
				pd = partial[(blk*sets+2)*p.Cols:][:p.Cols]
			}
			for r := blk * rowBlock; r < min(p.Rows, (blk+1)*rowBlock); r++ {
				xs, gs := xv.span(r*p.Cols, p.Cols, xb), dyv.span(r*p.Cols, p.Cols, gb)
				m, is := mu[r], rs[r]
				var sg, sgx float64
				for j, v := range xs {
					xh := (v - m) * is
					gh := gs[j] * g[j]
					sg += float64(gh)
					sgx += float64(gh) * float64(xh)
					pg[j] += float64(gs[j]) * float64(xh)
					pb[j] += float64(gs[j])
				}
				mg, mgx := float32(sg/float64(p.Cols)), float32(sgx/float64(p.Cols))
				ds := dxv.target(r*p.Cols, p.Cols, db)
				for j, v := range xs {
					xh := (v - m) * is
					d := is * (gs[j]*g[j] - mg - xh*mgx)
					if p.Accumulate { // F32 (CheckLayerNorm): ds is dx itself
						d = ds[j] + float32(d) // the conversion rounds d first: no fused multiply-add
					}
					ds[j] = d
				}
				for j, d := range pd { // dx is F32 (CheckLayerNormRounded)
					pd[j] = d + float64(ds[j])
				}
				dxv.commit(r*p.Cols, ds)
				rv.commit(r*p.Cols, ds) // 16-bit: ds rounded
			}
		}
	})
	dg, dbt := f32s(dgamma), f32s(dbeta)
	var sums []float32
	if sets == 3 {
		sums = f32s(p.Sums)
	}
	for j := 0; j < p.Cols; j++ {
		var sg, sb, sd float64
		for blk := 0; blk < blocks; blk++ {
			sg += partial[blk*sets*p.Cols+j]
			sb += partial[(blk*sets+1)*p.Cols+j]
			if sums != nil {
				sd += partial[(blk*sets+2)*p.Cols+j]
			}
		}
		dg[j], dbt[j] = float32(sg), float32(sb)
		if sums != nil {
			sums[j] = float32(sd)
		}
	}
}

// Attention runs each batch and head on its own: each query's scores are
// one row of Tk values, computed, normalised and used at once.
func (c *Backend) Attention(p kernels.AttentionParams, q, k, v, o, lse kernels.Buf) {
	kernels.CheckAttention("attention", p, q, k, v, o, lse)
	qv, kv, vv, ov, ls := valuesOf(q), valuesOf(k), valuesOf(v), valuesOf(o), f32s(lse)
	parallel(p.B*p.H, 1, func(lo, hi int) {
		s := make([]float32, p.Tk)
		qb, kb, vb, ob := make([]float32, p.D), make([]float32, p.D), make([]float32, p.D), make([]float32, p.D)
		for bh := lo; bh < hi; bh++ {
			b, h := bh/p.H, bh%p.H
			for i := 0; i < p.Tq; i++ {
				qi := qv.span(b*p.QBatch+i*p.QRow+h*p.D, p.D, qb)
				last := p.Tk - p.Tq + i // the last key this query sees
				m := float32(math.Inf(-1))
				for j := 0; j <= last; j++ {
					kj := kv.span(b*p.KBatch+j*p.KRow+h*p.D, p.D, kb)
					var dot float32
					for d, x := range qi {
						dot += x * kj[d]
					}
					s[j] = dot * p.Scale
					m = max(m, s[j])
				}
				var sum float64
				for j := 0; j <= last; j++ {
					s[j] = expf(s[j] - m)
					sum += float64(s[j])
				}
				ls[bh*p.Tq+i] = m + float32(math.Log(sum))
				inv := float32(1 / sum)
				clear(ob)
				for j := 0; j <= last; j++ {
					vj := vv.span(b*p.VBatch+j*p.VRow+h*p.D, p.D, vb)
					w := s[j] * inv
					for d, x := range vj {
						ob[d] += w * x
					}
				}
				at := b*p.OBatch + i*p.ORow + h*p.D
				t := ov.target(at, p.D, kb)
				copy(t, ob)
				ov.commit(at, t)
			}
		}
	})
}

// AttentionBackward recomputes each query's probabilities from its
// log-sum-exp: dv += p·do, ds = p·(do·v − do·o), dq = Scale·Σ ds·k,
// dk += Scale·ds·q; each batch and head on its own, queries in order.
func (c *Backend) AttentionBackward(p kernels.AttentionParams, q, k, v, o, lse, do, dq, dk, dv kernels.Buf) {
	kernels.CheckAttention("attention backward", p, q, k, v, o, lse)
	kernels.CheckAttention("attention backward gradients", p, dq, dk, dv, do, lse)
	if p.Tq != p.Tk {
		panic(fmt.Sprintf("cpu: attention backward of %d queries over %d keys: want as many", p.Tq, p.Tk))
	}
	qv, kv, vv, ov, dov := valuesOf(q), valuesOf(k), valuesOf(v), valuesOf(o), valuesOf(do)
	dqv, dkv, dvv, ls := valuesOf(dq), valuesOf(dk), valuesOf(dv), f32s(lse)
	T, D := p.Tq, p.D
	parallel(p.B*p.H, 1, func(lo, hi int) {
		kh, vh, dk32, dv32 := make([]float32, T*D), make([]float32, T*D), make([]float32, T*D), make([]float32, T*D)
		qb, dob, ob, dq32, ps := make([]float32, D), make([]float32, D), make([]float32, D), make([]float32, D), make([]float32, T)
		for bh := lo; bh < hi; bh++ {
			b, h := bh/p.H, bh%p.H
			for j := 0; j < T; j++ {
				kv.read(kh[j*D:(j+1)*D], b*p.KBatch+j*p.KRow+h*D)
				vv.read(vh[j*D:(j+1)*D], b*p.VBatch+j*p.VRow+h*D)
			}
			clear(dk32)
			clear(dv32)
			for i := 0; i < T; i++ {
				qi := qv.span(b*p.QBatch+i*p.QRow+h*D, D, qb)
				doi := dov.span(b*p.OBatch+i*p.ORow+h*D, D, dob)
				oi := ov.span(b*p.OBatch+i*p.ORow+h*D, D, ob)
				var di float32
				for d, x := range doi {
					di += x * oi[d]
				}
				l := ls[bh*T+i]
				clear(dq32)
				for j := 0; j <= i; j++ {
					kj, vj := kh[j*D:(j+1)*D], vh[j*D:(j+1)*D]
					var dot, dp float32
					for d, x := range qi {
						dot += x * kj[d]
						dp += doi[d] * vj[d]
					}
					pij := expf(dot*p.Scale - l)
					ps[j] = pij
					ds := pij * (dp - di) * p.Scale
					dvj, dkj := dv32[j*D:(j+1)*D], dk32[j*D:(j+1)*D]
					for d := range D {
						dvj[d] += pij * doi[d]
						dkj[d] += ds * qi[d]
						dq32[d] += ds * kj[d]
					}
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

// classifierChunk is how many rows of logits the CPU's fused classifier
// holds at a time.
const classifierChunk = 256

// ClassifierLoss computes a chunk of logits at a time with sgemm: the rows'
// losses and right predictions, and with p.Grad their softmax − one-hot,
// whose products with w and h are the chunk's share of dh and dw.
func (c *Backend) ClassifierLoss(p kernels.ClassifierParams, h, w, labels, loss, right, dh, dw kernels.Buf) {
	kernels.CheckClassifier(p, h, w, labels, loss, right, dh, dw)
	lab := i32s(labels)
	checkIDs("classifier loss", lab, p.V)
	m := min(classifierChunk, p.N)
	logits := getScratch(m * p.V)
	defer putScratch(logits)
	var total float64
	count := 0
	inv := 1 / float32(p.N)
	if p.GradScale.Valid() && p.Grad { // the logits' gradient stays F32 here: the scale joins 1/N
		inv *= f32s(p.GradScale)[0]
	}
	for r0 := 0; r0 < p.N; r0 += m {
		rows := min(m, p.N-r0)
		// logits = h[r0:r0+rows]·wᵀ
		c.mm.GemmOp(rows, p.V, p.C, 1, operand(h, r0*p.C, p.C, false, true), operand(w, 0, p.C, true, false), 0, logits, p.V)
		losses := make([]float64, rows)
		hits := make([]bool, rows)
		parallel(rows, max(1, elemGrain/p.V), func(lo, hi int) {
			var tmp []uint16
			if h.DType == kernels.F16 {
				tmp = make([]uint16, p.V)
			}
			for r := lo; r < hi; r++ {
				z := logits[r*p.V : (r+1)*p.V]
				roundLike(h.DType, z, tmp)
				mx, arg := float32(math.Inf(-1)), 0
				for j, v := range z {
					if v > mx {
						mx, arg = v, j
					}
				}
				y := int(lab[r0+r])
				zy := z[y]
				sum := expShift(z, mx)
				lse := float64(mx) + math.Log(sum)
				losses[r], hits[r] = lse-float64(zy), arg == y
				if p.Grad {
					inv := float32(1 / sum)
					for j := range z {
						z[j] *= inv
					}
					z[y]--
				}
			}
		})
		for r := range rows {
			total += losses[r]
			if hits[r] {
				count++
			}
		}
		if !p.Grad {
			continue
		}
		// dh[r0:] = (1/N)·dlogits·w;  dw += (1/N)·dlogitsᵀ·h[r0:]
		c.mm.GemmOp(rows, p.C, p.V, inv, sgemm.MatrixA(logits, p.V, false), operand(w, 0, p.C, false, false), 0, f32s(dh)[r0*p.C:], p.C)
		beta := float32(1)
		if r0 == 0 {
			beta = 0
		}
		c.mm.GemmOp(p.V, p.C, rows, inv, sgemm.MatrixA(logits, p.V, true), operand(h, r0*p.C, p.C, false, false), beta, f32s(dw), p.C)
	}
	f32s(loss)[0] = float32(total / float64(p.N))
	f32s(right)[0] = float32(count)
}

// roundLike rounds v in place to dt's precision, as a product stored in dt
// would hold it (tmp: len(v) values of scratch for F16, whose conversions
// run eight values an instruction); nothing for F32.
func roundLike(dt kernels.DType, v []float32, tmp []uint16) {
	switch dt {
	case kernels.F16:
		half.FromFloat32(tmp, v)
		half.ToFloat32(v, tmp)
	case kernels.BF16:
		half.RoundBF16(v)
	}
}

// SumSquares sums the squares of every gradient in float64, in blocks of
// elemGrain values added in order.
func (c *Backend) SumSquares(grads []kernels.Buf, sumsq kernels.Buf) {
	kernels.CheckLen("sum of squares", 1, sumsq)
	kernels.CheckF32("sum of squares", append([]kernels.Buf{sumsq}, grads...)...)
	var total float64
	for _, gb := range grads {
		g := f32s(gb)
		blocks := (len(g) + elemGrain - 1) / elemGrain
		part := make([]float64, blocks)
		parallel(blocks, 1, func(lo, hi int) {
			for b := lo; b < hi; b++ {
				var s float64
				for _, v := range g[b*elemGrain : min(len(g), (b+1)*elemGrain)] {
					s += float64(v) * float64(v)
				}
				part[b] = s
			}
		})
		for _, s := range part {
			total += s
		}
	}
	f32s(sumsq)[0] = float32(total)
}

// ClipGradNorm scales every gradient by the clip coefficient of the norm
// √sumsq.
func (c *Backend) ClipGradNorm(grads []kernels.Buf, maxNorm float32, sumsq, norm kernels.Buf) {
	kernels.CheckLen("clip grad norm", 1, sumsq, norm)
	kernels.CheckF32("clip grad norm", append([]kernels.Buf{sumsq, norm}, grads...)...)
	n := float32(math.Sqrt(float64(f32s(sumsq)[0])))
	f32s(norm)[0] = n
	coef := min(1, maxNorm/(n+1e-6))
	if coef == 1 {
		return
	}
	for _, gb := range grads {
		g := f32s(gb)
		parallel(len(g), elemGrain, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				g[i] *= coef
			}
		})
	}
}
