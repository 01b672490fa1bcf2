package train

import (
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
)

// Variant is one memory configuration: AMP on or off, checkpointing mode.
type Variant struct {
	Name       string `json:"name"`
	AMP        bool   `json:"amp"`
	Checkpoint string `json:"checkpoint"`
}

// Variants are the four configurations the savings are measured across.
func Variants(checkpoint string) []Variant {
	if checkpoint == "" || checkpoint == "none" {
		checkpoint = "blocks"
	}
	return []Variant{
		{"fp32", false, "none"},
		{"amp", true, "none"},
		{"checkpoint", false, checkpoint},
		{"amp+checkpoint", true, checkpoint},
	}
}

// Measurement is the pool's peak for one variant's training step.
type Measurement struct {
	Variant
	PeakAllocated int64 `json:"peak_allocated"` // an eager step's, measured by the pool
	PeakReserved  int64 `json:"peak_reserved"`  // the pool's high-water mark: it only grows across variants
	// Planned is what a planned (or captured) step needs: the memory alive
	// before the step (parameters, optimiser state) plus the arena its
	// traced allocations were planned into. Zero when not planned.
	Planned int64 `json:"planned,omitempty"`
}

// MeasureStep builds a fresh model and runs training steps of variant v on
// the batch x, y, and returns the pool's peak allocated bytes during an
// eager step, after a first one (model, gradients, optimiser state,
// activations and workspaces, as the pool saw them, not estimated); with
// plan, that step is traced and planned, and Planned is the planned step's
// need. The model and the optimiser state are released again, and the
// device's random generator is left as it was.
func MeasureStep(dev *tensor.Device, build func() nn.Module, cfg Config, v Variant, x, y *tensor.Tensor, plan bool) (Measurement, error) {
	gen := dev.Generator()
	state := gen.State()
	defer gen.SetState(state)
	model := build()
	defer nn.Release(model)
	cfg.AMP, cfg.Checkpoint, cfg.Epochs, cfg.EmptyCacheEvery, cfg.Capture = v.AMP, v.Checkpoint, 1, 0, false
	t, err := New(model, dev, cfg, 2)
	if err != nil {
		return Measurement{}, err
	}
	defer t.Release()
	if plan {
		t.Step.Mode = Planned
	}
	a := dev.Allocator()
	if err := t.RunStep(x, y); err != nil { // the optimiser's state exists from here on
		return Measurement{}, err
	}
	base := a.Stats().Allocated[memory.All].Current
	a.WindowPeak()
	if err := t.RunStep(x, y); err != nil {
		return Measurement{}, err
	}
	pa, pr := a.WindowPeak()
	if err := dev.Synchronize(); err != nil {
		return Measurement{}, err
	}
	m := Measurement{Variant: v, PeakAllocated: pa, PeakReserved: pr}
	if p := t.Step.Plan(x.Shape(), y.Shape()); plan && p != nil {
		m.Planned = base + p.Size
	}
	return m, nil
}
