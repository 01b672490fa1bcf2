package benchmarks

import (
	"image/color"
	"strings"
	"testing"
)

// TestClaimsSayTheSignRight: a saving is "less", a cost "more", none "the
// same", in the claims' summaries.
func TestClaimsSayTheSignRight(t *testing.T) {
	for _, c := range []struct {
		saving float64
		want   string
	}{{0.3, "30% less"}, {-0.02, "2% more"}, {0.001, "the same"}, {-0.004, "the same"}} {
		if got := lessOrMore(c.saving); got != c.want {
			t.Errorf("lessOrMore(%v) = %q, want %q", c.saving, got, c.want)
		}
	}
	rs := []Result{
		{Engine: "leangrad", Model: "mlp", Batch: 4, Config: "fp32", PeakAllocated: 33 << 20 / 10},
		{Engine: "leangrad", Model: "mlp", Batch: 4, Config: "amp", PeakAllocated: 34 << 20 / 10, SavingVsFP32: -0.02},
	}
	if cs := ClaimsFromResults(rs, "mlp", 4); len(cs) != 1 || !strings.Contains(cs[0].Summary, "3.4 MiB with AMP vs 3.3 MiB in fp32 (2% more)") {
		t.Errorf("claims %+v", cs)
	}
}

// TestConfigColors: each configuration has its own colour, the same in
// every dtype of AMP.
func TestConfigColors(t *testing.T) {
	seen := map[color.Color]string{}
	for _, c := range []string{"fp32", "amp", "checkpoint", "amp+checkpoint"} {
		if other, ok := seen[ConfigColor(c)]; ok {
			t.Errorf("%s and %s share a colour", c, other)
		}
		seen[ConfigColor(c)] = c
	}
	if ConfigColor("bf16+checkpoint") != ConfigColor("amp+checkpoint") || ConfigColor("f16") != ConfigColor("amp") {
		t.Errorf("AMP's dtypes take other colours")
	}
}
