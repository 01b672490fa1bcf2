package kerneltest

import (
	"fmt"
	"math"
	"slices"

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
	{"paged attention", func(s *suite) {
		for _, dt := range dtypes {
			// Decoding steps (a row a sequence; on CUDA, head sizes its
			// vector decoding kernel takes, 8 to 256, and one it does
			// not, 160), prefills after a cached prefix, a padding row,
			// ragged lengths across block boundaries, D below, at and
			// above the CUDA block's threads;
			// a step that decodes some sequences while it fills another
			// (on CUDA, rows of one sequence and of several in one tile);
			// prefills of head width 64 (on CUDA in F16 and BF16, the
			// tensor cores' tiles of 64 rows): a long cached prefix, a
			// fresh prompt, runs across tiles, many short ones in a tile.
			for _, c := range []struct {
				H, D, bs int
				lens     []int // each sequence's positions in all
				fresh    []int // of which the last are the rows
			}{
				{2, 8, 4, []int{1, 5, 9}, []int{1, 1, 1}},
				{3, 16, 16, []int{37, 16, 70}, []int{37, 3, 20}},
				{4, 32, 16, []int{50, 9, 100, 1, 66}, []int{1, 9, 1, 1, 40}},
				{12, 64, 16, []int{300, 1, 17, 64, 65, 250, 2, 129}, []int{1, 1, 1, 1, 1, 1, 1, 1}},
				{2, 128, 16, []int{700, 33, 1}, []int{1, 1, 1}},
				{1, 256, 16, []int{90, 5}, []int{1, 1}},
				{2, 160, 8, []int{40, 3}, []int{1, 1}},
				{2, 128, 8, []int{33, 9}, []int{5, 9}},
				{1, 160, 4, []int{13}, []int{13}},
				{4, 64, 16, []int{600, 40, 17, 129, 3, 70}, []int{80, 40, 1, 70, 2, 16}},
				{2, 64, 16, []int{116, 116, 116, 116, 116, 9}, []int{16, 16, 16, 16, 16, 1}},
				{3, 64, 8, []int{45, 64, 1}, []int{45, 30, 1}},
			} {
				C, maxLen := c.H*c.D, slices.Max(c.lens)
				maxBlocks := (maxLen+c.bs-1)/c.bs + 1
				blocks := len(c.lens)*maxBlocks + 3
				perm := s.rng.Perm(blocks - 1) // the sequences' blocks, scattered; block 0 spare
				tables := make([]float32, len(c.lens)*maxBlocks)
				var rowSeq, rowPos, slots []float32
				next := 0
				for q, n := range c.lens {
					for b := range maxBlocks {
						tables[q*maxBlocks+b] = float32(1 + perm[next])
						next++
					}
					for j := n - c.fresh[q]; j < n; j++ {
						rowSeq, rowPos = append(rowSeq, float32(q)), append(rowPos, float32(j))
						slots = append(slots, tables[q*maxBlocks+j/c.bs]*float32(c.bs)+float32(j%c.bs))
					}
				}
				rows := len(rowSeq)
				rowSeq, rowPos, slots = append(rowSeq, 0), append(rowPos, 0), append(slots, -1) // a padding row
				p := kernels.PagedParams{Rows: rows + 1, H: c.H, D: c.D, QRow: 3 * C, Blocks: blocks, BlockSize: c.bs,
					Seqs: len(c.lens), MaxBlocks: maxBlocks, MaxLen: maxLen, Scale: 1 / float32(math.Sqrt(float64(c.D)))}
				kc, vc := s.randIn(dt, blocks*c.bs*C), s.randIn(dt, blocks*c.bs*C) // the cached prefixes, and junk
				qkv := s.randIn(dt, (rows+1)*3*C)
				sl, tb := s.in(kernels.I32, slots), s.in(kernels.I32, tables)
				rs, rp := s.in(kernels.I32, rowSeq[:rows]), s.in(kernels.I32, rowPos[:rows])
				s.got.WritePaged(p, qkv.slice(C).got, qkv.slice(2*C).got, kc.got, vc.got, sl.got)
				s.ref.WritePaged(p, qkv.slice(C).ref, qkv.slice(2*C).ref, kc.ref, vc.ref, sl.ref)
				what := fmt.Sprintf("%v %+v", dt, c)
				s.check("write paged keys "+what, kc, 0)
				s.check("write paged values "+what, vc, 0)
				p.Rows = rows // the padding row's attention is nothing's
				o := s.out(dt, rows*C)
				s.got.PagedAttention(p, qkv.got, kc.got, vc.got, tb.got, rs.got, rp.got, o.got)
				s.ref.PagedAttention(p, qkv.ref, kc.ref, vc.ref, tb.ref, rs.ref, rp.ref, o.ref)
				s.check("paged attention "+what, o, TolAccumulate)
			}
		}
	}},
}
