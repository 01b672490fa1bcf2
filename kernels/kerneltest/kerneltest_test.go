package kerneltest

import (
	"strings"
	"testing"
)

// TestUncoveredNamesWhatNoCaseRan: the check a whole conformance run ends
// with names a method no case called, its family's interface and the file
// its case belongs in, and nothing else.
func TestUncoveredNamesWhatNoCaseRan(t *testing.T) {
	got := Uncovered(func(m string) bool { return m != "Transpose" && m != "Attention" })
	if len(got) != 2 || !strings.HasPrefix(got[0], "CopyOps.Transpose (") || !strings.Contains(got[0], "kerneltest/copy.go") ||
		!strings.HasPrefix(got[1], "TransformerOps.Attention (") {
		t.Errorf("Uncovered = %q, want CopyOps.Transpose and TransformerOps.Attention", got)
	}
	if got := Uncovered(func(string) bool { return true }); len(got) != 0 {
		t.Errorf("everything ran, and Uncovered = %q", got)
	}
}
