// Package train is leangrad's training loop: forward (under autocast with
// AMP), scaled backward, unscale + inf check, optimiser step or skip,
// gradients released; evaluation; per-step memory samples from the pool;
// optional EmptyCache every N steps; atomic save and resume of a training
// checkpoint; and the measurement of what AMP and checkpointing save.
package train

import (
	"fmt"
	"math"
	"time"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/datasets"
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

// StepStats is what an Observer hears after every step.
type StepStats struct {
	Epoch, Step, Steps int     // step within the epoch, of Steps
	Loss, Acc          float64 // running averages over the epoch
	ImgPerSec          float64
	Allocated          int64
	PeakAllocated      int64 // of the run so far
	Reserved           int64
}

// Observer follows training, for a progress bar.
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

	Epoch   int // the next epoch to run
	Step    int // optimiser steps taken (or skipped) so far
	History []EpochMetrics
	Memory  []MemSample
	Empty   EmptyCacheReport

	peakAllocated, peakReserved int64
	start                       time.Time
}

// New returns a trainer of model on dev. stepsPerEpoch sizes the schedule.
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
		return nil, fmt.Errorf("schedule %q: want cosine, onecycle or constant", cfg.Schedule)
	}
	mode, err := nn.ParseCheckpointMode(cfg.Checkpoint)
	if err != nil {
		return nil, err
	}
	if r, ok := model.(*nn.ResNet); ok {
		r.Checkpoint = mode
	} else if mode != nn.NoCheckpoint {
		return nil, fmt.Errorf("checkpointing needs a ResNet (its residual blocks are the checkpointed segments)")
	}
	scaler := optim.NewGradScaler(dev)
	scaler.Enabled = cfg.AMP
	return &Trainer{Cfg: cfg, Model: model, Dev: dev, Opt: opt, Sched: sched, Scaler: scaler,
		Empty: EmptyCacheReport{Every: cfg.EmptyCacheEvery}}, nil
}

// Release frees the optimiser's and scaler's state (the model is the caller's).
func (t *Trainer) Release() {
	if r, ok := t.Opt.(interface{ Release() }); ok {
		r.Release()
	}
	t.Scaler.Release()
}

// forward runs the model and the loss, under autocast with AMP.
func (t *Trainer) forward(x, y *tensor.Tensor) (logits, loss *tensor.Tensor) {
	run := func() {
		logits = t.Model.Forward(x)
		loss = ag.CrossEntropy(logits, y)
	}
	if t.Cfg.AMP {
		ag.Autocast(run)
	} else {
		run()
	}
	return logits, loss
}

// TrainStep runs one optimisation step on a batch and returns the batch's
// loss, how many predictions were right, and whether the step was skipped
// (AMP found an inf or NaN gradient).
func (t *Trainer) TrainStep(x, y *tensor.Tensor) (loss float64, correct int, skipped bool) {
	t.Opt.SetLR(t.Sched.LR(t.Step))
	tensor.WithScope(func() {
		logits, l := t.forward(x, y)
		pred := ag.ArgMax(logits, 1)
		logits.Release()
		ag.Backward(t.Scaler.ScaleLoss(l))
		skipped = !t.Scaler.Step(t.Opt)
		t.Scaler.Update()
		loss = float64(l.Item())
		correct = countEqual(pred.Int32s(), y.Int32s())
	})
	t.Opt.ZeroGrad()
	t.Step++
	if n := t.Cfg.EmptyCacheEvery; n > 0 && t.Step%n == 0 {
		a := t.Dev.Allocator()
		before := a.Stats().Reserved[memory.All].Current
		t0 := time.Now()
		a.EmptyCache()
		t.Empty.Calls++
		t.Empty.Seconds += time.Since(t0).Seconds()
		t.Empty.Released += before - a.Stats().Reserved[memory.All].Current
	}
	return loss, correct, skipped
}

func countEqual(a, b []int32) int {
	n := 0
	for i := range a {
		if a[i] == b[i] {
			n++
		}
	}
	return n
}

// Evaluate returns the mean loss and the accuracy over a loader, with
// recording off and the model in evaluation mode.
func (t *Trainer) Evaluate(l *datasets.Loader) (loss, acc float64) {
	t.Model.SetTraining(false)
	defer t.Model.SetTraining(true)
	ep := l.Epoch(0)
	defer ep.Close()
	var total float64
	var correct, n int
	ag.NoGrad(func() {
		for {
			var done bool
			tensor.WithScope(func() {
				x, y, ok := ep.Next()
				if !ok {
					done = true
					return
				}
				logits, lt := t.forward(x, y)
				total += float64(lt.Item()) * float64(x.Dim(0))
				correct += countEqual(ag.ArgMax(logits, 1).Int32s(), y.Int32s())
				n += x.Dim(0)
			})
			if done {
				break
			}
		}
	})
	if n == 0 {
		return math.NaN(), math.NaN()
	}
	return total / float64(n), float64(correct) / float64(n)
}

// Fit trains from t.Epoch up to Cfg.Epochs, evaluating on test after every
// epoch. obs may be nil. A checkpoint is written after every epoch when
// save is not empty.
func (t *Trainer) Fit(trainL, testL *datasets.Loader, obs Observer, save string) error {
	if t.start.IsZero() {
		t.start = time.Now()
	}
	a := t.Dev.Allocator()
	for ; t.Epoch < t.Cfg.Epochs; t.Epoch++ {
		steps := trainL.Len()
		if obs != nil {
			obs.EpochStart(t.Epoch, steps)
		}
		a.WindowPeak()
		var lossSum float64
		var correct, seen, skipped int
		var epochPeakA, epochPeakR int64
		ep := trainL.Epoch(t.Epoch)
		t0 := time.Now()
		for s := 0; ; s++ {
			var loss float64
			var right int
			var skip, ok bool
			var bs int
			tensor.WithScope(func() {
				var x, y *tensor.Tensor
				x, y, ok = ep.Next()
				if !ok {
					return
				}
				bs = x.Dim(0)
				loss, right, skip = t.TrainStep(x, y)
			})
			if !ok {
				break
			}
			lossSum += loss * float64(bs)
			correct += right
			seen += bs
			if skip {
				skipped++
			}
			pa, pr := a.WindowPeak()
			st := a.Stats()
			epochPeakA, epochPeakR = max(epochPeakA, pa), max(epochPeakR, pr)
			t.peakAllocated, t.peakReserved = max(t.peakAllocated, pa), max(t.peakReserved, pr)
			t.Memory = append(t.Memory, MemSample{Step: t.Step, Seconds: time.Since(t.start).Seconds(),
				Allocated: st.Allocated[memory.All].Current, Reserved: st.Reserved[memory.All].Current, PeakAllocated: pa})
			if obs != nil {
				obs.Step(StepStats{Epoch: t.Epoch, Step: s + 1, Steps: steps, Loss: lossSum / float64(seen),
					Acc: float64(correct) / float64(seen), ImgPerSec: float64(seen) / time.Since(t0).Seconds(),
					Allocated: st.Allocated[memory.All].Current, PeakAllocated: t.peakAllocated, Reserved: st.Reserved[memory.All].Current})
			}
		}
		ep.Close()
		if err := t.Dev.Synchronize(); err != nil {
			return err
		}
		secs := time.Since(t0).Seconds()
		m := EpochMetrics{Epoch: t.Epoch, TrainLoss: lossSum / float64(max(seen, 1)), TrainAcc: float64(correct) / float64(max(seen, 1)),
			ImgPerSec: float64(seen) / secs, Seconds: secs, PeakAllocated: epochPeakA, PeakReserved: epochPeakR,
			SkippedSteps: skipped, LR: t.Opt.LR()}
		if t.Cfg.AMP {
			m.LossScale = t.Scaler.Scale()
		}
		m.TestLoss, m.TestAcc = t.Evaluate(testL)
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
