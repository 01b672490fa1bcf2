package cuda

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"unsafe"

	"github.com/leangrad/leangrad/fileio"
)

type nvrtcResult uintptr

// nvrtcAPI is libnvrtc's functions; see Note [typed bindings].
type nvrtcAPI struct {
	major, minor int

	createProgram  func(prog unsafe.Pointer, src, name unsafe.Pointer, numHeaders int32, headers, includeNames unsafe.Pointer) nvrtcResult
	compileProgram func(prog uintptr, numOptions int32, options unsafe.Pointer) nvrtcResult
	getLogSize     func(prog uintptr, size unsafe.Pointer) nvrtcResult
	getLog         func(prog uintptr, log unsafe.Pointer) nvrtcResult
	getCUBINSize   func(prog uintptr, size unsafe.Pointer) nvrtcResult
	getCUBIN       func(prog uintptr, cubin unsafe.Pointer) nvrtcResult
	getPTXSize     func(prog uintptr, size unsafe.Pointer) nvrtcResult
	getPTX         func(prog uintptr, ptx unsafe.Pointer) nvrtcResult
	destroyProgram func(prog unsafe.Pointer) nvrtcResult
	getErrorString func(r nvrtcResult) uintptr
	version        func(major, minor unsafe.Pointer) nvrtcResult
}

func (n *nvrtcAPI) symbols() []symbol {
	return []symbol{
		fn6("nvrtcCreateProgram", &n.createProgram), fn3("nvrtcCompileProgram", &n.compileProgram),
		fn2("nvrtcGetProgramLogSize", &n.getLogSize), fn2("nvrtcGetProgramLog", &n.getLog),
		fn2("nvrtcGetCUBINSize", &n.getCUBINSize), fn2("nvrtcGetCUBIN", &n.getCUBIN),
		fn2("nvrtcGetPTXSize", &n.getPTXSize), fn2("nvrtcGetPTX", &n.getPTX),
		fn1("nvrtcDestroyProgram", &n.destroyProgram), fn1("nvrtcGetErrorString", &n.getErrorString),
		fn2("nvrtcVersion", &n.version),
	}
}

func (n *nvrtcAPI) init(*library) error {
	var major, minor int32
	if err := n.check("nvrtcVersion", n.version(unsafe.Pointer(&major), unsafe.Pointer(&minor))); err != nil {
		return err
	}
	n.major, n.minor = int(major), int(minor)
	return nil
}

var nvrtcLib = loader[*nvrtcAPI]{what: "NVRTC (libnvrtc, from the CUDA toolkit or pip's nvidia-cuda-nvrtc)",
	names:      []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"},
	companions: []string{"libnvrtc-builtins.so.*"}, constructor: func() *nvrtcAPI { return new(nvrtcAPI) }}

func loadNVRTC() (*nvrtcAPI, error) { return nvrtcLib.load() }

func (n *nvrtcAPI) check(what string, r nvrtcResult) error {
	if r == 0 {
		return nil
	}
	e := &Error{Call: what, Code: int(r), Name: "NVRTC_ERROR"}
	if s := cStringAt(n.getErrorString(r)); s != "" {
		e.Name = s
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

// Target is the architecture the kernels are compiled for on a device of
// architecture arch ("sm_90") with NVRTC of major version nvrtcMajor:
// Hopper's arch-specific sm_90a, whose warpgroup MMAs the flash kernels run
// (its code runs on compute capability 9.0 alone, which is the device in
// hand), where NVRTC knows it (12 and later); else arch itself.
func Target(arch string, nvrtcMajor int) string {
	if arch == "sm_90" && nvrtcMajor >= 12 {
		return "sm_90a"
	}
	return arch
}

// Compile compiles src for arch ("sm_90") with NVRTC and returns the CUBIN.
// A compilation failure returns a *CompileError holding NVRTC's log.
func Compile(src, arch string) ([]byte, error) {
	c, err := compile(src, arch)
	return c.cubin, err
}

// CompilePTX compiles src for the virtual architecture arch ("compute_90")
// and returns the PTX, as text: what the tests read the kernels'
// parameter lists from.
func CompilePTX(src, arch string) (string, error) {
	c, err := compile(src, arch)
	return c.ptx, err
}

// KernelResources compiles src for arch ("sm_90") and returns what ptxas
// gave each kernel, in the order it compiled them: registers, spills and
// static shared memory (KernelUse), from its verbose log.
func KernelResources(src, arch string) ([]KernelUse, error) {
	c, err := compile(src, arch, "--ptxas-options=-v")
	if err != nil {
		return nil, err
	}
	return ParsePtxasLog(c.log), nil
}

// compiled is what one NVRTC run gives: the PTX, the CUBIN when the
// architecture is a real one ("sm_90", not "compute_90"), and the log.
type compiled struct {
	ptx   string
	cubin []byte
	log   string
}

// compile runs NVRTC on src for arch with extra options.
func compile(src, arch string, extra ...string) (c compiled, err error) {
	n, err := loadNVRTC()
	if err != nil {
		return c, err
	}
	var prog uintptr
	csrc, cname := cBytes(src), cBytes("leangrad.cu")
	if err := n.check("nvrtcCreateProgram", n.createProgram(unsafe.Pointer(&prog),
		unsafe.Pointer(&csrc[0]), unsafe.Pointer(&cname[0]), 0, nil, nil)); err != nil {
		return c, err
	}
	defer n.destroyProgram(unsafe.Pointer(&prog))
	// The option strings are reached through an array of pointers: pin them
	// so that they are on the heap, unmoving, for the call.
	var pin runtime.Pinner
	defer pin.Unpin()
	opts := [][]byte{cBytes("--gpu-architecture=" + arch), cBytes("--std=c++17")}
	for _, o := range extra {
		opts = append(opts, cBytes(o))
	}
	optPtrs := make([]unsafe.Pointer, len(opts))
	for i, o := range opts {
		pin.Pin(&o[0])
		optPtrs[i] = unsafe.Pointer(&o[0])
	}
	r := n.compileProgram(prog, int32(len(opts)), unsafe.Pointer(&optPtrs[0]))
	var size uintptr
	n.getLogSize(prog, unsafe.Pointer(&size))
	buf := make([]byte, size+1)
	n.getLog(prog, unsafe.Pointer(&buf[0]))
	c.log = strings.TrimRight(string(buf), "\x00")
	if r != 0 {
		return compiled{}, &CompileError{Arch: arch, Log: c.log}
	}
	get := func(what string, getSize, get func(uintptr, unsafe.Pointer) nvrtcResult) ([]byte, error) {
		if err := n.check(what+"Size", getSize(prog, unsafe.Pointer(&size))); err != nil {
			return nil, err
		}
		out := make([]byte, size)
		return out, n.check(what, get(prog, unsafe.Pointer(&out[0])))
	}
	ptx, err := get("nvrtcGetPTX", n.getPTXSize, n.getPTX)
	if err != nil {
		return compiled{}, err
	}
	c.ptx = strings.TrimRight(string(ptx), "\x00")
	if strings.HasPrefix(arch, "sm_") {
		if c.cubin, err = get("nvrtcGetCUBIN", n.getCUBINSize, n.getCUBIN); err != nil {
			return compiled{}, err
		}
	}
	return c, nil
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

// compileCached returns the CUBIN of the kernel sources for a device of
// architecture arch and the target it was compiled for (Target), from the
// disk cache when a module with the same source, target and NVRTC version
// was compiled before. fromCache says which happened.
func compileCached(arch, dir string) (cubin []byte, target string, fromCache bool, err error) {
	n, err := loadNVRTC()
	if err != nil {
		return nil, "", false, err
	}
	target = Target(arch, n.major)
	src := Source()
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%s\x00nvrtc %d.%d", src, target, n.major, n.minor)))
	path := filepath.Join(cacheDir(dir), hex.EncodeToString(sum[:16])+"-"+target+".cubin")
	if data, err := fileio.ReadFile(path, 256<<20); err == nil && len(data) > 0 {
		return data, target, true, nil
	}
	cubin, err = Compile(src, target)
	if err != nil {
		return nil, "", false, err
	}
	// A cache that cannot be written costs a recompile next time, nothing more.
	_ = fileio.WriteFile(path, cubin)
	return cubin, target, false, nil
}
