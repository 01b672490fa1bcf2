package train

import (
	"math"
	"strings"
	"testing"

	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
)

// TestGPTFamily: the presets have their published sizes (GPT-2's 355M,
// 774M and 1.56B; GPT-3's 1.3B, 2.7B and 6.7B) and any shape can be
// named; a malformed shape is refused naming what is wrong.
func TestGPTFamily(t *testing.T) {
	for _, c := range []struct {
		name   string
		params float64
	}{
		{"gpt2", 124.4e6}, {"gpt2-medium", 354.8e6}, {"gpt2-large", 774.0e6}, {"gpt2-xl", 1557.6e6},
		{"gpt3-1.3b", 1.3e9}, {"gpt3-2.7b", 2.7e9}, {"gpt3-6.7b", 6.7e9},
	} {
		a, err := LookupArch(c.name)
		if err != nil {
			t.Fatal(err)
		}
		if got := float64(a.GPT.Params()); math.Abs(got-c.params)/c.params > 0.03 {
			t.Errorf("%s: %.4gM parameters, want %.4gM", c.name, got/1e6, c.params/1e6)
		}
	}
	a, err := LookupArch("gpt:L32,W4096,H32,C2048")
	if err != nil || a.GPT != (nn.GPTConfig{Layers: 32, Width: 4096, Heads: 32, Context: 2048, Vocab: 50257}) || !a.Text || a.Input[0] != 2048 {
		t.Errorf("gpt:L32,W4096,H32,C2048: %+v, %v", a.GPT, err)
	}
	if b, err := LookupArch(a.GPT.String()); a.GPT.String() != "gpt:L32,W4096,H32,C2048,V50257" || err != nil || b.GPT != a.GPT { // a shape names itself as -model does
		t.Errorf("%v: looked up again %v, %v", a.GPT, b.GPT, err)
	}
	dev := tensor.CPU()
	small, err := LookupArch("gpt:L2,W32,H4,C16,V64")
	if err != nil {
		t.Fatal(err)
	}
	m, err := small.Build(dev, small.Input, small.Classes, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer nn.Release(m)
	if got, want := nn.CountParams(m), small.GPT.Params(); got != want {
		t.Errorf("gpt:L2,W32,H4,C16,V64 built with %d parameters, its shape says %d", got, want)
	}
	for _, c := range []struct{ name, want string }{
		{"gpt:L2,W30,H4", "gpt:L2,W30,H4,C1024,V50257: the width 30 is not a multiple of the 4 heads"},
		{"gpt:L2,W32", "want at least L (layers), W (width) and H (heads)"},
		{"gpt:L2,X3,W32,H4", `"X3" is not one of L`},
		{"gpt:L0,W32,H4", `"L0": want a positive number`},
		{"gpt:L16777216,W16777216,H1", "more parameters than an int counts"},
	} {
		if _, err := LookupArch(c.name); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want %q", c.name, err, c.want)
		}
	}
}

// TestArchBlocks: what the registry says of a model's blocks is what the
// model built checkpoints (the count -checkpoint-blocks is checked
// against before anything is built).
func TestArchBlocks(t *testing.T) {
	for _, c := range []struct {
		name   string
		blocks int
	}{{"mlp", 0}, {"resnet", 9}, {"resnet8", 3}, {"resnet56", 27}, {"resnet18", 8}, {"gpt-mini", 2}, {"gpt:L3,W32,H4,C16,V64", 3}} {
		a, err := LookupArch(c.name)
		if err != nil {
			t.Fatal(err)
		}
		m, err := a.Build(tensor.CPU(), a.Input, a.Classes, 1)
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		if ck, ok := m.(nn.Checkpointer); ok {
			got = ck.Checkpointable()
		}
		nn.Release(m)
		if a.Blocks != c.blocks || got != c.blocks {
			t.Errorf("%s: the registry says %d blocks, the model has %d; want %d", c.name, a.Blocks, got, c.blocks)
		}
	}
}
