package memory

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sort"
)

// A Trace is the allocation record of one run of a fixed sequence of work (a
// training step): every buffer the work allocated, in the order of the
// requests, with the sizes it could take and when it was allocated and
// freed. Time is counted in allocator events (each Alloc and each Free is
// one), so two buffers are live at once exactly when their intervals
// [Alloc, Free) intersect.
type Trace struct {
	Buffers []TraceBuffer
	Events  int          // length of the time axis
	Phases  []TracePhase // in event order (Allocator.Phase)

	allocs, frees []int32 // the buffers' Alloc and Free, flat (placeInOrder)
}

// TraceBuffer is one buffer of a Trace.
type TraceBuffer struct {
	// Sizes are the rounded sizes the buffer may take: one for a tensor; for
	// a workspace (AllocWorkspace), every option in the caller's order of
	// preference, the fastest algorithm's first.
	Sizes []int64
	// Asked are the sizes as requested, before the pool rounded them
	// (nil in a trace read from a file that lacks them: Sizes stand in).
	Asked []int64 `json:",omitempty"`
	// Times are, for a workspace, the time of each option's algorithm as
	// the caller measured it (milliseconds); nil for a tensor.
	Times []float32
	Taken int  // the index into Sizes the traced run took
	Alloc int  // event of the request
	Free  int  // event of the release (Events: none, in a trace of work that leaves it allocated)
	Role  Role // what it held (Allocator.SetRole; a workspace's is Workspace)
}

// Taken is the size choice of every buffer in the traced run: with MaxLive,
// the most bytes that run had live, as the pool measured it.
func (t *Trace) Taken() []int {
	c := make([]int, len(t.Buffers))
	for i, b := range t.Buffers {
		c[i] = b.Taken
	}
	return c
}

// MaxLive is the most bytes live at once with every buffer at the given
// size choice (nil: each buffer's first size): a lower bound for the extent
// of any placement of those buffers.
func (t *Trace) MaxLive(choice []int) int64 {
	_, live := t.Peak(choice)
	return live
}

// A Plan places every buffer of a Trace at an offset in one arena, so that
// buffers live at the same time never overlap, and picks each workspace's
// size. Its Size is the arena the work needs: known before the work runs.
type Plan struct {
	Trace   *Trace
	Offsets []int64 // per buffer
	Choice  []int   // per buffer: the index into its Sizes
	Size    int64   // the arena's extent: max over buffers of offset + size
	Live    int64   // the most bytes live at once with these choices (a lower bound for Size)
	Order   string  // the placement order that produced the smallest extent
}

// size is buffer i's chosen size.
func (p *Plan) size(i int) int64 { return p.Trace.Buffers[i].Sizes[p.Choice[i]] }

// Check verifies the plan against its trace the way a brute-force checker
// would: every pair of buffers live at the same time is disjoint in the
// arena, every buffer lies inside [0, Size), offsets are aligned to
// MinBlockSize and Size is at least the live-bytes lower bound. It returns
// the first violation.
func (p *Plan) Check() error {
	bs := p.Trace.Buffers
	if len(p.Offsets) != len(bs) || len(p.Choice) != len(bs) {
		return fmt.Errorf("memory: plan of %d offsets and %d choices for %d buffers", len(p.Offsets), len(p.Choice), len(bs))
	}
	for i := range bs {
		if p.Choice[i] < 0 || p.Choice[i] >= len(bs[i].Sizes) {
			return fmt.Errorf("memory: buffer %d: choice %d of %d sizes", i, p.Choice[i], len(bs[i].Sizes))
		}
		if p.Offsets[i] < 0 || p.Offsets[i]%MinBlockSize != 0 || p.Offsets[i]+p.size(i) > p.Size {
			return fmt.Errorf("memory: buffer %d at [%d, %d) outside the arena of %d bytes or unaligned",
				i, p.Offsets[i], p.Offsets[i]+p.size(i), p.Size)
		}
		for j := 0; j < i; j++ {
			if bs[i].Alloc < bs[j].Free && bs[j].Alloc < bs[i].Free &&
				p.Offsets[i] < p.Offsets[j]+p.size(j) && p.Offsets[j] < p.Offsets[i]+p.size(i) {
				return fmt.Errorf("memory: buffers %d [%d, %d) and %d [%d, %d) are live together and overlap",
					j, p.Offsets[j], p.Offsets[j]+p.size(j), i, p.Offsets[i], p.Offsets[i]+p.size(i))
			}
		}
	}
	if live := p.Trace.MaxLive(p.Choice); p.Size < live {
		return fmt.Errorf("memory: plan of %d bytes below the %d bytes live at once", p.Size, live)
	}
	return nil
}

// PlanOptions say how PlanTrace sizes workspaces.
type PlanOptions struct {
	// MaxSlack is how far workspaces may raise the arena above the extent
	// of the other buffers, as a fraction of that extent. A workspace that
	// fits nowhere in the arena (as it is at the step's peak) would
	// otherwise get its slowest, smallest algorithm; a little room buys the
	// fast ones. PlanTrace tries room of 0, 1/32, 1/16, 1/8, 1/4, 1/2 and
	// all of MaxSlack and keeps the least whose workspaces' algorithms take
	// at most TimeTolerance (a fraction) longer, by the callers' timings,
	// than with the most room; the workspaces shaved at its peak stay
	// within the same time.
	MaxSlack      float64
	TimeTolerance float64
	// AsTraced gives every workspace the size the traced run took, instead
	// of choosing: the plan then runs exactly the traced run's algorithms.
	AsTraced bool
}

// DefaultPlanOptions let workspaces raise the arena by half at most, and
// take the least room whose algorithms are within 3% of the fastest's
// time: cuDNN's timings of one search vary by a few percent, and room is
// memory. (At 10%, the data-parallel ResNet-18 fp32 step at batch 256 on
// an H200, whose convolutions are most of its time, took no room and ran
// 0.7 ms, 6%, slower than with the room 3% gives it, while ResNet-20 at
// batch 1024 with AMP fell from 602.7 to 503.0 MiB at the same step time;
// bench -plan-tolerance measures it.)
var DefaultPlanOptions = PlanOptions{MaxSlack: 0.5, TimeTolerance: 0.03}

// PlanTrace assigns offsets to the buffers of t.
//
// Buffers are placed greedily: each in turn goes into the smallest gap left
// by the buffers already placed that overlap it in time, or above them
// all. The result depends on the order, so several orders are tried and
// the one with the smallest extent is kept: by size (TFLite's "greedy by
// size"), by the live bytes over the buffer's lifetime ("greedy by
// breadth"), by lifetime length, and by request order.
//
// Workspaces are sized two ways, and the smallest arena whose algorithms
// take at most TimeTolerance longer than the fastest plan of the first way
// is kept (without timings, an option's rank in the caller's order stands
// for its time):
//   - after the buffers of one size, in request order: each takes the first
//     of its sizes (the fastest algorithm's) that fits a gap below the
//     extent reached so far plus some room (PlanOptions); when none fits,
//     the smallest is placed, and the arena grows by as little as it can;
//   - among them, at their fastest size (or their traced one), placed by
//     the same greedy orders as the rest: a workspace needed when little
//     else is live then finds a gap made for it, where the first way may
//     find the free bytes of that moment scattered between the others
//     (Note [placing workspaces with the rest]).
//
// Neither raises the arena by more than MaxSlack over the first way's
// extent of the buffers of one size, and the second only ever finds a
// smaller arena for the first way's speed: on the H200, giving it the
// fastest algorithms' time to meet instead took ResNet-20 at batch 256
// with checkpointed blocks from 185.8 to 228.9 MiB for a step 5% faster.
//
// The plan kept is then refined within the same time budget: the
// workspaces live at its busiest moment take smaller sizes one at a time
// while the arena shrinks (Note [shaving the workspaces at the peak]); and
// its sizes are placed again by randomised greedy passes (polish).
func PlanTrace(t *Trace, o PlanOptions) *Plan {
	var fixed, flexible []int
	for i, b := range t.Buffers {
		if len(b.Sizes) == 1 {
			fixed = append(fixed, i)
		} else {
			flexible = append(flexible, i)
		}
	}
	best := t.placeGreedily(fixed, make([]int, len(t.Buffers)))
	if len(flexible) == 0 {
		best.Live = t.MaxLive(best.Choice)
		return best
	}
	base := slices.Clone(fixed)
	sort.Slice(base, func(a, b int) bool { return best.Offsets[base[a]] < best.Offsets[base[b]] })
	var plans []*Plan
	var times []float64
	for _, f := range []float64{0, 1.0 / 32, 1.0 / 16, 1.0 / 8, 1.0 / 4, 1.0 / 2, 1} {
		p := &Plan{Trace: t, Offsets: slices.Clone(best.Offsets), Choice: slices.Clone(best.Choice), Size: best.Size, Order: best.Order}
		times = append(times, p.placeWorkspaces(base, flexible, best.Size+int64(f*o.MaxSlack*float64(best.Size)), o.AsTraced))
		plans = append(plans, p)
		if o.AsTraced || o.MaxSlack == 0 {
			break
		}
	}
	// The fastest of these sets the time every plan must come within: the
	// plans below only find smaller arenas for it.
	fastest := slices.Min(times)
	limit := best.Size + int64(o.MaxSlack*float64(best.Size))
	choices := [][]int{t.Taken()}
	if !o.AsTraced {
		choices = append(choices, make([]int, len(t.Buffers))) // every workspace at its fastest
	}
	all := make([]int, len(t.Buffers))
	for i := range all {
		all[i] = i
	}
	for _, c := range choices {
		if p := t.placeGreedily(all, c); p.Size <= max(limit, plans[0].Size) {
			p.Order += ", workspaces among the rest"
			plans, times = append(plans, p), append(times, t.workspaceTime(flexible, c))
		}
	}
	chosen := -1 // the smallest within the tolerance, the faster of two as small
	for k, p := range plans {
		if times[k] <= fastest*(1+o.TimeTolerance) &&
			(chosen < 0 || p.Size < plans[chosen].Size || p.Size == plans[chosen].Size && times[k] < times[chosen]) {
			chosen = k
		}
	}
	p := plans[chosen]
	if !o.AsTraced {
		p = t.shaveWorkspaces(p, flexible, times[chosen], fastest*(1+o.TimeTolerance))
	}
	p = t.polish(p)
	p.Live = t.MaxLive(p.Choice)
	return p
}

// shaveLimit is the most buffers a trace may have for PlanTrace to shave
// its workspaces: each try places every buffer again, quadratic in them.
const shaveLimit = 5000

// shaveWorkspaces lowers p's arena by giving the workspaces live at the
// moment most bytes are live smaller sizes, while the workspaces' total
// time (now spent) stays within budget (Note [shaving the workspaces at
// the peak]).
func (t *Trace) shaveWorkspaces(p *Plan, flexible []int, spent, budget float64) *Plan {
	if len(t.Buffers) > shaveLimit {
		return p
	}
	s := &shaver{t: t, budget: budget, flexible: make(map[int]bool, len(flexible)), all: make([]int, len(t.Buffers))}
	for _, i := range flexible {
		s.flexible[i] = true
	}
	for i := range s.all {
		s.all[i] = i
	}
	for {
		q, qSpent := s.one(p, spent)
		if q == nil {
			q, qSpent = s.several(p, spent)
		}
		if q == nil {
			return p
		}
		q.Order += ", workspaces shaved"
		p, spent = q, qSpent
	}
}

// shaver holds what shaveWorkspaces' steps share.
type shaver struct {
	t        *Trace
	budget   float64
	flexible map[int]bool
	all      []int
}

// timeOf is buffer i's time at size choice c, by the callers' timings (or
// the choice's rank).
func (s *shaver) timeOf(i, c int) float64 {
	if b := s.t.Buffers[i]; b.Times != nil {
		return float64(b.Times[c])
	}
	return float64(c)
}

// smaller is buffer i's fastest size smaller than its choice's in choice
// whose time keeps spent within the budget, and the time spent then; -1
// when there is none.
func (s *shaver) smaller(choice []int, i int, spent float64) (int, float64) {
	b, now := s.t.Buffers[i], choice[i]
	pick, pickSpent := -1, 0.0
	for c, size := range b.Sizes {
		sp := spent - s.timeOf(i, now) + s.timeOf(i, c)
		if size < b.Sizes[now] && sp <= s.budget && (pick < 0 || s.timeOf(i, c) < s.timeOf(i, pick)) {
			pick, pickSpent = c, sp
		}
	}
	return pick, pickSpent
}

// one tries each workspace live at p's busiest moment at its next smaller
// size alone, placing everything again for each, and returns the smallest
// arena below p's, or nil.
func (s *shaver) one(p *Plan, spent float64) (*Plan, float64) {
	event, _ := s.t.Peak(p.Choice)
	var best *Plan
	var bestSpent float64
	for _, i := range s.t.LiveAt(event) {
		if !s.flexible[i] {
			continue
		}
		pick, sp := s.smaller(p.Choice, i, spent)
		if pick < 0 {
			continue
		}
		choice := slices.Clone(p.Choice)
		choice[i] = pick
		if s.t.MaxLive(choice) >= p.Size {
			continue // no placement of these sizes is smaller
		}
		q := s.t.placeGreedily(s.all, choice)
		if q.Size < p.Size && (best == nil || q.Size < best.Size) {
			best, bestSpent = q, sp
		}
	}
	return best, bestSpent
}

// several shaves one workspace at a time at whichever moment is busiest
// then, the one that saves the most bytes for the time it adds, until a
// placement of the sizes reached is smaller than p's arena: it returns that
// placement, or nil when the budget or the workspaces run out first. This
// lowers a peak that two moments share (a convolution's data and filter
// gradients, each with its own workspace), where shaving either alone
// leaves the other.
func (s *shaver) several(p *Plan, spent float64) (*Plan, float64) {
	choice := slices.Clone(p.Choice)
	for {
		event, _ := s.t.Peak(choice)
		best, bestC, bestSpent, bestScore := -1, -1, 0.0, 0.0
		for _, i := range s.t.LiveAt(event) {
			if !s.flexible[i] {
				continue
			}
			pick, sp := s.smaller(choice, i, spent)
			if pick < 0 {
				continue
			}
			b := s.t.Buffers[i]
			score := float64(b.Sizes[choice[i]]-b.Sizes[pick]) / max(sp-spent, 1e-6)
			if best < 0 || score > bestScore {
				best, bestC, bestSpent, bestScore = i, pick, sp, score
			}
		}
		if best < 0 {
			return nil, 0
		}
		choice[best], spent = bestC, bestSpent
		if s.t.MaxLive(choice) >= p.Size {
			continue
		}
		if q := s.t.placeGreedily(s.all, choice); q.Size < p.Size {
			return q, spent
		}
	}
}

// Note [shaving the workspaces at the peak]: the plans above trade a
// workspace's bytes for its algorithm's speed all at once (room for every
// workspace, or every workspace at its fastest among the rest), so a step
// whose peak is one convolution's workspace keeps it whenever shrinking
// every workspace costs more than the tolerance. A workspace live at the
// step's busiest moment sets the arena; one live elsewhere costs nothing.
// So the chosen plan is then refined: each workspace live at the moment of
// most live bytes tries its fastest smaller size that keeps the
// workspaces' total time within the tolerance, everything is placed again
// (by the greedy orders, workspaces among the rest), and the smallest arena
// found is kept; again until no such change makes the arena smaller. When
// none does alone, because another moment is as busy (a convolution's data
// gradient and its filter gradient, each with a workspace of about the
// same size), the workspaces are shaved in turn at whichever moment is
// then busiest, the most bytes for the time first, until the arena falls.
// The time spent is the one budget, so the plan is never more than the
// tolerance slower than the fastest. Traces of more than shaveLimit
// buffers (ResNet-1202's) are not shaved.

// Note [placing workspaces with the rest]: a convolution's workspace is
// live for one call, often when the activations live at that moment are
// fewer than at the step's peak, so its bytes are there; but the buffers
// placed before it, packed for their own peak, may leave them in pieces.
// On the H200 (ResNet-20 at batch 1024 with AMP), the eager step,
// cuDNN's fastest algorithms with workspaces from the pool, peaked at
// 700.7 MiB, while workspaces placed after the rest needed an arena of
// 786.0 MiB for algorithms as fast. Placed among the rest, at their
// fastest sizes, they fit in 700.7 MiB; at batch 256, 189.4 MiB instead
// of 217.0 (eager: 186.5); ResNet-18's at 256, 722.8 instead of 743.3
// (eager: 720.1), at the same speed within 2%. With
// checkpointed blocks the first way stays ahead: 448.8 MiB at batch 1024
// against the eager step's 425.4.

// placeInOrder places the buffers of order, in that order, at the sizes
// choice gives them: each in the smallest gap (with lowest, the lowest) that
// holds it among the buffers placed before it that overlap it in time, else
// above them all. It is fit's rule, without a limit, over flat copies of the
// buffers' lifetimes and sizes: whole greedy passes are the planner's
// innermost work.
func (t *Trace) placeInOrder(order, choice []int, lowest bool, name string) *Plan {
	n := len(t.Buffers)
	p := &Plan{Trace: t, Offsets: make([]int64, n), Choice: slices.Clone(choice), Order: name}
	if t.allocs == nil {
		t.allocs, t.frees = make([]int32, n), make([]int32, n)
		for i, b := range t.Buffers {
			t.allocs[i], t.frees[i] = int32(b.Alloc), int32(b.Free)
		}
	}
	allocs, frees := t.allocs, t.frees
	size := make([]int64, n)
	for i, b := range t.Buffers {
		size[i] = b.Sizes[choice[i]]
	}
	placed := make([]int32, 0, len(order)) // by offset
	for _, i := range order {
		a, f, sz := allocs[i], frees[i], size[i]
		off, bestGap := int64(-1), int64(-1)
		var top int64 // highest end seen so far
		for _, j := range placed {
			if allocs[j] >= f || a >= frees[j] {
				continue
			}
			lo := p.Offsets[j]
			if gap := lo - top; gap >= sz && (bestGap < 0 || gap < bestGap) {
				off, bestGap = top, gap
				if lowest {
					break
				}
			}
			top = max(top, lo+size[j])
		}
		if off < 0 {
			off = top
		}
		p.Offsets[i] = off
		p.Size = max(p.Size, off+sz)
		k := sort.Search(len(placed), func(k int) bool { return p.Offsets[placed[k]] > off })
		placed = slices.Insert(placed, k, int32(i))
	}
	return p
}

// placeGreedily places the buffers idx at the sizes choice gives them by
// each of placementOrders, and returns the placement of least extent.
func (t *Trace) placeGreedily(idx, choice []int) *Plan {
	var best *Plan
	floor := t.liveOf(idx, choice) // no placement is smaller: the orders stop there
	for _, ord := range placementOrders(t, idx, choice) {
		p := t.placeInOrder(ord.order, choice, ord.lowest, ord.name)
		if best == nil || p.Size < best.Size {
			best = p
		}
		if best.Size <= floor {
			break
		}
	}
	if best == nil { // no buffers
		best = &Plan{Trace: t, Offsets: make([]int64, len(t.Buffers)), Choice: slices.Clone(choice), Order: "request"}
	}
	return best
}

// liveOf is the most bytes the buffers idx have live at once at the sizes
// choice gives them.
func (t *Trace) liveOf(idx, choice []int) int64 {
	delta := make([]int64, t.Events+1)
	for _, i := range idx {
		b := t.Buffers[i]
		delta[b.Alloc] += b.Sizes[choice[i]]
		delta[b.Free] -= b.Sizes[choice[i]]
	}
	var now, most int64
	for _, d := range delta {
		now += d
		most = max(most, now)
	}
	return most
}

// workspaceTime is the total time of the workspaces' algorithms at choice,
// by the callers' timings (or the choices' ranks), as placeWorkspaces counts it.
func (t *Trace) workspaceTime(flexible, choice []int) float64 {
	var total float64
	for _, i := range flexible {
		if b := t.Buffers[i]; b.Times != nil {
			total += float64(b.Times[choice[i]])
		} else {
			total += float64(choice[i])
		}
	}
	return total
}

// placeWorkspaces places the flexible buffers, in request order, over the
// fixed ones (placed, sorted by offset), each at its first size that fits
// below limit (or its traced one), else its smallest; it returns the total
// time of the chosen sizes' algorithms, by the callers' timings (without
// timings, the choice's rank in the caller's order stands for its time).
func (p *Plan) placeWorkspaces(placed, flexible []int, limit int64, asTraced bool) float64 {
	placed = slices.Clone(placed)
	var total float64
	for _, i := range flexible {
		b := p.Trace.Buffers[i]
		chosen := -1
		if asTraced {
			chosen = b.Taken
		} else {
			for c, s := range b.Sizes {
				if off := p.fit(placed, i, s, limit); off >= 0 {
					chosen = c
					break
				}
			}
		}
		if chosen < 0 {
			chosen = 0
			for c, s := range b.Sizes {
				if s < b.Sizes[chosen] {
					chosen = c
				}
			}
		}
		p.Choice[i] = chosen
		p.Offsets[i] = p.fit(placed, i, b.Sizes[chosen], -1)
		p.Size = max(p.Size, p.Offsets[i]+b.Sizes[chosen])
		placed = p.insert(placed, i)
		if b.Times != nil {
			total += float64(b.Times[chosen])
		} else {
			total += float64(chosen)
		}
	}
	return total
}

// fit returns the offset of the smallest gap that holds size bytes among the
// buffers of placed (sorted by offset) that are live together with buffer
// i. With limit >= 0 the gap must end at or below limit, and -1 means none
// does; with limit < 0 the space above every overlapping buffer counts as a
// gap. One pass over placed: no sorting per query.
func (p *Plan) fit(placed []int, i int, size, limit int64) int64 {
	b := p.Trace.Buffers[i]
	bestOff, bestGap := int64(-1), int64(-1)
	var top int64 // highest end seen so far
	for _, j := range placed {
		o := p.Trace.Buffers[j]
		if o.Alloc >= b.Free || b.Alloc >= o.Free {
			continue
		}
		lo := p.Offsets[j]
		if gap := lo - top; gap >= size && (bestGap < 0 || gap < bestGap) {
			bestOff, bestGap = top, gap
		}
		top = max(top, lo+p.size(j))
	}
	if bestOff >= 0 {
		return bestOff
	}
	if limit >= 0 {
		if top+size <= limit {
			return top
		}
		return -1
	}
	return top
}

// insert adds buffer i to placed, keeping it sorted by offset.
func (p *Plan) insert(placed []int, i int) []int {
	k := sort.Search(len(placed), func(k int) bool { return p.Offsets[placed[k]] > p.Offsets[i] })
	return slices.Insert(placed, k, i)
}

type placementOrder struct {
	name   string
	order  []int
	lowest bool // each buffer in the lowest gap that holds it (placeInOrder), not the smallest
}

// shuffledWork bounds the greedy passes placementOrders adds with the
// buffers of one size in random orders: about this many buffer pairs
// compared over all of them, so short traces get more (at most
// maxShuffled) and traces of a few thousand buffers none.
const (
	shuffledWork = 4_000_000
	maxShuffled  = 24
)

// placementOrders are the orders PlanTrace tries for the buffers fixed, at
// the sizes choice gives them. Very long traces (tens of thousands of
// buffers: deep networks) try only the first, since each greedy pass is
// quadratic.
func placementOrders(t *Trace, fixed, choice []int) []placementOrder {
	bs := t.Buffers
	size := func(i int) int64 { return bs[i].Sizes[choice[i]] }
	life := func(i int) int { return bs[i].Free - bs[i].Alloc }
	bySize := slices.Clone(fixed)
	sort.SliceStable(bySize, func(a, b int) bool {
		i, j := bySize[a], bySize[b]
		if size(i) != size(j) {
			return size(i) > size(j)
		}
		return life(i) > life(j)
	})
	orders := []placementOrder{{name: "size", order: bySize}}
	if len(fixed) > 20000 {
		return orders
	}
	// breadth: the most bytes live at any event of the buffer's lifetime
	// (live bytes from a difference array, range maxima from a sparse table).
	live := make([]int64, t.Events+1)
	for _, i := range fixed {
		live[bs[i].Alloc] += size(i)
		live[bs[i].Free] -= size(i)
	}
	for e := 1; e < len(live); e++ {
		live[e] += live[e-1]
	}
	table := [][]int64{live}
	for w := 1; 2*w <= len(live); w *= 2 {
		prev := table[len(table)-1]
		next := make([]int64, len(prev)-w)
		for e := range next {
			next[e] = max(prev[e], prev[e+w])
		}
		table = append(table, next)
	}
	rangeMax := func(lo, hi int) int64 { // max of live[lo:hi], hi > lo
		k := bits.Len(uint(hi-lo)) - 1
		return max(table[k][lo], table[k][hi-(1<<k)])
	}
	breadth := make(map[int]int64, len(fixed))
	for _, i := range fixed {
		if bs[i].Free > bs[i].Alloc {
			breadth[i] = rangeMax(bs[i].Alloc, bs[i].Free)
		}
	}
	byBreadth := slices.Clone(fixed)
	sort.SliceStable(byBreadth, func(a, b int) bool {
		i, j := byBreadth[a], byBreadth[b]
		if breadth[i] != breadth[j] {
			return breadth[i] > breadth[j]
		}
		return size(i) > size(j)
	})
	byLife := slices.Clone(fixed)
	sort.SliceStable(byLife, func(a, b int) bool {
		i, j := byLife[a], byLife[b]
		if life(i) != life(j) {
			return life(i) > life(j)
		}
		return size(i) > size(j)
	})
	orders = append(orders, placementOrder{"breadth", byBreadth, false}, placementOrder{"breadth, lowest gaps", byBreadth, true},
		placementOrder{"lifetime", byLife, false}, placementOrder{"request", slices.Clone(fixed), false})
	// Many buffers share a size (a network's activations), and the order
	// among them decides how the gaps between them line up: the same
	// greedy pass by size, with those ties in random orders (Note [the
	// buffers of one size in random orders]).
	n := len(fixed)
	r := rand.New(rand.NewPCG(uint64(n), uint64(t.Events)))
	for k := range min(maxShuffled, shuffledWork/max(1, n*n)) {
		key := make(map[int]uint64, n)
		for _, i := range fixed {
			key[i] = r.Uint64()
		}
		shuffled := slices.Clone(fixed)
		sort.Slice(shuffled, func(a, b int) bool {
			i, j := shuffled[a], shuffled[b]
			if size(i) != size(j) {
				return size(i) > size(j)
			}
			return key[i] < key[j]
		})
		orders = append(orders, placementOrder{name: fmt.Sprintf("size, ties shuffled (%d)", k+1), order: shuffled, lowest: k%2 == 1})
	}
	return orders
}

// polishWork bounds polish's greedy passes as shuffledWork does
// placementOrders', at most maxPolish of them.
const (
	polishWork = 40_000_000
	maxPolish  = 256
)

// polish places p's buffers, at p's sizes, again by greedy passes in
// orders by size each scaled by a random factor from 1 to 1.5 (a fixed
// seed: plans repeat), in both kinds of gap (placeInOrder), and returns the
// smallest placement, p when none is smaller. The searches before it
// place each candidate a few ways; this searches harder once, for the
// sizes chosen (Note [the buffers of one size in random orders]).
func (t *Trace) polish(p *Plan) *Plan {
	all := make([]int, len(t.Buffers))
	for i := range all {
		all[i] = i
	}
	n := len(all)
	tries := min(maxPolish, polishWork/max(1, n*n))
	if tries == 0 || p.Size == t.MaxLive(p.Choice) {
		return p
	}
	r := rand.New(rand.NewPCG(uint64(n)+1, uint64(t.Events)))
	key := make([]float64, n)
	base := p.Order
	for k := range tries {
		for i := range key {
			key[i] = float64(p.size(i)) * (1 + 0.5*r.Float64())
		}
		order := slices.Clone(all)
		sort.Slice(order, func(a, b int) bool { return key[order[a]] > key[order[b]] })
		for _, lowest := range []bool{false, true} {
			if q := t.placeInOrder(order, p.Choice, lowest, fmt.Sprintf("%s, polished (%d)", base, k+1)); q.Size < p.Size {
				p = q
			}
		}
		if p.Size == t.MaxLive(p.Choice) {
			break // no placement is smaller
		}
	}
	return p
}

// Note [the buffers of one size in random orders]: greedy by size places a
// step's largest buffers first, and a network's activations are many
// buffers of a few sizes; which of a size goes first decides whether the
// gaps that later buffers (a convolution's workspace, a gradient) find
// line up. On the H200's traces of ResNet-18 at batch 256 with
// checkpointed blocks, the deterministic orders left 61.6 MiB of the
// 490.2 MiB arena unused at its peak; sixteen passes by size with the ties
// in random orders (a fixed seed: plans repeat) found 460.2 MiB. The
// passes are bounded by the trace's length (shuffledWork), since each is
// quadratic in its buffers.

// Extrapolate is the trace of the work traced as a at ka examples and as b
// at kb (ka < kb), at k examples: the same buffers, requested and freed at
// the same events, each of its sizes the line through its requests in a
// and b at k (Asked; Sizes where a trace lacks them), rounded as the pool
// rounds (RoundSize; a buffer that does not grow with the examples keeps
// its size). A step's activations and their
// gradients grow with its examples and its parameters' buffers do not, so
// the trace at the whole batch, and what follows from it (its peak, its
// plan), is known from two small ones without running it. It fails,
// naming the first difference, when a and b are not the same sequence of
// requests: then the work's order depends on its examples and no line
// through two traces says what it does at k.
func Extrapolate(a *Trace, ka int, b *Trace, kb int, k int) (*Trace, error) {
	if ka <= 0 || kb <= ka || k <= 0 {
		panic(fmt.Sprintf("memory: Extrapolate from %d and %d examples to %d: want 0 < ka < kb and k > 0", ka, kb, k))
	}
	if len(a.Buffers) != len(b.Buffers) || a.Events != b.Events {
		return nil, fmt.Errorf("memory: the traces at %d and %d examples differ: %d and %d buffers, %d and %d events", ka, kb, len(a.Buffers), len(b.Buffers), a.Events, b.Events)
	}
	t := &Trace{Buffers: make([]TraceBuffer, len(a.Buffers)), Events: a.Events, Phases: a.Phases}
	for i, x := range a.Buffers {
		y := b.Buffers[i]
		if x.Alloc != y.Alloc || x.Free != y.Free || len(x.Sizes) != len(y.Sizes) || x.Taken != y.Taken || x.Role != y.Role {
			return nil, fmt.Errorf("memory: the traces at %d and %d examples differ at buffer %d: %+v and %+v", ka, kb, i, x, y)
		}
		xs, ys := x.Sizes, y.Sizes
		if len(x.Asked) == len(xs) && len(y.Asked) == len(ys) {
			xs, ys = x.Asked, y.Asked
		}
		z := x
		z.Sizes, z.Asked = make([]int64, len(xs)), make([]int64, len(xs))
		for j, s := range xs {
			per := float64(ys[j]-s) / float64(kb-ka)
			z.Asked[j] = max(0, s+int64(math.Round(per*float64(k-ka))))
			z.Sizes[j] = RoundSize(z.Asked[j])
		}
		t.Buffers[i] = z
	}
	return t, nil
}
