package kernels

import (
	"strings"
	"testing"
)

// TestF32MatmulText: each mode reads back from its flag value, and a bad
// value's error names it and the choices.
func TestF32MatmulText(t *testing.T) {
	for _, m := range []F32Matmul{F32Strict, F32TF32x3, F32TF32} {
		text, _ := m.MarshalText()
		var got F32Matmul
		if err := got.UnmarshalText(text); err != nil || got != m {
			t.Errorf("%v: read back as %v, %v", m, got, err)
		}
	}
	var m F32Matmul
	if err := m.UnmarshalText([]byte("fast")); err == nil || !strings.Contains(err.Error(), `"fast"`) || !strings.Contains(err.Error(), "tf32x3") {
		t.Errorf("bad mode: %v", err)
	}
}
