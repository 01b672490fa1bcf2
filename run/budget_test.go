package run

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/internal/testdev"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/optim"
	"github.com/leangrad/leangrad/tensor"
	"github.com/leangrad/leangrad/train"
)

// gpt2OfBytes is the byte tokenizer and the parameters of gpt2 over it,
// and a GPU and a CPU to plan it for (testdev.FakeGPU: nothing runs); it
// skips the test on a host without the memory of their offloaded state.
func gpt2OfBytes(t *testing.T) (tok datasets.Tokenizer, params int64, gpu, host *tensor.Device) {
	t.Helper()
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
	params = int64(g.Params())
	if have := memory.HostMemory(); params*16 > have {
		t.Skipf("the host has %s, less than the %s of gpt2's offloaded state", memory.Bytes(have), memory.Bytes(params*16))
	}
	return tok, params, testdev.FakeGPU(), tensor.NewDevice(cpu.New())
}

// TestBudgetOffloadsTheState: under -max-memory, a language model whose F32
// parameters, gradients and AdamW state pass the budget, and whose
// parameters and gradients alone do not, keeps its state in host memory,
// planned before anything is built, and names 8-bit AdamW where its state
// would fit on the device (the user named the optimizer: else the budget
// takes 8-bit moments, TestBudgetChoosesTheOptimizer); otherwise the run
// is refused naming the sizes, and nothing moves on the CPU, where the
// user kept the state on the device, or for 8-bit moments (which stay on
// the device, in a quarter of the bytes).
func TestBudgetOffloadsTheState(t *testing.T) {
	tok, params, gpu, host := gpt2OfBytes(t)
	for _, c := range []struct {
		name      string
		dev       *tensor.Device
		optimizer string
		budget    int64
		keep      bool
		offload   bool
		says      string
		amp       train.AMP // asked for (NoAMP: none)
		bf16      bool      // -bf16-weights asked for
		bf16Out   bool      // BF16Weights after the plan
	}{
		{"the state to the host", gpu, "adamw", params * 12, false, true,
			"on the device; -optimizer adamw8bit would keep its moments on the device in a quarter of the bytes", 0, false, false},
		{"everything fits", gpu, "adamw", params * 17, false, false, "", 0, false, false},
		{"no budget", gpu, "adamw", 0, false, false, "", 0, false, false},
		{"the gradients stream to the host", gpu, "adamw", params * 5, false, true, "the state goes to host memory (-offload-optimizer)", 0, false, false},
		{"8-bit moments would not fit either", gpu, "adamw", params * 9, false, true, "on the device\n", 0, false, false},
		{"the blocks' weights in bf16", gpu, "adamw", params * 4, false, true, "the blocks' weights go to the device in bf16 (-bf16-weights, under bf16 AMP)", 0, false, true},
		{"the blocks' weights in bf16, asked for", gpu, "adamw", params * 4, false, true, "", train.AMPBF16, true, true},
		{"bf16 weights but f16 AMP", gpu, "adamw", params * 4, false, false, "more than the", train.AMPF16, false, false},
		{"bf16 weights too large too", gpu, "adamw", params * 2, false, false, "more than the", 0, false, false},
		{"bf16 weights without -offload-optimizer", gpu, "adamw", 0, true, false, "add -offload-optimizer", train.AMPBF16, true, true},
		{"bf16 weights without bf16 AMP", gpu, "adamw", 0, false, false, "add -amp -amp-dtype bf16", 0, true, true},
		{"bf16 weights on the CPU", host, "adamw", 0, false, false, "on the CPU", train.AMPBF16, true, true},
		{"kept on the device", gpu, "adamw", params * 12, true, false,
			"(-offload-optimizer keeps the state in host memory; -optimizer adamw8bit holds AdamW's moments in a quarter of the bytes)", 0, false, false},
		{"8-bit moments fit", gpu, "adamw8bit", params * 11, false, false, "", 0, false, false},
		{"8-bit moments stay on the device", gpu, "adamw8bit", params * 9, false, false, "adamw8bit's state, more than the", 0, false, false},
		{"the CPU", host, "adamw", params * 12, false, false, "more than the", 0, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var log bytes.Buffer
			job := Job{Config: train.Config{Model: "gpt2", Optimizer: c.optimizer, Batch: 1, AMP: c.amp, BF16Weights: c.bf16,
				OffloadOptimizer: c.bf16 && !c.keep}, Text: &datasets.Corpus{Name: "t", Tokenizer: tok}, MaxMemory: c.budget, KeepOptimizerOnDevice: c.keep, KeepOptimizer: true}
			r := &runner{dev: c.dev, job: job, cfg: job.Config, say: &log}
			err := r.lookup()
			if r.cfg.OffloadOptimizer != c.offload && !(c.bf16 && c.says != "") { // a refused -bf16-weights keeps what was asked
				t.Errorf("OffloadOptimizer %v, want %v (error %v)", r.cfg.OffloadOptimizer, c.offload, err)
			}
			if r.cfg.BF16Weights != c.bf16Out || (c.bf16Out && err == nil && (r.cfg.AMP != train.AMPBF16 || r.arch.GPT.ProductWeights != tensor.BF16)) {
				t.Errorf("BF16Weights %v, AMP %v, the model's product weights %v: want BF16Weights %v under bf16 AMP (error %v)",
					r.cfg.BF16Weights, r.cfg.AMP, r.arch.GPT.ProductWeights, c.bf16Out, err)
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

// TestBudgetChoosesTheOptimizer: under -max-memory, a language model whose
// F32 parameters, gradients and AdamW state pass the budget, where the user
// did not name the optimizer, holds AdamW's moments in 8 bits where those
// fit, on the CPU too, and says so; where they do not, its state goes to
// host memory (a GPU's) and, with clipping off and no F16 AMP, the host
// updates each parameter in the backward, unless the user said not to.
func TestBudgetChoosesTheOptimizer(t *testing.T) {
	tok, params, gpu, host := gpt2OfBytes(t)
	for _, c := range []struct {
		name             string
		dev              *tensor.Device
		budget           int64 // in bytes a parameter
		named, unfused   bool  // Job.KeepOptimizer, Job.KeepUnfused
		clip             float64
		amp, measured    train.AMP
		optimizer        string // after the plan
		offload, fused   bool
		says, doesNotSay string
	}{
		{name: "8-bit moments", dev: gpu, budget: 12, optimizer: "adamw8bit",
			says: "AdamW's moments go to 8 bits (-optimizer adamw8bit), ", doesNotSay: "host memory (-offload-optimizer)"},
		{name: "8-bit moments on the CPU", dev: host, budget: 12, optimizer: "adamw8bit", says: "(-optimizer adamw keeps them in F32)"},
		{name: "F32 moments fit", dev: gpu, budget: 17, optimizer: "adamw", doesNotSay: "8 bits"},
		{name: "the optimizer named", dev: gpu, budget: 12, named: true, optimizer: "adamw", offload: true, fused: true,
			says: "-fuse-optimizer), with the same results", doesNotSay: "AdamW's moments go to 8 bits"},
		{name: "8-bit moments would not fit", dev: gpu, budget: 9, optimizer: "adamw", offload: true, fused: true,
			says: "the state goes to host memory (-offload-optimizer)"},
		{name: "clipping", dev: gpu, budget: 9, clip: 1, optimizer: "adamw", offload: true, doesNotSay: "-fuse-optimizer"},
		{name: "unfused, as the user said", dev: gpu, budget: 9, unfused: true, optimizer: "adamw", offload: true, doesNotSay: "-fuse-optimizer"},
		{name: "F16 AMP", dev: gpu, budget: 9, amp: train.AMPF16, optimizer: "adamw", offload: true, doesNotSay: "-fuse-optimizer"},
		{name: "the budget's F16 AMP", dev: gpu, budget: 9, measured: train.AMPF16, optimizer: "adamw", offload: true, doesNotSay: "-fuse-optimizer"},
		{name: "bf16 AMP", dev: gpu, budget: 9, amp: train.AMPBF16, measured: train.AMPBF16, optimizer: "adamw", offload: true, fused: true},
		{name: "the blocks' weights in bf16", dev: gpu, budget: 4, optimizer: "adamw", offload: true, fused: true, says: "-bf16-weights"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var log bytes.Buffer
			job := Job{Config: train.Config{Model: "gpt2", Optimizer: "adamw", Batch: 1, AMP: c.amp, ClipNorm: c.clip},
				Text: &datasets.Corpus{Name: "t", Tokenizer: tok}, MaxMemory: c.budget * params, MeasuredAMP: c.measured,
				KeepOptimizer: c.named, KeepUnfused: c.unfused}
			r := &runner{dev: c.dev, job: job, cfg: job.Config, say: &log}
			if err := r.lookup(); err != nil {
				t.Fatalf("refused: %v", err)
			}
			if r.cfg.Optimizer != c.optimizer || r.cfg.OffloadOptimizer != c.offload || r.cfg.FuseOptimizer != c.fused {
				t.Errorf("optimizer %s, offloaded %v, fused %v; want %s, %v, %v (said %q)",
					r.cfg.Optimizer, r.cfg.OffloadOptimizer, r.cfg.FuseOptimizer, c.optimizer, c.offload, c.fused, log.String())
			}
			if said := log.String(); !strings.Contains(said, c.says) || c.doesNotSay != "" && strings.Contains(said, c.doesNotSay) {
				t.Errorf("said %q, want it to say %q and not %q", said, c.says, c.doesNotSay)
			}
			if want := optim.TrainingBytes(c.optimizer, params); !c.offload && want > r.job.MaxMemory {
				t.Errorf("%s's state takes %s with the parameters and gradients, past the budget's %s", c.optimizer, memory.Bytes(want), memory.Bytes(r.job.MaxMemory))
			}
		})
	}
}

// TestStateMovesWhenNoStepFits: where the budget's search found no step
// that fits beside the optimizer's state, the state moves and the search
// runs again: AdamW's moments to 8 bits, then AdamW's F32 state to host
// memory (a GPU's), then nothing more; the optimizer the user named keeps
// its kind, the CPU keeps its state, a resumed run its checkpoint's.
func TestStateMovesWhenNoStepFits(t *testing.T) {
	tok, params, gpu, host := gpt2OfBytes(t)
	for _, c := range []struct {
		name   string
		dev    *tensor.Device
		named  bool
		resume string
		want   []string // the optimizer after each move, "+host" offloaded
	}{
		{name: "a GPU", dev: gpu, want: []string{"adamw8bit", "adamw+host"}},
		{name: "the optimizer named", dev: gpu, named: true, want: []string{"adamw+host"}},
		{name: "the CPU", dev: host, want: []string{"adamw8bit"}},
		{name: "resumed", dev: gpu, resume: "run.ckpt"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var log bytes.Buffer
			job := Job{Config: train.Config{Model: "gpt2", Optimizer: "adamw", Batch: 1, ClipNorm: 1},
				Text: &datasets.Corpus{Name: "t", Tokenizer: tok}, MaxMemory: 17 * params, KeepOptimizer: c.named, Resume: c.resume}
			r := &runner{dev: c.dev, job: job, cfg: job.Config, say: &log, report: &Report{}}
			if err := r.lookup(); err != nil || r.cfg.Optimizer != "adamw" || r.cfg.OffloadOptimizer {
				t.Fatalf("the F32 state fits: %v, %s offloaded %v", err, r.cfg.Optimizer, r.cfg.OffloadOptimizer)
			}
			var got []string
			for range 3 {
				moved, err := r.stateElsewhere()
				if err != nil {
					t.Fatal(err)
				}
				if !moved {
					break
				}
				at := r.cfg.Optimizer
				if r.cfg.OffloadOptimizer {
					at += "+host"
				}
				got = append(got, at)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("moves %v, want %v (said %q)", got, c.want, log.String())
			}
			if len(c.want) > 0 && !strings.Contains(log.String(), "no configuration of its step fits the budget (-max-memory) beside adamw's state on the device: ") {
				t.Errorf("said %q", log.String())
			}
			if len(c.want) > 1 && !strings.Contains(log.String(), "beside AdamW's 8-bit moments on the device either: the state goes to host memory") {
				t.Errorf("said %q", log.String())
			}
			if r.cfg.OffloadOptimizer && (r.mode != train.Eager || r.report.Config.Optimizer != "adamw") {
				t.Errorf("offloaded: mode %v, reported %s", r.mode, r.report.Config.Optimizer)
			}
		})
	}
}

// TestBudgetKeepsTheUpdateInTheBackward: with the update in the backward
// the budget tries no F16 AMP, whose loss scaling would refuse it after the
// search (train -fuse-optimizer -max-memory without -amp failed so), but
// BF16 AMP and fp32; BF16 working weights take AMP only.
func TestBudgetKeepsTheUpdateInTheBackward(t *testing.T) {
	for _, c := range []struct {
		fused, bf16 bool
		amp         train.AMP
		want        bool
	}{
		{true, false, train.AMPF16, false}, {true, false, train.AMPBF16, true}, {true, false, train.NoAMP, true},
		{false, false, train.AMPF16, true}, {false, true, train.NoAMP, false}, {false, true, train.AMPBF16, true},
	} {
		r := &runner{cfg: train.Config{FuseOptimizer: c.fused, BF16Weights: c.bf16}}
		v := train.Variant{AMP: c.amp, Checkpoint: nn.CheckpointBlocks}
		if got := r.allowed(v); got != c.want {
			t.Errorf("fused %v, bf16 weights %v: AMP %v allowed %v, want %v", c.fused, c.bf16, c.amp, got, c.want)
		}
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
	r := &runner{dev: testdev.FakeGPU(), job: job, cfg: job.Config, say: io.Discard}
	err = r.lookup()
	if err == nil {
		t.Fatal("not refused")
	}
	for _, want := range []string{"model gpt2: in host memory -offload-optimizer ", "and -offload-activations ", "of what its 12 blocks keep a step", "this process may hold (90% of the host's "} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refused with %q, want it to say %q", err, want)
		}
	}
}

// TestDeviceStateCountsOnTheDevice: the share of an offloaded optimizer's
// state kept on the device (-device-state) counts there, with its
// gradients, when the plan checks the budget before anything is built: a
// small share fits where the whole state offloaded does, all of it does
// not, and the refusal names the flag.
func TestDeviceStateCountsOnTheDevice(t *testing.T) {
	tok, params, gpu, _ := gpt2OfBytes(t)
	for _, c := range []struct {
		share float64
		says  string // in the refusal ("": none)
	}{{0, ""}, {0.05, ""}, {1, "-device-state 1"}} {
		t.Run(fmt.Sprint(c.share), func(t *testing.T) {
			var log bytes.Buffer
			job := Job{Config: train.Config{Model: "gpt2", Optimizer: "adamw", Batch: 1, OffloadOptimizer: true, DeviceState: c.share},
				Text: &datasets.Corpus{Name: "t", Tokenizer: tok}, MaxMemory: params * 5, KeepOptimizer: true}
			r := &runner{dev: gpu, job: job, cfg: job.Config, say: &log}
			err := r.lookup()
			switch {
			case c.says == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.says != "" && (err == nil || !strings.Contains(err.Error(), c.says)):
				t.Fatalf("error %v: want one that says %q", err, c.says)
			}
		})
	}
}

// TestBudgetKeepsStateInTheRoom: under -max-memory, with the optimizer
// offloaded, the budget keeps on the device the state of as many of the
// first parameters as its chosen step leaves room for (deviceStateInRoom):
// the run then trains within the budget, and says what the device held.
// The room is the budget less the chosen whole-batch step's need and its
// headroom, each kept byte of F32 parameter taking its gradient, its
// headroom and its state; a step that leaves none keeps nothing.
func TestBudgetKeepsStateInTheRoom(t *testing.T) {
	m := func(name string, examples int, peak, standing int64) train.Measurement {
		return train.Measurement{Variant: train.Variant{Name: name}, Examples: examples, PeakAllocated: peak, Standing: standing}
	}
	choice := train.BudgetChoice{Chosen: train.Variant{Name: "amp"}, Measured: []train.Measurement{
		m("fp32", 0, 2000, 300), m("amp", 2, 100, 300), m("amp", 0, 700, 300)}}
	// room 1000 - 700 - 0.1·400 = 260; AdamW: 1.1 + 2 a kept byte.
	for _, c := range []struct {
		budget, params int64
		optimizer      string
		want           float64
	}{{1000, 400, "adamw", 260 / 3.1 / 400}, {1000, 400, "sgd", 260 / 2.1 / 400}, {1000, 10, "adamw", 1}, {740, 400, "adamw", 0}, {600, 400, "adamw", 0}} {
		if got := deviceStateInRoom(choice, c.budget, c.params, c.optimizer); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("budget %d, %d bytes of %s's parameters: share %v, want %v", c.budget, c.params, c.optimizer, got, c.want)
		}
	}

	corpus := brownBytes(t)
	var log bytes.Buffer
	const budget = 8 << 20 // room for some of the state: gpt-mini's fp32 step needs about 5 MiB
	job := Job{Config: train.Config{Model: "gpt-mini", Dataset: corpus.Name, Steps: 2, Batch: 4, LR: 1e-3, Optimizer: "adamw", Schedule: "constant",
		Seed: 1, Context: 32, EvalEvery: 2, EvalBatches: 1, OffloadOptimizer: true}, Text: corpus, MaxMemory: budget, KeepOptimizer: true, Log: &log}
	r, err := Train(testdev.FakeGPU(), job)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if s := r.Config.DeviceState; !(s > 0 && s < 1) || !strings.Contains(log.String(), "the first that fit in it keep theirs on the device (-device-state 0.") {
		t.Fatalf("device state %v; log:\n%s", s, log.String())
	}
	if r.Final.DeviceOptimizerBytes <= 0 {
		t.Errorf("the report's device_optimizer_bytes %d: want the state kept", r.Final.DeviceOptimizerBytes)
	}
	if r.Final.PeakAllocated > budget {
		t.Errorf("peak %s over the budget %s", memory.Bytes(r.Final.PeakAllocated), memory.Bytes(budget))
	}
	var sum bytes.Buffer
	r.WriteSummary(&sum)
	if !strings.Contains(sum.String(), "of the state, its first parameters' (-device-state") {
		t.Errorf("the summary does not say what the device held:\n%s", sum.String())
	}
	t.Logf("kept %.3f of the parameters' state on the device; peak %s of %s", r.Config.DeviceState, memory.Bytes(r.Final.PeakAllocated), memory.Bytes(budget))
}
