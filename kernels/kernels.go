// Package kernels is the seam between tensors and the hardware: one Backend
// interface through which every operation of leangrad runs, made of one
// interface per family of operations (Families), with a CPU implementation
// (package kernels/cpu, Go with AVX assembly for its matrix products and
// hot passes) and a CUDA one (package kernels/cuda, NVRTC-compiled kernels,
// cuBLAS and cuDNN), both held to the conformance suite of package
// kernels/kerneltest.
//
// A Backend works on Bufs: typed, contiguous, row-major views of memory
// blocks from the backend's caching allocator. Shapes travel as plain
// integers in parameter structs (GemmParams, ConvParams, ...), so the model
// code above never knows which backend runs. Backends may run asynchronously
// (the CUDA one queues work on its stream); Read and Synchronize wait.
//
// Argument errors in the parameter structs are programmer errors: backends
// panic with a message naming the operation and the sizes involved.
package kernels

import (
	"fmt"
	"reflect"

	"github.com/leangrad/leangrad/memory"
)

// DType is an element type.
type DType uint8

// The element types. F16 is IEEE 754 binary16 and BF16 bfloat16 (a
// float32's top 16 bits), both stored as 16 bits and computed in float32,
// rounded to nearest even when stored; I32 holds labels and indices; U8
// holds bytes (the codes of 8-bit optimizer states).
const (
	F32 DType = iota + 1
	F16
	I32
	BF16
	U8
)

// Size is the size of one element in bytes.
func (d DType) Size() int {
	switch d {
	case F32, I32:
		return 4
	case F16, BF16:
		return 2
	case U8:
		return 1
	}
	panic(fmt.Sprintf("kernels: unknown dtype %d", d))
}

// Half reports whether d is a 16-bit float type (F16, BF16).
func (d DType) Half() bool { return d == F16 || d == BF16 }

func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case F16:
		return "f16"
	case I32:
		return "i32"
	case BF16:
		return "bf16"
	case U8:
		return "u8"
	}
	return fmt.Sprintf("dtype(%d)", d)
}

// ParseDType reads a dtype by its String: "f32", "f16", "bf16", "i32" or
// "u8".
func ParseDType(s string) (DType, error) {
	for _, d := range []DType{F32, F16, BF16, I32, U8} {
		if s == d.String() {
			return d, nil
		}
	}
	return 0, fmt.Errorf("dtype %q: want f32, f16, bf16, i32 or u8", s)
}

// MarshalText is the dtype's String.
func (d DType) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText reads a dtype as ParseDType does.
func (d *DType) UnmarshalText(text []byte) error {
	v, err := ParseDType(string(text))
	if err == nil {
		*d = v
	}
	return err
}

// Buf is a typed view of N contiguous elements starting Off bytes into a block.
type Buf struct {
	Block *memory.Block
	Off   int64
	N     int
	DType DType
}

// Bytes is the view's length in bytes.
func (b Buf) Bytes() int64 { return int64(b.N) * int64(b.DType.Size()) }

// As is b's bytes read as dt, a type of the same size (an I32 buffer's
// words as F32, say), or a panic naming both.
func (b Buf) As(dt DType) Buf {
	if dt.Size() != b.DType.Size() {
		panic(fmt.Sprintf("kernels: a %v buffer read as %v: their sizes differ", b.DType, dt))
	}
	b.DType = dt
	return b
}

// Valid reports whether b refers to memory.
func (b Buf) Valid() bool { return b.Block != nil }

// OpTime is the time one kind of operation took over a profile: device time
// for an asynchronous backend (CUDA's events), host time for a synchronous
// one (the CPU's).
type OpTime struct {
	Op    string  // the kernel's name, the library call or the operation
	Count int     // operations of this kind
	MS    float64 // milliseconds in all
}

// Profiler is a backend that attributes time to its operations (CUDA's,
// by events on its stream): StartProfile begins, StopProfile returns each
// kind of operation's time since, the most first.
type Profiler interface {
	StartProfile()
	StopProfile() ([]OpTime, error)
}

// IdleOp is the OpTime of an asynchronous backend's stream while it waited
// for the host: from the end of each read into host memory (or
// synchronization) to the next operation queued.
const IdleOp = "idle (the stream waits for the host)"

// Backend runs operations on one device. Output Bufs are written, never read,
// unless documented otherwise; dtypes are F32, F16 or BF16 for data (mixed
// freely where documented, computed in float32) and I32 for labels.
//
// The operations come in families, one interface each (CopyOps,
// ElementwiseOps, ...), and every family X has the same files in every
// layer: kernels/X.go (the interface, its parameters and checks, and
// Observed's wrappers), kernels/cpu/X.go, kernels/cuda/X.go,
// kernels/cuda/src/X.cu and kernels/kerneltest/X.go (its conformance
// cases). Families lists them; a test fails when a family's file is
// missing or one of its methods has no conformance case
// (docs/adding-an-op.md).
type Backend interface {
	// Name is the device name: "cpu", "cuda:0".
	Name() string
	// Info describes the device and the libraries the backend runs on.
	Info() Info
	// Allocator is the device's caching allocator, from which Bufs come.
	Allocator() *memory.Allocator
	// Stream is the stream this backend's work runs on and its blocks are tied to.
	Stream() memory.Stream
	// Synchronize waits for all queued work and returns any error it raised.
	Synchronize() error

	CopyOps
	ElementwiseOps
	ReduceOps
	GemmOps
	ConvOps
	NormOps
	PoolOps
	LossOps
	RandomOps
	OptimOps
	TransformerOps
}

// Family is one family of a Backend's operations: the name its files have
// in every layer (kernels/Name.go, kernels/cpu/Name.go, ...) and its
// interface.
type Family struct {
	Name string
	Ops  reflect.Type
}

// Families lists the Backend's families in the order Backend embeds them.
var Families = []Family{
	{"copy", reflect.TypeFor[CopyOps]()},
	{"elementwise", reflect.TypeFor[ElementwiseOps]()},
	{"reduce", reflect.TypeFor[ReduceOps]()},
	{"gemm", reflect.TypeFor[GemmOps]()},
	{"conv", reflect.TypeFor[ConvOps]()},
	{"norm", reflect.TypeFor[NormOps]()},
	{"pool", reflect.TypeFor[PoolOps]()},
	{"loss", reflect.TypeFor[LossOps]()},
	{"random", reflect.TypeFor[RandomOps]()},
	{"optim", reflect.TypeFor[OptimOps]()},
	{"transformer", reflect.TypeFor[TransformerOps]()},
}

// Stoppable is a backend whose long operations can stop part way, for the
// CPU's, where one product of a large model takes seconds: each is the
// operation of the same name without "Stoppable" that stops soon after
// stop is closed and reports whether it ran whole; when it did not, its
// outputs are partly written. GemmStoppable is GemmEpilogue, or Gemm for
// a zero Epilogue. autograd calls them inside tensor.Device.Interruptible.
type Stoppable interface {
	GemmStoppable(p GemmParams, e Epilogue, a, b, c Buf, stop <-chan struct{}) bool
	ClassifierLossStoppable(p ClassifierParams, h, w, labels, loss, right, dh, dw Buf, stop <-chan struct{}) bool
	AttentionStoppable(p AttentionParams, q, k, v, o, lse Buf, stop <-chan struct{}) bool
	AttentionBackwardStoppable(p AttentionParams, q, k, v, o, lse, do, dq, dk, dv Buf, stop <-chan struct{}) bool
}

// Capturer is implemented by backends that can record the operations queued
// between BeginCapture and EndCapture as a Graph instead of running them,
// and replay the Graph (the CUDA backend, with CUDA graphs). Recorded
// operations keep the buffers they were given: replays read and write the
// same memory, so its contents (inputs, device scalars) are what changes
// from one replay to the next. Nothing may be read back while capturing.
type Capturer interface {
	BeginCapture() error
	// EndCapture ends the recording, even when it fails.
	EndCapture() (Graph, error)
}

// Graph is a recorded sequence of operations.
type Graph interface {
	// Launch queues one replay.
	Launch() error
	// Nodes is the number of operations recorded.
	Nodes() int
	// Release frees the graph.
	Release()
}

// Collective runs collective operations over the ranks of a process group
// (one process per device), queued on one backend's stream in order with
// its other work, so that a backend that captures graphs captures them with
// the step. Every rank must make the same calls, with buffers of the same
// lengths and dtypes, in the same order.
type Collective interface {
	// AllReduce replaces each buffer, on every rank, by the sum of that
	// buffer over the ranks, or by their mean when mean is set. The
	// buffers are reduced as one group.
	AllReduce(bufs []Buf, mean bool) error
	// StartAllReduce is AllReduce overlapped with the work the backend
	// queues after it, where the backend can run both at once (CUDA: on a
	// stream of the collective's own, after the work queued so far). bufs
	// must not be read or written until Join. A backend that runs one
	// thing at a time (the CPU) does the AllReduce before it returns.
	StartAllReduce(bufs []Buf, mean bool) error
	// Join makes the work the backend queues from now on wait for every
	// collective started so far. A captured graph must Join what it
	// started before its capture ends.
	Join() error
	// StartReduceScatter is the first half of an all-reduce, overlapped as
	// StartAllReduce: each buffer's length must be a multiple of the
	// group's size, and the rank-th of its size equal parts is replaced by
	// that part's sum over the ranks (their mean, with mean set); the other
	// parts are left unspecified.
	StartReduceScatter(bufs []Buf, mean bool) error
	// AllGather is the second half: each rank's part of each buffer (the
	// rank-th of the buffer's size equal parts) is copied into the same
	// part of every other rank's.
	AllGather(bufs []Buf) error
	// Broadcast copies root's buffers into every other rank's.
	Broadcast(bufs []Buf, root int) error
	// Abort ends the group's work at once, also work queued or blocked on
	// a rank that died; the Collective is unusable afterwards. It may be
	// called from any goroutine.
	Abort()
	// Close waits for queued work and frees the group's resources.
	Close() error
}

// CollectiveBackend is a backend with its own collective library (NCCL on
// CUDA). Rank 0 makes the group's id; the others receive it out of band
// (package dist's rendezvous) and all call NewCollective with it.
type CollectiveBackend interface {
	CollectiveID() ([]byte, error)
	NewCollective(id []byte, rank, size int) (Collective, error)
}

// Options configure a backend when its device is opened. A backend ignores
// what it has nothing to apply to: the CPU backend, all of them.
type Options struct {
	// MatmulF32 is how F32 matrix products run on a GPU: by default as
	// three TF32 products at F32's accuracy (F32TF32x3); F32Strict as
	// under PyTorch's default matmul precision.
	MatmulF32 F32Matmul
	// StrictConvF32 keeps F32 convolutions in F32: cuDNN may use only FMA
	// kernels. Off by default: as under PyTorch's default
	// torch.backends.cudnn.allow_tf32 = True, cuDNN may run F32
	// convolutions on TF32 tensor cores, several times faster.
	StrictConvF32 bool
	// ConvWorkspace caps the im2col workspace of one convolution, in bytes
	// (default 64 MiB); larger batches are processed in chunks.
	ConvWorkspace int64
	// NoCuDNN makes convolutions use im2col + cuBLAS even when cuDNN is
	// installed.
	NoCuDNN bool
	// LeanConvWorkspace makes eager convolutions take the fastest cuDNN
	// algorithm whose workspace is at most the size of the convolution's
	// larger tensor (counted in F32 bytes) instead of the fastest whatever
	// its workspace. The workspaces of the fast algorithms set an eager
	// step's peak; the lean ones are slower (measured by the benchmark
	// harness). A planned step chooses with its plan instead: the fastest
	// algorithm whose workspace fits the arena's gap (memory.PlanTrace).
	LeanConvWorkspace bool
	// KernelCache is the folder where a backend that compiles its kernels
	// at run time (CUDA, through NVRTC) keeps them, keyed by source, arch
	// and compiler version; empty means the user cache dir's
	// leangrad/cubin. The commands set it from $LEANGRAD_CACHE.
	KernelCache string
}

// The kinds of device a backend drives (Info.Kind).
const (
	KindCPU  = "cpu"  // the host's cores over host memory
	KindCUDA = "cuda" // an NVIDIA GPU
)

// Info describes a backend's device, for reports and for code that needs
// the device's number or capability without parsing its name.
type Info struct {
	Kind         string            `json:"kind"`          // KindCPU or KindCUDA
	Index        int               `json:"index"`         // the device's number (0 for the CPU)
	Name         string            `json:"name"`          // "cpu", "cuda:0"
	Model        string            `json:"model"`         // "NVIDIA H200"; for the CPU, its cores
	Capability   string            `json:"capability"`    // "sm_90"; for the CPU, the SIMD its kernels use ("avx512")
	Memory       int64             `json:"memory"`        // total bytes, as the driver (or the OS) reports them
	Convolutions string            `json:"convolutions"`  // what runs convolutions, and how
	Matmul       string            `json:"matmul"`        // what runs matrix products, and how F32 ones (Options.MatmulF32)
	ChannelsLast bool              `json:"channels_last"` // 16-bit convolutions run faster channels-last: a CNN's layout under autocast (Note [channels last])
	Libraries    map[string]string `json:"libraries"`     // library -> version
}

// Slice is the view of n elements of b from element off on.
func (b Buf) Slice(off, n int) Buf {
	if off < 0 || n < 0 || off+n > b.N {
		panic(fmt.Sprintf("kernels: Slice(%d, %d) of a buffer of %d elements", off, n, b.N))
	}
	return Buf{Block: b.Block, Off: b.Off + int64(off)*int64(b.DType.Size()), N: n, DType: b.DType}
}

// Float reports whether d is a float type (F32, F16, BF16).
func (d DType) Float() bool { return d == F32 || d.Half() }
