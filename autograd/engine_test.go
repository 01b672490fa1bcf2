package autograd_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/kernels/kerneltest"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
)

func allocated(d *tensor.Device) int64 { return d.Allocator().Stats().Allocated[memory.All].Current }

// blockBytes is the pool bytes held by the distinct storages of ts.
func blockBytes(ts ...*tensor.Tensor) int64 {
	seen := map[*memory.Block]bool{}
	var n int64
	for _, t := range ts {
		if t == nil || seen[t.Block()] {
			continue
		}
		seen[t.Block()] = true
		n += t.Block().Size()
	}
	return n
}

func expectPanic(t *testing.T, want string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		if r == nil {
			t.Fatalf("no panic; want %q", want)
		}
		if msg, _ := r.(string); !strings.Contains(msg, want) {
			t.Fatalf("panic %v; want %q", r, want)
		}
	}()
	f()
}

// smallConvNet is a conv net written out op by op, releasing each
// intermediate as soon as the next operation has consumed it, the way nn's
// containers do.
type smallConvNet struct {
	w1, g1, b1, rm1, rv1, w2, b2, lw, lb *tensor.Tensor
}

func newSmallConvNet(dev *tensor.Device, seed uint64) *smallConvNet {
	rng := newSrc(dev, seed, 1)
	p := func(gen func(*rand.Rand) float32, shape ...int) *tensor.Tensor { return param(rng, gen, shape...) }
	n := &smallConvNet{
		w1: p(normal, 6, 1, 3, 3), g1: p(positive, 6), b1: p(normal, 6),
		w2: p(normal, 8, 6, 3, 3), b2: p(normal, 8),
		lw: p(normal, 10, 8), lb: p(normal, 10),
	}
	n.rm1 = tensor.Zeros(dev, tensor.F32, 6).Keep()
	n.rv1 = tensor.Ones(dev, tensor.F32, 6).Keep()
	return n
}

func (n *smallConvNet) params() []*tensor.Tensor {
	return []*tensor.Tensor{n.w1, n.g1, n.b1, n.w2, n.b2, n.lw, n.lb}
}

func (n *smallConvNet) state() []*tensor.Tensor { return append(n.params(), n.rm1, n.rv1) }

func (n *smallConvNet) forward(x *tensor.Tensor) *tensor.Tensor {
	chain := func(h *tensor.Tensor, f func(*tensor.Tensor) *tensor.Tensor) *tensor.Tensor {
		out := f(h)
		h.Release()
		return out
	}
	h := ag.Conv2d(x, n.w1, nil, 1, 1)
	h = chain(h, func(h *tensor.Tensor) *tensor.Tensor {
		return ag.BatchNorm2d(h, n.g1, n.b1, n.rm1, n.rv1, true, 0.1, 1e-5)
	})
	h = chain(h, ag.ReLU)
	h = chain(h, func(h *tensor.Tensor) *tensor.Tensor { return ag.MaxPool2d(h, 2, 2, 0) })
	h = chain(h, func(h *tensor.Tensor) *tensor.Tensor { return ag.Conv2d(h, n.w2, n.b2, 2, 1) })
	h = chain(h, ag.ReLU)
	h = chain(h, ag.GlobalAvgPool)
	h = chain(h, func(h *tensor.Tensor) *tensor.Tensor { return ag.Linear(h, n.lw, n.lb) })
	return h
}

// TestStepMemory is the memory contract of one training step: after Backward
// only the parameters, their gradients and what the caller still holds are
// allocated; after the step's scope, parameters and gradients exactly; after
// releasing the gradients, parameters alone; and 200 steps later, no growth.
func TestStepMemory(t *testing.T) { testStepMemory(t, tensor.CPU()) }

func testStepMemory(t *testing.T, dev *tensor.Device) {
	net := newSmallConvNet(dev, 1)
	defer func() {
		for _, p := range net.state() {
			p.Release()
		}
	}()
	paramBytes := blockBytes(net.state()...)
	if got := allocated(dev); got < paramBytes {
		t.Fatalf("allocated %d < parameter bytes %d", got, paramBytes)
	}
	base := allocated(dev) - paramBytes // whatever other tests left alive on the shared device
	rng := newSrc(dev, 9, 9)
	var afterStep []int64
	var peaks []int64
	for step := 0; step < 200; step++ {
		dev.Allocator().ResetPeak()
		dev.WithScope(func() {
			x := tensor.Randn(dev, tensor.F32, 0, 1, 8, 1, 12, 12)
			lv := make([]int32, 8)
			for i := range lv {
				lv[i] = int32(rng.IntN(10))
			}
			y := tensor.FromInt32(dev, lv, 8)
			logits := net.forward(x)
			loss := ag.CrossEntropy(logits, y)
			ag.Backward(loss)
			if step == 0 {
				grads := make([]*tensor.Tensor, 0)
				for _, p := range net.params() {
					if p.Grad() == nil {
						t.Fatalf("parameter %v has no gradient", p.Shape())
					}
					grads = append(grads, p.Grad())
				}
				want := base + paramBytes + blockBytes(grads...) + blockBytes(x, y, logits, loss)
				if got := allocated(dev); got != want {
					t.Errorf("after Backward: allocated %d, want %d (parameters, gradients, input, labels, logits, loss)", got, want)
				}
			}
		})
		var grads []*tensor.Tensor
		for _, p := range net.params() {
			grads = append(grads, p.Grad())
		}
		if got, want := allocated(dev), base+paramBytes+blockBytes(grads...); got != want {
			t.Fatalf("step %d: after the step's scope: allocated %d, want parameters + gradients = %d", step, got, want)
		}
		for _, p := range net.params() {
			p.ZeroGrad()
		}
		if got, want := allocated(dev), base+paramBytes; got != want {
			t.Fatalf("step %d: after releasing gradients: allocated %d, want parameters alone = %d", step, got, want)
		}
		afterStep = append(afterStep, allocated(dev))
		peaks = append(peaks, dev.Allocator().Stats().Allocated[memory.All].Peak)
	}
	for i := 2; i < len(afterStep); i++ {
		if afterStep[i] != afterStep[1] {
			t.Fatalf("allocated after step %d is %d, after step 1 %d: memory grows", i, afterStep[i], afterStep[1])
		}
		if peaks[i] != peaks[1] {
			t.Fatalf("peak of step %d is %d, of step 1 %d", i, peaks[i], peaks[1])
		}
	}
}

func TestBackwardFreesGraphAndRefusesSecondPass(t *testing.T) {
	testBackwardFreesGraphAndRefusesSecondPass(t, tensor.CPU())
}

func testBackwardFreesGraphAndRefusesSecondPass(t *testing.T, dev *tensor.Device) {
	rng := newSrc(dev, 1, 1)
	w := param(rng, normal, 4, 4)
	defer w.Release()
	base := allocated(dev)
	dev.WithScope(func() {
		x := tensor.Randn(dev, tensor.F32, 0, 1, 3, 4)
		h := ag.Tanh(ag.MatMul(x, w))
		loss := ag.SumAll(ag.Square(h))
		held := allocated(dev)
		ag.Backward(loss)
		// The saved tensors were aliases of tensors this scope still holds:
		// what is new is the gradient of w alone.
		if got, want := allocated(dev), held+blockBytes(w.Grad()); got != want {
			t.Errorf("after Backward: %d allocated, want %d", got, want)
		}
		expectPanic(t, "already freed", func() { ag.Backward(loss) })
	})
	w.ZeroGrad()
	if got := allocated(dev); got != base {
		t.Errorf("after the scope: %d allocated, want %d", got, base)
	}
}

func TestRetainGraphAccumulates(t *testing.T) {
	rng := newSrc(tensor.CPU(), 2, 1)
	w := param(rng, normal, 5)
	defer w.Release()
	w.Device().WithScope(func() {
		loss := ag.SumAll(ag.Mul(w, w))
		ag.Backward(loss, ag.RetainGraph())
		first := w.Grad().Float32s()
		ag.Backward(loss)
		second := w.Grad().Float32s()
		wv := w.Float32s()
		for i := range wv {
			if first[i] != 2*wv[i] || second[i] != 4*wv[i] {
				t.Fatalf("element %d: grads %v then %v, want %v then %v", i, first[i], second[i], 2*wv[i], 4*wv[i])
			}
		}
	})
	w.ZeroGrad()
}

func TestDroppedGraphFreesSavedTensors(t *testing.T) {
	testDroppedGraphFreesSavedTensors(t, tensor.CPU())
}

func testDroppedGraphFreesSavedTensors(t *testing.T, dev *tensor.Device) {
	rng := newSrc(dev, 3, 1)
	w := param(rng, normal, 64, 64)
	defer w.Release()
	base := allocated(dev)
	x := tensor.Randn(dev, tensor.F32, 0, 1, 32, 64).Keep()
	h1 := ag.MatMul(x, w).Keep()
	h2 := ag.Tanh(h1).Keep()
	y := ag.Exp(h2).Keep()
	x.Release()
	h1.Release()
	h2.Release()
	if allocated(dev) == base {
		t.Fatal("nothing saved")
	}
	y.Release() // the whole graph goes: y's node, then the nodes it reached
	if got := allocated(dev); got != base {
		t.Errorf("dropping the graph left %d bytes allocated", got-base)
	}
}

func TestNoGradRecordsNothing(t *testing.T) { testNoGradRecordsNothing(t, tensor.CPU()) }

func testNoGradRecordsNothing(t *testing.T, dev *tensor.Device) {
	rng := newSrc(dev, 4, 1)
	w := param(rng, normal, 3, 3)
	defer w.Release()
	dev.WithScope(func() {
		var y *tensor.Tensor
		ag.NoGrad(dev, func() { y = ag.ReLU(ag.MatMul(w, w)) })
		if y.RequiresGrad() || y.GradNode() != nil {
			t.Error("an operation under NoGrad was recorded")
		}
		if !ag.GradEnabled(dev) {
			t.Error("recording still off after NoGrad")
		}
		expectPanic(t, "does not require grad", func() { ag.Backward(y) })
		x := tensor.Randn(dev, tensor.F32, 0, 1, 3, 3)
		if ag.Add(x, x).RequiresGrad() {
			t.Error("an operation on tensors that need no gradient was recorded")
		}
	})
}

func TestShapeMismatchPanicsNamingBothShapes(t *testing.T) {
	testShapeMismatchPanicsNamingBothShapes(t, tensor.CPU())
}

func testShapeMismatchPanicsNamingBothShapes(t *testing.T, dev *tensor.Device) {
	dev.WithScope(func() {
		a := tensor.Zeros(dev, tensor.F32, 2, 3)
		b := tensor.Zeros(dev, tensor.F32, 4, 5)
		expectPanic(t, "matmul of shapes [2 3] and [4 5]", func() { ag.MatMul(a, b) })
		expectPanic(t, "shapes [2 3] and [4 5] do not broadcast", func() { ag.Add(a, b) })
		expectPanic(t, "conv2d of input [2 3] with weight [4 5]", func() { ag.Conv2d(a, b, nil, 1, 0) })
	})
}

// Misuse panics at the call, naming what is wrong.
func TestBackwardMisusePanics(t *testing.T) { testBackwardMisusePanics(t, tensor.CPU()) }

func testBackwardMisusePanics(t *testing.T, dev *tensor.Device) {
	rng := newSrc(dev, 5, 1)
	w := param(rng, normal, 2, 3)
	defer w.Release()
	var loss *tensor.Tensor
	dev.WithScope(func() {
		y := ag.MatMul(w, ag.Scale(w, 1).View(3, 2)) // 2×2, not a scalar
		expectPanic(t, "Backward of a [2 2] tensor of 4 elements without WithGrad", func() { ag.Backward(y) })
		loss = ag.MeanAll(y)
	})
	// The scope released the loss: Backward says so, not "does not require grad".
	expectPanic(t, "Backward of a released tensor", func() { ag.Backward(loss) })
	dev.WithScope(func() {
		x := tensor.Randn(dev, tensor.F32, 0, 1, 1, 2, 5, 5)
		k := param(rng, normal, 3, 2, 3, 3)
		defer k.Release()
		expectPanic(t, "stride 0", func() { ag.Conv2d(x, k, nil, 0, 1) })
	})
}

// A Backward that runs out of memory half way (the device is full) frees
// the graph it did not reach and the gradients it had made: after the
// panic, only the leaves and the gradients already accumulated are alive.
func TestBackwardOutOfMemoryLeaksNothing(t *testing.T) {
	src := memory.Inject(memory.NewHeapSource(), memory.Faults{})
	dev := tensor.NewDevice(cpu.NewWithAllocator(memory.New(src, memory.Config{Device: "cpu"})))
	leaf := func() *tensor.Tensor {
		return tensor.Randn(dev, tensor.F32, 0, 0.1, 256, 256).Keep().SetRequiresGrad(true)
	}
	w1, w2 := leaf(), leaf()
	defer w1.Release()
	defer w2.Release()
	base := allocated(dev)
	// Activations of 12 MiB take segments of their own (see
	// memory.SegmentSize), so every allocation of the backward reaches the
	// source, and the fault can be put at each.
	for fault := 1; ; fault++ {
		var failed any
		dev.WithScope(func() {
			x := tensor.Randn(dev, tensor.F32, 0, 1, 12288, 256)
			loss := ag.MeanAll(ag.ReLU(ag.MatMul(ag.ReLU(ag.MatMul(x, w1)), w2)))
			dev.Allocator().EmptyCache() // the backward's memory comes from the source
			src.Set(memory.Faults{Every: fault, Burst: 3, Max: 1})
			defer func() { failed = recover() }()
			ag.Backward(loss)
		})
		src.Set(memory.Faults{})
		if failed == nil {
			if fault == 1 {
				t.Fatal("the backward allocated nothing from the source")
			}
			break // the backward made fewer allocations than fault
		}
		if err, ok := failed.(error); !ok || !errors.Is(err, memory.ErrOutOfMemory) {
			t.Fatalf("fault at allocation %d: recovered %v, want an out-of-memory error", fault, failed)
		}
		w1.ZeroGrad()
		w2.ZeroGrad()
		if got := allocated(dev); got != base {
			t.Errorf("fault at allocation %d of the backward: %d bytes allocated after it, %d before the step", fault, got, base)
		}
	}
}

// Modes belong to a handle: NoGrad and Autocast on a session leave the
// device's handle recording in F32, and an operation on a parameter (made on
// the device) and a session's input follows the session.
func TestModesBelongToTheHandle(t *testing.T) { testModesBelongToTheHandle(t, tensor.CPU()) }

func testModesBelongToTheHandle(t *testing.T, dev *tensor.Device) {
	s := dev.Session()
	rng := newSrc(dev, 8, 1)
	w := param(rng, normal, 4, 4)
	defer w.Release()
	ag.NoGrad(s, func() {
		ag.Autocast(s, tensor.F16, func() {
			s.WithScope(func() {
				x := tensor.Randn(s, tensor.F32, 0, 1, 2, 4)
				if ag.ModeOf(w, x) != s {
					t.Error("ModeOf(parameter, session input) is not the session")
				}
				y := ag.MatMul(x, w)
				if y.RequiresGrad() || y.DType() != tensor.F16 || y.Device() != s {
					t.Errorf("on the session: requires grad %v, %v, on the session %v", y.RequiresGrad(), y.DType(), y.Device() == s)
				}
			})
			dev.WithScope(func() {
				y := ag.MatMul(w, w) // the device's handle: recorded, in F32
				if !y.RequiresGrad() || y.DType() != tensor.F32 || !ag.GradEnabled(dev) || ag.AutocastEnabled(dev) {
					t.Error("the session's NoGrad or Autocast reached the device's handle")
				}
			})
		})
	})
}

// An operation on a session that uses tensors made on the device (the
// parameters) leaves its temporaries in the session's scope, never in the
// device's: another goroutine opens and closes that scope, and closing it
// released a session's temporary while the session still used it (seen on
// the H200 as a panic in a serving goroutine: "Release of an already
// released" bias view). Here one goroutine opens and closes scopes on the
// device as fast as it can while another runs operations on a session.
func TestSessionOpsLeaveNothingInTheDevicesScope(t *testing.T) {
	dev := tensor.NewDevice(cpu.New())
	s := dev.Session()
	rng := newSrc(dev, 9, 1)
	w, b := param(rng, normal, 3, 4), param(rng, normal, 3)
	gamma, beta := param(rng, positive, 2), param(rng, normal, 2)
	defer releaseAll(w, b, gamma, beta)
	rm, rv := tensor.Zeros(dev, tensor.F32, 2).Keep(), tensor.Ones(dev, tensor.F32, 2).Keep()
	defer releaseAll(rm, rv)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // the device's scopes, opened and closed as a training loop's are
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				dev.WithScope(func() {})
			}
		}
	}()
	ops := func(n int) {
		ag.NoGrad(s, func() {
			for i := 0; i < n; i++ {
				s.WithScope(func() {
					x := tensor.Randn(s, tensor.F32, 0, 1, 5, 4)
					ag.Linear(x, w, b)              // the bias, added
					ag.Add(ag.Linear(x, w, nil), b) // a parameter in a binary operation
					img := tensor.Randn(s, tensor.F32, 0, 1, 2, 2, 3, 3)
					ag.Autocast(s, tensor.F16, func() { ag.BatchNorm2d(img, gamma, beta, rm, rv, false, 0.1, 1e-5) }) // F32 parameters under autocast
				})
			}
		})
	}
	ops(5000) // beside the racing scopes: a temporary they released under the session would panic
	close(stop)
	<-done
	// And explicitly: with the device's scope held open, the session's
	// scopes give back everything its operations made.
	allocated := func() int64 { return dev.Allocator().Stats().Allocated[memory.All].Current }
	before := allocated()
	var during int64
	dev.WithScope(func() {
		ops(10)
		during = allocated()
	})
	if during != before || allocated() != before {
		t.Errorf("allocated %d bytes before, %d with the session's work done inside a device scope, %d after it closed: the device's scope held the session's temporaries",
			before, during, allocated())
	}
}

func releaseAll(ts ...*tensor.Tensor) {
	for _, t := range ts {
		t.Release()
	}
}

// OnGradReady reports each leaf once a pass, when its gradient from the
// pass is final: a leaf used twice after its second contribution, a
// checkpointed block's parameters from the block's recomputation, and a
// parameter used inside and outside the block by both passes, the later
// one with its final gradient. (The recomputation's own leaves, aliases of
// the block's inputs, are reported too; the test ignores them.)
func TestOnGradReady(t *testing.T) {
	dev := tensor.CPU()
	leaf := func(v ...float32) *tensor.Tensor {
		return tensor.FromFloat32(dev, v, len(v)).Keep().SetRequiresGrad(true)
	}
	a, b, c := leaf(1, 2), leaf(3, 4), leaf(5, 6)
	defer func() { a.Release(); b.Release(); c.Release() }()
	names := map[*tensor.Tensor]string{a: "a", b: "b", c: "c"}
	type report struct {
		grad        string
		recomputing bool
	}
	got := map[string][]report{}
	dev.WithScope(func() {
		// loss = Σ a·b + Σ checkpoint(x ↦ x·c·a)(b) + Σ a:
		// ∂a = b + b·c + 1, ∂b = a + c·a, ∂c = b·a.
		inner := ag.Checkpoint(func(in []*tensor.Tensor) *tensor.Tensor { return ag.Mul(ag.Mul(in[0], c), a) }, b)
		loss := ag.Add(ag.Add(ag.SumAll(ag.Mul(a, b)), ag.SumAll(inner)), ag.SumAll(a))
		ag.Backward(loss, ag.OnGradReady(func(l *tensor.Tensor) {
			if names[l] == "" {
				return // an alias of the block's input
			}
			got[names[l]] = append(got[names[l]], report{fmt.Sprint(l.Grad().Float32s()), ag.Recomputing(dev)})
		}))
	})
	want := map[string]string{"a": "[19 29]", "b": "[6 14]", "c": "[3 8]"}
	counts := map[string]int{"a": 2, "b": 1, "c": 1}
	for name, rs := range got {
		if len(rs) != counts[name] {
			t.Errorf("%s reported %d times (%v), want %d", name, len(rs), rs, counts[name])
			continue
		}
		if last := rs[len(rs)-1]; last.grad != want[name] {
			t.Errorf("%s reported with gradient %s, want its final %s", name, last.grad, want[name])
		}
	}
	if len(got) != 3 {
		t.Errorf("reports %v, want a, b and c", got)
	}
	if rs := got["c"]; len(rs) == 1 && !rs[0].recomputing {
		t.Errorf("c, used only inside the checkpointed block, was not reported from its recomputation")
	}
	if dev.Modes().GradReady != nil {
		t.Errorf("the hook outlived its Backward")
	}
}

// Tensors of two CPU devices do not mix, and the message tells the two
// "cpu"s apart.
func TestTwoDevicesOfOneKindAreToldApart(t *testing.T) {
	a := tensor.FromFloat32(tensor.NewDevice(cpu.New()), []float32{1}, 1)
	b := tensor.FromFloat32(tensor.NewDevice(cpu.New()), []float32{2}, 1)
	defer a.Release()
	defer b.Release()
	defer func() {
		if r := fmt.Sprint(recover()); !strings.Contains(r, "add of tensors on two different cpu devices") {
			t.Errorf("panic %q", r)
		}
	}()
	ag.Add(a, b)
}

// Saved counts each block a graph holds once, for the operation that saved
// it, leaves out what exclude names, and finds nothing once the backward
// freed the graph.
func TestSaved(t *testing.T) {
	dev := tensor.NewDevice(cpu.New())
	w := tensor.Randn(dev, tensor.F32, 0, 1, 64, 64).Keep().SetRequiresGrad(true)
	defer w.Release()
	dev.WithScope(func() {
		x := tensor.Randn(dev, tensor.F32, 0, 1, 32, 64)
		h := ag.MatMul(x, w)                         // saves x and w
		y := ag.Mul(h, h)                            // saves h (one block, twice)
		loss := ag.SumAll(ag.Mul(y, x.View(32, 64))) // saves x alone (y's gradient needs x; x needs none)
		got := map[string]int64{}
		for _, s := range ag.Saved(loss, func(b *memory.Block) bool { return b == w.Block() }) {
			got[s.Op] = s.Bytes
		}
		want := x.Block().Size() + h.Block().Size()
		if got["mul"] < h.Block().Size() || got["matmul"]+got["mul"] != want || len(got) > 2 {
			t.Errorf("saved %v: want x's and h's blocks, %d bytes, once each (w's left out)", got, want)
		}
		ag.Backward(loss)
		if s := ag.Saved(loss, nil); len(s) != 0 {
			t.Errorf("after the backward the graph holds %v", s)
		}
	})
}

// A convolution reading a batch norm's output keeps nothing of its own and
// writes the output again in its backward (Note [a batch norm's output
// written again]): the same bits (its output, the running statistics,
// every gradient) as the same operations with the output kept (a reshape
// between, whose output the convolution then keeps), in fp32 and under F16
// autocast, with one activation fewer saved; with and without a residual
// held elsewhere.
func TestBatchNormOutputWrittenAgain(t *testing.T) {
	for _, amp := range []tensor.DType{0, tensor.F16} {
		for _, residual := range []bool{false, true} {
			t.Run(fmt.Sprint("autocast ", amp, " residual ", residual), func(t *testing.T) {
				dev := tensor.NewDevice(cpu.New())
				type result struct {
					out, rm, rv []float32
					grads       [][]float32
					saved       int64
				}
				run := func(again bool) result {
					dev.Generator().Seed(3)
					x := tensor.Randn(dev, tensor.F32, 0.5, 2, 4, 3, 6, 6).SetRequiresGrad(true).Keep()
					g := tensor.Rand(dev, tensor.F32, 0.5, 1.5, 3).SetRequiresGrad(true).Keep()
					b := tensor.Randn(dev, tensor.F32, 0, 1, 3).SetRequiresGrad(true).Keep()
					w := tensor.Randn(dev, tensor.F32, 0, 0.3, 5, 3, 3, 3).SetRequiresGrad(true).Keep()
					r := tensor.Randn(dev, tensor.F32, 0, 1, 4, 3, 6, 6).SetRequiresGrad(true).Keep()
					rm, rv := tensor.Zeros(dev, tensor.F32, 3).Keep(), tensor.Ones(dev, tensor.F32, 3).Keep()
					all := []*tensor.Tensor{x, g, b, w, r, rm, rv}
					defer func() {
						for _, t := range all {
							t.Release()
						}
					}()
					var res result
					dev.WithScope(func() {
						f := func() *tensor.Tensor {
							h, s := x, (*tensor.Tensor)(nil)
							if amp != 0 {
								h = ag.Cast(x, amp) // a convolution's output under autocast
							}
							if residual {
								s = r
								if amp != 0 {
									s = ag.Cast(r, amp)
								}
								held := s.Alias() // as a block's first convolution holds its input
								defer held.Release()
							}
							y := ag.BatchNormAct(h, s, g, b, rm, rv, true, 0.1, 1e-5, true)
							if !again {
								y = ag.Reshape(y, y.Shape()...)
							}
							return ag.Conv2d(y, w, nil, 1, 1)
						}
						var out *tensor.Tensor
						if amp != 0 {
							ag.Autocast(dev, amp, func() { out = f() })
						} else {
							out = f()
						}
						leaves := map[*memory.Block]bool{x.Block(): true, g.Block(): true, b.Block(): true, w.Block(): true, r.Block(): true}
						for _, s := range ag.Saved(out, func(blk *memory.Block) bool { return leaves[blk] }) {
							res.saved += s.Bytes
						}
						res.out = ag.Cast(out, tensor.F32).Float32s()
						ag.Backward(ag.SumAll(ag.Mul(out, out)))
					})
					res.rm, res.rv = rm.Float32s(), rv.Float32s()
					for _, p := range all[:5] {
						if p.Grad() != nil {
							res.grads = append(res.grads, p.Grad().Float32s())
						}
						p.ZeroGrad()
					}
					return res
				}
				got, want := run(true), run(false)
				if !slices.Equal(got.out, want.out) || !slices.Equal(got.rm, want.rm) || !slices.Equal(got.rv, want.rv) {
					t.Errorf("the output or running statistics differ from the operations' with the output kept")
				}
				sameGradients(t, got.grads, want.grads, "the operations' with the output kept")
				size := activationBytes(amp, 4*3*6*6) // the batch norm's output
				if want.saved-got.saved != size {
					t.Errorf("saved %d bytes written again, %d kept: want one activation of %d bytes fewer", got.saved, want.saved, size)
				}
			})
		}
	}
}

// LayerNormTo's 16-bit output and its gradients are, bit for bit, those of
// LayerNorm followed by a cast, the path it replaces under Autocast.
func TestLayerNormToIsACastOfLayerNorm(t *testing.T) {
	testLayerNormToIsACastOfLayerNorm(t, tensor.CPU())
}

func testLayerNormToIsACastOfLayerNorm(t *testing.T, dev *tensor.Device) {
	for _, dt := range []tensor.DType{tensor.F16, tensor.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			type result struct{ out, dx, dg, db []float32 }
			run := func(fused bool) result {
				dev.Generator().Seed(5)
				x := tensor.Randn(dev, tensor.F32, 1, 2, 3, 37, 96).SetRequiresGrad(true).Keep()
				g := tensor.Rand(dev, tensor.F32, 0.5, 1.5, 96).SetRequiresGrad(true).Keep()
				b := tensor.Randn(dev, tensor.F32, 0, 1, 96).SetRequiresGrad(true).Keep()
				w := tensor.Randn(dev, dt, 0, 1, 3, 37, 96).Keep() // a 16-bit gradient of every element
				defer func() {
					for _, p := range []*tensor.Tensor{x, g, b, w} {
						p.Release()
					}
				}()
				var r result
				dev.WithScope(func() {
					var y *tensor.Tensor
					if fused {
						y = ag.LayerNormTo(x, g, b, 1e-5, dt)
					} else {
						y = ag.Cast(ag.LayerNorm(x, g, b, 1e-5), dt)
					}
					if y.DType() != dt {
						t.Fatalf("output %v, want %v", y.DType(), dt)
					}
					r.out = ag.Cast(y, tensor.F32).Float32s()
					ag.Backward(ag.SumAll(ag.Mul(y, w)))
				})
				r.dx, r.dg, r.db = x.Grad().Float32s(), g.Grad().Float32s(), b.Grad().Float32s()
				return r
			}
			got, want := run(true), run(false)
			for _, c := range []struct {
				name      string
				got, want []float32
			}{{"y", got.out, want.out}, {"dx", got.dx, want.dx}, {"dgamma", got.dg, want.dg}, {"dbeta", got.db, want.db}} {
				if !slices.Equal(c.got, c.want) {
					t.Errorf("%s differs from LayerNorm's followed by a cast", c.name)
				}
			}
		})
	}
}

// TestLayerNormFoldsTheResidualGradient: a residual stream x feeds a layer
// norm and the residual add after it; the norm's backward adds its
// gradient of x into the add's, already gathered (for a leaf, its Grad; for
// an operation's output, the pass's pending gradient), instead of
// returning one to be added. The gradients are bit for bit the unfolded
// graph's, and the backward allocates one tensor of x fewer.
func TestLayerNormFoldsTheResidualGradient(t *testing.T) {
	testLayerNormFoldsTheResidualGradient(t, tensor.CPU())
}

func testLayerNormFoldsTheResidualGradient(t *testing.T, dev *tensor.Device) {
	const rows, cols = 2 * 37, 96
	for _, c := range []struct {
		name string
		dt   tensor.DType // the norm's output
		leaf bool         // x is a leaf, or a scaled leaf
	}{{"f32 leaf", tensor.F32, true}, {"f32 node", tensor.F32, false}, {"bf16 leaf", tensor.BF16, true}, {"bf16 node", tensor.BF16, false}} {
		t.Run(c.name, func(t *testing.T) {
			type result struct {
				dx, dg, db []float32
				allocated  int64 // bytes the backward allocated
			}
			run := func(fold bool) result {
				defer ag.SetFolding(fold)()
				dev.Generator().Seed(9)
				x0 := tensor.Randn(dev, tensor.F32, 1, 2, 2, 37, cols).SetRequiresGrad(true).Keep()
				g := tensor.Rand(dev, tensor.F32, 0.5, 1.5, cols).SetRequiresGrad(true).Keep()
				b := tensor.Randn(dev, tensor.F32, 0, 1, cols).SetRequiresGrad(true).Keep()
				s := tensor.Rand(dev, tensor.F32, 0.5, 1.5, 2, 37, cols).Keep()
				w := tensor.Randn(dev, tensor.F32, 0, 1, 2, 37, cols).Keep()
				defer releaseAll(x0, g, b, s, w)
				var r result
				dev.WithScope(func() {
					x := x0
					if !c.leaf {
						x = ag.Mul(x0, s)
					}
					// The residual add after the norm and a branch (an F32
					// branch's gradient shares the add's storage until the
					// branch's backward has read it).
					y := ag.Mul(ag.LayerNormTo(x, g, b, 1e-5, c.dt), s)
					loss := ag.SumAll(ag.Mul(ag.Add(x, y), w))
					before := dev.Allocator().Stats().Allocated[memory.All].Allocated
					ag.Backward(loss)
					r.allocated = dev.Allocator().Stats().Allocated[memory.All].Allocated - before
				})
				r.dx, r.dg, r.db = x0.Grad().Float32s(), g.Grad().Float32s(), b.Grad().Float32s()
				return r
			}
			got, want := run(true), run(false)
			for _, v := range []struct {
				name      string
				got, want []float32
			}{{"dx", got.dx, want.dx}, {"dgamma", got.dg, want.dg}, {"dbeta", got.db, want.db}} {
				if !slices.Equal(v.got, v.want) {
					t.Errorf("%s differs from the unfolded graph's", v.name)
				}
			}
			if saved := want.allocated - got.allocated; saved != memory.RoundSize(rows*cols*4) {
				t.Errorf("the backward allocated %d bytes folding, %d not: want one f32 %d×%d fewer (%d)",
					got.allocated, want.allocated, rows, cols, memory.RoundSize(rows*cols*4))
			}
		})
	}
}

// TestEmbeddingFoldsTheTiedGradient: a table read by an embedding and by
// the classifier (tied, as GPT-2's) gets the embedding's gradient added
// into the classifier's in place, bit for bit the sum of the two, with one
// table fewer allocated.
func TestEmbeddingFoldsTheTiedGradient(t *testing.T) {
	dev := tensor.CPU()
	const vocab, dim, n = 37, 16, 24
	run := func(fold bool) (grad []float32, allocated int64) {
		defer ag.SetFolding(fold)()
		dev.Generator().Seed(4)
		w := tensor.Randn(dev, tensor.F32, 0, 1, vocab, dim).SetRequiresGrad(true).Keep()
		defer w.Release()
		rng := rand.New(rand.NewPCG(1, 2))
		ids, labels := make([]int32, n), make([]int32, n)
		for i := range ids {
			ids[i], labels[i] = int32(rng.IntN(vocab)), int32(rng.IntN(vocab))
		}
		dev.WithScope(func() {
			h := ag.Embedding(w, tensor.FromInt32(dev, ids, n))
			loss, _ := ag.ClassifierLoss(ag.Mul(h, h), w, tensor.FromInt32(dev, labels, n))
			before := dev.Allocator().Stats().Allocated[memory.All].Allocated
			ag.Backward(loss)
			allocated = dev.Allocator().Stats().Allocated[memory.All].Allocated - before
		})
		return w.Grad().Float32s(), allocated
	}
	got, gotBytes := run(true)
	want, wantBytes := run(false)
	if !slices.Equal(got, want) {
		t.Errorf("the folded gradient differs from the sum of the two")
	}
	if saved := wantBytes - gotBytes; saved != memory.RoundSize(vocab*dim*4) {
		t.Errorf("the backward allocated %d bytes folding, %d not: want one f32 table fewer (%d)", gotBytes, wantBytes, memory.RoundSize(vocab*dim*4))
	}
}

// TestLayerNormRoundsTheGradientForAProduct: under autocast, two blocks of
// a residual stream (a layer norm into bf16, then AddLinear adding to the
// F32 stream): the second norm's backward writes the stream's gradient
// rounded for the first block's products, which cast nothing, and its
// column sums, the first block's bias gradient, which its product does
// not sum; every other gradient is bit for bit the one computed with the
// casts, and the bias's the sums of the F32 gradient, not of its rounding
// (Note [a gradient rounded where it is finished]). The last block's
// gradient comes from no norm: it is cast and summed.
func TestLayerNormRoundsTheGradientForAProduct(t *testing.T) {
	testLayerNormRoundsTheGradientForAProduct(t, cpu.New())
}

func testLayerNormRoundsTheGradientForAProduct(t *testing.T, be kernels.Backend) {
	const rows, cols = 2 * 37, 64
	const summed = 4 // the first block's bias, whose gradient the norm sums
	var gotSums, wantSums int
	run := func(on bool) (grads [][]float32, casts int) {
		defer ag.SetRounding(on)()
		cb := &castCounter{Backend: be, n: rows * cols} // a gradient of the stream's
		dev := tensor.NewDevice(cb)
		dev.Generator().Seed(5)
		x0 := tensor.Randn(dev, tensor.F32, 0, 1, rows, cols).SetRequiresGrad(true).Keep()
		params := []*tensor.Tensor{x0}
		for range 2 {
			params = append(params,
				tensor.Rand(dev, tensor.F32, 0.5, 1.5, cols).SetRequiresGrad(true).Keep(), // gain
				tensor.Randn(dev, tensor.F32, 0, 1, cols).SetRequiresGrad(true).Keep(),    // bias
				tensor.Randn(dev, tensor.F32, 0, 0.2, cols, cols).SetRequiresGrad(true).Keep(),
				tensor.Randn(dev, tensor.F32, 0, 1, cols).SetRequiresGrad(true).Keep())
		}
		w := tensor.Randn(dev, tensor.F32, 0, 1, rows, cols).Keep()
		defer releaseAll(append(params, w)...)
		dev.WithScope(func() {
			x := x0
			ag.Autocast(dev, tensor.BF16, func() {
				for b := range 2 {
					p := params[1+4*b:]
					x = ag.AddLinear(x, ag.LayerNormTo(x, p[0], p[1], 1e-5, tensor.BF16), p[2], p[3])
				}
			})
			loss := ag.SumAll(ag.Mul(x, w))
			cb.casts, cb.biasSums = 0, 0
			ag.Backward(loss)
			casts = cb.casts
			if on {
				gotSums = cb.biasSums
			} else {
				wantSums = cb.biasSums
			}
		})
		for _, p := range params {
			grads = append(grads, p.Grad().Float32s())
		}
		return grads, casts
	}
	got, gotCasts := run(true)
	want, wantCasts := run(false)
	for i := range got {
		if i == summed {
			if d := relErr(got[i], want[i]); d == 0 || d > 1e-2 {
				t.Errorf("the bias gradient summed from the f32 gradient is %.2g from the sums of its rounding: want a difference, below 1e-2", d)
			}
			continue
		}
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("gradient %d differs from the one computed with casts", i)
		}
	}
	if gotCasts != 1 || wantCasts != 2 {
		t.Errorf("the backward cast the f32 stream's gradient to bf16 %d times rounding, %d not: want 1 and 2", gotCasts, wantCasts)
	}
	if gotSums != 1 || wantSums != 2 {
		t.Errorf("%d products summed their bias's gradient rounding, %d not: want 1 and 2", gotSums, wantSums)
	}
}

// TestClassifierHandsOnItsGradients: the classifier's backward scales the
// gradients its forward made by the loss's gradient, and with Backward's
// implied one (the loss the root, the graph freed as it goes) hands them
// on as they are: no multiplication, no table-sized allocation, the same
// bits. A retained graph keeps them for the next pass. Made inside
// LossScaled for the loss times a GradScaler's scale, they are handed on
// when that product is the root, and scaled by the loss's gradient over
// the scale otherwise.
func TestClassifierHandsOnItsGradients(t *testing.T) {
	const vocab, dim, n = 37, 16, 24
	type result struct {
		dw, dh    []float32
		muls      int
		allocated int64
	}
	run := func(scale float32, backward func(loss, scale *tensor.Tensor)) result {
		mc := &binaryCounter{Backend: cpu.New(), op: kernels.Mul}
		dev := tensor.NewDevice(mc)
		dev.Generator().Seed(4)
		w := tensor.Randn(dev, tensor.F32, 0, 1, vocab, dim).SetRequiresGrad(true).Keep()
		h := tensor.Randn(dev, tensor.F32, 0, 1, n, dim).SetRequiresGrad(true).Keep()
		defer releaseAll(w, h)
		rng := rand.New(rand.NewPCG(1, 2))
		labels := make([]int32, n)
		for i := range labels {
			labels[i] = int32(rng.IntN(vocab))
		}
		var r result
		dev.WithScope(func() {
			var loss, s *tensor.Tensor
			forward := func() { loss, _ = ag.ClassifierLoss(h, w, tensor.FromInt32(dev, labels, n)) }
			if scale != 0 {
				s = tensor.FromFloat32(dev, []float32{scale}, 1)
				ag.LossScaled(dev, s, forward)
			} else {
				forward()
			}
			before := dev.Allocator().Stats().Allocated[memory.All].Allocated
			mc.n = 0
			backward(loss, s)
			r.allocated = dev.Allocator().Stats().Allocated[memory.All].Allocated - before
		})
		r.dw, r.dh, r.muls = w.Grad().Float32s(), h.Grad().Float32s(), mc.n
		return r
	}
	implied := run(0, func(loss, _ *tensor.Tensor) { ag.Backward(loss) })
	for _, tc := range []struct {
		name     string
		scale    float32 // LossScaled's (0: none)
		backward func(loss, scale *tensor.Tensor)
		times    float32 // the gradients, as multiples of the implied pass's
		muls     int
	}{
		{"explicit one", 0, func(loss, _ *tensor.Tensor) {
			ag.Backward(loss, ag.WithGrad(tensor.Ones(loss.Device(), tensor.F32, 1)))
		}, 1, 2},
		{"scaled", 0, func(loss, _ *tensor.Tensor) { ag.Backward(ag.Scale(loss, 2)) }, 2, 2},
		{"retained, twice", 0, func(loss, _ *tensor.Tensor) {
			ag.Backward(loss, ag.RetainGraph())
			ag.Backward(loss)
		}, 2, 2},
		// The loss times the scale is one multiplication; the backward
		// makes none, or, with the root's gradient a half, the product's
		// and the classifier's two.
		{"loss-scaled", 1024, func(loss, s *tensor.Tensor) { ag.Backward(ag.Mul(loss, s)) }, 1024, 1},
		{"loss-scaled, half a batch", 1024, func(loss, s *tensor.Tensor) { ag.Backward(ag.Scale(ag.Mul(loss, s), 0.5)) }, 512, 1 + 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := run(tc.scale, tc.backward)
			if got.muls != tc.muls {
				t.Errorf("%d multiplications, want %d", got.muls, tc.muls)
			}
			for _, c := range []struct {
				name      string
				got, want []float32
			}{{"w", got.dw, implied.dw}, {"h", got.dh, implied.dh}} {
				for i := range c.want {
					if c.got[i] != tc.times*c.want[i] {
						t.Fatalf("%s's gradient [%d] = %v, want %v × the implied pass's %v", c.name, i, c.got[i], tc.times, c.want[i])
					}
				}
			}
			if tc.name == "explicit one" && got.allocated-implied.allocated < memory.RoundSize(vocab*dim*4) {
				t.Errorf("the implied pass allocated %d bytes, the explicit one %d: want at least a table fewer", implied.allocated, got.allocated)
			}
		})
	}
	if implied.muls != 0 {
		t.Errorf("the implied pass multiplied %d times, want none", implied.muls)
	}
}

// binaryCounter counts the backend's binaries of one op.
type binaryCounter struct {
	kernels.Backend
	op kernels.BinaryOp
	n  int
}

func (c *binaryCounter) Binary(op kernels.BinaryOp, y, a, b kernels.Buf, bc kernels.Broadcast) {
	if op == c.op {
		c.n++
	}
	c.Backend.Binary(op, y, a, b, bc)
}

// TestUnread: in a checkpoint's recomputation the last Unread's addition
// is left unwritten, an earlier one (a block whose result the next reads)
// is computed, and the gradients are those of the unchecked function bit
// for bit; an op that saves an unwritten value panics (Note [what a
// recomputation skips]).
func TestUnread(t *testing.T) {
	// block is h·c + h, its sum marked Unread.
	block := func(h, c *tensor.Tensor) *tensor.Tensor {
		return ag.Unread(ag.ModeOf(h), func() *tensor.Tensor { return ag.Add(ag.Mul(h, c), h) })
	}
	for _, tc := range []struct {
		name  string
		fn    func(x, c *tensor.Tensor) *tensor.Tensor
		extra int // additions of the checkpointed step beyond the unchecked one's: those recomputed
		panic string
	}{
		{"one block", block, 0, ""},
		{"two blocks", func(x, c *tensor.Tensor) *tensor.Tensor { return block(block(x, c), c) }, 1, ""},
		{"a product after the sum", func(x, c *tensor.Tensor) *tensor.Tensor {
			return ag.Unread(ag.ModeOf(x), func() *tensor.Tensor { return ag.Mul(ag.Add(x, c), c) })
		}, 0, "mul saves f32 [5], the result of add, which a checkpoint's recomputation left unwritten"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cb := &binaryCounter{Backend: cpu.New(), op: kernels.Add}
			dev := tensor.NewDevice(cb)
			rng := rand.New(rand.NewPCG(3, 4))
			vals := func() []float32 {
				v := make([]float32, 5)
				for i := range v {
					v[i] = float32(rng.NormFloat64())
				}
				return v
			}
			xv, cv, gv := vals(), vals(), vals()
			run := func(checkpoint bool) (x, c []float32) {
				xt := tensor.FromFloat32(dev, xv, 5).Keep().SetRequiresGrad(true)
				ct := tensor.FromFloat32(dev, cv, 5).Keep().SetRequiresGrad(true)
				defer xt.Release()
				defer ct.Release()
				dev.WithScope(func() {
					var y *tensor.Tensor
					if checkpoint {
						y = ag.Checkpoint(func(in []*tensor.Tensor) *tensor.Tensor { return tc.fn(in[0], ct) }, xt)
					} else {
						y = tc.fn(xt, ct)
					}
					ag.Backward(y, ag.WithGrad(tensor.FromFloat32(dev, gv, 5)))
				})
				return xt.Grad().Float32s(), ct.Grad().Float32s()
			}
			if tc.panic != "" {
				expectPanic(t, tc.panic, func() { run(true) })
				return
			}
			x0, c0 := run(false)
			plain := cb.n
			x1, c1 := run(true)
			if !slices.Equal(x0, x1) || !slices.Equal(c0, c1) {
				t.Errorf("checkpointed gradients %v, %v; unchecked %v, %v", x1, c1, x0, c0)
			}
			if extra := cb.n - 2*plain; extra != tc.extra {
				t.Errorf("%d additions recomputed, want %d", extra, tc.extra)
			}
		})
	}
}

// TestCheckpointLight: a light checkpoint keeps the results of the
// Keepable products of its function (Linear, and AddLinear with its
// residual) and runs neither again; a plain checkpoint keeps none and
// recomputes both; the gradients of all three are the unchecked
// function's bit for bit, in F32 and under BF16 autocast; what the light
// one holds between forward and backward beyond the plain one's is exactly
// the two products' results; and a recomputation that runs another product
// where one was kept panics naming both shapes.
func TestCheckpointLight(t *testing.T) {
	const n, in, hid = 6, 8, 16
	for _, amp := range []tensor.DType{0, tensor.BF16} {
		name := "f32"
		if amp != 0 {
			name = amp.String() + " autocast"
		}
		t.Run(name, func(t *testing.T) {
			gc := &kerneltest.Products{Backend: cpu.New()}
			dev := tensor.NewDevice(gc)
			dev.Generator().Seed(5)
			param := func(shape ...int) *tensor.Tensor {
				return tensor.Randn(dev, tensor.F32, 0, 0.5, shape...).Keep().SetRequiresGrad(true)
			}
			x, w1, b1, w2, b2 := param(n, in), param(hid, in), param(hid), param(in, hid), param(in)
			params := []*tensor.Tensor{x, w1, b1, w2, b2}
			defer releaseAll(params...)
			// fn is x + (h·h)·w2ᵀ + b2 squared, h = x·w1ᵀ + b1: both
			// products keepable, each result read by a later op's backward.
			fn := func(in []*tensor.Tensor) *tensor.Tensor {
				d := ag.ModeOf(in[0])
				h := ag.Keepable(d, func() *tensor.Tensor { return ag.Linear(in[0], w1, b1) })
				a := ag.Mul(h, h)
				h.Release()
				y := ag.Keepable(d, func() *tensor.Tensor { return ag.AddLinear(in[0], a, w2, b2) })
				a.Release()
				defer y.Release()
				return ag.Mul(y, y)
			}
			type result struct {
				grads    [][]float32
				products int   // in the backward
				held     int64 // between the forward and the backward
			}
			run := func(checkpoint func(func([]*tensor.Tensor) *tensor.Tensor, ...*tensor.Tensor) *tensor.Tensor) (r result) {
				dev.WithScope(func() {
					before := allocated(dev)
					var out *tensor.Tensor
					forward := func() { out = fn([]*tensor.Tensor{x}) }
					if checkpoint != nil {
						forward = func() { out = checkpoint(fn, x) }
					}
					if amp != 0 {
						ag.Autocast(dev, amp, forward)
					} else {
						forward()
					}
					r.held = allocated(dev) - before - out.Block().Size()
					gc.N = 0
					ag.Backward(ag.SumAll(out))
					r.products = gc.N
				})
				for _, p := range params {
					r.grads = append(r.grads, p.Grad().Float32s())
					p.SetGrad(nil)
				}
				return r
			}
			plain, full, light := run(nil), run(ag.Checkpoint), run(ag.CheckpointLight)
			for i := range plain.grads {
				if !slices.Equal(full.grads[i], plain.grads[i]) || !slices.Equal(light.grads[i], plain.grads[i]) {
					t.Errorf("gradient %d: checkpointed %v, lightly %v, unchecked %v", i, full.grads[i], light.grads[i], plain.grads[i])
				}
			}
			if full.products != plain.products+2 || light.products != plain.products {
				t.Errorf("backward products: %d unchecked, %d checkpointed, %d lightly: want the checkpoint's two more, the light one's none", plain.products, full.products, light.products)
			}
			dt := tensor.F32
			if amp != 0 {
				dt = amp
			}
			// h in the products' dtype, y in its residual's (F32).
			want := memory.RoundSize(int64(n*hid*dt.Size())) + memory.RoundSize(int64(n*in*4))
			if got := light.held - full.held; got != want {
				t.Errorf("the light checkpoint holds %d bytes more than the plain one between forward and backward, want %d (its two products' results)", got, want)
			}
		})
	}
	t.Run("another product in the recomputation", func(t *testing.T) {
		dev := tensor.CPU()
		x := tensor.Randn(dev, tensor.F32, 0, 1, 3, 4).Keep().SetRequiresGrad(true)
		w := tensor.Randn(dev, tensor.F32, 0, 1, 5, 4).Keep().SetRequiresGrad(true)
		v := tensor.Randn(dev, tensor.F32, 0, 1, 2, 4).Keep().SetRequiresGrad(true)
		defer releaseAll(x, w, v)
		runs := 0
		dev.WithScope(func() {
			y := ag.CheckpointLight(func(in []*tensor.Tensor) *tensor.Tensor {
				runs++
				if runs > 1 {
					w = v
				}
				return ag.Keepable(ag.ModeOf(in[0]), func() *tensor.Tensor { return ag.Linear(in[0], w, nil) })
			}, x)
			expectPanic(t, "found a kept f32 [3 5]", func() { ag.Backward(ag.SumAll(y)) })
		})
	})
}

// TestCheckpointFreesItsOutputAndGradient: a checkpoint's recomputation
// frees the function's output and its gradient after the function's last
// op, and copies neither: Backward of exp(exp(x)) checkpointed holds at
// most four tensors of x's size beyond what lived before it (the output's
// gradient, the recomputed exp(x) and exp(exp(x)), and the gradient of
// exp(x), while the last op's backward runs), where copying the gradient
// and keeping the output made six.
func TestCheckpointFreesItsOutputAndGradient(t *testing.T) {
	const n = 1 << 16 // 256 KiB of F32: large-pool blocks of exactly that size
	dev := tensor.NewDevice(cpu.New())
	a := dev.Allocator()
	x := tensor.Rand(dev, tensor.F32, 0, 1, n).Keep().SetRequiresGrad(true)
	defer x.Release()
	dev.WithScope(func() {
		y := ag.Checkpoint(func(in []*tensor.Tensor) *tensor.Tensor { return ag.Exp(ag.Exp(in[0])) }, x)
		g := tensor.Rand(dev, tensor.F32, 0, 1, n)
		before := a.Stats().Allocated[memory.All].Current
		a.WindowPeak()
		ag.Backward(y, ag.WithGrad(g))
		peak, _ := a.WindowPeak()
		if got, want := peak-before, int64(4*4*n); got != want {
			t.Errorf("Backward's peak is %d bytes above what lived before it, want %d (four tensors of x's size)", got, want)
		}
	})
	if left := a.Stats().Allocated[memory.All].Current - x.Block().Size() - x.Grad().Block().Size(); left != 0 {
		t.Errorf("%d bytes left beside x and its gradient", left)
	}
}

// TestTraceRoles: a traced backward through a checkpointed attention says
// what each buffer held: the attention's output and log-sum-exps kept by
// the checkpoint for its recomputation (Note [what a checkpoint keeps]),
// the gradients by the node whose backward made them, and the phases of
// each node's backward.
func TestTraceRoles(t *testing.T) {
	dev := tensor.NewDevice(cpu.New())
	a := dev.Allocator()
	qkv := tensor.Randn(dev, tensor.F32, 0, 1, 2, 8, 48).Keep().SetRequiresGrad(true)
	defer qkv.Release()
	a.StartTrace()
	dev.WithScope(func() {
		y := ag.Checkpoint(func(in []*tensor.Tensor) *tensor.Tensor { return ag.CausalAttention(in[0], 2) }, qkv)
		ag.Backward(ag.SumAll(y))
	})
	qkv.SetGrad(nil)
	tr, err := a.StopTrace()
	if err != nil {
		t.Fatal(err)
	}
	roles := map[memory.Role]int{}
	for _, b := range tr.Buffers {
		roles[b.Role]++
	}
	t.Logf("roles %v, phases %v", roles, tr.Phases)
	kept := memory.Role{Category: memory.Activation, Op: "checkpoint"}
	grad := memory.Role{Category: memory.Gradient, Op: "sum"}
	if roles[kept] != 2 || roles[grad] != 1 {
		t.Errorf("roles %v: want the output and log-sum-exps kept by the checkpoint, and sum's gradient", roles)
	}
	phases := map[string]bool{}
	for _, p := range tr.Phases {
		phases[p.Name] = true
	}
	// A phase with no event of its own gives way to the next (the
	// checkpoint's backward, then its recomputation, which recalls what it
	// kept and allocates nothing).
	for _, want := range []string{"the backward of sum", "the backward of causal_attention in a checkpoint's recomputation"} {
		if !phases[want] {
			t.Errorf("no phase %q in %v", want, tr.Phases)
		}
	}
}

// A convolution whose input a batch norm writes again, backward after an
// earlier Backward freed the batch norm's graph through another path,
// panics naming it instead of reading released tensors.
func TestWrittenAgainAfterItsGraphWasFreed(t *testing.T) {
	dev := tensor.NewDevice(cpu.New())
	x := tensor.Randn(dev, tensor.F32, 0, 1, 2, 3, 4, 4).Keep().SetRequiresGrad(true)
	g := tensor.Rand(dev, tensor.F32, 0.5, 1.5, 3).Keep().SetRequiresGrad(true)
	b := tensor.Randn(dev, tensor.F32, 0, 0.1, 3).Keep().SetRequiresGrad(true)
	w := tensor.Randn(dev, tensor.F32, 0, 0.1, 3, 3, 3, 3).Keep().SetRequiresGrad(true)
	rm, rv := tensor.Zeros(dev, tensor.F32, 3).Keep(), tensor.Ones(dev, tensor.F32, 3).Keep()
	defer releaseAll(x, g, b, w, rm, rv)
	dev.WithScope(func() {
		y := ag.BatchNormAct(x, nil, g, b, rm, rv, true, 0.1, 1e-5, true)
		out := ag.Conv2d(y, w, nil, 1, 1)
		ag.Backward(ag.SumAll(y))
		expectPanic(t, "reads the output of batch_norm, whose graph an earlier Backward already freed", func() { ag.Backward(ag.SumAll(out)) })
	})
}

// TestConvFreesBatchNormOutputFirst: a convolution's backward frees the
// batch norm output it writes again (for its filter gradient) before its
// input gradient exists (Note [a batch norm's output written again]): in
// the trace of its backward the two buffers of x's size that it allocates
// are never live at once.
func TestConvFreesBatchNormOutputFirst(t *testing.T) {
	dev := tensor.NewDevice(cpu.New())
	a := dev.Allocator()
	const n, c, hw = 4, 8, 16
	x := tensor.Randn(dev, tensor.F32, 0, 1, n, c, hw, hw).Keep().SetRequiresGrad(true)
	g := tensor.Rand(dev, tensor.F32, 0.5, 1.5, c).Keep().SetRequiresGrad(true)
	b := tensor.Randn(dev, tensor.F32, 0, 0.1, c).Keep().SetRequiresGrad(true)
	w := tensor.Randn(dev, tensor.F32, 0, 0.1, c, c, 3, 3).Keep().SetRequiresGrad(true)
	rm, rv := tensor.Zeros(dev, tensor.F32, c).Keep(), tensor.Ones(dev, tensor.F32, c).Keep()
	defer releaseAll(x, g, b, w, rm, rv)
	size := x.Block().Size()
	a.StartTrace()
	dev.WithScope(func() {
		y := ag.Conv2d(ag.BatchNormAct(x, nil, g, b, rm, rv, true, 0.1, 1e-5, true), w, nil, 1, 1)
		ag.Backward(y, ag.WithGrad(tensor.Randn(dev, tensor.F32, 0, 1, y.Shape()...)))
	})
	for _, p := range []*tensor.Tensor{x, g, b, w} {
		p.SetGrad(nil)
	}
	tr, err := a.StopTrace()
	if err != nil {
		t.Fatal(err)
	}
	var mine []memory.TraceBuffer // of x's size, made by the convolution's backward
	for _, buf := range tr.Buffers {
		if buf.Sizes[0] == size && tr.PhaseAt(buf.Alloc) == "the backward of conv2d" {
			mine = append(mine, buf)
		}
	}
	if len(mine) != 2 || mine[0].Free > mine[1].Alloc {
		t.Errorf("the backward's buffers of %d bytes: %+v; want the batch norm's output, freed before the input gradient is allocated", size, mine)
	}
}

// A network's first convolution, of data no gradient flows to, lets the
// batch norm that reads its output write it again instead of keeping it
// (Note [a convolution of the data written again]): the same bits (the
// output, every parameter's gradient) as with the data requiring a
// gradient (then the batch norm keeps its input), in fp32 and under F16
// autocast, with the convolution's output no longer saved.
func TestConvOfTheDataWrittenAgain(t *testing.T) {
	for _, amp := range []tensor.DType{0, tensor.F16} {
		t.Run(fmt.Sprint("autocast ", amp), func(t *testing.T) {
			dev := tensor.NewDevice(cpu.New())
			type result struct {
				out   []float32
				grads [][]float32
				saved map[string]int64
			}
			run := func(data bool) result {
				dev.Generator().Seed(5)
				x := tensor.Randn(dev, tensor.F32, 0.5, 2, 4, 3, 6, 6).SetRequiresGrad(!data).Keep()
				w0 := tensor.Randn(dev, tensor.F32, 0, 0.3, 5, 3, 3, 3).SetRequiresGrad(true).Keep()
				b0 := tensor.Randn(dev, tensor.F32, 0, 0.1, 5).SetRequiresGrad(true).Keep()
				g := tensor.Rand(dev, tensor.F32, 0.5, 1.5, 5).SetRequiresGrad(true).Keep()
				b := tensor.Randn(dev, tensor.F32, 0, 1, 5).SetRequiresGrad(true).Keep()
				w := tensor.Randn(dev, tensor.F32, 0, 0.3, 4, 5, 3, 3).SetRequiresGrad(true).Keep()
				rm, rv := tensor.Zeros(dev, tensor.F32, 5).Keep(), tensor.Ones(dev, tensor.F32, 5).Keep()
				params := []*tensor.Tensor{w0, b0, g, b, w}
				defer releaseAll(append(params, x, rm, rv)...)
				res := result{saved: map[string]int64{}}
				dev.WithScope(func() {
					f := func() *tensor.Tensor {
						h := ag.BatchNormAct(ag.Conv2d(x, w0, b0, 1, 1), nil, g, b, rm, rv, true, 0.1, 1e-5, true)
						return ag.Conv2d(h, w, nil, 1, 1)
					}
					var out *tensor.Tensor
					if amp != 0 {
						ag.Autocast(dev, amp, func() { out = f() })
					} else {
						out = f()
					}
					leaves := map[*memory.Block]bool{x.Block(): true}
					for _, p := range params {
						leaves[p.Block()] = true
					}
					for _, s := range ag.Saved(out, func(blk *memory.Block) bool { return leaves[blk] }) {
						res.saved[s.Op] += s.Bytes
					}
					res.out = ag.Cast(out, tensor.F32).Float32s()
					ag.Backward(ag.SumAll(ag.Mul(out, out)))
				})
				for _, p := range params {
					res.grads = append(res.grads, p.Grad().Float32s())
				}
				x.ZeroGrad()
				return res
			}
			got, want := run(true), run(false)
			if !slices.Equal(got.out, want.out) {
				t.Errorf("the output differs from the one with the data requiring a gradient")
			}
			sameGradients(t, got.grads, want.grads, "the one with the data requiring a gradient")
			size := activationBytes(amp, 4*5*6*6) // the first convolution's output
			if want.saved["batch_norm"]-got.saved["batch_norm"] != size {
				t.Errorf("the batch norm keeps %d bytes after a convolution of the data, %d otherwise: want its input of %d bytes fewer",
					got.saved["batch_norm"], want.saved["batch_norm"], size)
			}
		})
	}
}

// TestCheckpointInputReadAgain: a checkpointed residual block whose input
// a batch norm writes again holds that input only around its two reads in
// the recomputation (Note [a checkpoint's input read again]): in the trace
// of the backward, no buffer of the input's size made by the
// recomputation's start is live when the block's second convolution's
// backward runs, and the gradients are those of the block not
// checkpointed, bit for bit.
func TestCheckpointInputReadAgain(t *testing.T) {
	const n, c, hw = 4, 8, 16
	dev := tensor.NewDevice(cpu.New())
	a := dev.Allocator()
	var leaves []*tensor.Tensor
	param := func(t *tensor.Tensor) *tensor.Tensor {
		t.SetRequiresGrad(true).Keep()
		leaves = append(leaves, t)
		return t
	}
	dev.Generator().Seed(11)
	x := param(tensor.Randn(dev, tensor.F32, 0, 1, n, c, hw, hw))
	var gs, bs, ws []*tensor.Tensor
	for range 3 {
		gs = append(gs, param(tensor.Rand(dev, tensor.F32, 0.5, 1.5, c)))
		bs = append(bs, param(tensor.Randn(dev, tensor.F32, 0, 0.1, c)))
		ws = append(ws, param(tensor.Randn(dev, tensor.F32, 0, 0.1, c, c, 3, 3)))
	}
	stats := func() (*tensor.Tensor, *tensor.Tensor) {
		return tensor.Zeros(dev, tensor.F32, c), tensor.Ones(dev, tensor.F32, c)
	}
	block := func(in []*tensor.Tensor) *tensor.Tensor {
		rm1, rv1 := stats()
		rm2, rv2 := stats()
		h := ag.BatchNormAct(ag.Conv2d(in[0], ws[1], nil, 1, 1), nil, gs[1], bs[1], rm1, rv1, true, 0.1, 1e-5, true)
		return ag.BatchNormAct(ag.Conv2d(h, ws[2], nil, 1, 1), in[0], gs[2], bs[2], rm2, rv2, true, 0.1, 1e-5, true)
	}
	run := func(checkpointed bool) ([][]float32, *memory.Trace) {
		a.StartTrace()
		dev.WithScope(func() {
			rm, rv := stats()
			in := ag.BatchNormAct(ag.Conv2d(x, ws[0], nil, 1, 1), nil, gs[0], bs[0], rm, rv, true, 0.1, 1e-5, true)
			var y *tensor.Tensor
			if checkpointed {
				y = ag.Checkpoint(block, in)
			} else {
				y = block([]*tensor.Tensor{in})
			}
			ag.Backward(y, ag.WithGrad(tensor.Randn(dev, tensor.F32, 0, 1, y.Shape()...)))
		})
		var grads [][]float32
		for _, p := range leaves {
			grads = append(grads, p.Grad().Float32s())
			p.SetGrad(nil)
		}
		tr, err := a.StopTrace()
		if err != nil {
			t.Fatal(err)
		}
		return grads, tr
	}
	defer releaseAll(leaves...)
	dev.Generator().Seed(12)
	want, _ := run(false)
	dev.Generator().Seed(12)
	got, tr := run(true)
	sameGradients(t, got, want, "the block's not checkpointed")
	size := x.Block().Size()
	var inputs []memory.TraceBuffer
	convBackward := -1 // the first event of the recomputed block's second convolution's backward
	for _, p := range tr.Phases {
		if p.Name == "the backward of conv2d in a checkpoint's recomputation" {
			convBackward = p.Event
			break
		}
	}
	for _, buf := range tr.Buffers {
		if buf.Sizes[0] == size && tr.PhaseAt(buf.Alloc) == "a checkpoint's recomputation" {
			inputs = append(inputs, buf)
		}
	}
	if convBackward < 0 || len(inputs) == 0 {
		t.Fatalf("no recomputed convolution's backward (%v) or no buffer of the input's size made by the recomputation", tr.Phases)
	}
	if in := inputs[0]; in.Alloc <= convBackward && convBackward < in.Free {
		t.Errorf("the recomputation's copy of the input (events %d to %d) is live when the second convolution's backward starts (%d)", in.Alloc, in.Free, convBackward)
	}
}

// sameGradients checks that got holds the same gradients as want, bit for
// bit; against names where want came from.
func sameGradients(t *testing.T, got, want [][]float32, against string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d gradients, %d with %s", len(got), len(want), against)
	}
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("gradient %d differs from %s", i, against)
		}
	}
}

// activationBytes is the pool's size for n values in F32, or in F16 under
// autocast amp.
func activationBytes(amp tensor.DType, n int64) int64 {
	if amp != 0 {
		return memory.RoundSize(2 * n)
	}
	return memory.RoundSize(4 * n)
}

// TestSessionsBackwardIntoOneParameter: sessions whose backward passes
// add into one parameter at once lose nothing: the gradient is the sum of
// every pass's (whole numbers, so the order of the additions does not
// change it).
func TestSessionsBackwardIntoOneParameter(t *testing.T) {
	dev := tensor.NewDevice(cpu.New())
	const n, goroutines, passes = 4096, 4, 50
	w := tensor.Ones(dev, tensor.F32, n).Keep().SetRequiresGrad(true)
	defer w.Release()
	start := make(chan struct{})
	done := make(chan struct{})
	for g := 0; g < goroutines; g++ {
		go func() {
			defer func() { done <- struct{}{} }()
			s := dev.Session()
			<-start
			for p := 0; p < passes; p++ {
				s.WithScope(func() {
					x := tensor.Full(s, tensor.F32, float32(g+1), n) // d(sum(w*x))/dw = x
					ag.Backward(ag.SumAll(ag.Mul(w, x)))
				})
			}
		}()
	}
	close(start)
	for g := 0; g < goroutines; g++ {
		<-done
	}
	want := float32(0)
	for g := 0; g < goroutines; g++ {
		want += float32(passes * (g + 1))
	}
	wrong := 0
	for _, v := range w.Grad().Float32s() {
		if v != want {
			wrong++
		}
	}
	if wrong > 0 {
		t.Errorf("%d of %d elements of the gradient are not %v", wrong, n, want)
	}
}

// TestNilOperandsAreNamed: an operation given a nil tensor panics naming
// the operation and the operand, not with a nil dereference.
func TestNilOperandsAreNamed(t *testing.T) {
	dev := tensor.NewDevice(cpu.New())
	w := tensor.Ones(dev, tensor.F32, 3, 4)
	defer w.Release()
	for _, c := range []struct {
		name string
		f    func()
		want string
	}{
		{"MatMul", func() { ag.MatMul(nil, w) }, "autograd: MatMul: operand 1 of 2 is nil"},
		{"Linear", func() { ag.Linear(w, nil, nil) }, "autograd: Linear: operand 2 of 2 is nil"},
		{"Add", func() { ag.Add(w, nil) }, "autograd: add: operand 2 of 2 is nil"},
		{"ReLU", func() { ag.ReLU(nil) }, "autograd: relu: operand 1 of 1 is nil"},
		{"SumAll", func() { ag.SumAll(nil) }, "autograd: sum: operand 1 of 1 is nil"},
		{"CrossEntropy", func() { ag.CrossEntropy(w, nil) }, "autograd: CrossEntropy: operand 2 of 2 is nil"},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				if r := recover(); r != c.want {
					t.Errorf("panic %v, want %q", r, c.want)
				}
			}()
			c.f()
		})
	}
}
