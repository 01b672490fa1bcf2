package cuda

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/leangrad/leangrad/internal/race"
)

// needNVRTC skips t on a machine without NVRTC, or fails it where
// LEANGRAD_REQUIRE_NVRTC says NVRTC must be there (CI installs it).
func needNVRTC(t *testing.T) {
	t.Helper()
	if _, err := loadNVRTC(); err != nil {
		if os.Getenv("LEANGRAD_REQUIRE_NVRTC") != "" {
			t.Fatalf("NVRTC is required here (LEANGRAD_REQUIRE_NVRTC) but does not load: %v", err)
		}
		t.Skipf("no NVRTC on this machine: %v", err)
	}
}

// needModule is needNVRTC for a test of the whole module compiled, which
// leaves the race detector's run to CI's run without it (.ci/run): a
// compile takes most of a minute on two cores, in NVRTC, where the
// detector sees nothing.
func needModule(t *testing.T) {
	t.Helper()
	race.Skip(t, "go test ./kernels/cuda -run 'TestKernel|TestSignature|TestFlashWGMMA'")
	needNVRTC(t)
}

// The module compiled once for sm_90, with ptxas's verbose log, a compile
// that takes most of a minute on two cores: its CUBIN and log
// (TestKernelsCompile, TestKernelResources) and its PTX
// (TestKernelsWaitFirst, TestKernelSignatures).
var (
	sm90Once sync.Once
	sm90     compiled
	sm90Err  error
)

// moduleSM90 is the module compiled for sm_90.
func moduleSM90(t *testing.T) compiled {
	t.Helper()
	needModule(t)
	sm90Once.Do(func() { sm90, sm90Err = compile(Source(), "sm_90", "--ptxas-options=-v") })
	if sm90Err != nil {
		t.Fatal(sm90Err)
	}
	return sm90
}

// TestKernelsCompile compiles every kernel with whatever NVRTC this machine
// has (no GPU is needed), for the architectures leangrad targets.
func TestKernelsCompile(t *testing.T) {
	needModule(t)
	var sm80 []byte
	var err error
	done := make(chan struct{})
	go func() { // beside sm_90's compile
		defer close(done)
		sm80, err = Compile(Source(), "sm_80")
	}()
	sm90 := moduleSM90(t).cubin
	<-done
	if err != nil {
		t.Fatalf("sm_80: %v", err)
	}
	for arch, cubin := range map[string][]byte{"sm_80": sm80, "sm_90": sm90} {
		if len(cubin) < 1000 || string(cubin[1:4]) != "ELF" {
			t.Errorf("%s: %d bytes that are not an ELF cubin", arch, len(cubin))
		}
	}
}

func TestTarget(t *testing.T) {
	for _, c := range []struct {
		arch  string
		nvrtc int
		want  string
	}{
		{"sm_90", 13, "sm_90a"},
		{"sm_90", 12, "sm_90a"},
		{"sm_90", 11, "sm_90"}, // NVRTC 11.8 knows sm_90 but not its wgmma
		{"sm_80", 13, "sm_80"},
		{"sm_100", 13, "sm_100"},
	} {
		if got := Target(c.arch, c.nvrtc); got != c.want {
			t.Errorf("Target(%q, %d) = %q, want %q", c.arch, c.nvrtc, got, c.want)
		}
	}
}

// TestFlashWGMMAOnSM90a checks that every F16 and BF16 flash kernel (the
// paged prefill's too) takes its warpgroup path on sm_90a and only there:
// its PTX issues wgmma.mma_async on compute_90a and none on compute_90 or
// compute_80. The F32 kernels' TF32 products are mma.sync everywhere. It
// needs NVRTC 12 or later (CI's is 11.8, which has no sm_90a; the GPU
// machine's runs it).
func TestFlashWGMMAOnSM90a(t *testing.T) {
	needModule(t)
	if n, _ := loadNVRTC(); n.major < 12 {
		t.Skipf("NVRTC %d.%d has no sm_90a", n.major, n.minor)
	}
	for _, c := range []struct {
		arch  string
		wgmma bool
	}{{"compute_90a", true}, {"compute_90", false}, {"compute_80", false}} {
		ptx, err := CompilePTX(Source(), c.arch)
		if err != nil {
			t.Fatalf("%s: %v", c.arch, err)
		}
		kernels := 0
		for _, entry := range strings.Split(ptx, ".entry ")[1:] {
			name, _, _ := strings.Cut(entry, "(")
			name = strings.TrimSpace(name)
			if !strings.HasPrefix(name, "flash_") && !strings.HasPrefix(name, "paged_flash_") || strings.HasSuffix(name, "_f32") {
				continue
			}
			kernels++
			if got := strings.Contains(entry, "wgmma.mma_async"); got != c.wgmma {
				t.Errorf("%s: %s issues wgmma: %v, want %v", c.arch, name, got, c.wgmma)
			}
		}
		if kernels != 8 {
			t.Errorf("%s: %d flash kernels, want 8 (forward, backward kv and q, paged; f16 and bf16)", c.arch, kernels)
		}
	}
}

func TestCompileErrorCarriesLog(t *testing.T) {
	needNVRTC(t)
	_, err := Compile("extern \"C\" __global__ void k() { undefined_thing(); }", "sm_90")
	var ce *CompileError
	if !errors.As(err, &ce) || !strings.Contains(ce.Log, "undefined_thing") {
		t.Fatalf("err = %v, want a CompileError whose log names the undefined identifier", err)
	}
}

// ptxMemoryOp matches a PTX instruction that reads or writes memory other
// than the kernel's parameters, predicated or not.
var ptxMemoryOp = regexp.MustCompile(`(?m)^\s*(?:@!?%\w+\s+)?(ld|ldu|st|atom|red|cp|ldmatrix|stmatrix|prefetch|tex|suld|sust|mbarrier)\.(\S+)`)

// waitLate names each kernel of ptx whose first memory access is not
// preceded by griddepcontrol.wait, or that never waits.
func waitLate(ptx string) []string {
	var late []string
	for _, entry := range strings.Split(ptx, ".entry ")[1:] {
		name, _, _ := strings.Cut(entry, "(")
		wait := strings.Index(entry, "griddepcontrol.wait")
		if wait < 0 || !strings.Contains(entry, "griddepcontrol.launch_dependents") {
			late = append(late, name+" (no griddepcontrol.wait and launch_dependents)")
			continue
		}
		for _, m := range ptxMemoryOp.FindAllStringSubmatchIndex(entry, -1) {
			if op := entry[m[2]:m[3]]; op == "ld" && strings.HasPrefix(entry[m[4]:m[5]], "param") {
				continue
			}
			if m[0] < wait {
				late = append(late, fmt.Sprintf("%s (%s before the wait)", name, strings.TrimSpace(entry[m[0]:m[1]])))
			}
			break
		}
	}
	return late
}

// TestKernelsWaitFirst checks Note [programmatic dependent launch]: on
// compute capability 9.0 every kernel of the module waits for the grids
// before it (griddepcontrol.wait) before it touches memory, and lets the
// next be placed; a kernel that read its input first could read it
// unfinished.
func TestKernelsWaitFirst(t *testing.T) {
	ptx := moduleSM90(t).ptx
	if n := strings.Count(ptx, ".entry "); n < 100 {
		t.Fatalf("the PTX holds %d kernels: the split missed them", n)
	}
	for _, e := range waitLate(ptx) {
		t.Errorf("kernel %s", e)
	}
}

// TestWaitFirstCatchesALateWait requires the check above to name a kernel
// that loads before it waits and one that never waits, and to pass one
// that waits first.
func TestWaitFirstCatchesALateWait(t *testing.T) {
	needNVRTC(t)
	ptx, err := CompilePTX(`
#define WAIT asm volatile("griddepcontrol.wait;" ::: "memory")
#define LAUNCH asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
extern "C" __global__ void first(float* x) { WAIT; LAUNCH; x[threadIdx.x] += 1.f; }
extern "C" __global__ void late(float* x) { float v = x[threadIdx.x]; WAIT; LAUNCH; x[threadIdx.x + 1] = v; }
extern "C" __global__ void never(float* x) { x[threadIdx.x] = 1.f; }
`, "compute_90")
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(waitLate(ptx), "; ")
	for _, want := range []string{"late (ld.global", "never (no griddepcontrol.wait"} {
		if !strings.Contains(got, want) {
			t.Errorf("waitLate = %q, want it to name %q", got, want)
		}
	}
	if strings.Contains(got, "first") {
		t.Errorf("waitLate = %q names first, which waits before it loads", got)
	}
}
