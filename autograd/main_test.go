package autograd_test

import (
	"os"
	"testing"

	"github.com/leangrad/leangrad/internal/testdev"
)

// TestMain fails the run if a test leaves a tensor unreleased.
func TestMain(m *testing.M) { os.Exit(testdev.RunWithoutLeaks(m)) }
