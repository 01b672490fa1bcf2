package cuda

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
	"github.com/x448/float16"
)

// The copy operations (kernels.CopyOps): host transfers through pinned
// staging, memsets, and the casts, transposes and multi-tensor copies of
// copy.cu.

type castArgs struct {
	N    int64
	X, Y uintptr
}

var castKernels = map[[2]kernels.DType]kernel[castArgs]{}

func init() {
	for _, c := range [][2]kernels.DType{{kernels.F32, kernels.F16}, {kernels.F16, kernels.F32}, {kernels.I32, kernels.F32},
		{kernels.F32, kernels.I32}, {kernels.I32, kernels.F16}, {kernels.F16, kernels.I32},
		{kernels.F32, kernels.BF16}, {kernels.BF16, kernels.F32}, {kernels.I32, kernels.BF16}, {kernels.BF16, kernels.I32}} {
		castKernels[c] = declareKernel[castArgs]("cast_" + c[0].String() + "_" + c[1].String())
	}
}

// Fill sets every element with a memset of its bit pattern.
func (b *Backend) Fill(dst kernels.Buf, v float32) {
	b.enter()
	defer b.exit()
	if dst.N == 0 {
		return
	}
	p, n := ptrOf(dst), uintptr(dst.N)
	b.queued("memset")
	switch dst.DType {
	case kernels.F32:
		b.d.must("cuMemsetD32Async", b.d.memsetD32Async(p, math.Float32bits(v), n, b.stream))
	case kernels.I32:
		b.d.must("cuMemsetD32Async", b.d.memsetD32Async(p, uint32(int32(v)), n, b.stream))
	case kernels.F16:
		b.d.must("cuMemsetD16Async", b.d.memsetD16Async(p, float16.Fromfloat32(v).Bits(), n, b.stream))
	case kernels.BF16:
		b.d.must("cuMemsetD16Async", b.d.memsetD16Async(p, bf16Bits(v), n, b.stream))
	case kernels.U8:
		b.d.must("cuMemsetD8Async", b.d.memsetD8Async(p, uint8(v), n, b.stream))
	}
}

// Cast converts between F32, F16 and I32.
func (b *Backend) Cast(dst, src kernels.Buf) {
	kernels.CheckLen("cast", src.N, dst)
	if dst.DType == src.DType {
		b.Copy(dst, src)
		return
	}
	b.enter()
	defer b.exit()
	b.cast(dst, src)
}

// cast queues Cast's kernel (the caller holds the lock; the dtypes differ).
func (b *Backend) cast(dst, src kernels.Buf) {
	k, ok := castKernels[[2]kernels.DType{src.DType, dst.DType}]
	if !ok {
		panic(fmt.Sprintf("cuda: cast of %v to %v", src.DType, dst.DType))
	}
	k.launch(b, 0, b.elems(int64(src.N)), castArgs{int64(src.N), ptrOf(src), ptrOf(dst)})
}

var kCopyMulti = declareKernel[listArgs]("copy_multi")

// castMultiKernels by (from, to); accumulateMultiKernels by from.
var castMultiKernels = map[[2]kernels.DType]kernel[listArgs]{}

var accumulateMultiKernels = map[kernels.DType]kernel[listArgs]{}

func init() {
	for _, h := range []kernels.DType{kernels.F16, kernels.BF16} {
		castMultiKernels[[2]kernels.DType{kernels.F32, h}] = declareKernel[listArgs]("cast_multi_f32_" + h.String())
		castMultiKernels[[2]kernels.DType{h, kernels.F32}] = declareKernel[listArgs]("cast_multi_" + h.String() + "_f32")
		accumulateMultiKernels[h] = declareKernel[listArgs]("accumulate_multi_" + h.String())
	}
}

// CopyMany copies each src[i] into dst[i], one launch per 32 tensors (a
// graph's memcpy nodes cost a launch each).
func (b *Backend) CopyMany(dst, src []kernels.Buf) {
	kernels.CheckLists("copy many", dst, src)
	if len(dst) == 0 {
		return
	}
	b.multiTensor("copy many", [][]kernels.Buf{dst, src}, func(l tensorList, d dims) { kCopyMulti.launch(b, 0, d, listArgs{l}) })
}

// CastMany converts each src[i] into dst[i], one launch per 32 tensors.
func (b *Backend) CastMany(dst, src []kernels.Buf) {
	from, to := kernels.CheckCastLists("cast many", dst, src)
	if len(dst) == 0 {
		return
	}
	k := castMultiKernels[[2]kernels.DType{from, to}]
	b.multiTensor("cast many", [][]kernels.Buf{dst, src}, func(l tensorList, d dims) { k.launch(b, 0, d, listArgs{l}) })
}

// AccumulateMany adds each src[i], converted, into dst[i], one launch per
// 32 tensors.
func (b *Backend) AccumulateMany(dst, src []kernels.Buf) {
	from := kernels.CheckAccumulateLists("accumulate many", dst, src)
	if len(dst) == 0 {
		return
	}
	k := accumulateMultiKernels[from]
	b.multiTensor("accumulate many", [][]kernels.Buf{dst, src}, func(l tensorList, d dims) { k.launch(b, 0, d, listArgs{l}) })
}

// bf16Bits rounds v to bfloat16, to nearest even (as the kernels' f2bf).
func bf16Bits(v float32) uint16 {
	u := math.Float32bits(v)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}

// staging is a pinned host buffer for copies, with the event of its last use.
type staging struct {
	mem     []byte
	ptr     unsafe.Pointer
	event   uintptr
	pending bool
}

const stagingChunk = 8 << 20

func (s *staging) ready(d *driverAPI) {
	if s.pending {
		d.must("cuEventSynchronize", d.eventSynchronize(s.event))
		s.pending = false
	}
	if s.ptr == nil {
		d.must("cuMemHostAlloc", d.memHostAlloc(unsafe.Pointer(&s.ptr), stagingChunk, 0))
		s.mem = unsafe.Slice((*byte)(s.ptr), stagingChunk)
	}
}

// Write copies host bytes into dst through the pinned staging buffers: the
// call returns once the bytes are staged; the copies run on the stream.
func (b *Backend) Write(dst kernels.Buf, src []byte) {
	if int64(len(src)) != dst.Bytes() {
		panic(fmt.Sprintf("cuda: write of %d bytes into a %d-byte buffer", len(src), dst.Bytes()))
	}
	b.enter()
	defer b.exit()
	b.notCapturing("write of host bytes")
	base := ptrOf(dst)
	for off := 0; off < len(src); off += stagingChunk {
		n := min(stagingChunk, len(src)-off)
		s := &b.staging[b.nextStage]
		b.nextStage ^= 1
		s.ready(b.d)
		copy(s.mem[:n], src[off:off+n])
		b.queued("memcpy host to device")
		b.d.must("cuMemcpyHtoDAsync", b.d.memcpyHtoDAsync(base+uintptr(off), s.ptr, uintptr(n), b.stream))
		b.d.must("cuEventRecord", b.d.eventRecord(s.event, b.stream))
		s.pending = true
	}
}

// Read waits for the stream and copies src into host bytes: in one direct
// copy when they are page-locked memory from PinnedSource, else through the
// staging buffers.
func (b *Backend) Read(dst []byte, src kernels.Buf) {
	if int64(len(dst)) != src.Bytes() {
		panic(fmt.Sprintf("cuda: read of a %d-byte buffer into %d bytes", src.Bytes(), len(dst)))
	}
	b.enter()
	defer b.exit()
	b.notCapturing("read into host memory")
	b.mark("memcpy device to host")
	defer b.mark(kernels.IdleOp)
	base := ptrOf(src)
	if b.pinned.holds(dst) { // one direct copy
		b.d.must("cuMemcpyDtoHAsync", b.d.memcpyDtoHAsync(unsafe.Pointer(unsafe.SliceData(dst)), base, uintptr(len(dst)), b.stream))
		b.d.must("cuStreamSynchronize", b.d.streamSynchronize(b.stream))
		return
	}
	s := &b.staging[0]
	for off := 0; off < len(dst); off += stagingChunk {
		n := min(stagingChunk, len(dst)-off)
		s.ready(b.d)
		b.d.must("cuMemcpyDtoHAsync", b.d.memcpyDtoHAsync(s.ptr, base+uintptr(off), uintptr(n), b.stream))
		b.d.must("cuStreamSynchronize", b.d.streamSynchronize(b.stream))
		copy(dst[off:off+n], s.mem[:n])
	}
}

// Copy copies src into dst on the stream.
func (b *Backend) Copy(dst, src kernels.Buf) {
	if dst.DType != src.DType || dst.N != src.N {
		panic(fmt.Sprintf("cuda: copy of %d %v into %d %v", src.N, src.DType, dst.N, dst.DType))
	}
	b.enter()
	defer b.exit()
	if src.N > 0 {
		b.queued("memcpy device to device")
		b.d.must("cuMemcpyDtoDAsync", b.d.memcpyDtoDAsync(ptrOf(dst), ptrOf(src), uintptr(src.Bytes()), b.stream))
	}
}

type transposeArgs struct {
	Outer, Rows, Cols int32
	X, Y              uintptr
}

var kTranspose = declareTyped[transposeArgs]("transpose")

// Transpose swaps the inner axes of src into dst, a 32×32 tile a block.
func (b *Backend) Transpose(dst, src kernels.Buf, t kernels.Transposition) {
	kernels.CheckTranspose(t, dst, src)
	s := floatType("transpose", dst, src)
	b.enter()
	defer b.exit()
	b.transpose(s, dst, src, t)
}

// transpose is Transpose for a checked call (the caller holds the lock).
func (b *Backend) transpose(s kernels.DType, dst, src kernels.Buf, t kernels.Transposition) {
	tiles := int64((t.Rows+31)/32) * int64((t.Cols+31)/32)
	if tiles >= 1<<31 {
		panic(fmt.Sprintf("cuda: transpose %+v: %d tiles", t, tiles))
	}
	kTranspose.launch(b, s, dims{uint32(tiles), uint32(min(t.Outer, 65535)), 256},
		transposeArgs{int32(t.Outer), int32(t.Rows), int32(t.Cols), ptrOf(src), ptrOf(dst)})
}
