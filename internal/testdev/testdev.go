// Package testdev gives tests the GPU: CUDA opens cuda:0 or skips the test,
// naming why, so that the same test binaries pass on CPU-only machines.
package testdev

import (
	"testing"

	"github.com/leangrad/leangrad/kernels/cuda"
	"github.com/leangrad/leangrad/tensor"
)

// CUDA returns the cuda:0 device, or skips t when there is no usable GPU.
func CUDA(t testing.TB) *tensor.Device {
	t.Helper()
	if err := cuda.Available(); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	d, err := tensor.Open("cuda:0")
	if err != nil {
		t.Fatalf("cuda:0 is present but does not open: %v", err)
	}
	return d
}

// On runs f with *device set to the GPU's device (skipping t without one),
// restoring it afterwards: how a package runs its CPU tests on CUDA.
func On(t *testing.T, device *func() *tensor.Device, f func(*testing.T)) {
	t.Helper()
	d := CUDA(t)
	old := *device
	*device = func() *tensor.Device { return d }
	defer func() { *device = old }()
	f(t)
}
