package cuda

import (
	"errors"
	"os"
	"strings"
	"testing"
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

// TestKernelsCompile compiles every kernel with whatever NVRTC this machine
// has (no GPU is needed), for the architectures leangrad targets.
func TestKernelsCompile(t *testing.T) {
	needNVRTC(t)
	for _, arch := range []string{"sm_80", "sm_90"} {
		cubin, err := Compile(Source(), arch)
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
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

// TestFlashWGMMAOnSM90a checks that every flash kernel takes its warpgroup
// path on sm_90a and only there: its PTX issues wgmma.mma_async on
// compute_90a and none on compute_90 or compute_80. It needs NVRTC 12 or
// later (CI's is 11.8, which has no sm_90a; the GPU machine's runs it).
func TestFlashWGMMAOnSM90a(t *testing.T) {
	needNVRTC(t)
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
			if !strings.HasPrefix(entry, "flash_") {
				continue
			}
			kernels++
			name, _, _ := strings.Cut(entry, "(")
			if got := strings.Contains(entry, "wgmma.mma_async"); got != c.wgmma {
				t.Errorf("%s: %s issues wgmma: %v, want %v", c.arch, name, got, c.wgmma)
			}
		}
		if kernels != 6 {
			t.Errorf("%s: %d flash kernels, want 6 (forward, backward kv and q; f16 and bf16)", c.arch, kernels)
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
