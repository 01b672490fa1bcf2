package train

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leangrad/leangrad/datasets"

	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
)

// faultyDevice is a CPU device whose raw allocations fail when src says.
// With noCaching every allocation is a raw one.
func faultyDevice(noCaching bool) (*tensor.Device, *memory.FaultySource) {
	src := memory.Inject(memory.NewHeapSource(), memory.Faults{})
	return tensor.NewDevice(cpu.NewWithAllocator(memory.New(src, memory.Config{Device: "cpu", NoCaching: noCaching}))), src
}

func snapshotState(m nn.Model) [][]byte {
	var out [][]byte
	for _, n := range m.State("") {
		out = append(out, n.T.Raw())
	}
	return out
}

// sameState fails t for each tensor of want (snapshotState's) that got
// does not hold bit for bit, saying how got was made.
func sameState(t *testing.T, got, want [][]byte, how string) {
	t.Helper()
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Errorf("state %d differs %s", i, how)
		}
	}
}

// closeState fails t at the first value of want (snapshotState's F32
// tensors) that got does not hold within a millionth (relative, past 1),
// saying how got was made.
func closeState(t *testing.T, got, want [][]byte, how string) {
	t.Helper()
	for i := range want {
		g, w := f32sOf(got[i]), f32sOf(want[i])
		for k := range w {
			if d := math.Abs(float64(g[k] - w[k])); d > 1e-6*(1+math.Abs(float64(w[k]))) {
				t.Fatalf("state %d element %d is %v %s, %v", i, k, g[k], how, w[k])
			}
		}
	}
}

// TestFailedStepLeavesNoTrace: a step that runs out of memory at any of its
// allocations (forward, backward, the optimiser's first state) leaves the
// parameters, batch norm's running statistics, the optimiser, the metrics
// and the random generator as they were and gives back every byte; run
// again, it gives what a step that never failed gives, bit for bit. The
// model has batch norm and dropout, with AMP (so the scaler takes part) and
// without.
func TestFailedStepLeavesNoTrace(t *testing.T) {
	for _, v := range []Variant{{Name: "fp32", Checkpoint: nn.NoCheckpoint}, {Name: "amp+checkpoint", AMP: AMPF16, Checkpoint: nn.CheckpointBlocks}} {
		t.Run(v.Name, func(t *testing.T) {
			dev, src := faultyDevice(true)
			xs, ys := batches(dev, 2, 16, 3)
			defer releaseAll(xs)
			defer releaseAll(ys)
			want, wantTally := cleanRun(t, dev, v, xs, ys)

			r := newRig(dev, v, Eager, 0.2)
			defer r.release()
			for i := range xs {
				failEveryAllocation(t, dev, src, i, func() error { return r.step.Run(xs[i], ys[i]) }, nil)
			}
			sameAsClean(t, r, want, wantTally, "failed steps")
		})
	}
}

// TestTrainingSurvivesInjectedFaults: over a CPU training run in which
// 1,000 allocations fail (each a burst that gets past the allocator's own
// flush-and-retry), every failed step runs again and training ends exactly
// as the run without faults does: the same parameters and metrics, the
// same allocated bytes after every step, and checkpoints that load.
func TestTrainingSurvivesInjectedFaults(t *testing.T) {
	ds := datasets.SyntheticSize(2400, 5, 8)
	test := datasets.SyntheticSize(64, 6, 8)
	cfg := baseConfig("mlp")
	cfg.Epochs, cfg.Batch = 4, 4
	dir := t.TempDir()
	run := func(faults memory.Faults) (*Trainer, nn.Model, int, int) {
		dev, src := faultyDevice(true)
		dev.Generator().Seed(3)
		model := nn.NewMLP(dev, []int{64, 32, 10}, 0)
		tr, err := New(model, dev, cfg, 600)
		if err != nil {
			t.Fatal(err)
		}
		src.Set(faults)
		l := datasets.NewLoader(ds, dev, datasets.LoaderConfig{Batch: cfg.Batch, Shuffle: true, Seed: 2})
		tl := datasets.NewLoader(test, dev, datasets.LoaderConfig{Batch: 64})
		if err := tr.Fit(l, tl, nil, filepath.Join(dir, "run.ckpt")); err != nil {
			t.Fatal(err)
		}
		injected, calls := src.Injected()
		return tr, model, injected, calls
	}
	clean, cm, _, calls := run(memory.Faults{})
	defer nn.Release(cm)
	defer clean.Release()
	// Without caching every allocation reaches the source. A fault every
	// 2n+3 allocations, for steps of at most n, leaves a step run again
	// room to finish before the next.
	every := 2*(calls/clean.Steps+1) + 3
	tr, m, faults, calls := run(memory.Faults{Every: every, Burst: 3})
	defer nn.Release(m)
	defer tr.Release()
	t.Logf("a fault every %d allocations: %d faults in %d raw allocations, %d steps recovered, %d steps", every, faults, calls, tr.OOM.Recoveries, tr.Steps)
	if tr.OOM.Recoveries < 1000 || tr.OOM.MicroBatch != 0 {
		t.Errorf("%d recoveries (want 1000 or more), micro-batch %d (want none: every batch fits)", tr.OOM.Recoveries, tr.OOM.MicroBatch)
	}
	want, got := snapshotState(cm), snapshotState(m)
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Errorf("%s differs from the run without faults", m.State("")[i].Name)
		}
	}
	for i := range clean.History {
		a, b := clean.History[i], tr.History[i]
		if a.TrainLoss != b.TrainLoss || a.TestAcc != b.TestAcc {
			t.Errorf("epoch %d: loss %v acc %v, without faults %v %v", i+1, b.TrainLoss, b.TestAcc, a.TrainLoss, a.TestAcc)
		}
	}
	for i, s := range tr.Memory {
		if s.Allocated != clean.Memory[i].Allocated {
			t.Fatalf("after step %d: %d bytes allocated, %d without faults", s.Step, s.Allocated, clean.Memory[i].Allocated)
		}
	}
	// The checkpoint the faulty run wrote each epoch resumes.
	dev := tensor.CPU()
	m2 := nn.NewMLP(dev, []int{64, 32, 10}, 0)
	defer nn.Release(m2)
	t2, _ := New(m2, dev, cfg, 600)
	defer t2.Release()
	if _, err := t2.Resume(filepath.Join(dir, "run.ckpt"), false); err != nil || t2.Epoch != cfg.Epochs {
		t.Errorf("the checkpoint: %v, epoch %d", err, t2.Epoch)
	}
	for i, n := range m2.State("") {
		if !bytes.Equal(n.T.Raw(), got[i]) {
			t.Errorf("checkpointed %s is not the trained one", n.Name)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".run.ckpt.tmp-*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// TestOOMFallsBackToMicroBatches: a batch that does not fit the device runs
// as micro-batches; without batch norm that is the same step as the whole
// batch, up to the order of the sums. The model is a small convolutional
// net, whose activations outweigh its parameters: micro-batches shrink the
// activations, while the gradients, accumulated, stay whole (a
// micro-batch's gradient is made before it is added: one more copy).
func TestOOMFallsBackToMicroBatches(t *testing.T) {
	ds := datasets.SyntheticSize(256, 5, 28)
	cfg := baseConfig("convnet")
	cfg.Batch, cfg.Schedule = 128, "constant"
	convNet := func(dev *tensor.Device) nn.Model {
		return nn.NewSequential(nn.NewConv2d(dev, 1, 16, 3, 1, 1, true), nn.ReLU(), nn.NewConv2d(dev, 16, 16, 3, 1, 1, true), nn.ReLU(),
			nn.GlobalAvgPool(), nn.NewLinear(dev, 16, 10, true))
	}
	run := func(capacity int64) (*Trainer, nn.Model) {
		src := memory.Limit(memory.NewHeapSource(), capacity)
		dev := tensor.NewDevice(cpu.NewWithAllocator(memory.New(src, memory.Config{Device: "cpu", NoCaching: true})))
		dev.Generator().Seed(3)
		model := convNet(dev)
		tr, err := New(model, dev, cfg, 2)
		if err != nil {
			t.Fatal(err)
		}
		l := datasets.NewLoader(ds, dev, datasets.LoaderConfig{Batch: cfg.Batch, Seed: 2})
		tl := datasets.NewLoader(ds.Subset(8), dev, datasets.LoaderConfig{Batch: 8})
		if err := tr.Fit(l, tl, nil, ""); err != nil {
			t.Fatal(err)
		}
		return tr, model
	}
	whole, wm := run(1 << 30)
	defer nn.Release(wm)
	defer whole.Release()
	pa, _ := whole.Peaks()
	t.Logf("whole-batch peak %d", pa)
	tr, m := run(pa - pa/4)
	defer nn.Release(m)
	defer tr.Release()
	if tr.OOM.MicroBatch == 0 || tr.OOM.MicroBatch == cfg.Batch || len(tr.OOM.Events) == 0 {
		t.Fatalf("OOM report %+v: want micro-batches", tr.OOM)
	}
	t.Logf("micro-batches of %d: %s", tr.OOM.MicroBatch, strings.Join(tr.OOM.Events, "; "))
	want, got := wm.State(""), m.State("")
	for i := range want {
		if d := relDiff(got[i].T.Float32s(), want[i].T.Float32s()); d > 1e-5 {
			t.Errorf("%s: relative difference %.2g from whole batches", want[i].Name, d)
		}
	}
	if a, b := float64(whole.History[0].TrainLoss), float64(tr.History[0].TrainLoss); math.Abs(a-b) > 1e-5*math.Abs(a) {
		t.Errorf("train loss %v, whole batches %v", b, a)
	}
	// One example at a time does not fit a pool barely larger than the
	// input: the allocator's error comes back.
	src := memory.Limit(memory.NewHeapSource(), 600<<10)
	dev := tensor.NewDevice(cpu.NewWithAllocator(memory.New(src, memory.Config{Device: "cpu", NoCaching: true})))
	model := convNet(dev)
	defer nn.Release(model)
	tr2, _ := New(model, dev, cfg, 2)
	defer tr2.Release()
	err := tr2.Fit(datasets.NewLoader(ds, dev, datasets.LoaderConfig{Batch: cfg.Batch}), datasets.NewLoader(ds.Subset(8), dev, datasets.LoaderConfig{Batch: 8}), nil, "")
	if !errors.Is(err, memory.ErrOutOfMemory) || !strings.Contains(err.Error(), "even one example at a time") {
		t.Errorf("a model that does not fit: %v", err)
	}
}

// TestDivergenceStopsTheRun: a loss that is not finite (fp32), or AMP
// steps skipped MaxSkips in a row, stop Fit with a *DivergedError naming the
// step, and nothing is saved over the last good checkpoint.
func TestDivergenceStopsTheRun(t *testing.T) {
	dev := tensor.CPU()
	ds := datasets.SyntheticSize(512, 5, 8)
	for _, amp := range []AMP{NoAMP, AMPF16} {
		cfg := baseConfig("mlp")
		cfg.Epochs, cfg.Batch, cfg.AMP, cfg.LR, cfg.Schedule = 2, 8, amp, 1e9, "constant"
		dev.Generator().Seed(3)
		model := nn.NewMLP(dev, []int{64, 32, 10}, 0)
		tr, _ := New(model, dev, cfg, 64)
		tr.ProgressEvery = 4
		path := filepath.Join(t.TempDir(), "run.ckpt")
		os.WriteFile(path, []byte("the last good checkpoint"), 0o644)
		l := datasets.NewLoader(ds, dev, datasets.LoaderConfig{Batch: cfg.Batch, Shuffle: true, Seed: 2})
		err := tr.Fit(l, datasets.NewLoader(ds.Subset(16), dev, datasets.LoaderConfig{Batch: 16}), nil, path)
		var d *DivergedError
		if !errors.As(err, &d) || !errors.Is(err, ErrDiverged) || d.Step == 0 || !strings.Contains(err.Error(), "learning rate") {
			t.Errorf("amp %v: Fit returned %v, want a *DivergedError", amp, err)
		} else {
			t.Logf("amp %v: %v", amp, err)
		}
		if b, _ := os.ReadFile(path); string(b) != "the last good checkpoint" {
			t.Errorf("amp %v: the checkpoint was overwritten", amp)
		}
		tr.Release()
		nn.Release(model)
	}
}

// TestOOMBesideTheArenaFreesIt: the planned arena of the full batches is
// held when an epoch's last, smaller batch warms up eagerly, and when the
// evaluation runs; under a cap that holds either but not both, these run
// out of memory, the trainer gives the arena back and runs them again
// whole: no micro-batches, no smaller evaluation batches, and the
// parameters and test losses of a run without the cap.
func TestOOMBesideTheArenaFreesIt(t *testing.T) {
	ds := datasets.SyntheticSize(56, 5, 12) // 3 batches of 16 and one of 8
	cfg := baseConfig("tiny")
	cfg.Epochs, cfg.Batch = 3, 16
	run := func(capacity int64) (*Trainer, nn.Model) {
		src := memory.Limit(memory.NewHeapSource(), capacity)
		dev := tensor.NewDevice(cpu.NewWithAllocator(memory.New(src, memory.Config{Device: "cpu", NoCaching: true})))
		dev.Generator().Seed(3)
		model := nn.NewResNet(dev, "tiny", 1, 10, []int{8, 16}, []int{1, 1})
		tr, err := New(model, dev, cfg, 4)
		if err != nil {
			t.Fatal(err)
		}
		tr.Step.Mode = Planned
		l := datasets.NewLoader(ds, dev, datasets.LoaderConfig{Batch: cfg.Batch, Seed: 2})
		tl := datasets.NewLoader(ds.Subset(40), dev, datasets.LoaderConfig{Batch: 40})
		if err := tr.Fit(l, tl, nil, ""); err != nil {
			t.Fatal(err)
		}
		return tr, model
	}
	free, fm := run(1 << 30)
	defer nn.Release(fm)
	defer free.Release()
	_, peak := free.Peaks()
	tr, m := run(peak - 4<<10)
	defer nn.Release(m)
	defer tr.Release()
	t.Logf("%s", strings.Join(tr.OOM.Events, "\n"))
	if tr.OOM.Recoveries == 0 || tr.OOM.MicroBatch != 0 || !strings.Contains(strings.Join(tr.OOM.Events, " "), "after the planned arena") {
		t.Errorf("OOM report %+v: want steps run again whole after the arena was freed", tr.OOM)
	}
	if !strings.Contains(strings.Join(tr.OOM.Events, " "), "evaluation ran out of memory beside the planned arena") {
		t.Errorf("the evaluation (one batch of 40) did not give the arena back: %q", tr.OOM.Events)
	}
	for i := range free.History {
		if a, b := free.History[i].TestLoss, tr.History[i].TestLoss; a != b {
			t.Errorf("epoch %d: test loss %v, without the cap %v", i+1, b, a)
		}
	}
	want, got := snapshotState(fm), snapshotState(m)
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Errorf("%s differs from the run without a cap", m.State("")[i].Name)
		}
	}
}

// Running out of memory outside the step (its input buffers, which Fit
// makes first; the evaluation's batches, which its loader makes) is an
// error that says what ran out, not a panic.
func TestOutOfMemoryOutsideTheStepIsAnError(t *testing.T) {
	for _, c := range []struct {
		name        string
		train, test int // batches
		want        string
	}{
		{"inputs", 2048, 2048, "the step's input buffers"},
		{"evaluation", 16, 2048, "evaluation: the loader's batch"},
	} {
		dev, _ := faultyDevice(false)
		m := nn.NewMLP(dev, []int{784, 16, 10}, 0)
		tr, err := New(m, dev, Config{Model: "mlp", Epochs: 1, Batch: c.train, LR: 0.1}, 1)
		if err != nil {
			t.Fatal(err)
		}
		a := dev.Allocator()
		a.SetLimit(a.Stats().Reserved[memory.All].Current + 64<<10) // the model fits; a batch of 2048 images (6.1 MiB) does not
		trainL := datasets.NewLoader(datasets.Synthetic(c.train, 1), dev, datasets.LoaderConfig{Batch: c.train})
		testL := datasets.NewLoader(datasets.Synthetic(c.test, 2), dev, datasets.LoaderConfig{Batch: c.test})
		if c.train < c.test {
			a.SetLimit(a.Stats().Reserved[memory.All].Current + 1<<20) // and room for the small one's steps
		}
		err = tr.Fit(trainL, testL, nil, "")
		if !errors.Is(err, memory.ErrOutOfMemory) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Fit with no room for them: %v; want %q", c.name, err, c.want)
		}
		tr.Release()
		nn.Release(m)
	}
}

// cleanRun runs a rig of v over the batches xs, ys without a failure and
// returns its state and metrics.
func cleanRun(t *testing.T, dev *tensor.Device, v Variant, xs, ys []*tensor.Tensor) ([][]byte, Tally) {
	t.Helper()
	clean := newRig(dev, v, Eager, 0.2)
	defer clean.release()
	for i := range xs {
		if err := clean.step.Run(xs[i], ys[i]); err != nil {
			t.Fatal(err)
		}
	}
	tally, _ := clean.step.Metrics()
	return snapshotState(clean.model), tally
}

// sameAsClean checks that rig r ended with cleanRun's state and metrics,
// after what.
func sameAsClean(t *testing.T, r *stepRig, want [][]byte, wantTally Tally, after string) {
	t.Helper()
	got := snapshotState(r.model)
	for j := range want {
		if !bytes.Equal(got[j], want[j]) {
			t.Errorf("%s differs from the clean run's after %s", r.model.State("")[j].Name, after)
		}
	}
	if tally, _ := r.step.Metrics(); tally != wantTally {
		t.Errorf("metrics %+v; clean run %+v", tally, wantTally)
	}
}

// TestInterruptedStepLeavesNoTrace: a step whose Stop is closed before it
// begins, or between its forward and its backward, fails with
// tensor.ErrInterrupted at its next allocation and leaves what a failed step
// leaves (TestFailedStepLeavesNoTrace): the pool as before, and, run again
// without the stop, the clean run's weights and metrics.
func TestInterruptedStepLeavesNoTrace(t *testing.T) {
	closed := make(chan struct{})
	close(closed)
	dev := tensor.NewDevice(cpu.New())
	xs, ys := batches(dev, 3, 16, 3)
	defer releaseAll(xs)
	defer releaseAll(ys)
	v := Variant{Name: "fp32", Checkpoint: nn.NoCheckpoint}
	want, wantTally := cleanRun(t, dev, v, xs, ys)
	for _, c := range []struct {
		name    string
		observe bool // close the stop after the forward, else before the step
	}{{"before the step", false}, {"between the forward and the backward", true}} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(dev, v, Eager, 0.2)
			defer r.release()
			for i := range xs {
				before := dev.Allocator().Stats().Allocated[memory.All].Current
				stop := closed
				if c.observe {
					open := make(chan struct{})
					stop = open
					r.step.Observe = func(*tensor.Tensor) { close(open) }
				}
				r.step.Stop = stop
				err := r.step.Run(xs[i], ys[i])
				if !errors.Is(err, tensor.ErrInterrupted) {
					t.Fatalf("step %d: %v, want an interruption", i, err)
				}
				if got := dev.Allocator().Stats().Allocated[memory.All].Current; got != before && i > 0 { // the first keeps its undo copy
					t.Fatalf("step %d: %d bytes allocated after the interrupted step, %d before", i, got, before)
				}
				r.step.Stop, r.step.Observe = nil, nil
				if err := r.step.Run(xs[i], ys[i]); err != nil {
					t.Fatal(err)
				}
			}
			sameAsClean(t, r, want, wantTally, "interrupted steps")
		})
	}
}

// failEveryAllocation runs step i (run) with an out-of-memory fault at its
// first allocation, then its second, and so on until it succeeds, and
// fails t unless each failed run gave back every byte of dev's pool (after
// the first step, which keeps what it made for its undo copy) and passed
// check (nil: none), or the step failed at fewer than 50 allocations.
func failEveryAllocation(t *testing.T, dev *tensor.Device, src *memory.FaultySource, i int, run func() error, check func(fault int)) {
	t.Helper()
	before := dev.Allocator().Stats().Allocated[memory.All].Current
	faults := 0
	for fault := 1; ; fault++ {
		src.Set(memory.Faults{Every: fault, Burst: 3, Max: 1})
		err := run()
		src.Set(memory.Faults{})
		if err == nil {
			break
		}
		faults++
		if !errors.Is(err, memory.ErrOutOfMemory) {
			t.Fatalf("step %d, fault at allocation %d: %v", i, fault, err)
		}
		if got := dev.Allocator().Stats().Allocated[memory.All].Current; got != before && i > 0 {
			t.Fatalf("step %d, fault at allocation %d: %d bytes allocated after the failed step, %d before", i, fault, got, before)
		}
		if check != nil {
			check(fault)
		}
	}
	if faults < 50 {
		t.Errorf("step %d failed at only %d of its allocations", i, faults)
	}
}
