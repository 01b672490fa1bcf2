package kernels

import (
	"fmt"
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

// TestBufAs: a buffer read as another type of its size keeps its memory,
// offset and length; of another size it panics naming both types.
func TestBufAs(t *testing.T) {
	b := Buf{Off: 12, N: 5, DType: I32}
	for _, c := range []struct {
		to    DType
		panic string
	}{{F32, ""}, {I32, ""}, {BF16, "a i32 buffer read as bf16"}, {F16, "their sizes differ"}} {
		func() {
			defer func() {
				msg := fmt.Sprint(recover())
				if c.panic == "" && msg != "<nil>" || c.panic != "" && !strings.Contains(msg, c.panic) {
					t.Errorf("As(%v): panic %q, want %q", c.to, msg, c.panic)
				}
			}()
			if got := b.As(c.to); got.Off != 12 || got.N != 5 || got.DType != c.to || got.Block != b.Block {
				t.Errorf("As(%v) = %+v", c.to, got)
			}
		}()
	}
}
