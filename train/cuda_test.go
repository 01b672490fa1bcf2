package train

import (
	"testing"

	"github.com/leangrad/leangrad/internal/testdev"
)

func TestCUDANoGrowthOverManySteps(t *testing.T) {
	testdev.On(t, &testDevice, TestNoGrowthOverManySteps)
}
func TestCUDASaveResumeContinuesExactly(t *testing.T) {
	testdev.On(t, &testDevice, TestSaveResumeContinuesExactly)
}
func TestCUDAMLPFashionMNIST(t *testing.T) { testdev.On(t, &testDevice, TestMLPFashionMNIST) }

func TestCUDAMeasuredSavings(t *testing.T) {
	measureBatch = 128
	defer func() { measureBatch = 16 }()
	testdev.On(t, &testDevice, TestMeasuredSavings)
}
