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

// TestCUDAChannelsLastMatchesChannelsFirst allows for cuDNN's algorithms,
// which differ between the layouts (TF32 in F32).
func TestCUDAChannelsLastMatchesChannelsFirst(t *testing.T) {
	testChannelsLast(t, testdev.CUDA(t), 1e-2)
}

func TestCUDAGPTMatchesFloat64Reference(t *testing.T) { testGPTMatchesReference(t, testdev.CUDA(t)) }

func TestCUDAGPTGenerateMatchesFullForward(t *testing.T) { testGPTGenerate(t, testdev.CUDA(t)) }
