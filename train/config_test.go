package train

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/leangrad/leangrad/nn"
)

// TestAMPReadsItsNamesAndOldCheckpoints: AMP reads and writes none, f16
// and bf16 (and nothing else, naming the choices); a Config reads back as it
// was written, and also as checkpoints written before AMP was one value
// and a language model's steps were steps wrote it.
func TestAMPReadsItsNamesAndOldCheckpoints(t *testing.T) {
	for _, c := range []struct {
		text string
		want AMP
	}{{"none", NoAMP}, {"", NoAMP}, {"f16", AMPF16}, {"bf16", AMPBF16}} {
		var a AMP
		if err := a.UnmarshalText([]byte(c.text)); err != nil || a != c.want {
			t.Errorf("%q: %v, %v; want %v", c.text, a, err, c.want)
		}
	}
	for _, bad := range []string{"f32", "fp16", "i32", "half"} {
		var a AMP
		if err := a.UnmarshalText([]byte(bad)); err == nil || !strings.Contains(err.Error(), "bf16") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	cfg := Config{Model: "gpt-mini", AMP: AMPBF16, Checkpoint: nn.CheckpointSqrt, Steps: 200, WarmupSteps: 20, EvalEvery: 100}
	data, err := json.Marshal(cfg)
	if err != nil || !strings.Contains(string(data), `"amp":"bf16"`) || !strings.Contains(string(data), `"checkpoint":"sqrt"`) {
		t.Fatalf("%s, %v", data, err)
	}
	var back Config
	if err := json.Unmarshal(data, &back); err != nil || back != cfg {
		t.Errorf("read back as %+v, %v; want %+v", back, err, cfg)
	}
	old := `{"model":"gpt-mini","epochs":2,"warmup_epochs":0.2,"amp":true,"amp_dtype":"bf16","checkpoint":"blocks","eval_every":100}`
	if err := json.Unmarshal([]byte(old), &back); err != nil {
		t.Fatal(err)
	}
	if back.AMP != AMPBF16 || back.Checkpoint != nn.CheckpointBlocks || back.Steps != 200 || back.WarmupSteps != 20 || back.Epochs != 0 || back.Periods() != 2 {
		t.Errorf("an old text run's checkpoint read as %+v", back)
	}
	if err := json.Unmarshal([]byte(`{"model":"mlp","epochs":3,"amp":false}`), &back); err != nil || back.AMP != NoAMP || back.Periods() != 3 {
		t.Errorf("an old image run's: %+v, %v", back, err)
	}
}

// TestModelNameRefusesWhatTheRegistryLacks: the flag type of model names
// takes what LookupArch knows, "resnet" among them, and refuses the rest
// naming the choices.
func TestModelNameRefusesWhatTheRegistryLacks(t *testing.T) {
	var m ModelName
	for _, ok := range []string{"resnet", "resnet56", "resnet18", "mlp", "gpt", "gpt-mini", "gpt2"} {
		if err := m.Set(ok); err != nil || m.String() != ok {
			t.Errorf("%s: %v", ok, err)
		}
	}
	if a := ModelName("resnet").Arch(); a.Name != "resnet20" {
		t.Errorf("resnet is %s, want resnet20", a.Name)
	}
	for _, bad := range []string{"vgg", "resnet21", "resnet", "gpt3"} {
		if bad == "resnet" {
			continue
		}
		if err := m.Set(bad); err == nil || !strings.Contains(err.Error(), ModelNames) {
			t.Errorf("%s: %v", bad, err)
		}
	}
	if got := LanguageModels(); len(got) != 10 || got[0] != "gpt" || !slices.Contains(got, "gpt3-6.7b") {
		t.Errorf("LanguageModels = %v", got)
	}
	for _, name := range GPTFamily() { // the presets of GPT-2's and GPT-3's shapes, each known
		if a, err := LookupArch(name); err != nil || !a.Text || !strings.HasPrefix(name, "gpt2") && !strings.HasPrefix(name, "gpt3") {
			t.Errorf("GPTFamily's %s: %v", name, err)
		}
	}
	if n := len(GPTFamily()); n != 7 {
		t.Errorf("GPTFamily has %d presets, want GPT-2's four and GPT-3's three", n)
	}
}
