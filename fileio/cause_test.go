package fileio

import (
	"errors"
	"io/fs"
	"os"
	"testing"
)

func TestCause(t *testing.T) {
	_, err := os.Stat("/nonexistent/leangrad")
	if got := Cause(err); !errors.Is(got, fs.ErrNotExist) || got.Error() != "no such file or directory" {
		t.Errorf("Cause(%v) = %v", err, got)
	}
	other := errors.New("other")
	if Cause(other) != other {
		t.Error("Cause changed an error that is not a path error")
	}
}
