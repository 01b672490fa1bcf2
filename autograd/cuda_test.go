package autograd_test

import (
	"testing"

	"github.com/leangrad/leangrad/internal/testdev"
)

func TestCUDAGradCheck(t *testing.T)          { testdev.On(t, &testDevice, TestGradCheck) }
func TestCUDAStepMemory(t *testing.T)         { testdev.On(t, &testDevice, TestStepMemory) }
func TestCUDAResNet20StepMemory(t *testing.T) { testdev.On(t, &testDevice, TestResNet20StepMemory) }
func TestCUDABackwardFreesGraph(t *testing.T) {
	testdev.On(t, &testDevice, func(t *testing.T) {
		TestBackwardFreesGraphAndRefusesSecondPass(t)
		TestDroppedGraphFreesSavedTensors(t)
	})
}
