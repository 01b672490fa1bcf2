// Package train is leangrad's training loop. Its Step is the one training
// step everything runs (forward under autocast with AMP, scaled backward,
// unscale + inf check, the optimiser's update or its skip on the device,
// gradients released), eagerly, from a planned arena, or captured as a CUDA
// graph and replayed. Around it: the Trainer (epochs, schedules, metrics read
// once per progress update, evaluation, per-step memory samples from the
// pool, optional EmptyCache every N steps, atomic save and resume of a
// training checkpoint) and the measurement of what AMP and checkpointing
// save.
package train

import (
	"fmt"
	"math"
	"time"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/optim"
	"github.com/leangrad/leangrad/tensor"
)

// Config is what a training run is told.
type Config struct {
	Model           string  `json:"model"`
	Epochs          int     `json:"epochs"`
	Batch           int     `json:"batch"`
	LR              float64 `json:"lr"`
	Momentum        float64 `json:"momentum"`
	WeightDecay     float64 `json:"weight_decay"`
	Optimizer       string  `json:"optimizer"` // "sgd" (Nesterov) or "adamw"
	Schedule        string  `json:"schedule"`  // "cosine" (with warmup), "onecycle" or "constant"
	WarmupEpochs    float64 `json:"warmup_epochs"`
	AMP             bool    `json:"amp"`
	Checkpoint      string  `json:"checkpoint"` // "none", "blocks", "sqrt"
	EmptyCacheEvery int     `json:"empty_cache_every"`
	Seed            uint64  `json:"seed"`
	// Capture runs the step captured as a graph where the backend can
	// (CUDA), and eagerly elsewhere.
	Capture bool `json:"capture"`
}

// EpochMetrics are one epoch's results.
type EpochMetrics struct {
	Epoch         int     `json:"epoch"`
	TrainLoss     float64 `json:"train_loss"`
	TrainAcc      float64 `json:"train_acc"`
	TestLoss      float64 `json:"test_loss"`
	TestAcc       float64 `json:"test_acc"`
	ImgPerSec     float64 `json:"img_per_sec"` // training steps only
	Seconds       float64 `json:"seconds"`     // training steps only
	PeakAllocated int64   `json:"peak_allocated"`
	PeakReserved  int64   `json:"peak_reserved"`
	SkippedSteps  int     `json:"skipped_steps"`
	LR            float64 `json:"lr"`
	LossScale     float64 `json:"loss_scale,omitempty"`
}

// MemSample is the pool's state at the end of one step.
type MemSample struct {
	Step          int     `json:"step"`
	Seconds       float64 `json:"t"` // since training started
	Allocated     int64   `json:"allocated"`
	Reserved      int64   `json:"reserved"`
	PeakAllocated int64   `json:"peak_allocated"` // within the step
}

// StepStats is what an Observer hears at every progress update: every
// Trainer.ProgressEvery steps and at the end of an epoch.
type StepStats struct {
	Epoch, Step, Steps int     // step within the epoch, of Steps
	Loss, Acc          float64 // running averages over the epoch
	ImgPerSec          float64
	Allocated          int64
	PeakAllocated      int64 // of the run so far
	Reserved           int64
}

// Observer follows training, for a progress bar. Step is called at every
// progress update, not after every step: the metrics are read from the
// device then.
type Observer interface {
	EpochStart(epoch, steps int)
	Step(s StepStats)
	EpochEnd(m EpochMetrics)
}

// EmptyCacheReport says what calling EmptyCache every N steps did.
type EmptyCacheReport struct {
	Every    int     `json:"every"`
	Calls    int     `json:"calls"`
	Released int64   `json:"released_bytes"` // reserved bytes given back, in total
	Seconds  float64 `json:"seconds"`        // inside EmptyCache; re-growing the pool shows in the step times
}

// Trainer trains one model on one device.
type Trainer struct {
	Cfg    Config
	Model  nn.Module
	Dev    *tensor.Device
	Opt    optim.Optimizer
	Sched  optim.Schedule
	Scaler *optim.GradScaler
	Step   *Step

	Epoch   int // the next epoch to run
	Steps   int // optimiser steps taken (or skipped) so far
	History []EpochMetrics
	Memory  []MemSample
	Empty   EmptyCacheReport
	// ProgressEvery is the number of steps between progress updates, each
	// one device read (0: a fiftieth of an epoch).
	ProgressEvery int

	peakAllocated, peakReserved int64
	start                       time.Time
	evalSums                    *tensor.Tensor // F32[2]: the evaluation's loss sum and right predictions
}

// New returns a trainer of model on dev. stepsPerEpoch sizes the schedule.
// Its Step is Captured when cfg.Capture is set and the device can capture
// graphs, and Eager otherwise.
func New(model nn.Module, dev *tensor.Device, cfg Config, stepsPerEpoch int) (*Trainer, error) {
	params := nn.Parameters(model)
	var opt optim.Optimizer
	switch cfg.Optimizer {
	case "sgd", "":
		opt = optim.NewSGD(params, cfg.LR, cfg.Momentum, cfg.WeightDecay, cfg.Momentum > 0)
	case "adamw":
		opt = optim.NewAdamW(params, cfg.LR, cfg.WeightDecay)
	default:
		return nil, fmt.Errorf("optimizer %q: want sgd or adamw", cfg.Optimizer)
	}
	total := max(1, cfg.Epochs*stepsPerEpoch)
	var sched optim.Schedule
	switch cfg.Schedule {
	case "cosine", "":
		// Warmup is capped at a tenth of the run, so that a short run
		// spends most of its steps at useful rates.
		warmup := min(int(cfg.WarmupEpochs*float64(stepsPerEpoch)), total/10)
		sched = optim.CosineWarmup{Base: cfg.LR, Min: 0, Warmup: warmup, Total: total}
	case "onecycle":
		sched = optim.NewOneCycle(cfg.LR, total)
	case "constant":
		sched = optim.Constant(cfg.LR)
	default:
		opt.Release()
		return nil, fmt.Errorf("schedule %q: want cosine, onecycle or constant", cfg.Schedule)
	}
	mode, err := nn.ParseCheckpointMode(cfg.Checkpoint)
	if err != nil {
		opt.Release()
		return nil, err
	}
	if r, ok := model.(*nn.ResNet); ok {
		r.Checkpoint = mode
	} else if mode != nn.NoCheckpoint {
		opt.Release()
		return nil, fmt.Errorf("checkpointing needs a ResNet (its residual blocks are the checkpointed segments)")
	}
	scaler := optim.NewGradScaler(dev)
	scaler.Enabled = cfg.AMP
	stepMode := Eager
	if cfg.Capture {
		if _, ok := dev.Backend().(kernels.Capturer); ok {
			stepMode = Captured
		}
	}
	return &Trainer{Cfg: cfg, Model: model, Dev: dev, Opt: opt, Sched: sched, Scaler: scaler,
		Step:     NewStep(dev, model, opt, scaler, cfg.AMP, stepMode),
		evalSums: tensor.Zeros(dev, tensor.F32, 2).Keep(),
		Empty:    EmptyCacheReport{Every: cfg.EmptyCacheEvery}}, nil
}

// Release frees the step's, the optimiser's and the scaler's state (the
// model is the caller's).
func (t *Trainer) Release() {
	t.Step.Release()
	t.Opt.Release()
	t.Scaler.Release()
	t.evalSums.Release()
}

// RunStep sets the scheduled learning rate and runs one training step on a
// batch (see Step.Run), then calls EmptyCache if Cfg.EmptyCacheEvery says so.
func (t *Trainer) RunStep(x, y *tensor.Tensor) error {
	t.Opt.SetLR(t.Sched.LR(t.Steps))
	if err := t.Step.Run(x, y); err != nil {
		return err
	}
	t.Steps++
	if n := t.Cfg.EmptyCacheEvery; n > 0 && t.Steps%n == 0 {
		a := t.Dev.Allocator()
		before := a.Stats().Reserved[memory.All].Current
		t0 := time.Now()
		a.EmptyCache()
		t.Empty.Calls++
		t.Empty.Seconds += time.Since(t0).Seconds()
		t.Empty.Released += before - a.Stats().Reserved[memory.All].Current
	}
	return nil
}

// Evaluate returns the mean loss and the accuracy over a loader, with
// recording off and the model in evaluation mode, eagerly. The sums stay on
// the device until the end: one read.
func (t *Trainer) Evaluate(l *datasets.Loader) (loss, acc float64, err error) {
	defer recoverError(&err)
	t.Model.SetTraining(false)
	defer t.Model.SetTraining(true)
	be := t.Dev.Backend()
	be.Fill(t.evalSums.Buf(), 0)
	ep := l.Epoch(0)
	defer ep.Close()
	n := 0
	ag.NoGrad(func() {
		for {
			var done bool
			tensor.WithScope(func() {
				x, y, ok := ep.Next()
				if !ok {
					done = true
					return
				}
				logits, lt := t.Step.forward(x, y)
				be.AccumulateMetrics(t.evalSums.Buf(), lt.Buf(), logits.Buf(), y.Buf(), logits.Dim(0), logits.Dim(1))
				n += x.Dim(0)
			})
			if done {
				break
			}
		}
	})
	if n == 0 {
		return math.NaN(), math.NaN(), nil
	}
	v := t.evalSums.Float32s()
	return float64(v[0]) / float64(n), float64(v[1]) / float64(n), nil
}

// Fit trains from t.Epoch up to Cfg.Epochs, evaluating on test after every
// epoch. obs may be nil. A checkpoint is written after every epoch when
// save is not empty. It returns the first error of a step, an evaluation
// or a save.
func (t *Trainer) Fit(trainL, testL *datasets.Loader, obs Observer, save string) error {
	if t.start.IsZero() {
		t.start = time.Now()
	}
	a := t.Dev.Allocator()
	xs, ys := t.Step.Inputs(trainL.BatchShape(), trainL.BatchShape()[:1])
	for ; t.Epoch < t.Cfg.Epochs; t.Epoch++ {
		steps := trainL.Len()
		every := t.ProgressEvery
		if every <= 0 {
			every = max(1, steps/50)
		}
		if obs != nil {
			obs.EpochStart(t.Epoch, steps)
		}
		a.WindowPeak()
		t.Step.ResetMetrics()
		_, _, skipped0 := t.Step.Metrics()
		var seen int
		var epochPeakA, epochPeakR int64
		ep := trainL.Epoch(t.Epoch)
		t0 := time.Now()
		for s := 0; ; s++ {
			var ok bool
			var bs int
			var err error
			tensor.WithScope(func() {
				var x, y *tensor.Tensor
				x, y, ok = ep.NextInto(xs, ys)
				if !ok {
					return
				}
				bs = x.Dim(0)
				err = t.RunStep(x, y)
			})
			if err != nil {
				ep.Close()
				return err
			}
			if !ok {
				break
			}
			seen += bs
			pa, pr := a.WindowPeak()
			st := a.Stats()
			epochPeakA, epochPeakR = max(epochPeakA, pa), max(epochPeakR, pr)
			t.peakAllocated, t.peakReserved = max(t.peakAllocated, pa), max(t.peakReserved, pr)
			t.Memory = append(t.Memory, MemSample{Step: t.Steps, Seconds: time.Since(t.start).Seconds(),
				Allocated: st.Allocated[memory.All].Current, Reserved: st.Reserved[memory.All].Current, PeakAllocated: pa})
			if obs != nil && ((s+1)%every == 0 || s+1 == steps) {
				lossSum, right, _ := t.Step.Metrics()
				obs.Step(StepStats{Epoch: t.Epoch, Step: s + 1, Steps: steps, Loss: lossSum / float64(seen),
					Acc: float64(right) / float64(seen), ImgPerSec: float64(seen) / time.Since(t0).Seconds(),
					Allocated: st.Allocated[memory.All].Current, PeakAllocated: t.peakAllocated, Reserved: st.Reserved[memory.All].Current})
			}
		}
		ep.Close()
		if err := t.Dev.Synchronize(); err != nil {
			return err
		}
		secs := time.Since(t0).Seconds()
		lossSum, right, skipped := t.Step.Metrics()
		m := EpochMetrics{Epoch: t.Epoch, TrainLoss: lossSum / float64(max(seen, 1)), TrainAcc: float64(right) / float64(max(seen, 1)),
			ImgPerSec: float64(seen) / secs, Seconds: secs, PeakAllocated: epochPeakA, PeakReserved: epochPeakR,
			SkippedSteps: skipped - skipped0, LR: t.Opt.LR()}
		if t.Cfg.AMP {
			m.LossScale = t.Scaler.Scale()
		}
		var err error
		if m.TestLoss, m.TestAcc, err = t.Evaluate(testL); err != nil {
			return err
		}
		if t.Step.Mode != Eager {
			// The evaluation's memory came from the pools, which planned
			// steps do not use: give it back.
			a.EmptyCache()
		}
		t.History = append(t.History, m)
		if obs != nil {
			obs.EpochEnd(m)
		}
		if save != "" {
			t.Epoch++ // the checkpoint resumes at the next epoch
			err := t.Save(save)
			t.Epoch--
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// Peaks are the run's peak allocated and reserved bytes, from the pool.
func (t *Trainer) Peaks() (allocated, reserved int64) { return t.peakAllocated, t.peakReserved }
