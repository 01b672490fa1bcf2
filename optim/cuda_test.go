package optim

import (
	"testing"

	"github.com/leangrad/leangrad/internal/testdev"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
)

func TestCUDAOptimizers(t *testing.T) {
	dev := testdev.CUDA(t)
	t.Run("sgd", func(t *testing.T) { testSGD(t, dev) })
	t.Run("adamw", func(t *testing.T) { testAdamW(t, dev) })
	t.Run("adamw8bit", func(t *testing.T) { testAdamW8bit(t, dev) })
	t.Run("scaler", func(t *testing.T) { testGradScaler(t, dev) })
	t.Run("no-decay-groups", func(t *testing.T) { testNoDecayGroups(t, dev) })
	t.Run("clip-grad-norm", func(t *testing.T) { testClipGradNorm(t, dev) })
	t.Run("step-clipped", func(t *testing.T) { testStepClipped(t, dev) })
}

// TestCUDAOffloaded: AdamW and SGD with their state in host memory, the
// device's page-locked memory or the Go heap's, follow the GPU's own
// within rounding (the host's arithmetic is the CPU backend's), and the
// GPU holds none of their state.
func TestCUDAOffloaded(t *testing.T) {
	dev := testdev.CUDA(t)
	t.Run("page-locked", func(t *testing.T) { testOffloaded(t, dev, dev.Pinned(), 1e-5) })
	t.Run("pageable", func(t *testing.T) { testOffloaded(t, dev, tensor.CPU(), 1e-5) })
	for _, dt := range []tensor.DType{tensor.BF16, tensor.F16} {
		t.Run(dt.String()+" weights, page-locked", func(t *testing.T) { testOffloadedHalf(t, dev, dev.Pinned(), dt) })
	}
	t.Run("bf16 weights, pageable", func(t *testing.T) { testOffloadedHalf(t, dev, tensor.CPU(), tensor.BF16) })
	if n := dev.Pinned().Allocator().Stats().Allocated[memory.All].Current; n != 0 {
		t.Errorf("%d bytes of page-locked memory still allocated after the optimizers' release", n)
	}
}

// TestCUDAPerParameterMatchesStep: TestPerParameterMatchesStep on the GPU.
func TestCUDAPerParameterMatchesStep(t *testing.T) { testPerParameterMatchesStep(t, testdev.CUDA(t)) }
