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

// The step's tests on the GPU, captured.
func onCUDACaptured(t *testing.T, f func(*testing.T)) {
	planMode = Captured
	defer func() { planMode = Planned }()
	testdev.On(t, &testDevice, f)
}

func TestCUDAPlannedStepsMatchEager(t *testing.T)  { onCUDACaptured(t, TestPlannedStepsMatchEager) }
func TestCUDAPlannedStepMemory(t *testing.T)       { onCUDACaptured(t, TestPlannedStepMemory) }
func TestCUDAInfSkipsStepAsEagerDoes(t *testing.T) { onCUDACaptured(t, TestInfSkipsStepAsEagerDoes) }
func TestCUDADropoutMasksDifferBetweenSteps(t *testing.T) {
	onCUDACaptured(t, TestDropoutMasksDifferBetweenSteps)
}
func TestCUDAStepReadsNothing(t *testing.T) { onCUDACaptured(t, TestStepReadsNothing) }
