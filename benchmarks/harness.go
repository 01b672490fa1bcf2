// Package benchmarks is leangrad's benchmark harness: the same models, batch
// sizes and memory configurations (fp32, AMP, checkpointing, both) timed on
// a device and measured by the pool, set beside PyTorch's numbers from the
// reference script in pytorch/ref.py, plus the "seed claims" suite that
// reproduces or refutes common advice about GPU memory with numbers.
//
// cmd/bench runs it; the Go benchmarks in bench_test.go run single
// configurations under go test -bench.
package benchmarks

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/leangrad/leangrad/dist"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
	"github.com/leangrad/leangrad/train"
)

// The harness benchmarks the models of train's registry (train.LookupArch),
// on random inputs of each one's Input shape: Gaussian images and uniform
// labels, or uniform tokens and next tokens.

// build makes m on dev from seed, for its own input shape.
func build(dev *tensor.Device, m train.Arch, seed uint64) (nn.Model, error) {
	return m.Build(dev, m.Input, m.Classes, seed)
}

// randomBatch is a batch of b random examples for m, in the current scope.
func randomBatch(dev *tensor.Device, m train.Arch, b int, rng *rand.Rand) (x, y *tensor.Tensor) {
	labels := func(n int) []int32 {
		l := make([]int32, n)
		for i := range l {
			l[i] = int32(rng.IntN(m.Classes))
		}
		return l
	}
	if m.Text {
		T := m.Input[0]
		return tensor.FromInt32(dev, labels(b*T), b, T), tensor.FromInt32(dev, labels(b*T), b, T)
	}
	return tensor.Randn(dev, tensor.F32, 0, 1, append([]int{b}, m.Input...)...), tensor.FromInt32(dev, labels(b), b)
}

// recipe is the training configuration the harness times m with: SGD with
// Nesterov momentum at a constant rate for the image models; a language
// model's own recipe's optimiser and clipping (AdamW, gradients clipped to
// norm 1), as PyTorch's twin runs them, at a constant rate.
func recipe(m train.Arch, v train.Variant, batch int, seed uint64, capture bool) train.Config {
	cfg := train.Config{Model: m.Name, Epochs: 1, Batch: batch, LR: 0.01, Momentum: 0.9, WeightDecay: 5e-4,
		Optimizer: "sgd", Schedule: "constant", AMP: v.AMP, Checkpoint: v.Checkpoint, Seed: seed, Capture: capture,
		OffloadOptimizer: v.OffloadOptimizer, OffloadActivations: v.OffloadActivations, BF16Weights: v.BF16Weights}
	if r := m.Recipe; r != nil {
		cfg.Optimizer, cfg.LR, cfg.Momentum, cfg.Beta2, cfg.WeightDecay, cfg.ClipNorm = r.Optimizer, r.LR, 0, r.Beta2, r.WeightDecay, r.ClipNorm
	}
	if v.Optimizer != "" {
		cfg.Optimizer = v.Optimizer
	}
	return cfg
}

// A configuration's name is one of train.Variants' (fp32, amp,
// checkpoint, amp+checkpoint: AMP in Options.AMP) or an AMP one named by
// what it autocasts to (bf16, f16, bf16+checkpoint, f16+checkpoint), so
// that one run holds both AMP dtypes.
var ampDTypes = []train.AMP{train.AMPBF16, train.AMPF16}

// ConfigNames is every configuration's name, in reports' order: each
// checkpointed one also with "+offload", what its checkpoints keep held in
// host memory (train.Variant.OffloadActivations; a GPU's); then a GPT's
// light checkpoints (nn.CheckpointLight), without it.
func ConfigNames() []string {
	var names []string
	for _, v := range append(train.Variants(nn.CheckpointBlocks, train.AMPF16), lightVariants(train.AMPF16)...) {
		named := []string{v.Name}
		if rest, ok := strings.CutPrefix(v.Name, "amp"); ok {
			for _, d := range ampDTypes {
				named = append(named, d.String()+rest)
			}
		}
		names = append(names, named...)
		if v.Checkpoint == nn.CheckpointBlocks {
			for _, n := range named {
				names = append(names, n+offloadSuffix)
			}
		}
	}
	return names
}

// lightVariants are a GPT's light checkpoints (nn.CheckpointLight), in
// F32 and with amp: the checkpointed two of train.Variants.
func lightVariants(amp train.AMP) []train.Variant { return train.Variants(nn.CheckpointLight, amp)[2:] }

// offloadSuffix marks a configuration whose checkpoints' kept tensors go
// to host memory.
const offloadSuffix = "+offload"

// CheckConfigs checks a comma-separated list of configuration names
// before any work.
func CheckConfigs(list string) error {
	names := ConfigNames()
	for _, c := range strings.Split(list, ",") {
		if !slices.Contains(names, c) {
			return fmt.Errorf("unknown configuration %q: want %s", c, strings.Join(names, ", "))
		}
	}
	return nil
}

// ConfigAMP is what the configuration named name autocasts to: the dtype
// its name gives (bf16, f16+checkpoint, ...), amp's for amp and
// amp+checkpoint (AMPF16 when amp is NoAMP), and NoAMP for the others.
func ConfigAMP(name string, amp train.AMP) train.AMP {
	for _, d := range ampDTypes {
		if name == d.String() || strings.HasPrefix(name, d.String()+"+") {
			return d
		}
	}
	if strings.HasPrefix(name, "amp") {
		if !amp.On() {
			return train.AMPF16
		}
		return amp
	}
	return train.NoAMP
}

// ConfigDType is the dtype the configuration named name computes its
// products in: F32, or what its AMP autocasts to (ConfigAMP).
func ConfigDType(name string, amp train.AMP) tensor.DType {
	if a := ConfigAMP(name, amp); a.On() {
		return a.DType()
	}
	return tensor.F32
}

// arch is the registry's entry for model, with o's vocabulary.
func arch(model string, o Options) (train.Arch, error) {
	m, err := train.LookupArch(model)
	if err == nil && m.Text && o.Vocab > 0 {
		m.Classes = o.Vocab
	}
	return m, err
}

// LMReference is a language model's shape and recipe as the PyTorch
// reference builds and trains it (benchmarks/pytorch/ref.py's --lm).
type LMReference struct {
	Layers  int     `json:"layers"`
	Heads   int     `json:"heads"`
	Width   int     `json:"width"`
	Vocab   int     `json:"vocab"`
	Context int     `json:"context"`
	Dropout float32 `json:"dropout"`
	LR      float64 `json:"lr"`
	Beta2   float64 `json:"beta2"`
	WD      float64 `json:"wd"`
	Clip    float64 `json:"clip"`
}

// ReferenceLM returns the LMReference of model, a language model of the
// registry, with o's vocabulary: what Run trains; false for any other
// model.
func ReferenceLM(model string, o Options) (LMReference, bool) {
	m, err := arch(model, o)
	if err != nil || !m.Text {
		return LMReference{}, false
	}
	g, r := m.GPT, m.Recipe
	return LMReference{Layers: g.Layers, Heads: g.Heads, Width: g.Width, Vocab: m.Classes, Context: m.Input[0],
		Dropout: g.Dropout, LR: r.LR, Beta2: r.Beta2, WD: r.WeightDecay, Clip: r.ClipNorm}, true
}

// variant is the configuration named name (ConfigNames) for m and o: its
// checkpointing checkpoints m.Segments (or, light, a GPT's blocks), and
// its AMP autocasts to what ConfigAMP says.
func variant(m train.Arch, name string, o Options) (train.Variant, error) {
	amp := ConfigAMP(name, o.AMP)
	unloaded, offload := strings.CutSuffix(name, offloadSuffix)
	base := unloaded
	if d := amp.String(); amp.On() && strings.HasPrefix(unloaded, d) {
		base = "amp" + strings.TrimPrefix(unloaded, d)
	}
	for _, v := range append(train.Variants(m.Segments, amp), lightVariants(amp)...) {
		if v.Name == base {
			if v.Checkpoint != nn.NoCheckpoint && m.Blocks == 0 {
				return v, fmt.Errorf("%s has no blocks to checkpoint", m.Name)
			}
			if v.Checkpoint == nn.CheckpointLight && !m.Text {
				return v, fmt.Errorf("configuration %q: light checkpoints keep the products of a GPT's blocks; %s is not a GPT", name, m.Name)
			}
			if offload && v.Checkpoint == nn.NoCheckpoint {
				return v, fmt.Errorf("configuration %q: only checkpoints keep what %s moves to host memory", name, offloadSuffix)
			}
			v.Name, v.OffloadActivations = name, offload
			return v, nil
		}
	}
	return train.Variant{}, fmt.Errorf("unknown configuration %q", name)
}

// Spec is one benchmark: a model, a batch size and a configuration.
type Spec struct {
	Model  string `json:"model"`
	Batch  int    `json:"batch"`
	Config string `json:"config"`
}

// Result is what one benchmark measured. PyTorch's reference script writes
// the same fields (without the leangrad-only ones).
type Result struct {
	Engine         string  `json:"engine"` // "leangrad" or "pytorch"
	Model          string  `json:"model"`
	Batch          int     `json:"batch"`
	Config         string  `json:"config"`
	Device         string  `json:"device"`
	Steps          int     `json:"steps"`
	MedianMS       float64 `json:"median_ms"` // device-synchronised step time
	ImgPerSec      float64 `json:"img_per_s"`
	PeakAllocated  int64   `json:"peak_allocated"`
	PeakReserved   int64   `json:"peak_reserved"`
	SavingVsFP32   float64 `json:"saving_vs_fp32"`            // 1 − peak/peak(fp32)
	OverheadFP32   float64 `json:"overhead_vs_fp32"`          // step time/step time(fp32) − 1
	CompileSeconds float64 `json:"compile_seconds,omitempty"` // torch.compile only: the first steps, compiling
	// leangrad only
	Mode            string  `json:"mode,omitempty"`              // the step's: eager, planned or captured
	HostMS          float64 `json:"host_ms,omitempty"`           // median time to queue a step, before waiting for the device
	LaunchesPerStep float64 `json:"launches_per_step,omitempty"` // kernels, library calls, copies and graph launches
	PlannedArena    int64   `json:"planned_arena,omitempty"`     // the planned step's arena
	// Peak says what the planned (captured) step holds at its arena's peak.
	Peak       *train.Breakdown `json:"peak,omitempty"`
	Notes      []string         `json:"notes,omitempty"`      // the step's: captures, fallbacks
	Ranks      int              `json:"ranks,omitempty"`      // data parallel: the processes, one per device
	Overlapped bool             `json:"overlapped,omitempty"` // data parallel: the all-reduces overlapped the backward
	Sharded    bool             `json:"sharded,omitempty"`    // data parallel: the optimiser's state sharded over the ranks
	// OptimizerStateBytes is the optimiser's state on this device (this
	// rank's shard, when sharded).
	OptimizerStateBytes int64          `json:"optimizer_state_bytes,omitempty"`
	FLOPsPerStep        float64        `json:"flops_per_step,omitempty"` // a language model's: see modelFLOPs
	Timeline            []memory.Event `json:"-"`
}

// modelFLOPs is a GPT step's floating-point operations as llm.c and PaLM
// count them: 6·N + 12·L·C·T a token (N parameters, the tied embedding
// once; L layers of width C; the attention of T positions, causal or not),
// for batch·T tokens; 0 for other models.
func modelFLOPs(model nn.Model, batch int) float64 {
	g, ok := model.(*nn.GPT)
	if !ok {
		return 0
	}
	var n int
	for _, p := range nn.Parameters(g) {
		n += p.Numel()
	}
	c := g.Cfg
	return c.TokenFLOPs(int64(n)) * float64(batch*c.Context)
}

// Options tune a run.
type Options struct {
	Warmup, Steps int
	Seed          uint64
	// Eager runs the step eagerly even where it would be captured (CUDA);
	// the result's engine is then "leangrad-eager".
	Eager bool
	// Group makes the run one rank of a data-parallel job: every rank
	// steps on its own batch of the spec's size, the gradients are
	// averaged, and ImgPerSec counts every rank's images (engine
	// "leangrad-ddp"; Ranks says how many).
	Group *dist.Group
	// NoOverlap makes a data-parallel step all-reduce its gradients after
	// the backward instead of overlapping it (dist.Reducer.SetOverlap).
	NoOverlap bool
	// ShardOptimizer shards the optimiser's state over the group's ranks
	// (dist.Shard).
	ShardOptimizer bool
	// AMP is what the amp configurations autocast to: F16 (the default,
	// with a GradScaler) or BF16; the configurations named by their dtype
	// (bf16, f16+checkpoint, ...) autocast to it.
	AMP train.AMP
	// Vocab, if set, is a language model's vocabulary instead of its
	// preset's: 50,304 is GPT-2's padded to a multiple of 64, as nanoGPT
	// and llm.c train it.
	Vocab int
	// Planning, if set, is how planned and captured steps size their
	// convolutions' workspaces instead of memory.DefaultPlanOptions.
	Planning *memory.PlanOptions
}

// launchCounter is implemented by backends that count their launches (CUDA).
type launchCounter interface{ Launches() uint64 }

// stepper is a training run of one model and configuration: a
// train.Trainer (the optimiser recipe gives, at a constant learning rate)
// whose steps are the ones users run, on one fixed batch.
type stepper struct {
	dev   *tensor.Device
	model nn.Model
	tr    *train.Trainer
	x, y  *tensor.Tensor
}

func newStepper(dev *tensor.Device, m train.Arch, v train.Variant, batch int, o Options, capture bool) (*stepper, error) {
	cfg := recipe(m, v, batch, o.Seed, capture)
	m, err := m.For(cfg)
	if err != nil {
		return nil, err
	}
	model, err := build(dev, m, o.Seed)
	if err != nil {
		return nil, err
	}
	tr, err := train.New(model, dev, cfg, 1)
	if err != nil {
		nn.Release(model)
		return nil, err
	}
	if o.Planning != nil {
		tr.Step.Planning = *o.Planning
	}
	s := &stepper{dev: dev, model: model, tr: tr}
	dev.WithScope(func() {
		x, y := randomBatch(dev, m, batch, rand.New(rand.NewPCG(o.Seed, 7)))
		s.x, s.y = tr.Step.Inputs(x.DType(), x.Shape(), y.Shape())
		dev.Backend().Copy(s.x.Buf(), x.Buf())
		dev.Backend().Copy(s.y.Buf(), y.Buf())
	})
	return s, nil
}

// step is one training step on the stepper's batch.
func (s *stepper) step() error { return s.tr.RunStep(s.x, s.y) }

func (s *stepper) release() {
	s.tr.Release()
	nn.Release(s.model)
}

// Run benchmarks one spec on dev: Warmup steps (at least three where the
// step is captured: a warm-up, a traced step, the capture), then Steps
// timed steps, each followed by a device synchronisation; the median is
// reported. The pool's peaks are over the timed steps. A timeline of the
// pool's events is recorded over one eager step: the traced one when the
// step is planned, else the last warm-up step (or one more step after the
// timed ones, without warm-up).
func Run(dev *tensor.Device, spec Spec, o Options) (Result, error) {
	m, err := arch(spec.Model, o)
	if err != nil {
		return Result{}, err
	}
	c, err := variant(m, spec.Config, o)
	if err != nil {
		return Result{}, err
	}
	if c.OffloadActivations && dev.OnHost() {
		return Result{}, fmt.Errorf("configuration %s: host memory is the CPU's own: nothing to offload", spec.Config)
	}
	s, err := newStepper(dev, m, c, spec.Batch, o, !o.Eager)
	if err != nil {
		return Result{}, err
	}
	defer s.release()
	ranks := 1
	if g := o.Group; g != nil {
		if err := s.tr.SetGroup(g, o.ShardOptimizer); err != nil {
			return Result{}, err
		}
		s.tr.Step.Reducer().SetOverlap(!o.NoOverlap)
		ranks = g.Size()
	}
	a := dev.Allocator()
	planned := s.tr.Step.Mode != train.Eager
	warmup := o.Warmup
	if planned {
		warmup = max(warmup, 3)
	}
	var timeline []memory.Event
	for i := 0; i < warmup; i++ {
		record := (planned && i == 1) || (!planned && i == warmup-1)
		if record {
			a.RecordTimeline(true)
			a.Mark("step")
		}
		if err := s.step(); err != nil {
			return Result{}, err
		}
		if record {
			dev.Synchronize()
			a.RecordTimeline(false)
			timeline = a.Timeline()
		}
	}
	if err := dev.Synchronize(); err != nil {
		return Result{}, err
	}
	a.WindowPeak()
	counter, counts := dev.Backend().(launchCounter)
	var launches0 uint64
	if counts {
		launches0 = counter.Launches()
	}
	times, hosts := make([]float64, o.Steps), make([]float64, o.Steps)
	for i := range times {
		t0 := time.Now()
		if err := s.step(); err != nil {
			return Result{}, err
		}
		hosts[i] = time.Since(t0).Seconds() * 1e3
		if err := dev.Synchronize(); err != nil {
			return Result{}, err
		}
		times[i] = time.Since(t0).Seconds() * 1e3
	}
	engine := "leangrad"
	if o.Eager && train.ModeFor(dev, true) != train.Eager { // eager beside a device's captured steps
		engine = "leangrad-eager"
	}
	if o.Group != nil {
		engine = "leangrad-ddp"
	}
	r := Result{Engine: engine, Mode: s.tr.Step.Mode.String(), Model: m.Name, Batch: spec.Batch, Config: c.Name,
		Device: dev.Name(), Steps: o.Steps, MedianMS: median(times), HostMS: median(hosts)}
	if counts {
		r.LaunchesPerStep = float64(counter.Launches()-launches0) / float64(o.Steps)
	}
	r.ImgPerSec = float64(spec.Batch*ranks) / (r.MedianMS / 1e3)
	if o.Group != nil {
		r.Ranks = ranks
		r.Overlapped, _ = s.tr.Step.Reducer().Overlap()
		r.Sharded = o.ShardOptimizer
	}
	r.OptimizerStateBytes = s.tr.Step.OptimizerStateBytes()
	r.PeakAllocated, r.PeakReserved = a.WindowPeak()
	if p := s.tr.Step.Plan(s.x.DType(), s.x.Shape(), s.y.Shape()); p != nil {
		r.PlannedArena = p.Size
		r.Peak = s.tr.PlannedPeak(s.x, s.y)
	}
	r.Notes = s.tr.Step.Notes()
	r.FLOPsPerStep = modelFLOPs(s.model, spec.Batch*ranks)
	if timeline == nil { // no warm-up step: one more step, under the recorder
		a.RecordTimeline(true)
		a.Mark("step")
		if err := s.step(); err != nil {
			return Result{}, err
		}
		dev.Synchronize()
		a.RecordTimeline(false)
		timeline = a.Timeline()
	}
	r.Timeline = timeline
	return r, nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Relate fills each result's saving and overhead against the fp32 result
// of the same engine, model and batch.
func Relate(rs []Result) {
	base := map[string]Result{}
	key := func(r Result) string { return fmt.Sprintf("%s/%s/%d", r.Engine, r.Model, r.Batch) }
	for _, r := range rs {
		if r.Config == "fp32" {
			base[key(r)] = r
		}
	}
	for i, r := range rs {
		if b, ok := base[key(r)]; ok && b.PeakAllocated > 0 && b.MedianMS > 0 {
			rs[i].SavingVsFP32 = 1 - float64(r.PeakAllocated)/float64(b.PeakAllocated)
			rs[i].OverheadFP32 = r.MedianMS/b.MedianMS - 1
		}
	}
}

// MedianRounds merges rounds of results, each round every engine timing
// the same specs: for each engine, model, batch and configuration, the
// result of the round with the median step time (the lower of the two
// middle ones for an even count), in the first round's order. With more
// than one round it also returns notes that compare within each round, so
// that a machine's drift between rounds cancels: for each leangrad result
// that PyTorch eager ran beside, leangrad's speed over PyTorch's (with
// which engine ran first: leangrad in even rounds); for each leangrad
// configuration other than fp32, its step time over fp32's; each round by
// round, with their median.
func MedianRounds(rounds [][]Result) ([]Result, []string) {
	if len(rounds) == 0 {
		return nil, nil
	}
	type key struct {
		engine, model string
		batch         int
		config        string
	}
	keyOf := func(r Result) key { return key{r.Engine, r.Model, r.Batch, r.Config} }
	// ratios is, round by round, the median step time of the result at
	// key num over that at key den (speed: den's over num's), where both ran.
	ratios := func(num, den key) (each []float64) {
		for _, rs := range rounds {
			var a, b float64
			for _, x := range rs {
				switch keyOf(x) {
				case num:
					a = x.MedianMS
				case den:
					b = x.MedianMS
				}
			}
			if a > 0 && b > 0 {
				each = append(each, a/b)
			}
		}
		return each
	}
	note := func(r Result, what string, each []float64, label func(i int) string) string {
		parts := make([]string, len(each))
		for i, x := range each {
			parts[i] = fmt.Sprintf("%.2fx%s", x, label(i))
		}
		sorted := slices.Sorted(slices.Values(each))
		mid := sorted[len(sorted)/2]
		if len(sorted)%2 == 0 {
			mid = (sorted[len(sorted)/2-1] + mid) / 2
		}
		return fmt.Sprintf("%s batch %d %s over %d rounds, %s round by round: %s; median %.2fx.",
			r.Model, r.Batch, r.Config, len(each), what, strings.Join(parts, ", "), mid)
	}
	var out []Result
	var notes []string
	for _, r := range rounds[0] {
		var same []Result
		for _, rs := range rounds {
			for _, x := range rs {
				if keyOf(x) == keyOf(r) {
					same = append(same, x)
				}
			}
		}
		slices.SortStableFunc(same, func(a, b Result) int { return cmp.Compare(a.MedianMS, b.MedianMS) })
		out = append(out, same[(len(same)-1)/2])
		if len(rounds) < 2 || r.Engine != engineLeangrad {
			continue
		}
		torch, fp32 := keyOf(r), keyOf(r)
		torch.engine, fp32.config = enginePyTorch, "fp32"
		if each := ratios(torch, keyOf(r)); len(each) == len(rounds) {
			notes = append(notes, note(r, "leangrad's speed over PyTorch's", each, func(i int) string {
				return map[bool]string{true: " (leangrad first)", false: " (PyTorch first)"}[i%2 == 0]
			}))
		}
		if each := ratios(keyOf(r), fp32); r.Config != "fp32" && len(each) == len(rounds) {
			notes = append(notes, note(r, "its step time over fp32's", each, func(int) string { return "" }))
		}
	}
	return out, notes
}
