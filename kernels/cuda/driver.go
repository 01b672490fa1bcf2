package cuda

import (
	"errors"
	"fmt"
	"unsafe"
)

// The CUDA driver API, bound at run time from libcuda.so.1. Only the
// versioned entry points are used (cuMemAlloc_v2, ...), which is what the
// CUDA 13 headers map the plain names to.

type cuResult uintptr

const (
	cudaSuccess              cuResult = 0
	cudaErrorOutOfMemory     cuResult = 2
	cuStreamNonBlocking               = 1
	cuEventDisableTiming              = 2
	attrComputeCapMajor               = 75
	attrComputeCapMinor               = 76
	attrMultiprocessorCount           = 16
	attrSharedPerSM                   = 81 // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
	attrSharedPerBlockOptin           = 97 // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
	funcAttrMaxDynamicShared          = 8  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
	launchAttrProgrammatic            = 6  // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
	staticSharedLimit                 = 48 << 10
)

// Error is a failed CUDA library call.
type Error struct {
	Call string // the function that failed
	Code int
	Name string // CUDA_ERROR_OUT_OF_MEMORY, NVRTC_ERROR_COMPILATION, ...
	Msg  string
}

func (e *Error) Error() string {
	if e.Msg != "" {
		return fmt.Sprintf("%s: %s (%d): %s", e.Call, e.Name, e.Code, e.Msg)
	}
	return fmt.Sprintf("%s: %s (%d)", e.Call, e.Name, e.Code)
}

// driverAPI is libcuda's functions; see Note [typed bindings].
type driverAPI struct {
	version int

	init_              func(flags uint32) cuResult
	driverGetVersion   func(v unsafe.Pointer) cuResult
	deviceGetCount     func(n unsafe.Pointer) cuResult
	deviceGet          func(dev unsafe.Pointer, ordinal int32) cuResult
	deviceGetName      func(name unsafe.Pointer, n int32, dev int32) cuResult
	deviceGetAttribute func(v unsafe.Pointer, attr int32, dev int32) cuResult
	primaryCtxRetain   func(ctx unsafe.Pointer, dev int32) cuResult
	primaryCtxRelease  func(dev int32) cuResult
	ctxSetCurrent      func(ctx uintptr) cuResult
	getErrorName       func(err cuResult, s unsafe.Pointer) cuResult
	getErrorString     func(err cuResult, s unsafe.Pointer) cuResult
	memAlloc           func(dptr unsafe.Pointer, size uintptr) cuResult
	memFree            func(dptr uintptr) cuResult
	memGetInfo         func(free, total unsafe.Pointer) cuResult
	memHostAlloc       func(p unsafe.Pointer, size uintptr, flags uint32) cuResult
	memFreeHost        func(p unsafe.Pointer) cuResult
	memcpyHtoDAsync    func(dst uintptr, src unsafe.Pointer, n uintptr, stream uintptr) cuResult
	memcpyDtoHAsync    func(dst unsafe.Pointer, src uintptr, n uintptr, stream uintptr) cuResult
	memcpyDtoDAsync    func(dst, src uintptr, n uintptr, stream uintptr) cuResult
	memsetD32Async     func(dst uintptr, v uint32, n uintptr, stream uintptr) cuResult
	memsetD16Async     func(dst uintptr, v uint16, n uintptr, stream uintptr) cuResult
	memsetD8Async      func(dst uintptr, v uint8, n uintptr, stream uintptr) cuResult
	moduleLoadData     func(mod unsafe.Pointer, image unsafe.Pointer) cuResult
	moduleUnload       func(mod uintptr) cuResult
	moduleGetFunction  func(f unsafe.Pointer, mod uintptr, name unsafe.Pointer) cuResult
	launchKernel       func(f uintptr, gx, gy, gz, bx, by, bz, sharedBytes uint32, stream uintptr, params, extra unsafe.Pointer) cuResult
	launchKernelEx     func(config unsafe.Pointer, f uintptr, params, extra unsafe.Pointer) cuResult // nil before CUDA 12
	streamCreate       func(stream unsafe.Pointer, flags uint32) cuResult
	streamDestroy      func(stream uintptr) cuResult
	streamSynchronize  func(stream uintptr) cuResult
	streamWaitEvent    func(stream, event uintptr, flags uint32) cuResult
	streamBeginCapture func(stream uintptr, mode uint32) cuResult
	streamEndCapture   func(stream uintptr, graph unsafe.Pointer) cuResult
	eventCreate        func(event unsafe.Pointer, flags uint32) cuResult
	eventDestroy       func(event uintptr) cuResult
	eventRecord        func(event, stream uintptr) cuResult
	eventSynchronize   func(event uintptr) cuResult
	eventElapsedTime   func(ms unsafe.Pointer, start, end uintptr) cuResult
	graphInstantiate   func(exec unsafe.Pointer, graph uintptr, flags uint64) cuResult
	graphLaunch        func(exec, stream uintptr) cuResult
	graphExecDestroy   func(exec uintptr) cuResult
	graphDestroy       func(graph uintptr) cuResult
	graphGetNodes      func(graph uintptr, nodes, n unsafe.Pointer) cuResult
	funcSetAttribute   func(f uintptr, attr int32, v int32) cuResult
}

func (d *driverAPI) symbols() []symbol {
	return []symbol{
		fn1("cuInit", &d.init_), fn1("cuDriverGetVersion", &d.driverGetVersion),
		fn1("cuDeviceGetCount", &d.deviceGetCount), fn2("cuDeviceGet", &d.deviceGet),
		fn3("cuDeviceGetName", &d.deviceGetName), fn3("cuDeviceGetAttribute", &d.deviceGetAttribute),
		fn2("cuDevicePrimaryCtxRetain", &d.primaryCtxRetain), fn1("cuDevicePrimaryCtxRelease_v2", &d.primaryCtxRelease),
		fn1("cuCtxSetCurrent", &d.ctxSetCurrent),
		fn2("cuGetErrorName", &d.getErrorName), fn2("cuGetErrorString", &d.getErrorString),
		fn2("cuMemAlloc_v2", &d.memAlloc), fn1("cuMemFree_v2", &d.memFree), fn2("cuMemGetInfo_v2", &d.memGetInfo),
		fn3("cuMemHostAlloc", &d.memHostAlloc), fn1("cuMemFreeHost", &d.memFreeHost),
		fn4("cuMemcpyHtoDAsync_v2", &d.memcpyHtoDAsync), fn4("cuMemcpyDtoHAsync_v2", &d.memcpyDtoHAsync),
		fn4("cuMemcpyDtoDAsync_v2", &d.memcpyDtoDAsync),
		fn4("cuMemsetD32Async", &d.memsetD32Async), fn4("cuMemsetD16Async", &d.memsetD16Async),
		fn4("cuMemsetD8Async", &d.memsetD8Async),
		fn2("cuModuleLoadData", &d.moduleLoadData), fn1("cuModuleUnload", &d.moduleUnload),
		fn3("cuModuleGetFunction", &d.moduleGetFunction), fn11("cuLaunchKernel", &d.launchKernel),
		fn3("cuFuncSetAttribute", &d.funcSetAttribute),
		fn2("cuStreamCreate", &d.streamCreate), fn1("cuStreamDestroy_v2", &d.streamDestroy),
		fn1("cuStreamSynchronize", &d.streamSynchronize), fn3("cuStreamWaitEvent", &d.streamWaitEvent),
		fn2("cuStreamBeginCapture_v2", &d.streamBeginCapture), fn2("cuStreamEndCapture", &d.streamEndCapture),
		fn2("cuEventCreate", &d.eventCreate), fn1("cuEventDestroy_v2", &d.eventDestroy),
		fn2("cuEventRecord", &d.eventRecord), fn1("cuEventSynchronize", &d.eventSynchronize),
		fn3("cuGraphInstantiateWithFlags", &d.graphInstantiate), fn2("cuGraphLaunch", &d.graphLaunch),
		fn1("cuGraphExecDestroy", &d.graphExecDestroy), fn1("cuGraphDestroy", &d.graphDestroy),
		fn3("cuGraphGetNodes", &d.graphGetNodes),
	}
}

func (d *driverAPI) init(lib *library) error {
	// CUDA 12.8 added cuEventElapsedTime_v2, which CUDA 13's headers map
	// the name to; older drivers have only the first version.
	for _, name := range []string{"cuEventElapsedTime_v2", "cuEventElapsedTime"} {
		if p, err := lib.sym(name); err == nil {
			fn3(name, &d.eventElapsedTime).set(p)
			break
		}
	}
	if d.eventElapsedTime == nil {
		return fmt.Errorf("the CUDA driver is too old or incomplete: %s has no cuEventElapsedTime", lib.name)
	}
	// CUDA 12.0 added cuLaunchKernelEx, which programmatic dependent
	// launches need (Note [programmatic dependent launch]); without it
	// launches are ordinary.
	if p, err := lib.sym("cuLaunchKernelEx"); err == nil {
		fn4("cuLaunchKernelEx", &d.launchKernelEx).set(p)
	}
	if err := d.check("cuInit", d.init_(0)); err != nil {
		return err
	}
	var v int32
	if err := d.check("cuDriverGetVersion", d.driverGetVersion(unsafe.Pointer(&v))); err != nil {
		return err
	}
	d.version = int(v)
	return nil
}

var driver = loader[*driverAPI]{what: "the CUDA driver (libcuda.so.1, installed with the NVIDIA driver)",
	names: []string{"libcuda.so.1", "libcuda.so"}, constructor: func() *driverAPI { return new(driverAPI) }}

// loadDriver binds libcuda.so.1 and initialises the driver, once.
func loadDriver() (*driverAPI, error) { return driver.load() }

// check turns a CUresult into an *Error (nil on success).
func (d *driverAPI) check(what string, r cuResult) error {
	if r == cudaSuccess {
		return nil
	}
	e := &Error{Call: what, Code: int(r), Name: "CUDA_ERROR"}
	var name, msg unsafe.Pointer
	if d.getErrorName(r, unsafe.Pointer(&name)) == cudaSuccess && name != nil {
		e.Name = cString(name)
	}
	if d.getErrorString(r, unsafe.Pointer(&msg)) == cudaSuccess && msg != nil {
		e.Msg = cString(msg)
	}
	return e
}

// must panics with the error of a failed call: a driver failure in the middle
// of an operation leaves no state to recover.
func (d *driverAPI) must(what string, r cuResult) {
	if err := d.check(what, r); err != nil {
		panic(err)
	}
}

// isOOM reports whether err is the driver's out-of-memory error.
func isOOM(err error) bool {
	var e *Error
	return errors.As(err, &e) && cuResult(e.Code) == cudaErrorOutOfMemory
}

// DeviceCount returns the number of CUDA devices, or the reason there are none.
func DeviceCount() (int, error) {
	d, err := loadDriver()
	if err != nil {
		return 0, err
	}
	var n int32
	if err := d.check("cuDeviceGetCount", d.deviceGetCount(unsafe.Pointer(&n))); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Available returns nil when the driver loads and at least one device is
// present, or an error saying what is missing.
func Available() error {
	n, err := DeviceCount()
	if err != nil {
		return err
	}
	if n == 0 {
		return errors.New("the CUDA driver reports no device")
	}
	return nil
}
