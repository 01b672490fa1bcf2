package run

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
	"github.com/leangrad/leangrad/train"
)

// gpuNamed is the CPU backend under a GPU's name and kind: a device that
// is not the host's memory (tensor.Device.OnHost), as far as the plans of
// a run are concerned.
type gpuNamed struct{ *cpu.Backend }

func (gpuNamed) Name() string { return "cuda:0" }

func (g gpuNamed) Info() kernels.Info {
	in := g.Backend.Info()
	in.Kind, in.Name = kernels.KindCUDA, "cuda:0"
	return in
}

// TestBudgetOffloadsTheState: under -max-memory, a language model whose F32
// parameters, gradients and AdamW state pass the budget, and whose
// parameters and gradients alone do not, keeps its state in host memory,
// planned before anything is built, and names 8-bit AdamW where its state
// would fit on the device; otherwise the run is refused naming
// the sizes, and nothing moves on the CPU, where the user kept the state
// on the device, or for 8-bit moments (which stay on the device, in a
// quarter of the bytes).
func TestBudgetOffloadsTheState(t *testing.T) {
	tok, err := datasets.NewTokenizer(datasets.ByteTokens)
	if err != nil {
		t.Fatal(err)
	}
	arch, err := train.LookupArch("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	g := arch.GPT
	g.Vocab, g.Context = tok.Vocab(), contextOf(arch, 0)
	params := int64(g.Params())
	if host := memory.HostMemory(); params*16 > host {
		t.Skipf("the host has %s, less than the %s of gpt2's offloaded state", memory.Bytes(host), memory.Bytes(params*16))
	}
	gpu, host := tensor.NewDevice(gpuNamed{cpu.New()}), tensor.NewDevice(cpu.New())
	for _, c := range []struct {
		name      string
		dev       *tensor.Device
		optimizer string
		budget    int64
		keep      bool
		offload   bool
		says      string
	}{
		{"the state to the host", gpu, "adamw", params * 12, false, true,
			"on the device; -optimizer adamw8bit would keep its moments on the device in a quarter of the bytes"},
		{"everything fits", gpu, "adamw", params * 17, false, false, ""},
		{"no budget", gpu, "adamw", 0, false, false, ""},
		{"the gradients stream to the host", gpu, "adamw", params * 5, false, true, "the state goes to host memory (-offload-optimizer)"},
		{"8-bit moments would not fit either", gpu, "adamw", params * 9, false, true, "on the device\n"},
		{"the parameters alone too large", gpu, "adamw", params * 4, false, false, "more than the"},
		{"kept on the device", gpu, "adamw", params * 12, true, false,
			"(-offload-optimizer keeps the state in host memory; -optimizer adamw8bit holds AdamW's moments in a quarter of the bytes)"},
		{"8-bit moments fit", gpu, "adamw8bit", params * 11, false, false, ""},
		{"8-bit moments stay on the device", gpu, "adamw8bit", params * 9, false, false, "adamw8bit's state, more than the"},
		{"the CPU", host, "adamw", params * 12, false, false, "more than the"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var log bytes.Buffer
			job := Job{Config: train.Config{Model: "gpt2", Optimizer: c.optimizer, Batch: 1}, Text: &datasets.Corpus{Name: "t", Tokenizer: tok},
				MaxMemory: c.budget, KeepOptimizerOnDevice: c.keep}
			r := &runner{dev: c.dev, job: job, cfg: job.Config, say: &log}
			err := r.lookup()
			if r.cfg.OffloadOptimizer != c.offload {
				t.Errorf("OffloadOptimizer %v, want %v (error %v)", r.cfg.OffloadOptimizer, c.offload, err)
			}
			said := log.String()
			if err != nil {
				said = err.Error()
			}
			if c.offload || c.says == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
			} else if err == nil {
				t.Fatalf("not refused; said %q", said)
			}
			if !strings.Contains(said, c.says) {
				t.Errorf("said %q, want it to say %q", said, c.says)
			}
		})
	}
}

// TestHostTooSmallForTheOffloads: what the offloaded optimizer and the
// offloaded activations keep in host memory together, past the host's
// memory, is refused before anything is built, naming both and the sizes.
func TestHostTooSmallForTheOffloads(t *testing.T) {
	tok, err := datasets.NewTokenizer(datasets.ByteTokens)
	if err != nil {
		t.Fatal(err)
	}
	job := Job{Config: train.Config{Model: "gpt2", Optimizer: "adamw", Batch: 100000, Checkpoint: nn.CheckpointBlocks, AMP: train.AMPBF16,
		OffloadOptimizer: true, OffloadActivations: true}, Text: &datasets.Corpus{Name: "t", Tokenizer: tok}}
	r := &runner{dev: tensor.NewDevice(gpuNamed{cpu.New()}), job: job, cfg: job.Config, say: io.Discard}
	err = r.lookup()
	if err == nil {
		t.Fatal("not refused")
	}
	for _, want := range []string{"model gpt2: in host memory -offload-optimizer ", "and -offload-activations ", "of what its 12 blocks keep a step", "and the host has"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refused with %q, want it to say %q", err, want)
		}
	}
}
