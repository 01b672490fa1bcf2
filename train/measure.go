package train

import (
	"errors"
	"fmt"
	ag "github.com/leangrad/leangrad/autograd"
	"io"

	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
)

// Variant is one memory configuration: AMP on or off, checkpointing mode.
type Variant struct {
	Name       string `json:"name"`
	AMP        bool   `json:"amp"`
	Checkpoint string `json:"checkpoint"`
	MicroBatch int    `json:"micro_batch,omitempty"` // 0: whole batches (Step.SetMicroBatch)
}

// Variants are the four configurations the savings are measured across.
func Variants(checkpoint string) []Variant {
	if checkpoint == "" || checkpoint == "none" {
		checkpoint = "blocks"
	}
	return []Variant{
		{Name: "fp32", Checkpoint: "none"},
		{Name: "amp", AMP: true, Checkpoint: "none"},
		{Name: "checkpoint", Checkpoint: checkpoint},
		{Name: "amp+checkpoint", AMP: true, Checkpoint: checkpoint},
	}
}

// VariantName names a configuration as Variants does.
func VariantName(amp bool, checkpoint string) string {
	ck := checkpoint != "" && checkpoint != "none"
	switch {
	case amp && ck:
		return "amp+checkpoint"
	case amp:
		return "amp"
	case ck:
		return "checkpoint"
	}
	return "fp32"
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
	// OutOfMemory is set when the step did not fit the device at all.
	OutOfMemory bool `json:"out_of_memory,omitempty"`
	// Holds says what the measured step held at the end of its forward.
	Holds *Breakdown `json:"holds,omitempty"`
}

// Breakdown is what a training step holds at the end of its forward, when
// everything its backward needs is alive, by kind: each pool block counted
// once, at its size in the pool. A micro-batched step's is its largest
// micro-batch's.
type Breakdown struct {
	Allocated  int64 `json:"allocated"`  // the pool's allocated bytes then
	Parameters int64 `json:"parameters"` // the model's state: weights and buffers
	Optimizer  int64 `json:"optimizer"`  // the optimiser's state (momentum, moments)
	Batch      int64 `json:"batch"`      // the step's inputs and targets
	// Saved is what the graph holds for the backward, by the operation that
	// saved it (autograd.Saved), less the blocks counted above.
	Saved []ag.SavedBytes `json:"saved"`
	// Other is the rest: the loss and the metrics, workspaces and
	// temporaries still alive.
	Other int64 `json:"other"`
	// Backward is how much more the step's peak held than the end of its
	// forward: the gradients and the backward's temporaries.
	Backward int64 `json:"backward"`
}

// SavedTotal is the bytes of Saved.
func (b *Breakdown) SavedTotal() int64 {
	var n int64
	for _, s := range b.Saved {
		n += s.Bytes
	}
	return n
}

// holdings records, at the end of each forward, what the step holds.
type holdings struct {
	t     *Trainer
	x, y  *tensor.Tensor
	worst *Breakdown
}

func (h *holdings) observe(loss *tensor.Tensor) {
	seen := map[*memory.Block]bool{}
	blocks := func(ts ...*tensor.Tensor) int64 {
		var n int64
		for _, t := range ts {
			if t == nil {
				continue
			}
			if b := t.Block(); b != nil && !seen[b] {
				seen[b] = true
				n += b.Size()
			}
		}
		return n
	}
	b := &Breakdown{Allocated: h.t.Dev.Allocator().Stats().Allocated[memory.All].Current}
	for _, n := range h.t.Model.State("") {
		b.Parameters += blocks(n.T)
	}
	for _, v := range deviceState(h.t.Opt) {
		b.Optimizer += blocks(v)
	}
	b.Batch = blocks(h.x, h.y)
	b.Saved = ag.Saved(loss, func(blk *memory.Block) bool { return seen[blk] })
	b.Other = b.Allocated - b.Parameters - b.Optimizer - b.Batch - b.SavedTotal()
	if h.worst == nil || b.Allocated > h.worst.Allocated {
		h.worst = b
	}
}

// Need is the memory a run of the measured configuration needs: the eager
// step's peak, or the planned step's where that is more.
func (m Measurement) Need() int64 { return max(m.PeakAllocated, m.Planned) }

// MeasureStep builds a fresh model and runs training steps of variant v on
// the batch x, y, and returns the pool's peak allocated bytes during an
// eager step, after a first one (model, gradients, optimiser state,
// activations and workspaces, as the pool saw them, not estimated); with
// plan, that step is traced and planned, and Planned is the planned step's
// need. The model and the optimiser state are released again, and the
// device's random generator is left as it was.
func MeasureStep(dev *tensor.Device, build func() nn.Model, cfg Config, v Variant, x, y *tensor.Tensor, plan bool) (Measurement, error) {
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
	t.FailOnOOM = true
	if plan {
		t.Step.Mode = Planned
	}
	if err := t.Step.SetMicroBatch(v.MicroBatch); err != nil {
		return Measurement{}, err
	}
	a := dev.Allocator()
	if err := t.RunStep(x, y); err != nil { // the optimiser's state exists from here on
		return Measurement{}, err
	}
	base := a.Stats().Allocated[memory.All].Current
	h := &holdings{t: t, x: x, y: y}
	t.Step.Observe = h.observe
	a.WindowPeak()
	if err := t.RunStep(x, y); err != nil {
		return Measurement{}, err
	}
	t.Step.Observe = nil
	pa, pr := a.WindowPeak()
	if err := dev.Synchronize(); err != nil {
		return Measurement{}, err
	}
	m := Measurement{Variant: v, PeakAllocated: pa, PeakReserved: pr, Holds: h.worst}
	if h.worst != nil {
		h.worst.Backward = pa - h.worst.Allocated
	}
	if p := t.Step.Plan(x.DType(), x.Shape(), y.Shape()); plan && p != nil {
		m.Planned = base + p.Size
	}
	return m, nil
}

// BudgetHeadroom is the share of a memory budget that FitBudget leaves to
// the pool's rounding and fragmentation: a configuration fits when its
// measured need is at most (1-BudgetHeadroom) of the budget.
const BudgetHeadroom = 0.1

// BudgetChoice is what FitBudget measured and chose.
type BudgetChoice struct {
	Budget   int64         `json:"budget"`
	Measured []Measurement `json:"measured"` // in the order tried
	Chosen   Variant       `json:"chosen"`
}

// BudgetVariants are the configurations a memory budget is fitted with,
// fastest first on a GPU: fp32, AMP, checkpointed blocks, both, then
// checkpointed sqrt(n) segments without and with AMP (only the first two
// for a model without residual blocks). keep drops those a user ruled out.
func BudgetVariants(resnet bool, keep func(Variant) bool) []Variant {
	vs := Variants("blocks")
	vs = append(vs, Variant{Name: "checkpoint-sqrt", Checkpoint: "sqrt"}, Variant{Name: "amp+checkpoint-sqrt", AMP: true, Checkpoint: "sqrt"})
	var out []Variant
	for _, v := range vs {
		if (resnet || v.Checkpoint == "none") && (keep == nil || keep(v)) {
			out = append(out, v)
		}
	}
	return out
}

// FitBudget measures the candidates' training steps on the batch x, y in
// order (MeasureStep) and chooses the first whose need fits the budget
// (see BudgetHeadroom). When none does, it measures the leanest of them
// with micro-batches of half the batch, a quarter, ... down to one example,
// and chooses the first that fits. It returns an error wrapping
// memory.ErrOutOfMemory when nothing fits. Each measurement is written to w
// as it is taken.
func FitBudget(w io.Writer, dev *tensor.Device, build func() nn.Model, cfg Config, candidates []Variant, x, y *tensor.Tensor, plan bool, budget int64) (BudgetChoice, error) {
	c := BudgetChoice{Budget: budget}
	limit := int64(float64(budget) * (1 - BudgetHeadroom))
	try := func(v Variant) (bool, error) {
		m, err := MeasureStep(dev, build, cfg, v, x, y, plan)
		if errors.Is(err, memory.ErrOutOfMemory) {
			m, err = Measurement{Variant: v, OutOfMemory: true}, nil
		}
		if err != nil {
			return false, err
		}
		c.Measured = append(c.Measured, m)
		fits := !m.OutOfMemory && m.Need() <= limit
		need := "out of memory"
		if !m.OutOfMemory {
			need = memory.Bytes(m.Need()).String()
		}
		verdict := "does not fit"
		if fits {
			verdict = "fits"
		}
		fmt.Fprintf(w, "  %-38s %10s  %s\n", describeVariant(v, x.Dim(0)), need, verdict)
		if fits {
			c.Chosen = v
		}
		return fits, nil
	}
	fmt.Fprintf(w, "fitting a step into a budget of %s (%s after %.0f%% headroom):\n", memory.Bytes(budget), memory.Bytes(limit), 100*BudgetHeadroom)
	for _, v := range candidates {
		if ok, err := try(v); ok || err != nil {
			return c, err
		}
	}
	leanest := -1
	for i, m := range c.Measured {
		if !m.OutOfMemory && (leanest < 0 || m.Need() < c.Measured[leanest].Need()) {
			leanest = i
		}
	}
	if leanest < 0 {
		leanest = len(c.Measured) - 1
	}
	v := c.Measured[leanest].Variant
	for n := x.Dim(0); n > 1; {
		n = (n + 1) / 2
		v.MicroBatch = n
		if ok, err := try(v); ok || err != nil {
			return c, err
		}
	}
	return c, fmt.Errorf("no configuration fits a budget of %s, not even %s one example at a time: %w", memory.Bytes(budget), v.Name, memory.ErrOutOfMemory)
}

// describeVariant names v at a batch of n: "amp+checkpoint, micro-batches of 16".
func describeVariant(v Variant, n int) string {
	if v.MicroBatch > 0 && v.MicroBatch < n {
		return fmt.Sprintf("%s, micro-batches of %d", v.Name, v.MicroBatch)
	}
	return v.Name
}
