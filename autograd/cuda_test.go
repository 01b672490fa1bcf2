package autograd_test

import (
	"testing"

	"github.com/leangrad/leangrad/internal/testdev"
)

// The CPU tests' bodies, on the GPU.

func TestCUDAGradCheck(t *testing.T)          { testGradCheck(t, testdev.CUDA(t)) }
func TestCUDAStepMemory(t *testing.T)         { testStepMemory(t, testdev.CUDA(t)) }
func TestCUDAResNet20StepMemory(t *testing.T) { testResNet20StepMemory(t, testdev.CUDA(t)) }
func TestCUDALayerNormToIsACastOfLayerNorm(t *testing.T) {
	testLayerNormToIsACastOfLayerNorm(t, testdev.CUDA(t))
}
func TestCUDALayerNormFoldsTheResidualGradient(t *testing.T) {
	testLayerNormFoldsTheResidualGradient(t, testdev.CUDA(t))
}
func TestCUDALayerNormRoundsTheGradientForAProduct(t *testing.T) {
	testLayerNormRoundsTheGradientForAProduct(t, testdev.CUDA(t).Backend())
}
func TestCUDABackwardFreesGraph(t *testing.T) {
	dev := testdev.CUDA(t)
	testBackwardFreesGraphAndRefusesSecondPass(t, dev)
	testDroppedGraphFreesSavedTensors(t, dev)
}
