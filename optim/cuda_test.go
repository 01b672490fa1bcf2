package optim

import (
	"testing"

	"github.com/leangrad/leangrad/kernels/cuda"
	"github.com/leangrad/leangrad/tensor"
)

func TestCUDAOptimizers(t *testing.T) {
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
	t.Run("sgd", TestSGD)
	t.Run("adamw", TestAdamW)
	t.Run("scaler", TestGradScaler)
}
