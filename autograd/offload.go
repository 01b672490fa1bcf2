package autograd

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// An Offloader moves what checkpointed functions keep on a device for
// their recomputation (their inputs, and the results their ops keep:
// Note [what a checkpoint keeps]) to host memory during a forward, and
// brings it back ahead of each recomputation in the backward (Note
// [checkpoints offloaded]). One Offloader serves one device handle's
// forwards, one at a time; its copies can be captured into a graph with
// the step (Note [offloaded copies captured]).
type Offloader struct {
	dev, host *tensor.Device
	pc        kernels.PinnedCopier // dev's backend when host is its page-locked memory (nil: staged copies)
	pending   []*offloaded         // this forward's checkpoints whose copies down are under way
	pass      *[]*offloaded        // this forward's checkpoints, in order
	bytes     int64                // in host memory after this forward
	most      int64                // the most after a forward
	// bufs are the host copies' memory, each tensor a forward keeps at
	// its place in the forward with its dtype and shape: every forward of
	// that shape copies into the same memory, until Release.
	bufs map[bufKey]*T
	// stayed are the copies down of the tensors that stayed on the device
	// (offloadedTensor.stays, stayLast), which End joins.
	stayed []kernels.Transfer
}

// bufKey is where a forward keeps a tensor: its checkpoint's place in the
// forward, the tensor's among the checkpoint's, its dtype and shape.
type bufKey struct {
	checkpoint, tensor int
	dtype              tensor.DType
	shape              string
}

// NewOffloader returns an Offloader from dev to host: dev.Pinned() for
// direct copies on the copy engines, beside the kernels (a GPU's), or
// another CPU pool.
func NewOffloader(dev, host *tensor.Device) *Offloader {
	o := &Offloader{dev: dev, host: host, bufs: map[bufKey]*T{}}
	if pc, ok := dev.Backend().(kernels.PinnedCopier); ok && host.Allocator().Source() == pc.PinnedSource() {
		o.pc = pc
	}
	return o
}

// Forward runs f, a forward pass on the Offloader's device, with what its
// checkpointed functions keep moved to host memory: when it returns, the
// device holds none of it but what is held elsewhere too (the caller's
// input of the first) and the last stayLast checkpoints' sets.
func (o *Offloader) Forward(f func()) {
	m := o.dev.Modes()
	outer := m.Offload
	m.Offload = o
	o.pass, o.bytes = new([]*offloaded), 0
	done := false
	o.joinStayed()
	defer func() {
		m.Offload = outer
		if !done {
			o.abandon()
			return
		}
		o.settle(stayLast)
		o.stay()
		o.most = max(o.most, o.bytes)
	}()
	f()
	done = true
}

// End releases what the backward of the last forward brought back to the
// device and still holds (nothing after a backward that ran through, the
// sets queued up ahead of a backward that failed), and makes the device's
// stream wait for every copy the forward and the backward started. Call it
// once the backward has returned (or will not run).
func (o *Offloader) End() {
	o.joinStayed()
	if o.pc != nil {
		o.pc.JoinWrites() // the copies up of a checkpoint the backward did not recompute
	}
	if o.pass == nil {
		return
	}
	for _, c := range *o.pass {
		if c.up {
			c.drop()
		}
	}
}

// joinStayed joins the copies down of the tensors that stayed on the
// device.
func (o *Offloader) joinStayed() {
	for _, t := range o.stayed {
		t.Join()
	}
	o.stayed = nil
}

// Release gives back the host memory of the copies, once the device has
// done the work queued so far, which may still copy to and from it (a
// device that failed has none to do). The Offloader can be used again:
// its next forward takes new memory.
func (o *Offloader) Release() {
	o.joinStayed()
	if o.pc != nil && len(o.bufs) > 0 {
		_ = o.dev.Synchronize() // a device that failed has no work left to finish
	}
	for k, h := range o.bufs {
		h.Release()
		delete(o.bufs, k)
	}
}

// Bytes is the most that one forward left in host memory.
func (o *Offloader) Bytes() int64 { return o.most }

// HostBytes is the host memory the Offloader holds for its copies, as the
// host's pool counts it: a forward's copies of every shape it has run,
// those of the tensors that stayed on the device too (their copies start
// before it is known that they stay).
func (o *Offloader) HostBytes() int64 {
	var n int64
	for _, h := range o.bufs {
		n += h.Block().Size()
	}
	return n
}

// buffer returns the host memory for the tensor d, the k-th that the
// checkpoint at index i of a forward keeps, with a reference for the
// checkpoint's node.
func (o *Offloader) buffer(i, k int, d *T) *T {
	key := bufKey{i, k, d.DType(), fmt.Sprint(d.Shape())}
	h := o.bufs[key]
	if h == nil {
		h = tensor.Empty(o.host, d.DType(), d.Shape()...).Keep()
		o.bufs[key] = h
	}
	return h.Retain()
}

// offloaded is what one checkpoint keeps, in host memory.
type offloaded struct {
	o       *Offloader
	pass    *[]*offloaded // its forward's checkpoints, in order
	index   int           // in pass
	saved   []*T          // the checkpoint node's, which holds each host copy while there is one
	tensors []offloadedTensor
	up      bool // the copies up are queued (brought back, or on their way)
}

// offloadedTensor is one tensor a checkpoint keeps.
type offloadedTensor struct {
	ref  **T              // where the checkpoint reads it: set while it is on the device
	slot int              // its index in saved
	host *T               // its copy in host memory (nil: it stays on the device)
	dev  *T               // on the device: while it comes down, where it stays, or brought back
	down kernels.Transfer // its copy down, while under way
	// stays is decided when the next checkpoint begins (or the forward
	// ends), when the tensor's storage is held elsewhere too (the caller's
	// input): then it stays on the device, as releasing it would free
	// nothing, and its host copy is dropped.
	stays, decided bool
}

// offload starts the copies of the tensors *refs[i] (on o's device, each
// in saved, the checkpoint node's list) into host memory, where saved then
// holds them; it decides which of the checkpoint before's tensors stay on
// the device and settles those beyond inFlight.
func (o *Offloader) offload(refs []**T, saved []*T) *offloaded {
	if n := len(o.pending); n > 0 {
		o.pending[n-1].decide()
	}
	c := &offloaded{o: o, pass: o.pass, index: len(*o.pass), saved: saved}
	for k, r := range refs {
		d := *r
		h := o.buffer(c.index, k, d)
		ot := offloadedTensor{ref: r, slot: -1, host: h, dev: d}
		if o.pc != nil {
			ot.down = o.pc.StartRead(h.HostBytes(), d.Buf())
		} else {
			d.Backend().Read(h.HostBytes(), d.Buf())
		}
		for j := range saved {
			if saved[j] == d {
				saved[j], ot.slot = h, j
			}
		}
		*r = nil
		o.bytes += d.Bytes()
		c.tensors = append(c.tensors, ot)
	}
	*o.pass = append(*o.pass, c)
	o.pending = append(o.pending, c)
	o.settle(inFlight)
	return c
}

// stayLast is how many of a forward's last checkpoints keep their sets on
// the device: the backward recomputes them first, so that it begins
// without waiting for their copies down and up again, and the device
// holds no more sets in it than it would (the one recomputing and the
// next, which would be coming up).
const stayLast = 2

// stay keeps the sets of the checkpoints still pending at the forward's
// end on the device, as if their storage were held elsewhere too: their
// host copies are dropped, and their copies down joined at End.
func (o *Offloader) stay() {
	for _, c := range o.pending {
		c.decide()
		for i := range c.tensors {
			o.keep(c, &c.tensors[i])
		}
	}
	o.pending = nil
}

// keep leaves ot, one of c's tensors, on the device, where c reads it, and
// drops its host copy (the node's reference; the memory stays the
// Offloader's).
func (o *Offloader) keep(c *offloaded, ot *offloadedTensor) {
	*ot.ref, c.saved[ot.slot] = ot.dev, ot.dev
	ot.host.Release()
	if ot.down != nil {
		o.stayed = append(o.stayed, ot.down)
	}
	o.bytes -= ot.dev.Bytes()
	ot.host, ot.down = nil, nil
}

// inFlight is how many checkpoints' copies down may be under way while
// the forward goes on: the device holds their tensors until their copies
// are down, and the device's stream waits for the oldest beyond them,
// whose tensors are then released. A transformer block's copies take
// longer than its forward at PCIe's rate. Measured on GPT-2 small, batch
// 16, bf16, on an H100, with the host waiting for the copies (the eager
// step 37.5 ms without offloading, 3,048 MiB): 1 in flight 46.3 ms, 2,615
// MiB; 3 43.2 ms, 2,613 MiB; 6 41.8 ms, 2,660 MiB; all of them 41.7 ms,
// 3,048 MiB.
const inFlight = 6

// abandon ends a forward that failed: it joins the copies down under way
// and releases the device tensors the Offloader holds; the host copies
// stay with the checkpoints' nodes, which the failed step releases.
func (o *Offloader) abandon() {
	for _, c := range o.pending {
		for i := range c.tensors {
			ot := &c.tensors[i]
			if ot.down != nil {
				ot.down.Join()
				ot.down = nil
			}
			ot.dev.Release()
			ot.dev = nil
		}
	}
	o.pending = nil
}

// decide says, for each of the checkpoint's tensors, whether it stays on
// the device (offloadedTensor.stays), once.
func (c *offloaded) decide() {
	for i := range c.tensors {
		if ot := &c.tensors[i]; !ot.decided {
			ot.stays, ot.decided = ot.dev.SharesStorage(), true
		}
	}
}

// settle settles all but the last keep pending checkpoints: their
// device tensors are released once the device's stream has joined their
// copies down (its later work, which may reuse their memory, waits for
// them), but for those that stay on the device (offloadedTensor.stays),
// whose host copies it drops.
func (o *Offloader) settle(keep int) {
	for len(o.pending) > keep {
		c := o.pending[0]
		o.pending = o.pending[1:]
		c.decide()
		for i := range c.tensors {
			ot := &c.tensors[i]
			if ot.stays {
				o.keep(c, ot)
				continue
			}
			if ot.down != nil {
				ot.down.Join()
				ot.down = nil
			}
			ot.dev.Release()
			ot.dev = nil
		}
	}
}

// bringBack puts the checkpoint's tensors on the device again, where it
// reads them, and queues the copies up of the checkpoint before it in the
// forward, whose recomputation comes next in a sequential model's
// backward.
func (c *offloaded) bringBack() {
	c.queueUp()
	if c.o.pc != nil {
		c.o.pc.JoinWrites()
	}
	for _, ot := range c.tensors {
		*ot.ref = ot.dev
	}
	if i := c.index - 1; i >= 0 {
		(*c.pass)[i].queueUp()
	}
}

// queueUp makes the checkpoint's device tensors and queues their copies up
// (at once, through the staging buffers, without page-locked memory).
func (c *offloaded) queueUp() {
	if c.up {
		return
	}
	c.up = true
	for i := range c.tensors {
		ot := &c.tensors[i]
		if ot.host == nil {
			continue
		}
		ot.dev = tensor.Empty(c.o.dev, ot.host.DType(), ot.host.Shape()...).Keep()
		if c.o.pc != nil {
			c.o.pc.StartWrite(ot.dev.Buf(), ot.host.HostBytes())
		} else {
			ot.dev.Backend().Write(ot.dev.Buf(), ot.host.HostBytes())
		}
	}
}

// drop releases the device tensors brought back, after the checkpoint's
// backward; the host copies stay with its node.
func (c *offloaded) drop() {
	for i := range c.tensors {
		ot := &c.tensors[i]
		if ot.host == nil || ot.dev == nil {
			continue
		}
		*ot.ref = nil
		ot.dev.Release()
		ot.dev = nil
	}
	c.up = false
}

// Note [checkpoints offloaded]: a checkpointed function keeps on the
// device only its inputs and a few of its ops' results (Note [what a
// checkpoint keeps]), for its recomputation; in a transformer's backward
// they are what stays alive through the pass, one set a block. An
// Offloader's Forward moves each set to host memory as soon as the
// function has run: the copies down start at once (on a GPU, on a copy
// stream beside the kernels: Note [copies beside the stream] in kernels),
// and the device's tensors are released once the device's stream has
// joined their copies, up to inFlight checkpoints later, so that the
// forward seldom waits; one whose storage is held elsewhere too when the
// next checkpoint begins (the first block's input, the caller's) stays,
// and so do the sets of the forward's last stayLast checkpoints, which
// the backward reads first.
// In the backward, a checkpoint about to recompute waits for its set to be
// up again and queues the copies up of the checkpoint before it, whose
// recomputation a sequential model's backward runs next: the copies
// overlap a block's backward, and the device holds at most two sets. The
// copies are exact, so the gradients are those of the checkpoints kept on
// the device, bit for bit. The host copies are the checkpoint node's
// while it lives, in memory that the Offloader keeps for the next forward.
//
// Note [offloaded copies captured]: no host code waits for a copy. A copy
// down is joined into the device's stream (Transfer.Join) before its
// source is released, the copies up before the recomputation that reads
// them (JoinWrites), and End joins the rest; and each forward of a shape
// copies to and from the same host memory (Offloader.bufs). So a step
// with its checkpoints offloaded runs from a plan and is captured as any
// other: the graph holds the copies, on the copy streams, with the
// kernels they wait for and that wait for them, and each replay moves
// the sets through the host memory that the capture's forward took, which
// the Offloader keeps until Release. What the host decides (which tensor
// stays, when a set is released) depends on the forward's order alone,
// the same in the traced step, the plan and the capture.
