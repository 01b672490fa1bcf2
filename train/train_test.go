package train

import (
	"bytes"
	"errors"
	"fmt"
	"gonum.org/v1/gonum/floats"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/internal/race"
	"github.com/leangrad/leangrad/internal/testdev"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
)

func resnet(dev *tensor.Device) func() nn.Model {
	return func() nn.Model {
		r, err := nn.NewCIFARResNet(dev, 8, 1, 10)
		if err != nil {
			panic(err)
		}
		return r
	}
}

func baseConfig(model string) Config {
	return Config{Model: model, Epochs: 1, Batch: 32, LR: 0.05, Momentum: 0.9, WeightDecay: 5e-4,
		Optimizer: "sgd", Schedule: "cosine", Seed: 1}
}

// TestNoGrowthOverManySteps: allocated bytes after each step are the same
// from step 2 on, over 300 steps of the main configuration (AMP and
// checkpointing) and 105 of each other one. A narrow ResNet keeps it quick
// on a CPU (and under -race); the memory contract does not depend on the width.
func TestNoGrowthOverManySteps(t *testing.T) { testNoGrowthOverManySteps(t, tensor.CPU()) }

func testNoGrowthOverManySteps(t *testing.T, dev *tensor.Device) {
	ds := datasets.SyntheticSize(240, 1, 12)
	for _, v := range Variants(nn.CheckpointBlocks, AMPF16) {
		t.Run(v.Name, func(t *testing.T) {
			dev.Generator().Seed(1)
			model := nn.NewResNet(dev, "tiny", 1, 10, []int{8, 16}, []int{1, 1})
			defer nn.Release(model)
			cfg := baseConfig("tiny")
			cfg.Epochs, cfg.Batch, cfg.LR, cfg.AMP, cfg.Checkpoint = 7, 16, 0.1, v.AMP, v.Checkpoint
			if v.Name == "amp+checkpoint" {
				cfg.Epochs = 20
			}
			l := datasets.NewLoader(ds, dev, datasets.LoaderConfig{Batch: cfg.Batch, Shuffle: true, Seed: 2})
			test := datasets.NewLoader(datasets.SyntheticSize(16, 9, 12), dev, datasets.LoaderConfig{Batch: 16})
			tr, err := New(model, dev, cfg, l.Len())
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Release()
			if err := tr.Fit(l, test, nil, ""); err != nil {
				t.Fatal(err)
			}
			if want := cfg.Epochs * l.Len(); len(tr.Memory) != want {
				t.Fatalf("%d steps recorded, want %d", len(tr.Memory), want)
			}
			for _, m := range tr.Memory[2:] {
				if m.Allocated != tr.Memory[1].Allocated {
					t.Fatalf("allocated after step %d is %d, after step 2 %d", m.Step, m.Allocated, tr.Memory[1].Allocated)
				}
			}
			if last := tr.History[len(tr.History)-1]; last.TrainAcc < 0.6 {
				t.Errorf("the synthetic set was not learned: %+v", last)
			}
		})
	}
}

// TestSaveResumeContinuesExactly: a run saved after epoch 1 and resumed
// continues exactly as the uninterrupted run does (model, optimiser, loss
// scale, random state, epoch), with AMP and checkpointing on.
func TestSaveResumeContinuesExactly(t *testing.T) { testSaveResumeContinuesExactly(t, tensor.CPU()) }

func testSaveResumeContinuesExactly(t *testing.T, dev *tensor.Device) {
	ds := datasets.Synthetic(128, 3)
	cfg := baseConfig("resnet8")
	cfg.Epochs, cfg.AMP, cfg.Checkpoint = 2, AMPF16, nn.CheckpointBlocks
	loader := func() *datasets.Loader {
		return datasets.NewLoader(ds, dev, datasets.LoaderConfig{Batch: 32, Shuffle: true, Seed: 4, CropPad: 2, Flip: true})
	}
	test := datasets.NewLoader(datasets.Synthetic(32, 8), dev, datasets.LoaderConfig{Batch: 32})
	path := filepath.Join(t.TempDir(), "run.ckpt")

	dev.Generator().Seed(11)
	a := resnet(dev)()
	defer nn.Release(a)
	ta, _ := New(a, dev, cfg, 4)
	defer ta.Release()
	ta.Step.Scaler.GrowthInterval = 3 // so the scale changes within the run
	ta.Cfg.Epochs = 1
	if err := ta.Fit(loader(), test, nil, path); err != nil {
		t.Fatal(err)
	}
	ta.Cfg.Epochs = 2
	if err := ta.Fit(loader(), test, nil, ""); err != nil {
		t.Fatal(err)
	}

	dev.Generator().Seed(999) // a different initialisation, overwritten by Resume
	b := resnet(dev)()
	defer nn.Release(b)
	tb, _ := New(b, dev, cfg, 4)
	defer tb.Release()
	tb.Step.Scaler.GrowthInterval = 3
	if _, err := tb.Resume(path, false); err != nil {
		t.Fatal(err)
	}
	if tb.Epoch != 1 || tb.Steps != 4 || len(tb.History) != 1 {
		t.Fatalf("resumed at epoch %d step %d with %d epochs of history", tb.Epoch, tb.Steps, len(tb.History))
	}
	if err := tb.Fit(loader(), test, nil, ""); err != nil {
		t.Fatal(err)
	}
	if ta.Step.Scaler.Scale() != tb.Step.Scaler.Scale() {
		t.Errorf("loss scale %v vs %v", ta.Step.Scaler.Scale(), tb.Step.Scaler.Scale())
	}
	as, bs := a.State(""), b.State("")
	for i := range as {
		if !bytes.Equal(as[i].T.Raw(), bs[i].T.Raw()) {
			t.Errorf("%s differs between the uninterrupted and the resumed run", as[i].Name)
		}
	}
	// Everything but timings and the pool's peaks (the resumed process
	// allocated differently on its way) is the same.
	ha, hb := ta.History[1], tb.History[1]
	for _, h := range []*EpochMetrics{&ha, &hb} {
		h.Seconds, h.ImgPerSec, h.PredictionsPerSec, h.PeakAllocated, h.PeakReserved = 0, 0, 0, 0, 0
	}
	if ha != hb {
		t.Errorf("epoch 2: %+v vs %+v", ha, hb)
	}
	// A checkpoint of another configuration is refused, every difference
	// listed; with force it resumes, and says what changed.
	tb.Cfg.Batch, tb.Cfg.Optimizer, tb.Cfg.AMP = 64, "adamw", NoAMP
	_, err := tb.Resume(path, false)
	for _, want := range []string{path, "batch: 32 -> 64", "optimizer: sgd -> adamw", "amp: f16 -> none", "-resume-force"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("resuming with another batch, optimiser and AMP: %v; want %q", err, want)
		}
	}
	if info, err := tb.Resume(path, true); err != nil || len(info.Changed) != 3 {
		t.Errorf("forced resume: %v, changes %q", err, info.Changed)
	}
	// Another model is refused even with force, naming the file.
	tb.Cfg.Model = "mlp"
	if _, err := tb.Resume(path, true); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("resuming another model: %v", err)
	}
	os.WriteFile(path, []byte("garbage"), 0o644)
	if _, err := tb.Resume(path, false); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("resuming garbage: %v", err)
	}
}

// TestMeasuredSavings: the four variants' peaks, measured by the pool on the
// same batch for ResNet-20, are ordered as they must be; a run that
// offloads activations measures its variants without checkpoints too
// (nothing to offload there; the CPU offloads nothing at all).
//
// The CUDA variant measures a larger batch: at 16 images cuDNN's workspaces
// (larger for F16's tensor-core algorithms) outweigh the activations, and
// AMP's step can peak above fp32's.
func TestMeasuredSavings(t *testing.T) { testMeasuredSavings(t, tensor.CPU(), 16) }

func testMeasuredSavings(t *testing.T, dev *tensor.Device, measureBatch int) {
	build := func() nn.Model {
		r, _ := nn.NewCIFARResNet(dev, 20, 1, 10)
		return r
	}
	var m = map[string]int64{}
	dev.WithScope(func() {
		x := tensor.Randn(dev, tensor.F32, 0, 1, measureBatch, 1, 28, 28)
		y := tensor.FromInt32(dev, make([]int32, measureBatch), measureBatch)
		cfg := baseConfig("resnet20")
		cfg.OffloadActivations = true
		for _, v := range Variants(nn.CheckpointBlocks, AMPF16) {
			r, err := MeasureStep(dev, build, cfg, v, x, y, false)
			if err != nil {
				t.Fatal(err)
			}
			m[v.Name] = r.PeakAllocated
		}
	})
	t.Logf("peaks: %v", m)
	if !(m["amp"] < m["fp32"] && m["checkpoint"] < m["fp32"] && m["amp+checkpoint"] < m["amp"] && m["amp+checkpoint"] < m["checkpoint"]) {
		t.Errorf("peaks out of order: %v", m)
	}
}

// TestStepHoldings: what MeasureStep says the step holds adds up to what
// the pool had allocated, its parameters are the model's blocks, the
// activations are saved by the operations that save them (the batch
// norms; under checkpointing, mostly the blocks' inputs), and the peak is
// the end of the forward plus the backward's share.
func TestStepHoldings(t *testing.T) {
	dev := tensor.NewDevice(cpu.New())
	build := func() nn.Model {
		r, _ := nn.NewCIFARResNet(dev, 8, 1, 10)
		return r
	}
	probe := build()
	var params int64
	seen := map[*memory.Block]bool{}
	for _, n := range probe.State("") {
		if b := n.T.Block(); !seen[b] {
			seen[b] = true
			params += b.Size()
		}
	}
	nn.Release(probe)
	dev.WithScope(func() {
		x := tensor.Randn(dev, tensor.F32, 0, 1, 8, 1, 28, 28)
		y := tensor.FromInt32(dev, make([]int32, 8), 8)
		for _, v := range Variants(nn.CheckpointBlocks, AMPF16) {
			m, err := MeasureStep(dev, build, baseConfig("resnet8"), v, x, y, false)
			if err != nil {
				t.Fatal(err)
			}
			h := m.Holds
			if h == nil {
				t.Fatalf("%s: no holdings", v.Name)
			}
			ops := map[string]int64{}
			for _, s := range h.Saved {
				ops[s.Op] = s.Bytes
			}
			t.Logf("%s: %+v", v.Name, *h)
			if h.Parameters != params || h.Batch != x.Block().Size()+y.Block().Size() || h.Optimizer <= 0 ||
				h.Other < 0 || h.Backward < 0 || h.Allocated+h.Backward != m.PeakAllocated {
				t.Errorf("%s: %+v does not add up (parameters %d, peak %d)", v.Name, *h, params, m.PeakAllocated)
			}
			if ops["batch_norm"] == 0 || (v.Checkpoint != nn.NoCheckpoint) != (ops["checkpoint"] > 0) {
				t.Errorf("%s: saved by %v", v.Name, ops)
			}
			checkPeak(t, v.Name+", eager", m.Peak, params, m.PeakAllocated, v.Checkpoint != nn.NoCheckpoint)
			if v.Name == "amp+checkpoint" { // and planned
				m, err := MeasureStep(dev, build, baseConfig("resnet8"), v, x, y, true)
				if err != nil {
					t.Fatal(err)
				}
				checkPeak(t, v.Name+", planned", m.PlannedPeak, params, m.Planned, true)
				if p := m.PlannedPeak; p != nil && p.Allocated != m.Planned {
					t.Errorf("planned peak %d bytes, the planned need %d", p.Allocated, m.Planned)
				}
			}
		}
	})
}

// checkPeak checks a breakdown of a step's peak against the pool's peak:
// its kinds add up to it, less the pool's rounding (the trace counts
// rounded requests); its parameters are the model's; it falls in a
// checkpoint's recomputation when the blocks are checkpointed, where the
// recomputed activations are told apart, and otherwise in the backward or
// the forward.
func checkPeak(t *testing.T, name string, p *Breakdown, params, poolPeak int64, checkpointed bool) {
	t.Helper()
	if p == nil {
		t.Errorf("%s: no peak", name)
		return
	}
	t.Logf("%s: peak %+v", name, *p)
	sum := p.Parameters + p.Optimizer + p.Batch + p.SavedTotal() + p.Gradients + p.ParameterGradients + p.Workspaces + p.Gaps + p.Other
	if sum != p.Allocated || p.Parameters != params || p.Other < 0 || p.Allocated > poolPeak || float64(p.Allocated) < 0.97*float64(poolPeak) {
		t.Errorf("%s: peak %+v does not add up (kinds %d, parameters %d, the pool's peak %d)", name, *p, sum, params, poolPeak)
	}
	recomputed := false
	for _, s := range p.Saved {
		recomputed = recomputed || strings.HasSuffix(s.Op, " (recomputed)")
	}
	inRecomputation := strings.HasSuffix(p.Phase, "in a checkpoint's recomputation")
	inBackward := strings.HasPrefix(p.Phase, "the backward of ")
	if inForward := p.Phase == "the forward"; inForward && !checkpointed {
		// Everything saved and one op's temporaries can outweigh the
		// backward, which frees as it goes.
		if p.Gradients != 0 || recomputed {
			t.Errorf("%s: peak in the forward, saved by %v, gradients %d", name, p.Saved, p.Gradients)
		}
	} else if !inBackward || inRecomputation != checkpointed || recomputed != checkpointed || p.Gradients <= 0 {
		t.Errorf("%s: peak during %q, saved by %v, gradients %d", name, p.Phase, p.Saved, p.Gradients)
	}
}

func TestEmptyCacheEvery(t *testing.T) { testEmptyCacheEvery(t, tensor.CPU()) }

func testEmptyCacheEvery(t *testing.T, dev *tensor.Device) {
	ds := datasets.Synthetic(64, 1)
	model := resnet(dev)()
	defer nn.Release(model)
	cfg := baseConfig("resnet8")
	cfg.EmptyCacheEvery = 2
	l := datasets.NewLoader(ds, dev, datasets.LoaderConfig{Batch: 16})
	tr, _ := New(model, dev, cfg, l.Len())
	defer tr.Release()
	if err := tr.Fit(l, l, nil, ""); err != nil {
		t.Fatal(err)
	}
	if tr.Empty.Calls != 2 || tr.Empty.Released <= 0 {
		t.Errorf("EmptyCache report %+v: want 2 calls that released memory", tr.Empty)
	}
}

// TestMLPFashionMNIST is the end-to-end check on real data: an MLP reaches
// 84% test accuracy in one epoch of Fashion-MNIST. CI installs the data
// (dataset-fashion-mnist) and sets LEANGRAD_REQUIRE_DATA, so there it cannot skip.
func TestMLPFashionMNIST(t *testing.T) {
	race.Skip(t, "go test ./train -run TestMLPFashionMNIST")
	testMLPFashionMNIST(t, tensor.CPU())
}

func testMLPFashionMNIST(t *testing.T, dev *tensor.Device) {
	dir, err := datasets.Find(datasets.FashionMNIST, os.Getenv("LEANGRAD_DATA"))
	if err != nil {
		if os.Getenv("LEANGRAD_REQUIRE_DATA") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	trainSet, testSet, err := datasets.LoadFashionMNIST(dir)
	if err != nil {
		t.Fatal(err)
	}
	dev.Generator().Seed(1)
	model := nn.NewMLP(dev, []int{784, 256, 10}, 0)
	defer nn.Release(model)
	mean, std := trainSet.MeanStd()
	trainL := datasets.NewLoader(trainSet, dev, datasets.LoaderConfig{Batch: 64, Shuffle: true, Seed: 1, Mean: mean, Std: std})
	testL := datasets.NewLoader(testSet, dev, datasets.LoaderConfig{Batch: 500, Mean: mean, Std: std})
	cfg := Config{Model: "mlp", Epochs: 1, Batch: 64, LR: 0.05, Momentum: 0.9, WeightDecay: 1e-4, Optimizer: "sgd",
		Schedule: "cosine", WarmupEpochs: 0.05, Seed: 1}
	tr, err := New(model, dev, cfg, trainL.Len())
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Release()
	start := time.Now()
	if err := tr.Fit(trainL, testL, nil, ""); err != nil {
		t.Fatal(err)
	}
	m := tr.History[0]
	t.Logf("one epoch in %v: train loss %.4f acc %.4f, test loss %.4f acc %.4f", time.Since(start).Round(time.Millisecond),
		m.TrainLoss, m.TrainAcc, m.TestLoss, m.TestAcc)
	if m.TestAcc < 0.84 {
		t.Errorf("test accuracy %.4f after one epoch, want >= 0.84", m.TestAcc)
	}
}

func TestBuildModel(t *testing.T) { testBuildModel(t, tensor.CPU()) }

func testBuildModel(t *testing.T, dev *tensor.Device) {
	img, img3 := []int{1, 28, 28}, []int{3, 28, 28}
	mini := nn.GPTConfig{Layers: 2, Heads: 2, Width: 128, Vocab: 1000, Context: 32}
	small := nn.GPTConfig{Layers: 6, Heads: 6, Width: 384, Vocab: 500, Context: 16}
	for _, tc := range []struct {
		name    string
		input   []int
		classes int
		params  int // 0: an error is wanted
	}{
		{"resnet8", img, 10, 77754}, {"mlp", img, 10, 269322}, {"resnet18", img3, 10, 11173962},
		{"gpt-mini", []int{32}, 1000, mini.Params()}, {"gpt", []int{16}, 500, small.Params()},
		{"resnet21", img, 10, 0}, {"vgg", img, 10, 0}, {"resnetx", img, 10, 0},
		{"gpt-mini", img, 1000, 0}, {"resnet8", []int{32}, 10, 0}, {"mlp", img, 1, 0},
	} {
		shared := dev.Generator().State()
		m, err := BuildModel(dev, tc.name, tc.input, tc.classes, 1)
		if (err == nil) != (tc.params > 0) {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		// A model built beside a training run (a server's) leaves the
		// generator every handle shares alone.
		if got := dev.Generator().State(); got != shared {
			t.Errorf("%s: building moved the shared generator from %+v to %+v", tc.name, shared, got)
		}
		if err != nil {
			continue
		}
		if n := nn.CountParams(m); n != tc.params {
			t.Errorf("%s: %d parameters, want %d", tc.name, n, tc.params)
		}
		a := m.State("")[0].T.Float32s()[0]
		nn.Release(m)
		m2, _ := BuildModel(dev, tc.name, tc.input, tc.classes, 1)
		if m2.State("")[0].T.Float32s()[0] != a {
			t.Errorf("%s: the same seed made other parameters", tc.name)
		}
		nn.Release(m2)
	}
}

// stopAtEpochEnd closes stop at the progress update of an epoch's last
// step, so that the stop request arrives during the evaluation that
// follows.
type stopAtEpochEnd struct {
	stop chan struct{}
}

func (o *stopAtEpochEnd) EpochStart(epoch, steps int) {}
func (o *stopAtEpochEnd) EpochEnd(m EpochMetrics)     {}
func (o *stopAtEpochEnd) Step(s StepStats) {
	if s.Step == s.Steps {
		select {
		case <-o.stop:
		default:
			close(o.stop)
		}
	}
}

// TestStopDuringEvaluationResumesThere: a stop asked for while an epoch's
// evaluation runs ends the evaluation between its batches, saves the run
// at the epoch's end, and the resumed run evaluates again and goes on to
// the weights and history of a run that was never stopped.
func TestStopDuringEvaluationResumesThere(t *testing.T) {
	dev := tensor.CPU()
	ds := datasets.Synthetic(64, 3)
	cfg := baseConfig("resnet8")
	cfg.Epochs = 2
	loader := func() *datasets.Loader {
		return datasets.NewLoader(ds, dev, datasets.LoaderConfig{Batch: 32, Shuffle: true, Seed: 4})
	}
	test := func() *datasets.Loader {
		return datasets.NewLoader(datasets.Synthetic(96, 8), dev, datasets.LoaderConfig{Batch: 32})
	}
	path := filepath.Join(t.TempDir(), "run.ckpt")
	fit := func(seed uint64, stop *stopAtEpochEnd, resume string) (nn.Model, *Trainer, error) {
		dev.Generator().Seed(seed)
		m := resnet(dev)()
		t.Cleanup(func() { nn.Release(m) })
		tr, _ := New(m, dev, cfg, 2)
		t.Cleanup(tr.Release)
		if resume != "" {
			if _, err := tr.Resume(resume, false); err != nil {
				t.Fatal(err)
			}
		}
		var obs Observer
		if stop != nil {
			tr.Stop, obs = stop.stop, stop
		}
		return m, tr, tr.Fit(loader(), test(), obs, path)
	}
	a, ta, err := fit(11, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = fit(11, &stopAtEpochEnd{stop: make(chan struct{})}, "")
	var ie *InterruptedError
	if !errors.As(err, &ie) || ie.Epoch != 0 || ie.Batch != 2 || ie.Saved != path {
		t.Fatalf("stopped during the first evaluation: %v (%+v); want an interruption at epoch 0's end, saved", err, ie)
	}
	b, tb, err := fit(999, nil, path)
	if err != nil {
		t.Fatal(err)
	}
	sameRuns(t, a, b, ta, tb, 2)
}

// TestStopWithinAStepResumesThere: a Stop closed between a step's forward
// and its backward ends that step at its next allocation, undone: the run
// saves where that step was to begin, without it, and the run resumed from
// there ends with the uninterrupted run's weights and history, bit for bit.
func TestStopWithinAStepResumesThere(t *testing.T) {
	dev := tensor.CPU()
	ds := datasets.Synthetic(128, 3)
	cfg := baseConfig("resnet8")
	cfg.Epochs, cfg.Batch = 2, 16
	path := filepath.Join(t.TempDir(), "run.ckpt")
	fit := func(seed uint64, stopAt int, resume string) (nn.Model, *Trainer, error) {
		dev.Generator().Seed(seed)
		m := resnet(dev)()
		t.Cleanup(func() { nn.Release(m) })
		tr, _ := New(m, dev, cfg, 8)
		t.Cleanup(tr.Release)
		if resume != "" {
			if _, err := tr.Resume(resume, false); err != nil {
				t.Fatal(err)
			}
		}
		if stopAt > 0 {
			stop, forwards := make(chan struct{}), 0
			tr.Stop = stop
			tr.Step.Observe = func(*tensor.Tensor) { // after the forward, before the backward
				if forwards++; forwards == stopAt {
					close(stop)
				}
			}
		}
		train := datasets.NewLoader(ds, dev, datasets.LoaderConfig{Batch: cfg.Batch, Shuffle: true, Seed: 4})
		test := datasets.NewLoader(datasets.Synthetic(64, 8), dev, datasets.LoaderConfig{Batch: 32})
		return m, tr, tr.Fit(train, test, nil, path)
	}
	a, ta, err := fit(11, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = fit(11, 11, "") // epoch 1's third step
	var ie *InterruptedError
	if !errors.As(err, &ie) || ie.Epoch != 1 || ie.Batch != 2 || ie.Step != 10 || ie.Saved != path {
		t.Fatalf("stopped within step 11: %v (%+v); want an interruption before epoch 1's batch 2, after 10 steps, saved", err, ie)
	}
	b, tb, err := fit(999, 0, path)
	if err != nil {
		t.Fatal(err)
	}
	sameRuns(t, a, b, ta, tb, 2)
}

// sameRuns checks that an uninterrupted run (model a, trainer ta) and a
// resumed one (b, tb) ended with the same state, bit for bit, and the same
// history of epochs.
func sameRuns(t *testing.T, a, b nn.Model, ta, tb *Trainer, epochs int) {
	t.Helper()
	as, bs := a.State(""), b.State("")
	for i := range as {
		if !bytes.Equal(as[i].T.Raw(), bs[i].T.Raw()) {
			t.Errorf("%s differs between the uninterrupted and the resumed run", as[i].Name)
		}
	}
	if len(ta.History) != epochs || len(tb.History) != epochs {
		t.Fatalf("histories of %d and %d epochs, want %d", len(ta.History), len(tb.History), epochs)
	}
	for e := range ta.History {
		if ha, hb := ta.History[e], tb.History[e]; ha.TestLoss != hb.TestLoss || ha.TestAcc != hb.TestAcc || ha.TrainLoss != hb.TrainLoss {
			t.Errorf("epoch %d: %+v vs %+v", e, ha, hb)
		}
	}
}

// TestFitBudgetHoldsNoMoreThanTheBudget: FitBudget sizes each candidate on
// slices of a batch of 16 and never runs fp32, predicted not to fit, on
// the whole batch; on a batch of 4 it measures whole steps, fp32 first;
// the pool never reserves more than the budget (what does not fit stops
// there, out of memory), it chooses one that fits, measured last, and the
// pool's cap is what it was before; a stop asked for ends it before the
// next measurement.
func TestFitBudgetHoldsNoMoreThanTheBudget(t *testing.T) {
	dev := tensor.NewDevice(cpu.New())
	build := func() nn.Model {
		r, _ := nn.NewCIFARResNet(dev, 20, 1, 10)
		return r
	}
	cfg := baseConfig("resnet20")
	dev.WithScope(func() {
		x := tensor.Randn(dev, tensor.F32, 0, 1, 16, 1, 28, 28)
		y := tensor.FromInt32(dev, make([]int32, 16), 16)
		fp32, err := MeasureStep(dev, build, cfg, Variants(nn.CheckpointBlocks, AMPF16)[0], x, y, false)
		if err != nil {
			t.Fatal(err)
		}
		a := dev.Allocator()
		a.EmptyCache()
		a.ResetPeak()
		budget := fp32.Need() * 3 / 4 // fp32 does not fit; the leaner variants do
		var out strings.Builder
		c, err := FitBudget(&out, dev, build, cfg, BudgetVariants(true, false, false, AMPF16, nil), x, y, false, budget, nil)
		if err != nil {
			t.Fatalf("%v\n%s", err, out.String())
		}
		if peak := a.Stats().Reserved[memory.All].Peak; peak > budget {
			t.Errorf("the pool reserved %v while fitting into %v", memory.Bytes(peak), memory.Bytes(budget))
		}
		t.Logf("%s", out.String())
		wholeFP32 := slices.ContainsFunc(c.Measured, func(m Measurement) bool { return m.Name == "fp32" && m.Examples == 0 })
		if c.Chosen.Name == "fp32" || wholeFP32 || !strings.Contains(out.String(), "sizing each on 2 and 4 of the batch's 16 examples") {
			t.Errorf("fp32 (%v) in a budget of %v: chose %s (fp32 run on the whole batch: %v)\n%s", memory.Bytes(fp32.Need()), memory.Bytes(budget), c.Chosen.Name, wholeFP32, out.String())
		}
		if last := c.Measured[len(c.Measured)-1]; last.Variant != c.Chosen || last.Examples != 0 || last.Need() > budget {
			t.Errorf("the choice %+v was not measured last on the whole batch within the budget: %+v", c.Chosen, last)
		} else if ok, _ := withinBudget(last.Need(), last.Standing, budget); !ok || last.Standing <= 0 || last.Standing >= last.Need() {
			t.Errorf("the choice needs %d bytes, %d of them standing between steps: want 0 < standing < need, and the headroom within %d", last.Need(), last.Standing, budget)
		}
		// A budget that no whole batch fits: micro-batches, the first
		// tried fits, no step of them out of memory.
		out.Reset()
		tight := int64(5.5 * (1 << 20))
		c, err = FitBudget(&out, dev, build, cfg, BudgetVariants(true, false, false, AMPF16, nil), x, y, false, tight, nil)
		last := c.Measured[len(c.Measured)-1]
		if err != nil || c.Chosen.MicroBatch < 1 || c.Chosen.MicroBatch >= 16 || last.Variant != c.Chosen || last.Need() > tight ||
			!strings.Contains(out.String(), "micro-batches of") || strings.Contains(out.String(), "does not fit") {
			t.Errorf("a budget of %v: %v, chose %+v\n%s", memory.Bytes(tight), err, c.Chosen, out.String())
		}
		// A batch too small to size is measured whole, fp32 first: it stops at the budget.
		out.Reset()
		fp32of4, err := MeasureStep(dev, build, cfg, Variants(nn.CheckpointBlocks, AMPF16)[0], x.Rows(0, 4), y.Rows(0, 4), false)
		if err != nil {
			t.Fatal(err)
		}
		budget4 := fp32of4.Need() * 3 / 4
		c, err = FitBudget(&out, dev, build, cfg, BudgetVariants(true, false, false, AMPF16, nil), x.Rows(0, 4), y.Rows(0, 4), false, budget4, nil)
		if err != nil || !c.Measured[0].OutOfMemory && c.Measured[0].Need() <= budget4 || c.Chosen.Name == "fp32" || strings.Contains(out.String(), "sizing") {
			t.Errorf("a batch of 4: %v, measured first %+v, chose %s\n%s", err, c.Measured[0], c.Chosen.Name, out.String())
		}
		if a.Limit() != 0 {
			t.Errorf("the pool is left capped at %d", a.Limit())
		}
		stop := make(chan struct{})
		close(stop)
		if c, err := FitBudget(io.Discard, dev, build, cfg, BudgetVariants(true, false, false, AMPF16, nil), x, y, false, budget, stop); !errors.Is(err, ErrInterrupted) || len(c.Measured) != 0 {
			t.Errorf("fitting with stop closed: %v, %d measured", err, len(c.Measured))
		}
	})
}

// TestCheckpointingSomeBlocks: a GPT of six blocks and ResNet-20 with their
// first k blocks checkpointed need less as k grows, and no more than
// FitBudget predicts from the needs of none and all and the blocks'
// shares (Note [checkpointing some blocks] in package nn), and no more
// than with one fewer; under a budget that the prediction fits with three
// blocks, FitBudget chooses at most three, measured last within the
// budget, and never runs the unfitting configuration on the whole batch;
// where the first three blocks do not fit the pool's segments, it tries
// once more, halfway to every block.
func TestCheckpointingSomeBlocks(t *testing.T) {
	dev := tensor.NewDevice(cpu.New())
	const T, V = 32, 96
	for _, c := range []struct {
		name   string
		blocks int
		build  func() nn.Model
		cfg    Config
		batch  func() (x, y *tensor.Tensor)
	}{
		{"gpt", 6, func() nn.Model {
			g, err := nn.NewGPT(dev, nn.GPTConfig{Layers: 6, Heads: 2, Width: 64, Vocab: V, Context: T})
			if err != nil {
				t.Fatal(err)
			}
			return g
		}, Config{Model: "gpt", Batch: 8, LR: 1e-3, Optimizer: "adamw", Schedule: "constant", Seed: 1, Context: T, EvalEvery: 1, Steps: 1},
			func() (x, y *tensor.Tensor) {
				xs, ys := tokenBatches(dev, 1, 8, T, V, 3)
				return xs[0], ys[0]
			}},
		{"resnet20", 9, func() nn.Model {
			r, _ := nn.NewCIFARResNet(dev, 20, 1, 10)
			return r
		}, baseConfig("resnet20"),
			func() (x, y *tensor.Tensor) {
				return tensor.Randn(dev, tensor.F32, 0, 1, 16, 1, 28, 28).Keep(), tensor.FromInt32(dev, make([]int32, 16), 16).Keep()
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dev.WithScope(func() {
				x, y := c.batch()
				defer x.Release()
				defer y.Release()
				needs := make([]int64, c.blocks+1) // by the blocks checkpointed
				var standing int64
				var shares []float64
				for k := range needs {
					v := Variant{Name: fmt.Sprintf("checkpoint-%d/%d", k, c.blocks), Checkpoint: nn.CheckpointBlocks, Checkpointed: k}
					switch k {
					case 0:
						v.Checkpoint = nn.NoCheckpoint
					case c.blocks:
						v.Checkpointed = 0
					}
					m, err := MeasureStep(dev, c.build, c.cfg, v, x, y, false)
					if err != nil {
						t.Fatal(err)
					}
					if len(m.Shares) != c.blocks {
						t.Fatalf("%s: the shares of %d blocks measured, want %d", v.Name, len(m.Shares), c.blocks)
					}
					needs[k], standing, shares = m.Need(), m.Standing, m.Shares
				}
				none, all := needs[0], needs[c.blocks]
				predicted := func(k int) int64 { return none - int64(floats.Sum(shares[:k])*float64(none-all)) }
				for k := 1; k < c.blocks; k++ {
					if needs[k] > needs[k-1] || needs[k] > predicted(k) {
						t.Errorf("the first %d blocks checkpointed need %d bytes (%d with one fewer), predicted %d: want no more than with one fewer, nor than predicted", k, needs[k], needs[k-1], predicted(k))
					}
				}
				t.Logf("needs by the blocks checkpointed: %v", needs)
				// Room for three blocks checkpointed, with a quarter of the
				// step's own bytes spare: a pool this small, of segments of
				// 2 MiB, loses more than the budget's headroom to them.
				three := predicted(3)
				budget := three + (three-standing)/4
				var out strings.Builder
				ch, err := FitBudget(&out, dev, c.build, c.cfg, BudgetVariants(true, false, false, AMPF16, func(v Variant) bool { return !v.AMP.On() }), x, y, false, budget, nil)
				if err != nil {
					t.Fatalf("%v\n%s", err, out.String())
				}
				t.Logf("%s", out.String())
				last := ch.Measured[len(ch.Measured)-1]
				wholeFP32 := slices.ContainsFunc(ch.Measured, func(m Measurement) bool { return m.Name == "fp32" && m.Examples == 0 })
				if !ch.Chosen.Some || ch.Chosen.Checkpointed < 1 || ch.Chosen.Checkpointed > 3 || last.Variant != ch.Chosen || last.Need() > budget || wholeFP32 ||
					!strings.Contains(out.String(), fmt.Sprintf("the first %d of %d blocks", ch.Chosen.Checkpointed, c.blocks)) {
					t.Errorf("a budget of %d bytes (none %d, all %d): chose %+v, measured last %+v (fp32 run whole: %v)\n%s", budget, none, all, ch.Chosen, last, wholeFP32, out.String())
				}
				if c.name != "resnet20" {
					return
				}
				// With only the budget's headroom, a count of blocks may run
				// out of memory in the pool, its bytes scattered between
				// blocks. The pool's books say so before the whole batch
				// runs: the search sizes the next count, and no step on the
				// whole batch runs out. Budgets from every block's need to
				// one block's, with the headroom alone.
				booked := 0 // the budgets where the books turned a count down
				for i := range 4 {
					need := needs[c.blocks] + int64(i)*(needs[1]-needs[c.blocks])/3
					tight := need + int64(BudgetHeadroom*float64(need-standing)) + 1
					out.Reset()
					ch, err = FitBudget(&out, dev, c.build, c.cfg, BudgetVariants(true, false, false, AMPF16, func(v Variant) bool { return !v.AMP.On() }), x, y, false, tight, nil)
					said := out.String()
					for _, line := range strings.Split(said, "\n") {
						if strings.Contains(line, "checkpoint-") && strings.Contains(line, "by their traces") && strings.Contains(line, "out of memory under the budget") {
							booked++
							break
						}
					}
					ranOut := slices.ContainsFunc(ch.Measured, func(m Measurement) bool { return m.Examples == 0 && m.OutOfMemory })
					if err != nil || ranOut || ch.Measured[len(ch.Measured)-1].Need() > tight {
						t.Errorf("a budget of %d bytes: %v, chose %+v; want no whole step out of memory, and a choice within the budget\n%s", tight, err, ch.Chosen, said)
					}
				}
				t.Logf("the pool's books turned a count of blocks down under %d of 4 budgets", booked)
				if booked == 0 {
					t.Errorf("no budget had the pool's books turn a count of blocks down")
				}
			})
		})
	}
}

// TestLightCheckpointsInTheBudget: a GPT's step with its blocks
// checkpointed lightly needs less than without checkpoints and more than
// with plain ones, and its first k blocks so checkpointed no more than
// FitBudget predicts from the first two; under a budget that the
// prediction fits with three of six blocks checkpointed lightly, FitBudget
// chooses light checkpoints for at most three, measured last within the
// budget; and under one just short of the light checkpoints' need, plain
// checkpoints (Note [light checkpoints] in package autograd).
func TestLightCheckpointsInTheBudget(t *testing.T) {
	dev := tensor.NewDevice(cpu.New())
	const T, V, blocks = 32, 96, 6
	build := func() nn.Model {
		g, err := nn.NewGPT(dev, nn.GPTConfig{Layers: blocks, Heads: 2, Width: 64, Vocab: V, Context: T})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	cfg := Config{Model: "gpt", Batch: 8, LR: 1e-3, Optimizer: "adamw", Schedule: "constant", Seed: 1, Context: T, EvalEvery: 1, Steps: 1}
	dev.WithScope(func() {
		xs, ys := tokenBatches(dev, 1, 8, T, V, 3)
		x, y := xs[0], ys[0]
		defer x.Release()
		defer y.Release()
		need := func(v Variant) Measurement {
			m, err := MeasureStep(dev, build, cfg, v, x, y, false)
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
		none, light, plain := need(Variant{Name: "fp32"}), need(Variant{Name: "checkpoint-light", Checkpoint: nn.CheckpointLight}),
			need(Variant{Name: "checkpoint", Checkpoint: nn.CheckpointBlocks})
		t.Logf("needs: %d bytes without checkpoints, %d checkpointed lightly, %d checkpointed", none.Need(), light.Need(), plain.Need())
		if !(plain.Need() < light.Need() && light.Need() < none.Need()) {
			t.Fatalf("needs %d checkpointed, %d lightly, %d without: want them rising", plain.Need(), light.Need(), none.Need())
		}
		predicted := func(k int) int64 { return checkpointedNeed(none.Need(), light.Need(), light.Shares, k) }
		for k := 1; k < blocks; k++ {
			m := need(Variant{Name: "checkpoint-light-k", Checkpoint: nn.CheckpointLight, Checkpointed: k})
			if m.Need() > predicted(k) {
				t.Errorf("the first %d blocks checkpointed lightly need %d bytes, predicted %d", k, m.Need(), predicted(k))
			}
		}
		fit := func(budget int64) BudgetChoice {
			var out strings.Builder
			ch, err := FitBudget(&out, dev, build, cfg, BudgetVariants(true, true, false, AMPF16, func(v Variant) bool { return !v.AMP.On() }), x, y, false, budget, nil)
			if err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			t.Logf("%s", out.String())
			if last := ch.Measured[len(ch.Measured)-1]; last.Variant != ch.Chosen || last.Need() > budget {
				t.Errorf("the choice %+v was not measured last within the budget: %+v", ch.Chosen, last)
			}
			return ch
		}
		three := predicted(3)
		if ch := fit(three + (three-light.Standing)/4); !ch.Chosen.Some || ch.Chosen.Checkpoint != nn.CheckpointLight || ch.Chosen.Checkpointed < 1 || ch.Chosen.Checkpointed > 3 {
			t.Errorf("room for three blocks checkpointed lightly: chose %+v", ch.Chosen)
		}
		if ch := fit(light.Need() - 1); ch.Chosen.Checkpoint != nn.CheckpointBlocks || ch.Chosen.MicroBatch != 0 {
			t.Errorf("a budget just short of the light checkpoints' need: chose %+v", ch.Chosen)
		}
	})
}

// TestNeedPlannedFromSlices: the need of a step on the whole batch, planned
// from the traces of its steps on two slices (stepPlan, FitBudget's
// sizing), is what the whole batch's step then needs, to the byte, eager
// and planned, with and without checkpoints (light ones too) and AMP, where the line through
// the two slices' needs falls short by up to 6.5%; and the pool's books
// replayed through the first step and it reserve what a pool that started
// empty did, to the byte.
func TestNeedPlannedFromSlices(t *testing.T) {
	const T, V, n = 32, 96, 16
	gpt := func(dev *tensor.Device) nn.Model {
		g, err := nn.NewGPT(dev, nn.GPTConfig{Layers: 4, Heads: 2, Width: 64, Vocab: V, Context: T})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	tokens := func(dev *tensor.Device) (*tensor.Tensor, *tensor.Tensor) {
		xs, ys := tokenBatches(dev, 1, n, T, V, 3)
		return xs[0], ys[0]
	}
	resnet := func(dev *tensor.Device) nn.Model {
		r, _ := nn.NewCIFARResNet(dev, 20, 1, 10)
		return r
	}
	images := func(dev *tensor.Device) (*tensor.Tensor, *tensor.Tensor) {
		return tensor.Randn(dev, tensor.F32, 0, 1, n, 1, 28, 28).Keep(), tensor.FromInt32(dev, make([]int32, n), n).Keep()
	}
	gptCfg := Config{Model: "gpt", Batch: n, LR: 1e-3, Optimizer: "adamw", Schedule: "constant", Seed: 1, Context: T, EvalEvery: 1, Steps: 1}
	for _, c := range []struct {
		name  string
		model func(*tensor.Device) nn.Model
		batch func(*tensor.Device) (*tensor.Tensor, *tensor.Tensor)
		cfg   Config
		v     Variant
		plan  bool
	}{
		{"gpt", gpt, tokens, gptCfg, Variant{Name: "fp32"}, false},
		{"gpt planned", gpt, tokens, gptCfg, Variant{Name: "fp32"}, true},
		{"gpt checkpoint", gpt, tokens, gptCfg, Variant{Name: "checkpoint", Checkpoint: nn.CheckpointBlocks}, false},
		{"gpt amp+checkpoint-2/4 planned", gpt, tokens, gptCfg, Variant{Name: "amp+checkpoint-2/4", AMP: AMPBF16, Checkpoint: nn.CheckpointBlocks, Checkpointed: 2}, true},
		{"gpt amp+checkpoint-light planned", gpt, tokens, gptCfg, Variant{Name: "amp+checkpoint-light", AMP: AMPBF16, Checkpoint: nn.CheckpointLight}, true},
		{"resnet20", resnet, images, baseConfig("resnet20"), Variant{Name: "fp32"}, false},
		{"resnet20 amp+checkpoint planned", resnet, images, baseConfig("resnet20"), Variant{Name: "amp+checkpoint", AMP: AMPBF16, Checkpoint: nn.CheckpointBlocks}, true},
	} {
		// The slices on a device, the whole batch on another: its pool's
		// reserve starts at nothing, as the books' do.
		var ms [3]Measurement
		var dev *tensor.Device
		var x, y *tensor.Tensor
		for i, k := range []int{2, 4, n} {
			if i != 1 {
				dev = tensor.NewDevice(cpu.New())
				x, y = c.batch(dev)
				defer x.Release()
				defer y.Release()
			}
			xk, yk := x, y
			if k < n {
				xk, yk = x.Rows(0, k), y.Rows(0, k)
				defer xk.Release()
				defer yk.Release()
			}
			m, err := measureStep(dev, func() nn.Model { return c.model(dev) }, c.cfg, c.v, xk, yk, c.plan)
			if err != nil {
				t.Fatal(err)
			}
			if m.trace == nil || (m.planning != nil) != c.plan {
				t.Fatalf("%s on %d examples: trace %v, planning %v", c.name, k, m.trace != nil, m.planning)
			}
			ms[i] = m
		}
		p, why := planStep(dev.Allocator(), ms[0], 2, ms[1], 4)
		if p == nil {
			t.Fatalf("%s: no plan from 2 and 4 examples: %s", c.name, why)
		}
		got := p.at(n, 0)
		line := ms[0].Need() + (ms[1].Need()-ms[0].Need())*(n-2)/2
		if want := ms[2].Need(); got.need != want {
			t.Errorf("%s: the need on %d examples planned from 2 and 4 is %d bytes, measured %d (the line through the two: %d)", c.name, n, got.need, want, line)
		}
		if !got.fits || got.reserved != ms[2].PeakReserved {
			t.Errorf("%s: the pool's books through the step on %d examples reserve %d bytes (fits %v), the pool %d", c.name, n, got.reserved, got.fits, ms[2].PeakReserved)
		}
	}
}

// TestBooksForeseeTheRun: what the pool's books, kept through the traces
// of two slices' steps planned to the whole batch (stepPlan), say of a
// step under a cap is what a run under that cap then does: its steps run,
// or run out of memory, eager on the CPU and planned on a device that is
// not the host, where the arena comes after the eager steps' fragments.
func TestBooksForeseeTheRun(t *testing.T) {
	race.Skip(t, "go test ./train -run TestBooksForeseeTheRun")
	ran := map[bool]int{} // by whether the run's steps ran
	cpuDev := func(testing.TB) *tensor.Device { return tensor.NewDevice(cpu.New()) }
	fake := func(testing.TB) *tensor.Device { return testdev.FakeGPU() }
	testBooksForeseeTheRun(t, cpuDev, Eager, []float64{1.25, 1.4}, ran)
	testBooksForeseeTheRun(t, fake, Planned, []float64{1.25, 1.4}, ran)
	if ran[true] == 0 || ran[false] == 0 {
		t.Errorf("%d runs ran and %d ran out of memory: want some of each", ran[true], ran[false])
	}
}

// testBooksForeseeTheRun measures each of a few variants of a GPT's step
// on two slices of its batch on a device of newDev's, and runs the step in
// mode (eager with activations offloaded, on a device that is not the
// host) on another, from an empty pool, capped at each of the caps times
// the need predicted for the every-block checkpointed step, holding the
// books' verdict to the run's; ran counts the runs by whether they ran.
func testBooksForeseeTheRun(t *testing.T, newDev func(testing.TB) *tensor.Device, mode Mode, caps []float64, ran map[bool]int) {
	const T, V, n = 64, 96, 16
	cfg := Config{Model: "gpt", Batch: n, LR: 1e-3, Optimizer: "adamw", Schedule: "constant", Seed: 1, Context: T, EvalEvery: 1, Steps: 1}
	gpt := func(dev *tensor.Device) nn.Model {
		g, err := nn.NewGPT(dev, nn.GPTConfig{Layers: 6, Heads: 2, Width: 64, Vocab: V, Context: T})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	var plans []*stepPlan
	variants := []Variant{
		{Name: "amp+checkpoint", AMP: AMPBF16, Checkpoint: nn.CheckpointBlocks},
		{Name: "amp+checkpoint-5/6", AMP: AMPBF16, Checkpoint: nn.CheckpointBlocks, Checkpointed: 5, Some: true},
		{Name: "checkpoint", Checkpoint: nn.CheckpointBlocks},
	}
	if !newDev(t).OnHost() { // and what the checkpoints keep in host memory, the steps eager
		variants = append(variants, Variant{Name: "amp+checkpoint+offload", AMP: AMPBF16, Checkpoint: nn.CheckpointBlocks, OffloadActivations: true})
	}
	// What a fresh device's pool holds of its own (the CUDA backend's cuBLAS
	// workspace), which each device must be back to.
	allocated := func(dev *tensor.Device) int64 { return dev.Allocator().Stats().Allocated[memory.All].Current }
	for _, v := range variants {
		dev := newDev(t)
		own := allocated(dev)
		xs, ys := tokenBatches(dev, 1, n, T, V, 3)
		var ms [2]Measurement
		for i, k := range []int{2, 4} {
			x, y := xs[0].Rows(0, k), ys[0].Rows(0, k)
			m, err := measureStep(dev, func() nn.Model { return gpt(dev) }, cfg, v, x, y, mode != Eager)
			if err != nil {
				t.Fatal(err)
			}
			ms[i] = m
			x.Release()
			y.Release()
		}
		xs[0].Release()
		ys[0].Release()
		if n := allocated(dev) - own; n != 0 {
			t.Errorf("%s %s: %d bytes left allocated after its measurements", dev.Name(), v.Name, n)
		}
		p, why := planStep(dev.Allocator(), ms[0], 2, ms[1], 4)
		if p == nil {
			t.Fatalf("%s %s: no plan: %s", dev.Name(), v.Name, why)
		}
		plans = append(plans, p)
	}
	base := plans[0].at(n, 0).need
	for _, c := range caps {
		budget := int64(c * float64(base))
		for i, v := range variants {
			booked := plans[i].at(n, budget).fits
			run := newDev(t)
			own := allocated(run)
			tr, err := New(gpt(run), run, variantConfig(cfg, v, true), 2)
			if err != nil {
				t.Fatal(err)
			}
			tr.FailOnOOM = true
			if !v.OffloadActivations {
				tr.Step.Mode = mode
			}
			xs, ys := tokenBatches(run, 1, n, T, V, 3)
			run.Allocator().SetLimit(budget)
			for range 4 {
				if err = tr.RunStep(xs[0], ys[0]); err != nil {
					break
				}
			}
			t.Logf("%s %v, %s under %s: the books say it fits: %v; the run ran: %v", run.Name(), tr.Step.Mode, v.Name, memory.Bytes(budget), booked, err == nil)
			if ran[err == nil]++; booked != (err == nil) {
				t.Errorf("%s %v, %s under %s: the books say it fits: %v; the run: %v", run.Name(), tr.Step.Mode, v.Name, memory.Bytes(budget), booked, err)
			}
			xs[0].Release()
			ys[0].Release()
			tr.Release()
			nn.Release(tr.Model)
			if n := allocated(run) - own; n != 0 {
				t.Errorf("%s %v, %s under %s: %d bytes left allocated after the run was released (ran: %v)", run.Name(), tr.Step.Mode, v.Name, memory.Bytes(budget), n, err == nil)
			}
		}
	}
}

// TestTimeStep: a variant's step is timed as the run takes it, after the
// steps that warm up, and a step that does not fit is an error that wraps
// memory.ErrOutOfMemory, the device's generator left as it was.
func TestTimeStep(t *testing.T) {
	dev := tensor.NewDevice(cpu.New())
	build := func() nn.Model { return nn.NewMLP(dev, []int{784, 1024, 10}, 0) }
	x, y := tensor.Randn(dev, tensor.F32, 0, 1, 32, 1, 28, 28).Keep(), tensor.FromInt32(dev, make([]int32, 32), 32).Keep()
	defer x.Release()
	defer y.Release()
	cfg := baseConfig("mlp")
	before := dev.Generator().State()
	s, err := TimeStep(dev, build, cfg, Variant{Name: "fp32"}, x, y, 3)
	if err != nil || s <= 0 || dev.Generator().State() != before {
		t.Errorf("an MLP's step: %v s, %v; the generator moved: %v", s, err, dev.Generator().State() != before)
	}
	a := dev.Allocator()
	a.EmptyCache()
	a.SetLimit(a.Stats().Reserved[memory.All].Current) // no room for the model's weights
	defer a.SetLimit(0)
	if _, err := TimeStep(dev, build, cfg, Variant{Name: "fp32"}, x, y, 1); !errors.Is(err, memory.ErrOutOfMemory) {
		t.Errorf("no room: %v", err)
	}
}

// TestMicroBatchesSizedOnTwo: a micro-batched step needs on two of its
// micro-batches what it needs on the whole batch, to the byte (its trace
// repeats a micro-batch's requests), so FitBudget sizes a count of
// micro-batches on two of them before it runs the whole batch.
func TestMicroBatchesSizedOnTwo(t *testing.T) {
	const T, V, n = 32, 96, 16
	dev := tensor.NewDevice(cpu.New())
	build := func() nn.Model {
		g, err := nn.NewGPT(dev, nn.GPTConfig{Layers: 4, Heads: 2, Width: 64, Vocab: V, Context: T})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	cfg := Config{Model: "gpt", Batch: n, LR: 1e-3, Optimizer: "adamw", Schedule: "constant", Seed: 1, Context: T, EvalEvery: 1, Steps: 1}
	xs, ys := tokenBatches(dev, 1, n, T, V, 3)
	x, y := xs[0], ys[0]
	defer x.Release()
	defer y.Release()
	for _, m := range []int{2, 4} {
		v := Variant{Name: "amp+checkpoint", AMP: AMPBF16, Checkpoint: nn.CheckpointBlocks, MicroBatch: m}
		x2, y2 := x.Rows(0, 2*m), y.Rows(0, 2*m)
		two, err := MeasureStep(dev, build, cfg, v, x2, y2, false)
		x2.Release()
		y2.Release()
		if err != nil {
			t.Fatal(err)
		}
		whole, err := MeasureStep(dev, build, cfg, v, x, y, false)
		if err != nil || two.Need() != whole.Need() {
			t.Errorf("micro-batches of %d: %d bytes on two of them, %d on %d examples (%v)", m, two.Need(), whole.Need(), n, err)
		}
		if m == 4 {
			// Room for micro-batches of 4 and not of 8.
			budget := whole.Need() + int64(BudgetHeadroom*float64(whole.Need()-whole.Standing)) + 1
			var out strings.Builder
			var c BudgetChoice
			dev.WithScope(func() { // the slices' views
				c, err = FitBudget(&out, dev, build, cfg, []Variant{{Name: "amp+checkpoint", AMP: AMPBF16, Checkpoint: nn.CheckpointBlocks}}, x, y, false, budget, nil)
			})
			said := out.String()
			if err != nil || c.Chosen.MicroBatch != 4 || !strings.Contains(said, "micro-batches of 4") || !strings.Contains(said, "on 2 of them") || strings.Contains(said, "does not fit") {
				t.Errorf("a budget of %d bytes: %v, chose %+v\n%s", budget, err, c.Chosen, said)
			}
		}
	}
}

// TestFewestCheckpointed: the fewest first blocks predicted to fit, by the
// blocks' shares, and none when only every block would do.
func TestFewestCheckpointed(t *testing.T) {
	for _, c := range []struct {
		name          string
		none, all, st int64
		shares        []float64
		budget        int64
		k             int
		need          int64
	}{
		// none − w·(none − all) with need + (need − standing)/10 ≤ budget.
		{"equal shares", 200, 100, 0, []float64{0.25, 0.25, 0.25, 0.25}, 180, 2, 150},
		{"the first blocks largest", 200, 100, 0, []float64{0.5, 0.2, 0.2, 0.1}, 180, 1, 150},
		{"standing counts no headroom", 200, 100, 100, []float64{0.25, 0.25, 0.25, 0.25}, 184, 1, 175},
		{"only every block", 200, 100, 0, []float64{0.25, 0.25, 0.25, 0.25}, 120, 0, 0},
		{"one block", 200, 100, 0, []float64{1}, 1000, 0, 0},
	} {
		k := fewestCheckpointed(c.none, c.all, c.st, c.shares, c.budget)
		need := int64(0)
		if k > 0 {
			need = checkpointedNeed(c.none, c.all, c.shares, k)
		}
		if k != c.k || need != c.need {
			t.Errorf("%s: the first %d blocks, %d bytes; want %d, %d", c.name, k, need, c.k, c.need)
		}
	}
}

// TestFewestFitting: the first count of blocks that fits, from the one
// predicted up, each asked in turn; every block when none below it fits.
func TestFewestFitting(t *testing.T) {
	for _, c := range []struct {
		k, blocks int
		fit       []int // the counts that fit
		want      int
		asked     []int
	}{
		{3, 9, []int{3, 4, 5}, 3, []int{3}},
		{3, 9, []int{4, 8}, 4, []int{3, 4}},
		{3, 9, []int{2, 6, 7}, 6, []int{3, 4, 5, 6}},
		{3, 9, []int{9}, 9, []int{3, 4, 5, 6, 7, 8}},
		{1, 2, nil, 2, []int{1}},
	} {
		var asked []int
		got, err := fewestFitting(c.k, c.blocks, func(k int) (bool, error) {
			asked = append(asked, k)
			return slices.Contains(c.fit, k), nil
		})
		if err != nil || got != c.want || !slices.Equal(asked, c.asked) {
			t.Errorf("from %d of %d, %v fitting: %d (%v), asked %v; want %d, asked %v", c.k, c.blocks, c.fit, got, err, asked, c.want, c.asked)
		}
	}
	boom := errors.New("boom")
	if _, err := fewestFitting(3, 9, func(int) (bool, error) { return false, boom }); err != boom {
		t.Errorf("a failing check: %v", err)
	}
}

// TestWithinBudget: the headroom is a tenth of a step's bytes beyond what
// stands between steps.
func TestWithinBudget(t *testing.T) {
	const gib = 1 << 30
	for _, c := range []struct {
		need, standing, budget int64
		ok                     bool
		headroom               int64
	}{
		{100, 0, 110, true, 10},
		{100, 0, 109, false, 10},
		{100, 60, 104, true, 4},
		{100, 60, 103, false, 4},
		{100, 100, 100, true, 0},
		{100, 120, 100, true, 0}, // a step that frees some of what stood
		{101, 0, 100, false, 10},
		// gpt3-6.7b's step under 24 GiB: bf16 weights stand, the rest comes and goes.
		{2166 * gib / 100, 1241 * gib / 100, 24 * gib, true, (2166 - 1241) * gib / 1000},
	} {
		ok, headroom := withinBudget(c.need, c.standing, c.budget)
		if ok != c.ok || headroom < c.headroom-1 || headroom > c.headroom+1 {
			t.Errorf("need %d, standing %d, budget %d: fits %v with headroom %d, want %v and %d", c.need, c.standing, c.budget, ok, headroom, c.ok, c.headroom)
		}
	}
}

// TestBudgetVariants: the configurations a budget is fitted with, fastest
// first, for a model with blocks and without, with light checkpoints and
// without, on the CPU and on a GPU (AMP's checkpointed steps before
// fp32's, activations offloaded), and with the user's choices kept.
func TestBudgetVariants(t *testing.T) {
	names := func(vs []Variant) string {
		var n []string
		for _, v := range vs {
			n = append(n, v.Name)
		}
		return strings.Join(n, " ")
	}
	noAMP := func(v Variant) bool { return !v.AMP.On() }
	noLight := func(v Variant) bool { return v.Checkpoint != nn.CheckpointLight }
	for _, c := range []struct {
		blocks, light, device bool
		keep                  func(Variant) bool
		want                  string
	}{
		{true, false, false, nil, "fp32 amp checkpoint-some checkpoint amp+checkpoint-some amp+checkpoint checkpoint-sqrt amp+checkpoint-sqrt"},
		{true, false, true, nil, "fp32 amp amp+checkpoint-some amp+checkpoint amp+checkpoint-sqrt amp+checkpoint+offload checkpoint-some checkpoint checkpoint-sqrt"},
		{false, false, true, nil, "fp32 amp"},
		{false, false, false, nil, "fp32 amp"},
		{true, false, true, noAMP, "fp32 checkpoint-some checkpoint checkpoint-sqrt"},
		{true, false, false, noAMP, "fp32 checkpoint-some checkpoint checkpoint-sqrt"},
		{true, true, false, nil, "fp32 amp checkpoint-light-some checkpoint-light checkpoint-some checkpoint amp+checkpoint-light-some amp+checkpoint-light amp+checkpoint-some amp+checkpoint checkpoint-sqrt amp+checkpoint-sqrt"},
		{true, true, true, nil, "fp32 amp amp+checkpoint-light-some amp+checkpoint-light amp+checkpoint-some amp+checkpoint amp+checkpoint-sqrt amp+checkpoint+offload checkpoint-light-some checkpoint-light checkpoint-some checkpoint checkpoint-sqrt"},
		{true, true, true, noLight, "fp32 amp amp+checkpoint-some amp+checkpoint amp+checkpoint-sqrt amp+checkpoint+offload checkpoint-some checkpoint checkpoint-sqrt"},
	} {
		vs := BudgetVariants(c.blocks, c.light, c.device, AMPBF16, c.keep)
		if got := names(vs); got != c.want {
			t.Errorf("blocks %v, light %v, device %v: %s, want %s", c.blocks, c.light, c.device, got, c.want)
		}
		for _, v := range vs {
			if v.Some && v.Checkpoint != nn.CheckpointBlocks && v.Checkpoint != nn.CheckpointLight {
				t.Errorf("%s checkpoints some of %v", v.Name, v.Checkpoint)
			}
			if v.OffloadActivations && (v.Checkpoint == nn.NoCheckpoint || !v.AMP.On()) {
				t.Errorf("%s offloads activations with checkpoint %v, AMP %v", v.Name, v.Checkpoint, v.AMP)
			}
		}
	}
}
