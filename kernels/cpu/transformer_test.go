package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu/internal/half"
)

// The transformer operations against float64 references: each forward
// written from its definition, each gradient by central differences of
// that forward in float64 (not from the backward's formulas).

// numGrad is the gradient of f at x by central differences (in place on x,
// restored).
func numGrad(x []float64, f func() float64) []float64 {
	g := make([]float64, len(x))
	for i := range x {
		v := x[i]
		h := 1e-6 * max(1, math.Abs(v))
		x[i] = v + h
		fp := f()
		x[i] = v - h
		fm := f()
		x[i] = v
		g[i] = (fp - fm) / (2 * h)
	}
	return g
}

func randVals(rng *rand.Rand, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = float64(float32(rng.NormFloat64()))
	}
	return v
}

func bufOf(t testing.TB, v []float64) kernels.Buf {
	b := buf(t, kernels.F32, len(v))
	for i, x := range v {
		f32s(b)[i] = float32(x)
	}
	return b
}

func idsOf(t *testing.T, v []int32) kernels.Buf {
	b := buf(t, kernels.I32, len(v))
	copy(i32s(b), v)
	return b
}

func TestEmbedding(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 1))
	const vocab, dim = 7, 5
	ids := []int32{3, 0, 3, 6, 3, 1, 0} // repeated ids
	n := len(ids)
	table := randVals(rng, vocab*dim)
	y := buf(t, kernels.F32, n*dim)
	be.Embedding(y, bufOf(t, table), idsOf(t, ids), n, vocab, dim)
	want := make([]float64, n*dim)
	for i, id := range ids {
		copy(want[i*dim:(i+1)*dim], table[int(id)*dim:])
	}
	check(t, "embedding", y, want, 0)
	dy := randVals(rng, n*dim)
	dt := buf(t, kernels.F32, vocab*dim)
	be.EmbeddingBackward(dt, bufOf(t, dy), idsOf(t, ids), n, vocab, dim, false)
	// d/dtable of Σ dy·embedding(table)
	wantD := numGrad(table, func() float64 {
		var s float64
		for i, id := range ids {
			for j := 0; j < dim; j++ {
				s += dy[i*dim+j] * table[int(id)*dim+j]
			}
		}
		return s
	})
	check(t, "embedding backward", dt, wantD, 1e-6)
}

func layerNormRef(x, g, b []float64, rows, cols int, eps float64) []float64 {
	y := make([]float64, len(x))
	for r := 0; r < rows; r++ {
		row := x[r*cols : (r+1)*cols]
		var m float64
		for _, v := range row {
			m += v
		}
		m /= float64(cols)
		var v2 float64
		for _, v := range row {
			v2 += (v - m) * (v - m)
		}
		v2 /= float64(cols)
		for j, v := range row {
			y[r*cols+j] = (v-m)/math.Sqrt(v2+eps)*g[j] + b[j]
		}
	}
	return y
}

func TestLayerNorm(t *testing.T) {
	rng := rand.New(rand.NewPCG(12, 1))
	for _, sh := range [][2]int{{1, 8}, {5, 33}, {130, 24}} {
		rows, cols := sh[0], sh[1]
		p := kernels.LayerNormParams{Rows: rows, Cols: cols, Eps: 1e-5}
		x := randVals(rng, rows*cols)
		for i := range x {
			x[i] = 2 + 3*x[i] // a mean far from zero
		}
		g, b := randVals(rng, cols), randVals(rng, cols)
		y, mean, rstd := buf(t, kernels.F32, rows*cols), buf(t, kernels.F32, rows), buf(t, kernels.F32, rows)
		be.LayerNorm(p, bufOf(t, x), bufOf(t, g), bufOf(t, b), y, mean, rstd)
		check(t, "layer norm", y, layerNormRef(x, g, b, rows, cols, 1e-5), 1e-5)
		dy := randVals(rng, rows*cols)
		obj := func() float64 {
			var s float64
			for i, v := range layerNormRef(x, g, b, rows, cols, 1e-5) {
				s += dy[i] * v
			}
			return s
		}
		dx, dg, db := buf(t, kernels.F32, rows*cols), buf(t, kernels.F32, cols), buf(t, kernels.F32, cols)
		be.LayerNormBackward(p, bufOf(t, x), bufOf(t, g), mean, rstd, bufOf(t, dy), dx, dg, db)
		check(t, "layer norm dx", dx, numGrad(x, obj), 1e-4)
		check(t, "layer norm dgamma", dg, numGrad(g, obj), 1e-4)
		check(t, "layer norm dbeta", db, numGrad(b, obj), 1e-4)

		// Accumulating: the gradient added to what dx held.
		prev := randVals(rng, rows*cols)
		want := numGrad(x, obj)
		for i := range want {
			want[i] += prev[i]
		}
		acc := bufOf(t, prev)
		pa := p
		pa.Accumulate = true
		be.LayerNormBackward(pa, bufOf(t, x), bufOf(t, g), mean, rstd, bufOf(t, dy), acc, dg, db)
		check(t, "layer norm accumulated dx", acc, want, 1e-4)
	}
}

// attentionRef is causal attention from the definition on [B, T, H, D]
// arrays of q, k, v (query i of Tq at position Tk−Tq+i).
func attentionRef(q, k, v []float64, B, H, D, Tq, Tk int, scale float64) []float64 {
	o := make([]float64, B*Tq*H*D)
	for b := 0; b < B; b++ {
		for h := 0; h < H; h++ {
			for i := 0; i < Tq; i++ {
				last := Tk - Tq + i
				s := make([]float64, last+1)
				m := math.Inf(-1)
				for j := range s {
					for d := 0; d < D; d++ {
						s[j] += q[((b*Tq+i)*H+h)*D+d] * k[((b*Tk+j)*H+h)*D+d]
					}
					s[j] *= scale
					m = math.Max(m, s[j])
				}
				var z float64
				for j := range s {
					s[j] = math.Exp(s[j] - m)
					z += s[j]
				}
				for j := range s {
					for d := 0; d < D; d++ {
						o[((b*Tq+i)*H+h)*D+d] += s[j] / z * v[((b*Tk+j)*H+h)*D+d]
					}
				}
			}
		}
	}
	return o
}

// attentionParams is attention over B batches of H heads of D values,
// Tq queries and Tk keys in rows of their own (not packed), scaled by
// 1/√D.
func attentionParams(B, H, D, Tq, Tk int) kernels.AttentionParams {
	C := H * D
	return kernels.AttentionParams{B: B, H: H, D: D, Tq: Tq, Tk: Tk, Scale: float32(1 / math.Sqrt(float64(D))),
		QRow: C, KRow: C, VRow: C, ORow: C, QBatch: Tq * C, KBatch: Tk * C, VBatch: Tk * C, OBatch: Tq * C}
}

func TestAttention(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 1))
	for _, c := range []struct{ B, H, D, Tq, Tk int }{{1, 1, 4, 5, 5}, {2, 3, 8, 7, 7}, {2, 2, 4, 1, 6}, {1, 2, 5, 3, 9}} {
		B, H, D, Tq, Tk := c.B, c.H, c.D, c.Tq, c.Tk
		q, k, v := randVals(rng, B*Tq*H*D), randVals(rng, B*Tk*H*D), randVals(rng, B*Tk*H*D)
		scale := 1 / math.Sqrt(float64(D))
		C := H * D
		p := attentionParams(B, H, D, Tq, Tk)
		o, lse := buf(t, kernels.F32, B*Tq*C), buf(t, kernels.F32, B*H*Tq)
		qb, kb, vb := bufOf(t, q), bufOf(t, k), bufOf(t, v)
		be.Attention(p, qb, kb, vb, o, lse)
		check(t, "attention", o, attentionRef(q, k, v, B, H, D, Tq, Tk, scale), 1e-5)
		if Tq != Tk {
			continue
		}
		do := randVals(rng, B*Tq*C)
		obj := func() float64 {
			var s float64
			for i, x := range attentionRef(q, k, v, B, H, D, Tq, Tk, scale) {
				s += do[i] * x
			}
			return s
		}
		dq, dk, dv := buf(t, kernels.F32, len(q)), buf(t, kernels.F32, len(k)), buf(t, kernels.F32, len(v))
		be.AttentionBackward(p, qb, kb, vb, o, lse, bufOf(t, do), dq, dk, dv)
		check(t, "attention dq", dq, numGrad(q, obj), 1e-4)
		check(t, "attention dk", dk, numGrad(k, obj), 1e-4)
		check(t, "attention dv", dv, numGrad(v, obj), 1e-4)
	}
}

// TestAttentionPackedQKV runs attention on q, k and v as views of one
// packed [B, T, 3, H, D] buffer, as a GPT's c_attn makes them.
func TestAttentionPackedQKV(t *testing.T) {
	rng := rand.New(rand.NewPCG(14, 1))
	const B, T, H, D = 2, 6, 2, 4
	const C = H * D
	qkv := randVals(rng, B*T*3*C)
	q, k, v := make([]float64, B*T*C), make([]float64, B*T*C), make([]float64, B*T*C)
	for r := 0; r < B*T; r++ {
		copy(q[r*C:], qkv[r*3*C:r*3*C+C])
		copy(k[r*C:], qkv[r*3*C+C:r*3*C+2*C])
		copy(v[r*C:], qkv[r*3*C+2*C:r*3*C+3*C])
	}
	p := kernels.AttentionParams{B: B, H: H, D: D, Tq: T, Tk: T, Scale: 0.5,
		QRow: 3 * C, KRow: 3 * C, VRow: 3 * C, ORow: C, QBatch: T * 3 * C, KBatch: T * 3 * C, VBatch: T * 3 * C, OBatch: T * C}
	all := bufOf(t, qkv)
	o, lse := buf(t, kernels.F32, B*T*C), buf(t, kernels.F32, B*H*T)
	be.Attention(p, all, all.Slice(C, all.N-C), all.Slice(2*C, all.N-2*C), o, lse)
	check(t, "packed attention", o, attentionRef(q, k, v, B, H, D, T, T, 0.5), 1e-5)
	do := randVals(rng, B*T*C)
	dqkv := buf(t, kernels.F32, len(qkv))
	be.AttentionBackward(p, all, all.Slice(C, all.N-C), all.Slice(2*C, all.N-2*C), o, lse, bufOf(t, do),
		dqkv, dqkv.Slice(C, all.N-C), dqkv.Slice(2*C, all.N-2*C))
	want := numGrad(qkv, func() float64 {
		for r := 0; r < B*T; r++ {
			copy(q[r*C:], qkv[r*3*C:r*3*C+C])
			copy(k[r*C:], qkv[r*3*C+C:r*3*C+2*C])
			copy(v[r*C:], qkv[r*3*C+2*C:r*3*C+3*C])
		}
		var s float64
		for i, x := range attentionRef(q, k, v, B, H, D, T, T, 0.5) {
			s += do[i] * x
		}
		return s
	})
	check(t, "packed attention dqkv", dqkv, want, 1e-4)
}

func TestClassifierLoss(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 1))
	for _, c := range []struct{ N, C, V int }{{3, 4, 5}, {300, 6, 11}, {1, 3, 300}} {
		h, w := randVals(rng, c.N*c.C), randVals(rng, c.V*c.C)
		labels := make([]int32, c.N)
		for i := range labels {
			labels[i] = int32(rng.IntN(c.V))
		}
		lossOf := func() (float64, int) {
			var total float64
			right := 0
			for r := 0; r < c.N; r++ {
				z := make([]float64, c.V)
				best := 0
				for j := range z {
					for d := 0; d < c.C; d++ {
						z[j] += h[r*c.C+d] * w[j*c.C+d]
					}
					if z[j] > z[best] {
						best = j
					}
				}
				var s float64
				for _, v := range z {
					s += math.Exp(v - z[best])
				}
				total += z[best] + math.Log(s) - z[labels[r]]
				if best == int(labels[r]) {
					right++
				}
			}
			return total / float64(c.N), right
		}
		wantLoss, wantRight := lossOf()
		p := kernels.ClassifierParams{N: c.N, C: c.C, V: c.V, Grad: true}
		loss, right := buf(t, kernels.F32, 1), buf(t, kernels.F32, 1)
		dh, dw := buf(t, kernels.F32, c.N*c.C), buf(t, kernels.F32, c.V*c.C)
		be.ClassifierLoss(p, bufOf(t, h), bufOf(t, w), idsOf(t, labels), loss, right, dh, dw)
		check(t, "classifier loss", loss, []float64{wantLoss}, 1e-5)
		check(t, "classifier right", right, []float64{float64(wantRight)}, 0)
		obj := func() float64 { l, _ := lossOf(); return l }
		check(t, "classifier dh", dh, numGrad(h, obj), 1e-4)
		check(t, "classifier dw", dw, numGrad(w, obj), 1e-4)

		// ClassifierLossStoppable: with its stop open, the same bits; with
		// it closed, it says so and leaves dh unwritten.
		open, shut := make(chan struct{}), make(chan struct{})
		close(shut)
		for _, stop := range []chan struct{}{open, shut} {
			l, r := buf(t, kernels.F32, 1), buf(t, kernels.F32, 1)
			sh, sw := buf(t, kernels.F32, c.N*c.C), buf(t, kernels.F32, c.V*c.C)
			whole := be.ClassifierLossStoppable(p, bufOf(t, h), bufOf(t, w), idsOf(t, labels), l, r, sh, sw, stop)
			if stop == shut {
				if whole || !math.IsNaN(float64(in(sh)[0])) {
					t.Errorf("%+v: ClassifierLossStoppable with its stop closed: ran whole %v, dh[0] %v", c, whole, in(sh)[0])
				}
				continue
			}
			for _, o := range [][2]kernels.Buf{{loss, l}, {right, r}, {dh, sh}, {dw, sw}} {
				for i, v := range in(o[0]) {
					if g := in(o[1])[i]; !whole || math.Float32bits(g) != math.Float32bits(v) {
						t.Fatalf("%+v: ClassifierLossStoppable with its stop open (ran whole %v): element %d %v, ClassifierLoss's %v", c, whole, i, g, v)
					}
				}
			}
		}
	}
}

// TestClassifierLossRoundsLogits: with 16-bit h and w the logits are
// rounded to their dtype before the softmax, as a product into that dtype
// stores them (the loss of unrounded logits is further off than the
// tolerance).
func TestClassifierLossRoundsLogits(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 1))
	const N, C, V = 40, 4, 300
	h, w := randVals(rng, N*C), randVals(rng, V*C)
	for i := range h {
		h[i] *= 8 // logits of about ten: bf16 keeps eight bits of them
	}
	for _, v := range [][]float64{h, w} {
		for i, x := range v {
			v[i] = float64(half.BF16Value(half.BF16Bits(float32(x))))
		}
	}
	labels := make([]int32, N)
	for i := range labels {
		labels[i] = int32(rng.IntN(V))
	}
	lossOf := func(round bool) float64 {
		var total float64
		for r := 0; r < N; r++ {
			z := make([]float64, V)
			for j := range z {
				var acc float32 // as the product accumulates: in float32
				for d := 0; d < C; d++ {
					acc += float32(h[r*C+d]) * float32(w[j*C+d])
				}
				z[j] = float64(acc)
				if round {
					z[j] = float64(half.BF16Value(half.BF16Bits(acc)))
				}
			}
			m := slices.Max(z)
			var s float64
			for _, v := range z {
				s += math.Exp(v - m)
			}
			total += m + math.Log(s) - z[labels[r]]
		}
		return total / N
	}
	bf := func(v []float64) kernels.Buf {
		b := buf(t, kernels.BF16, len(v))
		for i, x := range v {
			u16s(b)[i] = half.BF16Bits(float32(x))
		}
		return b
	}
	loss, right := buf(t, kernels.F32, 1), buf(t, kernels.F32, 1)
	be.ClassifierLoss(kernels.ClassifierParams{N: N, C: C, V: V}, bf(h), bf(w), idsOf(t, labels), loss, right, kernels.Buf{}, kernels.Buf{})
	want, unrounded := lossOf(true), lossOf(false)
	if math.Abs(want-unrounded) < 1e-4*math.Abs(want) {
		t.Fatalf("the rounded and unrounded losses %v and %v are too close to tell apart", want, unrounded)
	}
	check(t, "classifier loss of bf16 logits", loss, []float64{want}, 1e-6)
}

func TestClipGradNorm(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 1))
	a, b := randVals(rng, 100), randVals(rng, 70001)
	var ss float64
	for _, v := range append(append([]float64(nil), a...), b...) {
		ss += v * v
	}
	n := math.Sqrt(ss)
	for _, maxNorm := range []float64{n * 2, n / 3} {
		ga, gb, sumsq, norm := bufOf(t, a), bufOf(t, b), buf(t, kernels.F32, 1), buf(t, kernels.F32, 1)
		be.SumSquares([]kernels.Buf{ga, gb}, sumsq)
		check(t, "sum of squares", sumsq, []float64{ss}, 1e-6)
		be.ClipGradNorm([]kernels.Buf{ga, gb}, float32(maxNorm), sumsq, norm)
		check(t, "grad norm", norm, []float64{n}, 1e-6)
		coef := math.Min(1, maxNorm/(n+1e-6))
		wa, wb := make([]float64, len(a)), make([]float64, len(b))
		for i := range a {
			wa[i] = a[i] * coef
		}
		for i := range b {
			wb[i] = b[i] * coef
		}
		check(t, "clipped a", ga, wa, 1e-6)
		check(t, "clipped b", gb, wb, 1e-6)
	}
}

// TestPagedAttention: attention through block tables against float64
// attention over each sequence's keys laid out in order, for decoding rows
// (one a sequence), a prefill after a cached prefix, ragged lengths across
// block boundaries; WritePaged puts each row where its slot says and
// leaves the rest alone, padding rows included.
func TestPagedAttention(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 2))
	const H, D, bs = 2, 5, 3
	C := H * D
	lens, fresh := []int{1, 4, 7, 11}, []int{1, 4, 1, 5}
	maxBlocks := 5
	blocks := len(lens)*maxBlocks + 1
	perm := rng.Perm(blocks - 1)
	tables := make([]int32, len(lens)*maxBlocks)
	for i := range tables {
		tables[i] = int32(1 + perm[i])
	}
	kc, vc := randVals(rng, blocks*bs*C), randVals(rng, blocks*bs*C)
	kcache, vcache := bufOf(t, kc), bufOf(t, vc)
	var rowSeq, rowPos, slots []int32
	for s, n := range lens {
		for j := n - fresh[s]; j < n; j++ {
			rowSeq, rowPos = append(rowSeq, int32(s)), append(rowPos, int32(j))
			slots = append(slots, tables[s*maxBlocks+j/bs]*bs+int32(j%bs))
		}
	}
	rows := len(rowSeq)
	qkv := randVals(rng, (rows+1)*3*C)
	q := bufOf(t, qkv)
	p := kernels.PagedParams{Rows: rows + 1, H: H, D: D, QRow: 3 * C, Blocks: blocks, BlockSize: bs, Seqs: len(lens), MaxBlocks: maxBlocks,
		MaxLen: 11, Scale: 0.4}
	c := New()
	c.WritePaged(p, q.Slice(C, q.N-C), q.Slice(2*C, q.N-2*C), kcache, vcache, idsOf(t, append(slices.Clone(slots), -1)))
	at := func(s, j int) int { return int(tables[s*maxBlocks+j/bs])*bs + j%bs } // a position's cache row
	for r, sl := range slots {
		for i := range C {
			kc[int(sl)*C+i], vc[int(sl)*C+i] = qkv[r*3*C+C+i], qkv[r*3*C+2*C+i]
		}
	}
	if !slices.Equal(f32s(kcache), toF32s(kc)) || !slices.Equal(f32s(vcache), toF32s(vc)) {
		t.Fatal("WritePaged wrote other than each row's key and value at its slot (or wrote the padding row)")
	}
	p.Rows = rows
	o := buf(t, kernels.F32, rows*C)
	c.PagedAttention(p, q, kcache, vcache, idsOf(t, tables), idsOf(t, rowSeq), idsOf(t, rowPos), o)
	var worst float64
	for r := range rows {
		s, n := int(rowSeq[r]), int(rowPos[r])+1
		for h := range H {
			w := make([]float64, n)
			var m, sum float64 = math.Inf(-1), 0
			for j := range n {
				for d := range D {
					w[j] += qkv[r*3*C+h*D+d] * kc[at(s, j)*C+h*D+d]
				}
				w[j] *= float64(p.Scale)
				m = max(m, w[j])
			}
			for j := range w {
				w[j] = math.Exp(w[j] - m)
				sum += w[j]
			}
			for d := range D {
				var want float64
				for j := range n {
					want += w[j] / sum * vc[at(s, j)*C+h*D+d]
				}
				worst = max(worst, math.Abs(float64(f32s(o)[r*C+h*D+d])-want))
			}
		}
	}
	if worst > 1e-5 {
		t.Errorf("paged attention against float64: worst difference %g", worst)
	}
}

func toF32s(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

// TestDotAxpy checks attention's dot products and weighted sums on fresh
// random rows of every length to 70 (whole vectors, tails, both), at
// offsets that leave the rows unaligned: the vector passes give the same
// bits as the Go loops that define them (dotLanes, axpy's loop), and
// both are within float32's rounding of a float64 reference; axpy writes
// only y's length.
func TestDotAxpy(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for n := 0; n <= 70; n++ {
		for _, off := range []int{0, 3} {
			a, b := randSlice(rng, n+off)[off:], randSlice(rng, n+off)[off:]
			var want, mag float64
			for i := range a {
				want += float64(a[i]) * float64(b[i])
				mag += math.Abs(float64(a[i]) * float64(b[i]))
			}
			got, lanes := dot(a, b), dotLanes(a, b)
			if math.Float32bits(got) != math.Float32bits(lanes) {
				t.Errorf("n %d offset %d: dot %v, its Go definition %v", n, off, got, lanes)
			}
			if d := math.Abs(float64(got) - want); d > 1e-6*mag+1e-30 {
				t.Errorf("n %d offset %d: dot %v, float64 %v", n, off, got, want)
			}
			w := float32(rng.NormFloat64())
			y := randSlice(rng, n+off+1)[off:]
			y0 := slices.Clone(y)
			axpy(y[:n], w, a)
			for i := range n {
				if want := y0[i] + w*a[i]; math.Float32bits(y[i]) != math.Float32bits(want) {
					t.Fatalf("n %d offset %d: axpy's y[%d] = %v, want %v", n, off, i, y[i], want)
				}
			}
			if y[n] != y0[n] {
				t.Fatalf("n %d offset %d: axpy wrote past y's end: %v, was %v", n, off, y[n], y0[n])
			}
		}
	}
}

// randSlice is n standard normal float32 values.
func randSlice(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

// TestAttentionStoppable: with its stop open, AttentionStoppable and
// AttentionBackwardStoppable give Attention's and AttentionBackward's bits
// and say they ran whole; with it closed, they stop before their first
// query, say so, and leave their outputs unwritten (poisoned).
func TestAttentionStoppable(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 1))
	const B, H, D, T = 2, 3, 8, 33
	C := H * D
	p := attentionParams(B, H, D, T, T)
	q, k, v, do := bufOf(t, randVals(rng, B*T*C)), bufOf(t, randVals(rng, B*T*C)), bufOf(t, randVals(rng, B*T*C)), bufOf(t, randVals(rng, B*T*C))
	shut := make(chan struct{})
	close(shut)
	for _, stop := range []chan struct{}{make(chan struct{}), shut} {
		closed := stop == shut
		o, lse := buf(t, kernels.F32, B*T*C), buf(t, kernels.F32, B*H*T)
		wo, wlse := buf(t, kernels.F32, B*T*C), buf(t, kernels.F32, B*H*T)
		be.Attention(p, q, k, v, wo, wlse)
		if whole := be.AttentionStoppable(p, q, k, v, o, lse, stop); whole == closed {
			t.Fatalf("AttentionStoppable with its stop closed %v: ran whole %v", closed, whole)
		}
		dq, dk, dv := buf(t, kernels.F32, B*T*C), buf(t, kernels.F32, B*T*C), buf(t, kernels.F32, B*T*C)
		wdq, wdk, wdv := buf(t, kernels.F32, B*T*C), buf(t, kernels.F32, B*T*C), buf(t, kernels.F32, B*T*C)
		be.AttentionBackward(p, q, k, v, wo, wlse, do, wdq, wdk, wdv)
		if whole := be.AttentionBackwardStoppable(p, q, k, v, wo, wlse, do, dq, dk, dv, stop); whole == closed {
			t.Fatalf("AttentionBackwardStoppable with its stop closed %v: ran whole %v", closed, whole)
		}
		if !closed {
			sameBits(t, "attention", o, wo)
			sameBits(t, "attention's log-sum-exps", lse, wlse)
			sameBits(t, "attention's dq", dq, wdq)
			sameBits(t, "attention's dk", dk, wdk)
			continue
		}
		for name, b := range map[string]kernels.Buf{"output": o, "log-sum-exps": lse, "dq": dq} {
			for i, x := range in(b) {
				if x == x {
					t.Fatalf("stopped attention's %s: element %d written (%v)", name, i, x)
				}
			}
		}
	}
}

// BenchmarkAttention times causal attention and its gradient on the CPU at
// GPT-2 small's heads (12 of 64) over one sequence of 1,024 positions, in
// F32 and in BF16 (autocast's).
//
//	go test ./kernels/cpu -run XXX -bench 'Attention$' -benchtime 5x
func BenchmarkAttention(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	const B, H, D, T = 1, 12, 64, 1024
	C := H * D
	p := attentionParams(B, H, D, T, T)
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		in := func() kernels.Buf {
			f := bufOf(b, randVals(rng, B*T*C))
			if dt == kernels.F32 {
				return f
			}
			h := buf(b, dt, B*T*C)
			be.Cast(h, f)
			return h
		}
		q, k, v, do, o := in(), in(), in(), in(), buf(b, dt, B*T*C)
		lse := buf(b, kernels.F32, B*H*T)
		dq, dk, dv := buf(b, dt, B*T*C), buf(b, dt, B*T*C), buf(b, dt, B*T*C)
		b.Run(fmt.Sprint("forward-", dt), func(b *testing.B) {
			for range b.N {
				be.Attention(p, q, k, v, o, lse)
			}
		})
		b.Run(fmt.Sprint("backward-", dt), func(b *testing.B) {
			for range b.N {
				be.AttentionBackward(p, q, k, v, o, lse, do, dq, dk, dv)
			}
		})
	}
}
