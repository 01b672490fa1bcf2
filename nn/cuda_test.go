package nn

import (
	"testing"

	"github.com/leangrad/leangrad/kernels/cuda"
	"github.com/leangrad/leangrad/tensor"
)

func onCUDA(t *testing.T, f func(*testing.T)) {
	if err := cuda.Available(); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	d, err := tensor.Open("cuda:0")
	if err != nil {
		t.Fatal(err)
	}
	old := testDevice
	testDevice = func() *tensor.Device { return d }
	defer func() { testDevice = old }()
	f(t)
}

func TestCUDACheckpointMatchesPlain(t *testing.T) { onCUDA(t, TestCheckpointMatchesPlain) }
func TestCUDAAMPSavesMemory(t *testing.T) {
	ampBatch = 128
	defer func() { ampBatch = 16 }()
	onCUDA(t, TestAMPSavesMemory)
}
func TestCUDASaveLoadRoundTrip(t *testing.T) { onCUDA(t, TestSaveLoadRoundTrip) }
