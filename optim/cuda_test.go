package optim

import (
	"testing"

	"github.com/leangrad/leangrad/internal/testdev"
)

func TestCUDAOptimizers(t *testing.T) {
	dev := testdev.CUDA(t)
	t.Run("sgd", func(t *testing.T) { testSGD(t, dev) })
	t.Run("adamw", func(t *testing.T) { testAdamW(t, dev) })
	t.Run("scaler", func(t *testing.T) { testGradScaler(t, dev) })
	t.Run("no-decay-groups", func(t *testing.T) { testNoDecayGroups(t, dev) })
	t.Run("clip-grad-norm", func(t *testing.T) { testClipGradNorm(t, dev) })
	t.Run("step-clipped", func(t *testing.T) { testStepClipped(t, dev) })
}

// TestCUDAOffloaded: AdamW and SGD with their state in host memory follow
// the GPU's own within rounding (the host's arithmetic is the CPU
// backend's), and the GPU holds none of their state.
func TestCUDAOffloaded(t *testing.T) { testOffloaded(t, testdev.CUDA(t), 1e-5) }
