package autograd_test

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
	"github.com/x448/float16"
)

// TestLinearUnderAutocast: the product runs on F16 copies of x and w, and
// the gradients reach the F32 tensors in F32; the weight's is the product
// of the F16 operands accumulated and kept in float32, not rounded to F16
// (a rounding would be off by up to 2⁻¹¹ of each value).
func TestLinearUnderAutocast(t *testing.T) {
	dev := tensor.CPU()
	rng := newSrc(dev, 9, 9)
	const n, in, out = 24, 40, 7
	x, w, b := param(rng, normal, n, in), param(rng, normal, out, in), param(rng, normal, out)
	defer x.Release()
	defer w.Release()
	defer b.Release()
	gv := make([]float32, n*out)
	for i := range gv {
		gv[i] = float32(rng.NormFloat64())
	}
	var y *tensor.Tensor
	ag.Autocast(dev, tensor.F16, func() { y = ag.Linear(x, w, b) })
	if y.DType() != tensor.F16 {
		t.Fatalf("y is %v under autocast, want f16", y.DType())
	}
	g32 := tensor.FromFloat32(dev, gv, n, out)
	g := ag.Cast(g32, tensor.F16)
	ag.Backward(y, ag.WithGrad(g))
	for _, t := range []*tensor.Tensor{y, g, g32} {
		t.Release()
	}

	h := func(v float32) float64 { return float64(float16.Fromfloat32(v).Float32()) }
	xv, wv := x.Float32s(), w.Float32s()
	for _, c := range []struct {
		name string
		p    *tensor.Tensor
		want func(i int) float64
		tol  float64
	}{
		{"dw", w, func(i int) float64 { // Σₙ g[n][o]·x[n][k], i = o·in + k
			var s float64
			for r := 0; r < n; r++ {
				s += h(gv[r*out+i/in]) * h(xv[r*in+i%in])
			}
			return s
		}, 1e-5},
		{"db", b, func(o int) float64 {
			var s float64
			for r := 0; r < n; r++ {
				s += h(gv[r*out+o])
			}
			return s
		}, 2e-3},
		{"dx", x, func(i int) float64 { // Σₒ g[n][o]·w[o][k], i = n·in + k
			var s float64
			for o := 0; o < out; o++ {
				s += h(gv[i/in*out+o]) * h(wv[o*in+i%in])
			}
			return s
		}, 2e-3},
	} {
		gr := c.p.Grad()
		if gr == nil || gr.DType() != tensor.F32 {
			t.Fatalf("%s: gradient %v, want an f32 one", c.name, gr)
		}
		var num, den float64
		for i, v := range gr.Float32s() {
			d := float64(v) - c.want(i)
			num, den = num+d*d, den+c.want(i)*c.want(i)
		}
		if e := math.Sqrt(num / den); e > c.tol {
			t.Errorf("%s: relative error %.3g against the product of the F16 operands, want at most %g", c.name, e, c.tol)
		}
	}
}

// TestMLPIsLinearGELULinear: the fused feed-forward op computes what
// Linear, GELU and Linear compute, forward and backward, in float32 and
// under BF16 autocast (where it rounds less: the biases are added before
// the products are rounded, and GELU's derivative is applied before the
// hidden gradient is).
func TestMLPIsLinearGELULinear(t *testing.T) {
	dev := tensor.CPU()
	rng := newSrc(dev, 5, 5)
	const n, in, hidden, out = 12, 16, 24, 8
	x, w1, b1 := param(rng, normal, n, in), param(rng, normal, hidden, in), param(rng, normal, hidden)
	w2, b2 := param(rng, normal, out, hidden), param(rng, normal, out)
	ps := []*tensor.Tensor{x, w1, b1, w2, b2}
	releasedAfter(t, ps)
	gv := normals(rng, n*out)
	run := func(f func() *tensor.Tensor, dt tensor.DType) ([]float32, [][]float32) {
		y, grads, _ := stepOf(dev, ps, gv, []int{n, out}, f, dt)
		return y, grads
	}
	fused := func() *tensor.Tensor { return ag.MLP(x, w1, b1, w2, b2) }
	composed := func() *tensor.Tensor { return ag.Linear(ag.GELU(ag.Linear(x, w1, b1)), w2, b2) }
	for _, c := range []struct {
		dt  tensor.DType
		tol float64
	}{{tensor.F32, 1e-5}, {tensor.BF16, 3e-2}} {
		yf, gf := run(fused, c.dt)
		yc, gc := run(composed, c.dt)
		if e := relErr(yf, yc); e > c.tol {
			t.Errorf("%v: output differs from Linear→GELU→Linear by %.3g", c.dt, e)
		}
		for i, name := range []string{"dx", "dw1", "db1", "dw2", "db2"} {
			if e := relErr(gf[i], gc[i]); e > c.tol {
				t.Errorf("%v: %s differs from Linear→GELU→Linear's by %.3g", c.dt, name, e)
			}
		}
	}
}

// TestResidualOpsAreTheirSums: AddLinear and AddMLP compute r + Linear and
// r + MLP, forward and backward, in float32 (to rounding) and under BF16
// autocast into an F32 r, where they round less: the product's sum with
// the bias reaches r unrounded, so they come closer to the float32 result
// than the 16-bit branch added to r. r's gradient is the result's, exactly.
func TestResidualOpsAreTheirSums(t *testing.T) {
	dev := tensor.CPU()
	rng := newSrc(dev, 6, 6)
	const n, in, hidden, out = 12, 16, 24, 8
	r, x := param(rng, normal, n, out), param(rng, normal, n, in)
	w1, b1 := param(rng, normal, hidden, in), param(rng, normal, hidden)
	w2, b2 := param(rng, normal, out, hidden), param(rng, normal, out)
	wl, bl := param(rng, normal, out, in), param(rng, normal, out)
	ps := []*tensor.Tensor{r, x, w1, b1, w2, b2, wl, bl}
	releasedAfter(t, ps)
	gv := normals(rng, n*out)
	run := func(f func() *tensor.Tensor, dt tensor.DType) ([]float32, [][]float32) {
		y, grads, ydt := stepOf(dev, ps, gv, []int{n, out}, f, dt)
		if ydt != tensor.F32 {
			t.Fatalf("%v: result %v, want r's F32", dt, ydt)
		}
		return y, grads
	}
	for _, c := range []struct {
		name            string
		fused, composed func() *tensor.Tensor
	}{
		{"linear", func() *tensor.Tensor { return ag.AddLinear(r, x, wl, bl) },
			func() *tensor.Tensor { return ag.Add(r, ag.Linear(x, wl, bl)) }},
		{"mlp", func() *tensor.Tensor { return ag.AddMLP(r, x, w1, b1, w2, b2) },
			func() *tensor.Tensor { return ag.Add(r, ag.MLP(x, w1, b1, w2, b2)) }},
	} {
		y32, g32 := run(c.composed, tensor.F32)
		yf, gf := run(c.fused, tensor.F32)
		if e := relErr(yf, y32); e > 1e-6 {
			t.Errorf("%s: output differs from r + the op's by %.3g", c.name, e)
		}
		for i := range gf {
			if e := relErr(gf[i], g32[i]); (gf[i] == nil) != (g32[i] == nil) || e > 1e-6 {
				t.Errorf("%s: gradient %d differs from r + the op's by %.3g", c.name, i, e)
			}
		}
		if !slices.Equal(gf[0], gv) {
			t.Errorf("%s: r's gradient %v, want the result's %v", c.name, gf[0], gv)
		}
		yb, _ := run(c.fused, tensor.BF16)
		yc, _ := run(c.composed, tensor.BF16)
		if eb, ec := relErr(yb, y32), relErr(yc, y32); eb >= ec || ec > 3e-2 {
			t.Errorf("%s under bf16: %.3g from the float32 result, the branch rounded first %.3g: want it closer", c.name, eb, ec)
		}
	}
}

// stepOf runs f, under autocast to dt unless dt is F32, and its backward
// from the gradient gv (of shape, in the result's dtype), and returns the
// result in float32, the gradients of ps (nil where none) and the
// result's dtype.
func stepOf(dev *tensor.Device, ps []*tensor.Tensor, gv []float32, shape []int, f func() *tensor.Tensor, dt tensor.DType) (y []float32, grads [][]float32, ydt tensor.DType) {
	for _, p := range ps {
		p.ZeroGrad()
	}
	dev.WithScope(func() {
		var yt *tensor.Tensor
		if dt == tensor.F32 {
			yt = f()
		} else {
			ag.Autocast(dev, dt, func() { yt = f() })
		}
		ydt = yt.DType()
		ag.Backward(yt, ag.WithGrad(ag.Cast(tensor.FromFloat32(dev, gv, shape...), ydt)))
		y = ag.Cast(yt, tensor.F32).Float32s()
		for _, p := range ps {
			var g []float32
			if p.Grad() != nil {
				g = p.Grad().Float32s()
			}
			grads = append(grads, g)
		}
	})
	return y, grads, ydt
}

// relErr is ‖a − b‖/‖b‖.
func relErr(a, b []float32) float64 {
	var num, den float64
	for i := range a {
		d := float64(a[i] - b[i])
		num, den = num+d*d, den+float64(b[i])*float64(b[i])
	}
	return math.Sqrt(num / den)
}

// releasedAfter releases ps when t ends.
func releasedAfter(t *testing.T, ps []*tensor.Tensor) {
	t.Cleanup(func() {
		for _, p := range ps {
			p.Release()
		}
	})
}

// normals is n draws of N(0, 1) from rng.
func normals(rng src, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// closingOps is the CPU backend whose stoppable operations close stop as
// they begin, as a signal arriving during a long one would, and count
// themselves.
type closingOps struct {
	*cpu.Backend
	stop  chan struct{}
	calls *int
}

func (c closingOps) GemmStoppable(p kernels.GemmParams, e kernels.Epilogue, a, b, cb kernels.Buf, stop <-chan struct{}) bool {
	*c.calls++
	close(c.stop)
	return c.Backend.GemmStoppable(p, e, a, b, cb, stop)
}

func (c closingOps) ClassifierLossStoppable(p kernels.ClassifierParams, h, w, labels, loss, right, dh, dw kernels.Buf, stop <-chan struct{}) bool {
	*c.calls++
	close(c.stop)
	return c.Backend.ClassifierLossStoppable(p, h, w, labels, loss, right, dh, dw, stop)
}

func (c closingOps) AttentionStoppable(p kernels.AttentionParams, q, k, v, o, lse kernels.Buf, stop <-chan struct{}) bool {
	*c.calls++
	close(c.stop)
	return c.Backend.AttentionStoppable(p, q, k, v, o, lse, stop)
}

// closingBackward is the CPU backend whose attention's backward closes
// stop as it begins, and counts itself; its forward runs whole.
type closingBackward struct {
	*cpu.Backend
	stop  chan struct{}
	calls *int
}

func (c closingBackward) AttentionBackwardStoppable(p kernels.AttentionParams, q, k, v, o, lse, do, dq, dk, dv kernels.Buf, stop <-chan struct{}) bool {
	*c.calls++
	close(c.stop)
	return c.Backend.AttentionBackwardStoppable(p, q, k, v, o, lse, do, dq, dk, dv, stop)
}

// TestOpsStopPartWay: inside Interruptible, a product or a classifier loss
// whose stop closes while it runs panics with an error wrapping
// ErrInterrupted that names its shapes, and leaves no tensor behind;
// outside it, they run whole without looking at any stop.
func TestOpsStopPartWay(t *testing.T) {
	for _, c := range []struct {
		name, says string
		inputs     func(dev *tensor.Device) []*tensor.Tensor
		op         func(in []*tensor.Tensor) []*tensor.Tensor
	}{
		{"product", "[300 50] and [50 70]", func(dev *tensor.Device) []*tensor.Tensor {
			return []*tensor.Tensor{tensor.Randn(dev, tensor.F32, 0, 1, 300, 50), tensor.Randn(dev, tensor.F32, 0, 1, 50, 70)}
		}, func(in []*tensor.Tensor) []*tensor.Tensor { return []*tensor.Tensor{ag.MatMul(in[0], in[1])} }},
		{"classifier loss", "input [40 16]", func(dev *tensor.Device) []*tensor.Tensor {
			return []*tensor.Tensor{
				tensor.Randn(dev, tensor.F32, 0, 1, 40, 16).SetRequiresGrad(true),
				tensor.Randn(dev, tensor.F32, 0, 1, 300, 16).SetRequiresGrad(true),
				tensor.FromInt32(dev, make([]int32, 40), 40),
			}
		}, func(in []*tensor.Tensor) []*tensor.Tensor {
			loss, right := ag.ClassifierLoss(in[0], in[1], in[2])
			return []*tensor.Tensor{loss, right}
		}},
		{"causal attention", "causal attention of [2 40 24]", func(dev *tensor.Device) []*tensor.Tensor {
			return []*tensor.Tensor{tensor.Randn(dev, tensor.F32, 0, 1, 2, 40, 24)}
		}, func(in []*tensor.Tensor) []*tensor.Tensor { return []*tensor.Tensor{ag.CausalAttention(in[0], 2)} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			calls := 0
			stop := make(chan struct{})
			dev := tensor.NewDevice(closingOps{cpu.New(), stop, &calls})
			in := c.inputs(dev)
			defer releaseAll(in...)
			releaseAll(c.op(in)...)
			if calls != 0 {
				t.Fatalf("outside Interruptible the stoppable operation ran %d times", calls)
			}
			before := dev.Allocator().Stats().Allocated[memory.All].Current
			err := tensor.Catch(func() { dev.Interruptible(stop, func() { c.op(in) }) })
			if !errors.Is(err, tensor.ErrInterrupted) || !strings.Contains(err.Error(), c.says) || calls != 1 {
				t.Fatalf("stopped part way: %v (the stoppable operation ran %d times)", err, calls)
			}
			if after := dev.Allocator().Stats().Allocated[memory.All].Current; after != before {
				t.Errorf("%d bytes allocated after it stopped, %d before", after, before)
			}
		})
	}
}

// TestAttentionGradientStopsPartWay: inside Interruptible, causal
// attention's backward whose stop closes as it begins fails with an error
// wrapping ErrInterrupted that names its shape, and once the graph is
// released the pool holds what it held before the forward.
func TestAttentionGradientStopsPartWay(t *testing.T) {
	calls := 0
	stop := make(chan struct{})
	dev := tensor.NewDevice(closingBackward{cpu.New(), stop, &calls})
	qkv := tensor.Randn(dev, tensor.F32, 0, 1, 2, 40, 24).Keep().SetRequiresGrad(true)
	defer qkv.Release()
	before := dev.Allocator().Stats().Allocated[memory.All].Current
	err := tensor.Catch(func() {
		dev.Interruptible(stop, func() {
			dev.WithScope(func() { ag.Backward(ag.SumAll(ag.CausalAttention(qkv, 2))) })
		})
	})
	if !errors.Is(err, tensor.ErrInterrupted) || !strings.Contains(err.Error(), "gradient of causal attention of [2 40 24]") || calls != 1 {
		t.Fatalf("stopped part way: %v (the stoppable backward ran %d times)", err, calls)
	}
	qkv.SetGrad(nil)
	if after := dev.Allocator().Stats().Allocated[memory.All].Current; after != before {
		t.Errorf("%d bytes allocated after the backward stopped, %d before", after, before)
	}
}

// BenchmarkStopPartWay reports how long an operation of GPT-2 small's
// size on the CPU takes to stop after its stop closes, 50 ms in
// (ms-after-stop), beside the time it takes whole (ms-whole): the
// classifier loss of 4,096 tokens over GPT-2's vocabulary with its
// gradients, and the product of 4,096×768 by 768×50,257.
//
//	go test ./autograd -run XXX -bench StopPartWay -benchtime 3x
func BenchmarkStopPartWay(b *testing.B) {
	dev := tensor.CPU()
	const n, c, v = 4096, 768, 50257
	for _, op := range []struct {
		name   string
		inputs func() []*tensor.Tensor
		run    func(in []*tensor.Tensor)
	}{
		{"classifier-loss", func() []*tensor.Tensor {
			return []*tensor.Tensor{tensor.Randn(dev, tensor.F32, 0, 1, n, c).SetRequiresGrad(true),
				tensor.Randn(dev, tensor.F32, 0, 0.02, v, c).SetRequiresGrad(true), tensor.FromInt32(dev, make([]int32, n), n)}
		}, func(in []*tensor.Tensor) {
			loss, right := ag.ClassifierLoss(in[0], in[1], in[2])
			releaseAll(loss, right)
		}},
		{"product", func() []*tensor.Tensor {
			return []*tensor.Tensor{tensor.Randn(dev, tensor.F32, 0, 1, n, c), tensor.Randn(dev, tensor.F32, 0, 1, c, v)}
		}, func(in []*tensor.Tensor) { ag.MatMul(in[0], in[1]).Release() }},
	} {
		b.Run(op.name, func(b *testing.B) {
			in := op.inputs()
			defer releaseAll(in...)
			var whole, after time.Duration
			for range b.N {
				t0 := time.Now()
				op.run(in)
				whole += time.Since(t0)
				stop := make(chan struct{})
				closed := make(chan time.Time, 1)
				go func() {
					time.Sleep(50 * time.Millisecond)
					closed <- time.Now()
					close(stop)
				}()
				err := tensor.Catch(func() { dev.Interruptible(stop, func() { op.run(in) }) })
				end := time.Now()
				if !errors.Is(err, tensor.ErrInterrupted) {
					b.Fatalf("not stopped: %v", err)
				}
				after += end.Sub(<-closed)
			}
			b.ReportMetric(float64(whole.Microseconds())/1e3/float64(b.N), "ms-whole")
			b.ReportMetric(float64(after.Microseconds())/1e3/float64(b.N), "ms-after-stop")
		})
	}
}
