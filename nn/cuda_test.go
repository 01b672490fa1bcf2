package nn

import (
	"testing"

	"github.com/leangrad/leangrad/internal/testdev"
	"github.com/leangrad/leangrad/tensor"
)

// TestCUDACheckpointMatchesPlain runs at batch 64, on lean convolution
// workspaces: at batch 8 sqrt(n) segments save about 2% of the peak (on the
// CPU), and on an H200 the workspaces outweighed that (+1%, and +0.6% with
// lean workspaces, measured 2026-11-30); at 64 they save about a quarter.
func TestCUDACheckpointMatchesPlain(t *testing.T) {
	testCheckpointMatchesPlain(t, testdev.CUDAWith(t, tensor.Options{LeanConvWorkspace: true}), 64)
}

func TestCUDASaveLoadRoundTrip(t *testing.T) { testSaveLoadRoundTrip(t, testdev.CUDA(t)) }

// TestCUDAAMPSavesMemory measures what AMP saves on the GPU at batch 128,
// on a backend with lean convolution workspaces: with the fastest cuDNN
// algorithms, F16's tensor-core workspaces (larger than F32's) take back
// part of the saving (26% instead of 35% or more, measured on an H200), and
// that is cuDNN's choice, not the activations'.
func TestCUDAAMPSavesMemory(t *testing.T) {
	testAMPSavesMemory(t, testdev.CUDAWith(t, tensor.Options{LeanConvWorkspace: true}), 128)
}

// TestCUDAChannelsLastMatchesChannelsFirst keeps F32 convolutions strict
// (StrictConvF32): cuDNN's algorithms differ between the layouts, and
// TF32's rounding in them can move a batch-norm weight's gradient by more
// than the 1% allowed (5.9% seen on an H200), which says nothing of the
// layout; strict, the F32 runs differ by F32's rounding alone, and the AMP
// runs are measured against that reference.
func TestCUDAChannelsLastMatchesChannelsFirst(t *testing.T) {
	testChannelsLast(t, testdev.CUDAWith(t, tensor.Options{StrictConvF32: true}), 1e-2)
}

func TestCUDAGPTMatchesFloat64Reference(t *testing.T) { testGPTMatchesReference(t, testdev.CUDA(t)) }

func TestCUDAGPTGenerateMatchesFullForward(t *testing.T) { testGPTGenerate(t, testdev.CUDA(t)) }

// TestCUDAGPTForwardPagedMatchesForward: the paged forward on the GPU, in
// F32 (its products at F32's accuracy) and under bf16 autocast (keys,
// values and products in bf16, held to bf16's rounding of logits near 1).
func TestCUDAGPTForwardPagedMatchesForward(t *testing.T) {
	dev := testdev.CUDA(t)
	t.Run("f32", func(t *testing.T) { testGPTForwardPaged(t, dev, 0, 1e-4) })
	t.Run("bf16", func(t *testing.T) { testGPTForwardPaged(t, dev, tensor.BF16, 0.1) })
}
