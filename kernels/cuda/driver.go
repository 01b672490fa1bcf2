package cuda

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

// The CUDA driver API, bound at run time from libcuda.so.1. Only the
// versioned entry points are used (cuMemAlloc_v2, ...), which is what the
// CUDA 13 headers map the plain names to.

type cuResult uintptr

const (
	cudaSuccess             cuResult = 0
	cudaErrorOutOfMemory    cuResult = 2
	cudaErrorNotReady       cuResult = 600
	cuStreamNonBlocking              = 1
	cuEventDisableTiming             = 2
	attrComputeCapMajor              = 75
	attrComputeCapMinor              = 76
	attrMultiprocessorCount          = 16
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

type driverAPI struct {
	lib     *library
	version int

	cuInit, cuDriverGetVersion, cuDeviceGetCount, cuDeviceGet, cuDeviceGetName, cuDeviceGetAttribute,
	cuDevicePrimaryCtxRetain, cuCtxSetCurrent, cuStreamCreate, cuStreamSynchronize, cuMemAlloc, cuMemFree, cuMemGetInfo, cuMemHostAlloc,
	cuMemFreeHost, cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, cuMemcpyDtoDAsync, cuMemsetD32Async,
	cuMemsetD16Async, cuModuleLoadData, cuModuleGetFunction, cuLaunchKernel, cuGetErrorName,
	cuGetErrorString, cuEventCreate, cuEventRecord, cuEventSynchronize, cuStreamWaitEvent uintptr

	// Closing a backend.
	cuModuleUnload, cuStreamDestroy, cuDevicePrimaryCtxRelease uintptr

	cuEventElapsedTime, cuEventDestroy uintptr

	// Graphs: stream capture, instantiation, launch.
	cuStreamBeginCapture, cuStreamEndCapture, cuGraphInstantiateWithFlags, cuGraphLaunch,
	cuGraphExecDestroy, cuGraphDestroy, cuGraphGetNodes uintptr
}

var (
	driverOnce sync.Once
	drv        *driverAPI
	driverErr  error
)

// loadDriver binds libcuda.so.1 and initialises the driver, once.
func loadDriver() (*driverAPI, error) {
	driverOnce.Do(func() {
		lib, err := openLibrary("the CUDA driver (libcuda.so.1, installed with the NVIDIA driver)", nil, "libcuda.so.1", "libcuda.so")
		if err != nil {
			driverErr = err
			return
		}
		d := &driverAPI{lib: lib}
		err = lib.bind(map[string]*uintptr{
			"cuInit": &d.cuInit, "cuDriverGetVersion": &d.cuDriverGetVersion, "cuDeviceGetCount": &d.cuDeviceGetCount,
			"cuDeviceGet": &d.cuDeviceGet, "cuDeviceGetName": &d.cuDeviceGetName,
			"cuDeviceGetAttribute":     &d.cuDeviceGetAttribute,
			"cuDevicePrimaryCtxRetain": &d.cuDevicePrimaryCtxRetain, "cuCtxSetCurrent": &d.cuCtxSetCurrent,
			"cuStreamCreate":      &d.cuStreamCreate,
			"cuStreamSynchronize": &d.cuStreamSynchronize, "cuMemAlloc_v2": &d.cuMemAlloc,
			"cuMemFree_v2": &d.cuMemFree, "cuMemGetInfo_v2": &d.cuMemGetInfo, "cuMemHostAlloc": &d.cuMemHostAlloc,
			"cuMemFreeHost": &d.cuMemFreeHost, "cuMemcpyHtoDAsync_v2": &d.cuMemcpyHtoDAsync,
			"cuMemcpyDtoHAsync_v2": &d.cuMemcpyDtoHAsync, "cuMemcpyDtoDAsync_v2": &d.cuMemcpyDtoDAsync,
			"cuMemsetD32Async": &d.cuMemsetD32Async, "cuMemsetD16Async": &d.cuMemsetD16Async,
			"cuModuleLoadData": &d.cuModuleLoadData, "cuModuleGetFunction": &d.cuModuleGetFunction,
			"cuLaunchKernel": &d.cuLaunchKernel, "cuGetErrorName": &d.cuGetErrorName,
			"cuGetErrorString": &d.cuGetErrorString, "cuEventCreate": &d.cuEventCreate,
			"cuEventRecord": &d.cuEventRecord, "cuEventSynchronize": &d.cuEventSynchronize,
			"cuStreamWaitEvent":       &d.cuStreamWaitEvent,
			"cuEventDestroy_v2":       &d.cuEventDestroy,
			"cuStreamBeginCapture_v2": &d.cuStreamBeginCapture, "cuStreamEndCapture": &d.cuStreamEndCapture,
			"cuGraphInstantiateWithFlags": &d.cuGraphInstantiateWithFlags, "cuGraphLaunch": &d.cuGraphLaunch,
			"cuGraphExecDestroy": &d.cuGraphExecDestroy, "cuGraphDestroy": &d.cuGraphDestroy,
			"cuGraphGetNodes": &d.cuGraphGetNodes,
			"cuModuleUnload":  &d.cuModuleUnload, "cuStreamDestroy_v2": &d.cuStreamDestroy,
			"cuDevicePrimaryCtxRelease_v2": &d.cuDevicePrimaryCtxRelease,
		})
		if err != nil {
			driverErr = fmt.Errorf("the CUDA driver is too old or incomplete: %w", err)
			return
		}
		// CUDA 12.8 added cuEventElapsedTime_v2, which CUDA 13's headers map
		// the name to; older drivers have only the first version.
		if d.cuEventElapsedTime, err = lib.sym("cuEventElapsedTime_v2"); err != nil {
			if d.cuEventElapsedTime, err = lib.sym("cuEventElapsedTime"); err != nil {
				driverErr = fmt.Errorf("the CUDA driver is too old or incomplete: %w", err)
				return
			}
		}
		if err := d.check("cuInit", call(d.cuInit, 0)); err != nil {
			driverErr = err
			return
		}
		var v int32
		if err := d.check("cuDriverGetVersion", call(d.cuDriverGetVersion, uintptr(unsafe.Pointer(&v)))); err != nil {
			driverErr = err
			return
		}
		d.version = int(v)
		drv = d
	})
	return drv, driverErr
}

// check turns a CUresult into an *Error (nil on success).
func (d *driverAPI) check(what string, r uintptr) error {
	if cuResult(r) == cudaSuccess {
		return nil
	}
	e := &Error{Call: what, Code: int(r), Name: "CUDA_ERROR"}
	var name, msg unsafe.Pointer
	if cuResult(call(d.cuGetErrorName, r, uintptr(unsafe.Pointer(&name)))) == cudaSuccess && name != nil {
		e.Name = cString(name)
	}
	if cuResult(call(d.cuGetErrorString, r, uintptr(unsafe.Pointer(&msg)))) == cudaSuccess && msg != nil {
		e.Msg = cString(msg)
	}
	return e
}

// must panics with the error of a failed call: a driver failure in the middle
// of an operation leaves no state to recover.
func (d *driverAPI) must(what string, r uintptr) {
	if err := d.check(what, r); err != nil {
		panic(err)
	}
}

// isOOM reports whether err is the driver's out-of-memory error.
func isOOM(err error) bool {
	var e *Error
	return errors.As(err, &e) && cuResult(e.Code) == cudaErrorOutOfMemory
}

// cString copies a NUL-terminated C string.
func cString(p unsafe.Pointer) string {
	var b []byte
	for i := uintptr(0); i < 4096; i++ {
		c := *(*byte)(unsafe.Add(p, i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

// cBytes is s as a NUL-terminated byte slice.
func cBytes(s string) []byte { return append([]byte(s), 0) }

// DeviceCount returns the number of CUDA devices, or the reason there are none.
func DeviceCount() (int, error) {
	d, err := loadDriver()
	if err != nil {
		return 0, err
	}
	var n int32
	if err := d.check("cuDeviceGetCount", call(d.cuDeviceGetCount, uintptr(unsafe.Pointer(&n)))); err != nil {
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
