package train

import (
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
	PeakAllocated int64 `json:"peak_allocated"`
	PeakReserved  int64 `json:"peak_reserved"` // the pool's high-water mark: it only grows across variants
}

// MeasureStep builds a fresh model, runs one full training step (forward,
// backward, optimiser step) of variant v on the batch x, y, and returns the
// pool's peak allocated bytes during it: model, gradients, optimiser state,
// activations and workspaces, as the pool saw them, not estimated. The
// model and the optimiser state are released again, and the device's random
// generator is left as it was.
func MeasureStep(dev *tensor.Device, build func() nn.Module, cfg Config, v Variant, x, y *tensor.Tensor) (Measurement, error) {
	gen := dev.Generator()
	state := gen.State()
	defer gen.SetState(state)
	model := build()
	defer nn.Release(model)
	cfg.AMP, cfg.Checkpoint, cfg.Epochs, cfg.EmptyCacheEvery = v.AMP, v.Checkpoint, 1, 0
	t, err := New(model, dev, cfg, 1)
	if err != nil {
		return Measurement{}, err
	}
	defer t.Release()
	a := dev.Allocator()
	a.WindowPeak()
	t.TrainStep(x, y)
	pa, pr := a.WindowPeak()
	if err := dev.Synchronize(); err != nil {
		return Measurement{}, err
	}
	return Measurement{Variant: v, PeakAllocated: pa, PeakReserved: pr}, nil
}
