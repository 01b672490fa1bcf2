package train

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/dist"
	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/optim"
	"github.com/leangrad/leangrad/tensor"
)

// Mode is how a Step runs its work.
type Mode int

// The modes. Planned and Captured run the first two steps of each batch
// shape eagerly, with the smallest convolution workspaces: the first
// searches the convolution algorithms, compiles and creates the
// optimiser's state; the second is traced, and its trace planned
// (memory.PlanTrace) into one arena, choosing each convolution's algorithm
// with the plan.
const (
	// Eager queues every operation as it is called, with memory from the
	// caching pools: the reference, the CPU's mode and the debugging mode.
	Eager Mode = iota
	// Planned serves the step's memory from the planned arena, running the
	// host code every step; on any backend. Tests use it on the CPU.
	Planned
	// Captured is Planned, and the third step of each shape is captured as
	// a graph (kernels.Capturer: CUDA graphs) that every later step of that
	// shape replays with one launch: no host work but copying the batch in.
	Captured
)

// ModeFor is the mode steps on dev run in, the one place it is decided:
// Captured when capture is asked for and the device can capture graphs
// (CUDA), Eager otherwise. (Planned is for tests and measurements, which
// set it themselves.)
func ModeFor(dev *tensor.Device, capture bool) Mode {
	if _, ok := dev.Backend().(kernels.Capturer); ok && capture {
		return Captured
	}
	return Eager
}

func (m Mode) String() string {
	switch m {
	case Eager:
		return "eager"
	case Planned:
		return "planned"
	case Captured:
		return "captured"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// Step is leangrad's one training step: forward (under autocast with AMP),
// the loss and its metrics, scaled backward, unscale, inf check and clip
// (read into AdamW's update, GradScaler.StepClipped), the optimiser's
// update or its skip, gradients released. The Trainer, the
// benchmark harness, the seed-claims suite and the memory measurements all
// run their steps through it.
//
// A step never waits for the device. The loss sum and the count of right
// predictions accumulate on the device (Metrics reads them); the learning
// rate, the loss scale and the skip decision live there too (package
// optim); dropout draws from a device counter. These are its only device
// reads, all outside Run: Metrics (and JobMetrics), SyncRNG, and the
// scaler's and optimiser's state when a checkpoint is saved. In a
// data-parallel step the gradients' all-reduce (sharded: their
// reduce-scatter and the parameters' all-gather) is queued on the device
// too (NCCL); only the CPU's collectives, over TCP, read the buckets inside
// Run.
//
// Run returns an error, never a panic, when the device runs out of memory
// or a driver call fails. A step that fails so leaves no trace (see eager):
// it can run again on the same batch, as the Trainer does.
type Step struct {
	Model nn.Model
	Opt   optim.Optimizer
	// Scaler scales the loss under F16 autocast; the step made it, enabled
	// exactly then.
	Scaler *optim.GradScaler
	Mode   Mode
	// Planning says how the plan sizes workspaces (memory.DefaultPlanOptions
	// unless set otherwise before the second step of a shape).
	Planning memory.PlanOptions
	// ClipNorm, if positive, clips the gradients' global L2 norm to it
	// before the update, on the device (after the scaler's unscale, after
	// a data-parallel all-reduce): the norm is never read by the host, so
	// a captured step clips too. GradNorm holds the last norm seen.
	ClipNorm float64
	// Observe, if set, is called with the loss of each step whose host code
	// runs (not with replays of a captured step), inside the step's scope:
	// Retain and Keep it to hold it past the step. A micro-batched step
	// calls it once a micro-batch.
	Observe func(loss *tensor.Tensor)
	// Stop, once closed, ends a step of Mode Eager in a single process
	// within one operation of its forward or backward
	// (tensor.Interruptible): Run returns an error wrapping
	// tensor.ErrInterrupted, the step undone as after any failure. The
	// update itself is never interrupted, nor a data-parallel step, whose
	// ranks must run the same collectives, nor one whose update runs in
	// its backward.
	Stop <-chan struct{}
	// FuseOptimizer updates each parameter as soon as the backward has
	// finished its gradient (optim.PerParameter) and releases the gradient
	// there, so that a step never holds all of them at once (LOMO's
	// update fused into the backward); with ClipNorm, after a first pass
	// for the gradients' norm (Note [the norm in a first pass]). Everything
	// it does is queued on the device, so its steps are planned and
	// captured as the others are (Mode). New checks what it needs: an
	// optimizer that can, no loss scaling, one process (Run panics on the
	// last). A step of micro-batches updates after its last, as without it.
	// Once a parameter is updated a failing step cannot be undone: Run then
	// returns an error wrapping ErrPartlyUpdated, and Stop does not
	// interrupt such steps.
	FuseOptimizer bool
	// HostUpdateInBackward has an offloaded optimizer update each
	// parameter on the host as its gradient arrives, during the backward
	// (optim.Offloaded.ReadyAndUpdate), when neither clipping nor loss
	// scaling needs every gradient first. Meanwhile, and while it sums
	// micro-batches' gradients (SetMicroBatch), the host's operations
	// spread over HostThreads goroutines (0: GOMAXPROCS less one, leaving
	// a core to the goroutine that queues the backward's kernels), through
	// kernels/cpu's LeaveCores, for the process, until the step ends.
	HostUpdateInBackward bool
	HostThreads          int
	// Offloader, if set, moves what checkpointed blocks keep for their
	// recomputation to host memory during each forward and brings it back
	// ahead of the recomputation (autograd.Offloader), in steps of any
	// Mode (Note [offloaded copies captured] in autograd); the Step's
	// Release releases it. Without checkpointed blocks it moves nothing.
	Offloader *ag.Offloader

	dev      *tensor.Device
	autocast tensor.DType    // what Autocast runs matrix products in (0: fp32)
	metrics  *tensor.Tensor  // F32[3]: loss sum, right predictions, predictions
	gradNorm *tensor.Tensor  // F32[1]: the gradients' norm before clipping
	rng      *tensor.Counter // the generator's position during steps
	rngFresh bool            // rng holds the host generator's position
	shapes   map[string]*shapeState
	arena    *memory.Arena
	notes    []string
	micro    int                    // micro-batch size; 0: whole batches
	undo     []*tensor.Tensor       // copies of the buffers (and metrics) an eager step changes, to restore when it fails
	group    *dist.Group            // the data-parallel job, or nil
	reducer  *dist.Reducer          // averages the gradients over group
	sharded  *dist.ShardedOptimizer // Opt, when its state is sharded over group
	params   map[*tensor.Tensor]int // Opt's parameters' indices, for FuseOptimizer
	updated  bool                   // the running step's fused update has begun
	released bool                   // Release has run
	sqRows   *tensor.Tensor         // F32[params, 1]: a clipped fused step's gradients' sums of squares (nil until one runs)
	coef     *tensor.Tensor         // F32[1]: their clip coefficient (Note [the norm in a first pass])
}

// ErrPartlyUpdated is wrapped by the error of a step whose update runs in
// its backward (FuseOptimizer, or HostUpdateInBackward) that failed after
// it had updated some parameters.
var ErrPartlyUpdated = errors.New("the step failed after its update in the backward began: some parameters are updated and some not; resume from the last checkpoint")

// shapeState is what a Step knows about one batch shape.
type shapeState struct {
	key   string
	x, y  *tensor.Tensor // static inputs of the captured graph
	runs  int
	plan  *memory.Plan
	graph kernels.Graph
	eager bool // planning or capture failed: this shape runs eagerly (the notes say why)
}

// NewStep returns a step of model with opt on dev, in mode, its forward
// under autocast to the dtype amp (0: none, fp32; F16: mixed precision,
// with a GradScaler; BF16: mixed precision, without one). It panics when mode is Captured and the device
// cannot capture graphs (ModeFor says which mode to ask for), or for an
// amp it has no autocast for. A model whose layout can change
// (nn.ChannelsLaster) is set to run channels last under autocast where
// the backend's 16-bit convolutions are fastest so (kernels.Info), and
// channels first otherwise.
func NewStep(dev *tensor.Device, model nn.Model, opt optim.Optimizer, amp tensor.DType, mode Mode) *Step {
	if _, ok := dev.Backend().(kernels.Capturer); !ok && mode == Captured {
		panic(fmt.Sprintf("train: a Captured step on %s, which cannot capture graphs", dev.Name()))
	}
	if amp != 0 && !amp.Half() {
		panic(fmt.Sprintf("train: autocast to %v", amp))
	}
	if c, ok := model.(nn.ChannelsLaster); ok {
		c.SetChannelsLast(amp != 0 && dev.Backend().Info().ChannelsLast)
	}
	return &Step{Model: model, Opt: opt, Scaler: optim.NewGradScaler(dev, amp == tensor.F16), autocast: amp, Mode: mode, dev: dev,
		Planning: memory.DefaultPlanOptions,
		metrics:  tensor.Zeros(dev, tensor.F32, 3).Keep(),
		gradNorm: tensor.Zeros(dev, tensor.F32, 1).Keep(),
		rng:      tensor.NewCounter(dev, 0),
		shapes:   map[string]*shapeState{}}
}

// SetGroup makes the step data-parallel over g: every rank's model takes
// rank 0's parameters and buffers now, and each step averages the
// gradients over the ranks (dist.Reducer: each bucket of gradients is
// all-reduced as soon as the backward has finished it, overlapping the
// rest), before the scaler's check, so every rank sees the
// same gradients, skips the same AMP steps and takes the same update.
// Batch norm's statistics stay each rank's own, as in DDP without buffer
// broadcasting; JobMetrics sums the ranks' metrics. With shard, each rank
// keeps the optimiser's state of its shard of the parameters only
// (dist.Shard, ZeRO stage 1): Opt becomes the dist.ShardedOptimizer that
// owns the optimiser given, and the gradients are reduce-scattered
// instead. Call it before the first Run.
func (s *Step) SetGroup(g *dist.Group, shard bool) error {
	if s.reducer != nil {
		panic("train: SetGroup called twice")
	}
	var state []*tensor.Tensor
	for _, e := range s.Model.State("") {
		state = append(state, e.T)
	}
	if err := g.Broadcast(state, 0); err != nil {
		return fmt.Errorf("broadcasting rank 0's model: %w", err)
	}
	if !shard {
		s.group, s.reducer = g, dist.NewReducer(g, s.Opt.Params())
		return nil
	}
	r, o, err := dist.Shard(g, s.Opt)
	if err != nil {
		return err
	}
	s.group, s.reducer, s.sharded, s.Opt = g, r, o, o
	return nil
}

// Reducer is the step's gradient reducer (nil without a group).
func (s *Step) Reducer() *dist.Reducer { return s.reducer }

// OptimizerStateBytes is what the pool holds for the optimiser's state on
// this device (a sharded optimiser's: this rank's shard).
func (s *Step) OptimizerStateBytes() int64 {
	var n int64
	for _, t := range deviceState(s.Opt) {
		n += t.Block().Size()
	}
	return n
}

// deviceState is what opt holds on its device: its State, a sharded
// optimiser's shard of it, or, for one offloaded to host memory, what it
// keeps on the device.
func deviceState(opt optim.Optimizer) map[string]*tensor.Tensor {
	switch o := opt.(type) {
	case *dist.ShardedOptimizer:
		return o.Local()
	case *optim.Offloaded:
		return o.DeviceState()
	}
	return opt.State()
}

// Release frees the step's graphs, arena, static inputs and device state,
// and its Offloader's host memory; later calls do nothing.
func (s *Step) Release() {
	if s.released {
		return
	}
	s.released = true
	if s.reducer != nil {
		s.reducer.Release()
	}
	s.dropGraphs()
	for _, st := range s.shapes {
		if st.x != nil {
			st.x.Release()
			st.y.Release()
		}
	}
	s.shapes = map[string]*shapeState{}
	if s.arena != nil {
		s.arena.Release()
		s.arena = nil
	}
	s.metrics.Release()
	s.gradNorm.Release()
	for _, t := range []*tensor.Tensor{s.sqRows, s.coef} {
		if t != nil {
			t.Release()
		}
	}
	s.rng.Release()
	s.Scaler.Release()
	if s.Offloader != nil { // after the graphs, which copy into its memory
		s.Offloader.Release()
	}
	for _, t := range s.undo {
		t.Release()
	}
	s.undo = nil
}

func (s *Step) dropGraphs() {
	for _, st := range s.shapes {
		if st.graph != nil {
			st.graph.Release()
			st.graph = nil
		}
	}
}

func shapeKey(xdt tensor.DType, xs []int, ydt tensor.DType, ys []int) string {
	return fmt.Sprintf("%v%v/%v%v", xdt, xs, ydt, ys)
}

func (s *Step) state(x, y *tensor.Tensor) *shapeState {
	return s.stateOf(shapeKey(x.DType(), x.Shape(), y.DType(), y.Shape()))
}

func (s *Step) stateOf(k string) *shapeState {
	st := s.shapes[k]
	if st == nil {
		st = &shapeState{key: k}
		s.shapes[k] = st
	}
	return st
}

// Inputs returns the static input tensors of the step for batches of x
// (of dtype xdt: F32 images, I32 tokens) and I32 targets y of the shapes
// given (they belong to the step: do not release them). A loader that
// writes each batch into them (datasets.Iterator.NextInto) saves the copy a
// captured step otherwise makes.
func (s *Step) Inputs(xdt tensor.DType, xShape, yShape []int) (x, y *tensor.Tensor) {
	st := s.stateOf(shapeKey(xdt, xShape, tensor.I32, yShape))
	if st.x == nil {
		st.x = tensor.Empty(s.dev, xdt, xShape...).Keep()
		st.y = tensor.Empty(s.dev, tensor.I32, yShape...).Keep()
	}
	return st.x, st.y
}

// Run runs one training step on the batch x (images, tokens) and y (I32
// targets).
// It queues the work and returns without waiting for the device. Set the
// learning rate (Opt.SetLR) before it: that write is not part of the step.
func (s *Step) Run(x, y *tensor.Tensor) (err error) {
	if s.FuseOptimizer && s.group != nil {
		panic(fmt.Sprintf("train: FuseOptimizer in a data-parallel step of %d ranks: it needs one process", s.group.Size()))
	}
	defer recoverError(&err)
	if !s.rngFresh {
		s.rng.Write(int64(s.dev.Generator().State().Offset))
		s.rngFresh = true
	}
	st := s.state(x, y)
	if s.Mode == Eager || st.eager || (s.micro > 0 && s.micro < x.Dim(0)) {
		return s.eager(x, y)
	}
	a := s.dev.Allocator()
	if st.plan == nil {
		// The eager steps before the plan take the smallest workspaces,
		// so that their peaks are not above the planned step's.
		defer a.SetWorkspacePolicy(a.SetWorkspacePolicy(memory.WorkspaceSmallest))
	}
	switch {
	case st.runs == 0: // warm-up: algorithms, kernels, optimiser state
		if err := s.eager(x, y); err != nil {
			return err
		}
		st.runs++
		return nil
	case st.plan == nil: // traced
		a.StartTrace()
		traced := false
		defer func() {
			if !traced {
				a.StopTrace()
			}
		}()
		if err := s.eager(x, y); err != nil {
			return err
		}
		st.runs++
		traced = true
		trace, err := a.StopTrace()
		if err != nil {
			s.fallBack(st, err)
			return nil
		}
		st.plan = memory.PlanTrace(trace, s.Planning)
		return nil
	}
	if err := s.ensureArena(st.plan.Size); err != nil {
		return err
	}
	if s.Mode == Planned {
		return s.planned(st, x, y)
	}
	if st.graph == nil {
		return s.capture(st, x, y)
	}
	s.copyIn(st, x, y)
	if err := st.graph.Launch(); err != nil {
		return err
	}
	a.Replayed(s.arena)
	return nil
}

// recoverError turns a panic carrying an error (an *memory.OOMError from a
// tensor allocation, a *cuda.Error from a driver call) into the step's
// error; programmer errors (strings, runtime errors) keep panicking.
func recoverError(err *error) {
	r := recover()
	if r == nil {
		return
	}
	*err = fmt.Errorf("training step: %w", tensor.AsError(r))
}

// eager runs the step's body with memory from the pools, as a transaction:
// when it fails (the device ran out of memory, most often), everything it
// allocated is back in the pool, the gradients are released, the model's
// buffers (batch norm's running statistics) and the metrics are as they
// were, and the random generator has not moved, so the same batch can run
// again and give what it would have given the first time. The optimiser's
// update, the last part of the step, allocates nothing once its state
// exists, so a failure never leaves parameters half updated.
func (s *Step) eager(x, y *tensor.Tensor) (err error) {
	if err := s.snapshot(); err != nil {
		return err
	}
	defer func() {
		if r := recover(); r != nil {
			s.restore()
			err = fmt.Errorf("training step: %w", tensor.AsError(r))
			if s.updated {
				err = fmt.Errorf("%w: %w", ErrPartlyUpdated, err)
			}
		}
	}()
	s.body(x, y)
	return nil
}

// snapshot copies what an eager step changes besides the parameters and
// the optimiser's state into s.undo (made on the first call).
func (s *Step) snapshot() (err error) {
	live := s.mutable()
	if s.undo == nil {
		undo := make([]*tensor.Tensor, 0, len(live))
		defer func() {
			if r := recover(); r != nil { // out of memory: keep nothing
				for _, t := range undo {
					t.Release()
				}
				err = fmt.Errorf("training step: %w", tensor.AsError(r))
			}
		}()
		for _, t := range live {
			undo = append(undo, tensor.Empty(s.dev, t.DType(), t.Shape()...).Keep())
		}
		s.undo = undo
	}
	copyAll(s.dev.Backend(), s.undo, live)
	return nil
}

// restore copies s.undo back after a failed eager step.
func (s *Step) restore() { copyAll(s.dev.Backend(), s.mutable(), s.undo) }

// copyAll copies each src[i] into dst[i]: the F32 ones (a ResNet-1202's
// 2,406 batch norm statistics) in CopyMany's few launches, the others
// one by one.
func copyAll(be kernels.Backend, dst, src []*tensor.Tensor) {
	var d32, s32 []kernels.Buf
	for i, t := range src {
		if t.DType() == tensor.F32 {
			d32, s32 = append(d32, dst[i].Buf()), append(s32, t.Buf())
		} else {
			be.Copy(dst[i].Buf(), t.Buf())
		}
	}
	be.CopyMany(d32, s32)
}

// mutable lists what a step changes besides the parameters and the
// optimiser's state: the model's buffers and the metrics.
func (s *Step) mutable() []*tensor.Tensor {
	var ts []*tensor.Tensor
	for _, n := range s.Model.State("") {
		if !n.Param {
			ts = append(ts, n.T)
		}
	}
	return append(ts, s.metrics)
}

// FreeArena gives back the planned arena and the graphs captured over it,
// to make room: the next planned step of a shape allocates the arena again
// and captures its graph again. A trainer calls it when a step runs out of
// memory, which happens when a new batch shape (an epoch's last, smaller
// batch) warms up eagerly beside the arena.
func (s *Step) FreeArena() error {
	if s.arena == nil {
		return nil
	}
	s.dropGraphs()
	if err := s.dev.Synchronize(); err != nil {
		return err
	}
	err := s.arena.Release()
	s.arena = nil
	return err
}

// MicroBatch is the micro-batch size steps run with (0: whole batches).
func (s *Step) MicroBatch() int { return s.micro }

// SetMicroBatch makes every batch larger than n run as micro-batches of at
// most n examples whose gradients accumulate before one update: the same
// effective batch and the same mean gradient, in less memory (the largest
// activations are a micro-batch's). Batch norm normalises each micro-batch
// with its own statistics, as data-parallel training does per device, so
// a ResNet's step is not bit-for-bit the whole batch's. Micro-batched steps
// run eagerly: the planned arena and the captured graphs are given back,
// and an Offloader's host memory for the forwards of the old size. n = 0
// goes back to whole batches.
func (s *Step) SetMicroBatch(n int) error {
	if n < 0 {
		panic(fmt.Sprintf("train: SetMicroBatch(%d)", n))
	}
	if n == s.micro {
		return nil
	}
	s.micro = n
	var err error
	if n > 0 {
		err = s.FreeArena() // the whole batches' graphs
	}
	if s.Offloader != nil && err == nil { // the copies of the old size's forwards, which no graph holds now
		s.Offloader.Release()
	}
	return err
}

// fallBack makes st run eagerly from now on, noting why.
func (s *Step) fallBack(st *shapeState, why error) {
	st.eager = true
	s.notes = append(s.notes, fmt.Sprintf("batch %s runs eagerly: %v", st.key, why))
}

// ensureArena makes the arena at least size bytes. A larger arena moves
// every buffer, so the graphs captured over the old one are dropped (their
// plans stay, and they are captured again on their next run).
func (s *Step) ensureArena(size int64) error {
	if s.arena != nil && s.arena.Size() >= size {
		return nil
	}
	s.dropGraphs()
	if s.arena != nil {
		if err := s.dev.Synchronize(); err != nil {
			return err
		}
		if err := s.arena.Release(); err != nil {
			return err
		}
		s.arena = nil
	}
	a := s.dev.Allocator()
	// The eager steps' temporaries are cached in the pools; planned steps
	// never use them again.
	a.EmptyCache()
	ar, err := a.NewArena(size)
	if err != nil {
		return fmt.Errorf("training step: the planned arena of %s: %w", memory.Bytes(size), err)
	}
	s.arena = ar
	return nil
}

// planned runs the host code with memory from the plan.
func (s *Step) planned(st *shapeState, x, y *tensor.Tensor) (err error) {
	a := s.dev.Allocator()
	if err := a.BeginPlanned(st.plan, s.arena); err != nil {
		return err
	}
	defer func() {
		if e := a.EndPlanned(); e != nil && err == nil {
			if errors.Is(e, memory.ErrPlanMismatch) {
				s.fallBack(st, e)
			} else {
				err = e
			}
		}
	}()
	s.body(x, y)
	return nil
}

// capture records the step over the arena as a graph, then launches it (the
// capture queued nothing).
func (s *Step) capture(st *shapeState, x, y *tensor.Tensor) (err error) {
	if st.x == nil {
		st.x = tensor.Empty(s.dev, x.DType(), x.Shape()...).Keep()
		st.y = tensor.Empty(s.dev, y.DType(), y.Shape()...).Keep()
	}
	s.copyIn(st, x, y)
	c := s.dev.Backend().(kernels.Capturer)
	a := s.dev.Allocator()
	if err := a.BeginPlanned(st.plan, s.arena); err != nil {
		return err
	}
	if err := c.BeginCapture(); err != nil {
		a.EndPlanned()
		return err
	}
	var g kernels.Graph
	func() {
		defer func() {
			var cerr error
			g, cerr = c.EndCapture()
			perr := a.EndPlanned()
			if err == nil {
				err = errors.Join(cerr, perr)
			}
			if err != nil && g != nil {
				g.Release()
				g = nil
			}
		}()
		s.body(st.x, st.y)
	}()
	if err != nil {
		if errors.Is(err, memory.ErrPlanMismatch) {
			s.fallBack(st, err)
			return s.eager(x, y) // this step, eagerly: the capture ran nothing
		}
		return err
	}
	st.graph = g
	s.notes = append(s.notes, fmt.Sprintf("batch %s captured: %d operations in one graph over an arena of %s (%s live at its peak)",
		st.key, g.Nodes(), memory.Bytes(st.plan.Size), memory.Bytes(st.plan.Live)))
	return g.Launch()
}

// copyIn queues the copy of the batch into the static inputs, unless it is them.
func (s *Step) copyIn(st *shapeState, x, y *tensor.Tensor) {
	if st.x == nil || (x.Block() == st.x.Block() && y.Block() == st.y.Block()) {
		return
	}
	be := s.dev.Backend()
	be.Copy(st.x.Buf(), x.Buf())
	be.Copy(st.y.Buf(), y.Buf())
}

// body is the step itself, the same in every mode: it runs in a sync-free
// section with the generator's position on the device. With a micro-batch
// size below the batch's, the forward and backward run once a micro-batch,
// each micro-batch's loss weighted by its share of the batch, so that the
// accumulated gradient is the batch's mean.
func (s *Step) body(x, y *tensor.Tensor) {
	be := s.dev.Backend()
	gen := s.dev.Generator()
	s.dev.SyncFree(func() {
		gen.BeginDevice(s.rng.Buf())
		done := false
		defer func() {
			// A step that failed is run again from the same position.
			if used := gen.EndDevice(); used > 0 && done {
				be.Increment(s.rng.Buf(), int64(used), kernels.Buf{})
			}
		}()
		defer s.Opt.ZeroGrad()
		if s.reducer != nil {
			s.reducer.Prepare()
			// A step that fails midway must not leave all-reduces running
			// on buckets the next step writes (Finish has joined them when
			// it ran).
			defer s.reducer.Join()
		}
		stop := s.Stop
		if s.group != nil || s.Mode != Eager || s.updatesInBackward() { // the planned and captured steps' traces and graphs run whole; an update begun is not undone
			stop = nil
		}
		s.updated = false
		s.dev.WithScope(func() {
			n := x.Dim(0)
			m := s.micro
			if m <= 0 || m >= n {
				m = n
			}
			var fused optim.PerParameter
			if s.FuseOptimizer && m == n {
				fused = s.Opt.(optim.PerParameter)
			}
			if _, ok := s.Opt.(*optim.Offloaded); ok && (s.updatesInBackward() || m < n) && !s.dev.OnHost() { // the host works beside the backward
				leave := 1
				if s.HostThreads > 0 {
					leave = max(0, runtime.GOMAXPROCS(0)-s.HostThreads)
				}
				defer cpu.LeaveCores(leave)()
			}
			var onGrad func(*tensor.Tensor)
			if fused != nil {
				onGrad = func(leaf *tensor.Tensor) { s.updateNow(fused, leaf) }
			}
			both := func() {
				if fused != nil && s.ClipNorm > 0 { // Note [the norm in a first pass]
					s.normPass(x, y, n)
					gen.EndDevice()
					gen.BeginDevice(s.rng.Buf()) // the second pass draws what the first did
				}
				s.passes(x, y, n, m, onGrad, true)
			}
			if stop != nil {
				s.dev.Interruptible(stop, both)
			} else { // an Interruptible around Run still holds
				both()
			}
			s.markParameterGradients()
			if fused != nil {
				return // updated in the backward
			}
			s.phase("the optimiser step")
			if s.reducer != nil {
				if err := s.reducer.Finish(); err != nil {
					panic(err) // Run returns it
				}
			}
			switch {
			case s.sharded != nil: // the norm is summed over the ranks' shards
				if s.ClipNorm > 0 {
					s.Scaler.Unscale(s.Opt)
					if err := s.sharded.ClipGradNorm(s.ClipNorm, s.gradNorm); err != nil {
						panic(err)
					}
				}
				s.Scaler.Step(s.Opt)
			default:
				var norm *tensor.Tensor // GradNorm stays 0 without a clip
				if s.ClipNorm > 0 {
					norm = s.gradNorm
				}
				s.Scaler.StepClipped(s.Opt, s.ClipNorm, norm)
			}
			if s.sharded != nil {
				if err := s.sharded.Err(); err != nil {
					panic(err)
				}
			}
			s.Scaler.Update()
		})
		done = true
	})
}

// passes runs the forward and the backward of the batch x, y of n
// examples in micro-batches of m, accumulating the gradients; onGrad, if
// set, is given each leaf as the last micro-batch's backward finishes its
// gradient (the update fused into the backward). With count the losses
// and predictions count in the step's metrics (and Observe sees them).
func (s *Step) passes(x, y *tensor.Tensor, n, m int, onGrad func(*tensor.Tensor), count bool) {
	be := s.dev.Backend()
	for lo := 0; lo < n; lo += m {
		hi := min(n, lo+m)
		var hooks []ag.Option
		if s.reducer != nil && hi == n { // the last micro-batch finishes the gradients
			hooks = append(hooks, ag.OnGradReady(s.reducer.Ready))
		}
		if onGrad != nil && hi == n {
			hooks = append(hooks, ag.OnGradReady(onGrad))
		}
		off, offloaded := s.Opt.(*optim.Offloaded)
		offloaded = offloaded && s.reducer == nil
		switch { // the gradients come down during the backward
		case offloaded && hi < n: // and are summed on the host (Note [parts summed on the host] in optim)
			hooks = append(hooks, ag.OnGradReady(off.Part))
		case offloaded && s.updatesInBackward(): // and the host updates the parameters as they come
			hooks = append(hooks, ag.OnGradReady(func(leaf *tensor.Tensor) {
				s.updated = true
				off.ReadyAndUpdate(leaf)
			}))
		case offloaded:
			hooks = append(hooks, ag.OnGradReady(off.Ready))
		}
		s.dev.WithScope(func() {
			xs, ys := x, y
			if m < n {
				xs, ys = x.Rows(lo, hi), y.Rows(lo, hi)
			}
			s.phase("the forward")
			var loss, right *tensor.Tensor
			var preds int
			if s.Offloader != nil {
				defer s.Offloader.End() // after the backward: one that fails leaves no set on the device
				s.Offloader.Forward(func() { loss, right, preds = s.forward(xs, ys) })
			} else {
				loss, right, preds = s.forward(xs, ys)
			}
			if count {
				be.AccumulateMetrics(s.metrics.Buf(), loss.Buf(), right.Buf(), preds)
			}
			right.Release()
			if s.Observe != nil && count {
				s.Observe(loss)
			}
			scaled := s.Scaler.ScaleLoss(loss)
			if m < n {
				scaled = ag.Scale(scaled, float32(hi-lo)/float32(n))
			}
			s.phase("the backward")
			ag.Backward(scaled, hooks...)
			if offloaded && hi < n {
				off.PartsDown()
			}
		})
	}
}

// updatesInBackward says whether the step's update runs in its backward:
// FuseOptimizer's on the device, or an offloaded optimizer's on the host
// (HostUpdateInBackward) when the gradients need neither clipping nor
// loss scaling.
func (s *Step) updatesInBackward() bool {
	if _, ok := s.Opt.(*optim.Offloaded); ok && s.reducer == nil {
		return s.HostUpdateInBackward && s.ClipNorm <= 0 && !s.Scaler.Enabled()
	}
	return s.FuseOptimizer
}

// updateNow updates the parameter leaf, whose gradient the backward has
// finished, counting the step at the first (FuseOptimizer); with
// clipping, its gradient multiplied first by the clip coefficient of the
// step's first pass (Note [the norm in a first pass]).
func (s *Step) updateNow(fused optim.PerParameter, leaf *tensor.Tensor) {
	i, ok := s.paramIndex(leaf)
	if !ok {
		return // not the optimizer's
	}
	if !s.updated {
		fused.Begin()
		s.updated = true
	}
	if g := leaf.Grad(); g != nil && s.ClipNorm > 0 {
		k := g.Numel()
		g.Backend().Binary(kernels.Mul, g.Buf(), g.Buf(), s.coef.Buf(), kernels.NewBroadcast([]int{k}, []int{k}, []int{1}))
	}
	fused.StepParam(i)
}

// paramIndex is leaf's index in the optimizer's parameters, if it is one.
func (s *Step) paramIndex(leaf *tensor.Tensor) (int, bool) {
	if s.params == nil {
		s.params = map[*tensor.Tensor]int{}
		for i, p := range s.Opt.Params() {
			s.params[p] = i
		}
	}
	i, ok := s.params[leaf]
	return i, ok
}

// Note [the norm in a first pass]: an update fused into the backward
// (FuseOptimizer) cannot wait for every gradient, which clipping to the
// gradients' global norm needs (ClipNorm). So a clipped fused step runs
// its forward and backward twice, as LOMO does: the first sums each
// gradient's squares into a row of its own as the backward finishes it
// and frees it at once, and takes the norm and the clip coefficient from
// the rows on the device (kernels.UnscaleClip, as the unfused step's
// update does); the second, drawing the same random numbers (dropout) from
// the same position of the generator, updates each parameter as its
// gradient is finished, the gradient multiplied by that coefficient first.
// The step holds no more than an unclipped fused one, at about twice its
// forward and backward's time; the results are the unfused clipped step's
// but for the norm's last bits (its squares summed a parameter at a
// time). The first pass's losses do not count in the step's metrics.

// normPass is a clipped fused step's first pass over the batch x, y of n
// examples (Note [the norm in a first pass]): it leaves the gradients'
// norm in gradNorm and the clip coefficient in coef, and no gradient.
func (s *Step) normPass(x, y *tensor.Tensor, n int) {
	be := s.dev.Backend()
	params := s.Opt.Params()
	if s.sqRows == nil {
		s.sqRows = tensor.Zeros(s.dev, tensor.F32, max(1, len(params)), 1).Keep()
		s.coef = tensor.Zeros(s.dev, tensor.F32, 1).Keep()
	}
	be.Fill(s.sqRows.Buf(), 0) // a parameter without a gradient adds none
	s.passes(x, y, n, n, func(leaf *tensor.Tensor) {
		if i, ok := s.paramIndex(leaf); ok && leaf.Grad() != nil {
			row := s.sqRows.Rows(i, i+1)
			be.SumSquares([]kernels.Buf{leaf.Grad().Buf()}, row.Buf())
			row.Release()
		}
		leaf.ZeroGrad() // the second pass makes it again
	}, false)
	sumsq := tensor.Empty(s.dev, tensor.F32, 1)
	defer sumsq.Release()
	be.Reduce(kernels.Sum, sumsq.Buf(), s.sqRows.Buf(), kernels.Reduction{Outer: 1, Len: s.sqRows.Dim(0), Inner: 1})
	be.UnscaleClip(float32(s.ClipNorm), sumsq.Buf(), kernels.Buf{}, s.gradNorm.Buf(), s.coef.Buf(), kernels.Buf{})
}

// phase marks, for a trace being recorded, what the step does next.
func (s *Step) phase(name string) { s.dev.Allocator().Phase(name) }

// markParameterGradients says, for a trace being recorded, which buffers
// hold the parameters' gradients: the backward passed them on as any
// other gradient, the optimiser reads them.
func (s *Step) markParameterGradients() {
	if al := s.dev.Allocator(); al.Tracing() {
		for _, p := range s.Opt.Params() {
			if g := p.Grad(); g != nil {
				al.SetRole(g.Block(), memory.Role{Category: memory.ParameterGradient}, true)
			}
		}
	}
}

// forward runs the model's objective, under autocast with AMP, with the
// loss scale known to it (GradScaler.Forward).
func (s *Step) forward(x, y *tensor.Tensor) (loss, right *tensor.Tensor, n int) {
	run := func() { s.Scaler.Forward(s.dev, func() { loss, right, n = s.Model.Loss(x, y) }) }
	if s.autocast != 0 {
		ag.Autocast(s.dev, s.autocast, run)
	} else {
		run()
	}
	return loss, right, n
}

// GradNorm reads from the device the gradients' global norm before the last
// step's clipping (0 without ClipNorm).
func (s *Step) GradNorm() float64 { return float64(s.gradNorm.Item()) }

// Autocast is the dtype the step's forward autocasts to (0: none).
func (s *Step) Autocast() tensor.DType { return s.autocast }

// Tally is what steps accumulate on the device until ResetMetrics: the
// summed loss of their predictions, how many were right, and how many
// there were (images for a classifier, tokens for a language model).
type Tally struct {
	LossSum      float64
	Right, Count int64
}

// Loss is the mean loss (NaN for no predictions).
func (t Tally) Loss() float64 { return t.LossSum / float64(t.Count) }

// Accuracy is the share of right predictions (NaN for none).
func (t Tally) Accuracy() float64 { return float64(t.Right) / float64(t.Count) }

func tallyOf(v []float32) Tally {
	return Tally{LossSum: float64(v[0]), Right: int64(v[1]), Count: int64(v[2])}
}

// Metrics reads what the steps accumulated since the last ResetMetrics
// (one device read), and the steps the scaler skipped in all. In a
// data-parallel step they are this rank's; JobMetrics sums the ranks'.
func (s *Step) Metrics() (t Tally, skipped int) {
	if s.Scaler.Enabled() {
		skipped = s.Scaler.Skipped()
	}
	return tallyOf(s.metrics.Float32s()), skipped
}

// JobMetrics is Metrics summed over a data-parallel job's ranks (one
// all-reduce of three numbers), so that every rank reads the same figures
// and makes the same decisions with them; without a group it is Metrics.
// The skipped steps are the same on every rank and are not summed.
func (s *Step) JobMetrics() (t Tally, skipped int, err error) {
	if s.group == nil || s.group.Size() == 1 {
		t, skipped = s.Metrics()
		return t, skipped, nil
	}
	if s.Scaler.Enabled() {
		skipped = s.Scaler.Skipped()
	}
	sums := s.metrics.Clone().Keep()
	defer sums.Release()
	if err := s.group.AllReduce([]*tensor.Tensor{sums}, false); err != nil {
		return Tally{}, 0, err
	}
	return tallyOf(sums.Float32s()), skipped, nil
}

// ResetMetrics queues the zeroing of the accumulated metrics.
func (s *Step) ResetMetrics() { s.dev.Backend().Fill(s.metrics.Buf(), 0) }

// setMetrics restores the accumulated metrics (loss sum, right
// predictions, predictions) that an interrupted epoch had reached.
func (s *Step) setMetrics(v []float32) {
	if len(v) != 3 {
		panic(fmt.Sprintf("train: %d metrics restored, want 3", len(v)))
	}
	b := make([]byte, 0, 12)
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	s.dev.Backend().Write(s.metrics.Buf(), b)
}

// SyncRNG reads the generator's position back from the device into the
// host generator (for a checkpoint); the next Run takes it from there.
func (s *Step) SyncRNG() {
	if !s.rngFresh {
		return
	}
	gen := s.dev.Generator()
	st := gen.State()
	st.Offset = uint64(s.rng.Read())
	gen.SetState(st)
	s.rngFresh = false
}

// Plan is the memory plan of batches of x of dtype xdt and shape xShape
// and I32 targets of yShape, once traced (nil before).
func (s *Step) Plan(xdt tensor.DType, xShape, yShape []int) *memory.Plan {
	if st := s.shapes[shapeKey(xdt, xShape, tensor.I32, yShape)]; st != nil {
		return st.plan
	}
	return nil
}

// Arena is the step's planned arena, or nil.
func (s *Step) Arena() *memory.Arena { return s.arena }

// Notes says what the step did that a report should tell: graphs captured,
// shapes that run eagerly and why.
func (s *Step) Notes() []string { return slices.Clone(s.notes) }
