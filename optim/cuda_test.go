package optim

import (
	"testing"

	"github.com/leangrad/leangrad/internal/testdev"
)

func TestCUDAOptimizers(t *testing.T) {
	testdev.On(t, &testDevice, func(t *testing.T) {
		t.Run("sgd", TestSGD)
		t.Run("adamw", TestAdamW)
		t.Run("scaler", TestGradScaler)
	})
}
