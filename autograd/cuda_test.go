package autograd_test

import (
	"testing"

	"github.com/leangrad/leangrad/kernels/cuda"
	"github.com/leangrad/leangrad/tensor"
)

// cudaDevice opens cuda:0 or skips the test, naming the reason.
func cudaDevice(t testing.TB) *tensor.Device {
	t.Helper()
	if err := cuda.Available(); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	d, err := tensor.Open("cuda:0")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// onDevice runs f with the tests' tensors made on dev.
func onDevice(dev *tensor.Device, f func()) {
	old := testDevice
	testDevice = func() *tensor.Device { return dev }
	defer func() { testDevice = old }()
	f()
}

func TestCUDAGradCheck(t *testing.T) {
	onDevice(cudaDevice(t), func() { TestGradCheck(t) })
}

func TestCUDAStepMemory(t *testing.T) {
	onDevice(cudaDevice(t), func() { TestStepMemory(t) })
}

func TestCUDABackwardFreesGraph(t *testing.T) {
	onDevice(cudaDevice(t), func() {
		TestBackwardFreesGraphAndRefusesSecondPass(t)
		TestDroppedGraphFreesSavedTensors(t)
	})
}
