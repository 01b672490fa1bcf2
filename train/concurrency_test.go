package train

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
)

// TestTrainingBesideInference: one goroutine trains a ResNet (AMP and
// checkpointing: autocast, recomputation and scopes on the device; planned
// steps: traced and served from an arena) while two others serve another
// model on the same device, each on its own Session
// under NoGrad, one of them under Autocast. Everything each goroutine
// computes is what it computes alone, bit for bit: no goroutine sees
// another's grad mode, autocast, checkpoint recomputation or scopes. Run
// with -race (CI does).
func TestTrainingBesideInference(t *testing.T) {
	testTrainingBesideInference(t, tensor.NewDevice(cpu.New()), 0)
}

// testTrainingBesideInference runs on dev with planned training steps
// (captured on a GPU): the step's trace and plan see only its own
// goroutine's allocations (Note [the planner's goroutine] in memory), and
// while a step is captured the serving goroutines' calls wait (Note [one
// goroutine captures] in kernels/cuda). tol is the relative difference
// allowed from running alone: 0 (bit for bit) on the CPU; on a GPU cuDNN's
// algorithm search may pick others between the runs.
func testTrainingBesideInference(t *testing.T, dev *tensor.Device, tol float64) {
	ds := datasets.SyntheticSize(192, 5, 12)
	cfg := baseConfig("tiny")
	cfg.Batch, cfg.AMP, cfg.Checkpoint, cfg.Capture = 16, AMPF16, nn.CheckpointBlocks, true
	newTrainer := func() (*Trainer, nn.Model) {
		dev.Generator().Seed(1)
		m := nn.NewResNet(dev, "tiny", 1, 10, []int{8, 16}, []int{1, 1})
		tr, err := New(m, dev, cfg, 12)
		if err != nil {
			t.Fatal(err)
		}
		if tr.Step.Mode == Eager {
			tr.Step.Mode = Planned // on the CPU: traced and planned steps beside the serving goroutines' allocations
		}
		return tr, m
	}
	trainRun := func(tr *Trainer) error {
		l := datasets.NewLoader(ds, dev, datasets.LoaderConfig{Batch: cfg.Batch, Shuffle: true, Seed: 2})
		return tr.Fit(l, datasets.NewLoader(ds.Subset(32), dev, datasets.LoaderConfig{Batch: 32}), nil, "")
	}
	// The served model, made before any goroutine starts (the generator is
	// the device's), in evaluation mode.
	dev.Generator().Seed(2)
	served := nn.NewResNet(dev, "served", 1, 10, []int{8, 16}, []int{1, 1})
	defer nn.Release(served)
	served.SetTraining(false)
	rng := rand.New(rand.NewPCG(3, 3))
	inputs := make([][]float32, 6)
	for i := range inputs {
		inputs[i] = make([]float32, 8*144)
		for j := range inputs[i] {
			inputs[i][j] = float32(rng.NormFloat64())
		}
	}
	serve := func(amp bool) [][]float32 {
		s := dev.Session()
		var out [][]float32
		ag.NoGrad(s, func() {
			for _, in := range inputs {
				s.WithScope(func() {
					x := tensor.FromFloat32(s, in, 8, 1, 12, 12)
					var y *tensor.Tensor
					if amp {
						ag.Autocast(s, tensor.F16, func() { y = served.Forward(x) })
					} else {
						y = served.Forward(x)
					}
					if y.RequiresGrad() {
						t.Error("an operation under NoGrad on a session was recorded")
					}
					out = append(out, y.Float32s())
				})
			}
		})
		return out
	}

	// Alone.
	tr, model := newTrainer()
	if err := trainRun(tr); err != nil {
		t.Fatal(err)
	}
	wantParams := snapshotState(model)
	tr.Release()
	nn.Release(model)
	wantF32, wantAMP := serve(false), serve(true)
	base := dev.Allocator().Stats()

	// Together.
	tr, model = newTrainer()
	var wg sync.WaitGroup
	var trainErr error
	var gotF32, gotAMP [][]float32
	wg.Add(3)
	go func() { defer wg.Done(); trainErr = trainRun(tr) }()
	go func() { defer wg.Done(); gotF32 = serve(false) }()
	go func() { defer wg.Done(); gotAMP = serve(true) }()
	wg.Wait()
	if trainErr != nil {
		t.Fatal(trainErr)
	}
	if tr.Step.Plan(tensor.F32, []int{cfg.Batch, 1, 12, 12}, []int{cfg.Batch}) == nil {
		t.Errorf("the %v step never planned beside the serving goroutines: %v", tr.Step.Mode, tr.Step.Notes())
	}
	for i, e := range model.State("") {
		if tol > 0 && e.T.DType() == tensor.F32 {
			if d := relDiff(e.T.Float32s(), wantF32s(wantParams[i])); d > tol {
				t.Errorf("trained %s differs from training alone by %.3g", e.Name, d)
			}
		} else if !bytes.Equal(e.T.Raw(), wantParams[i]) {
			t.Errorf("trained %s differs from training alone", e.Name)
		}
	}
	tr.Release()
	nn.Release(model)
	same := func(a, b [][]float32) bool {
		if len(a) != len(b) {
			return false
		}
		for i := range a {
			if d := relDiff(a[i], b[i]); d > tol || (tol == 0 && d != 0) {
				return false
			}
		}
		return true
	}
	if !same(gotF32, wantF32) || !same(gotAMP, wantAMP) {
		t.Error("inference beside training differs from inference alone")
	}
	if same(wantF32, wantAMP) {
		t.Error("autocast changed nothing: the test would not see it leak")
	}
	if a, b := dev.Allocator().Stats().Allocated, base.Allocated; a[0].Current != b[0].Current {
		t.Errorf("%d bytes allocated after, %d before: a scope of one goroutine kept or freed another's tensors", a[0].Current, b[0].Current)
	}
}

// wantF32s decodes an F32 tensor's raw bytes (snapshotState).
func wantF32s(raw []byte) []float32 {
	out := make([]float32, len(raw)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return out
}
