// Package train is leangrad's training loop. Its Step is the one training
// step everything runs (forward under autocast with AMP, scaled backward,
// unscale + inf check, the optimiser's update or its skip on the device,
// gradients released), eagerly, from a planned arena, or captured as a CUDA
// graph and replayed. Around it: the Trainer (epochs, schedules, metrics read
// once per progress update, evaluation, per-step memory samples from the
// pool, optional EmptyCache every N steps, atomic save and strict resume of
// a training checkpoint, divergence checks at every progress update, and
// recovery from running out of memory: the step run again, then as
// micro-batches), the measurement of what AMP and checkpointing save, which
// FitBudget uses to fit a step into a memory budget, and the registry of
// model names (LookupArch). ModeFor decides how steps run. A whole run as
// cmd/train does it, with its report and plots, is package run's.
package train

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/dist"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/optim"
	"github.com/leangrad/leangrad/tensor"
)

// Config is what a training run is told.
type Config struct {
	Model   string `json:"model"`
	Dataset string `json:"dataset,omitempty"`
	// Examples is the number of training examples (images; for a language
	// model, the training split's tokens) the run was given: a -limit
	// changes it, and a resumed run must see the same data.
	Examples    int     `json:"examples,omitempty"`
	Epochs      int     `json:"epochs"`
	Batch       int     `json:"batch"`
	LR          float64 `json:"lr"`
	Momentum    float64 `json:"momentum"`
	WeightDecay float64 `json:"weight_decay"`
	Optimizer   string  `json:"optimizer"`       // "sgd" (Nesterov), "adamw" or "adamw8bit"
	Beta2       float64 `json:"beta2,omitempty"` // AdamW's second-moment decay (0: 0.999)
	// ClipNorm clips the gradients' global L2 norm to it before each
	// update (0: no clipping).
	ClipNorm     float64           `json:"clip_norm,omitempty"`
	Schedule     string            `json:"schedule"` // "cosine" (with warmup), "onecycle" or "constant"
	WarmupEpochs float64           `json:"warmup_epochs"`
	AMP          AMP               `json:"amp"`
	Checkpoint   nn.CheckpointMode `json:"checkpoint"`
	// Checkpointed limits CheckpointBlocks (and CheckpointLight) to the model's first blocks
	// (nn.Checkpointer.SetCheckpointed; 0: all of them), the others
	// keeping their activations: less recomputation for more memory. A
	// budget (FitBudget) chooses it.
	Checkpointed    int    `json:"checkpointed,omitempty"`
	EmptyCacheEvery int    `json:"empty_cache_every"`
	Seed            uint64 `json:"seed"`
	// Capture runs the step captured as a graph where the backend can
	// (CUDA), and eagerly elsewhere.
	Capture bool `json:"capture"`
	// OffloadOptimizer keeps the optimiser's state in host memory and
	// runs its update on the host's cores (optim.Offload) when the device
	// is not the CPU: the gradients stream down as the backward finishes
	// them, the device holds the parameters and the gradients in flight
	// only, and its steps run eagerly (the update reads the device).
	OffloadOptimizer bool `json:"offload_optimizer,omitempty"`
	// DeviceState, with OffloadOptimizer, is the share (0 to 1) of the
	// parameters' bytes whose optimiser state stays on the device, updated
	// there (optim.OffloadSome): the first F32 parameters in the model's
	// order, those a backward finishes last, whose host update would be
	// left after it (Note [state kept on the device] in optim).
	DeviceState float64 `json:"device_state,omitempty"`
	// OffloadActivations moves what checkpointed blocks keep for their
	// recomputation (their inputs, attention's results) to host memory in
	// the forward and brings it back ahead of the recomputation
	// (Step.Offloader) when the device is not the CPU; it needs
	// Checkpoint, and its steps run eagerly (Note [offloaded steps eager]).
	OffloadActivations bool `json:"offload_activations,omitempty"`
	// BF16Weights holds a GPT's product weights (nn.GPTConfig.ProductWeights)
	// in BF16 on the device, working copies of F32 masters that the
	// offloaded optimizer keeps in host memory (Note [working weights in
	// 16 bits] in optim): half the bytes on the device and over PCIe, the
	// weights' gradients rounded to BF16. It needs OffloadOptimizer on a
	// GPU and BF16 AMP. A checkpoint holds the masters as the model's
	// weights.
	BF16Weights bool `json:"bf16_weights,omitempty"`
	// FuseOptimizer updates each parameter in the backward as soon as its
	// gradient is finished, and releases the gradient (Step.FuseOptimizer):
	// the step never holds every gradient. With the optimizer offloaded,
	// the host updates each parameter as its gradient arrives there, while
	// the backward goes on (Step.HostUpdateInBackward), unless clipped
	// (then after it). It needs AdamW or SGD, no F16 loss scaling (BF16 AMP
	// is fine) and one process; with clipping on the device, the forward
	// and backward run twice (Note [the norm in a first pass]).
	FuseOptimizer bool `json:"fuse_optimizer,omitempty"`
	// MicroBatch runs each batch as micro-batches of at most this many
	// examples whose gradients are summed before one update
	// (Step.SetMicroBatch; 0: whole batches): the same effective batch in
	// the activations of a micro-batch. With the optimizer offloaded the
	// gradients are summed in F32 in host memory and leave the device
	// during each micro-batch's backward (Note [parts summed on the host]
	// in optim). A budget (run.Job.MaxMemory, FitBudget) keeps it when set,
	// and may choose one when not.
	MicroBatch int `json:"micro_batch,omitempty"`
	// HostThreads is how many goroutines the host's work spreads over
	// while it runs beside the backward, the update or micro-batches' sums
	// (Step.HostThreads; 0: all cores but one).
	HostThreads int `json:"host_threads,omitempty"`
	// Language models: the window of tokens each example is (0: the
	// model's preset), the tokenizer, the training steps (Steps, of which
	// the first WarmupSteps warm the schedule up; Epochs and WarmupEpochs
	// are an image classifier's), the steps between evaluations, and how
	// many batches of the validation split an evaluation reads (0: all of
	// it). Steps is a multiple of EvalEvery: the Trainer's periods between
	// evaluations are its "epochs" (Periods).
	Context     int    `json:"context,omitempty"`
	Tokenizer   string `json:"tokenizer,omitempty"`
	Steps       int    `json:"steps,omitempty"`
	WarmupSteps int    `json:"warmup_steps,omitempty"`
	EvalEvery   int    `json:"eval_every,omitempty"`
	EvalBatches int    `json:"eval_batches,omitempty"`
}

// MicroBatched says whether steps run the batch as micro-batches of
// MicroBatch (set and below Batch).
func (c Config) MicroBatched() bool { return c.MicroBatch > 0 && c.MicroBatch < c.Batch }

// KeptOnDevice says which of params keep their optimiser state on the
// device when share of their bytes may (Config.DeviceState): the first
// F32 ones, in order, while their bytes come to at most share of all of
// theirs; a 16-bit working weight stops the run (its master is the
// host's). It panics unless share is within 0 and 1.
func KeptOnDevice(params []*tensor.Tensor, share float64) []bool {
	if share < 0 || share > 1 || math.IsNaN(share) {
		panic(fmt.Sprintf("train: a share of %v of the parameters' optimizer state kept on the device: want 0 to 1", share))
	}
	var all, kept int64
	for _, p := range params {
		all += p.Bytes()
	}
	keep := make([]bool, len(params))
	for i, p := range params {
		if p.DType() != tensor.F32 || float64(kept+p.Bytes()) > share*float64(all) {
			break
		}
		kept += p.Bytes()
		keep[i] = true
	}
	return keep
}

// Offloads says whether a run on dev keeps its optimiser's state in host
// memory: OffloadOptimizer, on a device other than the CPU (whose memory
// is the host's).
func (c Config) Offloads(dev *tensor.Device) bool { return c.OffloadOptimizer && !dev.OnHost() }

// Mode is how a run of c on dev steps: captured where the backend can and
// Capture asks, unless an offloaded optimizer (whose update runs on the
// host's cores, beside the step) needs eager steps, or activations are
// offloaded: such a step can be captured (Note [offloaded copies
// captured] in autograd), but its graph ran GPT-2 small's step 4% slower
// than the eager step on an H100, where its launches are a small part of
// the step (Note [offloaded steps eager]). An update fused into the
// backward on the device is captured with the step.
func (c Config) Mode(dev *tensor.Device) Mode {
	return ModeFor(dev, c.Capture && !c.Offloads(dev) && !c.OffloadsActivations(dev))
}

// Note [offloaded steps eager]: GPT-2 small, batch 16 × 1,024, bf16,
// checkpointed blocks, on an H100 at 49ef45e (2026-12-08, `TORCH=0 bash
// scripts/gpu.sh acts`): 36.13 ms a step captured, 36.71 eager; with its
// checkpoints offloaded 40.23 captured, 38.52 eager, at the same peak
// (2.60 GiB against 2.98). The graph holds the same copies, on the same
// streams, with the same joins, and is slower all the same; where its
// time goes inside the graph is not profiled. The models that need their
// activations offloaded are those whose steps are longest, where capture
// saves least: runs keep such steps eager, and the budget's search
// measures them planned as it measures the others.

// OffloadsActivations says whether a run on dev moves what its checkpointed
// blocks keep to host memory: OffloadActivations, on a device other than
// the CPU.
func (c Config) OffloadsActivations(dev *tensor.Device) bool {
	return c.OffloadActivations && !dev.OnHost()
}

// Periods is the number of the Trainer's epochs: an image classifier's
// Epochs, or a language model's Steps in periods of EvalEvery steps, each
// ending in an evaluation.
func (c Config) Periods() int {
	if c.EvalEvery > 0 {
		return c.Steps / c.EvalEvery
	}
	return c.Epochs
}

// UnmarshalJSON reads a Config, also as checkpoints that predate AMP as one
// value and a language model's steps as steps wrote it: "amp" a bool
// beside "amp_dtype", and the steps as epochs of eval_every steps.
func (c *Config) UnmarshalJSON(b []byte) error {
	type config Config // without this method
	var v struct {
		config
		AMPDType string `json:"amp_dtype"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*c = Config(v.config)
	if c.AMP == AMPF16 && v.AMPDType == "bf16" {
		c.AMP = AMPBF16
	}
	if c.EvalEvery > 0 && c.Steps == 0 {
		c.Steps, c.WarmupSteps = c.Epochs*c.EvalEvery, int(c.WarmupEpochs*float64(c.EvalEvery))
		c.Epochs, c.WarmupEpochs = 0, 0
	}
	return nil
}

// Autocast is the dtype the configuration's steps autocast to: F16 (and a
// GradScaler) or BF16 under AMP, 0 (fp32) without.
func (c Config) Autocast() tensor.DType { return c.AMP.DType() }

// AMP is what a step's forward autocasts to under mixed precision: NoAMP
// (fp32 throughout), AMPF16 (F16, with a GradScaler) or AMPBF16 (BF16,
// which needs none). Its text, for flags, JSON and messages, is "none",
// "f16" or "bf16".
type AMP tensor.DType

// The AMP settings.
const (
	NoAMP   AMP = 0
	AMPF16      = AMP(tensor.F16)
	AMPBF16     = AMP(tensor.BF16)
)

// AMPDTypes names what AMP autocasts to, for messages and -h.
const AMPDTypes = "f16 (with loss scaling) or bf16 (no scaling needed)"

// On reports whether a is mixed precision.
func (a AMP) On() bool { return a != NoAMP }

// DType is what a autocasts to: F16, BF16, or 0 for NoAMP.
func (a AMP) DType() tensor.DType { return tensor.DType(a) }

// String is "none", "f16" or "bf16".
func (a AMP) String() string {
	if a == NoAMP {
		return "none"
	}
	return tensor.DType(a).String()
}

// ParseAMP reads "none" (or "") or the dtype AMP autocasts to, "f16" or
// "bf16".
func ParseAMP(s string) (AMP, error) {
	if s == "none" || s == "" {
		return NoAMP, nil
	}
	if d, err := tensor.ParseDType(s); err == nil && d.Half() {
		return AMP(d), nil
	}
	return 0, fmt.Errorf("AMP %q: want %s, or none", s, AMPDTypes)
}

// MarshalText is a's String.
func (a AMP) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// UnmarshalText reads a as ParseAMP does.
func (a *AMP) UnmarshalText(text []byte) error {
	v, err := ParseAMP(string(text))
	if err == nil {
		*a = v
	}
	return err
}

// UnmarshalJSON reads a's text, or a bool (true: F16), as checkpoints
// that predate AMP as one value wrote it.
func (a *AMP) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case "true":
		*a = AMPF16
		return nil
	case "false":
		*a = NoAMP
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("AMP: %w", err)
	}
	return a.UnmarshalText([]byte(s))
}

// Float is a float64 that JSON writes as null when it is NaN or infinite
// (which encoding/json refuses to write): a diverged run's losses, an
// evaluation of no images. null reads back as NaN.
type Float float64

// MarshalJSON writes f, or null when it is not finite.
func (f Float) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, v, 'g', -1, 64), nil
}

// UnmarshalJSON reads a number, or null as NaN.
func (f *Float) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*f = Float(math.NaN())
		return nil
	}
	v, err := strconv.ParseFloat(string(b), 64)
	*f = Float(v)
	return err
}

// EpochMetrics are one epoch's results.
type EpochMetrics struct {
	Epoch     int     `json:"epoch"`
	TrainLoss Float   `json:"train_loss"`
	TrainAcc  Float   `json:"train_acc"`
	TestLoss  Float   `json:"test_loss"`
	TestAcc   Float   `json:"test_acc"`
	ImgPerSec float64 `json:"img_per_sec"` // examples (images, sequences) per second, training steps only
	// PredictionsPerSec counts what the loss is a mean over: images for a
	// classifier, tokens for a language model.
	PredictionsPerSec float64 `json:"predictions_per_sec"`
	Seconds           float64 `json:"seconds"` // training steps only
	PeakAllocated     int64   `json:"peak_allocated"`
	PeakReserved      int64   `json:"peak_reserved"`
	SkippedSteps      int     `json:"skipped_steps"`
	LR                float64 `json:"lr"`
	LossScale         float64 `json:"loss_scale,omitempty"`
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
	ImgPerSec          float64 // examples per second
	PredictionsPerSec  float64 // images or tokens per second
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

// OOMReport says how a trainer survived running out of memory.
type OOMReport struct {
	Recoveries int      `json:"recoveries"`            // steps that ran out of memory and ran again
	MicroBatch int      `json:"micro_batch,omitempty"` // the micro-batch size steps run with now (0: whole batches)
	Events     []string `json:"events,omitempty"`      // what was done, in order (the first 20)
}

func (r *OOMReport) note(format string, args ...any) {
	if len(r.Events) < 20 {
		r.Events = append(r.Events, fmt.Sprintf(format, args...))
	}
}

// ErrDiverged is wrapped by the *DivergedError that Fit returns.
var ErrDiverged = errors.New("training diverged")

// DivergedError says where and how a run diverged.
type DivergedError struct {
	Epoch int    // the epoch, from 0
	Step  int    // the optimiser step (of the run) at which it was seen
	Why   string // what was seen
}

func (e *DivergedError) Error() string {
	return fmt.Sprintf("%v at step %d (epoch %d): %s; nothing was saved from this epoch: try a lower learning rate (-lr)",
		ErrDiverged, e.Step, e.Epoch+1, e.Why)
}

// Unwrap makes errors.Is(err, ErrDiverged) true.
func (e *DivergedError) Unwrap() error { return ErrDiverged }

// ErrInterrupted is wrapped by the *InterruptedError that Fit returns when
// it was asked to stop (Trainer.Stop).
var ErrInterrupted = errors.New("training interrupted")

// InterruptedError says where a run stopped when asked to.
type InterruptedError struct {
	Epoch int    // the epoch it stopped in, from 0
	Batch int    // the batches of it done (0: it stopped between epochs)
	Step  int    // the optimiser steps taken in all
	Saved string // the checkpoint written there ("" when none was asked for)
}

func (e *InterruptedError) Error() string {
	where := fmt.Sprintf("after step %d (epoch %d, batch %d)", e.Step, e.Epoch+1, e.Batch)
	if e.Batch == 0 {
		where = fmt.Sprintf("after step %d (before epoch %d)", e.Step, e.Epoch+1)
	}
	if e.Saved == "" {
		return fmt.Sprintf("%v %s; nothing was saved", ErrInterrupted, where)
	}
	return fmt.Sprintf("%v %s; %s holds the run there, to resume from", ErrInterrupted, where, e.Saved)
}

// Unwrap makes errors.Is(err, ErrInterrupted) true.
func (e *InterruptedError) Unwrap() error { return ErrInterrupted }

// Trainer trains one model on one device.
type Trainer struct {
	Cfg   Config
	Model nn.Module
	Dev   *tensor.Device
	Opt   optim.Optimizer
	Sched optim.Schedule
	Step  *Step

	Epoch   int // the next epoch to run
	Steps   int // optimiser steps taken (or skipped) so far
	History []EpochMetrics
	Memory  []MemSample
	Empty   EmptyCacheReport
	// ProgressEvery is the number of steps between progress updates, each
	// one device read (0: a fiftieth of an epoch). Divergence is checked at
	// each.
	ProgressEvery int
	// MaxSkips is how many AMP steps in a row may be skipped (gradients not
	// finite at any loss scale tried) before Fit says the run diverged.
	MaxSkips int
	// FailOnOOM makes a step that runs out of memory end training with the
	// allocator's error, instead of being run again (see RunStep).
	FailOnOOM bool
	// OOM says what running out of memory made the trainer do.
	OOM OOMReport
	// Inputs, if set, are recorded in the checkpoints (see Inputs).
	Inputs *Inputs
	// Publisher, if set, gets a snapshot of the model's weights every
	// PublishEvery steps (0: at the end of every epoch) and at the end of
	// every epoch, for readers on other goroutines (see Publisher).
	Publisher    *Publisher
	PublishEvery int
	// Stop, when closed, asks Fit to stop at the next step boundary: it
	// saves a checkpoint there (Position records how far into the epoch it
	// got) and returns an *InterruptedError. In a data-parallel job the
	// ranks agree at each progress update to stop there together (one
	// all-reduce of a flag), so any rank's Stop stops them all. In a single
	// process it stops an evaluation too, between its batches: the
	// checkpoint then resumes at the epoch's end, which evaluates again.
	Stop <-chan struct{}

	peakAllocated, peakReserved int64
	skipsSeen, skipRun          int // AMP steps skipped so far, and in a row
	start                       time.Time
	evalSums                    *tensor.Tensor // F32[3]: the evaluation's loss sum, right predictions and predictions
	evalChunk                   int            // examples evaluated at a time (0: whole batches)
	evalFreesArena              bool           // an evaluation ran out of memory beside the arena
	evalPeak                    int64          // the evaluations' peak allocated bytes
	group                       *dist.Group    // the data-parallel job, or nil
	position                    *Position      // where in Epoch a resumed run goes on (nil: its start)
}

// SetGroup makes the trainer one rank of a data-parallel job (see
// Step.SetGroup): every rank starts from rank 0's model, steps average
// their gradients, progress and epoch figures are the job's (every rank's
// examples), each evaluation runs on this rank's share of the test loader
// (shard it with LoaderConfig.Rank) with rank 0's batch-norm statistics and
// sums the ranks' results, and only rank 0 writes checkpoints (of the whole
// optimiser state: a sharded one's is gathered on every rank first). Opt
// becomes the Step's (the sharded optimiser with shard). A step that
// runs out of memory ends the run (FailOnOOM): retrying it on one rank
// alone would leave the others waiting in its all-reduce.
func (t *Trainer) SetGroup(g *dist.Group, shard bool) error {
	if t.Step.FuseOptimizer && g != nil && g.Size() > 1 {
		return errors.New("fusing the optimizer into the backward: a data-parallel step updates after the gradients are all-reduced")
	}
	if err := t.Step.SetGroup(g, shard); err != nil {
		return err
	}
	t.Opt, t.group, t.FailOnOOM = t.Step.Opt, g, true
	return nil
}

// ranks is the number of processes training together (1 without a group).
func (t *Trainer) ranks() int {
	if t.group == nil {
		return 1
	}
	return t.group.Size()
}

// New returns a trainer of model on dev. stepsPerEpoch sizes the schedule.
// Its Step is Captured when cfg.Capture is set and the device can capture
// graphs, and Eager otherwise.
func New(model nn.Model, dev *tensor.Device, cfg Config, stepsPerEpoch int) (*Trainer, error) {
	if cfg.Optimizer == "" {
		cfg.Optimizer = "sgd"
	}
	if cfg.Schedule == "" {
		cfg.Schedule = "cosine"
	}
	total := max(1, cfg.Periods()*stepsPerEpoch)
	warmup := int(cfg.WarmupEpochs * float64(stepsPerEpoch))
	if cfg.EvalEvery > 0 {
		warmup = cfg.WarmupSteps
	}
	// Warmup is capped at a tenth of the run, so that a short run spends
	// most of its steps at useful rates.
	warmup = min(warmup, total/10)
	sched, err := optim.NewNamedSchedule(cfg.Schedule, cfg.LR, warmup, total)
	if err != nil {
		return nil, err
	}
	opt, err := optim.NewNamed(cfg.Optimizer, nn.Parameters(model), optim.Hyper{LR: cfg.LR, Momentum: cfg.Momentum,
		Beta2: cfg.Beta2, WeightDecay: cfg.WeightDecay, NoDecay: nn.NoDecay(model)})
	if err != nil {
		return nil, err
	}
	mode := cfg.Checkpoint
	c, ok := model.(nn.Checkpointer)
	blocks := 0
	if ok {
		blocks = c.Checkpointable()
	}
	switch {
	case !ok && mode != nn.NoCheckpoint:
		opt.Release()
		return nil, fmt.Errorf("checkpointing needs a model with blocks to checkpoint (nn.Checkpointer); %s has none", cfg.Model)
	case mode == nn.CheckpointLight && !nn.LightCheckpoints(model):
		opt.Release()
		return nil, fmt.Errorf("checkpoint mode light keeps the products of a GPT's blocks; %s is not a GPT: checkpoint its blocks instead", cfg.Model)
	case cfg.Checkpointed != 0 && (mode != nn.CheckpointBlocks && mode != nn.CheckpointLight || cfg.Checkpointed < 0 || cfg.Checkpointed > blocks):
		opt.Release()
		return nil, fmt.Errorf("checkpointing the first %d blocks (Checkpointed) with checkpoint mode %v: want blocks or light, and 1 to the %d blocks of %s", cfg.Checkpointed, mode, blocks, cfg.Model)
	case ok:
		c.SetCheckpoint(mode)
		c.SetCheckpointed(cfg.Checkpointed)
	}
	if !(cfg.ClipNorm >= 0) {
		opt.Release()
		return nil, fmt.Errorf("gradient clipping to a norm of %v: want a positive norm, or 0 for none", cfg.ClipNorm)
	}
	if cfg.OffloadActivations && mode == nn.NoCheckpoint {
		opt.Release()
		return nil, errors.New(ActivationsRefusal)
	}
	if cfg.FuseOptimizer {
		if err := fusable(cfg, opt); err != nil {
			opt.Release()
			return nil, err
		}
	}
	if err := workingWeights(model, cfg, dev); err != nil {
		opt.Release()
		return nil, err
	}
	offload := cfg.Offloads(dev)
	if offload {
		off, err := optim.OffloadSome(opt, dev.Pinned(), KeptOnDevice(opt.Params(), cfg.DeviceState))
		if err != nil {
			opt.Release()
			return nil, err
		}
		opt = off
	}
	step := NewStep(dev, model, opt, cfg.Autocast(), cfg.Mode(dev))
	step.ClipNorm = cfg.ClipNorm
	step.FuseOptimizer, step.HostUpdateInBackward = cfg.FuseOptimizer && !offload, cfg.FuseOptimizer && offload
	step.HostThreads = cfg.HostThreads
	if err := step.SetMicroBatch(cfg.MicroBatch); err != nil {
		step.Release()
		opt.Release()
		return nil, err
	}
	if cfg.OffloadsActivations(dev) {
		step.Offloader = ag.NewOffloader(dev, dev.Pinned())
	}
	return &Trainer{Cfg: cfg, Model: model, Dev: dev, Opt: opt, Sched: sched, Step: step,
		evalSums: tensor.Zeros(dev, tensor.F32, 3).Keep(),
		Empty:    EmptyCacheReport{Every: cfg.EmptyCacheEvery}, MaxSkips: 50}, nil
}

// workingWeights refuses a model with 16-bit parameters (working weights,
// Config.BF16Weights) unless the optimizer keeps their F32 masters in host
// memory (OffloadOptimizer, on a GPU) and the step autocasts to their
// dtype.
func workingWeights(model nn.Model, cfg Config, dev *tensor.Device) error {
	for _, n := range model.State("") {
		dt := n.T.DType()
		if !dt.Half() {
			continue
		}
		switch {
		case !cfg.Offloads(dev):
			return fmt.Errorf("model %s holds %s in %v, working weights whose F32 masters live in host memory (-bf16-weights): that needs -offload-optimizer on a GPU", cfg.Model, n.Name, dt)
		case cfg.Autocast() != dt:
			return fmt.Errorf("model %s holds %s in %v (-bf16-weights): train it under autocast to %v (-amp -amp-dtype %v)", cfg.Model, n.Name, dt, dt, dt)
		}
	}
	return nil
}

// fusable says why cfg's optimizer cannot be fused into the backward
// (Config.FuseOptimizer), or nil.
func fusable(cfg Config, opt optim.Optimizer) error {
	why := FuseRefusal(cfg.AMP, 1)
	if _, ok := opt.(optim.PerParameter); !ok {
		why = fmt.Sprintf("the %s optimizer: it updates all of its parameters at once", cfg.Optimizer)
	}
	if why != "" {
		return fmt.Errorf("fusing the optimizer into the backward (-fuse-optimizer) with %s", why)
	}
	return nil
}

// ActivationsRefusal is why OffloadActivations is refused without
// checkpointing.
const ActivationsRefusal = "-offload-activations moves what checkpointed blocks keep to host memory: use it with -checkpoint"

// FuseRefusal says why an optimizer cannot be fused into the backward
// (Config.FuseOptimizer) beside amp or a data-parallel job of ranks
// processes, naming the command's flag, or "" where nothing stops it.
// Clipping does not: the step then takes the norm in a first pass (Note
// [the norm in a first pass]).
func FuseRefusal(amp AMP, ranks int) string {
	switch {
	case amp == AMPF16:
		return "-amp-dtype f16: F16's loss scaling skips a step whose gradients overflow, known only after the last (use -amp-dtype bf16)"
	case ranks > 1:
		return fmt.Sprintf("-nproc %d: a data-parallel step updates after the gradients are all-reduced", ranks)
	}
	return ""
}

// Release frees the step's, the optimiser's and the scaler's state (the
// model is the caller's).
func (t *Trainer) Release() {
	t.Step.Release()
	t.Opt.Release()
	t.evalSums.Release()
}

// RunStep sets the scheduled learning rate and runs one training step on a
// batch (see Step.Run), then calls EmptyCache if Cfg.EmptyCacheEvery says so.
// A closed Stop ends an eager step within one operation (Step.Stop).
//
// A step that runs out of memory leaves no trace (Step.Run is a
// transaction) and runs again, unless FailOnOOM: first whole, after the
// step's planned arena (Step.FreeArena) and the pool's cached blocks went
// back to the device; then as micro-batches of half the batch,
// halving until the step fits (Step.SetMicroBatch: the same effective
// batch), and the later steps keep that size. If one example at a time does
// not fit either, RunStep returns the allocator's error. OOM says what was
// done.
func (t *Trainer) RunStep(x, y *tensor.Tensor) error {
	t.Opt.SetLR(t.Sched.LR(t.Steps))
	t.Step.Stop = t.Stop
	err := t.Step.Run(x, y)
	if errors.Is(err, memory.ErrOutOfMemory) && !t.FailOnOOM && !errors.Is(err, ErrPartlyUpdated) {
		err = t.recoverOOM(x, y, err)
	}
	if err != nil {
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

// recoverOOM runs again a step that ran out of memory (see RunStep).
func (t *Trainer) recoverOOM(x, y *tensor.Tensor, err error) error {
	t.OOM.Recoveries++
	a := t.Dev.Allocator()
	if err := t.Step.FreeArena(); err != nil {
		return err
	}
	a.EmptyCache()
	if err = t.Step.Run(x, y); !errors.Is(err, memory.ErrOutOfMemory) {
		if err == nil {
			t.OOM.note("step %d ran out of memory; it ran again whole after the planned arena and the cached blocks were freed", t.Steps+1)
		}
		return err
	}
	n := x.Dim(0)
	for errors.Is(err, memory.ErrOutOfMemory) {
		m := t.Step.MicroBatch()
		if m == 0 || m > n {
			m = n
		}
		if m == 1 {
			return fmt.Errorf("%w\n(step %d does not fit even one example at a time)", err, t.Steps+1)
		}
		from := "a batch"
		if m < n {
			from = "micro-batches"
		}
		from = fmt.Sprintf("%s of %d", from, m)
		m = (m + 1) / 2
		if err := t.Step.SetMicroBatch(m); err != nil {
			return err
		}
		a.EmptyCache()
		t.OOM.MicroBatch = m
		err = t.Step.Run(x, y)
		if err == nil {
			t.OOM.note("step %d ran out of memory at %s; it runs as micro-batches of %d from now on (gradients accumulated; batch norm, if any, per micro-batch)",
				t.Steps+1, from, m)
		}
	}
	return err
}

// Evaluate returns the mean loss and the accuracy over a loader, with
// recording off and the model in evaluation mode, eagerly. The sums stay on
// the device until the end: one read. A batch that runs out of memory runs
// again after the step's planned arena is given back (the next step makes
// it again), then in halves (in evaluation mode the examples are
// independent, so the result is the same); later batches keep the size.
//
// In a data-parallel job every rank evaluates its share of l with rank 0's
// batch-norm statistics (broadcast first), and the sums are the job's. In
// a single process a closed Stop ends it within one operation
// (tensor.Interruptible) with an error that wraps ErrInterrupted.
func (t *Trainer) Evaluate(l datasets.Batches) (loss, acc float64, err error) {
	if t.ranks() > 1 {
		var buffers []*tensor.Tensor
		for _, e := range t.Model.State("") {
			if !e.Param {
				buffers = append(buffers, e.T)
			}
		}
		if err := t.group.Broadcast(buffers, 0); err != nil {
			return 0, 0, fmt.Errorf("evaluation: broadcasting rank 0's batch-norm statistics: %w", err)
		}
	}
	t.Model.SetTraining(false)
	defer t.Model.SetTraining(true)
	be := t.Dev.Backend()
	be.Fill(t.evalSums.Buf(), 0)
	ep := l.Epoch(0)
	defer ep.Close()
	for {
		var x, y *tensor.Tensor
		var ok bool
		if err := tensor.Catch(func() {
			t.Dev.WithScope(func() {
				if x, y, ok = ep.Next(); ok {
					x.Keep()
					y.Keep()
				}
			})
		}); err != nil {
			return 0, 0, fmt.Errorf("evaluation: the loader's batch: %w", err)
		}
		if !ok {
			break
		}
		if t.ranks() == 1 && t.stopRequested() {
			x.Release()
			y.Release()
			return 0, 0, fmt.Errorf("evaluation: %w", ErrInterrupted)
		}
		var err error
		if t.ranks() == 1 && t.Stop != nil {
			t.Dev.Interruptible(t.Stop, func() { err = t.evaluateBatch(x, y) })
		} else {
			err = t.evaluateBatch(x, y)
		}
		x.Release()
		y.Release()
		if errors.Is(err, tensor.ErrInterrupted) {
			return 0, 0, fmt.Errorf("evaluation: %w", ErrInterrupted)
		}
		if err != nil {
			return 0, 0, err
		}
	}
	if t.ranks() > 1 {
		if err := t.group.AllReduce([]*tensor.Tensor{t.evalSums}, false); err != nil {
			return 0, 0, fmt.Errorf("evaluation: %w", err)
		}
	}
	tally := tallyOf(t.evalSums.Float32s())
	return tally.Loss(), tally.Accuracy(), nil
}

// evaluateBatch adds one batch's loss sum and right predictions to evalSums,
// in chunks of at most t.evalChunk examples, halving it when one runs out of
// memory (a chunk adds its sums only once its forward has run).
func (t *Trainer) evaluateBatch(x, y *tensor.Tensor) error {
	be := t.Dev.Backend()
	n := x.Dim(0)
	for lo := 0; lo < n; {
		m := n - lo
		if t.evalChunk > 0 {
			m = min(m, t.evalChunk)
		}
		err := func() (err error) {
			defer recoverError(&err)
			ag.NoGrad(t.Dev, func() {
				t.Dev.WithScope(func() {
					xs, ys := x, y
					if m < n {
						xs, ys = x.Rows(lo, lo+m), y.Rows(lo, lo+m)
					}
					lt, right, preds := t.Step.forward(xs, ys)
					be.AccumulateMetrics(t.evalSums.Buf(), lt.Buf(), right.Buf(), preds)
				})
			})
			return nil
		}()
		oom := errors.Is(err, memory.ErrOutOfMemory) && !t.FailOnOOM
		switch {
		case err == nil:
			lo += m
		case oom && t.Step.Arena() != nil:
			// The planned step's arena is not needed until the next step,
			// which allocates it again.
			if err := t.Step.FreeArena(); err != nil {
				return err
			}
			t.Dev.Allocator().EmptyCache()
			if !t.evalFreesArena {
				t.evalFreesArena = true
				t.OOM.note("evaluation ran out of memory beside the planned arena; it gives the arena back while it runs")
			}
		case oom && m > 1:
			t.evalChunk = (m + 1) / 2
			t.Dev.Allocator().EmptyCache()
			t.OOM.note("evaluation ran out of memory at a batch of %d; it evaluates %d examples at a time from now on", m, t.evalChunk)
		default:
			return fmt.Errorf("evaluation: %w", err)
		}
	}
	return nil
}

// Fit trains from t.Epoch (at the position a resumed checkpoint recorded)
// up to Cfg.Epochs, evaluating on test after every epoch. obs may be nil.
// A checkpoint is written after every epoch when save is not empty, once
// the epoch's losses were seen to be finite. It returns the first error of
// a step, an evaluation or a save (running out of memory anywhere among
// them is an error, not a panic), a *DivergedError (see diverged) at the
// progress update, or the end of the epoch, where the run was seen to
// diverge, or an *InterruptedError when Stop was closed.
func (t *Trainer) Fit(trainL, testL datasets.Batches, obs Observer, save string) (err error) {
	if t.start.IsZero() {
		t.start = time.Now()
	}
	var xs, ys *tensor.Tensor
	if err := tensor.Catch(func() { xs, ys = t.Step.Inputs(trainL.Inputs()) }); err != nil {
		return fmt.Errorf("the step's input buffers: %w", err)
	}
	for ; t.Epoch < t.Cfg.Periods(); t.Epoch++ {
		if err := t.fitEpoch(trainL, testL, obs, save, xs, ys); err != nil {
			return err
		}
	}
	return nil
}

// fitEpoch runs epoch t.Epoch (a language model's period between
// evaluations), from its recorded position, in three stages as llm.c marks
// its step's: the epoch begins (where a resumed checkpoint left it), its
// steps run (each followed by its memory sample, publishing, and at
// progress updates the metrics, the divergence check and the agreement to
// stop), and it ends (its figures, the evaluation, the checkpoint).
func (t *Trainer) fitEpoch(trainL, testL datasets.Batches, obs Observer, save string, xs, ys *tensor.Tensor) error {
	// ---- begin
	e := t.beginEpoch(trainL, obs)
	defer e.batches.Close()
	// ---- the steps
	for s := e.pos.Batch; ; s++ {
		ok, err := e.step(xs, ys)
		if errors.Is(err, tensor.ErrInterrupted) { // stopped within the step, which left no trace: resume runs it
			e.pos.Seconds = time.Since(e.t0).Seconds()
			return t.interrupt(&e.pos, save)
		}
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if err := e.sample(); err != nil {
			return err
		}
		update := (s+1)%e.every == 0 || s+1 == e.steps
		if update {
			if err := e.progress(s + 1); err != nil {
				return err
			}
		}
		if s+1 < e.steps {
			if stop, err := t.stopping(update); err != nil {
				return err
			} else if stop {
				e.pos.Seconds = time.Since(e.t0).Seconds()
				return t.interrupt(&e.pos, save)
			}
		}
	}
	// ---- end
	m, err := e.metrics()
	if err != nil {
		return err
	}
	if err := t.evaluateEpoch(testL, &m); err != nil {
		if errors.Is(err, ErrInterrupted) { // stopped during the evaluation: resume evaluates again
			e.pos.Seconds = time.Since(e.t0).Seconds()
			return t.interrupt(&e.pos, save)
		}
		return err
	}
	return t.endEpoch(m, obs, save)
}

// epochRun is an epoch under way: its batches, where it is (the Position
// a checkpoint records mid-epoch), and how far its progress updates have
// checked the metrics.
type epochRun struct {
	t       *Trainer
	obs     Observer
	batches datasets.Iterator
	pos     Position
	steps   int // the epoch's
	every   int // steps between progress updates
	checked int // steps whose metrics a progress update has read
	t0      time.Time
}

// beginEpoch starts epoch t.Epoch where a resumed checkpoint left it (its
// metrics then the job's sums so far), or at its first batch.
func (t *Trainer) beginEpoch(trainL datasets.Batches, obs Observer) *epochRun {
	e := &epochRun{t: t, obs: obs, steps: trainL.Len(), every: t.ProgressEvery}
	if e.every <= 0 {
		e.every = max(1, e.steps/50)
	}
	if obs != nil {
		obs.EpochStart(t.Epoch, e.steps)
	}
	t.Dev.Allocator().WindowPeak()
	if t.position != nil {
		e.pos, t.position = *t.position, nil
		if t.rank0() {
			t.Step.setMetrics(e.pos.Metrics) // the job's sums
		} else {
			t.Step.ResetMetrics()
		}
	} else {
		t.Step.ResetMetrics()
		_, e.pos.Skipped = t.Step.Metrics()
	}
	t.skipsSeen = e.pos.Skipped
	e.checked = e.pos.Batch
	e.batches = trainL.EpochFrom(t.Epoch, e.pos.Batch)
	e.t0 = time.Now().Add(-time.Duration(e.pos.Seconds * float64(time.Second)))
	return e
}

// step runs the next batch's training step; ok is false at the epoch's
// end.
func (e *epochRun) step(xs, ys *tensor.Tensor) (ok bool, err error) {
	var bs int
	var stepErr error
	err = tensor.Catch(func() {
		e.t.Dev.WithScope(func() {
			var x, y *tensor.Tensor
			x, y, ok = e.batches.NextInto(xs, ys)
			if !ok {
				return
			}
			bs = x.Dim(0)
			stepErr = e.t.RunStep(x, y)
		})
	})
	if err = errors.Join(err, stepErr); err != nil || !ok {
		return false, err
	}
	e.pos.Batch, e.pos.Seen = e.pos.Batch+1, e.pos.Seen+bs
	return true, nil
}

// sample records the pool's state after a step, and publishes the
// weights every PublishEvery steps.
func (e *epochRun) sample() error {
	t, a := e.t, e.t.Dev.Allocator()
	pa, pr := a.WindowPeak()
	st := a.Stats()
	e.pos.PeakAllocated, e.pos.PeakReserved = max(e.pos.PeakAllocated, pa), max(e.pos.PeakReserved, pr)
	t.peakAllocated, t.peakReserved = max(t.peakAllocated, pa), max(t.peakReserved, pr)
	t.Memory = append(t.Memory, MemSample{Step: t.Steps, Seconds: time.Since(t.start).Seconds(),
		Allocated: st.Allocated[memory.All].Current, Reserved: st.Reserved[memory.All].Current, PeakAllocated: pa})
	if t.Publisher != nil && t.PublishEvery > 0 && t.Steps%t.PublishEvery == 0 {
		if _, err := t.Publisher.Publish(t.Model); err != nil {
			return err
		}
	}
	return nil
}

// progress is a progress update after done steps of the epoch: the
// metrics read from the device (one of the loop's few reads), checked for
// divergence, and told to the observer.
func (e *epochRun) progress(done int) error {
	t := e.t
	tally, skipped, err := t.Step.JobMetrics()
	if err != nil {
		return err
	}
	if err := t.diverged(tally.LossSum, skipped, done-e.checked); err != nil {
		return err
	}
	e.checked = done
	if e.obs != nil {
		secs := time.Since(e.t0).Seconds()
		st := t.Dev.Allocator().Stats()
		e.obs.Step(StepStats{Epoch: t.Epoch, Step: done, Steps: e.steps, Loss: tally.Loss(), Acc: tally.Accuracy(),
			ImgPerSec: float64(e.pos.Seen*t.ranks()) / secs, PredictionsPerSec: float64(tally.Count) / secs,
			Allocated: st.Allocated[memory.All].Current, PeakAllocated: t.peakAllocated, Reserved: st.Reserved[memory.All].Current})
	}
	return nil
}

// metrics are the finished epoch's training figures, the device drained.
func (e *epochRun) metrics() (EpochMetrics, error) {
	t := e.t
	if err := t.Dev.Synchronize(); err != nil {
		return EpochMetrics{}, err
	}
	secs := time.Since(e.t0).Seconds()
	tally, skipped, err := t.Step.JobMetrics()
	if err != nil {
		return EpochMetrics{}, err
	}
	m := EpochMetrics{Epoch: t.Epoch, TrainLoss: Float(tally.Loss()), TrainAcc: Float(tally.Accuracy()),
		ImgPerSec: float64(e.pos.Seen*t.ranks()) / secs, PredictionsPerSec: float64(tally.Count) / secs, Seconds: secs,
		PeakAllocated: e.pos.PeakAllocated, PeakReserved: e.pos.PeakReserved, SkippedSteps: skipped - e.pos.Skipped, LR: t.Opt.LR()}
	if t.Step.Scaler.Enabled() {
		m.LossScale = t.Step.Scaler.Scale()
	}
	return m, nil
}

// evaluateEpoch evaluates on testL into m, its peak kept apart from the
// training's, and fails on a test loss that is not finite.
func (t *Trainer) evaluateEpoch(testL datasets.Batches, m *EpochMetrics) error {
	a := t.Dev.Allocator()
	a.WindowPeak()
	testLoss, testAcc, err := t.Evaluate(testL)
	if err != nil {
		return err
	}
	pa, _ := a.WindowPeak()
	t.evalPeak = max(t.evalPeak, pa)
	m.TestLoss, m.TestAcc = Float(testLoss), Float(testAcc)
	if math.IsNaN(testLoss) || math.IsInf(testLoss, 0) {
		return &DivergedError{Epoch: t.Epoch, Step: t.Steps, Why: fmt.Sprintf("the test loss is %v", testLoss)}
	}
	if t.Step.Mode != Eager {
		// The evaluation's memory came from the pools, which planned
		// steps do not use: give it back.
		a.EmptyCache()
	}
	return nil
}

// endEpoch records the epoch, publishes the weights, saves the checkpoint
// (which resumes at the next epoch) and, before another epoch, lets the
// ranks agree whether to stop.
func (t *Trainer) endEpoch(m EpochMetrics, obs Observer, save string) error {
	t.History = append(t.History, m)
	if obs != nil {
		obs.EpochEnd(m)
	}
	if t.Publisher != nil {
		if _, err := t.Publisher.Publish(t.Model); err != nil {
			return err
		}
	}
	if save != "" {
		if err := t.saveJob(save, t.Epoch+1, nil); err != nil {
			return err
		}
	}
	if t.Epoch+1 < t.Cfg.Periods() {
		// The last step was a progress update: the ranks agree here too.
		if stop, err := t.stopping(true); err != nil || stop {
			t.Epoch++
			if err != nil {
				return err
			}
			ie := &InterruptedError{Epoch: t.Epoch, Step: t.Steps}
			if save != "" {
				ie.Saved = save
			}
			return ie
		}
	}
	return nil
}

// rank0 says whether this trainer writes the job's checkpoints.
func (t *Trainer) rank0() bool { return t.group == nil || t.group.Rank() == 0 }

// saveJob writes the job's checkpoint, to resume at epoch and, within it,
// pos (nil: its start): every rank gathers a sharded optimiser's state,
// and rank 0 saves.
func (t *Trainer) saveJob(path string, epoch int, pos *Position) error {
	if o, ok := t.Opt.(*dist.ShardedOptimizer); ok {
		var err error
		if cerr := tensor.Catch(func() { err = o.Gather() }); cerr != nil || err != nil {
			return fmt.Errorf("gathering the sharded optimizer state: %w", errors.Join(cerr, err))
		}
	}
	if !t.rank0() {
		return nil
	}
	var err error
	if cerr := tensor.Catch(func() { err = t.saveAt(path, epoch, pos) }); cerr != nil {
		return fmt.Errorf("saving the training checkpoint: %w", cerr)
	}
	return err
}

// stopRequested says whether Stop was closed, on this rank.
func (t *Trainer) stopRequested() bool {
	select {
	case <-t.Stop:
		return t.Stop != nil
	default:
		return false
	}
}

// stopping says whether Stop was closed. In a data-parallel job the
// answer is the job's, agreed at progress updates only (an all-reduce of
// each rank's flag): between them it is false.
func (t *Trainer) stopping(update bool) (bool, error) {
	mine := t.stopRequested()
	if t.group == nil || t.group.Size() == 1 {
		return mine, nil
	}
	if !update {
		return false, nil
	}
	flag := float32(0)
	if mine {
		flag = 1
	}
	var any bool
	err := tensor.Catch(func() {
		t.Dev.WithScope(func() {
			f := tensor.FromFloat32(t.Dev, []float32{flag}, 1)
			if err := t.group.AllReduce([]*tensor.Tensor{f}, false); err != nil {
				panic(err)
			}
			any = f.Float32s()[0] > 0
		})
	})
	return any, err
}

// interrupt ends an epoch at pos: the device drained, the checkpoint
// saved there, and the error that says so.
func (t *Trainer) interrupt(pos *Position, save string) error {
	if err := t.Dev.Synchronize(); err != nil {
		return err
	}
	ie := &InterruptedError{Epoch: t.Epoch, Batch: pos.Batch, Step: t.Steps}
	if save == "" {
		return ie
	}
	tally, _, err := t.Step.JobMetrics() // rank 0 takes the job's sums back on resume
	if err != nil {
		return errors.Join(ie, err)
	}
	pos.Metrics = []float32{float32(tally.LossSum), float32(tally.Right), float32(tally.Count)}
	if err := t.saveJob(save, t.Epoch, pos); err != nil {
		return errors.Join(ie, err)
	}
	ie.Saved = save
	return ie
}

// diverged checks the metrics read at a progress update, steps after the
// previous one. Divergence is a loss that is not finite without AMP; with
// AMP (where steps whose gradients overflow are skipped and the loss scale
// lowered), a window of steps all skipped whose loss is not finite either
// (the forward itself overflowed: no loss scale mends that), or MaxSkips
// steps in a row skipped. Consecutive skips are counted over whole
// windows between updates.
func (t *Trainer) diverged(lossSum float64, skipped, steps int) error {
	if !t.Cfg.AMP.On() {
		if math.IsNaN(lossSum) || math.IsInf(lossSum, 0) {
			return &DivergedError{Epoch: t.Epoch, Step: t.Steps,
				Why: fmt.Sprintf("the training loss became %v in the last %s", lossSum, stepCount(steps))}
		}
		return nil
	}
	allSkipped := skipped-t.skipsSeen == steps
	if allSkipped {
		t.skipRun += steps
	} else {
		t.skipRun = 0
	}
	t.skipsSeen = skipped
	if allSkipped && (math.IsNaN(lossSum) || math.IsInf(lossSum, 0)) {
		return &DivergedError{Epoch: t.Epoch, Step: t.Steps,
			Why: fmt.Sprintf("the training loss became %v with every step skipped in the last %s (the forward overflows, at any loss scale)", lossSum, stepCount(steps))}
	}
	if t.MaxSkips > 0 && t.skipRun >= t.MaxSkips {
		return &DivergedError{Epoch: t.Epoch, Step: t.Steps,
			Why: fmt.Sprintf("every step was skipped in the last %s: the gradients were not finite at any loss scale (now %.3g)", stepCount(t.skipRun), t.Step.Scaler.Scale())}
	}
	return nil
}

// stepCount is "1 step" or "n steps".
func stepCount(n int) string {
	if n == 1 {
		return "1 step"
	}
	return fmt.Sprintf("%d steps", n)
}

// Peaks are the training steps' peak allocated and reserved bytes, from the
// pool (evaluation is not a step: EvalPeak).
func (t *Trainer) Peaks() (allocated, reserved int64) { return t.peakAllocated, t.peakReserved }

// EvalPeak is the evaluations' peak allocated bytes.
func (t *Trainer) EvalPeak() int64 { return t.evalPeak }

// EvalChunk is how many examples an evaluation runs at a time since one ran
// out of memory (0: whole batches).
func (t *Trainer) EvalChunk() int { return t.evalChunk }
