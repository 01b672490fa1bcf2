package cuda

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ebitengine/purego"
)

// library is a shared library opened at run time, whose symbols are checked
// one by one before use.
type library struct {
	name   string // the file that was opened
	handle uintptr
}

// searchDirs lists where the CUDA libraries are looked for after the dynamic
// loader's own path: $CUDA_HOME and $CUDA_PATH, the usual toolkit folders,
// and the nvidia-* wheels of every Python site-packages folder found.
//
// Note [finding the CUDA libraries]: these are the only environment
// variables the library reads. Like LD_LIBRARY_PATH, which dlopen reads,
// they are how every CUDA program (nvcc, PyTorch, CuPy) is told where a
// toolkit lives; they change where a library comes from, never what a
// computation does. Every other setting is an option or an argument
// (internal/cmdenv lists what the commands read).
func searchDirs() []string {
	var dirs []string
	for _, env := range []string{"CUDA_HOME", "CUDA_PATH"} {
		if v := os.Getenv(env); v != "" {
			dirs = append(dirs, filepath.Join(v, "lib64"), filepath.Join(v, "lib"))
		}
	}
	dirs = append(dirs, "/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib",
		"/usr/lib/x86_64-linux-gnu", "/usr/local/nvidia/lib64", "/usr/lib/wsl/lib")
	// pip's nvidia-* wheels: .../site-packages/nvidia/<pkg>/lib
	var roots []string
	for _, pattern := range []string{
		"/usr/lib/python3*/site-packages", "/usr/local/lib/python3*/dist-packages", "/usr/lib/python3/dist-packages",
		"/opt/*/.venv/lib/python3*/site-packages", os.ExpandEnv("$HOME/.local/lib/python3*/site-packages"),
	} {
		m, _ := filepath.Glob(pattern)
		roots = append(roots, m...)
	}
	if v := os.Getenv("VIRTUAL_ENV"); v != "" {
		m, _ := filepath.Glob(filepath.Join(v, "lib/python3*/site-packages"))
		roots = append(roots, m...)
	}
	for _, r := range roots {
		m, _ := filepath.Glob(filepath.Join(r, "nvidia", "*", "lib"))
		dirs = append(dirs, m...)
	}
	return dirs
}

// openLibrary opens the first of names that loads, trying the loader's path
// first and then searchDirs. The libraries matching the companion patterns
// in the same folder (NVRTC's builtins, cuBLASLt) are loaded first, so that
// the library finds them even when its folder is not on the loader's path.
// The error names every place it looked.
func openLibrary(what string, companions []string, names ...string) (*library, error) {
	var tried []string
	try := func(path string) *library {
		h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			tried = append(tried, path)
			return nil
		}
		return &library{name: path, handle: h}
	}
	for _, n := range names {
		if l := try(n); l != nil {
			return l, nil
		}
	}
	dirs := searchDirs()
	for _, d := range dirs {
		for _, n := range names {
			p := filepath.Join(d, n)
			if _, err := os.Stat(p); err != nil {
				continue
			}
			for _, c := range companions {
				m, _ := filepath.Glob(filepath.Join(d, c))
				for _, f := range m {
					purego.Dlopen(f, purego.RTLD_NOW|purego.RTLD_GLOBAL)
				}
			}
			if l := try(p); l != nil {
				return l, nil
			}
		}
	}
	return nil, fmt.Errorf("%s not found: tried %s on the loader's path (LD_LIBRARY_PATH, ld.so.cache) and in %s",
		what, strings.Join(names, ", "), strings.Join(dirs, ", "))
}

// sym returns the address of a symbol, or an error naming the library.
func (l *library) sym(name string) (uintptr, error) {
	p, err := purego.Dlsym(l.handle, name)
	if err != nil || p == 0 {
		return 0, fmt.Errorf("%s has no symbol %s", l.name, name)
	}
	return p, nil
}

// bind fills each *uintptr in syms with the address of the symbol named by
// its key, failing on the first one missing.
func (l *library) bind(syms map[string]*uintptr) error {
	for name, p := range syms {
		addr, err := l.sym(name)
		if err != nil {
			return err
		}
		*p = addr
	}
	return nil
}

// call invokes a C function whose arguments are all integers or pointers.
// Like purego.SyscallN it is marked uintptrescapes: a Go pointer converted to
// uintptr in the argument list (an out-parameter such as &n) is moved to the
// heap and kept alive for the call, so the C side never writes into a
// goroutine stack that the runtime may move. Pointers stored inside memory
// passed to C (arrays of strings) must be pinned by the caller.
//
//go:uintptrescapes
func call(fn uintptr, args ...uintptr) uintptr {
	r, _, _ := purego.SyscallN(fn, args...)
	return r
}
