package benchmarks

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/internal/race"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
	"github.com/leangrad/leangrad/train"
)

// TestHarnessOnCPU runs the harness on a tiny configuration, with the claims
// suite, and checks that the report's JSON parses back and its numbers are
// sane.
func TestHarnessOnCPU(t *testing.T) {
	dev := tensor.CPU()
	rep := &Report{Date: "test", Device: dev.Name()}
	for _, c := range train.Variants(nn.NoCheckpoint, train.AMPF16) {
		r, err := Run(dev, Spec{Model: "resnet20", Batch: 2, Config: c.Name}, Options{Warmup: 1, Steps: 2, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		if r.MedianMS <= 0 || r.PeakAllocated <= 0 || len(r.Timeline) == 0 {
			t.Errorf("%s: %+v", c.Name, r)
		}
		rep.Results = append(rep.Results, r)
	}
	if _, err := Run(dev, Spec{Model: "mlp", Batch: 2, Config: "checkpoint"}, Options{Steps: 1}); err == nil {
		t.Error("checkpointing an MLP was accepted")
	}
	lk, err := LeakyLoop(dev, "mlp", 4, 3, 3, 1)
	if err != nil || lk.Verdict != "reproduced" || !strings.Contains(lk.Summary, "f32 [1] tensor") || !strings.Contains(lk.Summary, "train.(*Step).forward") {
		t.Errorf("leaky loop: %v %+v", err, lk)
	}
	Relate(rep.Results)
	rep.Claims = append(ClaimsFromResults(rep.Results, "resnet20", 2), lk)
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(data, &back); err != nil || len(back.Results) != 4 || len(back.Claims) != 3 {
		t.Fatalf("JSON round trip: %v, %d results, %d claims", err, len(back.Results), len(back.Claims))
	}
	if s := back.Results[1].SavingVsFP32; s <= 0 {
		t.Errorf("AMP saving %v", s)
	}
	// A CPU step is eager: the planned peak a GPU run reports, made up.
	rep.Results[3].Peak = &train.Breakdown{Allocated: 3 << 20, Parameters: 1 << 20, Gradients: 1 << 20, Phase: "the backward of conv2d",
		Saved: []ag.SavedBytes{{Op: "checkpoint", Bytes: 1 << 20, Blocks: 1}}}
	var md bytes.Buffer
	rep.Markdown(&md)
	for _, want := range []string{"| resnet20 | 2 | amp+checkpoint |",
		"- resnet20 2 amp+checkpoint: 3.0 MiB during the backward of conv2d: parameters 1.00 MiB, optimiser state 0 B, batch 0 B, saved for the backward 1.00 MiB, gradients 1.00 MiB, other 0 B; saved by checkpoint 1.00 MiB\n"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown without %q:\n%s", want, md.String())
		}
	}
	dir := t.TempDir()
	if err := rep.PlotBars(dir+"/t.png", "t", "ms", func(r Result) float64 { return r.MedianMS }); err != nil {
		t.Error(err)
	}
	if paths, err := rep.PlotTimelines(dir); err != nil || len(paths) != 1 {
		t.Errorf("timelines: %v %v", paths, err)
	}
	if st, err := os.Stat(dir + "/t.png"); err != nil || st.Size() == 0 {
		t.Error("no plot written")
	}
}

// benchmarkStep times one configuration under go test -bench, on the device
// named by $LEANGRAD_DEVICE (default auto).
func benchmarkStep(b *testing.B, model string, batch int, config string) {
	spec := os.Getenv("LEANGRAD_DEVICE")
	if spec == "" {
		spec = "auto"
	}
	dev, err := tensor.Open(spec)
	if err != nil {
		b.Fatal(err)
	}
	r, err := Run(dev, Spec{Model: model, Batch: batch, Config: config}, Options{Warmup: 3, Steps: max(b.N, 5), Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r.MedianMS, "ms/step")
	b.ReportMetric(r.ImgPerSec, "img/s")
	b.ReportMetric(float64(r.PeakAllocated)/(1<<20), "peak-MiB")
	if r.LaunchesPerStep > 0 {
		b.ReportMetric(r.LaunchesPerStep, "launches/step")
	}
}

func BenchmarkResNet20(b *testing.B) {
	for _, c := range train.Variants(nn.NoCheckpoint, train.AMPF16) {
		b.Run(c.Name, func(b *testing.B) { benchmarkStep(b, "resnet20", 256, c.Name) })
	}
}

func BenchmarkResNet18(b *testing.B) {
	for _, c := range train.Variants(nn.NoCheckpoint, train.AMPF16) {
		b.Run(c.Name, func(b *testing.B) { benchmarkStep(b, "resnet18", 256, c.Name) })
	}
}

func BenchmarkMLP(b *testing.B) {
	for _, c := range train.Variants(nn.NoCheckpoint, train.AMPF16)[:2] {
		b.Run(c.Name, func(b *testing.B) { benchmarkStep(b, "mlp", 256, c.Name) })
	}
}

// TestConfigsNamedByDType: an AMP configuration named by its dtype runs
// in it whatever Options.AMP says, amp and amp+checkpoint in Options'; names
// off the list are refused, and light checkpoints for a model that is not a
// GPT; PyTorch's reference (pytorch/ref.py) takes the same names.
func TestConfigsNamedByDType(t *testing.T) {
	m, err := train.LookupArch("resnet20")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name          string
		amp           train.AMP // the variant's
		ckpt          bool
		productsDType tensor.DType // ConfigDType's
	}{
		{"fp32", train.NoAMP, false, tensor.F32},
		{"amp", train.AMPF16, false, tensor.F16},
		{"bf16", train.AMPBF16, false, tensor.BF16},
		{"f16", train.AMPF16, false, tensor.F16},
		{"checkpoint", train.NoAMP, true, tensor.F32},
		{"amp+checkpoint", train.AMPF16, true, tensor.F16},
		{"bf16+checkpoint", train.AMPBF16, true, tensor.BF16},
	} {
		v, err := variant(m, c.name, Options{AMP: train.AMPF16})
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if v.Name != c.name || v.AMP != c.amp || (v.Checkpoint != nn.NoCheckpoint) != c.ckpt {
			t.Errorf("%s: %+v, want AMP %v, checkpointing %v", c.name, v, c.amp, c.ckpt)
		}
		if d := ConfigDType(c.name, train.AMPF16); d != c.productsDType {
			t.Errorf("ConfigDType(%q) = %v, want %v", c.name, d, c.productsDType)
		}
		if err := CheckConfigs(c.name); err != nil {
			t.Errorf("CheckConfigs(%q): %v", c.name, err)
		}
	}
	if v, _ := variant(m, "amp", Options{AMP: train.AMPBF16}); v.AMP != train.AMPBF16 {
		t.Errorf("amp under Options{AMP: bf16}: %+v, want bf16", v)
	}
	if v, err := variant(m, "bf16+checkpoint+offload", Options{}); err != nil || !v.OffloadActivations || v.Checkpoint == nn.NoCheckpoint || v.AMP != train.AMPBF16 {
		t.Errorf("bf16+checkpoint+offload: %+v, %v", v, err)
	}
	if v, _ := variant(m, "bf16+checkpoint", Options{}); v.OffloadActivations {
		t.Errorf("bf16+checkpoint offloads: %+v", v)
	}
	// Light checkpoints are a GPT's: a run of one, refused for a ResNet.
	if _, err := variant(m, "bf16+checkpoint-light", Options{}); err == nil || !strings.Contains(err.Error(), "resnet20 is not a GPT") {
		t.Errorf("bf16+checkpoint-light for resnet20: %v", err)
	}
	if r, err := Run(tensor.CPU(), Spec{Model: "gpt-mini", Batch: 2, Config: "bf16+checkpoint-light"}, Options{Warmup: 1, Steps: 1, Seed: 1}); err != nil ||
		r.Config != "bf16+checkpoint-light" || r.MedianMS <= 0 {
		t.Errorf("a light checkpoint's run of gpt-mini: %v, %+v", err, r)
	}
	if _, err := Run(tensor.CPU(), Spec{Model: "gpt-mini", Batch: 1, Config: "checkpoint+offload"}, Options{Warmup: 1, Steps: 1}); err == nil ||
		!strings.Contains(err.Error(), "nothing to offload") {
		t.Errorf("an offloaded configuration on the CPU: %v", err)
	}
	for _, bad := range []string{"fp16", "amp+bf16", "bf16+", "bf16,amp+f16", "bf16+offload", "offload"} {
		if err := CheckConfigs(bad); err == nil {
			t.Errorf("CheckConfigs(%q) accepted it", bad)
		}
	}
	r, err := Run(tensor.CPU(), Spec{Model: "mlp", Batch: 2, Config: "bf16"}, Options{Warmup: 1, Steps: 1, Seed: 1, AMP: train.AMPF16})
	if err != nil || r.Config != "bf16" || r.MedianMS <= 0 {
		t.Errorf("a bf16 run of the MLP: %v, %+v", err, r)
	}
	// PyTorch's reference takes the same names.
	src, err := os.ReadFile("pytorch/ref.py")
	if err != nil {
		t.Fatal(err)
	}
	table := regexp.MustCompile(`(?s)\nCONFIGS = \{(.*?)\}\n`).FindSubmatch(src)
	if table == nil {
		t.Fatal("pytorch/ref.py: no CONFIGS table")
	}
	var keys []string
	for _, m := range regexp.MustCompile(`"([a-z0-9+-]+)": \(`).FindAllSubmatch(table[1], -1) {
		keys = append(keys, string(m[1]))
	}
	if names := ConfigNames(); !slices.Equal(keys, names) {
		t.Errorf("pytorch/ref.py's configurations %v, the harness's %v", keys, names)
	}
}

// The fragmentation claim measures inactive split bytes, after every shape
// ran once, and reports the cached bytes beside them.
func TestFragmentationClaim(t *testing.T) {
	dev := tensor.CPU()
	c, err := Fragmentation(dev, "mlp", 2048, 12, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"mean_inactive_split_mib", "mean_inactive_split_mib_with_empty_cache", "mean_cached_mib", "ms_per_step"} {
		if v, ok := c.Numbers[k]; !ok || v < 0 || math.IsNaN(v) {
			t.Errorf("%s = %v, %v", k, v, ok)
		}
	}
	if !strings.Contains(c.Summary, "after every shape ran once") || !strings.Contains(c.Summary, "inactive split") {
		t.Errorf("summary: %s", c.Summary)
	}
	// Both arms see the same sequence of batches; EmptyCache gives the
	// cached segments back, so the arm that calls it holds less cached
	// memory on average, and something was cached to give back.
	if n := c.Numbers; !(n["mean_cached_mib_with_empty_cache"] < n["mean_cached_mib"]) {
		t.Errorf("cached %.3f MiB on average with EmptyCache every 3 steps, %.3f without: want less with it",
			n["mean_cached_mib_with_empty_cache"], n["mean_cached_mib"])
	}
	if c.Verdict == "" {
		t.Error("no verdict")
	}
}

// TestLargestBatchClaim: under a cap the largest batch is found for fp32
// and AMP; the batch found trains under the same cap and one a tenth larger
// does not (right at the boundary the pool's rounding lets a batch fit
// where a smaller one does not), and nothing stays allocated.
func TestLargestBatchClaim(t *testing.T) {
	dev := tensor.CPU()
	const limit = 6 << 20
	c, err := LargestBatch(dev, "mlp", 0, limit, Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	fp32, amp := int(c.Numbers["fp32_batch"]), int(c.Numbers["amp_batch"])
	t.Log(c.Summary)
	if fp32 < 8 || amp < 8 {
		t.Errorf("largest batches: fp32 %d, amp %d: want batches of some size", fp32, amp)
	}
	m, _ := train.LookupArch("mlp")
	a := dev.Allocator()
	step := func(b int) error {
		a.EmptyCache()
		a.SetLimit(limit)
		defer a.SetLimit(0)
		defer func() { recover() }() // an OOM while building is a batch that does not fit
		s, err := newStepper(dev, m, train.Variant{Name: "fp32", Checkpoint: nn.NoCheckpoint}, b, Options{Seed: 1}, false)
		if err != nil {
			return err
		}
		defer s.release()
		s.tr.FailOnOOM = true
		if err := s.step(); err != nil {
			return err
		}
		return s.step()
	}
	if b := fp32 + fp32/10; step(b) == nil {
		t.Errorf("a batch of %d, a tenth more than the largest found, trains under the cap", b)
	}
	if err := step(fp32); err != nil {
		t.Errorf("the largest batch found, %d, does not train under the cap: %v", fp32, err)
	}
	if got := a.Stats().Allocated[memory.All].Current; got != 0 {
		t.Errorf("%d bytes left allocated", got)
	}
}

// TestProfileOnCPU: the CPU's profile counts each operation of a step once,
// under its kind and dtype (an MLP step of three layers: three products
// forward, with their biases in the epilogue, five backward, three with
// the bias gradients), and its total is the sum of the kinds.
func TestProfileOnCPU(t *testing.T) {
	dev := tensor.CPU()
	for _, tc := range []struct {
		config, dtype, extra string
	}{
		{"fp32", "f32", "SGD f32"},
		{"amp", "f16", "Cast f32 to f16"},
	} {
		ops, total, err := Profile(dev, Spec{Model: "mlp", Batch: 4, Config: tc.config}, Options{Warmup: 1, Steps: 3, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		var sum float64
		count := map[string]int{}
		products := 0
		for i, op := range ops {
			sum += op.MS
			count[op.Op] = op.Count
			if strings.HasPrefix(op.Op, "Gemm") && strings.HasSuffix(op.Op, " "+tc.dtype) {
				products += op.Count
			}
			if i > 0 && op.MS > ops[i-1].MS {
				t.Errorf("%s: %s (%v ms) after %s (%v ms): not the most first", tc.config, op.Op, op.MS, ops[i-1].Op, ops[i-1].MS)
			}
		}
		if products != 8 || count["GemmEpilogue bias "+tc.dtype] != 3 || count["GemmEpilogue bias grad of A "+tc.dtype] != 3 ||
			count[tc.extra] == 0 || math.Abs(sum-total) > 1e-9 || total <= 0 {
			t.Errorf("%s: %d %s products, %d× %s, total %v ms (sum %v): %+v", tc.config, products, tc.dtype, count[tc.extra], tc.extra, total, sum, ops)
		}
	}
}

// TestMedianRounds: each engine's result is its median round; the notes
// compare within rounds: PyTorch's step time over leangrad's, and AMP's
// over fp32's.
func TestMedianRounds(t *testing.T) {
	res := func(engine, config string, ms float64) Result {
		return Result{Engine: engine, Model: "mlp", Batch: 8, Config: config, MedianMS: ms}
	}
	rounds := [][]Result{
		{res("leangrad", "fp32", 10), res("leangrad", "amp", 5), res("pytorch", "fp32", 10)},
		{res("leangrad", "fp32", 40), res("leangrad", "amp", 8), res("pytorch", "fp32", 20)},
		{res("leangrad", "fp32", 20), res("leangrad", "amp", 6), res("pytorch", "fp32", 60)},
		{res("leangrad", "fp32", 30), res("leangrad", "amp", 9), res("pytorch", "fp32", 30)},
	}
	got, notes := MedianRounds(rounds)
	want := []float64{20, 6, 20} // the lower middle of four
	if len(got) != len(want) {
		t.Fatalf("%d results, want %d", len(got), len(want))
	}
	for i, w := range want {
		if got[i].MedianMS != w || got[i].Engine != rounds[0][i].Engine || got[i].Config != rounds[0][i].Config {
			t.Errorf("result %d: %+v, want %s %s at %v ms", i, got[i], rounds[0][i].Engine, rounds[0][i].Config, w)
		}
	}
	wantNotes := []string{"mlp batch 8 fp32 over 4 rounds, leangrad's speed over PyTorch's round by round: " +
		"1.00x (leangrad first), 0.50x (PyTorch first), 3.00x (leangrad first), 1.00x (PyTorch first); median 1.00x.",
		"mlp batch 8 amp over 4 rounds, its step time over fp32's round by round: 0.50x, 0.20x, 0.30x, 0.30x; median 0.30x."}
	if !slices.Equal(notes, wantNotes) {
		t.Errorf("notes %q,\nwant %q", notes, wantNotes)
	}
	if _, notes := MedianRounds(rounds[:1]); len(notes) != 0 {
		t.Errorf("one round gave notes %q", notes)
	}
}

// TestModelFLOPsAndMFU: a GPT step counts 6·N + 12·L·C·T FLOPs a token (N
// its parameters: GPT-2's layout, 12·L·C² + 13·L·C + V·C + T·C + 2·C), and
// the MFU notes divide the step's rate by the measured peak of its dtype.
func TestModelFLOPsAndMFU(t *testing.T) {
	dev := tensor.CPU()
	const L, C, V, T, batch = 2, 16, 50, 8, 3
	g, err := nn.NewGPT(dev, nn.GPTConfig{Layers: L, Heads: 2, Width: C, Vocab: V, Context: T})
	if err != nil {
		t.Fatal(err)
	}
	defer nn.Release(g)
	n := 12*L*C*C + 13*L*C + V*C + T*C + 2*C
	if got, want := modelFLOPs(g, batch), float64(6*n+12*L*C*T)*batch*T; got != want {
		t.Errorf("modelFLOPs = %v, want %v (N = %d)", got, want, n)
	}
	results := []Result{
		{Engine: "leangrad", Model: "gpt2", Batch: 16, Config: "amp", MedianMS: 45, FLOPsPerStep: 14.09e12},
		{Engine: "leangrad", Model: "gpt2", Batch: 16, Config: "fp32", MedianMS: 300, FLOPsPerStep: 14.09e12},
		{Engine: "pytorch", Model: "gpt2", Batch: 16, Config: "amp", MedianMS: 48, FLOPsPerStep: 14.09e12},
		{Engine: "leangrad", Model: "resnet20", Batch: 256, Config: "amp", MedianMS: 5},
		{Engine: "leangrad", Model: "gpt2", Batch: 16, Config: "f16+checkpoint", MedianMS: 60, FLOPsPerStep: 14.09e12},
	}
	got := MFU(results, train.AMPBF16, map[tensor.DType]float64{tensor.BF16: 780, tensor.F16: 700, tensor.F32: 50},
		map[tensor.DType]string{tensor.BF16: "bf16 8192³ product", tensor.F16: "f16 8192³ product", tensor.F32: "f32 8192³ product"})
	want := []string{
		"leangrad gpt2 batch 16 amp: 14.09 TFLOP a step (6N + 12·L·C·T a token), 313.1 TFLOP/s, MFU 40.1% of the measured bf16 8192³ product peak (780 TFLOP/s).",
		"leangrad gpt2 batch 16 fp32: 14.09 TFLOP a step (6N + 12·L·C·T a token), 47.0 TFLOP/s, MFU 93.9% of the measured f32 8192³ product peak (50 TFLOP/s).",
		"leangrad gpt2 batch 16 f16+checkpoint: 14.09 TFLOP a step (6N + 12·L·C·T a token), 234.8 TFLOP/s, MFU 33.5% of the measured f16 8192³ product peak (700 TFLOP/s).",
	}
	if !slices.Equal(got, want) {
		t.Errorf("MFU notes:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if r, err := GemmPeak(dev, tensor.F32, 32, 3); err != nil || !(r > 0) || math.IsInf(r, 0) {
		t.Errorf("GemmPeak on the CPU: %v TFLOP/s, %v", r, err)
	}
}

// TestReportNamesTheCompileModes: a report beside PyTorch on a GPU says
// which torch.compile mode ran, language models' (the default) named only
// where one is among the results.
func TestReportNamesTheCompileModes(t *testing.T) {
	for _, tc := range []struct {
		model string
		lm    bool
	}{{"resnet20", false}, {"gpt2", true}, {"gpt-mini", true}} {
		rep := Report{Device: "cuda:0 (a GPU)", Date: "2026-12-03", PyTorch: "2.11",
			Results: []Result{{Engine: engineLeangrad, Model: tc.model, Batch: 2, Config: "amp", MedianMS: 1, ImgPerSec: 2}}}
		var b bytes.Buffer
		rep.Markdown(&b)
		if !strings.Contains(b.String(), `torch.compile(mode="reduce-overhead")`) {
			t.Errorf("%s: the report does not name reduce-overhead:\n%s", tc.model, b.String())
		}
		if got := strings.Contains(b.String(), "for language models torch.compile in its default mode"); got != tc.lm {
			t.Errorf("%s: the report names the language models' mode: %v, want %v:\n%s", tc.model, got, tc.lm, b.String())
		}
	}
}

// TestLargestModelClaim: the search takes the models smallest first,
// trains each in the fastest configuration that fits the cap, rules out
// without running one whose parameters, gradients and optimizer state
// alone pass it, goes on to 8-bit AdamW after a step that runs out of
// memory, and stops at the first model that trains in none; on a CPU no
// configuration offloads, and the pool ends as it began. Without the race
// detector: it adds nothing to the training it runs (.ci/run runs it).
func TestLargestModelClaim(t *testing.T) {
	race.Skip(t, "go test ./benchmarks -run TestLargestModelClaim")
	dev := tensor.CPU()
	m, _ := arch("gpt-mini", Options{})
	g := m.GPT
	g.Context = 16
	mini := 16 * int64(g.Params()) // parameters, gradients and AdamW's moments
	const ruledOut, outOfMemory = "bf16+checkpoint: ruled out, its parameters, gradients and optimizer state take", "bf16+checkpoint: out of memory"
	for _, c := range []struct {
		name   string
		limit  int64
		config string // gpt-mini's ("": none trains)
		tried  string // what gpt-mini tried before it
		next   string // what the model after the largest says first
	}{
		{"mini trains, small is ruled out", 200 << 20, "bf16+checkpoint", "", ruledOut},
		{"mini's F32 step runs out, 8-bit AdamW trains", mini + 1<<20, "bf16+checkpoint, 8-bit AdamW", outOfMemory, ruledOut},
		{"nothing fits", 60 << 20, "", "", ruledOut},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := dev.Allocator().Stats().Allocated[memory.All].Current
			var seen []string
			claim, fits, err := LargestModel(dev, []string{"gpt-small", "gpt-mini"}, c.limit, 16, 2, 2, Options{Seed: 1}, func(f ModelFit) { seen = append(seen, f.Model) })
			if err != nil {
				t.Fatal(err)
			}
			t.Log(claim.Summary)
			want := []string{"gpt-mini", "gpt-small"}
			if c.config == "" {
				want = want[:1]
			}
			if !slices.Equal(seen, want) || len(fits) != len(want) {
				t.Fatalf("models tried %v, want %v (fits %+v)", seen, want, fits)
			}
			last := fits[len(fits)-1]
			if last.Config != "" || len(last.Tried) == 0 || !strings.HasPrefix(last.Tried[0], c.next) {
				t.Errorf("the model that did not train: %+v, want %q first", last, c.next)
			}
			if c.config == "" {
				if claim.Verdict != "refuted" || !strings.Contains(claim.Summary, "none of") {
					t.Errorf("no model trains: %s: %s", claim.Verdict, claim.Summary)
				}
				return
			}
			f := fits[0]
			if f.Config != c.config || strings.Join(f.Tried, "; ") != c.tried || f.TokensPerS <= 0 || f.PeakAllocated > c.limit ||
				claim.Numbers["largest_params"] != float64(f.Params) {
				t.Errorf("gpt-mini: %+v, want %q after %q; claim %v", f, c.config, c.tried, claim.Numbers)
			}
			if after := dev.Allocator().Stats().Allocated[memory.All].Current; after != before {
				t.Errorf("%d bytes allocated after the search, %d before", after, before)
			}
		})
	}
}
