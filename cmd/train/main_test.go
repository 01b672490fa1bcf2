package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/leangrad/leangrad/cmd/internal/cmdenv"
	"github.com/leangrad/leangrad/internal/race"
	"github.com/leangrad/leangrad/kernels/cuda"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/run"
	"github.com/leangrad/leangrad/tensor"
)

func runCLI(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = command(args, &o, &e)
	return code, o.String(), e.String()
}

func TestUserMistakesGetOneClearLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-model", "vgg"}, cmdenv.ExitUsage, `-model "vgg": want resnet (resnet20), resnetN`},
		{[]string{"-model", "gpt", "-epochs", "3"}, cmdenv.ExitUsage, "-epochs: -model gpt is a language model, which -epochs is not for"},
		{[]string{"-model", "mlp", "-context", "64"}, cmdenv.ExitUsage, "-context: -model mlp classifies images, which -context is not for"},
		{[]string{"-model", "gpt", "-tokenizer", "sentencepiece"}, cmdenv.ExitUsage, `-tokenizer "sentencepiece": want gpt2 or bytes`},
		{[]string{"-model", "gpt-mini", "-steps", "250", "-eval-every", "100"}, cmdenv.ExitUsage, "-steps 250: want a multiple of -eval-every 100"},
		{[]string{"-model", "gpt-mini", "-sample", "16777217"}, cmdenv.ExitUsage, "-sample 16777217: want at most 16777216 tokens"},
		{[]string{"-model", "gpt-mini", "-data", "/nonexistent/texts"}, cmdenv.ExitUsage, "-data /nonexistent/texts: no such file or directory"},
		{[]string{"-amp-dtype", "fp8"}, cmdenv.ExitUsage, `-amp-dtype "fp8": want f16 (with loss scaling) or bf16`},
		{[]string{"-depth", "21"}, cmdenv.ExitUsage, "-depth 21: want 6n+2"},
		{[]string{"-epochs", "0"}, cmdenv.ExitUsage, "-epochs 0: want at least 1"},
		{[]string{"-batch", "x"}, cmdenv.ExitUsage, `-batch "x": not a number`},
		{[]string{"extra"}, cmdenv.ExitUsage, `unexpected argument "extra"`},
		{[]string{"-model", "mlp", "-checkpoint"}, cmdenv.ExitUsage, "-checkpoint needs a model with blocks to checkpoint: mlp has none"},
		{[]string{"-checkpoint-mode", "half"}, cmdenv.ExitUsage, `-checkpoint-mode "half": want none, blocks, light or sqrt`},
		{[]string{"-model", "resnet8", "-checkpoint", "-checkpoint-mode", "light"}, cmdenv.ExitUsage, "-checkpoint-mode light keeps the products of a GPT's blocks: resnet8 is not a GPT"},
		{[]string{"-dataset", "imagenet"}, cmdenv.ExitUsage, `-dataset "imagenet": want fashion-mnist, cifar10 or synthetic`},
		{[]string{"-dataset", "cifar10", "-data", "/nonexistent"}, cmdenv.ExitUsage, "-data /nonexistent: no such file or directory"},
		{[]string{"-device", "tpu"}, cmdenv.ExitUsage, `-device "tpu": want cpu, cuda, cuda:N or auto`},
		{[]string{"-nproc", "0"}, cmdenv.ExitUsage, "-nproc 0: want 1 or more processes"},
		{[]string{"-shard-optimizer"}, cmdenv.ExitUsage, "-shard-optimizer: not a data-parallel job"},
		{[]string{"-nproc", "2", "-shard-optimizer", "-offload-optimizer"}, cmdenv.ExitUsage, "-shard-optimizer with -offload-optimizer: choose one"},
		{[]string{"-fuse-optimizer", "-amp", "-amp-dtype", "f16"}, cmdenv.ExitUsage, "-fuse-optimizer with -amp-dtype f16: F16's loss scaling"},
		{[]string{"-device-state", "0.2"}, cmdenv.ExitUsage, "-device-state 0.2 keeps part of an offloaded optimizer's state on the device: add -offload-optimizer"},
		{[]string{"-offload-optimizer", "-device-state", "1.5"}, cmdenv.ExitUsage, "-device-state 1.5: want a share of the parameters' bytes from 0 to 1"},
		{[]string{"-host-threads", "4"}, cmdenv.ExitUsage, "-host-threads sizes the host's work beside the backward: it needs -offload-optimizer with -fuse-optimizer or -micro-batch"},
		{[]string{"-fuse-optimizer", "-offload-optimizer", "-host-threads", "-2"}, cmdenv.ExitUsage, "-host-threads -2: want a count of cores"},
		{[]string{"-fuse-optimizer", "-nproc", "2"}, cmdenv.ExitUsage, "-fuse-optimizer with -nproc 2: a data-parallel step"},
		{[]string{"-checkpoint-blocks", "2"}, cmdenv.ExitUsage, "-checkpoint-blocks 2 needs -checkpoint with -checkpoint-mode blocks or light"},
		{[]string{"-checkpoint", "-checkpoint-mode", "sqrt", "-checkpoint-blocks", "2"}, cmdenv.ExitUsage, "-checkpoint-blocks 2 needs -checkpoint with -checkpoint-mode blocks or light"},
		{[]string{"-checkpoint", "-checkpoint-blocks", "0"}, cmdenv.ExitUsage, "-checkpoint-blocks 0: want a count of blocks, 1 or more"},
		{[]string{"-model", "gpt-mini", "-checkpoint", "-checkpoint-blocks", "3"}, cmdenv.ExitUsage, "-checkpoint-blocks 3: gpt-mini has 2 blocks"},
		{[]string{"-model", "resnet8", "-checkpoint", "-checkpoint-blocks", "4"}, cmdenv.ExitUsage, "-checkpoint-blocks 4: resnet8 has 3 blocks"},
		{[]string{"-checkpoint", "-checkpoint-blocks", "2", "-max-memory", "1GiB"}, cmdenv.ExitUsage, "-checkpoint-blocks 2 with -max-memory: the budget chooses how many blocks to checkpoint"},
		{[]string{"-micro-batch", "0"}, cmdenv.ExitUsage, "-micro-batch 0: want a count of examples from 1 to -batch's 128"},
		{[]string{"-batch", "8", "-micro-batch", "9"}, cmdenv.ExitUsage, "-micro-batch 9: want a count of examples from 1 to -batch's 8"},
		{[]string{"-micro-batch", "4", "-fuse-optimizer"}, cmdenv.ExitUsage, "-micro-batch 4 with -fuse-optimizer on the device: the update fused into the backward needs the whole batch's gradients"},
		{[]string{"-offload-activations"}, cmdenv.ExitUsage, "-offload-activations moves what checkpointed blocks keep to host memory: use it with -checkpoint"},
		{[]string{"-bf16-weights"}, cmdenv.ExitUsage, "-bf16-weights: model resnet is not a GPT"},
		{[]string{"-model", "gpt-mini", "-bf16-weights", "-amp", "-amp-dtype", "bf16"}, cmdenv.ExitUsage, "-bf16-weights keeps the F32 masters with the optimizer's state in host memory: add -offload-optimizer"},
		{[]string{"-model", "gpt-mini", "-bf16-weights", "-offload-optimizer", "-amp", "-amp-dtype", "f16"}, cmdenv.ExitUsage, "-bf16-weights trains the bf16 weights under bf16 autocast"},
		{[]string{"-nproc", "2", "-device", "cuda:1"}, cmdenv.ExitUsage, "each rank takes its own GPU"},
		{[]string{"-dist-timeout", "-1s"}, cmdenv.ExitUsage, "-dist-timeout -1s: want a positive duration"},
		{[]string{"-model", "mlp", "-dataset", "synthetic", "-resume", "/nonexistent/run.ckpt", "-measure=false"}, cmdenv.ExitUsage, "-resume /nonexistent/run.ckpt: no such file"},
		{[]string{"-optimizer", "adam"}, cmdenv.ExitUsage, `-optimizer "adam": want sgd, adamw or adamw8bit`},
		{[]string{"-optimizer", "adamw8bit", "-offload-optimizer"}, cmdenv.ExitUsage, "-optimizer adamw8bit with -offload-optimizer: 8-bit moments stay whole on the device"},
		{[]string{"-optimizer", "adamw8bit", "-nproc", "2", "-shard-optimizer"}, cmdenv.ExitUsage, "-optimizer adamw8bit with -shard-optimizer"},
		{[]string{"-schedule", "step"}, cmdenv.ExitUsage, `-schedule "step": want cosine, onecycle or constant`},
		{[]string{"-max-memory", "lots"}, cmdenv.ExitUsage, `-max-memory "lots": want a size`},
		{[]string{"-max-memory", "20XB"}, cmdenv.ExitUsage, `unknown unit "XB"`},
		{[]string{"-resume-force"}, cmdenv.ExitUsage, "-resume-force without -resume"},
		{[]string{"-batch", "-1"}, cmdenv.ExitUsage, "-batch -1: want at least 1"},
		{[]string{"-model", "gpt:L1,W63,H2"}, cmdenv.ExitUsage, `-model "gpt:L1,W63,H2": gpt:L1,W63,H2,C1024,V50257: the width 63 is not a multiple of the 2 heads`},
	} {
		code, _, stderr := runCLI(tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("train %v: exit %d, stderr %q; want exit %d and %q", tc.args, code, stderr, tc.code, tc.want)
		}
		if lines := strings.Count(strings.TrimSpace(stderr), "\n") + 1; tc.code == cmdenv.ExitUsage && lines != 1 {
			t.Errorf("train %v: %d lines for one mistake:\n%s", tc.args, lines, stderr)
		}
		if strings.Contains(stderr, "goroutine ") || strings.Contains(stderr, "panic") {
			t.Errorf("train %v printed a stack trace:\n%s", tc.args, stderr)
		}
	}
	if cuda.Available() != nil {
		code, _, stderr := runCLI("-device", "cuda")
		if code != cmdenv.ExitNothingRan || !strings.Contains(stderr, "libcuda.so.1") || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("-device cuda without a GPU: exit %d, %q; want one line naming libcuda.so.1", code, stderr)
		}
	}
	if code, _, stderr := runCLI("-model", "gpt-mini", "-temperature", "-1", "-top-k", "-2"); code != cmdenv.ExitUsage ||
		stderr != "train: -top-k -2: want 0 (every token) or more\ntrain: -temperature -1: want 0 (greedy) or more\n" {
		t.Errorf("two mistakes: exit %d, %q; want each on a line of its own", code, stderr)
	}
	if code, _, _ := runCLI("-h"); code != 0 {
		t.Errorf("-h exits %d", code)
	}
}

func TestRunWritesReports(t *testing.T) {
	dir := t.TempDir()
	js, csv, png, ck := filepath.Join(dir, "r.json"), filepath.Join(dir, "m.csv"), filepath.Join(dir, "m.png"), filepath.Join(dir, "c.st")
	code, stdout, stderr := runCLI("-model", "resnet", "-depth", "8", "-dataset", "synthetic", "-device", "cpu", "-limit", "96",
		"-test-limit", "64", "-batch", "16", "-epochs", "2", "-amp", "-checkpoint", "-empty-cache", "3",
		"-json", js, "-memlog", csv, "-memplot", png, "-save", ck)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	for _, want := range []string{"measured by the pool", "the measured step's, eager", "amp+checkpoint", "<- this run", "test accuracy",
		"img/s", "peak allocated", "(fp32: ", "EmptyCache every 3 steps: 4 calls", "leangrad memory summary, device cpu"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
	var r run.Report
	data, err := os.ReadFile(js)
	if err != nil || json.Unmarshal(data, &r) != nil || len(r.Epochs) != 2 || len(r.Measured) != 4 || r.Final.PeakAllocated <= 0 {
		t.Errorf("-json: %v %+v", err, r.Final)
	}
	for _, m := range r.Measured {
		if m.StepSeconds <= 0 {
			t.Errorf("-json: %s measured untimed", m.Name)
		}
	}
	for _, f := range []string{csv, png, ck} {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	// Resuming the finished run with one more epoch continues from epoch 3.
	code, stdout, stderr = runCLI("-model", "resnet", "-depth", "8", "-dataset", "synthetic", "-device", "cpu", "-limit", "96",
		"-test-limit", "64", "-batch", "16", "-epochs", "3", "-amp", "-checkpoint", "-resume", ck, "-measure=false")
	if code != 0 || !strings.Contains(stdout, "resumed from") || !strings.Contains(stderr, "epoch 3:") {
		t.Errorf("resume: exit %d\n%s\n%s", code, stdout, stderr)
	}
}

// story writes a small text to train on, story.txt in dir, and returns
// its path.
func story(t *testing.T, dir string) string {
	t.Helper()
	text := filepath.Join(dir, "story.txt")
	var b strings.Builder
	for i := range 300 {
		fmt.Fprintf(&b, "The %d quick brown foxes jumped over the lazy dog, and the dog slept on. ", i%7)
	}
	if err := os.WriteFile(text, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return text
}

// The text job end to end on a small text: the flags' recipe, validation
// lines, the summary, a sample, the JSON report, a checkpoint and resuming
// it for more steps; and a text file that is not text gets one line.
func TestTextRun(t *testing.T) {
	dir := t.TempDir()
	text := story(t, dir)
	js, ck := filepath.Join(dir, "r.json"), filepath.Join(dir, "gpt.ckpt")
	args := []string{"-model", "gpt-mini", "-device", "cpu", "-data", text, "-tokenizer", "bytes", "-context", "32", "-batch", "4",
		"-eval-batches", "4", "-warmup-steps", "2", "-sample", "8", "-prompt", "The 3", "-json", js, "-save", ck, "-measure=false"}
	code, stdout, stderr := runCLI(append(args, "-steps", "20", "-eval-every", "10")...)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	for _, want := range []string{"text: " + text, "training gpt-mini", "20 steps of 4 windows of 32 tokens (evaluated every 10)",
		"validation     loss", "tokens/s (", "TFLOP/s of the model's: 6N + 12·L·C·T a token)", `sample (8 tokens, temperature 0.8, top-k 40) after "The 3"`} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
	if !strings.Contains(stderr, "validation at step 20/20") {
		t.Errorf("progress lacks the last validation:\n%s", stderr)
	}
	var r run.Report
	data, err := os.ReadFile(js)
	if err != nil || json.Unmarshal(data, &r) != nil || len(r.Epochs) != 2 || r.Config.Optimizer != "adamw" || r.Config.ClipNorm != 1 ||
		r.Config.Context != 32 || r.Config.EvalEvery != 10 || r.Sample == nil || r.Tokenizer != "bytes" || !(r.Final.TokensPerSec > 0) {
		t.Errorf("-json: %v %+v", err, r)
	}
	code, stdout, stderr = runCLI(append(args, "-steps", "30", "-eval-every", "10", "-resume", ck, "-save", "")...)
	if code != 0 || !strings.Contains(stdout, "resumed from") || !strings.Contains(stderr, "validation at step 30/30") {
		t.Errorf("resume: exit %d\n%s\n%s", code, stdout, stderr)
	}
	junk := filepath.Join(dir, "weights.bin")
	os.WriteFile(junk, []byte{0x7f, 'E', 'L', 'F', 0, 1, 2}, 0o644)
	code, _, stderr = runCLI("-model", "gpt-mini", "-device", "cpu", "-data", junk, "-measure=false")
	if code != cmdenv.ExitNothingRan || !strings.Contains(stderr, junk+": not UTF-8 text") || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Errorf("binary -data: exit %d, %q", code, stderr)
	}
}

// TestMicroBatchRun: -micro-batch trains a GPT in micro-batches to
// within rounding of the whole batches' losses (the same mean gradient),
// says so, and records it in the report; -max-memory keeps them, measuring
// each configuration on the whole batch in them rather than sizing it.
func TestMicroBatchRun(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "story.txt")
	os.WriteFile(text, []byte(strings.Repeat("The quick brown foxes jumped over the lazy dog, and the dog slept on. ", 100)), 0o644)
	var losses []float64
	for i, c := range []struct {
		micro  string
		budget bool // under -max-memory, which keeps them
	}{{"0", false}, {"2", false}, {"2", true}} {
		js := filepath.Join(dir, fmt.Sprintf("r-%d.json", i))
		args := []string{"-model", "gpt-mini", "-device", "cpu", "-data", text, "-tokenizer", "bytes", "-context", "32", "-batch", "4",
			"-eval-batches", "2", "-steps", "8", "-eval-every", "8", "-json", js, "-measure=false"}
		if c.micro != "0" {
			args = append(args, "-micro-batch", c.micro)
		}
		if c.budget {
			args = append(args, "-max-memory", "1GiB")
		}
		code, stdout, stderr := runCLI(args...)
		if code != 0 {
			t.Fatalf("-micro-batch %s (budget %v): exit %d\n%s\n%s", c.micro, c.budget, code, stdout, stderr)
		}
		if said := strings.Contains(stdout, "micro-batches of 2 (-micro-batch)"); said != (c.micro == "2") {
			t.Errorf("-micro-batch %s: the training line says micro-batches %v:\n%s", c.micro, said, stdout)
		}
		var r run.Report
		if data, err := os.ReadFile(js); err != nil || json.Unmarshal(data, &r) != nil || len(r.Epochs) != 1 {
			t.Fatalf("-json: %v %+v", err, r)
		}
		if got := fmt.Sprint(r.Config.MicroBatch); got != c.micro {
			t.Errorf("-micro-batch %s: the report's micro_batch is %s", c.micro, got)
		}
		if c.budget {
			if r.Budget == nil || r.Budget.Chosen.MicroBatch != 2 || len(r.Budget.Measured) != 1 || r.Budget.Measured[0].Examples != 0 ||
				!strings.Contains(stdout, "fp32, micro-batches of 2") || strings.Contains(stdout, "sizing") {
				t.Errorf("-micro-batch 2 -max-memory 1GiB: the budget measured %+v and chose %+v, want fp32 in micro-batches of 2 on the whole batch\n%s", r.Budget.Measured, r.Budget.Chosen, stdout)
			}
		}
		losses = append(losses, float64(r.Epochs[0].TestLoss))
	}
	if d := math.Abs(losses[1] - losses[0]); !(d <= 1e-3*losses[0]) {
		t.Errorf("validation loss %v in micro-batches of 2, %v in whole batches of 4: want the same within rounding", losses[1], losses[0])
	}
	if losses[2] != losses[1] {
		t.Errorf("validation loss %v in micro-batches of 2 under -max-memory, %v without: want the same", losses[2], losses[1])
	}
}

// TestCheckpointSomeBlocksRun: -checkpoint -checkpoint-blocks 2 trains a
// GPT of four blocks to the losses of every block checkpointed, exactly,
// says so, measures its step beside the four others and records it; so
// does -checkpoint-mode light; under -max-memory between the needs
// measured for fp32 and for every block checkpointed, the budget chooses
// to checkpoint some of them lightly, and the run does.
func TestCheckpointSomeBlocksRun(t *testing.T) {
	race.Skip(t, "go test ./cmd/train -run TestCheckpointSomeBlocksRun")
	dir := t.TempDir()
	text := filepath.Join(dir, "story.txt")
	os.WriteFile(text, []byte(strings.Repeat("The quick brown foxes jumped over the lazy dog, and the dog slept on. ", 100)), 0o644)
	base := []string{"-model", "gpt:L4,W128,H2,C128", "-device", "cpu", "-data", text, "-tokenizer", "bytes", "-batch", "8",
		"-eval-batches", "2", "-steps", "4", "-eval-every", "4"}
	train := func(name string, args ...string) (run.Report, string) {
		js := filepath.Join(dir, name+".json")
		code, stdout, stderr := runCLI(append(append(base, "-json", js), args...)...)
		if code != 0 {
			t.Fatalf("%s: exit %d\n%s\n%s", name, code, stdout, stderr)
		}
		var r run.Report
		if data, err := os.ReadFile(js); err != nil || json.Unmarshal(data, &r) != nil || len(r.Epochs) != 1 {
			t.Fatalf("%s -json: %v %+v", name, err, r)
		}
		return r, stdout
	}
	all, _ := train("all", "-checkpoint")
	some, stdout := train("some", "-checkpoint", "-checkpoint-blocks", "2")
	measured := regexp.MustCompile(`(?m)^  checkpoint-2/4 .*<- this run$`)
	if !strings.Contains(stdout, "checkpoint of the first 2 blocks") || some.Config.Checkpointed != 2 || !measured.MatchString(stdout) {
		t.Errorf("-checkpoint-blocks 2: the report's checkpointed is %d, and the output says\n%s", some.Config.Checkpointed, stdout)
	}
	light, stdout := train("light", "-checkpoint", "-checkpoint-mode", "light")
	if lightly := regexp.MustCompile(`(?m)^  checkpoint-light .*<- this run$`); !lightly.MatchString(stdout) {
		t.Errorf("-checkpoint-mode light: its step is not measured as this run's:\n%s", stdout)
	}
	for _, c := range []struct {
		name string
		r    run.Report
	}{{"two of four blocks checkpointed", some}, {"light checkpoints", light}} {
		if a, s := all.Epochs[0], c.r.Epochs[0]; a.TestLoss != s.TestLoss || a.TrainLoss != s.TrainLoss {
			t.Errorf("losses with %s %v, %v; with every block checkpointed %v, %v: want the same", c.name, s.TrainLoss, s.TestLoss, a.TrainLoss, a.TestLoss)
		}
	}
	need := map[string]int64{}
	for _, m := range all.Measured {
		need[m.Name] = m.Need()
	}
	if need["fp32"] <= need["checkpoint"] {
		t.Fatalf("measured needs %v: want fp32's above checkpoint's", need)
	}
	// Just below fp32's: a pool this small reserves a third more than it
	// allocates, which the budget's headroom does not cover.
	budget := need["fp32"] * 19 / 20
	r, stdout := train("budget", "-amp=false", "-measure=false", "-max-memory", fmt.Sprint(budget)+"B")
	if c := r.Budget.Chosen; !c.Some || c.Checkpoint != nn.CheckpointLight || c.Checkpointed < 1 || c.Checkpointed > 3 || r.Config.Checkpointed != c.Checkpointed ||
		!strings.Contains(stdout, fmt.Sprintf("chose %s", c.Name)) || !strings.Contains(stdout, fmt.Sprintf("checkpoint-light of the first %d blocks", c.Checkpointed)) {
		t.Errorf("-max-memory %d (fp32 needs %d, every block checkpointed %d): chose %+v, trained with %d blocks checkpointed\n%s", budget, need["fp32"], need["checkpoint"], c, r.Config.Checkpointed, stdout)
	}
}

// TestFuseOptimizerRun: -fuse-optimizer trains a GPT to the plain run's
// losses exactly, turns the GPT's default clipping off, and says what it
// did.
func TestFuseOptimizerRun(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "story.txt")
	os.WriteFile(text, []byte(strings.Repeat("The quick brown foxes jumped over the lazy dog, and the dog slept on. ", 100)), 0o644)
	reports := map[bool]run.Report{}
	for _, fuse := range []bool{false, true} {
		js := filepath.Join(dir, fmt.Sprintf("r-%v.json", fuse))
		args := []string{"-model", "gpt-mini", "-device", "cpu", "-data", text, "-tokenizer", "bytes", "-context", "32", "-batch", "4",
			"-eval-batches", "2", "-steps", "8", "-eval-every", "8", "-json", js, "-measure=false", "-clip", "-1"}
		if fuse {
			args = append(args[:len(args)-2], "-fuse-optimizer")
		}
		code, stdout, stderr := runCLI(args...)
		if code != 0 {
			t.Fatalf("-fuse-optimizer %v: exit %d\n%s\n%s", fuse, code, stdout, stderr)
		}
		if said := strings.Contains(stdout, "each parameter updated in the backward (-fuse-optimizer)"); said != fuse {
			t.Errorf("-fuse-optimizer %v: the training line says it %v:\n%s", fuse, said, stdout)
		}
		var r run.Report
		if data, err := os.ReadFile(js); err != nil || json.Unmarshal(data, &r) != nil || len(r.Epochs) != 1 {
			t.Fatalf("-json: %v %+v", err, r)
		}
		reports[fuse] = r
	}
	plain, fused := reports[false], reports[true]
	if fused.Config.ClipNorm != 0 || !fused.Config.FuseOptimizer {
		t.Errorf("the fused run's configuration: clip %v, fused %v", fused.Config.ClipNorm, fused.Config.FuseOptimizer)
	}
	if a, b := plain.Epochs[0], fused.Epochs[0]; a.TrainLoss != b.TrainLoss || a.TestLoss != b.TestLoss {
		t.Errorf("losses: %v/%v plain, %v/%v fused", a.TrainLoss, a.TestLoss, b.TrainLoss, b.TestLoss)
	}
	// Clipped, it runs each step's forward and backward twice and says so,
	// to the unfused clipped run's losses but for the norm's last bits.
	clipped := map[bool]run.Report{}
	for _, fuse := range []bool{false, true} {
		js := filepath.Join(dir, fmt.Sprintf("c-%v.json", fuse))
		args := []string{"-model", "gpt-mini", "-device", "cpu", "-data", text, "-tokenizer", "bytes", "-context", "32", "-batch", "4",
			"-eval-batches", "2", "-steps", "8", "-eval-every", "8", "-json", js, "-measure=false", "-clip", "0.5"}
		if fuse {
			args = append(args, "-fuse-optimizer")
		}
		code, stdout, stderr := runCLI(args...)
		var r run.Report
		if data, err := os.ReadFile(js); code != 0 || err != nil || json.Unmarshal(data, &r) != nil || len(r.Epochs) != 1 {
			t.Fatalf("-clip 0.5, -fuse-optimizer %v: exit %d, report %v\n%s\n%s", fuse, code, err, stdout, stderr)
		}
		if said := strings.Contains(stdout, "the first for the gradients' norm (-clip)"); said != fuse {
			t.Errorf("-clip 0.5, -fuse-optimizer %v: the training line says two passes %v:\n%s", fuse, said, stdout)
		}
		clipped[fuse] = r
	}
	if a, b := clipped[false].Epochs[0], clipped[true].Epochs[0]; math.Abs(float64(a.TrainLoss-b.TrainLoss)) > 1e-4*float64(a.TrainLoss) || clipped[true].Config.ClipNorm != 0.5 {
		t.Errorf("clipped: training loss %v plain, %v fused (clip %v)", a.TrainLoss, b.TrainLoss, clipped[true].Config.ClipNorm)
	}
	// Under a budget that only micro-batches fit (fp32, no checkpoints), the
	// update waits for the last micro-batch, and the run says so.
	budgeted := func(budget int64) (run.Report, string) {
		js := filepath.Join(dir, fmt.Sprintf("b-%d.json", budget))
		code, stdout, stderr := runCLI("-model", "gpt-mini", "-device", "cpu", "-data", text, "-tokenizer", "bytes", "-context", "64", "-batch", "16",
			"-eval-batches", "1", "-steps", "2", "-eval-every", "2", "-measure=false", "-fuse-optimizer", "-amp=false", "-checkpoint=false",
			"-max-memory", fmt.Sprint(budget)+"B", "-json", js)
		var r run.Report
		if data, err := os.ReadFile(js); code != 0 || err != nil || json.Unmarshal(data, &r) != nil || r.Budget == nil || len(r.Budget.Measured) == 0 {
			t.Fatalf("-fuse-optimizer -max-memory %d: exit %d, report %v\n%s\n%s", budget, code, err, stdout, stderr)
		}
		return r, stdout
	}
	r, _ := budgeted(1 << 30)
	whole := r.Budget.Measured[len(r.Budget.Measured)-1] // the chosen, measured on the whole batch
	if !whole.Variant.AMP.On() && whole.MicroBatch == 0 && whole.Examples == 0 && r.Budget.Chosen.MicroBatch == 0 {
		budget := whole.Need() * 3 / 4
		if r, stdout := budgeted(budget); r.Budget.Chosen.MicroBatch == 0 || !strings.Contains(stdout, "updated after the budget's micro-batches") ||
			strings.Contains(stdout, "each parameter updated in the backward") {
			t.Errorf("-fuse-optimizer -max-memory %d (the whole batch's fused step needs %d): chose %+v, want micro-batches, said to update after them:\n%s",
				budget, whole.Need(), r.Budget.Chosen, stdout)
		}
	} else {
		t.Errorf("-fuse-optimizer -max-memory 1GiB: measured %+v first, chose %+v; want fp32 whole", whole, r.Budget.Chosen)
	}
}

// Why 1: every output path is checked before the dataset is loaded, and
// every bad flag is reported, in one run, exit 64 (cmdenv.ExitUsage). (An unwritable -save used
// to fail after the first epoch, -json, -memlog and -memplot after the
// whole run, one at a time.)
func TestBadOutputPathsFailBeforeAnyWork(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, []byte("x"), 0o644)
	args := []string{"-model", "mlp", "-dataset", "synthetic", "-device", "cpu",
		"-save", "/proc/leangrad-test/run.ckpt", // no one may create files in /proc, not even root
		"-json", filepath.Join(file, "r.json"), // under a file
		"-memplot", dir, // a folder
		"-memlog", filepath.Join(dir, "new", "deeper", "m.csv"), // fine: the folders are made
		"-memsnapshot", filepath.Join(dir, "m.svg"), "-memplot", filepath.Join(dir, "m.svg")}
	code, stdout, stderr := runCLI(args...)
	if code != cmdenv.ExitUsage || stdout != "" {
		t.Errorf("exit %d, stdout %q: want %d and nothing done", code, stdout, cmdenv.ExitUsage)
	}
	for _, want := range []string{"-save /proc/leangrad-test/run.ckpt: cannot write in /proc", "-json " + file + "/r.json: " + file + " is not a folder",
		"-memsnapshot " + filepath.Join(dir, "m.svg") + ": -memplot writes it too"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "-memlog") {
		t.Errorf("a -memlog in folders still to be made was refused:\n%s", stderr)
	}
	code, _, stderr = runCLI("-memplot", dir, "-lr", "NaN", "-momentum", "1", "-wd", "-Inf", "-warmup", "NaN", "-epochs", "0")
	for _, want := range []string{"-memplot \"" + dir + "\": want a .png, .svg or .pdf file", "-lr NaN: want a positive", "-momentum 1: want a momentum in [0, 1)",
		"-wd -Inf: want a weight decay", "-warmup NaN", "-epochs 0"} {
		if code != cmdenv.ExitUsage || !strings.Contains(stderr, want) {
			t.Errorf("exit %d, stderr lacks %q:\n%s", code, want, stderr)
		}
	}
	if n := strings.Count(stderr, "train: "); n != 6 {
		t.Errorf("%d errors reported, want all 6:\n%s", n, stderr)
	}
	if os.Geteuid() != 0 { // root writes in read-only folders
		ro := filepath.Join(dir, "ro")
		os.Mkdir(ro, 0o500)
		if code, _, stderr := runCLI("-save", filepath.Join(ro, "run.ckpt")); code != cmdenv.ExitUsage || !strings.Contains(stderr, "cannot write in "+ro) {
			t.Errorf("a read-only folder: exit %d, %s", code, stderr)
		}
	}
}

// smallRun is a quick CPU run of an MLP on the synthetic set.
var smallRun = []string{"-model", "mlp", "-dataset", "synthetic", "-device", "cpu", "-limit", "512", "-test-limit", "64",
	"-batch", "16", "-measure=false"}

// Why 2: a run that diverges stops, names the step, exits 3, writes valid
// JSON with null for the numbers that are not finite, and saves nothing
// over the last good checkpoint.
func TestDivergedRunStopsAndSaysSo(t *testing.T) {
	dir := t.TempDir()
	js, ck := filepath.Join(dir, "r.json"), filepath.Join(dir, "run.ckpt")
	if code, _, stderr := runCLI(append(smallRun, "-epochs", "1", "-save", ck)...); code != 0 {
		t.Fatalf("the good run: %d\n%s", code, stderr)
	}
	good, _ := os.ReadFile(ck)
	for _, amp := range []string{"-amp=false", "-amp"} {
		args := append(smallRun, "-epochs", "2", "-lr", "1e9", amp, "-resume", ck, "-resume-force", "-save", ck, "-json", js)
		code, _, stderr := runCLI(args...)
		if code != 3 || !strings.Contains(stderr, "training diverged at step") || !strings.Contains(stderr, "try a lower learning rate (-lr)") {
			t.Errorf("%s: exit %d, %s", amp, code, stderr)
		}
		if b, _ := os.ReadFile(ck); !bytes.Equal(b, good) {
			t.Errorf("%s: the diverged run wrote over the last good checkpoint", amp)
		}
		data, err := os.ReadFile(js)
		var r struct {
			Diverged *run.Diverged `json:"diverged"`
			Error    string        `json:"error"`
		}
		if err != nil || json.Unmarshal(data, &r) != nil || r.Diverged == nil || r.Diverged.Step == 0 || r.Error == "" {
			t.Errorf("%s: -json %v: %s", amp, err, data)
		}
	}
}

// writeIDX writes an IDX file of unsigned bytes.
func writeIDX(t *testing.T, path string, dims []int, body []byte) {
	var b bytes.Buffer
	b.Write([]byte{0, 0, 8, byte(len(dims))})
	for _, d := range dims {
		binary.Write(&b, binary.BigEndian, int32(d))
	}
	b.Write(body)
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Why 3: the report says which folder the dataset came from, and a -data
// that does not hold it is an error naming the files expected there, not
// a silent fallback to the copy found elsewhere.
func TestDatasetProvenance(t *testing.T) {
	root := t.TempDir()
	t.Setenv("LEANGRAD_DATA", root)
	dir := filepath.Join(root, "fashion-mnist")
	os.MkdirAll(dir, 0o755)
	for _, p := range []string{"train", "t10k"} {
		writeIDX(t, filepath.Join(dir, p+"-images-idx3-ubyte"), []int{32, 28, 28}, make([]byte, 32*28*28))
		labels := make([]byte, 32)
		for i := range labels {
			labels[i] = byte(i % 10)
		}
		writeIDX(t, filepath.Join(dir, p+"-labels-idx1-ubyte"), []int{32}, labels)
	}
	base := []string{"-model", "mlp", "-dataset", "fashion-mnist", "-device", "cpu", "-batch", "16", "-measure=false"}
	code, stdout, stderr := runCLI(base...)
	if code != 0 || !strings.Contains(stdout, "read from "+dir) {
		t.Errorf("exit %d; stdout does not name %s:\n%s%s", code, dir, stdout, stderr)
	}
	typo := t.TempDir()
	code, stdout, stderr = runCLI(append(base, "-data", typo)...)
	if code != cmdenv.ExitNothingRan || !strings.Contains(stderr, "dataset not found in "+typo) || !strings.Contains(stderr, "train-images-idx3-ubyte") || strings.Contains(stdout, "training") {
		t.Errorf("a -data without the dataset: exit %d\n%s%s", code, stdout, stderr)
	}
}

// Why 4: resuming with another configuration is an error listing what
// differs, unless -resume-force, and then the report says what changed.
func TestResumeIsStrict(t *testing.T) {
	ck := filepath.Join(t.TempDir(), "run.ckpt")
	if code, _, stderr := runCLI(append(smallRun, "-epochs", "1", "-save", ck)...); code != 0 {
		t.Fatalf("the first run: %d\n%s", code, stderr)
	}
	code, _, stderr := runCLI(append(smallRun, "-epochs", "2", "-resume", ck, "-optimizer", "adamw", "-batch", "32", "-amp")...)
	for _, want := range []string{"optimizer: sgd -> adamw", "batch: 16 -> 32", "amp: none -> f16", "-resume-force"} {
		if code != cmdenv.ExitNothingRan || !strings.Contains(stderr, want) {
			t.Errorf("resume with another optimiser, batch and AMP: exit %d, stderr lacks %q:\n%s", code, want, stderr)
		}
	}
	code, stdout, stderr := runCLI(append(smallRun, "-epochs", "2", "-resume", ck, "-optimizer", "adamw", "-resume-force")...)
	if code != 0 || !strings.Contains(stdout, "changed since the checkpoint (-resume-force): optimizer: sgd -> adamw") {
		t.Errorf("forced resume: exit %d\n%s%s", code, stdout, stderr)
	}
	// The throughput line counts this run's training only: one epoch here,
	// so its seconds are fewer than the run's in all.
	// (The seconds are printed to 0.1 s, which a small run's training, and
	// on a fast machine the whole run, rounds to 0: its img/s must be
	// positive instead.)
	var ips, train, all float64
	for _, l := range strings.Split(stdout, "\n") {
		if strings.HasPrefix(l, "throughput") {
			fmt.Sscanf(l, "throughput %f img/s over this run's training steps (%f s), %f s in all", &ips, &train, &all)
		}
	}
	if ips <= 0 || train < 0 || all < 0 || train > all {
		t.Errorf("after a resume: %.0f img/s, %.1f s of training in %.1f s in all", ips, train, all)
	}
}

// Why 6: an interrupted save's temporary file goes at the next save, however
// fresh (no write holds it); the report tells training peaks from
// evaluation's and says what the summary covers.
func TestStaleTemporariesAndReportWording(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "run.ckpt")
	stale := filepath.Join(dir, ".run.ckpt.tmp-12345")
	os.WriteFile(stale, []byte("torn"), 0o644)
	code, stdout, stderr := runCLI(append(smallRun, "-epochs", "1", "-save", ck)...)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	if _, err := os.Stat(stale); err == nil {
		t.Error("the stale temporary file of an interrupted save is still there")
	}
	for _, want := range []string{"peak allocated", "by the training steps", "evaluation     peak allocated", "the pool's summary below covers training and evaluation"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, stdout)
		}
	}
}

// -max-memory fits the step into the budget: the acceptance run of the
// issue, on a narrower budget than the measured peaks (CPU, batch 64).
func TestMaxMemoryFitsTheBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("trains a ResNet-8 for an epoch")
	}
	js := filepath.Join(t.TempDir(), "r.json")
	code, stdout, stderr := runCLI("-model", "resnet", "-depth", "8", "-dataset", "synthetic", "-device", "cpu", "-limit", "256",
		"-test-limit", "64", "-batch", "64", "-epochs", "1", "-amp", "-checkpoint", "-max-memory", "6MiB", "-json", js, "-measure=false")
	if code != 0 || !strings.Contains(stdout, "fitting a step into a budget of 6.00 MiB") || !strings.Contains(stdout, "chose ") {
		t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
	}
	var r run.Report
	data, _ := os.ReadFile(js)
	if err := json.Unmarshal(data, &r); err != nil || r.Budget == nil || r.Final == nil {
		t.Fatalf("-json: %v", err)
	}
	if r.Final.PeakAllocated > 6<<20 || r.Final.EvalPeakAllocated > 6<<20 {
		t.Errorf("peaks %d (steps) and %d (evaluation) above the 6 MiB budget", r.Final.PeakAllocated, r.Final.EvalPeakAllocated)
	}
	if !r.Budget.Chosen.AMP.On() || r.Budget.Chosen.Checkpoint == nn.NoCheckpoint {
		t.Errorf("chose %+v: -amp and -checkpoint were given, and must be kept", r.Budget.Chosen)
	}
	if got := tensor.CPU().Allocator().Limit(); got != 0 {
		t.Errorf("the run left the CPU's pool capped at %d bytes: the cap is the run's", got)
	}
	t.Logf("%s", stdout)
}

// -max-memory on a language model whose F32 AdamW state fits the budget
// but no step beside it does: the search runs again with the moments in 8
// bits and trains, where it refused; with -optimizer given it still
// refuses, naming the budget.
func TestMaxMemoryMovesTheStateWhenNoStepFits(t *testing.T) {
	dir := t.TempDir()
	text := story(t, dir)
	js := filepath.Join(dir, "r.json")
	args := []string{"-model", "gpt:L2,W128,H2,C64", "-device", "cpu", "-data", text, "-tokenizer", "bytes", "-batch", "4",
		"-steps", "1", "-eval-every", "1", "-eval-batches", "1", "-measure=false", "-max-memory", "7MiB", "-json", js}
	code, stdout, stderr := runCLI(args...)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	moved := "no configuration of its step fits the budget (-max-memory) beside adamw's state on the device: AdamW's moments go to 8 bits"
	if !strings.Contains(stdout, moved) || strings.Count(stdout, "fitting a step into a budget of 7.00 MiB") != 2 {
		t.Errorf("output lacks %q after a first search:\n%s", moved, stdout)
	}
	var r run.Report
	data, err := os.ReadFile(js)
	if err != nil || json.Unmarshal(data, &r) != nil || r.Config.Optimizer != "adamw8bit" || r.Budget == nil || r.Budget.Chosen.Name == "" ||
		r.Final == nil || r.Final.PeakAllocated > 7<<20 {
		t.Errorf("-json: %v %+v", err, r)
	}
	code, stdout, stderr = runCLI(append(args, "-optimizer", "adamw", "-json", "")...)
	if code == 0 || strings.Contains(stdout, moved) || !strings.Contains(stderr, "no configuration fits a budget of 7.00 MiB") {
		t.Errorf("-optimizer adamw: exit %d\n%s\n%s", code, stdout, stderr)
	}
}
