package cuda

import (
	"fmt"
	"reflect"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
)

// Note [typed launches]: every kernel of the module is declared once in Go,
// as a kernel[A]: its name and the struct type A of its parameters, field
// by field in the order of the __global__ function's. A launch takes an A,
// so the compiler checks every launch site against the declaration, and
// TestKernelSignatures (CPU only: NVRTC compiles the module to PTX) checks
// every declaration against the kernel's parameter list in the PTX: the
// same number of parameters, each of the same size, alignment and kind,
// and no kernel without a declaration. The structs passed by value
// (source.go's cStructs) are generated into the CUDA source from their Go
// types, so no layout is mirrored by hand either.
//
// Field types: int32, uint32, int64, uint64, float32, uintptr (a device
// pointer; 0 is NULL) and the by-value structs. The fields of an embedded
// struct are parameters of their own (a convolution's geometry, shared by
// several kernels).

// blockSize is the threads per block of the elementwise and grid-stride
// kernels; the CUDA source's THREADS.
const blockSize = 256

// kernelDecl is what the registry knows of a declared kernel.
type kernelDecl struct {
	id     int
	name   string       // the base name: "unary", or the whole name of an untyped kernel
	typed  bool         // instantiated per float dtype: name_f32, name_f16
	args   reflect.Type // the parameter struct
	params []param      // its fields, embedded structs' flattened
}

// param is one parameter of a kernel: a field of its parameter struct.
type param struct {
	name   string
	t      reflect.Type
	offset uintptr
}

// kernelDecls lists every declared kernel, in declaration order.
var kernelDecls []*kernelDecl

// kernel is a declared kernel with parameters A.
type kernel[A any] struct{ *kernelDecl }

// declareKernel declares the untyped kernel name, with parameters A.
func declareKernel[A any](name string) kernel[A] { return declare[A](name, false) }

// declareTyped declares the kernel name_S for each float storage type S
// (the CUDA source's FOR_TYPES), with parameters A.
func declareTyped[A any](name string) kernel[A] { return declare[A](name, true) }

func declare[A any](name string, typed bool) kernel[A] {
	t := reflect.TypeFor[A]()
	if t.Kind() != reflect.Struct {
		panic(fmt.Sprintf("cuda: kernel %s: parameters of type %v, want a struct", name, t))
	}
	d := &kernelDecl{id: len(kernelDecls), name: name, typed: typed, args: t, params: flatten(t, 0)}
	kernelDecls = append(kernelDecls, d)
	return kernel[A]{d}
}

// flatten lists t's fields as parameters, from offset base.
func flatten(t reflect.Type, base uintptr) []param {
	var ps []param
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			ps = append(ps, flatten(f.Type, base+f.Offset)...)
			continue
		}
		ps = append(ps, param{f.Name, f.Type, base + f.Offset})
	}
	return ps
}

// floatTypes are the storage types a typed kernel is instantiated for, in
// the CUDA source's FOR_TYPES order.
var floatTypes = []kernels.DType{kernels.F32, kernels.F16, kernels.BF16}

// symbols are the names of the kernel's instantiations, in floatTypes
// order (one name for an untyped kernel).
func (d *kernelDecl) symbols() []string {
	if !d.typed {
		return []string{d.name}
	}
	var s []string
	for _, dt := range floatTypes {
		s = append(s, d.name+"_"+dt.String())
	}
	return s
}

// variant is the index of dt's instantiation.
func (d *kernelDecl) variant(dt kernels.DType) int {
	if !d.typed {
		if dt != 0 {
			panic(fmt.Sprintf("cuda: kernel %s has no %v instantiation", d.name, dt))
		}
		return 0
	}
	for i, t := range floatTypes {
		if t == dt {
			return i
		}
	}
	panic(fmt.Sprintf("cuda: kernel %s of %v data", d.name, dt))
}

// dims are a launch's grid (gx·gy blocks) and block (threads).
type dims struct{ gx, gy, block uint32 }

// elems is the launch of a grid-stride kernel over n elements: blockSize
// threads a block, the grid capped at 32 blocks per multiprocessor so that
// the loops take over past a few waves.
func (b *Backend) elems(n int64) dims {
	return dims{gx: b.blocks(n, blockSize), gy: 1, block: blockSize}
}

// blocks is the number of blocks of threads for n elements, capped as elems says.
func (b *Backend) blocks(n int64, threads int) uint32 {
	g := (n + int64(threads) - 1) / int64(threads)
	g = max(1, min(g, int64(b.sms)*32))
	return uint32(g)
}

// launch queues the kernel's instantiation for dt (0 for an untyped
// kernel) with args; the caller holds the backend's lock. An empty grid
// launches nothing.
func (k kernel[A]) launch(b *Backend, dt kernels.DType, d dims, args A) {
	k.launchShared(b, dt, d, 0, args)
}

// launchShared is launch with shared bytes of dynamic shared memory a
// block (extern __shared__), at most b.sharedPerBlock: past the 48 KiB a
// block has without asking, the function is first allowed them. Where
// b.programmatic, the launch is a programmatic dependent of the kernel
// before it (Note [programmatic dependent launch], common.cuh).
func (k kernel[A]) launchShared(b *Backend, dt kernels.DType, d dims, shared int, args A) {
	if d.gx == 0 || d.gy == 0 {
		return
	}
	if shared > b.sharedPerBlock {
		panic(fmt.Sprintf("cuda: kernel %s with %d bytes of shared memory, %d a block at most", k.name, shared, b.sharedPerBlock))
	}
	f := b.function(k.kernelDecl, k.variant(dt))
	if shared > staticSharedLimit && b.funcShared[f] < shared {
		b.d.must("cuFuncSetAttribute("+k.name+")", b.d.funcSetAttribute(f, funcAttrMaxDynamicShared, int32(shared)))
		b.funcShared[f] = shared
	}
	a := b.args
	*(*A)(unsafe.Pointer(&a.data[0])) = args
	for i, p := range k.params {
		a.ptrs[i] = unsafe.Add(unsafe.Pointer(&a.data[0]), p.offset)
	}
	b.queued(k.name)
	if !b.programmatic {
		b.d.must("cuLaunchKernel("+k.name+")", b.d.launchKernel(f, d.gx, d.gy, 1, d.block, 1, 1, uint32(shared), b.stream,
			unsafe.Pointer(&a.ptrs[0]), nil))
		return
	}
	a.config = launchConfig{gridX: d.gx, gridY: d.gy, gridZ: 1, blockX: d.block, blockY: 1, blockZ: 1,
		shared: uint32(shared), stream: b.stream, attrs: uintptr(unsafe.Pointer(&a.attr)), numAttrs: 1}
	a.attr = launchAttr{id: launchAttrProgrammatic}
	a.attr.value[0] = 1 // programmaticStreamSerializationAllowed, an int
	b.d.must("cuLaunchKernelEx("+k.name+")", b.d.launchKernelEx(unsafe.Pointer(&a.config), f,
		unsafe.Pointer(&a.ptrs[0]), nil))
}

// launchArgs holds the arguments of one launch: cuLaunchKernel takes an
// array of pointers to argument values, cuLaunchKernelEx also a
// configuration that points to its attributes. It lives on the Go heap,
// whose objects do not move, is reachable from the Backend for as long as
// the driver may read it (the launch call), and is reused under the
// backend's lock.
type launchArgs struct {
	data   [512]uint64 // the parameter struct, 8-byte aligned
	ptrs   [64]unsafe.Pointer
	config launchConfig
	attr   launchAttr
}

// launchConfig is the driver's CUlaunchConfig.
type launchConfig struct {
	gridX, gridY, gridZ    uint32
	blockX, blockY, blockZ uint32
	shared                 uint32
	stream                 uintptr
	attrs                  uintptr // *launchAttr, in the same launchArgs
	numAttrs               uint32
}

// launchAttr is the driver's CUlaunchAttribute: an id, padding to 8 bytes
// and a 64-byte union of values.
type launchAttr struct {
	id    uint32
	_     uint32
	value [8]uint64
}

// function returns the kernel's instantiation v from the module.
func (b *Backend) function(d *kernelDecl, v int) uintptr {
	if f := b.funcs[d.id][v]; f != 0 {
		return f
	}
	name := d.symbols()[v]
	var f uintptr
	cname := cBytes(name)
	b.d.must("cuModuleGetFunction("+name+")", b.d.moduleGetFunction(unsafe.Pointer(&f), b.module, unsafe.Pointer(&cname[0])))
	b.funcs[d.id][v] = f
	return f
}

// newFunctionTable is an empty cache of the module's functions, one slot a
// declared kernel's instantiation.
func newFunctionTable() [][]uintptr {
	t := make([][]uintptr, len(kernelDecls))
	for i, d := range kernelDecls {
		t[i] = make([]uintptr, len(d.symbols()))
	}
	return t
}

// floatType returns the dtype of buffers that must share a float dtype: the
// instantiation of a typed kernel that runs on them.
func floatType(op string, bufs ...kernels.Buf) kernels.DType {
	dt := bufs[0].DType
	for _, b := range bufs {
		if b.Block != nil && b.DType != dt {
			panic(fmt.Sprintf("cuda: %s of mixed dtypes %v and %v", op, dt, b.DType))
		}
	}
	if _, ok := cTypeNames[dt]; !ok {
		panic(fmt.Sprintf("cuda: %s of %v data", op, dt))
	}
	return dt
}

func boolInt(v bool) int32 {
	if v {
		return 1
	}
	return 0
}
