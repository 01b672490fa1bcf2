package train

import (
	"errors"
	"fmt"
	"io"
	"slices"

	"gonum.org/v1/gonum/floats"

	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
)

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

// Whole is the measurement of the chosen variant on the whole batch, the
// one that chose it (false: none).
func (c BudgetChoice) Whole() (Measurement, bool) {
	for i := len(c.Measured) - 1; i >= 0; i-- {
		m := c.Measured[i]
		if m.Name == c.Chosen.Name && m.MicroBatch == c.Chosen.MicroBatch && m.Examples == 0 && !m.OutOfMemory {
			return m, true
		}
	}
	return Measurement{}, false
}

// Room is what m's step leaves of budget beyond its need and its headroom
// (withinBudget): negative when it does not fit.
func (m Measurement) Room(budget int64) int64 {
	_, headroom := withinBudget(m.Need(), m.Standing, budget)
	return budget - m.Need() - headroom
}

// BudgetVariants are the configurations a memory budget is fitted with,
// fastest first: fp32 and AMP (in amp's dtype, as Variants), then, on the
// CPU, some of the blocks checkpointed (Variant.Some) and all of them,
// without AMP and then with it, and checkpointed sqrt(n) segments without
// and with AMP. Where light checkpoints can keep the blocks' products (a
// GPT's, nn.LightCheckpoints), some and all of the blocks checkpointed
// lightly come before each precision's plain checkpoints (Note [light
// checkpoints] in package autograd). On a device other than the host (a
// GPU's), where AMP's step is the faster in every configuration measured
// (ResNets and GPT-2: docs/benchmarks.md), AMP's checkpointed
// configurations come first, then AMP with checkpointed blocks whose kept
// tensors go to host memory, and only then fp32's, for a run that rules
// AMP out. A model without blocks
// (blocks false) has only fp32 and AMP. keep drops those a user ruled out.
func BudgetVariants(blocks, light, device bool, amp AMP, keep func(Variant) bool) []Variant {
	four := Variants(nn.CheckpointBlocks, amp)
	some := func(v Variant) Variant {
		v.Name, v.Some = v.Name+"-some", true
		return v
	}
	lightly := func(v Variant) Variant {
		v.Name, v.Checkpoint = VariantName(v.AMP, nn.CheckpointLight), nn.CheckpointLight
		return v
	}
	// checkpointed are a precision's checkpointed configurations, sqrt(n)
	// segments last.
	checkpointed := func(v, sqrt Variant) []Variant {
		var vs []Variant
		if light {
			vs = append(vs, some(lightly(v)), lightly(v))
		}
		return append(vs, some(v), v, sqrt)
	}
	fp32 := checkpointed(four[2], Variant{Name: "checkpoint-sqrt", Checkpoint: nn.CheckpointSqrt})
	mixed := checkpointed(four[3], Variant{Name: "amp+checkpoint-sqrt", AMP: four[1].AMP, Checkpoint: nn.CheckpointSqrt})
	vs := []Variant{four[0], four[1]}
	if device {
		vs = append(append(append(vs, mixed...),
			Variant{Name: "amp+checkpoint+offload", AMP: four[1].AMP, Checkpoint: nn.CheckpointBlocks, OffloadActivations: true}), fp32...)
	} else {
		last := len(fp32) - 1
		vs = append(append(append(vs, fp32[:last]...), mixed[:last]...), fp32[last], mixed[last])
	}
	var out []Variant
	for _, v := range vs {
		if (blocks || v.Checkpoint == nn.NoCheckpoint) && (keep == nil || keep(v)) {
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
	s := &budgetSearch{w: w, dev: dev, build: build, cfg: cfg, x: x, y: y, n: x.Dim(0), plan: plan, budget: budget, stop: stop,
		pool: dev.Allocator(), c: BudgetChoice{Budget: budget}, measured: map[searchKey]Measurement{}, said: map[searchKey]bool{}}
	defer func() { // the choice made, its traces are read no more
		for i := range s.c.Measured {
			s.c.Measured[i].dropTraces()
		}
	}()
	old := s.pool.Limit()
	s.pool.EmptyCache()
	if err := s.pool.SetLimit(budget); err != nil { // a candidate that does not fit stops at the budget: the process never holds more
		return s.c, err
	}
	defer s.pool.SetLimit(old)
	err := s.search(candidates)
	return s.c, err
}

// A budgetSearch is FitBudget's search for one batch: what it measured, by
// variant and examples, and said; and, where the batch is sized on slices
// of it (b > 0), what each variant's slices say of it.
type budgetSearch struct {
	w        io.Writer
	dev      *tensor.Device
	build    func() nn.Model
	cfg      Config
	x, y     *tensor.Tensor
	n        int // the batch's examples
	plan     bool
	budget   int64
	stop     <-chan struct{}
	pool     *memory.Allocator // capped at the budget; whose books are kept (stepPlan)
	c        BudgetChoice
	measured map[searchKey]Measurement
	said     map[searchKey]bool // the whole batch's measurements written to w
	// b is the smaller slice's examples (the larger's 2b) where the batch
	// is sized (sizeBatch), else 0; sized are the variants' sizes (by the
	// variant, unnamed), sizes the same in the order sized.
	b     int
	sized map[Variant]size
	sizes []size
}

// searchKey keys a budgetSearch's measurements.
type searchKey struct {
	v        Variant // unnamed
	examples int
}

func keyOf(v Variant, examples int) searchKey { return searchKey{unnamed(v), examples} }

// size is what a variant's steps on a batch's slices of b and 2b examples
// say of it (budgetSearch.sizeOf).
type size struct {
	v         Variant
	fits      int       // the most examples measured within the budget: 0, b or 2b
	base, per float64   // the need of k examples, base + k·per, when fits is 2b
	standing  int64     // what stays between its steps
	shares    []float64 // its blocks' checkpoint shares (Measurement.Shares)
	// plan is what its steps' traces on b and 2b examples say of it on
	// any number (nil where they do not: the line through their needs
	// stands in).
	plan *stepPlan
}

// search tries the candidates in turn, then micro-batches (FitBudget).
func (s *budgetSearch) search(candidates []Variant) error {
	fmt.Fprintf(s.w, "fitting a step into a budget of %s (a step's need + %.0f%% of its own bytes, beyond what stays between steps, for the pool's fragmentation; where its traces say, the pool's books through it under the cap):\n", memory.Bytes(s.budget), 100*BudgetHeadroom)
	if m := s.cfg.MicroBatch; m > 0 && m < s.n {
		// The user's micro-batches: a step holds a micro-batch's
		// activations whatever the batch, so each candidate is measured
		// on the whole batch, in them.
		for _, v := range candidates {
			v.MicroBatch = m
			if ok, err := s.next(v); ok || err != nil {
				return err
			}
		}
		return fmt.Errorf("no configuration fits a budget of %s in micro-batches of %d (try fewer examples a micro-batch): %w", memory.Bytes(s.budget), m, memory.ErrOutOfMemory)
	}
	if s.n >= minSizedBatch {
		return s.sizeBatch(candidates)
	}
	for _, v := range candidates {
		if ok, err := s.next(v); ok || err != nil {
			return err
		}
	}
	leanest := -1
	for i, m := range s.c.Measured {
		if !m.OutOfMemory && (leanest < 0 || m.Need() < s.c.Measured[leanest].Need()) {
			leanest = i
		}
	}
	if leanest < 0 {
		leanest = len(s.c.Measured) - 1
	}
	v := s.c.Measured[leanest].Variant
	for m := s.n; m > 1; {
		m = (m + 1) / 2
		v.MicroBatch = m
		if ok, err := s.try(v); ok || err != nil {
			return err
		}
	}
	return fmt.Errorf("no configuration fits a budget of %s, not even %s one example at a time: %w", memory.Bytes(s.budget), v.Name, memory.ErrOutOfMemory)
}

// measure measures v's step on the batch's first examples (MeasureStep),
// once: a step out of memory is a Measurement that says so.
func (s *budgetSearch) measure(v Variant, examples int) (Measurement, error) {
	if m, ok := s.measured[keyOf(v, examples)]; ok {
		return m, nil
	}
	select {
	case <-s.stop:
		return Measurement{}, fmt.Errorf("fitting a step into the budget: %w", ErrInterrupted)
	default:
	}
	xs, ys := s.x, s.y
	if examples < s.n {
		xs, ys = s.x.Rows(0, examples), s.y.Rows(0, examples)
	}
	m, err := measureStep(s.dev, s.build, s.cfg, v, xs, ys, s.plan)
	if errors.Is(err, memory.ErrOutOfMemory) {
		m, err = Measurement{Variant: v, OutOfMemory: true}, nil
	}
	if examples < s.n {
		m.Examples = examples
	}
	if err == nil {
		s.c.Measured = append(s.c.Measured, m)
		s.measured[keyOf(v, examples)] = m
	}
	return m, err
}

// try measures v's step on the whole batch and says whether it fits the
// budget, choosing it if so.
func (s *budgetSearch) try(v Variant) (bool, error) {
	m, err := s.measure(v, s.n)
	if err != nil {
		return false, err
	}
	fits, headroom := withinBudget(m.Need(), m.Standing, s.budget)
	fits = fits && !m.OutOfMemory
	if k := keyOf(v, s.n); !s.said[k] {
		s.said[k] = true
		need := "over the budget"
		if !m.OutOfMemory {
			need = fmt.Sprintf("%s + %s", memory.Bytes(m.Need()), memory.Bytes(headroom))
		}
		verdict := "does not fit"
		if fits {
			verdict = "fits"
		}
		fmt.Fprintf(s.w, "  %-38s %22s  %s\n", describeVariant(v, s.n), need, verdict)
	}
	if fits {
		s.c.Chosen = v
	}
	return fits, nil
}

// next tries v: a Variant.Some with as few blocks checkpointed as fit.
func (s *budgetSearch) next(v Variant) (bool, error) {
	if v.Some {
		return s.some(v)
	}
	return s.try(v)
}

// some tries v, a Variant.Some, with the fewest blocks checkpointed whose
// step fits: the needs of its twins (needOf) predict a count, and from it
// up the first count that passes (passes) is tried.
func (s *budgetSearch) some(v Variant) (bool, error) {
	all := v
	all.Some, all.Name = false, VariantName(v.AMP, v.Checkpoint)
	none := all
	none.Checkpoint, none.Name = nn.NoCheckpoint, VariantName(v.AMP, nn.NoCheckpoint)
	mNone, ok, err := s.needOf(none, false)
	if !ok || err != nil {
		return false, err
	}
	mAll, ok, err := s.needOf(all, true)
	if !ok || err != nil {
		return false, err
	}
	kept, recomputed, shares := mNone.Need(), mAll.Need(), mAll.Shares
	k, blocks := fewestCheckpointed(kept, recomputed, mAll.Standing, shares, s.budget), len(shares)
	if k == 0 {
		return false, nil
	}
	counted := func(k int) Variant {
		u := v
		u.Checkpointed, u.Name = k, SomeCheckpointedName(v.AMP, v.Checkpoint, k, blocks)
		return u
	}
	fmt.Fprintf(s.w, "  %-38s the first %d of %d blocks: %s predicted, between %s's %s and %s's %s\n", describeVariant(counted(k), s.n), k, blocks,
		memory.Bytes(checkpointedNeed(kept, recomputed, shares, k)), none.Name, memory.Bytes(kept), all.Name, memory.Bytes(recomputed))
	// The prediction bounds what the step allocates, not what the pool's
	// segments round that up to near the cap.
	if k, err = fewestFitting(k, blocks, func(k int) (bool, error) { return s.passes(counted(k)) }); err != nil || k == blocks {
		return false, err
	}
	return s.try(counted(k))
}

// needOf is what u's step on the whole batch needs, and whether that is
// known: measured, or, where the batch is sized, predicted from its
// slices; measured or sized only when measureIt says so.
func (s *budgetSearch) needOf(u Variant, measureIt bool) (Measurement, bool, error) {
	if s.b > 0 {
		z, ok := s.sized[unnamed(u)]
		if !ok && measureIt {
			var err error
			if z, err = s.sizeOf(u); err != nil {
				return Measurement{}, false, err
			}
		}
		if z.fits != 2*s.b {
			return Measurement{}, false, nil
		}
		return Measurement{Variant: u, PeakAllocated: s.predict(z, s.n), Standing: z.standing, Shares: z.shares}, true, nil
	}
	m, ok := s.measured[keyOf(u, s.n)]
	if !ok && measureIt {
		var err error
		if m, err = s.measure(u, s.n); err != nil {
			return m, false, err
		}
		ok = true
	}
	return m, ok && !m.OutOfMemory, nil
}

// passes says whether u fits: where the batch is sized, predicted to from
// its slices; else measured whole (try).
func (s *budgetSearch) passes(u Variant) (bool, error) {
	if s.b == 0 {
		return s.try(u)
	}
	z, err := s.sizeOf(u)
	return err == nil && z.fits == 2*s.b && s.fitsAt(z, s.n), err
}

// within says whether a step's need fits the budget (withinBudget).
func (s *budgetSearch) within(need, standing int64) bool {
	ok, _ := withinBudget(need, standing, s.budget)
	return ok
}

// predict is z's need on k examples.
func (s *budgetSearch) predict(z size, k int) int64 {
	if z.plan == nil {
		return int64(z.base + float64(k)*z.per)
	}
	return z.plan.at(k, s.budget).need
}

// fitsAt says whether z's step on k examples is predicted to fit: its need
// within the budget (withinBudget) and, where its traces say, the pool's
// books kept through it under the cap.
func (s *budgetSearch) fitsAt(z size, k int) bool {
	return s.within(s.predict(z, k), z.standing) && (z.plan == nil || z.plan.at(k, s.budget).fits)
}

// sizeOf sizes v on the batch's slices of b and 2b examples, once.
func (s *budgetSearch) sizeOf(v Variant) (size, error) {
	key := unnamed(v)
	if z, ok := s.sized[key]; ok {
		return z, nil
	}
	b := s.b
	var need [2]int64
	var ms [2]Measurement
	z := size{v: v}
	for i, k := range []int{b, 2 * b} {
		m, err := s.measure(v, k)
		if err != nil {
			return z, err
		}
		if m.OutOfMemory || !s.within(m.Need(), m.Standing) {
			break
		}
		need[i], z.fits, z.standing, z.shares, ms[i] = m.Need(), k, m.Standing, m.Shares, m
	}
	switch z.fits {
	case 0:
		fmt.Fprintf(s.w, "  %-38s over the budget on %d examples\n", v.Name, b)
	case b:
		fmt.Fprintf(s.w, "  %-38s %10s on %d examples, over the budget on %d\n", v.Name, memory.Bytes(need[0]), b, 2*b)
	default:
		z.per = max(0, float64(need[1]-need[0])/float64(b))
		z.base = float64(need[0]) - float64(b)*z.per
		var why string
		z.plan, why = planStep(s.pool, ms[0], b, ms[1], 2*b)
		if z.plan == nil {
			fmt.Fprintf(s.w, "  %-38s %10s and %s an example: %s for %d, by the line through them (%s)\n", v.Name, memory.Bytes(int64(z.base)), memory.Bytes(int64(z.per)), memory.Bytes(s.predict(z, s.n)), s.n, why)
			break
		}
		p := z.plan.at(s.n, s.budget)
		fmt.Fprintf(s.w, "  %-38s %10s and %s an example: %s for %d by their traces; %s\n", v.Name, memory.Bytes(int64(z.base)), memory.Bytes(int64(z.per)), memory.Bytes(p.need), s.n, booksSay(p.reserved, p.fits))
	}
	s.sizes = append(s.sizes, z)
	s.sized[key] = z
	return z, nil
}

// sizeBatch is the search on a batch sized on two slices of it (see
// FitBudget): each candidate sized, the fastest predicted to fit measured
// whole before the next is sized; then micro-batches of the leanest.
func (s *budgetSearch) sizeBatch(candidates []Variant) error {
	b := max(2, s.n/8) // a step of one example is not traced as the others are (nor holds only its share)
	s.b, s.sized = b, map[Variant]size{}
	fmt.Fprintf(s.w, "  sizing each on %d and %d of the batch's %d examples:\n", b, 2*b, s.n)
	for _, v := range candidates {
		if v.Some {
			if ok, err := s.some(v); ok || err != nil {
				return err
			}
			continue
		}
		z, err := s.sizeOf(v)
		if err != nil {
			return err
		}
		if z.fits == 2*b && s.fitsAt(z, s.n) { // the fastest predicted to fit, before sizing the rest
			if ok, err := s.try(z.v); ok || err != nil {
				return err
			}
		}
	}
	// Micro-batches of the leanest: the least per example of those sized,
	// else the first that ran on b examples, else the last candidate (the
	// leanest by their order) on fewer than b.
	leanest := -1
	for i, z := range s.sizes {
		if z.fits == 2*b && (leanest < 0 || z.per < s.sizes[leanest].per) {
			leanest = i
		}
	}
	for i, z := range s.sizes {
		if leanest < 0 && z.fits == b {
			leanest = i
		}
	}
	v := candidates[len(candidates)-1]
	if leanest >= 0 {
		v = s.sizes[leanest].v
	}
	// A micro-batched step holds one micro-batch's activations and the
	// gradients' sums whatever the batch: its trace repeats a micro-batch's
	// requests, so two micro-batches need what the whole batch's do, and
	// keep the pool's books as it does. Each count is sized on two of its
	// micro-batches, where a step of one micro-batch alone is predicted to
	// fit (less than it needs).
	for m := s.n; m > 1; {
		m = (m + 1) / 2
		if leanest >= 0 && s.sizes[leanest].fits == 2*b {
			if z := s.sizes[leanest]; !s.within(s.predict(z, m), z.standing) {
				continue
			}
		} else if leanest >= 0 && m > b || leanest < 0 && m >= b {
			continue // more examples than ran within the budget
		}
		u := v
		u.MicroBatch = m
		if 2*m < s.n {
			mm, err := s.measure(u, 2*m)
			if err != nil {
				return err
			}
			if mm.OutOfMemory {
				fmt.Fprintf(s.w, "  %-38s over the budget on 2 of them\n", describeVariant(u, s.n))
				continue
			}
			books := ""
			fits := s.within(mm.Need(), mm.Standing)
			if booksAgree(s.pool, mm) {
				reserved, room := keepBooks(s.pool, mm.books(), s.budget)
				fits, books = fits && room, "; "+booksSay(reserved, room)
			}
			fmt.Fprintf(s.w, "  %-38s %10s on 2 of them%s\n", describeVariant(u, s.n), memory.Bytes(mm.Need()), books)
			if !fits {
				continue
			}
		}
		if ok, err := s.try(u); ok || err != nil {
			return err
		}
	}
	return fmt.Errorf("no configuration fits a budget of %s, not even %s one example at a time: %w", memory.Bytes(s.budget), v.Name, memory.ErrOutOfMemory)
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
