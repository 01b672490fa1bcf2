package train

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/optim"
	"github.com/leangrad/leangrad/tensor"
)

// sameAlgorithms makes the eager steps take the smallest workspaces and the
// plan the traced run's, so that both run the same convolution algorithms
// (otherwise a plan picks the fastest that fits its arena, which can round
// differently from the eager policy's): parameters then agree bitwise.
func sameAlgorithms(dev *tensor.Device, s *Step) func() {
	s.Planning.AsTraced = true
	old := dev.Allocator().SetWorkspacePolicy(memory.WorkspaceSmallest)
	return func() { dev.Allocator().SetWorkspacePolicy(old) }
}

// stepRig is a small ResNet with dropout, its optimiser and a Step.
type stepRig struct {
	dev   *tensor.Device
	model *nn.ResNet
	opt   *optim.SGD
	step  *Step
}

func newRig(dev *tensor.Device, v Variant, mode Mode, dropout float32) *stepRig {
	dev.Generator().Seed(7)
	m := nn.NewResNet(dev, "tiny", 1, 10, []int{8, 16}, []int{1, 1})
	m.SetDropout(dropout)
	if v.Checkpoint != nn.NoCheckpoint {
		m.Checkpoint = nn.CheckpointBlocks
		m.SetCheckpointed(v.Checkpointed)
	}
	r := &stepRig{dev: dev, model: m, opt: optim.NewSGD(nn.Parameters(m), 0.05, 0.9, 5e-4, true)}
	r.step = NewStep(dev, m, r.opt, Config{AMP: v.AMP}.Autocast(), mode)
	return r
}

func (r *stepRig) release() {
	r.step.Release()
	r.opt.Release()
	nn.Release(r.model)
}

// batches makes n batches of b images (1×12×12) with labels, fixed by seed.
func batches(dev *tensor.Device, n, b int, seed uint64) (xs, ys []*tensor.Tensor) {
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := 0; i < n; i++ {
		v := make([]float32, b*144)
		for j := range v {
			v[j] = float32(rng.NormFloat64())
		}
		l := make([]int32, b)
		for j := range l {
			l[j] = int32(rng.IntN(10))
		}
		xs = append(xs, tensor.FromFloat32(dev, v, b, 1, 12, 12).Keep())
		ys = append(ys, tensor.FromInt32(dev, l, b).Keep())
	}
	return xs, ys
}

func releaseAll(ts []*tensor.Tensor) {
	for _, t := range ts {
		t.Release()
	}
}

func relDiff(a, b []float32) float64 {
	var num, den float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	return math.Sqrt(num / max(den, 1e-30))
}

// TestPlannedStepsMatchEager: parameters, metrics and loss scale after
// steps in the planned (on a GPU, captured) mode equal those of eager steps
// on the same batches bit for bit, in all four configurations and with
// the first of two blocks checkpointed, with dropout
// (its masks come from the device counter in both modes), and with a
// second batch shape (the last, smaller batch of an epoch) that gets its
// own plan.
func TestPlannedStepsMatchEager(t *testing.T) { testPlannedStepsMatchEager(t, tensor.CPU(), Planned) }

// testPlannedStepsMatchEager runs on dev with planMode, Planned on the CPU and Captured on the GPU.
func testPlannedStepsMatchEager(t *testing.T, dev *tensor.Device, planMode Mode) {
	xs, ys := batches(dev, 9, 8, 1)
	defer releaseAll(xs)
	defer releaseAll(ys)
	tail, tailY := batches(dev, 1, 3, 2)
	defer releaseAll(tail)
	defer releaseAll(tailY)
	vs := append(Variants(nn.CheckpointBlocks, AMPF16), Variant{Name: "amp+checkpoint-1/2", AMP: AMPF16, Checkpoint: nn.CheckpointBlocks, Checkpointed: 1})
	for _, v := range vs {
		t.Run(v.Name, func(t *testing.T) {
			run := func(mode Mode) (params [][]float32, loss float64, right int, scale float64, rng uint64) {
				r := newRig(dev, v, mode, 0.2)
				defer r.release()
				defer sameAlgorithms(dev, r.step)()
				r.step.Scaler.GrowthInterval = 2 // so that the scale changes
				for i := range xs {
					if err := r.step.Run(xs[i], ys[i]); err != nil {
						t.Fatal(err)
					}
					if i%3 == 2 { // a partial batch every third step: three runs of its shape
						if err := r.step.Run(tail[0], tailY[0]); err != nil {
							t.Fatal(err)
						}
					}
				}
				if n := r.step.Notes(); mode != Eager && strings.Contains(strings.Join(n, "\n"), "eagerly") {
					t.Errorf("%v step fell back: %v", mode, n)
				}
				for _, p := range nn.Parameters(r.model) {
					params = append(params, p.Float32s())
				}
				var tally Tally
				tally, _ = r.step.Metrics()
				loss, right = tally.LossSum, int(tally.Right)
				r.step.SyncRNG()
				return params, loss, right, r.step.Scaler.Scale(), dev.Generator().State().Offset
			}
			ep, el, er, es, eo := run(Eager)
			pp, pl, pr, ps, po := run(planMode)
			for i := range ep {
				if !equalBits(pp[i], ep[i]) {
					t.Errorf("parameter %d: %v steps differ from eager by %.3g", i, planMode, relDiff(pp[i], ep[i]))
				}
			}
			if pl != el || pr != er {
				t.Errorf("metrics: %v loss sum %v right %d, eager %v %d", planMode, pl, pr, el, er)
			}
			if ps != es || po != eo {
				t.Errorf("scale %v and generator offset %d, eager %v and %d", ps, po, es, eo)
			}
		})
	}
}

func equalBits(a, b []float32) bool {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// TestPlannedStepMemory: once planned, a step takes nothing from the pools
// (one use of the arena per step, no segment obtained), its peak is the
// memory alive before it plus the arena, the plan's live-bytes bound is the
// pool's measured peak of the traced eager step (with the workspaces that
// step took), and the arena is within 10% of the plan's own bound. Allocated bytes after each step do not move.
func TestPlannedStepMemory(t *testing.T) {
	src := memory.Limit(memory.NewHeapSource(), 1<<30)
	// a device of its own, to count its segments
	testPlannedStepMemory(t, tensor.NewDevice(cpu.NewWithAllocator(memory.New(src, memory.Config{Device: "cpu"}))), Planned, src)
}

// testPlannedStepMemory runs on dev with planMode, Planned on the CPU and
// Captured on the GPU; src, when not nil, is dev's source, whose segments
// it counts.
func testPlannedStepMemory(t *testing.T, dev *tensor.Device, planMode Mode, src *memory.LimitedSource) {
	xs, ys := batches(dev, 1, 16, 3)
	defer releaseAll(xs)
	defer releaseAll(ys)
	for _, v := range Variants(nn.CheckpointBlocks, AMPF16) {
		t.Run(v.Name, func(t *testing.T) {
			r := newRig(dev, v, planMode, 0)
			defer r.release()
			r.step.Planning = memory.PlanOptions{} // workspaces may not raise the arena: the bound below is the planner's
			a := dev.Allocator()
			if err := r.step.Run(xs[0], ys[0]); err != nil { // warm-up
				t.Fatal(err)
			}
			base := a.Stats().Allocated[memory.All].Current
			a.WindowPeak()
			if err := r.step.Run(xs[0], ys[0]); err != nil { // traced
				t.Fatal(err)
			}
			eagerPeak, _ := a.WindowPeak()
			p := r.step.Plan(xs[0].DType(), xs[0].Shape(), ys[0].Shape())
			if p == nil {
				t.Fatal("no plan after two steps")
			}
			if err := p.Check(); err != nil {
				t.Fatal(err)
			}
			if live := p.Trace.MaxLive(p.Trace.Taken()); live != eagerPeak-base {
				t.Errorf("the trace's live bytes %d, the pool measured %d over the traced step", live, eagerPeak-base)
			}
			if float64(p.Size) > 1.1*float64(p.Live) {
				t.Errorf("arena %d bytes for %d live", p.Size, p.Live)
			}
			if err := r.step.Run(xs[0], ys[0]); err != nil { // the first planned (captured) step
				t.Fatal(err)
			}
			dev.Synchronize()
			segments := func() int {
				if src == nil {
					return 0
				}
				n, _ := src.Counts()
				return n
			}
			segs := segments()
			before := a.Stats()
			a.WindowPeak()
			for i := 0; i < 5; i++ {
				if err := r.step.Run(xs[0], ys[0]); err != nil {
					t.Fatal(err)
				}
				if got := a.Stats().Allocated[memory.All].Current; got != before.Allocated[memory.All].Current {
					t.Fatalf("allocated %d after planned step %d, %d before", got, i, before.Allocated[memory.All].Current)
				}
			}
			after := a.Stats()
			if n := after.Allocations[memory.All].Allocated - before.Allocations[memory.All].Allocated; n != 5 {
				t.Errorf("5 planned steps made %d allocations, want 5 (the arena, once each)", n)
			}
			if s := segments(); s != segs {
				t.Errorf("planned steps obtained %d segments", s-segs)
			}
			if pa, _ := a.WindowPeak(); pa != before.Allocated[memory.All].Current+r.step.Arena().Size() {
				t.Errorf("peak %d over planned steps, want %d alive plus the arena %d", pa, before.Allocated[memory.All].Current, r.step.Arena().Size())
			}
			t.Logf("%s: eager peak %s, planned %s (arena %s, %s live at most)", v.Name, memory.Bytes(eagerPeak),
				memory.Bytes(base+p.Size), memory.Bytes(p.Size), memory.Bytes(p.Live))
		})
	}
}

// TestInfSkipsStepAsEagerDoes: an inf in the batch makes AMP's gradients
// non-finite; the planned step skips the update and halves the scale on
// the device, exactly as the eager step does, and counts the skipped step.
func TestInfSkipsStepAsEagerDoes(t *testing.T) { testInfSkipsStepAsEagerDoes(t, tensor.CPU(), Planned) }

// testInfSkipsStepAsEagerDoes runs on dev with planMode, Planned on the CPU and Captured on the GPU.
func testInfSkipsStepAsEagerDoes(t *testing.T, dev *tensor.Device, planMode Mode) {
	xs, ys := batches(dev, 4, 8, 4)
	defer releaseAll(xs)
	defer releaseAll(ys)
	bad := make([]float32, 8*144)
	for i := range bad {
		bad[i] = float32(math.Inf(1))
	}
	xInf := tensor.FromFloat32(dev, bad, 8, 1, 12, 12).Keep()
	defer xInf.Release()
	v := Variant{Name: "amp", AMP: AMPF16, Checkpoint: nn.NoCheckpoint}
	for _, mode := range []Mode{Eager, planMode} {
		r := newRig(dev, v, mode, 0)
		for i := 0; i < 3; i++ { // warm-up, trace, capture
			if err := r.step.Run(xs[i], ys[i]); err != nil {
				t.Fatal(err)
			}
		}
		before := nn.Parameters(r.model)[0].Float32s()
		scale := r.step.Scaler.Scale()
		if err := r.step.Run(xInf, ys[3]); err != nil {
			t.Fatal(err)
		}
		if after := nn.Parameters(r.model)[0].Float32s(); !equalBits(after, before) {
			t.Errorf("%v: a step with inf gradients changed the parameters", mode)
		}
		if got := r.step.Scaler.Scale(); got != scale/2 {
			t.Errorf("%v: scale %v after an inf step, want %v", mode, got, scale/2)
		}
		if _, skipped := r.step.Metrics(); skipped < 1 {
			t.Errorf("%v: %d skipped steps counted", mode, skipped)
		}
		r.release()
	}
}

// TestDropoutMasksDifferBetweenSteps: with the learning rate at zero and
// the same batch, planned steps' losses differ only through dropout: they
// differ with dropout on (each step draws from the advanced device counter)
// and repeat exactly with it off.
func TestDropoutMasksDifferBetweenSteps(t *testing.T) {
	testDropoutMasksDifferBetweenSteps(t, tensor.CPU(), Planned)
}

// testDropoutMasksDifferBetweenSteps runs on dev with planMode, Planned on the CPU and Captured on the GPU.
func testDropoutMasksDifferBetweenSteps(t *testing.T, dev *tensor.Device, planMode Mode) {
	xs, ys := batches(dev, 1, 8, 5)
	defer releaseAll(xs)
	defer releaseAll(ys)
	for _, p := range []float32{0.5, 0} {
		r := newRig(dev, Variant{Name: "fp32", Checkpoint: nn.NoCheckpoint}, planMode, p)
		r.opt.SetLR(0)
		var losses []float64
		for i := 0; i < 6; i++ {
			r.step.ResetMetrics()
			if err := r.step.Run(xs[0], ys[0]); err != nil {
				t.Fatal(err)
			}
			l, _ := r.step.Metrics()
			losses = append(losses, l.LossSum)
		}
		// BN's running statistics change the forward not at all in training.
		last := losses[3:]
		same := last[0] == last[1] && last[1] == last[2]
		if p > 0 && same {
			t.Errorf("dropout %v: planned steps repeat the same loss %v: the masks do not change", p, losses)
		}
		if p == 0 && !same {
			t.Errorf("without dropout the planned losses differ: %v", losses)
		}
		r.release()
	}
}

// TestStepReadsNothing: a read from the device inside the step (here, of
// the loss, by Observe) panics, naming the read and the sync-free step, in
// every mode the device runs steps in: eager, and the planned (CPU) or
// captured (GPU) steps that follow the first two.
func TestStepReadsNothing(t *testing.T) { testStepReadsNothing(t, tensor.CPU(), Planned) }

// testStepReadsNothing runs on dev with planMode, Planned on the CPU and Captured on the GPU.
func testStepReadsNothing(t *testing.T, dev *tensor.Device, planMode Mode) {
	xs, ys := batches(dev, 3, 4, 6)
	defer releaseAll(xs)
	defer releaseAll(ys)
	for _, mode := range []Mode{Eager, planMode} {
		t.Run(mode.String(), func(t *testing.T) {
			r := newRig(dev, Variant{Name: "fp32"}, mode, 0)
			defer r.release()
			first := 0
			if mode != Eager { // the eager and the traced steps before the plan
				for ; first < 2; first++ {
					if err := r.step.Run(xs[first], ys[first]); err != nil {
						t.Fatal(err)
					}
				}
				if r.step.Plan(xs[0].DType(), xs[0].Shape(), ys[0].Shape()) == nil {
					t.Fatalf("%v: no plan after two steps", mode)
				}
			}
			r.step.Observe = func(loss *tensor.Tensor) { _ = loss.Item() }
			msg := func() (msg string) {
				defer func() { msg = fmt.Sprint(recover()) }()
				r.step.Run(xs[first], ys[first])
				return "no panic"
			}()
			if !strings.Contains(msg, "Float32s") || !strings.Contains(msg, "sync-free") {
				t.Errorf("%v: a read inside the step: %q", mode, msg)
			}
		})
	}
}

// TestStepReturnsOOM: running out of memory inside a step is an error
// naming the allocation, not a panic; the next step on a roomier device works.
func TestStepReturnsOOM(t *testing.T) {
	src := memory.Limit(memory.NewHeapSource(), 3<<20)
	dev := tensor.NewDevice(cpu.NewWithAllocator(memory.New(src, memory.Config{Device: "cpu"})))
	r := newRig(dev, Variant{Name: "fp32", Checkpoint: nn.NoCheckpoint}, Eager, 0)
	defer r.release()
	xs, ys := batches(dev, 1, 256, 7)
	defer releaseAll(xs)
	defer releaseAll(ys)
	err := r.step.Run(xs[0], ys[0])
	var oom *memory.OOMError
	if err == nil || !errors.As(err, &oom) || !strings.Contains(err.Error(), "out of memory") {
		t.Fatalf("step over a 3 MiB pool: %v", err)
	}
	var buf bytes.Buffer
	fmt.Fprint(&buf, err)
	if !strings.Contains(buf.String(), "training step") {
		t.Errorf("error %q does not say where", buf.String())
	}
}

// TestStepChoosesTheLayout: a ResNet's step runs it channels last under
// autocast where the backend says so, and channels first otherwise.
func TestStepChoosesTheLayout(t *testing.T) { testStepChoosesTheLayout(t, tensor.CPU()) }

func testStepChoosesTheLayout(t *testing.T, dev *tensor.Device) {
	for _, v := range Variants(nn.CheckpointBlocks, AMPF16) {
		r := newRig(dev, v, Eager, 0)
		want := v.AMP.On() && dev.Backend().Info().ChannelsLast
		if got := r.model.ChannelsLast(); got != want {
			t.Errorf("%s on %s: channels last %v, want %v", v.Name, dev.Name(), got, want)
		}
		r.release()
	}
}
