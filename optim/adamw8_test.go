package optim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
)

// TestAdamW8bit: AdamW with 8-bit moments (see testAdamW8bit).
func TestAdamW8bit(t *testing.T) { testAdamW8bit(t, tensor.CPU()) }

// testAdamW8bit: over a large parameter and a small one, NewAdamW8bit's
// state takes under 27% of AdamW's bytes in the pool (the small one's in
// F32), gives the pool back whole, follows AdamW's updates within 5% over
// 20 steps of gradients whose scale varies by orders of magnitude, and a
// state saved and loaded into a fresh optimizer continues bit for bit,
// while an F32 state is refused by name.
func testAdamW8bit(t *testing.T, dev *tensor.Device) {
	const big, small = 1<<16 + 77, 100
	rng := rand.New(rand.NewPCG(2, 8))
	init := func(n int, scale float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * scale)
		}
		return v
	}
	p0 := [][]float32{init(big, 1), init(small, 1)}
	grads := make([][][]float32, 20)
	for k := range grads {
		// Each block of 1024 values at its own scale, 10⁻⁴ to 1.
		g := init(big, 1)
		for i := range g {
			g[i] *= float32(math.Pow(10, -float64((i/1024)%5)))
		}
		grads[k] = [][]float32{g, init(small, 0.1)}
	}
	a := dev.Allocator()
	base := a.Stats().Allocated[memory.All].Current
	type run struct {
		params []*tensor.Tensor
		opt    *AdamW
	}
	start := func(eight bool) run {
		ps := []*tensor.Tensor{param(dev, p0[0]...), param(dev, p0[1]...)}
		if eight {
			return run{ps, NewAdamW8bit(ps, 1e-3, 0.1)}
		}
		return run{ps, NewAdamW(ps, 1e-3, 0.1)}
	}
	steps := func(r run, from, to int) {
		for k := from; k < to; k++ {
			for i, p := range r.params {
				setGrad(p, grads[k][i]...)
			}
			r.opt.Step()
			r.opt.ZeroGrad()
		}
	}
	stateBytes := func(o *AdamW) (n int64) {
		for _, s := range o.State() {
			n += s.Bytes()
		}
		return n
	}
	f32, q8 := start(false), start(true)
	steps(f32, 0, 20)
	steps(q8, 0, 10)
	if !q8.opt.Is8Bit(0) || q8.opt.Is8Bit(1) {
		t.Errorf("8-bit moments for parameter 0 (%d values) %v, for parameter 1 (%d values) %v: want only the first", big, q8.opt.Is8Bit(0), small, q8.opt.Is8Bit(1))
	}
	if n, want := stateBytes(q8.opt), int64(2*big+8*kernels.Quant8Blocks(big)+8*small); n != want || float64(n) > 0.27*float64(stateBytes(f32.opt)) {
		t.Errorf("8-bit state %d bytes (want %d), F32 state %d", n, want, stateBytes(f32.opt))
	}

	// Saved after 10 steps, loaded into a fresh optimizer, 10 more steps.
	saved := map[string]*tensor.Tensor{}
	for name, s := range q8.opt.State() {
		saved[name] = tensor.FromBytes(dev, s.DType(), s.Raw(), s.Shape()...)
	}
	counters := q8.opt.Counters()
	again := start(true)
	for i, p := range q8.params {
		again.params[i].Backend().Write(again.params[i].Buf(), p.Raw())
	}
	if err := again.opt.LoadState(saved, counters); err != nil {
		t.Fatal(err)
	}
	steps(q8, 10, 20)
	steps(again, 10, 20)
	for i := range q8.params {
		if a, b := q8.params[i].Float32s(), again.params[i].Float32s(); fmt.Sprint(a) != fmt.Sprint(b) {
			t.Errorf("parameter %d after a save and load differs from the run that went on", i)
		}
	}

	// The updates beside AdamW's.
	for i := range p0 {
		got, want := q8.params[i].Float32s(), f32.params[i].Float32s()
		var num, den float64
		for j := range got {
			d8, d32 := float64(got[j])-float64(p0[i][j]), float64(want[j])-float64(p0[i][j])
			num += (d8 - d32) * (d8 - d32)
			den += d32 * d32
		}
		rel := math.Sqrt(num / den)
		t.Logf("parameter %d: 20 updates with 8-bit moments differ from F32 AdamW's by %.3g%%", i, 100*rel)
		if !(rel < 0.05) {
			t.Errorf("parameter %d: 20 updates with 8-bit moments differ from F32 AdamW's by %.3g%%, want under 5%%", i, 100*rel)
		}
	}

	// An F32 state into an 8-bit optimizer, and the other way.
	f32State := map[string]*tensor.Tensor{}
	for name, s := range f32.opt.State() {
		f32State[name] = s
	}
	for _, c := range []struct {
		into  *AdamW
		state map[string]*tensor.Tensor
		want  string
	}{
		{again.opt, f32State, "optimizer state of parameter 0 is exp_avg; this optimizer holds its moments in 8 bits (adamw8bit)"},
		{f32.opt, saved, "optimizer state of parameter 0 is codes8; this optimizer holds its moments in F32 (adamw)"},
	} {
		if err := c.into.LoadState(c.state, counters); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("loading a state of the other kind: %v, want %q", err, c.want)
		}
	}

	for _, r := range []run{f32, q8, again} {
		r.opt.Release()
		for _, p := range r.params {
			p.Release()
		}
	}
	for _, s := range saved {
		s.Release()
	}
	if n := a.Stats().Allocated[memory.All].Current; n != base {
		t.Errorf("%d bytes allocated after every optimizer's release, %d before", n, base)
	}
}
