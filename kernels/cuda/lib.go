package cuda

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// The native libraries (the driver, NVRTC, cuBLAS, cuDNN, NCCL) are bound at
// run time, each through one loader: it opens the library (searchDirs),
// looks up every symbol the API needs and fails with one error naming the
// library, the places it looked or the missing symbol; then the API's
// typed Go function values call the C functions directly.
//
// Note [typed bindings]: each C function is a Go function value of its
// signature (fn0 ... fn23 build them from the symbol's address), so the
// compiler checks every call's arguments. Arguments are words: integers,
// uintptr for device pointers and handles, unsafe.Pointer for host memory.
// The wrappers call purego.SyscallN, whose //go:uintptrescapes keeps what
// an unsafe.Pointer argument points to on the heap and alive for the call
// (runtime.KeepAlive after it). purego.RegisterFunc builds the same typed
// values by reflection, at about 1 µs and 11 allocations a call for
// cuLaunchKernel's 11 arguments, against 0.2 µs here: it binds only the one
// function that takes a struct by value (ncclCommInitRank), which needs its
// C-ABI layout.

// library is an opened shared library.
type library struct {
	name   string // the file that was opened
	handle uintptr
}

// symbol is one C function of a library and where its typed Go value goes.
type symbol struct {
	name string
	set  func(addr uintptr)
}

// api is a bound library's Go side: the symbols it needs, and what to
// check once they are bound (a version, say).
type api interface {
	symbols() []symbol
	init(lib *library) error
}

// loader opens a library once, for every backend of the process.
type loader[A api] struct {
	what        string   // the library as the error names it
	names       []string // file names to try, in order
	companions  []string // patterns of libraries to load first from the same folder
	once        sync.Once
	api         A
	err         error
	constructor func() A
}

// load opens the library and binds its API, once; later calls return the
// same API or error.
func (l *loader[A]) load() (A, error) {
	l.once.Do(func() {
		lib, err := openLibrary(l.what, l.companions, l.names...)
		if err != nil {
			l.err = err
			return
		}
		a := l.constructor()
		for _, s := range a.symbols() {
			addr, err := lib.sym(s.name)
			if err != nil {
				l.err = fmt.Errorf("%s is too old or incomplete: %w", l.what, err)
				return
			}
			s.set(addr)
		}
		if err := a.init(lib); err != nil {
			l.err = err
			return
		}
		l.api = a
	})
	return l.api, l.err
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
// (cmd/internal/cmdenv lists what the commands read).
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
	try := func(path string) *library {
		h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
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

// cString copies a NUL-terminated C string (at most 4 KiB of it).
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

// cStringAt is cString of a const char* returned by a C function: read
// through a one-element array, so that no integer becomes a pointer in Go's
// eyes.
func cStringAt(addr uintptr) string {
	var p [1]unsafe.Pointer
	*(*uintptr)(unsafe.Pointer(&p[0])) = addr
	if p[0] == nil {
		return ""
	}
	return cString(p[0])
}

// cBytes is s as a NUL-terminated byte slice.
func cBytes(s string) []byte { return append([]byte(s), 0) }

// word is a C function's argument: an integer, a handle or device address
// (uintptr), or host memory (unsafe.Pointer).
type word interface {
	~uintptr | ~int | ~int32 | ~uint32 | ~uint16 | ~uint8 | ~int64 | ~uint64 | unsafe.Pointer
}

// result is a C function's status or return value.
type result interface {
	~uintptr | ~int | ~int32 | ~uint32 | ~int64 | ~uint64
}

// registered binds a function whose arguments are not all words (a struct
// by value) with purego.RegisterFunc; see Note [typed bindings].
func registered[F any](name string, f *F) symbol {
	return symbol{name, func(addr uintptr) { purego.RegisterFunc(f, addr) }}
}

// sys calls the C function at addr, returning its result.
func sys(addr uintptr, args ...uintptr) uintptr {
	r, _, _ := purego.SyscallN(addr, args...)
	return r
}

// fn0 ... fn23 bind the C function name to *f, a Go function of its
// signature with that many arguments; see Note [typed bindings]. Each
// keeps its arguments alive until the C function returns.
func fn0[R result](name string, f *func() R) symbol {
	return symbol{name, func(addr uintptr) { *f = func() R { return R(sys(addr)) } }}
}

func fn1[R result, A word](name string, f *func(A) R) symbol {
	return symbol{name, func(addr uintptr) {
		*f = func(a A) R {
			r := sys(addr, uintptr(a))
			runtime.KeepAlive(a)
			return R(r)
		}
	}}
}

func fn2[R result, A, B word](name string, f *func(A, B) R) symbol {
	return symbol{name, func(addr uintptr) {
		*f = func(a A, b B) R {
			r := sys(addr, uintptr(a), uintptr(b))
			runtime.KeepAlive(a)
			runtime.KeepAlive(b)
			return R(r)
		}
	}}
}

func fn3[R result, A, B, C word](name string, f *func(A, B, C) R) symbol {
	return symbol{name, func(addr uintptr) {
		*f = func(a A, b B, c C) R {
			r := sys(addr, uintptr(a), uintptr(b), uintptr(c))
			runtime.KeepAlive(a)
			runtime.KeepAlive(b)
			runtime.KeepAlive(c)
			return R(r)
		}
	}}
}

func fn4[R result, A, B, C, D word](name string, f *func(A, B, C, D) R) symbol {
	return symbol{name, func(addr uintptr) {
		*f = func(a A, b B, c C, d D) R {
			r := sys(addr, uintptr(a), uintptr(b), uintptr(c), uintptr(d))
			runtime.KeepAlive(a)
			runtime.KeepAlive(b)
			runtime.KeepAlive(c)
			runtime.KeepAlive(d)
			return R(r)
		}
	}}
}

func fn5[R result, A, B, C, D, E word](name string, f *func(A, B, C, D, E) R) symbol {
	return symbol{name, func(addr uintptr) {
		*f = func(a A, b B, c C, d D, e E) R {
			r := sys(addr, uintptr(a), uintptr(b), uintptr(c), uintptr(d), uintptr(e))
			runtime.KeepAlive(a)
			runtime.KeepAlive(b)
			runtime.KeepAlive(c)
			runtime.KeepAlive(d)
			runtime.KeepAlive(e)
			return R(r)
		}
	}}
}

func fn6[R result, A, B, C, D, E, F word](name string, f *func(A, B, C, D, E, F) R) symbol {
	return symbol{name, func(addr uintptr) {
		*f = func(a A, b B, c C, d D, e E, f F) R {
			r := sys(addr, uintptr(a), uintptr(b), uintptr(c), uintptr(d), uintptr(e), uintptr(f))
			runtime.KeepAlive(a)
			runtime.KeepAlive(b)
			runtime.KeepAlive(c)
			runtime.KeepAlive(d)
			runtime.KeepAlive(e)
			runtime.KeepAlive(f)
			return R(r)
		}
	}}
}

func fn7[R result, A, B, C, D, E, F, G word](name string, f *func(A, B, C, D, E, F, G) R) symbol {
	return symbol{name, func(addr uintptr) {
		*f = func(a A, b B, c C, d D, e E, f F, g G) R {
			r := sys(addr, uintptr(a), uintptr(b), uintptr(c), uintptr(d), uintptr(e), uintptr(f), uintptr(g))
			runtime.KeepAlive(a)
			runtime.KeepAlive(b)
			runtime.KeepAlive(c)
			runtime.KeepAlive(d)
			runtime.KeepAlive(e)
			runtime.KeepAlive(f)
			runtime.KeepAlive(g)
			return R(r)
		}
	}}
}

func fn8[R result, A, B, C, D, E, F, G, H word](name string, f *func(A, B, C, D, E, F, G, H) R) symbol {
	return symbol{name, func(addr uintptr) {
		*f = func(a A, b B, c C, d D, e E, f F, g G, h H) R {
			r := sys(addr, uintptr(a), uintptr(b), uintptr(c), uintptr(d), uintptr(e), uintptr(f), uintptr(g), uintptr(h))
			runtime.KeepAlive(a)
			runtime.KeepAlive(b)
			runtime.KeepAlive(c)
			runtime.KeepAlive(d)
			runtime.KeepAlive(e)
			runtime.KeepAlive(f)
			runtime.KeepAlive(g)
			runtime.KeepAlive(h)
			return R(r)
		}
	}}
}

func fn9[R result, A, B, C, D, E, F, G, H, I word](name string, f *func(A, B, C, D, E, F, G, H, I) R) symbol {
	return symbol{name, func(addr uintptr) {
		*f = func(a A, b B, c C, d D, e E, f F, g G, h H, i I) R {
			r := sys(addr, uintptr(a), uintptr(b), uintptr(c), uintptr(d), uintptr(e), uintptr(f), uintptr(g), uintptr(h), uintptr(i))
			runtime.KeepAlive(a)
			runtime.KeepAlive(b)
			runtime.KeepAlive(c)
			runtime.KeepAlive(d)
			runtime.KeepAlive(e)
			runtime.KeepAlive(f)
			runtime.KeepAlive(g)
			runtime.KeepAlive(h)
			runtime.KeepAlive(i)
			return R(r)
		}
	}}
}

func fn10[R result, A, B, C, D, E, F, G, H, I, J word](name string, f *func(A, B, C, D, E, F, G, H, I, J) R) symbol {
	return symbol{name, func(addr uintptr) {
		*f = func(a A, b B, c C, d D, e E, f F, g G, h H, i I, j J) R {
			r := sys(addr, uintptr(a), uintptr(b), uintptr(c), uintptr(d), uintptr(e), uintptr(f), uintptr(g), uintptr(h), uintptr(i), uintptr(j))
			runtime.KeepAlive(a)
			runtime.KeepAlive(b)
			runtime.KeepAlive(c)
			runtime.KeepAlive(d)
			runtime.KeepAlive(e)
			runtime.KeepAlive(f)
			runtime.KeepAlive(g)
			runtime.KeepAlive(h)
			runtime.KeepAlive(i)
			runtime.KeepAlive(j)
			return R(r)
		}
	}}
}

func fn11[R result, A, B, C, D, E, F, G, H, I, J, K word](name string, f *func(A, B, C, D, E, F, G, H, I, J, K) R) symbol {
	return symbol{name, func(addr uintptr) {
		*f = func(a A, b B, c C, d D, e E, f F, g G, h H, i I, j J, k K) R {
			r := sys(addr, uintptr(a), uintptr(b), uintptr(c), uintptr(d), uintptr(e), uintptr(f), uintptr(g), uintptr(h), uintptr(i), uintptr(j), uintptr(k))
			runtime.KeepAlive(a)
			runtime.KeepAlive(b)
			runtime.KeepAlive(c)
			runtime.KeepAlive(d)
			runtime.KeepAlive(e)
			runtime.KeepAlive(f)
			runtime.KeepAlive(g)
			runtime.KeepAlive(h)
			runtime.KeepAlive(i)
			runtime.KeepAlive(j)
			runtime.KeepAlive(k)
			return R(r)
		}
	}}
}

func fn12[R result, A, B, C, D, E, F, G, H, I, J, K, L word](name string, f *func(A, B, C, D, E, F, G, H, I, J, K, L) R) symbol {
	return symbol{name, func(addr uintptr) {
		*f = func(a A, b B, c C, d D, e E, f F, g G, h H, i I, j J, k K, l L) R {
			r := sys(addr, uintptr(a), uintptr(b), uintptr(c), uintptr(d), uintptr(e), uintptr(f), uintptr(g), uintptr(h), uintptr(i), uintptr(j), uintptr(k), uintptr(l))
			runtime.KeepAlive(a)
			runtime.KeepAlive(b)
			runtime.KeepAlive(c)
			runtime.KeepAlive(d)
			runtime.KeepAlive(e)
			runtime.KeepAlive(f)
			runtime.KeepAlive(g)
			runtime.KeepAlive(h)
			runtime.KeepAlive(i)
			runtime.KeepAlive(j)
			runtime.KeepAlive(k)
			runtime.KeepAlive(l)
			return R(r)
		}
	}}
}

func fn13[R result, A, B, C, D, E, F, G, H, I, J, K, L, M word](name string, f *func(A, B, C, D, E, F, G, H, I, J, K, L, M) R) symbol {
	return symbol{name, func(addr uintptr) {
		*f = func(a A, b B, c C, d D, e E, f F, g G, h H, i I, j J, k K, l L, m M) R {
			r := sys(addr, uintptr(a), uintptr(b), uintptr(c), uintptr(d), uintptr(e), uintptr(f), uintptr(g), uintptr(h), uintptr(i), uintptr(j), uintptr(k), uintptr(l), uintptr(m))
			runtime.KeepAlive(a)
			runtime.KeepAlive(b)
			runtime.KeepAlive(c)
			runtime.KeepAlive(d)
			runtime.KeepAlive(e)
			runtime.KeepAlive(f)
			runtime.KeepAlive(g)
			runtime.KeepAlive(h)
			runtime.KeepAlive(i)
			runtime.KeepAlive(j)
			runtime.KeepAlive(k)
			runtime.KeepAlive(l)
			runtime.KeepAlive(m)
			return R(r)
		}
	}}
}

func fn16[R result, A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, P word](name string, f *func(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, P) R) symbol {
	return symbol{name, func(addr uintptr) {
		*f = func(a A, b B, c C, d D, e E, f F, g G, h H, i I, j J, k K, l L, m M, n N, o O, p P) R {
			r := sys(addr, uintptr(a), uintptr(b), uintptr(c), uintptr(d), uintptr(e), uintptr(f), uintptr(g), uintptr(h), uintptr(i), uintptr(j), uintptr(k), uintptr(l), uintptr(m), uintptr(n), uintptr(o), uintptr(p))
			runtime.KeepAlive(a)
			runtime.KeepAlive(b)
			runtime.KeepAlive(c)
			runtime.KeepAlive(d)
			runtime.KeepAlive(e)
			runtime.KeepAlive(f)
			runtime.KeepAlive(g)
			runtime.KeepAlive(h)
			runtime.KeepAlive(i)
			runtime.KeepAlive(j)
			runtime.KeepAlive(k)
			runtime.KeepAlive(l)
			runtime.KeepAlive(m)
			runtime.KeepAlive(n)
			runtime.KeepAlive(o)
			runtime.KeepAlive(p)
			return R(r)
		}
	}}
}

func fn19[R result, A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, P, Q, S, T word](name string, f *func(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, P, Q, S, T) R) symbol {
	return symbol{name, func(addr uintptr) {
		*f = func(a A, b B, c C, d D, e E, f F, g G, h H, i I, j J, k K, l L, m M, n N, o O, p P, q Q, s S, t T) R {
			r := sys(addr, uintptr(a), uintptr(b), uintptr(c), uintptr(d), uintptr(e), uintptr(f), uintptr(g), uintptr(h), uintptr(i), uintptr(j), uintptr(k), uintptr(l), uintptr(m), uintptr(n), uintptr(o), uintptr(p), uintptr(q), uintptr(s), uintptr(t))
			runtime.KeepAlive(a)
			runtime.KeepAlive(b)
			runtime.KeepAlive(c)
			runtime.KeepAlive(d)
			runtime.KeepAlive(e)
			runtime.KeepAlive(f)
			runtime.KeepAlive(g)
			runtime.KeepAlive(h)
			runtime.KeepAlive(i)
			runtime.KeepAlive(j)
			runtime.KeepAlive(k)
			runtime.KeepAlive(l)
			runtime.KeepAlive(m)
			runtime.KeepAlive(n)
			runtime.KeepAlive(o)
			runtime.KeepAlive(p)
			runtime.KeepAlive(q)
			runtime.KeepAlive(s)
			runtime.KeepAlive(t)
			return R(r)
		}
	}}
}

func fn23[R result, A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, P, Q, S, T, U, V, W, X word](name string, f *func(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, P, Q, S, T, U, V, W, X) R) symbol {
	return symbol{name, func(addr uintptr) {
		*f = func(a A, b B, c C, d D, e E, f F, g G, h H, i I, j J, k K, l L, m M, n N, o O, p P, q Q, s S, t T, u U, v V, w W, x X) R {
			r := sys(addr, uintptr(a), uintptr(b), uintptr(c), uintptr(d), uintptr(e), uintptr(f), uintptr(g), uintptr(h), uintptr(i), uintptr(j), uintptr(k), uintptr(l), uintptr(m), uintptr(n), uintptr(o), uintptr(p), uintptr(q), uintptr(s), uintptr(t), uintptr(u), uintptr(v), uintptr(w), uintptr(x))
			runtime.KeepAlive(a)
			runtime.KeepAlive(b)
			runtime.KeepAlive(c)
			runtime.KeepAlive(d)
			runtime.KeepAlive(e)
			runtime.KeepAlive(f)
			runtime.KeepAlive(g)
			runtime.KeepAlive(h)
			runtime.KeepAlive(i)
			runtime.KeepAlive(j)
			runtime.KeepAlive(k)
			runtime.KeepAlive(l)
			runtime.KeepAlive(m)
			runtime.KeepAlive(n)
			runtime.KeepAlive(o)
			runtime.KeepAlive(p)
			runtime.KeepAlive(q)
			runtime.KeepAlive(s)
			runtime.KeepAlive(t)
			runtime.KeepAlive(u)
			runtime.KeepAlive(v)
			runtime.KeepAlive(w)
			runtime.KeepAlive(x)
			return R(r)
		}
	}}
}
