package kerneltest

import (
	"fmt"
	"math"

	"github.com/leangrad/leangrad/kernels"
)

// The transformer family's cases (kernels.TransformerOps).
var transformerCases = []testCase{
	{"embedding", func(s *suite) {
		for _, dt := range dtypes {
			for _, c := range [][3]int{{1, 5, 3}, {37, 11, 16}, {2000, 97, 24}, {600, 3, 770}} {
				n, vocab, dim := c[0], c[1], c[2]
				ids := make([]float32, n)
				for i := range ids {
					ids[i] = float32(s.rng.IntN(vocab)) // repeats
				}
				id := s.in(kernels.I32, ids)
				table := s.randIn(dt, vocab*dim)
				y := s.out(dt, n*dim)
				s.got.Embedding(y.got, table.got, id.got, n, vocab, dim)
				s.ref.Embedding(y.ref, table.ref, id.ref, n, vocab, dim)
				s.check(fmt.Sprintf("embedding %v %v", dt, c), y, 0)
				dy := s.randIn(dt, n*dim)
				dtab := s.out(kernels.F32, vocab*dim)
				s.got.EmbeddingBackward(dtab.got, dy.got, id.got, n, vocab, dim, false)
				s.ref.EmbeddingBackward(dtab.ref, dy.ref, id.ref, n, vocab, dim, false)
				s.check(fmt.Sprintf("embedding backward %v %v", dt, c), dtab, TolAccumulate)
				acc := s.randIn(kernels.F32, vocab*dim) // a gradient the table already has
				s.got.EmbeddingBackward(acc.got, dy.got, id.got, n, vocab, dim, true)
				s.ref.EmbeddingBackward(acc.ref, dy.ref, id.ref, n, vocab, dim, true)
				s.check(fmt.Sprintf("embedding backward accumulated %v %v", dt, c), acc, TolAccumulate)
			}
		}
	}},
	{"attention", func(s *suite) {
		for _, dt := range dtypes {
			// D = 64 runs CUDA's flash kernels at F16 and BF16: whole
			// tiles, a ragged last tile, a decoding step over a cache.
			for _, c := range []struct{ B, H, D, Tq, Tk int }{{1, 1, 8, 1, 1}, {2, 3, 16, 37, 37}, {1, 2, 64, 300, 300}, {3, 2, 32, 1, 50},
				{2, 4, 8, 5, 64}, {2, 3, 64, 128, 128}, {1, 2, 64, 3, 70}, {1, 1, 64, 1, 1}} {
				C := c.H * c.D
				// q, k, v packed as a GPT's c_attn makes them when Tq = Tk;
				// separate (a decoding step over a cache) otherwise.
				p := kernels.AttentionParams{B: c.B, H: c.H, D: c.D, Tq: c.Tq, Tk: c.Tk, Scale: 1 / float32(math.Sqrt(float64(c.D))),
					ORow: C, OBatch: c.Tq * C}
				var q, k, v pair
				if c.Tq == c.Tk {
					qkv := s.randIn(dt, c.B*c.Tq*3*C)
					q, k, v = qkv, qkv.slice(C), qkv.slice(2*C)
					p.QRow, p.KRow, p.VRow = 3*C, 3*C, 3*C
					p.QBatch, p.KBatch, p.VBatch = c.Tq*3*C, c.Tq*3*C, c.Tq*3*C
				} else {
					q, k, v = s.randIn(dt, c.B*c.Tq*C), s.randIn(dt, c.B*c.Tk*C), s.randIn(dt, c.B*c.Tk*C)
					p.QRow, p.KRow, p.VRow = C, C, C
					p.QBatch, p.KBatch, p.VBatch = c.Tq*C, c.Tk*C, c.Tk*C
				}
				o, lse := s.out(dt, c.B*c.Tq*C), s.out(kernels.F32, c.B*c.H*c.Tq)
				s.got.Attention(p, q.got, k.got, v.got, o.got, lse.got)
				s.ref.Attention(p, q.ref, k.ref, v.ref, o.ref, lse.ref)
				what := fmt.Sprintf("%v %+v", dt, c)
				s.check("attention o "+what, o, TolAccumulate)
				s.check("attention lse "+what, lse, TolAccumulate)
				if c.Tq != c.Tk {
					continue
				}
				do := s.randIn(dt, c.B*c.Tq*C)
				dqkv := s.out(dt, c.B*c.Tq*3*C)
				dq, dk, dv := dqkv, dqkv.slice(C), dqkv.slice(2*C)
				s.got.AttentionBackward(p, q.got, k.got, v.got, o.got, lse.got, do.got, dq.got, dk.got, dv.got)
				s.ref.AttentionBackward(p, q.ref, k.ref, v.ref, o.ref, lse.ref, do.ref, dq.ref, dk.ref, dv.ref)
				s.check("attention dqkv "+what, dqkv, TolAccumulate)
			}
		}
	}},
}
