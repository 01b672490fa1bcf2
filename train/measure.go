package train

import (
	"fmt"
	"slices"
	"strings"
	"time"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
)

// Variant is one memory configuration: AMP or not, checkpointing mode.
type Variant struct {
	Name       string            `json:"name"`
	AMP        AMP               `json:"amp"`
	Checkpoint nn.CheckpointMode `json:"checkpoint"`
	// Checkpointed limits CheckpointBlocks (and CheckpointLight) to the first blocks
	// (Config.Checkpointed; 0: all).
	Checkpointed int `json:"checkpointed,omitempty"`
	// Some, in FitBudget's candidates, checkpoints as few of the first
	// blocks as the budget allows: FitBudget predicts how many from its
	// twins' needs, Checkpoint without Some and no checkpointing, and sets
	// Checkpointed (Note [checkpointing some blocks] in package nn).
	Some       bool `json:"some,omitempty"`
	MicroBatch int  `json:"micro_batch,omitempty"` // 0: whole batches (Step.SetMicroBatch)
	// OffloadActivations moves what the checkpointed blocks keep to host
	// memory (Config.OffloadActivations).
	OffloadActivations bool `json:"offload_activations,omitempty"`
	// OffloadOptimizer keeps the optimizer's state in host memory
	// (Config.OffloadOptimizer).
	OffloadOptimizer bool `json:"offload_optimizer,omitempty"`
	// Optimizer replaces the recipe's optimizer ("": the recipe's), for
	// the benchmarks' searches (adamw8bit's quarter-size state).
	Optimizer string `json:"optimizer,omitempty"`
	// BF16Weights holds a GPT's product weights in BF16 on the device, their
	// F32 masters with the offloaded optimizer (Config.BF16Weights): with
	// OffloadOptimizer and BF16 autocast.
	BF16Weights bool `json:"bf16_weights,omitempty"`
}

// Variants are the four configurations the savings are measured across:
// fp32, AMP in amp's dtype (AMPF16 when amp is NoAMP), checkpointing as
// mode says (blocks when it says none), and both.
func Variants(mode nn.CheckpointMode, amp AMP) []Variant {
	if mode == nn.NoCheckpoint {
		mode = nn.CheckpointBlocks
	}
	if !amp.On() {
		amp = AMPF16
	}
	return []Variant{
		{Name: "fp32"},
		{Name: "amp", AMP: amp},
		{Name: VariantName(NoAMP, mode), Checkpoint: mode},
		{Name: VariantName(amp, mode), AMP: amp, Checkpoint: mode},
	}
}

// VariantName names a configuration as Variants does.
func VariantName(amp AMP, mode nn.CheckpointMode) string {
	ck := ""
	switch mode {
	case nn.NoCheckpoint:
	case nn.CheckpointLight:
		ck = "checkpoint-light"
	default:
		ck = "checkpoint"
	}
	switch {
	case amp.On() && ck != "":
		return "amp+" + ck
	case amp.On():
		return "amp"
	case ck != "":
		return ck
	}
	return "fp32"
}

// SomeCheckpointedName names the variant that checkpoints the first k of
// a model's blocks as mode says: "amp+checkpoint-3/12",
// "amp+checkpoint-light-3/12".
func SomeCheckpointedName(amp AMP, mode nn.CheckpointMode, k, blocks int) string {
	return fmt.Sprintf("%s-%d/%d", VariantName(amp, mode), k, blocks)
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
	// Standing is what stays allocated between steps (parameters,
	// optimiser state, whatever else outlives a step): allocated once, it
	// does not fragment the pool as the step's own bytes can.
	Standing int64 `json:"standing,omitempty"`
	// Shares is about what checkpointing each of the model's blocks saves,
	// as shares of what checkpointing all of them does
	// (nn.Checkpointer.CheckpointShares).
	Shares []float64 `json:"checkpoint_shares,omitempty"`
	// StepSeconds is what the step costs: an eager step's time, the
	// measured one's (MeasureStep); for a run whose steps are planned or
	// captured, the median of a few taken so (TimeStep), where they were
	// timed.
	StepSeconds float64 `json:"step_seconds,omitempty"`
	// OutOfMemory is set when the step did not fit the device at all.
	OutOfMemory bool `json:"out_of_memory,omitempty"`
	// Examples is how many of the batch's examples the step ran, when
	// FitBudget sized the variant on a few (0: the whole batch).
	Examples int `json:"examples,omitempty"`
	// Holds says what the measured step held at the end of its forward.
	Holds *Breakdown `json:"holds,omitempty"`
	// Peak says what the measured step held at its peak, from its trace.
	Peak *Breakdown `json:"peak,omitempty"`
	// PlannedPeak says what the planned step holds at its arena's peak.
	PlannedPeak *Breakdown `json:"planned_peak,omitempty"`

	// trace is the measured step's allocations (nil when it could not be
	// traced), and planning, for a planned step, how its plan sized them:
	// FitBudget plans a whole batch's step from two slices' (budgetSearch.sizeBatch).
	trace          *memory.Trace
	planning       *memory.PlanOptions
	standingBlocks []int64 // what stands between steps, block by block
	// first is the trace of the first step, which leaves the optimiser's
	// state (memory.Allocator.StopTraceLeaving), and built what was
	// allocated before it, block by block.
	first *memory.Trace
	built []int64
}

// allocatedBlocks are the requested sizes of a's blocks allocated now, in
// the order of their addresses.
func allocatedBlocks(a *memory.Allocator) []int64 {
	var out []int64
	for _, seg := range a.Snapshot().Segments {
		for _, b := range seg.Blocks {
			if b.Allocated {
				out = append(out, b.Requested)
			}
		}
	}
	return out
}

// Breakdown is what a training step holds at one moment, by kind: at the
// end of its forward (Measurement.Holds), when everything its backward
// needs is alive, or at its peak (Peak, PlannedPeak), from the step's
// trace and the roles its buffers were given there (memory.Role). Each
// pool block is counted once, at its size in the pool (in a trace, its
// rounded request). A micro-batched step's is its largest micro-batch's.
type Breakdown struct {
	Allocated  int64 `json:"allocated"`  // the bytes allocated then
	Parameters int64 `json:"parameters"` // the model's state: weights and buffers
	Optimizer  int64 `json:"optimizer"`  // the optimiser's state (momentum, moments)
	Batch      int64 `json:"batch"`      // the step's inputs and targets
	// Saved is what the graph holds for the backward, by the operation that
	// saved it (autograd.Saved; at a peak, "conv2d (recomputed)" is what a
	// checkpoint's recomputation saved), less the blocks counted above.
	Saved []ag.SavedBytes `json:"saved"`
	// Other is the rest: the loss and the metrics, temporaries and, at the
	// end of the forward, workspaces still alive.
	Other int64 `json:"other"`
	// Backward is how much more the step's peak held than the end of its
	// forward: the gradients and the backward's temporaries, or an op's
	// temporaries where the peak is in the forward.
	Backward int64 `json:"backward,omitempty"`

	// At a peak only:
	Phase              string `json:"phase,omitempty"`               // what the step was doing ("the backward of conv2d")
	Gradients          int64  `json:"gradients,omitempty"`           // passed on through the backward
	ParameterGradients int64  `json:"parameter_gradients,omitempty"` // kept for the optimiser
	Workspaces         int64  `json:"workspaces,omitempty"`          // convolutions' scratch
	Gaps               int64  `json:"gaps,omitempty"`                // a planned arena's bytes not live at its peak
}

// SavedTotal is the bytes of Saved.
func (b *Breakdown) SavedTotal() int64 {
	var n int64
	for _, s := range b.Saved {
		n += s.Bytes
	}
	return n
}

// Kinds lists the bytes of each kind, "parameters 42.66 MiB, optimiser
// state ...": those only a peak has where they are not zero.
func (b *Breakdown) Kinds() string {
	kinds := []struct {
		name  string
		bytes int64
		peak  bool // a peak's kind: left out when zero
	}{
		{"parameters", b.Parameters, false},
		{"optimiser state", b.Optimizer, false},
		{"parameter gradients", b.ParameterGradients, true},
		{"batch", b.Batch, false},
		{"saved for the backward", b.SavedTotal(), false},
		{"gradients", b.Gradients, true},
		{"workspaces", b.Workspaces, true},
		{"gaps", b.Gaps, true},
		{"other", b.Other, false},
	}
	var parts []string
	for _, k := range kinds {
		if !k.peak || k.bytes != 0 {
			parts = append(parts, fmt.Sprintf("%s %s", k.name, memory.Bytes(k.bytes)))
		}
	}
	return strings.Join(parts, ", ")
}

// SavedBy lists the n operations whose saved tensors take the most,
// "checkpoint 23.75 MiB, batch_norm ...", and how many more there are.
func (b *Breakdown) SavedBy(n int) string {
	var parts []string
	for i, s := range b.Saved {
		if i == n {
			parts = append(parts, fmt.Sprintf("%d more", len(b.Saved)-i))
			break
		}
		parts = append(parts, fmt.Sprintf("%s %s", s.Op, memory.Bytes(s.Bytes)))
	}
	return strings.Join(parts, ", ")
}

// blockCounter adds up pool blocks, each once.
type blockCounter map[*memory.Block]bool

func (c blockCounter) bytes(ts ...*tensor.Tensor) int64 {
	var n int64
	for _, t := range ts {
		if t == nil {
			continue
		}
		if b := t.Block(); b != nil && !c[b] {
			c[b] = true
			n += b.Size()
		}
	}
	return n
}

// standing counts what lives now, outside a step, by kind: parameters,
// optimiser state, the batch x, y (and the step's static copies of
// batches of their shapes), and the rest allocated as Other.
func (t *Trainer) standing(x, y *tensor.Tensor, seen blockCounter) Breakdown {
	b := Breakdown{Allocated: t.Dev.Allocator().Stats().Allocated[memory.All].Current}
	for _, n := range t.Model.State("") {
		b.Parameters += seen.bytes(n.T)
	}
	for _, v := range deviceState(t.Opt) {
		b.Optimizer += seen.bytes(v)
	}
	b.Batch = seen.bytes(x, y)
	if st := t.Step.shapes[shapeKey(x.DType(), x.Shape(), y.DType(), y.Shape())]; st != nil {
		b.Batch += seen.bytes(st.x, st.y)
	}
	b.Other = b.Allocated - b.Parameters - b.Optimizer - b.Batch
	return b
}

// peakOf is what a step holds at the peak of its trace tr with the buffers
// at the sizes choice (the traced run's, Trace.Taken, or a plan's), beside
// before, what lives outside the step (standing).
func peakOf(tr *memory.Trace, choice []int, before Breakdown) *Breakdown {
	event, live := tr.Peak(choice)
	b := before
	b.Allocated += live
	b.Phase = tr.PhaseAt(event)
	saved := map[string]*ag.SavedBytes{}
	for _, i := range tr.LiveAt(event) {
		buf := tr.Buffers[i]
		size := buf.Sizes[choice[i]]
		switch r := buf.Role; r.Category {
		case memory.Activation:
			op := r.Op
			if r.Recomputed {
				op += " (recomputed)"
			}
			if saved[op] == nil {
				saved[op] = &ag.SavedBytes{Op: op}
			}
			saved[op].Bytes += size
			saved[op].Blocks++
		case memory.Gradient:
			b.Gradients += size
		case memory.ParameterGradient:
			b.ParameterGradients += size
		case memory.Workspace:
			b.Workspaces += size
		default:
			b.Other += size
		}
	}
	for _, s := range saved {
		b.Saved = append(b.Saved, *s)
	}
	ag.SortSaved(b.Saved)
	return &b
}

// PlannedPeak says what the planned (and captured) step of batches shaped
// like x and y holds at its arena's peak: what lives outside the step, as
// counted now (call it between steps), and the arena's buffers live at its
// peak by the roles the traced step gave them; the arena's bytes not live
// then are Gaps. It is nil before the shape is planned.
func (t *Trainer) PlannedPeak(x, y *tensor.Tensor) *Breakdown {
	p := t.Step.Plan(x.DType(), x.Shape(), y.Shape())
	if p == nil {
		return nil
	}
	b := peakOf(p.Trace, p.Choice, t.standing(x, y, blockCounter{}))
	b.Gaps = p.Size - p.Live
	b.Allocated += b.Gaps
	return b
}

// holdings records, at the end of each forward, what the step holds.
type holdings struct {
	t     *Trainer
	x, y  *tensor.Tensor
	worst *Breakdown
}

func (h *holdings) observe(loss *tensor.Tensor) {
	seen := blockCounter{}
	b := h.t.standing(h.x, h.y, seen)
	b.Saved = ag.Saved(loss, func(blk *memory.Block) bool { return seen[blk] })
	b.Other -= b.SavedTotal()
	if h.worst == nil || b.Allocated > h.worst.Allocated {
		h.worst = &b
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
// need; without, StepSeconds is its time. The model and the optimiser
// state are released again, and the device's random generator is left as
// it was. It returns an error wrapping memory.ErrOutOfMemory where the
// model or its steps do not fit.
func MeasureStep(dev *tensor.Device, build func() nn.Model, cfg Config, v Variant, x, y *tensor.Tensor, plan bool) (Measurement, error) {
	m, err := measureStep(dev, build, cfg, v, x, y, plan)
	m.dropTraces()
	return m, err
}

// dropTraces lets go of what only FitBudget's plans read: a large model's
// traces are many buffers.
func (m *Measurement) dropTraces() {
	m.trace, m.first, m.built, m.standingBlocks, m.planning = nil, nil, nil, nil, nil
}

// measureStep is MeasureStep, its traces kept for stepPlan.
func measureStep(dev *tensor.Device, build func() nn.Model, cfg Config, v Variant, x, y *tensor.Tensor, plan bool) (Measurement, error) {
	gen := dev.Generator()
	state := gen.State()
	defer gen.SetState(state)
	var model nn.Model
	if err := tensor.Catch(func() { model = build() }); err != nil { // its parameters out of memory
		return Measurement{}, err
	}
	defer nn.Release(model)
	t, err := New(model, dev, variantConfig(cfg, v, false), 2)
	if err != nil {
		return Measurement{}, err
	}
	defer t.Release()
	t.FailOnOOM = true
	// Micro-batches accumulate: such steps run eagerly, and are measured
	// so.
	plan = plan && (v.MicroBatch == 0 || v.MicroBatch >= x.Dim(0))
	if plan {
		t.Step.Mode = Planned
	}
	if err := t.Step.SetMicroBatch(v.MicroBatch); err != nil {
		return Measurement{}, err
	}
	a := dev.Allocator()
	// The first step is traced too, what it leaves (the optimiser's
	// state) and all: with what was allocated before it, it is what the
	// pool's books need to replay the measured step from where this pool
	// starts (stepPlan).
	built := allocatedBlocks(a)
	a.StartTrace()
	err = t.RunStep(x, y) // the optimiser's state exists from here on
	first, ferr := a.StopTraceLeaving()
	if err != nil {
		return Measurement{}, err
	}
	if ferr != nil {
		first = nil
	}
	base := a.Stats().Allocated[memory.All].Current
	standing := allocatedBlocks(a)
	before := t.standing(x, y, blockCounter{})
	h := &holdings{t: t, x: x, y: y}
	t.Step.Observe = h.observe
	a.WindowPeak()
	// A planned step traces this run itself (Step.Run); an eager one is
	// traced here, for what it holds at its peak.
	var trace *memory.Trace
	if err := dev.Synchronize(); err != nil { // the first step's work is not this one's time
		return Measurement{}, err
	}
	start := time.Now()
	err = func() error {
		if plan {
			return t.RunStep(x, y)
		}
		a.StartTrace()
		err := t.RunStep(x, y)
		tr, terr := a.StopTrace()
		if terr == nil {
			trace = tr
		}
		return err
	}()
	if err != nil {
		return Measurement{}, err
	}
	t.Step.Observe = nil
	pa, pr := a.WindowPeak()
	if err := dev.Synchronize(); err != nil {
		return Measurement{}, err
	}
	m := Measurement{Variant: v, PeakAllocated: pa, PeakReserved: pr, Standing: base, Holds: h.worst}
	if !plan { // an eager run's step as it takes it, but traced
		m.StepSeconds = time.Since(start).Seconds()
	}
	if c, ok := model.(nn.Checkpointer); ok {
		m.Shares = c.CheckpointShares(x.Shape()[1:])
	}
	if h.worst != nil {
		h.worst.Backward = pa - h.worst.Allocated
	}
	if p := t.Step.Plan(x.DType(), x.Shape(), y.Shape()); plan && p != nil {
		m.Planned = base + p.Size
		trace = p.Trace
		m.PlannedPeak = t.PlannedPeak(x, y)
		planning := t.Step.Planning
		m.planning = &planning
	}
	if trace != nil {
		m.Peak = peakOf(trace, trace.Taken(), before)
		m.trace, m.first, m.built, m.standingBlocks = trace, first, built, standing
	}
	return m, nil
}

// variantConfig is cfg for a run of variant v's step alone: one epoch, no
// evaluation, captured where capture says and cfg's run would be.
func variantConfig(cfg Config, v Variant, capture bool) Config {
	cfg.AMP, cfg.Checkpoint, cfg.Checkpointed, cfg.Epochs, cfg.Steps, cfg.EvalEvery, cfg.EmptyCacheEvery = v.AMP, v.Checkpoint, v.Checkpointed, 1, 0, 0, 0
	cfg.Capture = capture && cfg.Capture
	// Without checkpoints nothing is kept to move to host memory.
	cfg.OffloadActivations = (cfg.OffloadActivations || v.OffloadActivations) && v.Checkpoint != nn.NoCheckpoint
	cfg.OffloadOptimizer = cfg.OffloadOptimizer || v.OffloadOptimizer
	cfg.BF16Weights = cfg.BF16Weights || v.BF16Weights
	if v.Optimizer != "" {
		cfg.Optimizer = v.Optimizer
	}
	if cfg.Autocast() == tensor.F16 { // F16's loss scaling cannot fuse the update into the backward: measured after it
		cfg.FuseOptimizer = false
	}
	return cfg
}

// TimeStep builds a fresh model and times steps of variant v on the batch
// x, y as cfg's run would take them (captured where the device captures
// and cfg asks; Config.Mode): after the steps that warm up, trace and
// capture, it returns the median of timed steps' times, each waited for.
// The model and the optimiser state are released again, and the device's
// random generator is left as it was. It returns an error wrapping
// memory.ErrOutOfMemory where the steps do not fit.
func TimeStep(dev *tensor.Device, build func() nn.Model, cfg Config, v Variant, x, y *tensor.Tensor, timed int) (seconds float64, err error) {
	if timed < 1 {
		panic(fmt.Sprintf("train: TimeStep of %d steps", timed))
	}
	gen := dev.Generator()
	state := gen.State()
	defer gen.SetState(state)
	var model nn.Model
	if err := tensor.Catch(func() { model = build() }); err != nil {
		return 0, err
	}
	defer nn.Release(model)
	t, err := New(model, dev, variantConfig(cfg, v, true), 2)
	if err != nil {
		return 0, err
	}
	defer t.Release()
	t.FailOnOOM = true
	if err := t.Step.SetMicroBatch(v.MicroBatch); err != nil {
		return 0, err
	}
	warm := 1 // the eager step's algorithms and the optimiser's state
	switch t.Step.Mode {
	case Planned:
		warm = 3 // and the traced step, and the first planned one
	case Captured:
		warm = 4 // and the step captured
	}
	times := make([]float64, 0, timed)
	for i := range warm + timed {
		start := time.Now()
		if err := t.RunStep(x, y); err != nil {
			return 0, err
		}
		if err := dev.Synchronize(); err != nil {
			return 0, err
		}
		if i >= warm {
			times = append(times, time.Since(start).Seconds())
		}
	}
	slices.Sort(times)
	return times[len(times)/2], nil
}
