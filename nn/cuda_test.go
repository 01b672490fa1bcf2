package nn

import (
	"testing"

	"github.com/leangrad/leangrad/internal/testdev"
)

func TestCUDACheckpointMatchesPlain(t *testing.T) {
	testdev.On(t, &testDevice, TestCheckpointMatchesPlain)
}
func TestCUDASaveLoadRoundTrip(t *testing.T) { testdev.On(t, &testDevice, TestSaveLoadRoundTrip) }

func TestCUDAAMPSavesMemory(t *testing.T) {
	ampBatch = 128
	defer func() { ampBatch = 16 }()
	testdev.On(t, &testDevice, TestAMPSavesMemory)
}
