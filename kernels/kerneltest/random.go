package kerneltest

import (
	"fmt"
	"slices"

	"github.com/leangrad/leangrad/kernels"
)

// The random family's cases (kernels.RandomOps).
var randomCases = []testCase{
	{"random", func(s *suite) {
		for _, dt := range dtypes {
			for _, n := range []int{1, 7, 4096, 100003} {
				g := kernels.Philox{Seed: uint64(n) * 31, Offset: uint64(n)}
				u := s.out(dt, n)
				s.got.Uniform(u.got, -2, 3, g)
				s.ref.Uniform(u.ref, -2, 3, g)
				s.check(fmt.Sprintf("uniform %v[%d]", dt, n), u, TolElementwise)
				z := s.out(dt, n)
				s.got.Normal(z.got, 0.5, 2, g)
				s.ref.Normal(z.ref, 0.5, 2, g)
				s.check(fmt.Sprintf("normal %v[%d]", dt, n), z, TolElementwise)
				x := s.randIn(dt, n)
				d := s.out(dt, n)
				s.got.Dropout(d.got, x.got, 0.3, g)
				s.ref.Dropout(d.ref, x.ref, 0.3, g)
				s.check(fmt.Sprintf("dropout %v[%d]", dt, n), d, TolElementwise)
				// The same draw with part of the offset in a device counter.
				base := s.in(kernels.I32, []float32{float32(n / 2), 0})
				gb := kernels.Philox{Seed: g.Seed, Offset: g.Offset - uint64(n/2)}
				gg, gr := gb, gb
				gg.Base, gr.Base = base.got, base.ref
				db := s.out(dt, n)
				s.got.Dropout(db.got, x.got, 0.3, gg)
				s.ref.Dropout(db.ref, x.ref, 0.3, gr)
				s.check(fmt.Sprintf("dropout with a device base %v[%d]", dt, n), db, TolElementwise)
				if !slices.Equal(s.read(db.got, s.got), s.read(d.got, s.got)) {
					s.t.Errorf("dropout %v[%d]: offset %d+%d on the device differs from %d", dt, n, g.Offset-uint64(n/2), n/2, g.Offset)
				}
				ub := s.out(dt, n)
				s.got.Normal(ub.got, 0.5, 2, gg)
				s.ref.Normal(ub.ref, 0.5, 2, gr)
				s.check(fmt.Sprintf("normal with a device base %v[%d]", dt, n), ub, TolElementwise)
			}
		}
	}},
	{"sample", func(s *suite) {
		// Each row its own settings: greedy, the whole distribution, top-k,
		// top-p, both, a low temperature; ties at the maximum (the first
		// wins); vocabularies of a few tokens to GPT-2's.
		type row struct {
			t    float32
			k    int
			topP float32
		}
		settings := []row{{0, 0, 1}, {1, 0, 1}, {1, 5, 1}, {0.8, 0, 0.9}, {1.2, 40, 0.95}, {0.3, 0, 1}, {1, 1, 1}, {2, 0, 0.5}}
		for _, dt := range dtypes {
			for _, V := range []int{7, 1000, 50257} {
				rows := 3 * len(settings)
				logits := s.normal(rows * V)
				for i := range logits {
					logits[i] *= 3
				}
				logits[V+V/2], logits[V+V/3] = 40, 40 // a tie, at the maximum, in the second row (greedy)
				var temp, topK, topP, seeds, steps []float32
				for r := range rows {
					st := settings[r%len(settings)]
					temp, topK, topP = append(temp, st.t), append(topK, float32(st.k)), append(topP, st.topP)
					seeds, steps = append(seeds, float32(1+r), float32(r%3)), append(steps, float32(7*r))
				}
				p := kernels.SampleParams{Rows: rows, V: V, TopN: min(3, V)}
				l := s.in(dt, logits)
				tp, tk, pp, sd, sp := s.in(kernels.F32, temp), s.in(kernels.I32, topK), s.in(kernels.F32, topP), s.in(kernels.I32, seeds), s.in(kernels.I32, steps)
				tok, lp := s.out(kernels.I32, rows), s.out(kernels.F32, rows)
				tt, tl := s.out(kernels.I32, rows*p.TopN), s.out(kernels.F32, rows*p.TopN)
				s.got.Sample(p, l.got, tp.got, tk.got, pp.got, sd.got, sp.got, tok.got, lp.got, tt.got, tl.got)
				s.ref.Sample(p, l.ref, tp.ref, tk.ref, pp.ref, sd.ref, sp.ref, tok.ref, lp.ref, tt.ref, tl.ref)
				what := fmt.Sprintf("%v V %d", dt, V)
				s.check("sample tokens "+what, tok, 0)
				s.check("sample log-probabilities "+what, lp, TolAccumulate)
				s.check("sample top tokens "+what, tt, 0)
				s.check("sample top log-probabilities "+what, tl, TolAccumulate)
			}
		}
	}},
}
