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

func TestCompileErrorCarriesLog(t *testing.T) {
	needNVRTC(t)
	_, err := Compile("extern \"C\" __global__ void k() { undefined_thing(); }", "sm_90")
	var ce *CompileError
	if !errors.As(err, &ce) || !strings.Contains(ce.Log, "undefined_thing") {
		t.Fatalf("err = %v, want a CompileError whose log names the undefined identifier", err)
	}
}
