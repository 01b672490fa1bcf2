package train

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/gonum/floats"

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
	// Checkpointed limits CheckpointBlocks to the first blocks
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
		{Name: "checkpoint", Checkpoint: mode},
		{Name: "amp+checkpoint", AMP: amp, Checkpoint: mode},
	}
}

// VariantName names a configuration as Variants does.
func VariantName(amp AMP, mode nn.CheckpointMode) string {
	ck := mode != nn.NoCheckpoint
	switch {
	case amp.On() && ck:
		return "amp+checkpoint"
	case amp.On():
		return "amp"
	case ck:
		return "checkpoint"
	}
	return "fp32"
}

// SomeCheckpointedName names the variant that checkpoints the first k of
// a model's blocks: "amp+checkpoint-3/12".
func SomeCheckpointedName(amp AMP, k, blocks int) string {
	return fmt.Sprintf("%s-%d/%d", VariantName(amp, nn.CheckpointBlocks), k, blocks)
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
	// FitBudget plans a whole batch's step from two slices' (fitSized).
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
// it was.
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
	model := build()
	defer nn.Release(model)
	t, err := New(model, dev, variantConfig(cfg, v, false), 2)
	if err != nil {
		return Measurement{}, err
	}
	defer t.Release()
	t.FailOnOOM = true
	// Offloaded copies follow the forward as it runs, and micro-batches
	// accumulate: such steps run eagerly, and are measured so.
	plan = plan && t.Step.Offloader == nil && (v.MicroBatch == 0 || v.MicroBatch >= x.Dim(0))
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

// BudgetHeadroom is the share of a step's own bytes (its need above what
// stands between steps, Measurement.Standing) that FitBudget leaves to the
// pool's fragmentation: the parameters and the optimiser's state are
// allocated once and stay, while the step's activations, gradients and
// workspaces come and go in blocks of many sizes.
const BudgetHeadroom = 0.1

// withinBudget says whether a step that needs need bytes, standing of them
// allocated between steps, fits budget with BudgetHeadroom of the rest
// spare; headroom is that spare.
func withinBudget(need, standing, budget int64) (ok bool, headroom int64) {
	headroom = int64(BudgetHeadroom * float64(max(0, need-standing)))
	return need+headroom <= budget, headroom
}

// BudgetChoice is what FitBudget measured and chose.
type BudgetChoice struct {
	Budget   int64         `json:"budget"`
	Measured []Measurement `json:"measured"` // in the order tried
	Chosen   Variant       `json:"chosen"`
}

// BudgetVariants are the configurations a memory budget is fitted with,
// fastest first on a GPU: fp32, AMP (in amp's dtype, as Variants), some of
// the blocks checkpointed (Variant.Some) and all of them, without AMP and
// then with it, then checkpointed sqrt(n) segments without and with AMP,
// then, where offload says the device can move activations to host memory
// (not the CPU's), AMP with checkpointed blocks whose kept tensors go there
// (only the first two for a model without residual blocks). keep drops
// those a user ruled out.
func BudgetVariants(resnet, offload bool, amp AMP, keep func(Variant) bool) []Variant {
	four := Variants(nn.CheckpointBlocks, amp)
	some := func(v Variant) Variant {
		v.Name, v.Some = v.Name+"-some", true
		return v
	}
	vs := []Variant{four[0], four[1], some(four[2]), four[2], some(four[3]), four[3]}
	vs = append(vs, Variant{Name: "checkpoint-sqrt", Checkpoint: nn.CheckpointSqrt}, Variant{Name: "amp+checkpoint-sqrt", AMP: four[1].AMP, Checkpoint: nn.CheckpointSqrt})
	if offload {
		vs = append(vs, Variant{Name: "amp+checkpoint+offload", AMP: vs[1].AMP, Checkpoint: nn.CheckpointBlocks, OffloadActivations: true})
	}
	var out []Variant
	for _, v := range vs {
		if (resnet || v.Checkpoint == nn.NoCheckpoint) && (keep == nil || keep(v)) {
			out = append(out, v)
		}
	}
	return out
}

// FitBudget chooses the fastest of the candidates whose training step on
// the batch x, y fits the budget (see BudgetHeadroom), or else the leanest
// with micro-batches of half the batch, a quarter, ... down to one example;
// with cfg.MicroBatch below the batch, the first of the candidates that fits
// in those micro-batches, each measured on the whole batch. It returns an
// error wrapping memory.ErrOutOfMemory when nothing fits.
//
// A batch of at least minSizedBatch examples is sized first, so that what
// is predicted not to fit never runs on the whole batch: each candidate's
// step is measured (MeasureStep) on two slices of the batch, of b and 2b
// examples (b an eighth of it, at least two), and traced. Each of the
// step's buffers grows with the examples or does not, so the two traces
// give the trace of the whole batch's step (memory.Extrapolate), and from
// it its need, to the byte, and, replaying the pool's books through the
// first step and that one (memory.Allocator.Replay), whether the pool,
// capped at the budget, would run out, fragmented (where the steps cannot
// be traced alike, the line through the two needs stands in). In order,
// fastest first, a candidate predicted to fit is measured on the whole
// batch before the next is sized, then the micro-batches predicted to fit
// (each count sized on two of its micro-batches, which need what the whole
// batch's do), and the first that fits is chosen. A smaller batch is measured whole, candidate by
// candidate. A candidate that checkpoints some blocks (Variant.Some) is
// not measured until its number is known: the fewest of the first
// blocks whose step is predicted to fit from the needs of its twins,
// without checkpoints (measured before it) and with every block
// checkpointed (measured then), and the blocks' shares
// (Measurement.Shares), as Note [checkpointing some blocks] in package nn
// says, is sized as the others are, and the counts above it in turn until
// one is predicted to fit; it is then measured as the others are. Each
// measurement is written to w as it is taken. The pool is capped at the
// budget while they run: a candidate that does not fit stops there, out of
// memory, so the process never holds more than the budget. stop, when
// closed, ends the search before its next measurement with an error
// wrapping ErrInterrupted.
func FitBudget(w io.Writer, dev *tensor.Device, build func() nn.Model, cfg Config, candidates []Variant, x, y *tensor.Tensor, plan bool, budget int64, stop <-chan struct{}) (BudgetChoice, error) {
	c := BudgetChoice{Budget: budget}
	defer func() { // the choice made, its traces are read no more
		for i := range c.Measured {
			c.Measured[i].dropTraces()
		}
	}()
	a := dev.Allocator()
	old := a.Limit()
	a.EmptyCache()
	if err := a.SetLimit(budget); err != nil { // a candidate that does not fit stops at the budget: the process never holds more
		return c, err
	}
	defer a.SetLimit(old)
	n := x.Dim(0)
	type key struct {
		v        Variant // unnamed
		examples int
	}
	keyOf := func(v Variant, examples int) key { return key{unnamed(v), examples} }
	measured := map[key]Measurement{}
	measure := func(v Variant, examples int) (Measurement, error) {
		if m, ok := measured[keyOf(v, examples)]; ok {
			return m, nil
		}
		select {
		case <-stop:
			return Measurement{}, fmt.Errorf("fitting a step into the budget: %w", ErrInterrupted)
		default:
		}
		xs, ys := x, y
		if examples < n {
			xs, ys = x.Rows(0, examples), y.Rows(0, examples)
		}
		m, err := measureStep(dev, build, cfg, v, xs, ys, plan)
		if errors.Is(err, memory.ErrOutOfMemory) {
			m, err = Measurement{Variant: v, OutOfMemory: true}, nil
		}
		if examples < n {
			m.Examples = examples
		}
		if err == nil {
			c.Measured = append(c.Measured, m)
			measured[keyOf(v, examples)] = m
		}
		return m, err
	}
	said := map[key]bool{}
	try := func(v Variant) (bool, error) {
		m, err := measure(v, n)
		if err != nil {
			return false, err
		}
		fits, headroom := withinBudget(m.Need(), m.Standing, budget)
		fits = fits && !m.OutOfMemory
		if k := keyOf(v, n); !said[k] {
			said[k] = true
			need := "over the budget"
			if !m.OutOfMemory {
				need = fmt.Sprintf("%s + %s", memory.Bytes(m.Need()), memory.Bytes(headroom))
			}
			verdict := "does not fit"
			if fits {
				verdict = "fits"
			}
			fmt.Fprintf(w, "  %-38s %22s  %s\n", describeVariant(v, n), need, verdict)
		}
		if fits {
			c.Chosen = v
		}
		return fits, nil
	}
	// some tries v, a Variant.Some, with the fewest blocks checkpointed
	// whose step fits: needAt's needs of its twins predict a count (needAt
	// says what a variant's step on the whole batch needs, measured or
	// predicted from sizes, measuring it only when asked to, and whether it
	// knows), and check says whether a count fits (sized, or measured
	// whole): from the predicted count up, the first it passes is tried.
	some := func(v Variant, needAt func(u Variant, measure bool) (Measurement, bool, error), check func(Variant) (bool, error)) (bool, error) {
		all := v
		all.Some, all.Name = false, VariantName(v.AMP, nn.CheckpointBlocks)
		none := all
		none.Checkpoint, none.Name = nn.NoCheckpoint, VariantName(v.AMP, nn.NoCheckpoint)
		mNone, ok, err := needAt(none, false)
		if !ok || err != nil {
			return false, err
		}
		mAll, ok, err := needAt(all, true)
		if !ok || err != nil {
			return false, err
		}
		kept, recomputed, shares := mNone.Need(), mAll.Need(), mAll.Shares
		k, blocks := fewestCheckpointed(kept, recomputed, mAll.Standing, shares, budget), len(shares)
		if k == 0 {
			return false, nil
		}
		counted := func(k int) Variant {
			u := v
			u.Checkpointed, u.Name = k, SomeCheckpointedName(v.AMP, k, blocks)
			return u
		}
		fmt.Fprintf(w, "  %-38s the first %d of %d blocks: %s predicted, between %s's %s and %s's %s\n", describeVariant(counted(k), n), k, blocks,
			memory.Bytes(checkpointedNeed(kept, recomputed, shares, k)), none.Name, memory.Bytes(kept), all.Name, memory.Bytes(recomputed))
		// The prediction bounds what the step allocates, not what the
		// pool's segments round that up to near the cap.
		if k, err = fewestFitting(k, blocks, func(k int) (bool, error) { return check(counted(k)) }); err != nil || k == blocks {
			return false, err
		}
		return try(counted(k))
	}
	// whole is needAt for steps measured on the whole batch.
	whole := func(u Variant, measureIt bool) (Measurement, bool, error) {
		m, ok := measured[keyOf(u, n)]
		if !ok && measureIt {
			var err error
			if m, err = measure(u, n); err != nil {
				return m, false, err
			}
			ok = true
		}
		return m, ok && !m.OutOfMemory, nil
	}
	next := func(v Variant) (bool, error) {
		if v.Some {
			return some(v, whole, try)
		}
		return try(v)
	}
	fmt.Fprintf(w, "fitting a step into a budget of %s (a step's need + %.0f%% of its own bytes, beyond what stays between steps, for the pool's fragmentation; where its traces say, the pool's books through it under the cap):\n", memory.Bytes(budget), 100*BudgetHeadroom)
	if m := cfg.MicroBatch; m > 0 && m < n {
		// The user's micro-batches: a step holds a micro-batch's
		// activations whatever the batch, so each candidate is measured
		// on the whole batch, in them.
		for _, v := range candidates {
			v.MicroBatch = m
			if ok, err := next(v); ok || err != nil {
				return c, err
			}
		}
		return c, fmt.Errorf("no configuration fits a budget of %s in micro-batches of %d (try fewer examples a micro-batch): %w", memory.Bytes(budget), m, memory.ErrOutOfMemory)
	}
	if n >= minSizedBatch {
		return fitSized(w, a, &c, candidates, n, budget, measure, try, some)
	}
	for _, v := range candidates {
		if ok, err := next(v); ok || err != nil {
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
	for m := n; m > 1; {
		m = (m + 1) / 2
		v.MicroBatch = m
		if ok, err := try(v); ok || err != nil {
			return c, err
		}
	}
	return c, fmt.Errorf("no configuration fits a budget of %s, not even %s one example at a time: %w", memory.Bytes(budget), v.Name, memory.ErrOutOfMemory)
}

// fewestCheckpointed is the fewest of a model's first blocks that a step
// must checkpoint to fit the budget beside standing by the need predicted
// for it, none − w·(none − all), none and all being the needs of
// the step without checkpoints and with every block checkpointed and w the
// sum of the first k blocks' shares (Note [checkpointing some blocks] in
// package nn); 0 when only all of them would do.
func fewestCheckpointed(none, all, standing int64, shares []float64, budget int64) int {
	for k := 1; k < len(shares); k++ {
		if ok, _ := withinBudget(checkpointedNeed(none, all, shares, k), standing, budget); ok {
			return k
		}
	}
	return 0
}

// fewestFitting is the fewest blocks checkpointed, from k up to blocks,
// that fits passes (blocks when none below it does), asking each in turn:
// more blocks checkpointed need fewer bytes, but the pool's books may not
// fit them where they fit fewer (ResNet-20 at batch 16 fits the first 4
// of its 9 blocks in a cap of 10.4 MB, the first 5 in 11.3), so no count
// is passed over.
func fewestFitting(k, blocks int, fits func(k int) (bool, error)) (int, error) {
	for ; k < blocks; k++ {
		if ok, err := fits(k); ok || err != nil {
			return k, err
		}
	}
	return blocks, nil
}

// checkpointedNeed is the need predicted for a step with the first k
// blocks checkpointed (fewestCheckpointed).
func checkpointedNeed(none, all int64, shares []float64, k int) int64 {
	return none - int64(floats.Sum(shares[:k])*float64(none-all))
}

// minSizedBatch is the smallest batch FitBudget sizes on slices of it
// before it measures whole steps.
const minSizedBatch = 8

// fitSized is FitBudget's search on a batch of n examples sized on two
// slices of it (see FitBudget): measure(v, k) measures v's step on k of
// the examples, try(v) on all of them, saying whether it fits, and some(v,
// needAt, check) tries a Variant.Some with needAt's predictions, each
// count of blocks checked by sizing it. pool is the one whose books are
// kept (stepPlan).
func fitSized(w io.Writer, pool *memory.Allocator, c *BudgetChoice, candidates []Variant, n int, budget int64, measure func(Variant, int) (Measurement, error), try func(Variant) (bool, error),
	some func(Variant, func(Variant, bool) (Measurement, bool, error), func(Variant) (bool, error)) (bool, error)) (BudgetChoice, error) {
	b := max(2, n/8) // a step of one example is not traced as the others are (nor holds only its share)
	type size struct {
		v         Variant
		fits      int       // the most examples measured within the budget: 0, b or 2b
		base, per float64   // the need of k examples, base + k·per, when fits is 2b
		standing  int64     // what stays between its steps
		shares    []float64 // its blocks' checkpoint shares (Measurement.Shares)
		// plan is what its steps' traces on b and 2b examples say of it
		// on any number (nil where they do not: the line through their
		// needs stands in).
		plan *stepPlan
	}
	within := func(need, standing int64) bool {
		ok, _ := withinBudget(need, standing, budget)
		return ok
	}
	predict := func(s size, k int) int64 {
		if s.plan == nil {
			return int64(s.base + float64(k)*s.per)
		}
		return s.plan.at(k, budget).need
	}
	// fitsAt says whether s's step on k examples is predicted to fit: its
	// need within the budget (withinBudget) and, where its traces say, the
	// pool's books kept through it under the cap.
	fitsAt := func(s size, k int) bool {
		return within(predict(s, k), s.standing) && (s.plan == nil || s.plan.at(k, budget).fits)
	}
	fmt.Fprintf(w, "  sizing each on %d and %d of the batch's %d examples:\n", b, 2*b, n)
	var sizes []size
	sized := map[Variant]size{} // by the variant, unnamed
	sizeOf := func(v Variant) (size, error) {
		key := unnamed(v)
		if s, ok := sized[key]; ok {
			return s, nil
		}
		var need [2]int64
		var ms [2]Measurement
		s := size{v: v}
		for i, k := range []int{b, 2 * b} {
			m, err := measure(v, k)
			if err != nil {
				return s, err
			}
			if m.OutOfMemory || !within(m.Need(), m.Standing) {
				break
			}
			need[i], s.fits, s.standing, s.shares, ms[i] = m.Need(), k, m.Standing, m.Shares, m
		}
		switch s.fits {
		case 0:
			fmt.Fprintf(w, "  %-38s over the budget on %d examples\n", v.Name, b)
		case b:
			fmt.Fprintf(w, "  %-38s %10s on %d examples, over the budget on %d\n", v.Name, memory.Bytes(need[0]), b, 2*b)
		default:
			s.per = max(0, float64(need[1]-need[0])/float64(b))
			s.base = float64(need[0]) - float64(b)*s.per
			var why string
			s.plan, why = planStep(pool, ms[0], b, ms[1], 2*b)
			if s.plan == nil {
				fmt.Fprintf(w, "  %-38s %10s and %s an example: %s for %d, by the line through them (%s)\n", v.Name, memory.Bytes(int64(s.base)), memory.Bytes(int64(s.per)), memory.Bytes(predict(s, n)), n, why)
				break
			}
			p := s.plan.at(n, budget)
			fmt.Fprintf(w, "  %-38s %10s and %s an example: %s for %d by their traces; %s\n", v.Name, memory.Bytes(int64(s.base)), memory.Bytes(int64(s.per)), memory.Bytes(p.need), n, booksSay(p.reserved, p.fits))
		}
		sizes = append(sizes, s)
		sized[key] = s
		return s, nil
	}
	predicted := func(u Variant, measureIt bool) (Measurement, bool, error) {
		s, ok := sized[unnamed(u)]
		if !ok && measureIt {
			var err error
			if s, err = sizeOf(u); err != nil {
				return Measurement{}, false, err
			}
		}
		if s.fits != 2*b {
			return Measurement{}, false, nil
		}
		return Measurement{Variant: u, PeakAllocated: predict(s, n), Standing: s.standing, Shares: s.shares}, true, nil
	}
	check := func(u Variant) (bool, error) {
		s, err := sizeOf(u)
		return err == nil && s.fits == 2*b && fitsAt(s, n), err
	}
	for _, v := range candidates {
		if v.Some {
			if ok, err := some(v, predicted, check); ok || err != nil {
				return *c, err
			}
			continue
		}
		s, err := sizeOf(v)
		if err != nil {
			return *c, err
		}
		if s.fits == 2*b && fitsAt(s, n) { // the fastest predicted to fit, before sizing the rest
			if ok, err := try(s.v); ok || err != nil {
				return *c, err
			}
		}
	}
	// Micro-batches of the leanest: the least per example of those sized,
	// else the first that ran on b examples, else the last candidate (the
	// leanest by their order) on fewer than b.
	leanest := -1
	for i, s := range sizes {
		if s.fits == 2*b && (leanest < 0 || s.per < sizes[leanest].per) {
			leanest = i
		}
	}
	for i, s := range sizes {
		if leanest < 0 && s.fits == b {
			leanest = i
		}
	}
	v := candidates[len(candidates)-1]
	if leanest >= 0 {
		v = sizes[leanest].v
	}
	// A micro-batched step holds one micro-batch's activations and the
	// gradients' sums whatever the batch: its trace repeats a micro-batch's
	// requests, so two micro-batches need what the whole batch's do, and
	// keep the pool's books as it does. Each count is sized on two of its
	// micro-batches, where a step of one micro-batch alone is predicted to
	// fit (less than it needs).
	for m := n; m > 1; {
		m = (m + 1) / 2
		if leanest >= 0 && sizes[leanest].fits == 2*b {
			if s := sizes[leanest]; !within(predict(s, m), s.standing) {
				continue
			}
		} else if leanest >= 0 && m > b || leanest < 0 && m >= b {
			continue // more examples than ran within the budget
		}
		u := v
		u.MicroBatch = m
		if 2*m < n {
			mm, err := measure(u, 2*m)
			if err != nil {
				return *c, err
			}
			if mm.OutOfMemory {
				fmt.Fprintf(w, "  %-38s over the budget on 2 of them\n", describeVariant(u, n))
				continue
			}
			books := ""
			fits := within(mm.Need(), mm.Standing)
			if booksAgree(pool, mm) {
				reserved, room := keepBooks(pool, mm.books(), budget)
				fits, books = fits && room, "; "+booksSay(reserved, room)
			}
			fmt.Fprintf(w, "  %-38s %10s on 2 of them%s\n", describeVariant(u, n), memory.Bytes(mm.Need()), books)
			if !fits {
				continue
			}
		}
		if ok, err := try(u); ok || err != nil {
			return *c, err
		}
	}
	return *c, fmt.Errorf("no configuration fits a budget of %s, not even %s one example at a time: %w", memory.Bytes(c.Budget), v.Name, memory.ErrOutOfMemory)
}

// A stepPlan is what the traces of a variant's steps on ka and kb examples
// say of its step on any number of examples (memory.Extrapolate): what it
// needs, and what the pool's books do through it (memory.Replay).
type stepPlan struct {
	pool     *memory.Allocator // whose books are kept (memory.Allocator.Replay)
	examples [2]int
	traces   [2]*memory.Trace // the measured steps'
	standing int64
	planning *memory.PlanOptions // how a planned step's arena is planned (nil: eager)
	// The books replay what was allocated before the first step (built),
	// the first step (firsts) and the measured one; or, where the first
	// steps' traces do not extrapolate, what stands between steps (blocks)
	// and the measured step twice.
	built, blocks []int64
	firsts        [2]*memory.Trace
	work          map[int]memory.Work         // by examples: the books' work, planned
	found         map[[2]int64]stepPrediction // by examples and budget
}

// stepPrediction is a stepPlan's prediction for a number of examples under
// a budget.
type stepPrediction struct {
	need     int64 // as Measurement.Need has it
	reserved int64 // the most the pool's books reserve by the measured step, uncapped
	fits     bool  // the books, capped at the budget, never run out
}

// planStep is the stepPlan of the steps measured as a, on ka examples, and
// b, on kb; or nil and why not, where their traces do not say what the
// step does on other numbers: a step not traced, traced in part (its peak
// is not what stands and its trace's peak, as where copies run beside it),
// or traced as other requests.
func planStep(pool *memory.Allocator, a Measurement, ka int, b Measurement, kb int) (*stepPlan, string) {
	for _, m := range []Measurement{a, b} {
		if m.trace == nil {
			return nil, "a step not traced"
		}
		if _, live := m.trace.Peak(m.trace.Taken()); m.Standing+live != m.PeakAllocated {
			return nil, fmt.Sprintf("the trace holds %s at most of a step that allocated %s", memory.Bytes(live), memory.Bytes(m.PeakAllocated-m.Standing))
		}
	}
	if a.Standing != b.Standing {
		return nil, fmt.Sprintf("%s and %s stand between the steps", memory.Bytes(a.Standing), memory.Bytes(b.Standing))
	}
	if _, err := memory.Extrapolate(a.trace, ka, b.trace, kb, kb); err != nil {
		return nil, "their traces differ"
	}
	p := &stepPlan{pool: pool, examples: [2]int{ka, kb}, traces: [2]*memory.Trace{a.trace, b.trace}, standing: a.Standing, planning: a.planning,
		blocks: a.standingBlocks, work: map[int]memory.Work{}, found: map[[2]int64]stepPrediction{}}
	// The first steps' traces stand for what the pool went through only
	// where the books kept with them allocate what the pool did (nothing
	// that ran beside the step, on another goroutine, was missed).
	if a.first != nil && b.first != nil && slices.Equal(a.built, b.built) {
		if _, err := memory.Extrapolate(a.first, ka, b.first, kb, kb); err == nil && booksAgree(pool, a) && booksAgree(pool, b) {
			p.firsts, p.built = [2]*memory.Trace{a.first, b.first}, a.built
		}
	}
	return p, ""
}

// booksAgree says whether the pool's books through m's first step and its
// measured one allocate, at their peak, what m's pool did: whether its
// traces stand for what the pool went through.
func booksAgree(pool *memory.Allocator, m Measurement) bool {
	if m.first == nil || m.trace == nil {
		return false
	}
	allocated, _, err := pool.Replay(0, m.books())
	return err == nil && allocated == m.PeakAllocated
}

// at is the prediction for k examples under budget: the need of the trace
// at k (the most it has live, or a planned step's arena where that is
// more) beside what stands; the pool's books through the steps to it,
// uncapped and capped at budget, and for a planned step on to its arena.
func (p *stepPlan) at(k int, budget int64) stepPrediction {
	key := [2]int64{int64(k), budget}
	if f, ok := p.found[key]; ok {
		return f
	}
	w, ok := p.work[k]
	if !ok {
		extrapolate := func(t [2]*memory.Trace) *memory.Trace {
			out, err := memory.Extrapolate(t[0], p.examples[0], t[1], p.examples[1], k)
			if err != nil {
				panic(fmt.Sprintf("train: the traces of a stepPlan do not extrapolate: %v", err))
			}
			return out
		}
		t := extrapolate(p.traces)
		w = memory.Work{Standing: p.blocks, Traces: []*memory.Trace{t, t}}
		if p.firsts[0] != nil {
			w = memory.Work{Standing: p.built, Traces: []*memory.Trace{extrapolate(p.firsts), t}}
		}
		if p.planning != nil {
			w.Arena = memory.PlanTrace(t, *p.planning).Size
		}
		p.work[k] = w
	}
	t := w.Traces[len(w.Traces)-1]
	_, live := t.Peak(t.Taken())
	f := stepPrediction{need: max(p.standing+live, p.standing+w.Arena)}
	f.reserved, f.fits = keepBooks(p.pool, w, budget)
	p.found[key] = f
	return f
}

// keepBooks runs pool's books through w: the most they reserve by its
// last trace without a cap (the arena aside, as MeasureStep's pool has
// it), and whether, capped at budget, they never run out.
func keepBooks(pool *memory.Allocator, w memory.Work, budget int64) (reserved int64, fits bool) {
	uncapped := w
	uncapped.Arena = 0
	_, reserved, err := pool.Replay(0, uncapped)
	if err != nil {
		panic(fmt.Sprintf("train: the pool's books without a cap ran out: %v", err))
	}
	_, _, err = pool.Replay(budget, w)
	return reserved, err == nil
}

// booksSay is what FitBudget says of the pool's books for a step.
func booksSay(reserved int64, fits bool) string {
	verdict := "out of memory under the budget"
	if fits {
		verdict = "room under the budget"
	}
	return fmt.Sprintf("the pool's books: %s reserved uncapped, %s", memory.Bytes(reserved), verdict)
}

// books is the work m's pool went through: what was allocated before its
// first step, that step and the measured one.
func (m Measurement) books() memory.Work {
	return memory.Work{Standing: m.built, Traces: []*memory.Trace{m.first, m.trace}}
}

// unnamed is v without its name: what FitBudget keys its measurements by.
func unnamed(v Variant) Variant {
	v.Name = ""
	return v
}

// describeVariant names v at a batch of n: "amp+checkpoint, micro-batches of 16".
func describeVariant(v Variant, n int) string {
	if v.MicroBatch > 0 && v.MicroBatch < n {
		return fmt.Sprintf("%s, micro-batches of %d", v.Name, v.MicroBatch)
	}
	return v.Name
}
