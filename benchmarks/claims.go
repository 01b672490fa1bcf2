package benchmarks

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/optim"
	"github.com/leangrad/leangrad/tensor"
	"github.com/leangrad/leangrad/train"
)

// Claim is one piece of common advice about training memory, with the
// numbers a run measured and the verdict they support.
type Claim struct {
	Name    string             `json:"name"`
	Claim   string             `json:"claim"`
	Verdict string             `json:"verdict"` // "reproduced", "refuted" or "partly"
	Summary string             `json:"summary"`
	Numbers map[string]float64 `json:"numbers"`
}

func find(rs []Result, engine, model string, batch int, config string) (Result, bool) {
	for _, r := range rs {
		if r.Engine == engine && r.Model == model && r.Batch == batch && r.Config == config {
			return r, true
		}
	}
	return Result{}, false
}

// ClaimsFromResults judges the AMP and checkpointing claims on the main
// table's numbers for model at batch.
func ClaimsFromResults(rs []Result, model string, batch int) []Claim {
	var out []Claim
	fp, ok1 := find(rs, "leangrad", model, batch, "fp32")
	amp, ok2 := find(rs, "leangrad", model, batch, "amp")
	ck, ok3 := find(rs, "leangrad", model, batch, "checkpoint")
	if ok1 && ok2 {
		c := Claim{Name: "amp-memory", Claim: "mixed precision (AMP) cuts training memory substantially (activations saved in half precision)",
			Numbers: map[string]float64{"fp32_peak_mib": memory.Bytes(fp.PeakAllocated).MiB(), "amp_peak_mib": memory.Bytes(amp.PeakAllocated).MiB(),
				"saving": amp.SavingVsFP32, "time_change": amp.OverheadFP32}}
		c.Verdict = verdict(amp.SavingVsFP32 >= 0.3, amp.SavingVsFP32 > 0)
		c.Summary = fmt.Sprintf("%s batch %d: peak allocated %.1f MiB with AMP vs %.1f MiB in fp32 (%s); step time %+.0f%%",
			model, batch, memory.Bytes(amp.PeakAllocated).MiB(), memory.Bytes(fp.PeakAllocated).MiB(), lessOrMore(amp.SavingVsFP32), 100*amp.OverheadFP32)
		if pa, ok := find(rs, "pytorch", model, batch, "amp"); ok {
			c.Numbers["pytorch_saving"] = pa.SavingVsFP32
			c.Summary += "; PyTorch: " + lessOrMore(pa.SavingVsFP32)
		}
		out = append(out, c)
	}
	if ok1 && ok3 {
		c := Claim{Name: "checkpoint-tradeoff", Claim: "activation checkpointing saves memory at the cost of about one extra forward pass (~25-35% more time)",
			Numbers: map[string]float64{"fp32_peak_mib": memory.Bytes(fp.PeakAllocated).MiB(), "checkpoint_peak_mib": memory.Bytes(ck.PeakAllocated).MiB(),
				"saving": ck.SavingVsFP32, "time_overhead": ck.OverheadFP32}}
		c.Verdict = verdict(ck.SavingVsFP32 > 0.2 && ck.OverheadFP32 > 0.1 && ck.OverheadFP32 < 0.5, ck.SavingVsFP32 > 0)
		c.Summary = fmt.Sprintf("%s batch %d: checkpointing every block: %s peak memory, %+.0f%% step time",
			model, batch, lessOrMore(ck.SavingVsFP32), 100*ck.OverheadFP32)
		if pc, ok := find(rs, "pytorch", model, batch, "checkpoint"); ok {
			c.Numbers["pytorch_saving"], c.Numbers["pytorch_overhead"] = pc.SavingVsFP32, pc.OverheadFP32
			c.Summary += fmt.Sprintf("; PyTorch: %s, %+.0f%% time", lessOrMore(pc.SavingVsFP32), 100*pc.OverheadFP32)
		}
		out = append(out, c)
	}
	return out
}

// lessOrMore words a saving (a fraction; negative when it costs more):
// "30% less", "2% more", "the same".
func lessOrMore(saving float64) string {
	switch p := math.Round(100 * saving); {
	case p > 0:
		return fmt.Sprintf("%.0f%% less", p)
	case p < 0:
		return fmt.Sprintf("%.0f%% more", -p)
	}
	return "the same"
}

func verdict(yes, partly bool) string {
	switch {
	case yes:
		return "reproduced"
	case partly:
		return "partly"
	}
	return "refuted"
}

// capped runs f, the training steps of one trial, with dev's pool capped
// at limit bytes and emptied before and after: ok is false when f ran out
// of memory (an error wrapping memory.ErrOutOfMemory, or a panic with one
// while the model or its batch is built), err any other failure.
func capped(dev *tensor.Device, limit int64, f func() error) (ok bool, err error) {
	a := dev.Allocator()
	a.EmptyCache()
	if err := a.SetLimit(limit); err != nil {
		return false, err
	}
	defer a.SetLimit(0)
	defer a.EmptyCache()
	if err := tensor.Catch(func() {
		if err := f(); err != nil {
			panic(err)
		}
	}); err != nil {
		if errors.Is(err, memory.ErrOutOfMemory) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// EmptyCacheEveryBatch measures the advice (in the seed's training template)
// to call EmptyCache after every batch: step time and peak memory, with and
// without it.
func EmptyCacheEveryBatch(dev *tensor.Device, model string, batch int, o Options) (Claim, error) {
	m, err := train.LookupArch(model)
	if err != nil {
		return Claim{}, err
	}
	run := func(empty bool) (ms float64, peakA, reservedAfter int64, err error) {
		s, err := newStepper(dev, m, train.Variant{Name: "fp32"}, batch, o, false)
		if err != nil {
			return 0, 0, 0, err
		}
		defer s.release()
		a := dev.Allocator()
		for i := 0; i < o.Warmup; i++ {
			if err := s.step(); err != nil {
				return 0, 0, 0, err
			}
		}
		dev.Synchronize()
		a.WindowPeak()
		if empty {
			s.tr.Cfg.EmptyCacheEvery = 1
		}
		times := make([]float64, o.Steps)
		for i := range times {
			t0 := time.Now()
			if err := s.step(); err != nil {
				return 0, 0, 0, err
			}
			dev.Synchronize()
			times[i] = time.Since(t0).Seconds() * 1e3
		}
		peakA, _ = a.WindowPeak()
		return median(times), peakA, a.Stats().Reserved[memory.All].Current, nil
	}
	dev.Allocator().EmptyCache()
	base, baseA, baseR, err := run(false)
	if err != nil {
		return Claim{}, err
	}
	emptyMS, emptyA, emptyR, err := run(true)
	if err != nil {
		return Claim{}, err
	}
	cost := emptyMS/base - 1
	c := Claim{Name: "empty-cache-every-batch", Claim: "calling EmptyCache (torch.cuda.empty_cache) after every batch keeps memory use down",
		Numbers: map[string]float64{"step_ms": base, "step_ms_with_empty_cache": emptyMS, "time_cost": cost,
			"peak_allocated_mib": memory.Bytes(baseA).MiB(), "peak_allocated_mib_with_empty_cache": memory.Bytes(emptyA).MiB(),
			"reserved_after_mib": memory.Bytes(baseR).MiB(), "reserved_after_mib_with_empty_cache": memory.Bytes(emptyR).MiB()}}
	// The peak a step needs is the same either way: EmptyCache only hands
	// cached segments back between steps, to be obtained again in the next.
	lower := emptyA < baseA*95/100
	c.Verdict = verdict(lower && cost < 0.05, emptyR < baseR)
	c.Summary = fmt.Sprintf("%s batch %d: %.2f ms/step without, %.2f ms/step with EmptyCache after every batch (%+.0f%%); "+
		"peak allocated %.1f vs %.1f MiB (unchanged: the step needs it either way); reserved between steps %.1f vs %.1f MiB",
		model, batch, base, emptyMS, 100*cost, memory.Bytes(baseA).MiB(), memory.Bytes(emptyA).MiB(), memory.Bytes(baseR).MiB(), memory.Bytes(emptyR).MiB())
	return c, nil
}

// LeakyLoop measures the classic leak, a training loop that keeps every
// step's loss tensor (to average later), against one that reads the value
// and releases the tensor: allocated bytes after each epoch, and what the
// leak report names as the holder.
func LeakyLoop(dev *tensor.Device, model string, batch, epochs, steps int, seed uint64) (Claim, error) {
	m, err := train.LookupArch(model)
	if err != nil {
		return Claim{}, err
	}
	a := dev.Allocator()
	measure := func(leak bool) (perEpoch []int64, report string, err error) {
		s, err := newStepper(dev, m, train.Variant{Name: "fp32"}, batch, Options{Seed: seed}, false)
		if err != nil {
			return nil, "", err
		}
		defer s.release()
		if err := s.step(); err != nil { // the optimiser's momentum exists before anything is measured
			return nil, "", err
		}
		var kept []*tensor.Tensor
		if leak {
			s.tr.Step.Observe = func(loss *tensor.Tensor) {
				kept = append(kept, keepLoss(loss)) // "to average at the end of the epoch"
			}
		}
		// Tensors left unreleased before this arm are collected now, not at
		// whatever point of the arm the garbage collector happens to run.
		tensor.CollectLeaks()
		base := a.Stats().Allocated[memory.All].Current
		// Creation sites are recorded from here on: the report covers what
		// the loop itself leaves alive.
		tensor.SetDebug(leak)
		defer tensor.SetDebug(false)
		for e := 0; e < epochs; e++ {
			for i := 0; i < steps; i++ {
				if err := s.step(); err != nil {
					return nil, "", err
				}
			}
			perEpoch = append(perEpoch, a.Stats().Allocated[memory.All].Current-base)
		}
		if leak {
			report = tensor.LiveReport()
			for _, t := range kept {
				t.Release()
			}
		}
		return perEpoch, report, nil
	}
	leaky, report, err := measure(true)
	if err != nil {
		return Claim{}, err
	}
	clean, _, err := measure(false)
	if err != nil {
		return Claim{}, err
	}
	growth := float64(leaky[len(leaky)-1]-leaky[0]) / float64(max(1, epochs-1))
	cleanGrowth := float64(clean[len(clean)-1]-clean[0]) / float64(max(1, epochs-1))
	site := strings.TrimSpace(strings.SplitN(report, "\n", 2)[0]) // the largest holder
	c := Claim{Name: "leaky-loop", Claim: "a loop that keeps every step's loss tensor alive leaks memory every epoch",
		Numbers: map[string]float64{"leaky_growth_bytes_per_epoch": growth, "clean_growth_bytes_per_epoch": cleanGrowth,
			"steps_per_epoch": float64(steps)}}
	c.Verdict = verdict(growth > 0 && cleanGrowth == 0, growth > cleanGrowth)
	c.Summary = fmt.Sprintf("%s batch %d, %d epochs of %d steps: keeping the losses grows allocated memory by %.0f bytes per epoch "+
		"(%.0f per step: one pool block each; the graphs behind them were already freed by Backward), releasing them by %.0f; "+
		"the leak report names: %s", model, batch, epochs, steps, growth, growth/float64(steps), cleanGrowth, site)
	return c, nil
}

// keepLoss is the leaky line: it takes the loss out of the step's scope.
func keepLoss(loss *tensor.Tensor) *tensor.Tensor { return loss.Retain().Keep() }

// Fragmentation measures, after every step of a run whose batch size
// changes from step to step among a quarter, a half, three quarters and all
// of maxBatch (as with variable-length inputs), with and without EmptyCache
// every k steps: fragmentation, the inactive split bytes (free blocks inside
// segments that are partly in use, which EmptyCache cannot return), and the
// cached bytes, reserved − allocated. Every shape runs once before either
// arm, so that neither pays the one-time work of a new shape (cuDNN's
// algorithm search) and the timing verdict does not come from run order.
func Fragmentation(dev *tensor.Device, model string, maxBatch, steps, k int, seed uint64) (Claim, error) {
	m, err := train.LookupArch(model)
	if err != nil {
		return Claim{}, err
	}
	a := dev.Allocator()
	batches := []int{max(1, maxBatch/4), max(1, maxBatch/2), max(1, maxBatch*3/4), maxBatch}
	step := func(s *stepper, b int, rng *rand.Rand) (err error) {
		dev.WithScope(func() {
			x, y := randomBatch(dev, m, b, rng)
			err = s.tr.RunStep(x, y)
		})
		return err
	}
	type arm struct{ meanFrag, maxFrag, meanCached, ms float64 }
	run := func(every int, warm bool) (r arm, err error) {
		a.EmptyCache()
		s, err := newStepper(dev, m, train.Variant{Name: "fp32"}, 1, Options{Seed: seed}, false)
		if err != nil {
			return r, err
		}
		defer s.release()
		rng := rand.New(rand.NewPCG(seed, 3))
		if warm {
			for _, b := range batches {
				if err := step(s, b, rng); err != nil {
					return r, err
				}
			}
			return r, dev.Synchronize()
		}
		var frag, cached float64
		start := time.Now()
		for i := 0; i < steps; i++ {
			if err := step(s, batches[rng.IntN(len(batches))], rng); err != nil {
				return r, err
			}
			if every > 0 && (i+1)%every == 0 {
				a.EmptyCache()
			}
			st := a.Stats()
			f := memory.Bytes(st.InactiveSplit[memory.All].Current).MiB()
			frag += f
			r.maxFrag = max(r.maxFrag, f)
			cached += memory.Bytes(st.Reserved[memory.All].Current - st.Allocated[memory.All].Current).MiB()
		}
		if err := dev.Synchronize(); err != nil {
			return r, err
		}
		r.ms = time.Since(start).Seconds() * 1e3 / float64(steps)
		r.meanFrag, r.meanCached = frag/float64(steps), cached/float64(steps)
		return r, nil
	}
	if _, err := run(0, true); err != nil {
		return Claim{}, err
	}
	neverArm, err := run(0, false)
	if err != nil {
		return Claim{}, err
	}
	periodicArm, err := run(k, false)
	if err != nil {
		return Claim{}, err
	}
	never, neverMax, neverMS := neverArm.meanFrag, neverArm.maxFrag, neverArm.ms
	periodic, periodicMax, periodicMS := periodicArm.meanFrag, periodicArm.maxFrag, periodicArm.ms
	c := Claim{Name: "fragmentation", Claim: "periodic EmptyCache reduces fragmentation when shapes vary",
		Numbers: map[string]float64{"mean_inactive_split_mib": never, "max_inactive_split_mib": neverMax,
			"mean_inactive_split_mib_with_empty_cache": periodic, "max_inactive_split_mib_with_empty_cache": periodicMax,
			"mean_cached_mib": neverArm.meanCached, "mean_cached_mib_with_empty_cache": periodicArm.meanCached,
			"ms_per_step": neverMS, "ms_per_step_with_empty_cache": periodicMS}}
	c.Verdict = verdict(periodic < never*0.8 && periodicMS < neverMS*1.05, periodic < never)
	c.Summary = fmt.Sprintf("%s, batch varying in [%d, %d], %d steps after every shape ran once: fragmentation (inactive split blocks) averages "+
		"%.1f MiB (max %.1f) without EmptyCache, %.1f MiB (max %.1f) with EmptyCache every %d steps; cached (reserved − allocated) %.1f vs %.1f MiB; "+
		"%.1f vs %.1f ms per step",
		model, batches[0], maxBatch, steps, never, neverMax, periodic, periodicMax, k, neverArm.meanCached, periodicArm.meanCached, neverMS, periodicMS)
	return c, nil
}

// LargestBatch measures the advice that mixed precision lets a model train
// a larger batch in the same memory (the seed's: a BERT's batch from 16 to
// 64, four times): for fp32 and AMP (o.AMPDType), the largest batch whose
// training steps run with the pool capped at limit bytes (reserved, as a
// smaller GPU would hold), found by doubling and then bisecting over real
// eager steps, two at each batch tried. Right at the boundary a batch may
// fail where a larger one fits (the pool's rounding of the blocks it
// splits): the search's answer is within a few percent of the largest.
// A language model's windows are context tokens (0: its preset's).
func LargestBatch(dev *tensor.Device, model string, context int, limit int64, o Options) (Claim, error) {
	m, err := arch(model, o)
	if err != nil {
		return Claim{}, err
	}
	if m.Text && context > 0 {
		m.Input = []int{context}
	}
	fits := func(v train.Variant, b int) (bool, error) {
		return capped(dev, limit, func() error {
			s, err := newStepper(dev, m, v, b, o, false)
			if err != nil {
				return err
			}
			defer s.release()
			s.tr.FailOnOOM = true
			for range 2 {
				if err := s.step(); err != nil {
					return err
				}
			}
			return dev.Synchronize()
		})
	}
	largest := func(v train.Variant) (int, error) {
		lo, hi := 0, 1 // lo fits (0: nothing yet), hi is the next to try
		for {
			ok, err := fits(v, hi)
			if err != nil {
				return 0, err
			}
			if !ok {
				break
			}
			lo, hi = hi, 2*hi
		}
		for hi-lo > 1 {
			mid := (lo + hi) / 2
			ok, err := fits(v, mid)
			if err != nil {
				return 0, err
			}
			if ok {
				lo = mid
			} else {
				hi = mid
			}
		}
		return lo, nil
	}
	fp32, err := largest(train.Variant{Name: "fp32"})
	if err != nil {
		return Claim{}, err
	}
	dt := ConfigAMP("amp", o.AMP)
	amp, err := largest(train.Variant{Name: "amp", AMP: dt})
	if err != nil {
		return Claim{}, err
	}
	ratio := float64(amp) / float64(max(fp32, 1))
	c := Claim{Name: "amp-batch", Claim: "mixed precision lets a model train a much larger batch in the same memory (a BERT's from 16 to 64: 4x)",
		Verdict: verdict(ratio >= 3, ratio > 1.1),
		Numbers: map[string]float64{"fp32_batch": float64(fp32), "amp_batch": float64(amp), "ratio": ratio, "limit_gib": float64(limit) / (1 << 30)}}
	shape := fmt.Sprint(m.Input)
	if m.Text {
		shape = fmt.Sprintf("windows of %d tokens", m.Input[0])
	}
	c.Summary = fmt.Sprintf("%s, %s, the pool capped at %s: the largest batch is %d in fp32 and %d with AMP (%s), %.2fx",
		model, shape, memory.Bytes(limit), fp32, amp, dt, ratio)
	return c, nil
}

// ModelFit is how one model fared in LargestModel: the first configuration
// that trained under the cap, its speed and peak, and what was ruled out
// or ran out of memory before it.
type ModelFit struct {
	Model         string  `json:"model"`
	Params        int64   `json:"params"`
	Config        string  `json:"config,omitempty"` // "" when none trained
	TokensPerS    float64 `json:"tokens_per_s,omitempty"`
	TFLOPs        float64 `json:"tflops,omitempty"` // the model FLOPs rate, TFLOP/s (nn.GPTConfig.TokenFLOPs)
	PeakAllocated int64   `json:"peak_allocated,omitempty"`
	// HostStepS is an offloaded optimizer's update, seconds a step after
	// the first, from the step's call to the last copy up queued: what the
	// backward did not hide (optim.Offloaded.MeanStep).
	HostStepS float64  `json:"host_step_s,omitempty"`
	Tried     []string `json:"tried,omitempty"`
}

// seedParams is the model size the seed opens with: "a 24 GB GPU such as
// an RTX 3090 can train a model of about 1.2 billion parameters".
const seedParams = 1.2e9

// LargestModel measures the seed's opening claim, that a 24 GB GPU trains
// a model of about 1.2 billion parameters: of models (language models of
// the registry, taken smallest first), the largest whose training steps
// run with the pool capped at limit bytes, in windows of context tokens
// (0: each preset's), batch windows a step. Each model runs in the first
// of these that trains, fastest first: bf16 autocast with checkpointed
// blocks; that with 8-bit AdamW (a quarter of the state, on the device);
// that with AdamW's state in the host's page-locked memory
// (-offload-optimizer); that with what the blocks keep there too
// (-offload-activations); and those two with the blocks' weights in bf16
// on the device, their F32 masters in host memory
// (nn.GPTConfig.ProductWeights). A
// configuration whose parameters, gradients and state alone pass the cap
// on the device, or the host's memory, is ruled out without running. Each
// runs steps steps (at least two); tokens/s is over those after the first,
// which page-locks the state. The search stops at the first model that
// trains in none of them.
func LargestModel(dev *tensor.Device, models []string, limit int64, context, batch, steps int, o Options, progress func(ModelFit)) (Claim, []ModelFit, error) {
	type candidate struct {
		arch   train.Arch
		gpt    nn.GPTConfig // its shape, at the context run
		params int64
	}
	var cs []candidate
	for _, name := range models {
		m, err := arch(name, o)
		if err != nil {
			return Claim{}, nil, err
		}
		if !m.Text {
			return Claim{}, nil, fmt.Errorf("model %s is not a language model", name)
		}
		if context > 0 {
			m.Input = []int{context}
		}
		g := m.GPT
		g.Context, g.Vocab = m.Input[0], m.Classes
		cs = append(cs, candidate{m, g, int64(g.Params())})
	}
	slices.SortStableFunc(cs, func(a, b candidate) int { return cmp.Compare(a.params, b.params) })
	steps = max(steps, 2)
	a := dev.Allocator()
	var hostStep float64 // the last run's offloaded update, seconds a step
	run := func(m train.Arch, v train.Variant) (tps float64, peak int64, ok bool, err error) {
		hostStep = 0
		ok, err = capped(dev, limit, func() error {
			s, err := newStepper(dev, m, v, batch, o, false)
			if err != nil {
				return err
			}
			defer s.release()
			s.tr.FailOnOOM = true
			var start time.Time
			for i := range steps {
				if i == 1 { // the first step page-locks an offloaded state
					if err := dev.Synchronize(); err != nil {
						return err
					}
					a.WindowPeak()
					start = time.Now()
				}
				if err := s.step(); err != nil {
					return err
				}
			}
			if err := dev.Synchronize(); err != nil {
				return err
			}
			peak, _ = a.WindowPeak()
			tps = float64((steps-1)*batch*m.Input[0]) / time.Since(start).Seconds()
			if off, ok := s.tr.Opt.(*optim.Offloaded); ok {
				hostStep = off.MeanStep().Seconds()
			}
			return nil
		})
		return tps, peak, ok, err
	}
	var fits []ModelFit
	largest := -1
	for _, c := range cs {
		f := ModelFit{Model: c.arch.Name, Params: c.params}
		state := optim.TrainingBytes(c.arch.Recipe.Optimizer, c.params)
		state8 := optim.TrainingBytes("adamw8bit", c.params)
		acts := c.gpt.KeptBytes(batch, tensor.BF16)
		bf16 := c.gpt
		bf16.ProductWeights = tensor.BF16
		halvedState := optim.OffloadedHostBytes(c.arch.Recipe.Optimizer, c.params, bf16.ParamBytes())
		for _, v := range []struct {
			v         train.Variant
			device    int64 // what the device must hold before any activation
			host      int64 // what the host must hold
			deviceFor string
		}{
			{train.Variant{Name: "bf16+checkpoint", AMP: train.AMPBF16, Checkpoint: nn.CheckpointBlocks}, state, 0,
				"its parameters, gradients and optimizer state"},
			{train.Variant{Name: "bf16+checkpoint, 8-bit AdamW", AMP: train.AMPBF16, Checkpoint: nn.CheckpointBlocks, Optimizer: "adamw8bit"}, state8, 0,
				"its parameters, gradients and 8-bit AdamW's state"},
			{train.Variant{Name: "bf16+checkpoint, optimizer in host memory", AMP: train.AMPBF16, Checkpoint: nn.CheckpointBlocks, OffloadOptimizer: true},
				optim.OffloadedDeviceBytes(c.gpt.ParamBytes()), state, "its F32 parameters and the gradients in flight"},
			{train.Variant{Name: "bf16+checkpoint, optimizer and activations in host memory", AMP: train.AMPBF16, Checkpoint: nn.CheckpointBlocks,
				OffloadOptimizer: true, OffloadActivations: true}, optim.OffloadedDeviceBytes(c.gpt.ParamBytes()), state + acts,
				"its F32 parameters and the gradients in flight"},
			{train.Variant{Name: "bf16+checkpoint, bf16 weights, optimizer in host memory", AMP: train.AMPBF16, Checkpoint: nn.CheckpointBlocks,
				OffloadOptimizer: true, BF16Weights: true}, optim.OffloadedDeviceBytes(bf16.ParamBytes()), halvedState,
				"its parameters (the blocks' weights in bf16) and the gradients in flight"},
			{train.Variant{Name: "bf16+checkpoint, bf16 weights, optimizer and activations in host memory", AMP: train.AMPBF16, Checkpoint: nn.CheckpointBlocks,
				OffloadOptimizer: true, OffloadActivations: true, BF16Weights: true}, optim.OffloadedDeviceBytes(bf16.ParamBytes()), halvedState + acts,
				"its parameters (the blocks' weights in bf16) and the gradients in flight"},
		} {
			if (v.v.OffloadOptimizer || v.v.OffloadActivations) && dev.OnHost() {
				continue
			}
			if v.device > limit {
				f.Tried = append(f.Tried, fmt.Sprintf("%s: ruled out, %s take %s", v.v.Name, v.deviceFor, memory.Bytes(v.device)))
				continue
			}
			if host := memory.HostMemory(); v.host > host {
				f.Tried = append(f.Tried, fmt.Sprintf("%s: ruled out, it needs %s of host memory, the host has %s", v.v.Name, memory.Bytes(v.host), memory.Bytes(host)))
				continue
			}
			tps, peak, ok, err := run(c.arch, v.v)
			if err != nil {
				return Claim{}, fits, fmt.Errorf("%s in %s: %w", c.arch.Name, v.v.Name, err)
			}
			if !ok {
				f.Tried = append(f.Tried, v.v.Name+": out of memory")
				continue
			}
			f.Config, f.TokensPerS, f.PeakAllocated = v.v.Name, tps, peak
			f.TFLOPs, f.HostStepS = tps*c.gpt.TokenFLOPs(c.params)/1e12, hostStep
			break
		}
		fits = append(fits, f)
		if progress != nil {
			progress(f)
		}
		if f.Config == "" {
			break
		}
		largest = len(fits) - 1
	}
	c := Claim{Name: "largest-model", Claim: "a 24 GB GPU trains a model of about 1.2 billion parameters",
		Numbers: map[string]float64{"limit_gib": float64(limit) / (1 << 30)}}
	if largest < 0 {
		c.Verdict = verdict(false, false)
		c.Summary = fmt.Sprintf("the pool capped at %s: none of %s trains (%s)", memory.Bytes(limit), strings.Join(models, ", "), strings.Join(fits[0].Tried, "; "))
		return c, fits, nil
	}
	f := fits[largest]
	ratio := float64(f.Params) / seedParams
	c.Numbers["largest_params"], c.Numbers["tokens_per_s"], c.Numbers["peak_allocated_gib"], c.Numbers["ratio"] =
		float64(f.Params), f.TokensPerS, float64(f.PeakAllocated)/(1<<30), ratio
	c.Verdict = verdict(ratio >= 0.9*float64(limit)/(24<<30), ratio >= 0.5*float64(limit)/(24<<30))
	c.Summary = fmt.Sprintf("the pool capped at %s, batches of %d × %d tokens: the largest model that trains is %s (%s parameters, %.2fx the seed's 1.2B) in %s, %.0f tokens/s, peak %s",
		memory.Bytes(limit), batch, cs[largest].arch.Input[0], f.Model, countParams(f.Params), ratio, f.Config, f.TokensPerS, memory.Bytes(f.PeakAllocated))
	if largest+1 < len(fits) {
		next := fits[largest+1]
		c.Summary += fmt.Sprintf("; %s (%s) does not: %s", next.Model, countParams(next.Params), strings.Join(next.Tried, "; "))
	}
	return c, fits, nil
}

// countParams writes n parameters as "1.56B" or "355M".
func countParams(n int64) string {
	if n >= 1e9 {
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	}
	return fmt.Sprintf("%.0fM", float64(n)/1e6)
}
