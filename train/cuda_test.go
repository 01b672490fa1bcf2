package train

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

func TestCUDANoGrowthOverManySteps(t *testing.T) { onCUDA(t, TestNoGrowthOverManySteps) }
func TestCUDASaveResumeContinuesExactly(t *testing.T) {
	onCUDA(t, TestSaveResumeContinuesExactly)
}
func TestCUDAMeasuredSavings(t *testing.T) {
	measureBatch = 128
	defer func() { measureBatch = 16 }()
	onCUDA(t, TestMeasuredSavings)
}
func TestCUDAMLPFashionMNIST(t *testing.T) { onCUDA(t, TestMLPFashionMNIST) }
