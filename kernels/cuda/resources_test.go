package cuda

import (
	"slices"
	"testing"
)

func TestParsePtxasLog(t *testing.T) {
	for _, tc := range []struct {
		name, log string
		want      []KernelUse
	}{
		{"none", "", nil},
		{"two kernels, the second spilling", `ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'fill_f32' for 'sm_90'
ptxas info    : Function properties for fill_f32
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, 368 bytes cmem[0]
ptxas info    : Compiling entry function 'layernorm_bwd_mixed_bf16' for 'sm_90'
ptxas info    : Function properties for layernorm_bwd_mixed_bf16
ptxas         .     72 bytes stack frame, 248 bytes spill stores, 240 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 32768 bytes smem, 424 bytes cmem[0]
`, []KernelUse{{Name: "fill_f32", Registers: 10}, {Name: "layernorm_bwd_mixed_bf16", Registers: 128, SpillStores: 248, SpillLoads: 240, Stack: 72, Shared: 32768}}},
		{"lines before any kernel", "ptxas info    : Used 7 registers\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ParsePtxasLog(tc.log); !slices.Equal(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestKernelResources: every kernel of the backend's source compiled for
// sm_90 is reported with the registers ptxas gave it, layer norm's backward
// among them.
func TestKernelResources(t *testing.T) {
	log := moduleSM90(t).log
	uses := ParsePtxasLog(log)
	found := false
	for _, k := range uses {
		if k.Registers <= 0 {
			t.Errorf("%s: %d registers", k.Name, k.Registers)
		}
		found = found || k.Name == "layernorm_bwd_mixed_bf16"
	}
	if !found || len(uses) < 100 {
		t.Errorf("%d kernels reported, layer norm's backward among them: %v; want it and at least 100", len(uses), found)
	}
}
