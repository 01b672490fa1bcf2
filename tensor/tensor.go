// Package tensor provides leangrad's Tensor: a shape and a dtype over
// reference-counted storage drawn from a device's caching allocator.
//
// Lifetimes are explicit. A tensor is created with one reference; Retain adds
// one, Release drops one, and the last Release returns the memory to the pool
// at once. Operations return new tensors (Reshape returns a view sharing
// storage). A Scope releases everything created on its device handle while
// it is open, except what was kept, so a training step needs no Release on
// every line:
//
//	dev.WithScope(func() {
//		loss, _, _ := model.Loss(x, y)
//		autograd.Backward(loss)
//		opt.Step()
//	}) // every intermediate is back in the pool here
//
// Scopes, like autograd's modes, belong to a device handle: a goroutine that
// works on its own (Device.Session) neither sees nor releases another's.
//
// A tensor dropped without Release is caught by a cleanup when the garbage
// collector finds it: its memory is returned and it is counted in Leaks. With
// debug mode on (SetDebug; in the commands, LEANGRAD_DEBUG=1), tensors record their creation
// site, and LiveTensors says who holds memory.
package tensor

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/memory"
)

// DType is an element type; see kernels.DType.
type DType = kernels.DType

// The element types.
const (
	F32  = kernels.F32
	F16  = kernels.F16
	BF16 = kernels.BF16
	I32  = kernels.I32
	U8   = kernels.U8
)

// ParseDType reads a dtype by its name: f32, f16, bf16, i32 or u8; see
// kernels.ParseDType.
func ParseDType(s string) (DType, error) { return kernels.ParseDType(s) }

// GradNode is what package autograd attaches to a tensor computed by a
// recorded operation. Release is called once, when the last reference to the
// tensor is dropped.
type GradNode interface {
	Release()
}

// Tensor is an n-dimensional, row-major, contiguous array on a device.
// Its methods panic when called after its last Release.
type Tensor struct {
	shape []int
	dtype DType
	dev   *Device
	off   int64 // bytes into the storage's block
	n     int
	h     *handle

	requiresGrad bool // a leaf that accumulates a gradient
	scope        *Scope
	scopeIdx     int
	cleanup      runtime.Cleanup
}

// handle is everything a tensor must give back when it dies. The cleanup that
// catches leaks holds the handle, never the Tensor, so the Tensor can become
// unreachable.
type handle struct {
	refs   atomic.Int32
	st     *storage
	node   GradNode
	grad   *Tensor
	gradMu sync.Mutex // LockGrad's
	info   *liveInfo  // debug mode only
}

type storage struct {
	block *memory.Block
	dev   *Device
	refs  atomic.Int32
}

func (s *storage) release() {
	if s.refs.Add(-1) == 0 {
		s.dev.Allocator().Free(s.block)
		s.block = nil
	}
}

// numel is shape's element count; it panics naming a shape with a
// negative dimension or more elements than an int holds.
func numel(shape []int) int {
	for _, d := range shape {
		if d < 0 {
			panic(fmt.Sprintf("tensor: negative dimension in shape %v", shape))
		}
	}
	n, ok := memory.Product(shape...)
	if !ok {
		panic(fmt.Sprintf("tensor: shape %v has more elements than an int holds", shape))
	}
	return n
}

// newTensor allocates a tensor of shape on dev, registered in the current scope.
func newTensor(dev *Device, dtype DType, shape []int) (*Tensor, error) {
	drainLeaked()
	if err := dev.interrupted(dtype, shape); err != nil {
		return nil, err
	}
	n := numel(shape)
	bytes, ok := memory.Product(n, dtype.Size())
	if !ok {
		return nil, fmt.Errorf("tensor: a %v tensor of shape %v is more bytes than a 64-bit count holds: %w", dtype, shape, memory.ErrOutOfMemory)
	}
	block, err := dev.Allocator().Alloc(int64(bytes), dev.Backend().Stream())
	if err != nil {
		return nil, err
	}
	st := &storage{block: block, dev: dev}
	st.refs.Store(1)
	return wrap(dev, dtype, append([]int(nil), shape...), st, 0), nil
}

// wrap makes a new handle on st (whose reference the caller gives it).
func wrap(dev *Device, dtype DType, shape []int, st *storage, off int64) *Tensor {
	t := wrapKept(dev, dtype, shape, st, off)
	register(t)
	return t
}

// wrapKept is wrap without the scope: a handle no scope releases.
func wrapKept(dev *Device, dtype DType, shape []int, st *storage, off int64) *Tensor {
	t := &Tensor{shape: shape, dtype: dtype, dev: dev, off: off, n: numel(shape), h: &handle{st: st}}
	t.h.refs.Store(1)
	track(t)
	t.cleanup = runtime.AddCleanup(t, collectLeak, t.h)
	return t
}

// Empty returns a tensor whose contents are unspecified. It panics with the
// allocator's *memory.OOMError when the device is out of memory; use TryEmpty
// to get the error instead.
func Empty(dev *Device, dtype DType, shape ...int) *Tensor {
	t, err := newTensor(dev, dtype, shape)
	if err != nil {
		panic(err)
	}
	return t
}

// TryEmpty is Empty returning the allocator's error instead of panicking.
func TryEmpty(dev *Device, dtype DType, shape ...int) (*Tensor, error) {
	return newTensor(dev, dtype, shape)
}

// Full returns a tensor with every element v.
func Full(dev *Device, dtype DType, v float32, shape ...int) *Tensor {
	t := Empty(dev, dtype, shape...)
	dev.Backend().Fill(t.Buf(), v)
	return t
}

// Zeros returns a tensor of zeros.
func Zeros(dev *Device, dtype DType, shape ...int) *Tensor { return Full(dev, dtype, 0, shape...) }

// Ones returns a tensor of ones.
func Ones(dev *Device, dtype DType, shape ...int) *Tensor { return Full(dev, dtype, 1, shape...) }

// FromFloat32 returns an F32 tensor holding a copy of data, which must have
// as many elements as shape.
func FromFloat32(dev *Device, data []float32, shape ...int) *Tensor {
	if n := numel(shape); n != len(data) {
		panic(fmt.Sprintf("tensor: %d values for shape %v (%d elements)", len(data), shape, n))
	}
	dev.mustExchange("FromFloat32")
	t := Empty(dev, F32, shape...)
	if len(data) > 0 {
		dev.Backend().Write(t.Buf(), unsafe.Slice((*byte)(unsafe.Pointer(&data[0])), 4*len(data)))
	}
	return t
}

// FromInt32 returns an I32 tensor holding a copy of data.
func FromInt32(dev *Device, data []int32, shape ...int) *Tensor {
	if n := numel(shape); n != len(data) {
		panic(fmt.Sprintf("tensor: %d values for shape %v (%d elements)", len(data), shape, n))
	}
	dev.mustExchange("FromInt32")
	t := Empty(dev, I32, shape...)
	if len(data) > 0 {
		dev.Backend().Write(t.Buf(), unsafe.Slice((*byte)(unsafe.Pointer(&data[0])), 4*len(data)))
	}
	return t
}

// FromBytes returns a tensor of dtype whose memory is a copy of raw
// (little-endian elements, as the device stores them).
func FromBytes(dev *Device, dtype DType, raw []byte, shape ...int) *Tensor {
	if n, ok := memory.Product(numel(shape), dtype.Size()); !ok || n != len(raw) {
		panic(fmt.Sprintf("tensor: %d bytes for %v shape %v (%d elements of %d bytes)", len(raw), dtype, shape, numel(shape), dtype.Size()))
	}
	dev.mustExchange("FromBytes")
	t := Empty(dev, dtype, shape...)
	if len(raw) > 0 {
		dev.Backend().Write(t.Buf(), raw)
	}
	return t
}

// Rand returns a tensor of numbers uniform in [lo, hi) from dev's generator.
func Rand(dev *Device, dtype DType, lo, hi float32, shape ...int) *Tensor {
	t := Empty(dev, dtype, shape...)
	dev.Backend().Uniform(t.Buf(), lo, hi, dev.Generator().Next(t.n))
	return t
}

// Randn returns a tensor of normal numbers from dev's generator.
func Randn(dev *Device, dtype DType, mean, std float32, shape ...int) *Tensor {
	t := Empty(dev, dtype, shape...)
	dev.Backend().Normal(t.Buf(), mean, std, dev.Generator().Next(t.n))
	return t
}

func (t *Tensor) live() {
	if t.h.refs.Load() <= 0 {
		panic("tensor: use of a released " + t.describe())
	}
}

// desc names the tensor in messages: "f32 [2 3] tensor on cpu".
func (t *Tensor) desc() string {
	return fmt.Sprintf("%v %v tensor on %s", t.dtype, t.shape, t.dev.Name())
}

func (t *Tensor) describe() string {
	d := t.desc()
	if t.h.info != nil && t.h.info.Site != "" {
		return d + " created at " + t.h.info.Site
	}
	return d + " (creation site unknown: call tensor.SetDebug(true), or run the command with LEANGRAD_DEBUG=1, to record it)"
}

// Shape returns a copy of the tensor's shape.
func (t *Tensor) Shape() []int { return append([]int(nil), t.shape...) }

// Dim returns the size of dimension i; negative i counts from the end.
func (t *Tensor) Dim(i int) int {
	if i < 0 {
		i += len(t.shape)
	}
	return t.shape[i]
}

// NDim is the number of dimensions.
func (t *Tensor) NDim() int { return len(t.shape) }

// Numel is the number of elements.
func (t *Tensor) Numel() int { return t.n }

// DType is the element type.
func (t *Tensor) DType() DType { return t.dtype }

// Device is the device holding the tensor.
func (t *Tensor) Device() *Device { return t.dev }

// Backend is the tensor's device's backend.
func (t *Tensor) Backend() kernels.Backend { return t.dev.Backend() }

// Bytes is the size of the tensor's elements in bytes.
func (t *Tensor) Bytes() int64 { return int64(t.n) * int64(t.dtype.Size()) }

// SharesStorage reports whether another handle (a view, an alias) holds
// t's storage too: releasing t alone would not free it.
func (t *Tensor) SharesStorage() bool {
	t.live()
	return t.h.st.refs.Load() > 1
}

// HostBytes is t's own memory, without a copy, where its device's memory
// is the host's (a CPU pool, page-locked or not): for copies to and from
// another device. It panics for a tensor in a GPU's memory.
func (t *Tensor) HostBytes() []byte {
	b := t.Buf()
	mem := b.Block.Bytes()
	if mem == nil {
		panic(fmt.Sprintf("tensor: a %v %v tensor on %s is not in host memory", t.dtype, t.shape, t.dev.Name()))
	}
	return mem[b.Off : b.Off+b.Bytes()]
}

// Block is the pool block holding the tensor's storage (shared by its views).
func (t *Tensor) Block() *memory.Block {
	t.live()
	return t.h.st.block
}

// Buf is the backend view of the tensor's elements.
func (t *Tensor) Buf() kernels.Buf {
	t.live()
	return kernels.Buf{Block: t.h.st.block, Off: t.off, N: t.n, DType: t.dtype}
}

// SameShape reports whether t and u have equal shapes.
func (t *Tensor) SameShape(u *Tensor) bool {
	if len(t.shape) != len(u.shape) {
		return false
	}
	for i := range t.shape {
		if t.shape[i] != u.shape[i] {
			return false
		}
	}
	return true
}

func (t *Tensor) String() string {
	return fmt.Sprintf("Tensor(%v %v %s)", t.dtype, t.shape, t.dev.Name())
}

// Released reports whether the tensor's last reference was released.
func (t *Tensor) Released() bool { return t.h.refs.Load() <= 0 }

// Exclusive reports whether t is the only reference to its storage: one
// handle with one reference, no other views. Autograd may then reuse it.
func (t *Tensor) Exclusive() bool { return t.h.refs.Load() == 1 && t.h.st.refs.Load() == 1 }

// Retain adds a reference and returns t.
func (t *Tensor) Retain() *Tensor {
	t.live()
	t.h.refs.Add(1)
	return t
}

// Release drops a reference. The last one returns the memory to the pool,
// the tensor's gradient with it, and tells autograd its node is unreferenced.
func (t *Tensor) Release() {
	r := t.h.refs.Add(-1)
	if r < 0 {
		t.h.refs.Store(0)
		panic("tensor: Release of an already released " + t.describe())
	}
	if r > 0 {
		return
	}
	t.cleanup.Stop()
	unregister(t)
	t.h.free()
}

// free gives back everything the handle holds.
func (h *handle) free() {
	untrack(h)
	if node := h.node; node != nil {
		h.node = nil
		node.Release()
	}
	if g := h.grad; g != nil {
		h.grad = nil
		g.Release()
	}
	h.st.release()
}

// View returns a new handle of the given shape on t's storage: a reshape
// (one dimension may be -1). It records nothing for autograd; use
// autograd.Reshape in differentiable code.
func (t *Tensor) View(shape ...int) *Tensor {
	t.live()
	shape = InferShape(t.n, shape)
	t.h.st.refs.Add(1)
	return wrap(t.dev, t.dtype, shape, t.h.st, t.off)
}

// Rows returns a new handle on rows [start, end) of t's first dimension,
// sharing its storage: a micro-batch of a batch. Like View, it records
// nothing for autograd. It panics when the range is not inside t.
func (t *Tensor) Rows(start, end int) *Tensor {
	t.live()
	if len(t.shape) == 0 || start < 0 || end > t.shape[0] || start >= end {
		panic(fmt.Sprintf("tensor: Rows(%d, %d) of a tensor of shape %v", start, end, t.shape))
	}
	row := int64(t.n / t.shape[0])
	shape := append([]int{end - start}, t.shape[1:]...)
	t.h.st.refs.Add(1)
	return wrap(t.dev, t.dtype, shape, t.h.st, t.off+int64(start)*row*int64(t.dtype.Size()))
}

// On returns a new handle on t's storage made on the handle d of the same
// device (a Session of it, or the device itself): it lives in d's scopes
// and follows d's modes. Like View, it records nothing for autograd.
func (t *Tensor) On(d *Device) *Tensor {
	t.live()
	if !t.dev.Same(d) {
		panic(fmt.Sprintf("tensor: On(%s) of a tensor on %s", d.Name(), t.dev.Name()))
	}
	t.h.st.refs.Add(1)
	return wrap(d, t.dtype, append([]int(nil), t.shape...), t.h.st, t.off)
}

// InferShape resolves a -1 in shape so that it holds n elements, or panics
// naming both sizes.
func InferShape(n int, shape []int) []int {
	shape = append([]int(nil), shape...)
	known, free := 1, -1
	for i, d := range shape {
		if d == -1 {
			if free >= 0 {
				panic(fmt.Sprintf("tensor: shape %v has more than one -1", shape))
			}
			free = i
			continue
		}
		if d < 0 {
			panic(fmt.Sprintf("tensor: negative dimension in shape %v", shape))
		}
		known *= d
	}
	if free >= 0 {
		if known == 0 || n%known != 0 {
			panic(fmt.Sprintf("tensor: cannot reshape %d elements to %v", n, shape))
		}
		shape[free] = n / known
	} else if known != n {
		panic(fmt.Sprintf("tensor: cannot reshape %d elements to %v", n, shape))
	}
	return shape
}

// Clone returns a copy of t in new storage.
func (t *Tensor) Clone() *Tensor {
	t.live()
	c := Empty(t.dev, t.dtype, t.shape...)
	t.Backend().Copy(c.Buf(), t.Buf())
	return c
}

// To returns a copy of t on dev (a new handle on t's storage if dev is t's device).
func (t *Tensor) To(dev *Device) *Tensor {
	t.live()
	if dev == t.dev {
		return t.View(t.shape...)
	}
	raw := t.Raw()
	return FromBytes(dev, t.dtype, raw, t.shape...)
}

// Raw returns a copy of t's memory, as little-endian elements of its dtype.
// It waits for queued work on the device.
func (t *Tensor) Raw() []byte {
	t.live()
	t.dev.mustExchange("Raw")
	raw := make([]byte, t.Bytes())
	t.Backend().Read(raw, t.Buf())
	return raw
}

// Float32s returns a copy of t's elements as float32 (F16, BF16, I32 and
// U8 converted).
func (t *Tensor) Float32s() []float32 {
	t.live()
	t.dev.mustExchange("Float32s")
	switch t.dtype {
	case F32:
		out := make([]float32, t.n)
		if t.n > 0 {
			t.Backend().Read(unsafe.Slice((*byte)(unsafe.Pointer(&out[0])), 4*t.n), t.Buf())
		}
		return out
	case U8:
		out := make([]float32, t.n)
		for i, b := range t.Raw() {
			out[i] = float32(b)
		}
		return out
	}
	tmp := Empty(t.dev, F32, t.shape...)
	defer tmp.Release()
	t.Backend().Cast(tmp.Buf(), t.Buf())
	return tmp.Float32s()
}

// Int32s returns a copy of an I32 tensor's elements.
func (t *Tensor) Int32s() []int32 {
	t.live()
	t.dev.mustExchange("Int32s")
	if t.dtype != I32 {
		panic(fmt.Sprintf("tensor: Int32s of a %v tensor", t.dtype))
	}
	out := make([]int32, t.n)
	if t.n > 0 {
		t.Backend().Read(unsafe.Slice((*byte)(unsafe.Pointer(&out[0])), 4*t.n), t.Buf())
	}
	return out
}

// Item returns the value of a one-element tensor.
func (t *Tensor) Item() float32 {
	if t.n != 1 {
		panic(fmt.Sprintf("tensor: Item of a tensor of shape %v", t.shape))
	}
	return t.Float32s()[0]
}

// RequiresGrad reports whether gradients flow to t: it is a leaf marked with
// SetRequiresGrad, or the result of a recorded operation.
func (t *Tensor) RequiresGrad() bool { return t.requiresGrad || t.h.node != nil }

// IsLeaf reports whether t was not produced by a recorded operation.
func (t *Tensor) IsLeaf() bool { return t.h.node == nil }

// SetRequiresGrad marks a leaf tensor (a parameter) as accumulating a
// gradient during autograd.Backward, and returns t.
func (t *Tensor) SetRequiresGrad(on bool) *Tensor {
	if t.h.node != nil {
		panic("tensor: SetRequiresGrad on a non-leaf " + t.describe())
	}
	t.requiresGrad = on
	return t
}

// Grad is the gradient accumulated into a leaf, or nil. It belongs to t.
func (t *Tensor) Grad() *Tensor { return t.h.grad }

// SetGrad replaces t's gradient, taking over the caller's reference to g
// (and taking g out of any scope); the old gradient is released.
func (t *Tensor) SetGrad(g *Tensor) {
	t.live()
	if g != nil {
		if !g.SameShape(t) {
			panic(fmt.Sprintf("tensor: gradient of shape %v for a tensor of shape %v", g.shape, t.shape))
		}
		g.Keep()
	}
	old := t.h.grad
	t.h.grad = g
	if old != nil {
		old.Release()
	}
}

// LockGrad locks t's gradient for one accumulation into it and returns
// the unlock: the backward passes of two sessions into one parameter add
// their gradients one after the other (on the device's one stream, in the
// order they took the lock), and neither is lost.
func (t *Tensor) LockGrad() (unlock func()) {
	t.h.gradMu.Lock()
	return t.h.gradMu.Unlock
}

// ZeroGrad releases t's gradient, returning its memory to the pool.
func (t *Tensor) ZeroGrad() { t.SetGrad(nil) }

// GradNode is the autograd node that produced t, or nil for a leaf.
func (t *Tensor) GradNode() GradNode { return t.h.node }

// SetGradNode attaches the autograd node that produced t; t's last Release
// will call n.Release. For package autograd.
func (t *Tensor) SetGradNode(n GradNode) {
	t.live()
	if t.h.node != nil {
		panic("tensor: SetGradNode on a tensor that already has a node")
	}
	t.h.node = n
}

// Alias returns a new handle on t's storage with t's shape and no autograd
// node: what autograd saves for a backward so that the saved value does not
// keep t's own handle (and its node) alive.
func (t *Tensor) Alias() *Tensor {
	t.live()
	t.h.st.refs.Add(1)
	// Never in a scope, not even for a moment: t's handle may be another
	// goroutine's, whose scope could close in between.
	return wrapKept(t.dev, t.dtype, append([]int(nil), t.shape...), t.h.st, t.off)
}
