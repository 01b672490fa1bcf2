package cuda

import (
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// ptxParam is one parameter of a kernel in the PTX: its type (u32, u64,
// f32, ... or b8 for bytes), the size of a byte array, and its alignment.
type ptxParam struct {
	typ         string
	size, align int
	text        string
}

var (
	ptxEntry   = regexp.MustCompile(`(?s)\.entry\s+(\w+)\s*\((.*?)\)`)
	ptxParamRE = regexp.MustCompile(`\.param\s+(?:\.ptr\s+)?(?:\.\w+\s+)*?(?:\.align\s+(\d+)\s+)?\.(u8|u16|u32|u64|s32|s64|f32|f64|b8|b16|b32|b64)\s+\w+(?:\[(\d+)\])?`)
)

// parsePTX returns each kernel's parameter list.
func parsePTX(ptx string) map[string][]ptxParam {
	entries := map[string][]ptxParam{}
	for _, m := range ptxEntry.FindAllStringSubmatch(ptx, -1) {
		var ps []ptxParam
		for _, pm := range ptxParamRE.FindAllStringSubmatch(m[2], -1) {
			p := ptxParam{typ: pm[2], text: strings.TrimSpace(pm[0])}
			p.align, _ = strconv.Atoi(pm[1])
			if pm[3] != "" {
				p.size, _ = strconv.Atoi(pm[3])
			} else {
				bits, _ := strconv.Atoi(p.typ[1:])
				p.size = bits / 8
			}
			if p.align == 0 {
				p.align = p.size
			}
			ps = append(ps, p)
		}
		entries[m[1]] = ps
	}
	return entries
}

// checkParam says how a Go parameter differs from the PTX one ("" if not).
func checkParam(p param, q ptxParam) string {
	t := p.t
	want := ""
	switch t.Kind() {
	case reflect.Int32, reflect.Uint32:
		want = "u32 s32 b32"
	case reflect.Int64, reflect.Uint64, reflect.Uintptr:
		want = "u64 s64 b64"
	case reflect.Uint16, reflect.Int16:
		want = "u16 b16"
	case reflect.Float32:
		want = "f32"
	case reflect.Float64:
		want = "f64"
	case reflect.Struct, reflect.Array:
		want = "b8"
	default:
		return fmt.Sprintf("Go type %v cannot be a kernel parameter", t)
	}
	if !strings.Contains(" "+want+" ", " "+q.typ+" ") {
		return fmt.Sprintf("Go %v (%s) against PTX %q", t, want, q.text)
	}
	if int(t.Size()) != q.size || t.Align() != q.align {
		return fmt.Sprintf("Go %v of %d bytes aligned to %d against PTX %q (%d bytes aligned to %d)", t, t.Size(), t.Align(), q.text, q.size, q.align)
	}
	return ""
}

// checkDecl lists the mismatches between a declaration and the PTX.
func checkDecl(d *kernelDecl, entries map[string][]ptxParam) []string {
	var errs []string
	for _, name := range d.symbols() {
		ps, ok := entries[name]
		if !ok {
			errs = append(errs, fmt.Sprintf("kernel %s is declared in Go (%v) but not in the CUDA source", name, d.args))
			continue
		}
		if len(ps) != len(d.params) {
			errs = append(errs, fmt.Sprintf("kernel %s: %d parameters in Go (%v), %d in the CUDA source", name, len(d.params), d.args, len(ps)))
			continue
		}
		for i, p := range d.params {
			if why := checkParam(p, ps[i]); why != "" {
				errs = append(errs, fmt.Sprintf("kernel %s parameter %d (%s): %s", name, i, p.name, why))
			}
		}
	}
	return errs
}

// modulePTX is the entries of the module's PTX (compute_90's: the
// parameter lists are every architecture's).
func modulePTX(t *testing.T) map[string][]ptxParam {
	t.Helper()
	ptxEntries := parsePTX(moduleSM90(t).ptx)
	if len(ptxEntries) < 20 {
		t.Fatalf("the PTX holds %d kernels: the parser missed them", len(ptxEntries))
	}
	return ptxEntries
}

// TestKernelSignatures holds every kernel declared in Go to its parameter
// list in the compiled module, and every kernel of the module to a Go
// declaration (Note [typed launches]).
func TestKernelSignatures(t *testing.T) {
	entries := modulePTX(t)
	declared := map[string]bool{}
	for _, d := range kernelDecls {
		for _, e := range checkDecl(d, entries) {
			t.Error(e)
		}
		for _, s := range d.symbols() {
			declared[s] = true
		}
	}
	var orphans []string
	for name := range entries {
		if !declared[name] {
			orphans = append(orphans, name)
		}
	}
	sort.Strings(orphans)
	for _, name := range orphans {
		t.Errorf("kernel %s is in the CUDA source but has no Go declaration (declareKernel or declareTyped)", name)
	}
}

// TestSignatureCheckCatchesMismatch declares launchers that disagree with
// their kernels, the way a hand-edited argument list would, and requires
// the check to name each one.
func TestSignatureCheckCatchesMismatch(t *testing.T) {
	entries := modulePTX(t)
	type (
		swapped struct { // unary's Op and N swapped
			N    int64
			Op   int32
			X, Y uintptr
		}
		short struct { // affine without beta
			N     int64
			X, Y  uintptr
			Alpha float32
		}
		floatForInt struct { // argmax's Outer as a float
			Outer      float32
			Len, Inner int32
			X, Y       uintptr
		}
		wrongStruct struct { // binary's broadcast as a 5-dimensional one
			Op      int32
			N       int64
			Bc      struct{ ndim, shape, sa, sb [5]int32 }
			A, B, Y uintptr
		}
	)
	for _, c := range []struct {
		d    *kernelDecl
		want string
	}{
		{mismatch[swapped]("unary", true), "parameter 0 (N)"},
		{mismatch[short]("affine", true), "4 parameters in Go"},
		{mismatch[floatForInt]("argmax", true), "parameter 0 (Outer)"},
		{mismatch[wrongStruct]("binary", true), "parameter 2 (Bc)"},
		{mismatch[incrementArgs]("no_such_kernel", false), "not in the CUDA source"},
	} {
		errs := checkDecl(c.d, entries)
		if len(errs) == 0 || !strings.Contains(strings.Join(errs, "\n"), c.want) {
			t.Errorf("%s declared as %v: the check said %q, want a complaint naming %q", c.d.name, c.d.args, errs, c.want)
		}
	}
}

// mismatch is a declaration outside the registry, for the test above.
func mismatch[A any](name string, typed bool) *kernelDecl {
	t := reflect.TypeFor[A]()
	return &kernelDecl{name: name, typed: typed, args: t, params: flatten(t, 0)}
}

// TestLaunchConfigLayout holds launchConfig and launchAttr to the driver's
// CUlaunchConfig and CUlaunchAttribute (cuda.h, 64-bit): cuLaunchKernelEx
// reads them by offset.
func TestLaunchConfigLayout(t *testing.T) {
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(CUlaunchConfig)", unsafe.Sizeof(launchConfig{}), 56},
		{"offsetof(CUlaunchConfig, sharedMemBytes)", unsafe.Offsetof(launchConfig{}.shared), 24},
		{"offsetof(CUlaunchConfig, hStream)", unsafe.Offsetof(launchConfig{}.stream), 32},
		{"offsetof(CUlaunchConfig, attrs)", unsafe.Offsetof(launchConfig{}.attrs), 40},
		{"offsetof(CUlaunchConfig, numAttrs)", unsafe.Offsetof(launchConfig{}.numAttrs), 48},
		{"sizeof(CUlaunchAttribute)", unsafe.Sizeof(launchAttr{}), 72},
		{"offsetof(CUlaunchAttribute, value)", unsafe.Offsetof(launchAttr{}.value), 8},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
}
