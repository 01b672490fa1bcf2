package nn

import (
	"testing"

	"github.com/leangrad/leangrad/internal/testdev"
	"github.com/leangrad/leangrad/kernels/cuda"
	"github.com/leangrad/leangrad/tensor"
)

func TestCUDACheckpointMatchesPlain(t *testing.T) {
	testdev.On(t, &testDevice, TestCheckpointMatchesPlain)
}
func TestCUDASaveLoadRoundTrip(t *testing.T) { testdev.On(t, &testDevice, TestSaveLoadRoundTrip) }

// TestCUDAAMPSavesMemory measures what AMP saves on the GPU at batch 128,
// on a backend with lean convolution workspaces: with the fastest cuDNN
// algorithms, F16's tensor-core workspaces (larger than F32's) take back
// part of the saving (26% instead of 35% or more, measured on an H200), and
// that is cuDNN's choice, not the activations'.
func TestCUDAAMPSavesMemory(t *testing.T) {
	testdev.CUDA(t)
	be, err := cuda.OpenSeparate(0, cuda.Options{LeanConvWorkspace: true})
	if err != nil {
		t.Fatal(err)
	}
	lean := tensor.NewDevice(be)
	old := testDevice
	testDevice = func() *tensor.Device { return lean }
	ampBatch = 128
	defer func() { testDevice, ampBatch = old, 16 }()
	TestAMPSavesMemory(t)
}
