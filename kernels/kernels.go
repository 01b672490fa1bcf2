// Package kernels is the seam between tensors and the hardware: one Backend
// interface through which every operation of leangrad runs, with a CPU
// implementation (package kernels/cpu, Go with AVX assembly for its matrix
// products and hot passes) and a CUDA one (package
// kernels/cuda, NVRTC-compiled kernels and cuBLAS).
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
	"strings"

	"github.com/leangrad/leangrad/memory"
)

// DType is an element type.
type DType uint8

// The element types. F16 is IEEE 754 binary16 and BF16 bfloat16 (a
// float32's top 16 bits), both stored as 16 bits and computed in float32,
// rounded to nearest even when stored; I32 holds labels and indices.
const (
	F32 DType = iota + 1
	F16
	I32
	BF16
)

// Size is the size of one element in bytes.
func (d DType) Size() int {
	switch d {
	case F32, I32:
		return 4
	case F16, BF16:
		return 2
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
	}
	return fmt.Sprintf("dtype(%d)", d)
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

// Valid reports whether b refers to memory.
func (b Buf) Valid() bool { return b.Block != nil }

// ReduceOp is a reduction along one axis.
type ReduceOp uint8

// The reductions.
const (
	Sum ReduceOp = iota + 1
	Mean
	Max
)

// ReduceOps lists the reductions.
func ReduceOps() []ReduceOp { return []ReduceOp{Sum, Mean, Max} }

func (op ReduceOp) String() string {
	switch op {
	case Sum:
		return "sum"
	case Mean:
		return "mean"
	case Max:
		return "max"
	}
	return fmt.Sprintf("reduce(%d)", op)
}

// Reduction describes x as an (Outer, Len, Inner) array reduced along its
// middle axis to an (Outer, Inner) result.
type Reduction struct{ Outer, Len, Inner int }

// GemmParams describes C = Alpha·op(A)·op(B) + Beta·C for row-major matrices,
// op(A) being M×K and op(B) K×N. A is stored M×K, or K×M when TransA; B is
// stored K×N, or N×K when TransB. With Batch > 1 the product is repeated for
// Batch matrices StrideA, StrideB, StrideC elements apart (a stride of 0
// reuses one matrix). A and B share a dtype (F32, F16 or BF16); C is F32,
// or A's 16-bit dtype (cuBLAS has no F32×F32→F16 product); accumulation is
// in float32.
type GemmParams struct {
	TransA, TransB            bool
	M, N, K                   int
	Alpha, Beta               float32
	Batch                     int
	StrideA, StrideB, StrideC int
}

// Epilogue is what a single (unbatched, Beta = 0) matrix product does to
// its result on the way to memory, in the pass that stores C (cuBLASLt's
// epilogues on CUDA): a linear layer's bias, its activation, their
// gradients and the residual connection after it cost no pass of their own
// over C. The zero Epilogue does nothing.
//
// Forward (Grad false): C = Act(Alpha·op(A)·op(B) + Bias), the bias
// broadcast over the rows and, for a 16-bit C, rounded to C's dtype (as
// autocast rounds a bias); with an Act, Aux receives its input, the
// pre-activation the backward needs.
//
// Backward (Grad true): C = Alpha·op(A)·op(B) · Act′(Aux), the gradient
// through the activation whose input Aux holds, into the product that
// computed it.
//
// Forward with a Residual (and no Act): C = Alpha·op(A)·op(B) + Bias +
// Residual, the bias rounded as above (not at all for an F32 C) and the
// sum rounded once into C: under autocast, a 16-bit product summed into
// the F32 residual stream without being rounded to 16 bits first.
//
// Either way BiasGrad, when valid, receives the column sums of the stored C
// (the gradient of the bias that made the activation's input), and
// BiasGradA the sums of op(A) over K (the gradient of the bias of a layer
// whose weight gradient the product is, A being that layer's output
// gradient, transposed). A backend may round them to C's or A's 16-bit
// dtype, as a bias gradient of that dtype would be.
type Epilogue struct {
	Bias      Buf     // F32 or C's dtype, N elements; forward only (a 16-bit C adds it rounded to its dtype)
	Act       UnaryOp // 0: none; else an op whose derivative reads its input (UsesInput)
	Grad      bool
	Aux       Buf // C's dtype, M×N
	BiasGrad  Buf // F32, N elements
	BiasGradA Buf // F32, M elements
	Residual  Buf // C's dtype, M×N, apart from C; forward only
}

// String names what the epilogue does, as profiles show it: "bias+gelu",
// "gelu′+bias grad".
func (e Epilogue) String() string {
	var parts []string
	if e.Bias.Valid() {
		parts = append(parts, "bias")
	}
	if e.Act != 0 {
		parts = append(parts, e.Act.String()+map[bool]string{true: "′"}[e.Grad])
	}
	if e.BiasGrad.Valid() {
		parts = append(parts, "bias grad")
	}
	if e.BiasGradA.Valid() {
		parts = append(parts, "bias grad of A")
	}
	if e.Residual.Valid() {
		parts = append(parts, "residual")
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "+")
}

// ConvParams describes a 2-D convolution (cross-correlation, as in every deep
// learning framework) of an N×C×H×W input with K filters of C×R×S, with
// zero padding and stride. There is no bias: add one with Binary.
//
// With ChannelsLast the tensors are laid out channels innermost (NHWC):
// the input N×H×W×C, the output N×OH×OW×K and the filters K×R×S×C, the
// layout in which cuDNN's 16-bit tensor-core kernels read them without
// transposing around themselves (Note [channels last], layout.go).
type ConvParams struct {
	N, C, H, W       int
	K, R, S          int
	StrideH, StrideW int
	PadH, PadW       int
	ChannelsLast     bool
}

// OutH is the output height.
func (p ConvParams) OutH() int { return (p.H+2*p.PadH-p.R)/p.StrideH + 1 }

// OutW is the output width.
func (p ConvParams) OutW() int { return (p.W+2*p.PadW-p.S)/p.StrideW + 1 }

// Validate panics unless the parameters describe a convolution with a
// non-empty output.
func (p ConvParams) Validate() {
	if p.N <= 0 || p.C <= 0 || p.H <= 0 || p.W <= 0 || p.K <= 0 || p.R <= 0 || p.S <= 0 ||
		p.StrideH <= 0 || p.StrideW <= 0 || p.PadH < 0 || p.PadW < 0 || p.OutH() <= 0 || p.OutW() <= 0 {
		panic(fmt.Sprintf("kernels: invalid convolution %+v", p))
	}
}

// PoolParams describes 2-D max or average pooling of an N×C×H×W input with a
// KH×KW window, stride and zero padding. Average pooling counts the padding
// in its divisor (PyTorch's count_include_pad=True); max pooling ignores it.
type PoolParams struct {
	N, C, H, W int
	KH, KW     int
	SH, SW     int
	PH, PW     int
}

// OutH is the output height.
func (p PoolParams) OutH() int { return (p.H+2*p.PH-p.KH)/p.SH + 1 }

// OutW is the output width.
func (p PoolParams) OutW() int { return (p.W+2*p.PW-p.KW)/p.SW + 1 }

// Validate panics unless the parameters describe a pooling with a non-empty
// output whose windows each hold at least one input element.
func (p PoolParams) Validate() {
	if p.N <= 0 || p.C <= 0 || p.H <= 0 || p.W <= 0 || p.KH <= 0 || p.KW <= 0 || p.SH <= 0 || p.SW <= 0 ||
		p.PH < 0 || p.PW < 0 || 2*p.PH > p.KH || 2*p.PW > p.KW || p.OutH() <= 0 || p.OutW() <= 0 {
		panic(fmt.Sprintf("kernels: invalid pooling %+v", p))
	}
}

// BNParams describes batch normalisation of an N×C×HW input over its N and
// HW axes, per channel. Momentum weights the new batch statistics in the
// running averages, as in PyTorch; the running variance is unbiased. With
// ReLU the output is max(0, ·) of the normalised value plus the residual:
// batch norm fused with the ReLU (and the residual addition) after it, as
// in a ResNet block.
type BNParams struct {
	N, C, HW int
	Eps      float32
	Momentum float32
	ReLU     bool
}

// Philox is the state of a counter-based Philox4x32-10 generator: a key and
// a position in its stream. Random operations take it by value, so that the
// same state always yields the same numbers, on every backend.
type Philox struct {
	Seed   uint64
	Offset uint64 // in blocks of four 32-bit words
	// Base, when valid, is a device counter (see Counter) whose value the
	// operation adds to Offset when it runs, not when it is queued: a
	// captured training step replayed many times draws new numbers at every
	// replay because the step advances its Base on the device.
	Base Buf `json:"-"`
}

// CounterLen is the I32 elements of a device counter, a little-endian
// two's-complement int64 that operations read and advance without the
// host (tensor.Counter owns them; Philox bases, AdamW's step count).
const CounterLen = 2

// SGDParams are the hyper-parameters of one SGD step, as in torch.optim.SGD.
// The learning rate is read on the device, so that a captured step follows
// the schedule; with FirstStep, momentum buffers are initialised to the
// gradient.
type SGDParams struct {
	LR                               Buf // F32, 1 element
	Momentum, Dampening, WeightDecay float32
	Nesterov                         bool
	FirstStep                        bool
	// Skip, when valid (F32, 1 element), makes the update do nothing if its
	// value is not zero: GradScaler's found-inf flag, read on the device.
	Skip Buf
}

// AdamWParams are the hyper-parameters of one AdamW step, as in
// torch.optim.AdamW. Step is a counter holding the step number, counted from
// 1, that drives the bias correction; it is read on the device.
type AdamWParams struct {
	LR                             Buf // F32, 1 element
	Beta1, Beta2, Eps, WeightDecay float32
	Step                           Buf // a counter
	Skip                           Buf // as SGDParams.Skip
	// GradScale, when valid (F32, 1 element, read on the device),
	// multiplies each gradient as the update reads it: UnscaleClip's
	// multiplier, the GradScaler's 1/scale and the clip's coefficient
	// applied without a pass of their own over the gradients.
	GradScale Buf
}

// ScalerParams are GradScaler's growth and backoff, as in torch.amp.GradScaler.
type ScalerParams struct {
	Growth, Backoff float32
	Interval        int
}

// OpTime is the time one kind of operation took over a profile: device time
// for an asynchronous backend (CUDA's events), host time for a synchronous
// one (the CPU's).
type OpTime struct {
	Op    string  // the kernel's name, the library call or the operation
	Count int     // operations of this kind
	MS    float64 // milliseconds in all
}

// Backend runs operations on one device. Output Bufs are written, never read,
// unless documented otherwise; dtypes are F32 or F16 for data (mixed freely,
// computed in float32) and I32 for labels.
type Backend interface {
	TransformerOps

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

	// Write copies host bytes, in dst's dtype, into dst.
	Write(dst Buf, src []byte)
	// Read waits for queued work and copies src into host bytes.
	Read(dst []byte, src Buf)
	// Copy copies src into dst; both have the same dtype and length.
	Copy(dst, src Buf)
	// Transpose swaps the inner axes of src into dst, both of one dtype
	// and t.Len() elements: a filter or an activation to or from
	// channels-last (Note [channels last]).
	Transpose(dst, src Buf, t Transposition)
	// CopyMany copies each src[i] into dst[i] (F32, the same lengths), in
	// one launch per 32 tensors where the backend launches kernels: what
	// gathers a data-parallel bucket's gradients.
	CopyMany(dst, src []Buf)
	// CastMany converts each src[i] into dst[i] (the same lengths), every
	// src of one dtype and every dst of another, F32 to F16 or BF16 or
	// back, rounding to nearest even as Cast does, in one launch per 32
	// tensors where the backend launches kernels: an autocast's copies of
	// the parameters made at once (autograd.CastParameters).
	CastMany(dst, src []Buf)
	// AccumulateMany adds each src[i] (F16 or BF16, all of one dtype),
	// converted, into the F32 dst[i] of its length, in one launch per 32
	// tensors where the backend launches kernels: those copies' gradients
	// returned to the parameters' at once.
	AccumulateMany(dst, src []Buf)
	// Fill sets every element of dst to v.
	Fill(dst Buf, v float32)
	// Cast converts src into dst's dtype, rounding to nearest even.
	Cast(dst, src Buf)

	// Unary computes dst = op(x).
	Unary(op UnaryOp, dst, x Buf)
	// UnaryBackward computes dx = dy·op'(x), from x or the forward output y.
	UnaryBackward(op UnaryOp, dx, dy, x, y Buf)
	// Affine computes dst = alpha·x + beta.
	Affine(dst, x Buf, alpha, beta float32)
	// Binary computes dst = a op b, broadcasting as bc says. a and b have
	// dst's dtype, or dst and one of them are F32 and the other is read in
	// its own (a 16-bit residual branch added to an F32 stream, uncast).
	Binary(op BinaryOp, dst, a, b Buf, bc Broadcast)

	// Reduce reduces x along the middle axis of r into dst (r.Outer·r.Inner elements).
	Reduce(op ReduceOp, dst, x Buf, r Reduction)
	// ReduceMaxBackward routes dy to the elements of x equal to their maximum y.
	ReduceMaxBackward(dx, dy, x, y Buf, r Reduction)
	// ArgMax writes, as I32, the index along the middle axis of each maximum (the first on ties).
	ArgMax(dst, x Buf, r Reduction)

	// Gemm computes a (batched) matrix product; see GemmParams. C is read when Beta != 0.
	Gemm(p GemmParams, a, b, c Buf)
	// GemmEpilogue computes a matrix product and its epilogue in one
	// pass where the backend can fuse them; see Epilogue.
	GemmEpilogue(p GemmParams, e Epilogue, a, b, c Buf)

	// Conv2d computes y (N×K×OH×OW) from x (N×C×H×W) and w (K×C×R×S).
	Conv2d(p ConvParams, x, w, y Buf)
	// Conv2dBackwardData computes dx from dy and w.
	Conv2dBackwardData(p ConvParams, dy, w, dx Buf)
	// Conv2dBackwardFilter computes dw from x and dy.
	Conv2dBackwardFilter(p ConvParams, x, dy, dw Buf)

	// BatchNormTrain normalises x with its batch statistics, writes them to
	// saveMean and saveInvStd (F32, C each) and updates runMean and runVar
	// in place; y = γ·x̂ + β + residual, through a ReLU with p.ReLU. The
	// residual (x's length and dtype) is optional.
	BatchNormTrain(p BNParams, x, residual, gamma, beta, y, runMean, runVar, saveMean, saveInvStd Buf)
	// BatchNormEval normalises x with the running statistics, adding the
	// optional residual and applying the ReLU as BatchNormTrain does.
	BatchNormEval(p BNParams, x, residual, gamma, beta, runMean, runVar, y Buf)
	// BatchNormApply writes BatchNormTrain's y again, bit for bit, from the
	// batch statistics it saved: how a backward that did not keep y
	// recomputes it.
	BatchNormApply(p BNParams, x, residual, gamma, beta, saveMean, saveInvStd, y Buf)
	// BatchNormBackward computes dx, dgamma and dbeta of BatchNormTrain, and
	// the optional dresidual; with p.ReLU, dy is masked where the forward
	// output y was not positive (y is read only then). Without y, the mask
	// is BatchNormApply's y's, computed from x, beta and the forward's
	// residual (if it had one) as it writes it: a backward need not keep y.
	// dx may be dy itself (in place) when there is no dresidual, and
	// dresidual may be dy itself.
	BatchNormBackward(p BNParams, x, y, residual, dy, gamma, beta, saveMean, saveInvStd, dx, dresidual, dgamma, dbeta Buf)

	// MaxPool2d computes y from x.
	MaxPool2d(p PoolParams, x, y Buf)
	// MaxPool2dBackward routes dy to the maximum of each window of x (the first on ties).
	MaxPool2dBackward(p PoolParams, x, dy, dx Buf)
	// AvgPool2d computes y from x.
	AvgPool2d(p PoolParams, x, y Buf)
	// AvgPool2dBackward computes dx from dy.
	AvgPool2dBackward(p PoolParams, dy, dx Buf)

	// CrossEntropy computes, for logits (n×k) and I32 labels (n), the mean
	// over rows of -log softmax(logits)[label] into loss (F32, 1), and each
	// row's log-sum-exp into lse (F32, n) for the backward.
	CrossEntropy(logits, labels, lse, loss Buf, n, k int)
	// CrossEntropyBackward computes dlogits = (softmax(logits) - onehot(labels))·dloss/n,
	// dloss being the F32 gradient of the mean loss, read on the device.
	CrossEntropyBackward(logits, labels, lse, dloss, dlogits Buf, n, k int)

	// Uniform fills dst with numbers uniform in [lo, hi) drawn from g.
	Uniform(dst Buf, lo, hi float32, g Philox)
	// Normal fills dst with normal numbers drawn from g.
	Normal(dst Buf, mean, std float32, g Philox)
	// Dropout computes dst = x·mask/(1-p), the mask keeping each element with
	// probability 1-p, drawn from g. The same g gives the same mask, which is
	// how the backward (and a checkpoint's recompute) reproduce it.
	Dropout(dst, x Buf, p float32, g Philox)

	// SGD updates params in place (and their momentum buffers, when Momentum != 0).
	SGD(p SGDParams, params, grads, moms []Buf)
	// AdamW updates params and their moment estimates in place.
	AdamW(p AdamWParams, params, grads, m, v []Buf)
	// UnscaleCheck divides every grad by scale (F32, 1 element, read on the
	// device) in place and sets found (F32, 1 element, not cleared) to 1 if
	// any value is infinite or NaN.
	UnscaleCheck(grads []Buf, scale, found Buf)
	// UnscaleClip is UnscaleCheck and ClipGradNorm for an update that
	// multiplies the gradients as it reads them (AdamWParams.GradScale),
	// in one thread on the device: from the sum of squares sumsq (F32, 1)
	// of gradients still multiplied by scale (F32, 1; invalid: 1), it
	// writes their norm √sumsq/scale to norm, mult = c/scale where c is
	// the clip coefficient min(1, maxNorm/(norm + 10⁻⁶)) (1 for maxNorm
	// 0), and sets found (F32, 1, not cleared; invalid: none) to 1 if
	// sumsq is not finite: an inf or NaN gradient, or one whose square
	// overflows.
	UnscaleClip(maxNorm float32, sumsq, scale, norm, mult, found Buf)
	// UpdateScale is torch's _amp_update_scale_, on the device: when found
	// is set, scale ← scale·Backoff and tracker (I32, 1) ← 0, and skipped
	// (F32, 1) counts one more skipped step; otherwise the tracker counts up
	// and at Interval the scale grows by Growth and the tracker restarts.
	UpdateScale(p ScalerParams, scale, tracker, found, skipped Buf)
	// Increment adds n to a counter, unless unless is valid and holds a
	// value other than zero.
	Increment(counter Buf, n int64, unless Buf)
	// CountCorrect writes into right (F32, 1 element) the number of rows of
	// logits (n×k) whose first maximum is at the row's I32 label.
	CountCorrect(right, logits, labels Buf, n, k int)
	// AccumulateMetrics adds to sums (F32, 3 elements) loss·n (loss: F32,
	// 1 element, a mean over n predictions), right (F32, 1 element: how
	// many were right) and n: a training run's loss and accuracy, kept on
	// the device until they are read.
	AccumulateMetrics(sums, loss, right Buf, n int)
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

// F32Matmul is how a backend multiplies F32 matrices on a GPU.
type F32Matmul uint8

const (
	// F32TF32x3, the default, splits each operand into two TF32 parts, x
	// = big + small, and multiplies on TF32 tensor cores as three products
	// (small·big, big·small, big·big; small·small is below F32's
	// rounding), summed in F32, as CUTLASS's 3xTF32 and PyTorch's F32
	// memory-efficient attention do: on the H200 the products' errors are
	// below strict F32's and GPT-2 small's fp32 step is 1.13 times
	// PyTorch's strict one (ca66e6d; the CUDA backend's Note [F32 products
	// as three TF32 ones]). A device without TF32 tensor cores (or the
	// shared memory its kernels ask) multiplies strictly.
	F32TF32x3 F32Matmul = iota
	// F32Strict multiplies in F32 on the FMA units: PyTorch's default
	// (torch.set_float32_matmul_precision("highest")).
	F32Strict
	// F32TF32 multiplies on TF32 tensor cores once: inputs rounded to
	// 10-bit mantissas, as PyTorch's torch.backends.cuda.matmul.allow_tf32.
	F32TF32
)

var f32MatmulNames = [...]string{F32Strict: "strict", F32TF32x3: "tf32x3", F32TF32: "tf32"}

// String is the mode's flag value: strict, tf32x3 or tf32.
func (m F32Matmul) String() string {
	if int(m) < len(f32MatmulNames) {
		return f32MatmulNames[m]
	}
	return fmt.Sprintf("F32Matmul(%d)", m)
}

// MarshalText is the mode's String, for flag.TextVar.
func (m F32Matmul) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText reads a mode from its String.
func (m *F32Matmul) UnmarshalText(text []byte) error {
	for v, name := range f32MatmulNames {
		if string(text) == name {
			*m = F32Matmul(v)
			return nil
		}
	}
	return fmt.Errorf("F32 matmul mode %q: want strict, tf32x3 or tf32", text)
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

// Info describes a backend's device, for reports and for code that needs
// the device's number or capability without parsing its name.
type Info struct {
	Kind         string            `json:"kind"`          // "cpu" or "cuda"
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
