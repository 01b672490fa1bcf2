package optim

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// Offloaded is an optimiser whose state lives in host memory (ZeRO-Offload's
// optimizer offload): the device keeps the parameters and their gradients,
// the host keeps an F32 copy of every parameter, its gradient and the
// optimiser's state (AdamW's two moments: 8 bytes a parameter the device
// no longer holds), and the update runs on the host's cores.
//
// Note [the offloaded step]: the backward hands each parameter to Ready as
// soon as its gradient is finished (autograd.OnGradReady), and Ready sums
// the gradient's squares on the device (for clipping and the loss scaler's
// check, SumGradSquares), starts its copy into its host copy and releases
// it on the device once it is down, so that the gradients come down during
// the rest of the backward and the device holds only about a sixteenth of
// them at once; without clipping or loss scaling, ReadyAndUpdate also
// updates each parameter on the host as its gradient arrives and sends it
// up, while the backward goes on. A step reads the skip flag and the
// gradients' multiplier from the device (so it waits for the backward),
// starts the copies of the gradients Ready was not given, then streams the
// parameters not yet updated: as each gradient is down, the host updates
// that parameter with the optimiser of its own (multi-threaded, fused over
// parameter, moments and gradient) and its copy up is queued. In the
// device's page-locked memory (tensor's Device.Pinned) each copy is one
// direct transfer by the copy engines, down and up on streams of their own
// beside the kernels (Note [copies beside the stream] in kernels); in
// ordinary host memory it goes through the backend's staging buffers, at a
// fraction of the speed, and Ready copies at once. The step ends by making
// the device's later work wait for the copies up; a parameter's host copy
// changes next in the next step's update, after that step's gradient has
// come down, which follows them. The device copy of a parameter is its host
// copy after every step, so the host's is the master. A gradient must not
// change after Ready. The update of a parameter is the on-device
// optimiser's own arithmetic run by the host's backend: on a CPU device an
// offloaded run equals an unoffloaded one bit for bit, but for the norm of
// clipped gradients, summed a parameter at a time (it may differ in its
// last bit). Each parameter counts its own steps (as PyTorch does) where
// the on-device AdamW keeps one count: the two differ only for a parameter
// without a gradient in some steps. Because the host reads the device, a
// step with an offloaded optimiser cannot be captured as a graph (train
// runs it eagerly).
type Offloaded struct {
	params []*tensor.Tensor       // on the device
	slot   map[*tensor.Tensor]int // a parameter's index in params
	host   []*tensor.Tensor       // their copies in host memory, each with its gradient's copy
	pc     kernels.PinnedCopier   // the device's backend when host is its page-locked memory (nil: staged copies)
	inner  []Optimizer            // inner[i] updates host[i]
	mult   *tensor.Tensor         // host F32[1]: the gradients' multiplier of the step
	lr     float64
	kinds  []string
	down   []kernels.Transfer // down[i]: gradient i's copy into host[i]'s, started this step (nil: not started)
	early  []bool             // early[i]: Ready started down[i]
	gone   []bool             // gone[i]: Ready released gradient i on the device
	// work hands the parameters ReadyAndUpdate was given to the goroutine
	// that updates them during the backward (nil when none runs), which
	// closes worked when it ends; updated[i] says it updated parameter i
	// this step.
	work         chan update
	worked       chan struct{}
	updated      []bool
	updatedBytes int64 // parameters' bytes updated during the backward, over the steps
	// queue lists the gradients Ready started down and has not released
	// on the device, oldest first, inFlight their bytes: Ready waits for
	// the oldest while they are more than flightMost, a sixteenth of all
	// the parameters' bytes (the backward runs that far ahead of the
	// copies), and there is more than one.
	queue                []int
	inFlight, flightMost int64
	// squares holds each gradient's sum of squares this step (device
	// F32[len(params), 1]; nil until the first is summed; Ready sums
	// gradient i's as it starts it down, early[i]); begun says it was
	// cleared for this step.
	squares *tensor.Tensor
	begun   bool
	steps   int           // updates taken
	first   time.Duration // by the first, which makes the state, from the step's call to the parameters' last copy queued up
	took    time.Duration // by the others
	hidden  int64         // gradients' bytes Ready started down, over the steps
	total   int64         // gradients' bytes down, over the steps
}

// Offload moves opt's state to host, a host device: the device's Pinned
// for the fastest copies, or tensor.CPU():
// it returns an optimiser of opt's kind and hyper-parameters over opt's
// parameters whose state, and copies of the parameters and gradients, live
// there, and releases opt. opt must be SGD or AdamW and must not have
// stepped; when Offload fails (host memory), opt is as it was.
func Offload(opt Optimizer, host *tensor.Device) (o *Offloaded, err error) {
	kinds, err := StateKinds(opt)
	if err != nil {
		return nil, err
	}
	if len(opt.State()) > 0 {
		return nil, fmt.Errorf("optim: offloading an optimizer that has taken steps (its state would be lost)")
	}
	params := opt.Params()
	n := len(params)
	o = &Offloaded{params: params, slot: map[*tensor.Tensor]int{}, lr: opt.LR(), kinds: kinds, down: make([]kernels.Transfer, n),
		early: make([]bool, n), gone: make([]bool, n), updated: make([]bool, n)}
	defer func() {
		if r := recover(); r != nil {
			o.Release()
			o, err = nil, fmt.Errorf("optim: offloading the optimizer's state: %w", tensor.AsError(r))
		}
	}()
	if len(params) > 0 {
		if pc, ok := params[0].Backend().(kernels.PinnedCopier); ok && host.Allocator().Source() == pc.PinnedSource() {
			o.pc = pc
		}
	}
	o.mult = tensor.Zeros(host, tensor.F32, 1).Keep()
	for i, p := range params {
		o.slot[p] = i
		o.flightMost += p.Bytes() / 16
		h := tensor.FromBytes(host, tensor.F32, p.Raw(), p.Shape()...).Keep()
		h.SetGrad(tensor.Zeros(host, tensor.F32, p.Shape()...).Keep())
		o.host = append(o.host, h)
		in, err := Partition(opt, []*tensor.Tensor{h}, []int{i})
		if err != nil {
			panic(err)
		}
		o.inner = append(o.inner, in)
	}
	opt.Release()
	return o, nil
}

// ReadyAndUpdate is Ready, and then, as soon as the gradient is down, the
// parameter's update on the host and its copy up, on a goroutine of their
// own while the backward goes on: the update hidden behind the backward,
// for steps whose gradients need neither a multiplier nor a skip flag (no
// clipping, no loss scaling: the step's StepScaled panics when given
// either after such a backward). A parameter updated there cannot take a
// second part of its gradient: a second call for it panics, naming it.
func (o *Offloaded) ReadyAndUpdate(leaf *tensor.Tensor) {
	i, ok := o.slot[leaf]
	if !ok || leaf.Grad() == nil {
		return
	}
	if o.early[i] {
		panic(fmt.Sprintf("optim: the gradient of parameter %d (shape %v) was finished twice in one backward, after its update began: a parameter read in several checkpointed blocks cannot be updated in the backward", i, leaf.Shape()))
	}
	o.Ready(leaf)
	if o.work == nil {
		o.work, o.worked = make(chan update, len(o.params)), make(chan struct{})
		go func() {
			defer close(o.worked)
			for u := range o.work {
				u.down.Wait()
				o.update(u.i, kernels.Buf{}, 1)
				o.updated[u.i] = true
			}
		}()
	}
	o.work <- update{i, o.down[i]}
}

// update is a parameter whose gradient is coming down, for the goroutine
// that updates it during the backward.
type update struct {
	i    int
	down kernels.Transfer
}

// stopWork waits for the updates ReadyAndUpdate started.
func (o *Offloaded) stopWork() {
	if o.work != nil {
		close(o.work)
		<-o.worked
		o.work, o.worked = nil, nil
	}
}

// update updates parameter i on the host from its gradient there, read
// through the multiplier m (on the host; invalid: none) of value mv, and
// queues its copy up.
func (o *Offloaded) update(i int, m kernels.Buf, mv float32) {
	switch in := o.inner[i].(type) {
	case ScaledStepper:
		in.StepScaled(m, kernels.Buf{})
	default:
		if m.Valid() {
			f := hostF32s(o.host[i].Grad())
			for k := range f {
				f[k] *= mv
			}
		}
		in.Step()
	}
	if o.pc != nil {
		o.pc.StartWrite(o.params[i].Buf(), o.host[i].HostBytes())
	} else {
		o.params[i].Backend().Write(o.params[i].Buf(), o.host[i].HostBytes())
	}
}

// UpdatedInBackward is the share of the parameters' bytes updated during
// the backward (ReadyAndUpdate), over the steps so far (0 before one).
func (o *Offloaded) UpdatedInBackward() float64 {
	if o.total == 0 {
		return 0
	}
	return float64(o.updatedBytes) / float64(o.total)
}

// OffloadedDeviceBytes is the least device memory n parameters take
// under an offloaded optimizer whose gradients leave the device during the
// backward (Ready): the parameters in F32 and the sixteenth of their
// gradients in flight. Micro-batches hold the whole gradients between
// their backwards.
func OffloadedDeviceBytes(n int64) int64 { return n*4 + n*4/16 }

// Ready is the backward's hook (autograd.OnGradReady): leaf's gradient is
// finished, so Ready sums its squares on the device (for the step's
// clipping), starts its copy into host memory and, once the copy is done,
// releases it on the device (Note [the offloaded step]): after such a
// backward the parameters' gradients are in host memory only (Grad is
// nil), and the step, SumGradSquares and ZeroGrad know which had one.
// Leaves that are not the optimiser's parameters are ignored. Give it only
// to the backward that finishes the gradients (a step's last micro-batch).
func (o *Offloaded) Ready(leaf *tensor.Tensor) {
	i, ok := o.slot[leaf]
	if !ok || leaf.Grad() == nil {
		return
	}
	if o.gone[i] {
		panic(fmt.Sprintf("optim: the gradient of parameter %d (shape %v) was finished twice in one backward, after its first part had left the device: a parameter read in several checkpointed blocks cannot stream its gradient to host memory as the backward finishes it",
			i, leaf.Shape()))
	}
	o.sumSquares(i)
	o.early[i] = true
	o.startDown(i) // again for a gradient finished twice while on the device: the later copy lands last
	o.queue = append(o.queue, i)
	o.inFlight += leaf.Bytes()
	for len(o.queue) > 1 && o.inFlight > o.flightMost {
		j := o.queue[0]
		o.queue = o.queue[1:]
		o.down[j].Wait()
		o.inFlight -= o.params[j].Bytes()
		if !o.gone[j] { // j may be queued twice
			o.params[j].SetGrad(nil)
			o.gone[j] = true
		}
	}
}

// sumSquares queues the sum of the squares of gradient i into squares[i].
func (o *Offloaded) sumSquares(i int) {
	p := o.params[i]
	if o.squares == nil {
		o.squares = tensor.Zeros(p.Device(), tensor.F32, len(o.params), 1).Keep()
	}
	if !o.begun { // the step's first: a parameter without a gradient adds 0
		p.Backend().Fill(o.squares.Buf(), 0)
		o.begun = true
	}
	row := o.squares.Rows(i, i+1)
	defer row.Release()
	p.Backend().SumSquares([]kernels.Buf{p.Grad().Buf()}, row.Buf())
}

// SumGradSquares writes the sum of the squares of the step's gradients,
// those Ready released on the device among them, into sumsq (F32, 1
// element, on the device) (SquareSummer).
func (o *Offloaded) SumGradSquares(sumsq kernels.Buf) {
	o.checkLate()
	for i, p := range o.params {
		if p.Grad() != nil && !o.early[i] { // not summed by Ready
			o.sumSquares(i)
		}
	}
	if o.squares == nil { // no gradient yet
		if len(o.params) > 0 {
			o.params[0].Backend().Fill(sumsq, 0)
		}
		return
	}
	if !o.begun { // none this step
		o.squares.Backend().Fill(o.squares.Buf(), 0)
		o.begun = true
	}
	be := o.squares.Backend()
	be.Reduce(kernels.Sum, sumsq, o.squares.Buf(), kernels.Reduction{Outer: 1, Len: len(o.params), Inner: 1})
}

// startDown starts gradient i's copy into its host copy (at once, through
// the staging buffers, without page-locked memory).
func (o *Offloaded) startDown(i int) {
	p := o.params[i]
	g := p.Grad()
	if g.DType() != tensor.F32 || !g.SameShape(p) {
		panic(fmt.Sprintf("optim: parameter %d's gradient is %v %v; want f32 %v", i, g.DType(), g.Shape(), p.Shape()))
	}
	if o.pc != nil {
		o.down[i] = o.pc.StartRead(o.host[i].Grad().HostBytes(), g.Buf())
		return
	}
	p.Backend().Read(o.host[i].Grad().HostBytes(), g.Buf())
	o.down[i] = done{}
}

// done is a copy already done.
type done struct{}

func (done) Wait() {}

// checkLate panics when a gradient the backward finished (Ready) and
// released on the device has a part again: one the backward added after
// saying it was finished, which no copy would carry.
func (o *Offloaded) checkLate() {
	for i, p := range o.params {
		if o.gone[i] && p.Grad() != nil {
			panic(fmt.Sprintf("optim: parameter %d (shape %v) has a gradient again after the backward finished it and its copy left the device", i, p.Shape()))
		}
	}
}

// settle waits for the gradients' copies under way and forgets the step:
// the device's gradients may change or be released after it.
func (o *Offloaded) settle() {
	o.stopWork()
	for i, d := range o.down {
		if d != nil {
			d.Wait()
			o.down[i] = nil
		}
		o.early[i], o.gone[i], o.updated[i] = false, false, false
	}
	o.queue, o.inFlight, o.begun = o.queue[:0], 0, false
}

// Step updates every parameter that has a gradient.
func (o *Offloaded) Step() { o.StepScaled(kernels.Buf{}, kernels.Buf{}) }

// StepUnless is Step unless skip (F32, 1 element, on the device) is set.
func (o *Offloaded) StepUnless(skip kernels.Buf) { o.StepScaled(kernels.Buf{}, skip) }

// StepScaled is StepUnless with every gradient multiplied by mult (F32, 1
// element, on the device; invalid: 1) as the update reads it (Note [the
// offloaded step]).
func (o *Offloaded) StepScaled(mult, skip kernels.Buf) {
	defer o.settle()
	if len(o.params) == 0 {
		return
	}
	start := time.Now() // what the backward did not hide: the updates it began, finished, too
	o.stopWork()
	o.checkLate()
	if slices.Contains(o.updated, true) && (mult.Valid() || skip.Valid()) {
		panic("optim: an offloaded optimizer's step given a gradient multiplier or a skip flag after ReadyAndUpdate updated parameters in the backward (use Ready with clipping or loss scaling)")
	}
	be := o.params[0].Backend()
	if skip.Valid() && scalar(be, skip) != 0 {
		return
	}
	var m kernels.Buf
	mv := float32(1)
	if mult.Valid() {
		mv = scalar(be, mult)
		o.mult.Backend().Fill(o.mult.Buf(), mv)
		m = o.mult.Buf()
	}
	defer func() {
		if o.steps++; o.steps == 1 {
			o.first = time.Since(start)
		} else {
			o.took += time.Since(start)
		}
	}()
	if o.pc != nil { // the rest come down at once, behind those Ready started
		for i, p := range o.params {
			if o.down[i] == nil && p.Grad() != nil {
				o.startDown(i)
			}
		}
	}
	ready := make(chan int, 2)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the gradients come down, one ahead of the updates
		defer wg.Done()
		defer close(ready)
		for i, p := range o.params {
			if o.down[i] == nil && p.Grad() != nil {
				o.startDown(i)
			}
			if o.down[i] != nil { // it has a gradient this step
				o.down[i].Wait()
				n := o.host[i].Grad().Bytes()
				o.total += n
				if o.early[i] {
					o.hidden += n
				}
				if o.updated[i] {
					o.updatedBytes += n
					continue
				}
				ready <- i
			}
		}
	}()
	defer wg.Wait()
	for i := range ready {
		o.update(i, m, mv)
	}
	if o.pc != nil {
		o.pc.JoinWrites()
	}
}

// MeanStep is the mean time of the updates after the first (FirstStep,
// until there is a second), from the step's call to the parameters' last
// copy queued up (0 before one): what the backward did not hide.
func (o *Offloaded) MeanStep() time.Duration {
	if o.steps < 2 {
		return o.first
	}
	return o.took / time.Duration(o.steps-1)
}

// FirstStep is the time of the first update, which also makes the
// optimiser's state in host memory (page-locking it takes seconds for
// billions of parameters), from the step's call to the parameters' last
// copy queued up (0 before one).
func (o *Offloaded) FirstStep() time.Duration { return o.first }

// Overlapped is the share of the gradients' bytes that began to come down
// during the backward (Ready), over the steps so far (0 before one).
func (o *Offloaded) Overlapped() float64 {
	if o.total == 0 {
		return 0
	}
	return float64(o.hidden) / float64(o.total)
}

// scalar reads a one-element F32 buffer of be's device.
func scalar(be kernels.Backend, b kernels.Buf) float32 {
	kernels.CheckScalar("optimizer flag", b)
	var v float32
	be.Read(unsafe.Slice((*byte)(unsafe.Pointer(&v)), 4), b)
	return v
}

// hostF32s is the elements of t, an F32 tensor in host memory.
func hostF32s(t *tensor.Tensor) []float32 {
	b := t.HostBytes()
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

// ZeroGrad releases the device's gradients (the host's copies stay, to be
// overwritten), once the copies Ready started are done: after a step that
// failed before its update, too.
func (o *Offloaded) ZeroGrad() {
	o.settle()
	zeroGrad(o.params)
}

// Params are the parameters, on the device.
func (o *Offloaded) Params() []*tensor.Tensor { return o.params }

// LR is the learning rate.
func (o *Offloaded) LR() float64 { return o.lr }

// SetLR sets every parameter's learning rate.
func (o *Offloaded) SetLR(lr float64) {
	o.lr = lr
	for _, in := range o.inner {
		in.SetLR(lr)
	}
}

// State lists the state in host memory, named as the on-device
// optimiser's ("<kind>.<param index>"), so that checkpoints move between
// the two.
func (o *Offloaded) State() map[string]*tensor.Tensor {
	s := map[string]*tensor.Tensor{}
	for i, in := range o.inner {
		for k, t := range in.State() {
			s[strings.TrimSuffix(k, ".0")+"."+strconv.Itoa(i)] = t
		}
	}
	return s
}

// Pinned reports whether the host copies are in the device's page-locked
// memory (copied directly; see Note [the offloaded step]).
func (o *Offloaded) Pinned() bool { return o.pc != nil }

// HostBytes is the host memory the optimiser holds: the parameters' and
// gradients' copies and the state.
func (o *Offloaded) HostBytes() int64 {
	var n int64
	for _, h := range o.host {
		n += h.Bytes() + h.Grad().Bytes()
	}
	for _, t := range o.State() {
		n += t.Bytes()
	}
	return n
}

// Counters lists the learning rate and, for AdamW, the step count (the
// most any parameter took).
func (o *Offloaded) Counters() map[string]float64 {
	c := map[string]float64{"lr": o.lr}
	for _, in := range o.inner {
		if s, ok := in.Counters()["step"]; ok {
			c["step"] = max(c["step"], s)
		}
	}
	return c
}

// LoadState restores what State and Counters (of this optimiser or of the
// on-device one of its kind) returned, and copies the parameters' values
// from the device into the host's master copies: a resumed run loads the
// model's weights first, then the optimiser's state.
func (o *Offloaded) LoadState(ts map[string]*tensor.Tensor, c map[string]float64) error {
	for i, p := range o.params {
		p.Backend().Read(o.host[i].HostBytes(), p.Buf())
	}
	for i, in := range o.inner {
		mine := map[string]*tensor.Tensor{}
		for _, k := range o.kinds {
			if t, ok := ts[k+"."+strconv.Itoa(i)]; ok {
				mine[k+".0"] = t
			}
		}
		cc := map[string]float64{}
		for k, v := range c {
			cc[k] = v
		}
		if len(mine) == 0 {
			delete(cc, "step") // a parameter without state has not stepped
		}
		if err := in.LoadState(mine, cc); err != nil {
			return fmt.Errorf("parameter %d: %w", i, err)
		}
	}
	if lr, ok := c["lr"]; ok {
		o.lr = lr
	}
	return nil
}

// Release frees the host copies and the state, once the device has read
// the parameters' last copies up.
func (o *Offloaded) Release() {
	if o.down != nil {
		o.settle()
	}
	if o.pc != nil && len(o.params) > 0 {
		if err := o.params[0].Device().Synchronize(); err != nil {
			panic(fmt.Sprintf("optim: releasing the offloaded optimizer: %v", err))
		}
	}
	for _, in := range o.inner {
		in.Release()
	}
	for _, h := range o.host {
		h.Release() // its gradient with it
	}
	for _, t := range []*tensor.Tensor{o.mult, o.squares} {
		if t != nil {
			t.Release()
		}
	}
	o.inner, o.host, o.mult, o.squares = nil, nil, nil, nil
}
