// Package testdev gives tests the GPU: CUDA opens cuda:0 or skips the test,
// naming why, so that the same test binaries pass on CPU-only machines.
//
// A behaviour has one test body that takes the device (and whatever differs
// between devices, such as a batch size, as arguments): TestX runs it on
// tensor.CPU(), TestCUDAX on CUDA(t). No package global is swapped, so
// tests may run in parallel.
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
