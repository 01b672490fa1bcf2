package cuda

import (
	"testing"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/memory"
)

// TestLtEpilogue: which of cuBLASLt's epilogues each epilogue maps to, and
// what runs unfused (Note [the fused epilogues]): strict F32's GELU′ by
// measurement, another activation, and GELU with N not a multiple of 8.
func TestLtEpilogue(t *testing.T) {
	vec := kernels.Buf{Block: new(memory.Block), N: 8, DType: kernels.F32} // valid; never read
	for _, c := range []struct {
		name          string
		ab            kernels.DType
		n             int
		e             kernels.Epilogue
		sums, strict  bool
		want          int32
		fused, refuse bool
	}{
		{"bf16 gelu′", kernels.BF16, 64, kernels.Epilogue{Act: kernels.GELU, Grad: true}, false, true, ltEpilogueDGELU, false, false},
		{"bf16 gelu′ with sums", kernels.BF16, 64, kernels.Epilogue{Act: kernels.GELU, Grad: true, BiasGrad: vec}, true, true, ltEpilogueDGELUBGrad, true, false},
		{"strict f32 gelu′", kernels.F32, 64, kernels.Epilogue{Act: kernels.GELU, Grad: true}, false, true, 0, false, true},
		{"tf32 gelu′", kernels.F32, 64, kernels.Epilogue{Act: kernels.GELU, Grad: true}, false, false, ltEpilogueDGELU, false, false},
		{"f32 bias+gelu", kernels.F32, 64, kernels.Epilogue{Act: kernels.GELU, Bias: vec}, false, true, ltEpilogueGELUAuxB, false, false},
		{"f32 bias", kernels.F32, 64, kernels.Epilogue{Bias: vec}, false, true, ltEpilogueBias, false, false},
		{"tanh", kernels.BF16, 64, kernels.Epilogue{Act: kernels.Tanh}, false, true, 0, false, true},
		{"gelu, odd N", kernels.BF16, 12, kernels.Epilogue{Act: kernels.GELU}, false, true, 0, false, true},
	} {
		epi, fused, why := ltEpilogue(gemmCall{m: 16, n: c.n, k: 16, ab: c.ab, cType: c.ab}, c.e, c.sums, c.strict)
		if (why != "") != c.refuse || epi != c.want || fused != c.fused {
			t.Errorf("%s: epilogue %d, fused %v, why %q; want %d, %v, refused %v", c.name, epi, fused, why, c.want, c.fused, c.refuse)
		}
	}
}
