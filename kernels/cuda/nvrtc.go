package cuda

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/leangrad/leangrad/internal/atomicfile"
)

// The kernel sources, compiled together as one module in this order.
//
//go:embed src/*.cu src/*.cuh
var sources embed.FS

var sourceOrder = []string{"common.cuh", "elementwise.cu", "reduce.cu", "conv.cu", "norm.cu", "pool.cu", "loss.cu", "random.cu", "optim.cu"}

// Source returns the concatenated CUDA C source of every kernel.
func Source() string {
	var b strings.Builder
	for _, name := range sourceOrder {
		data, err := sources.ReadFile("src/" + name)
		if err != nil {
			panic(err) // embedded: cannot happen
		}
		fmt.Fprintf(&b, "// ---- %s ----\n", name)
		b.Write(data)
		b.WriteString("\n")
	}
	return b.String()
}

type nvrtcAPI struct {
	lib          *library
	major, minor int

	nvrtcCreateProgram, nvrtcCompileProgram, nvrtcGetProgramLogSize, nvrtcGetProgramLog,
	nvrtcGetCUBINSize, nvrtcGetCUBIN, nvrtcDestroyProgram, nvrtcGetErrorString, nvrtcVersion uintptr
}

var (
	nvrtcOnce sync.Once
	nvrtc     *nvrtcAPI
	nvrtcErr  error
)

func loadNVRTC() (*nvrtcAPI, error) {
	nvrtcOnce.Do(func() {
		lib, err := openLibrary("NVRTC (libnvrtc, from the CUDA toolkit or pip's nvidia-cuda-nvrtc)",
			[]string{"libnvrtc-builtins.so.*"}, "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so")
		if err != nil {
			nvrtcErr = err
			return
		}
		n := &nvrtcAPI{lib: lib}
		if err := lib.bind(map[string]*uintptr{
			"nvrtcCreateProgram": &n.nvrtcCreateProgram, "nvrtcCompileProgram": &n.nvrtcCompileProgram,
			"nvrtcGetProgramLogSize": &n.nvrtcGetProgramLogSize, "nvrtcGetProgramLog": &n.nvrtcGetProgramLog,
			"nvrtcGetCUBINSize": &n.nvrtcGetCUBINSize, "nvrtcGetCUBIN": &n.nvrtcGetCUBIN,
			"nvrtcDestroyProgram": &n.nvrtcDestroyProgram, "nvrtcGetErrorString": &n.nvrtcGetErrorString,
			"nvrtcVersion": &n.nvrtcVersion,
		}); err != nil {
			nvrtcErr = err
			return
		}
		var major, minor int32
		call(n.nvrtcVersion, uintptr(unsafe.Pointer(&major)), uintptr(unsafe.Pointer(&minor)))
		n.major, n.minor = int(major), int(minor)
		nvrtc = n
	})
	return nvrtc, nvrtcErr
}

func (n *nvrtcAPI) check(what string, r uintptr) error {
	if r == 0 {
		return nil
	}
	e := &Error{Call: what, Code: int(r), Name: "NVRTC_ERROR"}
	// nvrtcGetErrorString returns a const char*: read it through a one-element
	// array so that no integer becomes a pointer.
	var p [1]unsafe.Pointer
	*(*uintptr)(unsafe.Pointer(&p[0])) = call(n.nvrtcGetErrorString, r)
	if p[0] != nil {
		e.Name = cString(p[0])
	}
	return e
}

// CompileError is an NVRTC compilation failure with the compiler's log.
type CompileError struct {
	Arch string
	Log  string
}

func (e *CompileError) Error() string {
	return fmt.Sprintf("NVRTC could not compile the kernels for %s:\n%s", e.Arch, e.Log)
}

// Compile compiles src for arch ("sm_90") with NVRTC and returns the CUBIN.
// A compilation failure returns a *CompileError holding NVRTC's log.
func Compile(src, arch string) ([]byte, error) {
	n, err := loadNVRTC()
	if err != nil {
		return nil, err
	}
	var prog uintptr
	csrc, cname := cBytes(src), cBytes("leangrad.cu")
	if err := n.check("nvrtcCreateProgram", call(n.nvrtcCreateProgram, uintptr(unsafe.Pointer(&prog)),
		uintptr(unsafe.Pointer(&csrc[0])), uintptr(unsafe.Pointer(&cname[0])), 0, 0, 0)); err != nil {
		return nil, err
	}
	defer call(n.nvrtcDestroyProgram, uintptr(unsafe.Pointer(&prog)))
	// The option strings are reached through an array of pointers: pin them
	// so that they are on the heap, unmoving, for the call.
	var pin runtime.Pinner
	defer pin.Unpin()
	opts := [][]byte{cBytes("--gpu-architecture=" + arch), cBytes("--std=c++17")}
	optPtrs := make([]uintptr, len(opts))
	for i, o := range opts {
		pin.Pin(&o[0])
		optPtrs[i] = uintptr(unsafe.Pointer(&o[0]))
	}
	res := call(n.nvrtcCompileProgram, prog, uintptr(len(opts)), uintptr(unsafe.Pointer(&optPtrs[0])))
	if res != 0 {
		var size uintptr
		call(n.nvrtcGetProgramLogSize, prog, uintptr(unsafe.Pointer(&size)))
		log := make([]byte, size+1)
		call(n.nvrtcGetProgramLog, prog, uintptr(unsafe.Pointer(&log[0])))
		return nil, &CompileError{Arch: arch, Log: strings.TrimRight(string(log), "\x00")}
	}
	var size uintptr
	if err := n.check("nvrtcGetCUBINSize", call(n.nvrtcGetCUBINSize, prog, uintptr(unsafe.Pointer(&size)))); err != nil {
		return nil, err
	}
	cubin := make([]byte, size)
	if err := n.check("nvrtcGetCUBIN", call(n.nvrtcGetCUBIN, prog, uintptr(unsafe.Pointer(&cubin[0])))); err != nil {
		return nil, err
	}
	return cubin, nil
}

// cacheDir is where compiled modules are kept: dir (Options.KernelCache)
// when set, or the user cache dir's leangrad/cubin.
func cacheDir(dir string) string {
	if dir != "" {
		return dir
	}
	d, err := os.UserCacheDir()
	if err != nil {
		d = os.TempDir()
	}
	return filepath.Join(d, "leangrad", "cubin")
}

// compileCached returns the CUBIN of the kernel sources for arch, from the
// disk cache when a module with the same source, arch and NVRTC version was
// compiled before. fromCache says which happened.
func compileCached(arch, dir string) (cubin []byte, fromCache bool, err error) {
	n, err := loadNVRTC()
	if err != nil {
		return nil, false, err
	}
	src := Source()
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%s\x00nvrtc %d.%d", src, arch, n.major, n.minor)))
	path := filepath.Join(cacheDir(dir), hex.EncodeToString(sum[:16])+"-"+arch+".cubin")
	if data, err := os.ReadFile(path); err == nil && len(data) > 0 {
		return data, true, nil
	}
	cubin, err = Compile(src, arch)
	if err != nil {
		return nil, false, err
	}
	// A cache that cannot be written costs a recompile next time, nothing more.
	_ = atomicfile.WriteFile(path, cubin)
	return cubin, false, nil
}
