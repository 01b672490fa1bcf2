package optim

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/tensor"
	"github.com/x448/float16"
)

// Offloaded is an optimiser whose state lives in host memory (ZeRO-Offload's
// optimizer offload): the device keeps the parameters and their gradients,
// the host keeps an F32 copy of every parameter, its gradient and the
// optimiser's state (AdamW's two moments: 8 bytes a parameter the device
// no longer holds), and the update runs on the host's cores; but for the
// parameters OffloadSome keeps on the device (Note [state kept on the
// device]).
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
//
// Note [working weights in 16 bits]: a parameter in BF16 or F16 on the
// device (nn.GPTConfig.ProductWeights) is a working copy of its F32
// master in host memory. Its gradient comes in its dtype. AdamW on the
// host keeps its copy in that dtype too, widens it as it reads it and
// rounds the updated master to the parameter's dtype into the same
// buffer, nearest even as the device's casts do, in one pass
// (kernels.MasterAdamW; OffloadedHostBytes counts two bytes a gradient).
// SGD's gradient comes down into the first half of an F32 copy, which its
// update widens in place first (halves of the buffer from the end: each
// half's values land past the narrow ones still unread) and rounds into
// after. The rounded values are the copy up. The device holds two
// bytes a value and sends two down and two up; the host holds the F32
// master and state and the gradient, and a checkpoint the masters
// ("master.<index>" in State). With host the device's page-locked memory,
// only the gradient's buffer is there: no copy reads the master or the
// state, which stay in a pageable pool of their own (pageable), so that
// page-locking, which takes seconds for billions of values and the memory
// from everything else, is a seventh of it under AdamW.
//
// Note [parts summed on the host]: a step of micro-batches hands each
// gradient of every micro-batch but the last to Part, which copies it
// down like Ready and releases it on the device, so that the device never
// holds the step's gradients whole (nor sums them in a 16-bit dtype), and
// PartsDown ends each such micro-batch. A goroutine adds each part,
// widened, into the parameter's F32 sum in host memory (4 bytes a
// parameter, made at the first part: OffloadedSumBytes; pageable beside
// page-locked copies, as the masters of 16-bit weights) while the
// backward goes on, before the next part of it may land where this one
// did. The last micro-batch's gradient comes through Ready or
// ReadyAndUpdate, and its sum is the step's gradient: in the F32 gradient
// copy of an F32 parameter, in the sum of a 16-bit one, which AdamW reads
// in F32 (kernels.MasterAdamW) and the others through the F32 copy. The
// sum's squares are summed as it is written, so the step's norm is the
// host's for those parameters (the device's rows for the others). Each
// part is added to the sum of those before it, as the device adds a
// backward's gradient to the one it holds, so on a CPU device a
// micro-batched offloaded step equals the unoffloaded one bit for bit for
// F32 parameters whose gradient a backward makes in one piece (a tied
// one, finished from several, adds them in another order there).
//
// Note [state kept on the device]: OffloadSome keeps some F32 parameters'
// state on the device, where the budget has room for it: each such
// parameter is updated by an optimizer of its own on the device (the
// on-device optimizer's arithmetic, bit for bit), its gradient stays on
// the device until the step (through the micro-batches too, summed there
// as the on-device optimizer's is), nothing of it is copied, and its
// state is named in State as the others'. The device then holds, for each
// parameter kept, its gradient whole and its state (12 bytes a parameter
// under AdamW, beside the 4 of its F32 value), and the host's update
// skips it. With the update in the backward (ReadyAndUpdate) a kept
// parameter is updated there on the device as its gradient is finished:
// the parameters a backward finishes last (the embeddings of a GPT,
// which its forward reads first) are those whose host update would be
// left after the backward, and keeping them takes that tail away.
type Offloaded struct {
	params []*tensor.Tensor       // on the device
	slot   map[*tensor.Tensor]int // a parameter's index in params
	host   []*tensor.Tensor       // their copies in host memory, each with its gradient's copy (nil: kept, Note [state kept on the device])
	pc     kernels.PinnedCopier   // the device's backend when host is its page-locked memory (nil: staged copies)
	at     *tensor.Device         // the host device Offload was given
	inner  []Optimizer            // inner[i] updates host[i], or parameter i where it is kept
	mult   *tensor.Tensor         // host F32[1]: the gradients' multiplier of the step
	lr     float64
	kinds  []string
	down   []kernels.Transfer // down[i]: gradient i's copy into host[i]'s, started this step (nil: not started)
	early  []bool             // early[i]: Ready started down[i]
	gone   []bool             // gone[i]: Ready released gradient i on the device
	// work hands the goroutine that runs during the backward (nil when
	// none runs) the parts to sum and the parameters ReadyAndUpdate was
	// given to update, in order; it closes worked when it ends. updated[i]
	// says it updated parameter i this step.
	work         chan job
	worked       chan struct{}
	updated      []bool
	updatedBytes int64 // parameters' bytes updated during the backward, over the steps
	steppedBytes int64 // parameters' bytes with a gradient, over the steps
	// Note [parts summed on the host]: sums[i] is gradient i's F32 sum
	// (nil until a part comes), parts[i] the parts of it started down this
	// step, summed[i] says the step's is summed (its squares' sum in sq[i]), and
	// landing[i], when not nil, is closed once the host is done with the
	// gradient's copy down, so that the next may land there.
	sums    []*tensor.Tensor
	parts   []int
	summed  []bool
	sq      []float64
	landing []chan struct{}
	// queue lists the gradients Ready and Part started down and have not
	// released on the device, oldest first, inFlight their bytes: they
	// wait for the oldest while they are more than flightMost, a sixteenth
	// of all the parameters' bytes (the backward runs that far ahead of
	// the copies), and there is more than one (drain).
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
func Offload(opt Optimizer, host *tensor.Device) (*Offloaded, error) {
	return OffloadSome(opt, host, nil)
}

// OffloadSome is Offload but for the parameters i where keep[i] (keep is
// nil or has a value a parameter of opt's): their state stays on the
// device, and their update runs there (Note [state kept on the device]).
// It panics when keep's length is not the parameters' count or it keeps a
// 16-bit working weight, whose F32 master must be the host's.
func OffloadSome(opt Optimizer, host *tensor.Device, keep []bool) (o *Offloaded, err error) {
	params := opt.Params()
	n := len(params)
	if keep == nil {
		keep = make([]bool, n)
	}
	if len(keep) != n {
		panic(fmt.Sprintf("optim: %d parameters to keep or offload, of %d", len(keep), n))
	}
	for i, k := range keep {
		if k && params[i].DType() != tensor.F32 {
			panic(fmt.Sprintf("optim: keeping the state of parameter %d, a %v %v working weight, on the device: its F32 master is the host's", i, params[i].DType(), params[i].Shape()))
		}
	}
	kinds, err := StateKinds(opt)
	if err != nil {
		return nil, err
	}
	if len(opt.State()) > 0 {
		return nil, fmt.Errorf("optim: offloading an optimizer that has taken steps (its state would be lost)")
	}
	o = &Offloaded{params: params, slot: map[*tensor.Tensor]int{}, at: host, lr: opt.LR(), kinds: kinds, down: make([]kernels.Transfer, n),
		early: make([]bool, n), gone: make([]bool, n), updated: make([]bool, n),
		sums: make([]*tensor.Tensor, n), parts: make([]int, n), summed: make([]bool, n), sq: make([]float64, n), landing: make([]chan struct{}, n)}
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
		if keep[i] { // updated on the device by an optimizer of its own
			in, err := Partition(opt, []*tensor.Tensor{p}, []int{i})
			if err != nil {
				panic(err)
			}
			o.host = append(o.host, nil)
			o.inner = append(o.inner, in)
			continue
		}
		o.flightMost += p.Bytes() / 16
		at := host
		if p.DType().Half() { // no copy reads the master or the state: only the gradient's buffer is page-locked
			at = o.unread()
		}
		h := hostMaster(at, p)
		in, err := Partition(opt, []*tensor.Tensor{h}, []int{i})
		if err != nil {
			panic(err)
		}
		gradType := tensor.F32
		if onePass(p, in) {
			gradType = p.DType()
		}
		h.SetGrad(tensor.Zeros(host, gradType, p.Shape()...).Keep())
		o.host = append(o.host, h)
		o.inner = append(o.inner, in)
	}
	opt.Release()
	return o, nil
}

// onePass says whether parameter p's update by in, its optimizer on the
// host, reads its gradient in p's 16-bit dtype and rounds p's master in
// the same pass (AdamW.stepMasters), so that the gradient's host copy
// takes p's bytes rather than F32's.
func onePass(p *tensor.Tensor, in Optimizer) bool {
	a, ok := in.(*AdamW)
	if !ok || !p.DType().Half() || !fuseMasters || a.qmap != nil {
		return false
	}
	_, ok = a.params[0].Backend().(kernels.MasterAdamW)
	return ok
}

// OffloadedHostBytes is the host memory an offloaded optimizer (Offload)
// of kind name holds for n parameters of paramBytes on the device: their
// F32 copies (the masters of 16-bit ones), the state, and the gradients'
// copies, in the parameters' dtypes for AdamW (its update reads a 16-bit
// gradient as it is), in F32 for the others.
func OffloadedHostBytes(name string, n, paramBytes int64) int64 {
	grads := 4 * n
	if name == "adamw" {
		grads = paramBytes
	}
	return 4*n + grads + StateBytes(name, n)
}

// OffloadedSumBytes is the host memory an offloaded optimizer adds for n
// parameters once a step runs in micro-batches: their gradients' F32 sums
// (Note [parts summed on the host]).
func OffloadedSumBytes(n int64) int64 { return 4 * n }

// pageable is the host device of 16-bit parameters' masters and state
// when their gradients are in page-locked memory: the CPU's, in a pool of
// its own, whose handle no step's scope shares (Note [working weights in
// 16 bits]).
var pageable = sync.OnceValue(func() *tensor.Device { return tensor.NewDevice(cpu.New()) })

// hostMaster is p's F32 master copy in host memory: p's values, widened
// from a 16-bit p.
func hostMaster(host *tensor.Device, p *tensor.Tensor) *tensor.Tensor {
	if p.DType() == tensor.F32 {
		return tensor.FromBytes(host, tensor.F32, p.Raw(), p.Shape()...).Keep()
	}
	if !p.DType().Half() {
		panic(fmt.Sprintf("optim: offloading a %v parameter of shape %v: want f32, bf16 or f16", p.DType(), p.Shape()))
	}
	narrow := tensor.FromBytes(host, p.DType(), p.Raw(), p.Shape()...)
	defer narrow.Release()
	h := tensor.Empty(host, tensor.F32, p.Shape()...).Keep()
	host.Backend().Cast(h.Buf(), narrow.Buf())
	return h
}

// ReadyAndUpdate is Ready, and then, as soon as the gradient is down, the
// parameter's update on the host and its copy up, on a goroutine of their
// own while the backward goes on: the update hidden behind the backward,
// for steps whose gradients need neither a multiplier nor a skip flag (no
// clipping, no loss scaling: the step's StepScaled panics when given
// either after such a backward); a parameter kept on the device
// (OffloadSome) is updated there at once. A parameter updated there cannot
// take a second part of its gradient: a second call for it panics, naming
// it.
func (o *Offloaded) ReadyAndUpdate(leaf *tensor.Tensor) {
	i, ok := o.slot[leaf]
	if !ok || leaf.Grad() == nil {
		return
	}
	if o.early[i] {
		panic(fmt.Sprintf("optim: the gradient of parameter %d (shape %v) was finished twice in one backward, after its update began: a parameter read in several checkpointed blocks cannot be updated in the backward", i, leaf.Shape()))
	}
	if o.kept(i) { // on the device, now
		o.early[i], o.updated[i] = true, true
		o.inner[i].Step()
		leaf.ZeroGrad()
		return
	}
	o.Ready(leaf)
	o.enqueue(job{i: i, down: o.down[i], update: true})
}

// job is work for the goroutine that runs beside the backward: the part of
// gradient i coming down (down) to sum into its sum (sum; last says it is
// the step's last), then, with update, parameter i's update.
type job struct {
	i                        int
	down                     kernels.Transfer
	sum, first, last, update bool
	landed                   chan struct{} // closed once the part is summed
}

// enqueue hands j to the goroutine beside the backward, starting it.
func (o *Offloaded) enqueue(j job) {
	if o.work == nil {
		o.work, o.worked = make(chan job, 2*len(o.params)), make(chan struct{})
		go func() {
			defer close(o.worked)
			for j := range o.work {
				j.down.Wait()
				if j.sum {
					o.sumPart(j.i, j.first, j.last)
					close(j.landed)
				}
				if j.update {
					o.update(j.i, kernels.Buf{}, 1)
					o.updated[j.i] = true
				}
			}
		}()
	}
	if j.sum {
		j.landed = make(chan struct{})
		o.landing[j.i] = j.landed
	}
	o.work <- j
}

// stopWork waits for the work queued beside the backward.
func (o *Offloaded) stopWork() {
	if o.work != nil {
		close(o.work)
		<-o.worked
		o.work, o.worked = nil, nil
	}
}

// Part is the backward's hook (autograd.OnGradReady) in a step's
// micro-batches but the last: leaf's gradient, a part of the step's,
// comes down into host memory, leaves the device (PartsDown waits for the
// last ones) and is added to the parameter's F32 sum there by the
// goroutine beside the backward (Note [parts summed on the host]).
// Leaves that are not the optimiser's parameters are ignored, and so are
// those kept on the device, whose parts add up there.
func (o *Offloaded) Part(leaf *tensor.Tensor) {
	i, ok := o.slot[leaf]
	if !ok || leaf.Grad() == nil || o.kept(i) { // a kept one's parts add up on the device
		return
	}
	if o.early[i] {
		panic(fmt.Sprintf("optim: a part of the gradient of parameter %d (shape %v) after the step's last (Ready)", i, leaf.Shape()))
	}
	if slices.Contains(o.queue, i) {
		panic(fmt.Sprintf("optim: the gradient of parameter %d (shape %v) was finished twice in one micro-batch's backward", i, leaf.Shape()))
	}
	if o.sums[i] == nil { // here, where running out of host memory is an error the step returns
		o.sums[i] = tensor.Empty(o.unread(), tensor.F32, leaf.Shape()...).Keep()
	}
	o.land(i)
	o.startDown(i)
	o.enqueue(job{i: i, down: o.down[i], sum: true, first: o.parts[i] == 0})
	o.parts[i]++
	o.queue = append(o.queue, i)
	o.inFlight += leaf.Bytes()
	o.drain(o.flightMost)
}

// PartsDown ends a micro-batch whose gradients went to Part: it waits for
// their copies down and releases them on the device, so that the next
// micro-batch's backward starts from none.
func (o *Offloaded) PartsDown() { o.drain(-1) }

// unread is where the host keeps what no copy reads: pageable memory
// beside page-locked copies (Note [working weights in 16 bits]), else the
// host device Offload was given.
func (o *Offloaded) unread() *tensor.Device {
	if o.pc != nil {
		return pageable()
	}
	return o.at
}

// land waits until the host is done with gradient i's last copy down, so
// that the next may land where it did.
func (o *Offloaded) land(i int) {
	if c := o.landing[i]; c != nil {
		<-c
		o.landing[i] = nil
	}
}

// landed is gradient i's copy down, where the host reads it: its host
// copy's gradient, in the first half of an F32 one for a 16-bit parameter
// that is not updated in one pass (Note [working weights in 16 bits]).
func (o *Offloaded) landed(i int) kernels.Buf {
	b := narrowed(o.host[i].Grad(), o.params[i].DType())
	b.N = o.params[i].Numel()
	return b
}

// sumPart adds the part of gradient i that came down into its sum; the
// step's last part writes the step's gradient where the update reads it
// (Note [parts summed on the host]) and keeps its sum of squares.
func (o *Offloaded) sumPart(i int, first, last bool) {
	p, h := o.params[i], o.host[i]
	sum, part := o.sums[i].Buf(), o.landed(i)
	var prev kernels.Buf
	if !first {
		prev = sum
	}
	dst := sum
	if last { // where the update reads it
		dst = o.hostGrad(i)
	}
	sq := h.Backend().(kernels.PartSummer).SumPart(dst, prev, part)
	n := p.Bytes()
	o.total += n
	o.hidden += n
	if last {
		o.summed[i], o.sq[i] = true, sq
	}
}

// finishSum makes the step's gradient of parameter i, whose last part did
// not come (it had no gradient in the last micro-batch), its sum so far.
func (o *Offloaded) finishSum(i int) {
	o.sq[i] = o.host[i].Backend().(kernels.PartSummer).SumPart(o.hostGrad(i), kernels.Buf{}, o.sums[i].Buf())
	o.summed[i] = true
}

// hostGrad is the buffer the update reads parameter i's gradient from
// when the step summed it from parts, in F32: its sum, or its F32 copy
// for an F32 parameter.
func (o *Offloaded) hostGrad(i int) kernels.Buf {
	if o.params[i].DType() == tensor.F32 {
		return o.host[i].Grad().Buf()
	}
	return o.sums[i].Buf()
}

// update updates parameter i on the host from its gradient there, read
// through the multiplier m (on the host; invalid: none) of value mv, and
// queues its copy up.
func (o *Offloaded) update(i int, m kernels.Buf, mv float32) {
	p, h := o.params[i], o.host[i]
	half := p.DType().Half()
	narrow := narrowed(h.Grad(), p.DType())
	summed := o.parts[i] > 0 // the gradient is the F32 sum of parts (Note [parts summed on the host])
	switch {
	case h.Grad().DType().Half(): // widened, updated and rounded in one pass (onePass)
		g := narrow
		if summed {
			g = o.hostGrad(i)
		}
		if !o.inner[i].(*AdamW).stepMasters(m, []kernels.Buf{g}, []kernels.Buf{narrow}) {
			panic(fmt.Sprintf("optim: parameter %d's host optimizer cannot update its %v master in one pass", i, p.DType()))
		}
	case half:
		if summed {
			h.Backend().Copy(h.Grad().Buf(), o.hostGrad(i))
		} else {
			widen(h.Grad(), p.DType())
		}
		o.step(i, m, mv)
		h.Backend().Cast(narrow, h.Buf())
	default:
		o.step(i, m, mv)
	}
	up := h.HostBytes()
	if half { // rounded into the gradient's buffer, which the next step's gradient overwrites after the copy
		up = h.Grad().HostBytes()[:p.Bytes()]
	}
	if o.pc != nil {
		o.pc.StartWrite(p.Buf(), up)
	} else {
		p.Backend().Write(p.Buf(), up)
	}
}

// fuseMasters turns on the one-pass update of 16-bit weights' masters
// (AdamW.stepMasters); the package's benchmark turns it off to compare.
var fuseMasters = true

// step runs inner optimizer i over its parameter's F32 gradient (host
// copy i's, or parameter i's where it is kept on the device), read through
// the multiplier m (on that optimizer's device; invalid: none) of value
// mv.
func (o *Offloaded) step(i int, m kernels.Buf, mv float32) {
	switch in := o.inner[i].(type) {
	case ScaledStepper:
		in.StepScaled(m, kernels.Buf{})
	default:
		if m.Valid() {
			g := in.Params()[0].Grad()
			g.Backend().Affine(g.Buf(), g.Buf(), mv, 0)
		}
		in.Step()
	}
}

// narrowed is the first half of g, an F32 host tensor, as a buffer of its
// values in dt, a 16-bit dtype (Note [working weights in 16 bits]); g
// itself when it is of dt.
func narrowed(g *tensor.Tensor, dt tensor.DType) kernels.Buf {
	b := g.Buf()
	b.DType = dt
	return b
}

// widen converts the 16-bit values of dt in the first half of g, an F32
// host tensor, into g's F32 values in place: in passes over halves of the
// values from the end, [⌈hi/2⌉, hi) each, whose F32 values (from byte
// 4⌈hi/2⌉ on) land past the narrow ones they read (below byte 2hi) and
// the ones not yet read (below byte 2⌈hi/2⌉), so that each pass is one
// conversion over the backend's threads.
func widen(g *tensor.Tensor, dt tensor.DType) {
	b, be := g.Buf(), g.Backend()
	for hi := b.N; hi > 0; {
		lo := (hi + 1) / 2
		if hi == 1 {
			lo = 0
		}
		n := hi - lo
		src := kernels.Buf{Block: b.Block, Off: b.Off + 2*int64(lo), N: n, DType: dt}
		dst := kernels.Buf{Block: b.Block, Off: b.Off + 4*int64(lo), N: n, DType: tensor.F32}
		if lo == 0 { // the first value, in place: read before it is written
			raw := g.HostBytes()
			bits := binary.LittleEndian.Uint16(raw)
			v := math.Float32frombits(uint32(bits) << 16)
			if dt == tensor.F16 {
				v = float16.Frombits(bits).Float32()
			}
			binary.LittleEndian.PutUint32(raw, math.Float32bits(v))
		} else {
			be.Cast(dst, src)
		}
		hi = lo
	}
}

// UpdatedInBackward is the share of the parameters' bytes updated during
// the backward (ReadyAndUpdate), over the steps so far (0 before one).
func (o *Offloaded) UpdatedInBackward() float64 {
	if o.steppedBytes == 0 {
		return 0
	}
	return float64(o.updatedBytes) / float64(o.steppedBytes)
}

// OffloadedDeviceBytes is the least device memory parameters of
// paramBytes take under an offloaded optimizer whose gradients leave the
// device during the backward (Ready, and Part in micro-batches): the
// parameters and the sixteenth of their gradients (of the parameters'
// dtypes) in flight.
func OffloadedDeviceBytes(paramBytes int64) int64 { return paramBytes + paramBytes/16 }

// Ready is the backward's hook (autograd.OnGradReady): leaf's gradient is
// finished, so Ready sums its squares on the device (for the step's
// clipping), starts its copy into host memory and, once the copy is done,
// releases it on the device (Note [the offloaded step]): after such a
// backward the parameters' gradients are in host memory only (Grad is
// nil), and the step, SumGradSquares and ZeroGrad know which had one.
// Leaves that are not the optimiser's parameters are ignored, and so are
// those kept on the device (OffloadSome), whose gradients stay there for
// the step. Give it only to the backward that finishes the gradients (a
// step's last micro-batch).
func (o *Offloaded) Ready(leaf *tensor.Tensor) {
	i, ok := o.slot[leaf]
	if !ok || leaf.Grad() == nil || o.kept(i) { // a kept one's stays, its squares summed with the step's
		return
	}
	if o.gone[i] {
		panic(fmt.Sprintf("optim: the gradient of parameter %d (shape %v) was finished twice in one backward, after its first part had left the device: a parameter read in several checkpointed blocks cannot stream its gradient to host memory as the backward finishes it",
			i, leaf.Shape()))
	}
	summing := o.parts[i] > 0 // the last part of a sum (Note [parts summed on the host])
	switch {
	case summing && o.early[i]:
		panic(fmt.Sprintf("optim: the gradient of parameter %d (shape %v) was finished twice in a micro-batched step's last backward: its sum cannot take the second part", i, leaf.Shape()))
	case summing:
		o.land(i)
	default:
		o.sumSquares(i)
	}
	o.early[i] = true
	o.startDown(i) // again for a gradient finished twice while on the device: the later copy lands last
	if summing {
		o.enqueue(job{i: i, down: o.down[i], sum: true, last: true})
		o.parts[i]++
	}
	o.queue = append(o.queue, i)
	o.inFlight += leaf.Bytes()
	o.drain(o.flightMost)
}

// drain waits for the oldest gradients in flight (queue) while there is
// more than one and they pass most bytes, or for all of them when most is
// negative, and releases each on the device once it is down: for good
// (gone) when Ready started it, until the next micro-batch's part when
// Part did.
func (o *Offloaded) drain(most int64) {
	for len(o.queue) > 0 && (most < 0 || len(o.queue) > 1 && o.inFlight > most) {
		j := o.queue[0]
		o.queue = o.queue[1:]
		o.down[j].Wait()
		o.inFlight -= o.params[j].Bytes()
		if !o.gone[j] { // j may be queued twice
			o.params[j].SetGrad(nil)
			o.gone[j] = o.early[j]
		}
	}
}

// sumSquares queues the sum of the squares of gradient i into squares[i].
func (o *Offloaded) sumSquares(i int) {
	p := o.params[i]
	o.beginSquares()
	row := o.squares.Rows(i, i+1)
	defer row.Release()
	g := p.Grad()
	if g.DType() != tensor.F32 { // a 16-bit working weight's: summed widened
		wide := tensor.Empty(p.Device(), tensor.F32, g.Shape()...)
		defer wide.Release()
		p.Backend().Cast(wide.Buf(), g.Buf())
		g = wide
	}
	p.Backend().SumSquares([]kernels.Buf{g.Buf()}, row.Buf())
}

// beginSquares makes squares, and clears it at the step's first use: a
// parameter without a gradient adds 0.
func (o *Offloaded) beginSquares() {
	if o.squares == nil { // the device's rows, then the host's (Note [parts summed on the host])
		o.squares = tensor.Zeros(o.params[0].Device(), tensor.F32, 2*len(o.params), 1).Keep()
	}
	if !o.begun {
		o.squares.Backend().Fill(o.squares.Buf(), 0)
		o.begun = true
	}
}

// SumGradSquares writes the sum of the squares of the step's gradients,
// those Ready released on the device and those summed from parts on the
// host among them, into sumsq (F32, 1 element, on the device)
// (SquareSummer).
func (o *Offloaded) SumGradSquares(sumsq kernels.Buf) {
	o.checkLate()
	summed := o.sumsDone()
	for i, p := range o.params {
		if p.Grad() != nil && !o.early[i] { // not summed by Ready
			o.sumSquares(i)
		}
	}
	if len(o.params) == 0 {
		return
	}
	o.beginSquares()
	if summed { // the host's squares of the sums into the rows past the device's
		host := make([]float32, len(o.params))
		for i, ok := range o.summed {
			if ok {
				host[i] = float32(o.sq[i])
			}
		}
		rows := o.squares.Rows(len(o.params), 2*len(o.params))
		defer rows.Release()
		rows.Backend().Write(rows.Buf(), unsafe.Slice((*byte)(unsafe.Pointer(&host[0])), 4*len(host)))
	}
	be := o.squares.Backend()
	be.Reduce(kernels.Sum, sumsq, o.squares.Buf(), kernels.Reduction{Outer: 1, Len: 2 * len(o.params), Inner: 1})
}

// sumsDone waits for the parts' sums the goroutine beside the backward
// makes, finishes those whose last part did not come, and reports whether
// the step summed any gradient from parts.
func (o *Offloaded) sumsDone() bool {
	o.stopWork()
	any := false
	for i, n := range o.parts {
		if n == 0 {
			continue
		}
		any = true
		if o.summed[i] {
			continue
		}
		if o.params[i].Grad() != nil {
			panic(fmt.Sprintf("optim: parameter %d (shape %v) has parts of its gradient summed on the host and its last on the device: give a micro-batched step's last backward Ready", i, o.params[i].Shape()))
		}
		o.finishSum(i)
	}
	return any
}

// startDown starts gradient i's copy into its host copy (at once, through
// the staging buffers, without page-locked memory).
func (o *Offloaded) startDown(i int) {
	p := o.params[i]
	g := p.Grad()
	if g.DType() != p.DType() || !g.SameShape(p) {
		panic(fmt.Sprintf("optim: parameter %d's gradient is %v %v; want %v %v", i, g.DType(), g.Shape(), p.DType(), p.Shape()))
	}
	dst := o.host[i].Grad().HostBytes()[:g.Bytes()] // a 16-bit one into the first half (Note [working weights in 16 bits])
	if o.pc != nil {
		o.down[i] = o.pc.StartRead(dst, g.Buf())
		return
	}
	p.Backend().Read(dst, g.Buf())
	o.down[i] = done{}
}

// done is a copy already done.
type done struct{}

func (done) Wait() {}
func (done) Join() {}

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
		o.parts[i], o.summed[i], o.landing[i] = 0, false, nil
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
	o.sumsDone()
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
	for i, p := range o.params { // those kept on the device are updated there, first
		switch {
		case !o.kept(i):
		case o.updated[i]: // in the backward
			o.steppedBytes += p.Bytes()
			o.updatedBytes += p.Bytes()
		case p.Grad() != nil:
			o.steppedBytes += p.Bytes()
			o.step(i, mult, mv)
		}
	}
	if o.pc != nil { // the rest come down at once, behind those Ready started
		for i, p := range o.params {
			if o.down[i] == nil && p.Grad() != nil && !o.kept(i) {
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
			if o.kept(i) {
				continue
			}
			if o.parts[i] > 0 { // summed from parts on the host, counted as they came down
				o.steppedBytes += p.Bytes()
				if o.updated[i] {
					o.updatedBytes += p.Bytes()
				} else {
					ready <- i
				}
				continue
			}
			if o.down[i] == nil && p.Grad() != nil {
				o.startDown(i)
			}
			if o.down[i] != nil { // it has a gradient this step
				o.down[i].Wait()
				n := o.params[i].Bytes()
				o.total += n
				o.steppedBytes += n
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
	s := o.innerState(func(int) bool { return true })
	for i, p := range o.params {
		if p.DType().Half() { // the device's copy is rounded (Note [working weights in 16 bits])
			s[MasterKind+"."+strconv.Itoa(i)] = o.host[i]
		}
	}
	return s
}

// MasterKind names the F32 master copies of 16-bit parameters in State
// ("master.<index>").
const MasterKind = "master"

// kept says whether parameter i's state stays on the device (OffloadSome).
func (o *Offloaded) kept(i int) bool { return o.host[i] == nil }

// DeviceState is the state of the parameters kept on the device
// (OffloadSome), named as State names it.
func (o *Offloaded) DeviceState() map[string]*tensor.Tensor {
	return o.innerState(o.kept)
}

// innerState is the state of the optimisers of the parameters i where
// which(i), named as State names it.
func (o *Offloaded) innerState(which func(int) bool) map[string]*tensor.Tensor {
	s := map[string]*tensor.Tensor{}
	for i, in := range o.inner {
		if !which(i) {
			continue
		}
		for k, t := range in.State() {
			s[strings.TrimSuffix(k, ".0")+"."+strconv.Itoa(i)] = t
		}
	}
	return s
}

// Master is the F32 master copy in host memory of p, one of the
// parameters (nil for another tensor or one kept on the device): what p's
// values are, unrounded, for a 16-bit p (Note [working weights in 16
// bits]). Its values change in the steps; writing them sets the master,
// and the device's copy at the next update.
func (o *Offloaded) Master(p *tensor.Tensor) *tensor.Tensor {
	if i, ok := o.slot[p]; ok {
		return o.host[i]
	}
	return nil
}

// Pinned reports whether the host copies are in the device's page-locked
// memory (copied directly; see Note [the offloaded step]).
func (o *Offloaded) Pinned() bool { return o.pc != nil }

// HostBytes is the host memory the optimiser holds: the parameters' and
// gradients' copies, the state (but that kept on the device), and the
// gradients' sums once a step ran in micro-batches.
func (o *Offloaded) HostBytes() int64 {
	var n int64
	o.eachHeld(func(t *tensor.Tensor) { n += t.Bytes() })
	return n
}

// PinnedBytes is the part of HostBytes in the device's page-locked memory,
// which the copies read and write directly (0 with staged copies); the
// rest is pageable (Note [working weights in 16 bits]).
func (o *Offloaded) PinnedBytes() int64 {
	var n int64
	if o.pc != nil {
		o.eachHeld(func(t *tensor.Tensor) {
			if t.Device() == o.at {
				n += t.Bytes()
			}
		})
	}
	return n
}

// eachHeld calls f with each tensor the optimiser holds in host memory.
func (o *Offloaded) eachHeld(f func(*tensor.Tensor)) {
	for i, h := range o.host {
		if h == nil { // kept on the device
			continue
		}
		f(h)
		f(h.Grad())
		if o.sums[i] != nil {
			f(o.sums[i])
		}
	}
	for _, t := range o.innerState(func(i int) bool { return !o.kept(i) }) {
		f(t)
	}
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
		if o.kept(i) { // its value is the device's
			continue
		}
		if !p.DType().Half() {
			p.Backend().Read(o.host[i].HostBytes(), p.Buf())
			continue
		}
		name := MasterKind + "." + strconv.Itoa(i)
		m, ok := ts[name]
		if !ok { // from an on-device optimiser's checkpoint: the rounded values
			h := hostMaster(o.host[i].Device(), p)
			copy(o.host[i].HostBytes(), h.HostBytes())
			h.Release()
			continue
		}
		if err := CheckState(name, m, tensor.F32, p.Shape()); err != nil {
			return err
		}
		copy(o.host[i].HostBytes(), m.Raw())
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
		if h != nil {
			h.Release() // its gradient with it
		}
	}
	for _, t := range o.sums {
		if t != nil {
			t.Release()
		}
	}
	clear(o.sums)
	for _, t := range []*tensor.Tensor{o.mult, o.squares} {
		if t != nil {
			t.Release()
		}
	}
	o.inner, o.host, o.mult, o.squares = nil, nil, nil, nil
}
