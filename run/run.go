// Package run is a whole training run, as cmd/train does it, for a Go
// program: a Job in (the configuration, the data, what to measure, fit,
// save and record), a Report out (what was measured and trained, always
// valid JSON, also for a run that failed), and the memory plot. It sits
// above package train, whose Step and Trainer it drives, so that a service
// that imports only train links no plotting or report code.
package run

import (
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/dist"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/optim"
	"github.com/leangrad/leangrad/tensor"
	"github.com/leangrad/leangrad/train"
)

// Job is a training run to do: the Config its checkpoints record, the data,
// and what to measure, fit, save and record on the way. cmd/train fills it
// from its flags; a Go program fills it itself and calls Train.
type Job struct {
	train.Config
	// Train and Test are an image classifier's data.
	Train, Test *datasets.Dataset
	// Text is a language model's (train.Arch.Text) corpus: each "epoch" is
	// Config.EvalEvery steps on random windows of its training split, then
	// an evaluation on its validation split (Config.EvalBatches' worth).
	Text *datasets.Corpus
	// Sample, for a language model, generates that many tokens with the
	// trained model at the end (Report.Sample), drawn as Sampling says,
	// after Prompt (empty: the validation split's first tokens).
	Sample   int
	Sampling nn.Sampling
	Prompt   string
	// Augment takes random crops (padding 2, or 4 for 32×32 images) and
	// horizontal flips, for the models they suit (train.Arch.CNN).
	Augment bool
	// Measure runs one step of fp32, AMP, checkpointing and both first,
	// and reports each one's peak (Report.Measured).
	Measure bool
	// CheckpointMode is what the measured configurations checkpoint
	// (NoCheckpoint: blocks), and MeasuredAMP what their AMP, and the
	// budget's, autocasts to (NoAMP: Config.AMP's, or F16).
	CheckpointMode nn.CheckpointMode
	MeasuredAMP    train.AMP
	// MaxMemory caps the pool at this many bytes and fits the step into it
	// (train.FitBudget; 0: no cap). Allow, if set, rules out candidates.
	//
	// A language model whose F32 parameters, gradients and AdamW state
	// pass MaxMemory, and would fit with 8-bit moments, takes them
	// (optimizer adamw8bit) unless KeepOptimizer (the user named the
	// optimizer). Else, on a GPU, one whose parameters and gradients alone
	// fit keeps the state in host memory (Config.OffloadOptimizer) unless
	// KeepOptimizerOnDevice, updated in the backward (Config.FuseOptimizer)
	// where clipping is off, the results the same, unless KeepUnfused. The
	// sizes are planned from the shape, before anything is built. Where the
	// state fits but no configuration of the step fits beside it, the
	// budget's search runs again with the state moved the same way (8 bits,
	// then host memory), unless the run resumes a checkpoint.
	MaxMemory                                         int64
	Allow                                             func(train.Variant) bool
	KeepOptimizer, KeepOptimizerOnDevice, KeepUnfused bool
	// KeepDeviceState keeps Config.DeviceState as the user gave it; else,
	// with the optimizer offloaded, the budget keeps on the device the
	// state of as many of the first parameters as the chosen step leaves
	// room for (deviceStateInRoom).
	KeepDeviceState bool
	// Save writes a checkpoint after every epoch; Resume starts from one
	// (with ResumeForce, even one of another configuration).
	Save, Resume string
	ResumeForce  bool
	// RecordTimeline and RecordHistory turn on the allocator's recordings
	// for the training (memory.Allocator.RecordTimeline, RecordHistory).
	RecordTimeline, RecordHistory bool
	// Progress follows the epochs (nil: nothing); Log hears what the run
	// says as it goes: measurements, the budget, resume (nil: nothing).
	Progress train.Observer
	Log      io.Writer
	// Stop, when closed, stops the run at the next step boundary (before
	// the training: between stages, and between the measured or fitted
	// configurations' steps): a checkpoint is saved there when Save is set, and Train returns an error wrapping
	// train.ErrInterrupted with the report (see train.Trainer.Stop).
	Stop <-chan struct{}
	// Group, if set, makes the run one rank of a data-parallel job
	// (Trainer.SetGroup): the batch is per rank, each rank trains on its
	// share of every epoch and evaluates its share of the test set, and
	// the figures are the job's. Only rank 0 saves. ShardOptimizer
	// shards the optimiser's state over the ranks (ZeRO stage 1,
	// dist.Shard); the checkpoints hold it whole.
	Group          *dist.Group
	ShardOptimizer bool
}

// The CPU policy: what a run on a CPU trains, where the user did not
// choose, so that it ends in minutes rather than hours. These constants,
// CPUModel and Job.CPUDefaults are its one statement; CPUPolicy says it
// for -h.
const (
	CPULimit     = 2000 // training images
	CPUTestLimit = 1000 // test images
	CPUEpochs    = 1
	CPUBatch     = 32 // with the learning rate scaled linearly
)

// CPUPolicy says the CPU policy, for a command's -h.
var CPUPolicy = fmt.Sprintf("On a CPU, unless given: -limit %d -test-limit %d -epochs %d -batch %d (the learning rate scaled to it), and -model gpt is %s.",
	CPULimit, CPUTestLimit, CPUEpochs, CPUBatch, cpuGPT)

// cpuGPT is what a CPU trains for gpt, whose GPU-sized default (gpt-small)
// would take hours there.
const cpuGPT = "gpt-mini"

// CPUModel is the model a CPU trains for name, and why when it is another.
func CPUModel(name string) (model, why string) {
	if name == "gpt" {
		return cpuGPT, "the gpt-mini preset (2 layers of width 128, context 64; its recipe: 200 steps of 16 windows; -model gpt-small trains the GPU's gpt here too)"
	}
	return name, ""
}

// CPUDefaults applies the CPU policy to the job, where given says the user
// did not choose: for an image classifier the first CPULimit training
// images ("limit") and CPUTestLimit test images ("test-limit"), CPUEpochs
// ("epochs"), and a batch of CPUBatch ("batch") with the learning rate
// ("lr") scaled linearly; for a language model, CPUModel's. It returns
// what it changed, to be said.
func (j *Job) CPUDefaults(given func(name string) bool) []string {
	var notes []string
	if j.Text != nil {
		if m, why := CPUModel(j.Model); m != j.Model {
			j.Model = m
			notes = append(notes, why)
		}
		return notes
	}
	if !given("limit") && j.Train.N > CPULimit {
		j.Train = j.Train.Subset(CPULimit)
		notes = append(notes, fmt.Sprintf("the first %d training images", CPULimit))
	}
	if !given("test-limit") && j.Test.N > CPUTestLimit {
		j.Test = j.Test.Subset(CPUTestLimit)
		notes = append(notes, fmt.Sprintf("%d test images", CPUTestLimit))
	}
	if !given("epochs") && j.Epochs > CPUEpochs {
		j.Epochs = CPUEpochs
		notes = append(notes, plural(CPUEpochs, "epoch"))
	}
	if !given("batch") && j.Batch > CPUBatch {
		if !given("lr") {
			j.LR *= CPUBatch / float64(j.Batch) // the linear scaling rule
			notes = append(notes, fmt.Sprintf("lr %g", j.LR))
		}
		j.Batch = CPUBatch
		notes = append(notes, fmt.Sprintf("batch %d", CPUBatch))
	}
	return notes
}

// Train trains job.Config's model on dev and reports what happened. The
// report is returned also with an error, saying as much as the run got to.
// The stages, in order: the loaders; the budget (with MaxMemory); the
// measured savings (with Measure); the model and trainer, joined to the
// job's group and resumed; the training; the summary.
func Train(dev *tensor.Device, job Job) (report *Report, err error) {
	r := &runner{dev: dev, job: job, cfg: job.Config, say: job.Log}
	if r.say == nil {
		r.say = io.Discard
	}
	r.report = &Report{Config: r.cfg, Device: dev.Name()}
	switch {
	case job.Text != nil:
		r.report.Dataset, r.report.DataDir = job.Text.Name, job.Text.Path
		r.report.Tokenizer, r.report.TrainTokens, r.report.ValTokens = job.Text.Tokenizer.Name(), len(job.Text.Train), len(job.Text.Val)
	case job.Train != nil && job.Test != nil:
		r.report.Dataset, r.report.DataDir = job.Train.Name, job.Train.Dir
		r.report.TrainImages, r.report.TestImages = job.Train.N, job.Test.N
	}
	defer func() { r.report.finish(dev, err) }()
	defer r.release()
	setup := []func() error{r.lookup, r.checkResume, r.loaders}
	for i, stage := range append(setup, r.fitBudget, r.measure, r.trainer, r.fit, r.summarize, r.sample) {
		if r.t == nil && r.stopped() { // before the training: nothing to save
			return r.report, &train.InterruptedError{Epoch: r.startEpoch}
		}
		// Operations panic when the device runs out of memory (or fails);
		// no stage lets that through as a panic.
		var err error
		if cerr := tensor.Catch(func() { err = stage() }); cerr != nil {
			err = cerr
		}
		if err != nil && i < len(setup) {
			err = &SetupError{Err: err}
		}
		if err != nil {
			return r.report, err
		}
	}
	return r.report, nil
}

// SetupError is Train's error when the job could not start (an unknown
// model, data that does not suit it, a checkpoint that does not match):
// nothing was measured or trained.
type SetupError struct{ Err error }

func (e *SetupError) Error() string { return e.Err.Error() }

// Unwrap returns the cause.
func (e *SetupError) Unwrap() error { return e.Err }

// stopped says whether Job.Stop was closed.
func (r *runner) stopped() bool {
	select {
	case <-r.job.Stop:
		return r.job.Stop != nil
	default:
		return false
	}
}

// runner is a Train in progress: what each stage leaves for the next.
type runner struct {
	dev    *tensor.Device
	job    Job
	cfg    train.Config // the job's, with what the budget chose
	say    io.Writer
	report *Report

	arch          train.Arch
	mode          train.Mode
	input         []int    // one example's shape
	classes       int      // or the vocabulary
	labels        []string // the classes' names, where the dataset has them
	trainL, testL datasets.Batches
	micro         int  // the micro-batch size the budget chose (0: whole batches)
	eightBit      bool // the budget took AdamW's moments to 8 bits (eightBitChosen)
	model         nn.Model
	t             *train.Trainer
	resumed       int       // epochs of the history that ran before this run
	startEpoch    int       // the epoch the run starts at (a resumed checkpoint's)
	mean, std     []float32 // the images' normalisation
	wall          time.Duration
}

func (r *runner) lookup() (err error) {
	if r.arch, err = train.LookupArch(r.cfg.Model); err != nil {
		return err
	}
	if r.arch, err = r.arch.For(r.cfg); err != nil {
		return err
	}
	switch {
	case r.arch.Text && r.job.Text == nil:
		return fmt.Errorf("model %s is a language model: the job needs a text corpus (Job.Text)", r.cfg.Model)
	case !r.arch.Text && (r.job.Train == nil || r.job.Test == nil):
		return fmt.Errorf("model %s classifies images: the job needs training and test images (Job.Train, Job.Test)", r.cfg.Model)
	}
	err = r.stateFits()        // which may offload the optimizer
	r.mode = r.cfg.Mode(r.dev) // how the steps will run
	return err
}

// stateFits refuses, before anything is built, a language model whose
// parameters, gradients and optimizer state alone (F32: 4 bytes each, and
// the optimizer's state, optim.StateBytes) pass the device's memory, or the
// budget: no configuration of activations can make it fit. With the
// optimizer offloaded, the device holds the parameters and the gradients
// in flight (optim.OffloadedDeviceBytes), and the host their copies and
// the state (optim.Offload), but for the share of the parameters' bytes
// whose state stays on the device (train.Config.DeviceState), counted
// there whole with their gradients.
func (r *runner) stateFits() error {
	if !r.arch.Text {
		return nil
	}
	g := r.gptShape()
	params := int64(g.Params())
	whole := optim.TrainingBytes(r.cfg.Optimizer, params)
	if err := r.bf16Weights(); err != nil {
		return err
	}
	offload := r.cfg.Offloads(r.dev)
	need, what := whole, fmt.Sprintf("with their gradients and %s's state", r.cfg.Optimizer)
	var hostNeed int64
	var held []string
	if offload {
		keptBytes := int64(r.cfg.DeviceState * float64(g.ParamBytes())) // at most; F32
		kept := keptBytes / 4
		need, what = optim.OffloadedDeviceBytes(g.ParamBytes())+keptBytes+optim.StateBytes(r.cfg.Optimizer, kept), "with the gradients in flight to host memory (the optimizer's state there)"
		if kept > 0 {
			what = fmt.Sprintf("with the gradients in flight to host memory (the optimizer's state there) but %s's, whose gradients and state stay (-device-state %g)", memory.Bytes(keptBytes), r.cfg.DeviceState)
		}
		onHost := optim.OffloadedHostBytes(r.cfg.Optimizer, params-kept, g.ParamBytes()-keptBytes)
		sums := ""
		if r.cfg.MicroBatched() {
			onHost += optim.OffloadedSumBytes(params - kept)
			sums = fmt.Sprintf(" and their sums over micro-batches of %d", r.cfg.MicroBatch)
		}
		hostNeed += onHost
		held = append(held, fmt.Sprintf("-offload-optimizer %s of copies of its %s parameters, their gradients%s and %s's state",
			memory.Bytes(onHost), count(int(params)), sums, r.cfg.Optimizer))
	}
	if r.cfg.OffloadsActivations(r.dev) {
		acts := g.KeptBytes(r.cfg.Batch, r.cfg.Autocast())
		hostNeed += acts
		held = append(held, fmt.Sprintf("-offload-activations %s of what its %d blocks keep a step", memory.Bytes(acts), g.Layers))
	}
	if may := memory.HostShare(); hostNeed > may {
		return fmt.Errorf("model %s: in host memory %s, %s in all, more than the %s this process may hold (%.0f%% of the host's %s)",
			r.cfg.Model, strings.Join(held, " and "), memory.Bytes(hostNeed), memory.Bytes(may), 100*memory.HeapShare, memory.Bytes(memory.HostMemory()))
	}
	limit, of := r.stateLimit()
	over := fmt.Sprintf("its %s parameters take %s in F32 with their gradients and %s's state, more than the %s of %s",
		count(int(params)), memory.Bytes(whole), r.cfg.Optimizer, memory.Bytes(limit), of)
	if need > limit && !offload && r.eightBitChosen(params, limit, over) {
		return r.stateFits() // with the 8-bit moments' sizes
	}
	if need > limit && !r.cfg.BF16Weights && r.offloadChosen(g, whole, limit, of, over) {
		return nil
	}
	if need > limit {
		var hints []string
		halved := g
		halved.ProductWeights = tensor.BF16
		switch {
		case r.dev.OnHost() || r.cfg.Optimizer == "adamw8bit":
		case !offload && optim.OffloadedDeviceBytes(4*params) <= limit:
			hints = append(hints, "-offload-optimizer keeps the state in host memory")
		case !r.cfg.BF16Weights && optim.OffloadedDeviceBytes(halved.ParamBytes()) <= limit && r.cfg.AMP != train.AMPF16:
			hints = append(hints, "-offload-optimizer -bf16-weights -amp -amp-dtype bf16 keeps the state and F32 masters in host memory, the blocks' weights in bf16 on the device")
		}
		if r.eightBitFits(params, limit) {
			hints = append(hints, "-optimizer adamw8bit holds AdamW's moments in a quarter of the bytes")
		}
		hint := ""
		if len(hints) > 0 {
			hint = " (" + strings.Join(hints, "; ") + ")"
		}
		in := "in F32"
		if r.cfg.BF16Weights && offload {
			in = "with the blocks' weights in bf16"
		}
		return fmt.Errorf("model %s: its %s parameters take %s %s %s, more than the %s of %s%s",
			r.cfg.Model, count(int(params)), memory.Bytes(need), in, what, memory.Bytes(limit), of, hint)
	}
	return nil
}

// stateLimit is the device memory that a model's parameters, gradients
// and optimizer state must fit within, and what it is called: the budget
// (Job.MaxMemory) where it is less than the device's memory.
func (r *runner) stateLimit() (int64, string) {
	_, total := r.dev.MemInfo()
	if r.job.MaxMemory > 0 && r.job.MaxMemory < total {
		return r.job.MaxMemory, "the budget (-max-memory)"
	}
	return total, r.dev.Name() + "'s memory"
}

// eightBitChosen turns AdamW's F32 moments of params parameters into 8-bit
// ones (optimizer adamw8bit) for the reason why, and says so, where those
// fit within limit with the parameters and gradients and the budget allows
// it (Job.MaxMemory, not Job.KeepOptimizer, no sharded state): on the
// device, the steps captured, which beats the state in host memory (GPT-2
// XL under 24 GiB on an H100: 32,627 tokens/s against 20,643 with the
// host's update in the backward, docs/benchmarks.md), and AdamW's
// validation loss within 0.05 nats (TestAdamW8bitFollowsAdamW).
func (r *runner) eightBitChosen(params, limit int64, why string) bool {
	if r.job.MaxMemory <= 0 || r.job.KeepOptimizer || r.job.ShardOptimizer || !r.eightBitFits(params, limit) {
		return false
	}
	r.cfg.Optimizer, r.eightBit = "adamw8bit", true
	keep := "-optimizer adamw keeps them in F32"
	if !r.dev.OnHost() {
		keep += ", the state in host memory"
	}
	fmt.Fprintf(r.say, "model %s: %s: AdamW's moments go to 8 bits (-optimizer adamw8bit), %s in all (%s)\n",
		r.cfg.Model, why, memory.Bytes(optim.TrainingBytes("adamw8bit", params)), keep)
	return true
}

// stateElsewhere moves a language model's optimizer state where no
// configuration of the step fitted the budget beside it, and says so:
// AdamW's F32 moments to 8 bits on the device (eightBitChosen), or, where
// those did not fit either (or are not the run's to take), AdamW's F32
// state to host memory (offloadChosen: 8-bit moments do not go there). It
// reports whether it moved the state, and refuses what host memory cannot
// hold. A resumed run keeps its checkpoint's optimizer.
func (r *runner) stateElsewhere() (bool, error) {
	if !r.arch.Text || r.cfg.OffloadOptimizer || r.job.Resume != "" {
		return false, nil
	}
	g := r.gptShape()
	params := int64(g.Params())
	limit, of := r.stateLimit()
	why := fmt.Sprintf("no configuration of its step fits %s beside %s's state on the device", of, r.cfg.Optimizer)
	switch {
	case r.cfg.Optimizer == "adamw" && r.eightBitChosen(params, limit, why):
	case r.eightBit: // the budget's 8 bits did not fit: AdamW's F32 state goes to the host
		r.cfg.Optimizer, r.eightBit = "adamw", false
		why = fmt.Sprintf("no configuration of its step fits %s beside AdamW's 8-bit moments on the device either", of)
		if !r.offloadChosen(g, optim.TrainingBytes("adamw", params), limit, of, why) {
			r.cfg.Optimizer, r.eightBit = "adamw8bit", true
			return false, nil
		}
	case !r.offloadChosen(g, optim.TrainingBytes(r.cfg.Optimizer, params), limit, of, why):
		return false, nil
	}
	r.mode = r.cfg.Mode(r.dev)
	r.report.Config = r.cfg
	return true, r.stateFits()
}

// gptShape is the language model's shape with the corpus's vocabulary and
// the run's context.
func (r *runner) gptShape() nn.GPTConfig {
	g := r.arch.GPT
	g.Vocab, g.Context = r.job.Text.Tokenizer.Vocab(), contextOf(r.arch, r.cfg.Context)
	return g
}

// offloadChosen turns Config.OffloadOptimizer on for the reason why, and
// says so, when the budget allows it (Job.MaxMemory,
// Job.KeepOptimizerOnDevice, a GPU, no sharded state, an optimizer whose
// state can move: not adamw8bit's) and it makes the parameters of g fit,
// which with their gradients and state take whole bytes: what they take
// on the device (optim.OffloadedDeviceBytes) within limit (of), what the
// host keeps (optim.OffloadedHostBytes) within its memory. Where their F32
// weights do not fit and the blocks' weights in BF16 would, it turns
// Config.BF16Weights and BF16 AMP on too (unless the run asked for F16).
func (r *runner) offloadChosen(g nn.GPTConfig, whole, limit int64, of, why string) bool {
	params := int64(g.Params())
	if r.job.MaxMemory <= 0 || r.job.KeepOptimizerOnDevice || r.job.ShardOptimizer || r.dev.OnHost() ||
		r.cfg.Optimizer == "adamw8bit" {
		return false
	}
	halved := g
	halved.ProductWeights = tensor.BF16
	device, hostHalved := optim.OffloadedDeviceBytes(4*params), optim.OffloadedHostBytes(r.cfg.Optimizer, params, halved.ParamBytes())
	switch {
	case device <= limit && !r.cfg.OffloadOptimizer && whole <= memory.HostMemory():
		r.cfg.OffloadOptimizer = true
		alternative := ""
		if r.eightBitFits(params, limit) {
			alternative = "; -optimizer adamw8bit would keep its moments on the device in a quarter of the bytes, the steps captured"
		}
		fmt.Fprintf(r.say, "model %s: %s: the state goes to host memory (-offload-optimizer), %s there, %s on the device%s\n",
			r.cfg.Model, why, memory.Bytes(whole), memory.Bytes(device), alternative)
	case device > limit && optim.OffloadedDeviceBytes(halved.ParamBytes()) <= limit && r.cfg.AMP != train.AMPF16 && r.job.MeasuredAMP != train.AMPF16 &&
		hostHalved <= memory.HostMemory():
		r.cfg.OffloadOptimizer, r.cfg.BF16Weights, r.cfg.AMP = true, true, train.AMPBF16
		r.arch.GPT.ProductWeights = tensor.BF16
		fmt.Fprintf(r.say, "model %s: its %s parameters take %s in F32 with the gradients in flight, more than the %s of %s: "+
			"the blocks' weights go to the device in bf16 (-bf16-weights, under bf16 AMP), %s there, their F32 masters and %s's state to host memory (-offload-optimizer), %s\n",
			r.cfg.Model, count(int(params)), memory.Bytes(device), memory.Bytes(limit), of,
			memory.Bytes(optim.OffloadedDeviceBytes(halved.ParamBytes())), r.cfg.Optimizer, memory.Bytes(hostHalved))
	default:
		return false
	}
	r.fuseChosen()
	return true
}

// fuseChosen has the host update each parameter of an offloaded optimizer
// as its gradient arrives, beside the backward (Config.FuseOptimizer), and
// says so, where that changes no result: clipping off, and neither the
// run's AMP nor the budget's F16 (train.FuseRefusal), unless
// Job.KeepUnfused. On GPT-2 XL it leaves 0.153 s of the update after the
// backward, where the update after it takes 0.434 s (docs/benchmarks.md).
func (r *runner) fuseChosen() {
	ranks := 1
	if r.job.Group != nil {
		ranks = r.job.Group.Size()
	}
	if r.cfg.FuseOptimizer || r.job.KeepUnfused || r.cfg.ClipNorm != 0 ||
		train.FuseRefusal(r.cfg.AMP, ranks) != "" || train.FuseRefusal(r.measuredAMP(), ranks) != "" {
		return
	}
	r.cfg.FuseOptimizer = true
	fmt.Fprintf(r.say, "model %s: clipping is off, so the host updates each parameter as its gradient arrives, beside the backward (-fuse-optimizer), with the same results\n", r.cfg.Model)
}

// bf16Weights refuses, before any work, BF16 working weights
// (Config.BF16Weights) without what they need: the optimizer's state and
// masters in host memory on a GPU, and BF16 AMP.
func (r *runner) bf16Weights() error {
	switch {
	case !r.cfg.BF16Weights:
		return nil
	case r.dev.OnHost():
		return fmt.Errorf("-bf16-weights keeps F32 masters in host memory for a GPU's bf16 weights: on the CPU, train in F32 or with -amp")
	case !r.cfg.OffloadOptimizer:
		return fmt.Errorf("-bf16-weights keeps the F32 masters with the optimizer's state in host memory: add -offload-optimizer")
	case r.cfg.AMP != train.AMPBF16:
		return fmt.Errorf("-bf16-weights trains the bf16 weights under bf16 autocast: add -amp -amp-dtype bf16")
	}
	return nil
}

// eightBitFits says whether an AdamW run's params parameters would fit
// within limit on the device with 8-bit moments (-optimizer adamw8bit).
func (r *runner) eightBitFits(params, limit int64) bool {
	return r.cfg.Optimizer == "adamw" && optim.TrainingBytes("adamw8bit", params) <= limit
}

// textDefaults fills a language model's context and tokenizer, where the
// job leaves them to the model and the corpus.
func (r *runner) textDefaults() {
	if !r.arch.Text {
		return
	}
	r.cfg.Context = contextOf(r.arch, r.cfg.Context)
	if r.cfg.Tokenizer == "" {
		r.cfg.Tokenizer = r.job.Text.Tokenizer.Name()
	}
}

// contextOf is a language model's context: the one given, else arch's.
func contextOf(arch train.Arch, given int) int {
	if given > 0 {
		return given
	}
	return arch.Input[0]
}

// CheckResumeBeforeData compares the checkpoint job.Resume holds with the
// job in all that its data does not decide (the dataset, its examples), so
// that a language model's resume is refused before its corpus is
// tokenized; budget says that -max-memory will choose AMP and
// checkpointing. Train compares the rest.
func CheckResumeBeforeData(job Job, budget bool) error {
	if job.Resume == "" {
		return nil
	}
	arch, err := train.LookupArch(job.Model)
	if err != nil {
		return err
	}
	info, err := train.ReadCheckpointInfo(job.Resume)
	if err != nil {
		return err
	}
	now := job.Config
	if arch.Text {
		now.Context = contextOf(arch, now.Context)
	}
	now.Dataset, now.Examples = info.Config.Dataset, info.Config.Examples
	return resumeMatches(job.Resume, info.Config, now, budget, job.ResumeForce)
}

// resumeMatches compares a checkpoint's configuration, saved, with the
// run's: all of it, less AMP and checkpointing when the budget chooses
// them (they are compared once it has, when the trainer resumes).
func resumeMatches(path string, saved, now train.Config, budget, force bool) error {
	if budget {
		saved.AMP, saved.Checkpoint, saved.Checkpointed = now.AMP, now.Checkpoint, now.Checkpointed
	}
	_, err := train.CheckResume(path, saved, now, force)
	return err
}

// checkResume reads the checkpoint to resume (its checksums checked)
// and compares its configuration with the job's before any work
// (resumeMatches). A checkpoint that finished every epoch of the job has
// nothing left to train.
func (r *runner) checkResume() error {
	if r.job.Resume == "" {
		return nil
	}
	info, err := train.ReadCheckpointInfo(r.job.Resume)
	if err != nil {
		return err
	}
	r.textDefaults()
	now := r.cfg
	now.Examples = r.examples()
	if err := resumeMatches(r.job.Resume, info.Config, now, r.job.MaxMemory > 0, r.job.ResumeForce); err != nil {
		return err
	}
	if info.Epoch >= r.cfg.Periods() {
		return fmt.Errorf("%s: the run it holds has done %s, and this one asks for %s: nothing is left to train (ask for more to go on)",
			r.job.Resume, r.length(info.Epoch), r.length(r.cfg.Periods()))
	}
	if p := info.Config.Periods(); p != r.cfg.Periods() && r.cfg.Schedule != "constant" {
		fmt.Fprintf(r.say, "resuming a run of %s as one of %s: the %s schedule takes the new length from here, so the learning rate differs from a run that asked for %s from the start\n",
			r.length(p), r.length(r.cfg.Periods()), r.cfg.Schedule, r.length(r.cfg.Periods()))
	}
	r.startEpoch = info.Epoch
	return nil
}

// length words a number of the run's epochs: "1 epoch", "15 epochs", or
// for a language model its steps, "1,000 steps".
func (r *runner) length(epochs int) string {
	if r.arch.Text {
		return plural(epochs*r.cfg.EvalEvery, "step")
	}
	return plural(epochs, "epoch")
}

// plural is "1 epoch" or "n epochs", with n's thousands apart.
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return count(n) + " " + what + "s"
}

// examples is the number of training examples the job gives: images, or
// a language model's training tokens.
func (r *runner) examples() int {
	if r.job.Text != nil {
		return len(r.job.Text.Train)
	}
	if r.job.Train != nil {
		return r.job.Train.N
	}
	return 0
}

// build makes a fresh model of the run, from its seed; the device's
// generator, the run's random stream (dropout), goes on from where the
// initialisation left off.
func (r *runner) build() nn.Model {
	gen := tensor.NewGenerator(r.cfg.Seed)
	m, err := r.arch.BuildWith(r.dev, r.input, r.classes, gen)
	if err != nil {
		panic(err) // loaders checked the shapes
	}
	r.dev.Generator().SetState(gen.State())
	return m
}

// hostFits checks, before they are made, that n examples of per bytes each
// (a batch's host buffers, outside the pool) fit the host memory the Go
// heap may hold (memory.HostMemory, memory.HeapShare); what names them.
func hostFits(n, per int, what string) error {
	host := memory.HostShare()
	if b, ok := memory.Product(n, per); !ok || int64(b) > host {
		size := "more bytes than an int holds"
		if ok {
			size = memory.Bytes(b).String()
		}
		return fmt.Errorf("%s: its host buffers alone take %s, more than the %s this process may hold on this machine", what, size, memory.Bytes(host))
	}
	return nil
}

// loaders makes the training loader (shuffled, augmented where the model
// suits it, sharded across the job's ranks) and the test loader; for a
// language model, the loaders of random training windows and of the
// validation split's consecutive ones.
func (r *runner) loaders() error {
	if r.arch.Text {
		return r.textLoaders()
	}
	d := r.job.Train
	if r.cfg.Batch > d.N {
		return fmt.Errorf("batch %d: more than the %d training images (%s); want at most %d", r.cfg.Batch, d.N, d.Name, d.N)
	}
	r.cfg.Examples = d.N
	r.report.Config = r.cfg
	r.input, r.classes = []int{d.C, d.H, d.W}, d.Classes
	if len(d.ClassNames) == d.Classes {
		r.labels = d.ClassNames
	}
	mean, std := d.MeanStd()
	r.mean, r.std = mean, std
	lc := datasets.LoaderConfig{Batch: r.cfg.Batch, Shuffle: true, Seed: r.cfg.Seed, Mean: mean, Std: std}
	if r.job.Augment && r.arch.CNN {
		lc.CropPad, lc.Flip = 2, true
		if d.H >= 32 {
			lc.CropPad = 4
		}
	}
	tc := datasets.LoaderConfig{Batch: 500, Mean: mean, Std: std}
	if g := r.job.Group; g != nil {
		lc.Rank, lc.Ranks, lc.EvenShards = g.Rank(), g.Size(), true
		tc.Rank, tc.Ranks = g.Rank(), g.Size()
	}
	r.trainL = datasets.NewLoader(d, r.dev, lc)
	r.testL = datasets.NewLoader(r.job.Test, r.dev, tc)
	return nil
}

func (r *runner) textLoaders() error {
	c, cfg := r.job.Text, &r.cfg
	r.textDefaults()
	T := cfg.Context
	switch {
	case cfg.Tokenizer != c.Tokenizer.Name():
		return fmt.Errorf("corpus %s: tokenized by %s, and the configuration says %s", c.Name, c.Tokenizer.Name(), cfg.Tokenizer)
	case cfg.EvalEvery < 1:
		return fmt.Errorf("a language model's run needs the steps between evaluations (EvalEvery), not %d", cfg.EvalEvery)
	case cfg.Steps < cfg.EvalEvery || cfg.Steps%cfg.EvalEvery != 0:
		return fmt.Errorf("a language model's run of %d steps (Steps) evaluated every %d (EvalEvery): want a positive multiple of EvalEvery", cfg.Steps, cfg.EvalEvery)
	case T < 1 || cfg.Batch < 1:
		return fmt.Errorf("batch %d of context %d: want positive sizes", cfg.Batch, T)
	case len(c.Val) < T+1:
		return fmt.Errorf("corpus %s: %d validation tokens, fewer than one window of the context %d and its next token", c.Name, len(c.Val), T)
	}
	if err := hostFits(cfg.Batch, T*2*4, fmt.Sprintf("batch %d of %d-token windows", cfg.Batch, T)); err != nil { // the windows and their targets, int32s
		return err
	}
	r.input, r.classes = []int{T}, c.Tokenizer.Vocab()
	cfg.Examples = len(c.Train)
	r.report.Config = r.cfg
	tc := datasets.TextConfig{Batch: cfg.Batch, Context: T, Steps: cfg.EvalEvery, Seed: cfg.Seed}
	vc := datasets.TextConfig{Batch: cfg.Batch, Context: T, MaxBatches: cfg.EvalBatches}
	if g := r.job.Group; g != nil {
		tc.Rank, tc.Ranks = g.Rank(), g.Size()
		vc.Rank, vc.Ranks = g.Rank(), g.Size()
	}
	r.trainL = datasets.NewTextLoader(c.Train, r.dev, tc)
	r.testL = datasets.NewTextLoader(c.Val, r.dev, vc)
	return nil
}

// fitBudget chooses, under MaxMemory, the fastest configuration whose
// measured step fits; where none does, it searches again with the
// optimizer's state moved (stateElsewhere), while that can move.
func (r *runner) fitBudget() (err error) {
	if r.job.MaxMemory <= 0 {
		return nil
	}
	var choice train.BudgetChoice
	for {
		withFirstBatch(r.dev, r.trainL, func(x, y *tensor.Tensor) {
			err = r.interruptible(func() (err error) {
				choice, err = train.FitBudget(r.say, r.dev, r.build, r.cfg, train.BudgetVariants(r.arch.Blocks > 0, r.arch.Text, !r.dev.OnHost(), r.measuredAMP(), r.allowed), x, y,
					r.mode != train.Eager, r.job.MaxMemory, r.job.Stop)
				return err
			})
		})
		if !errors.Is(err, memory.ErrOutOfMemory) {
			break
		}
		moved, serr := r.stateElsewhere()
		if serr != nil {
			err = serr
			break
		}
		if !moved {
			break
		}
	}
	r.report.Budget = &choice
	if err != nil {
		return err
	}
	r.cfg.AMP, r.cfg.Checkpoint, r.cfg.Checkpointed, r.micro = choice.Chosen.AMP, choice.Chosen.Checkpoint, choice.Chosen.Checkpointed, choice.Chosen.MicroBatch
	r.cfg.OffloadActivations = r.cfg.OffloadActivations || choice.Chosen.OffloadActivations
	r.mode = r.cfg.Mode(r.dev)
	if r.cfg.Offloads(r.dev) && !r.job.KeepDeviceState && r.arch.Text {
		r.cfg.DeviceState = deviceStateInRoom(choice, r.job.MaxMemory, r.gptShape().ParamBytes(), r.cfg.Optimizer)
	}
	r.report.Config = r.cfg
	fmt.Fprintf(r.say, "chose %s: the pool is capped at %s\n", choice.Chosen.Name, memory.Bytes(r.job.MaxMemory))
	if r.cfg.DeviceState > 0 && !r.job.KeepDeviceState {
		fmt.Fprintf(r.say, "  the room the step leaves holds the offloaded optimizer's state of up to %.1f%% of the parameters' bytes: the first that fit in it keep theirs on the device (-device-state %.3f)\n",
			100*r.cfg.DeviceState, r.cfg.DeviceState)
	}
	if r.micro > 0 && r.cfg.MicroBatch == 0 { // the user's are said with the training's mode
		bn := "; batch norm normalises each micro-batch on its own"
		if r.arch.Text {
			bn = ""
		}
		fmt.Fprintf(r.say, "  with micro-batches of %d: each batch of %d accumulates their gradients before one update%s\n", r.micro, r.cfg.Batch, bn)
	}
	return nil
}

// deviceStateInRoom is the share of the parameters' paramBytes whose
// offloaded optimizer's state (of the named optimizer) fits on the device
// with their gradients, held whole, in the room that the chosen step of
// choice, measured on the whole batch, leaves under budget, each kept
// gradient with its share of train.BudgetHeadroom as the step's own bytes
// have (0 when it leaves none; at most 1).
func deviceStateInRoom(choice train.BudgetChoice, budget, paramBytes int64, optimizer string) float64 {
	m, ok := choice.Whole()
	room := m.Room(budget)
	if !ok || room <= 0 || paramBytes <= 0 {
		return 0
	}
	perByte := 1 + train.BudgetHeadroom + float64(optim.StateBytes(optimizer, 1))/4 // a kept F32 byte: its gradient's, its headroom, its state's
	return min(1, float64(room)/perByte/float64(paramBytes))
}

// interruptible runs f, a stage's measured steps, so that on a device
// whose steps run eagerly (the CPU) a closed Job.Stop ends it within one
// operation rather than after steps that can take minutes; the error then
// says the run was interrupted, nothing saved.
func (r *runner) interruptible(f func() error) error {
	if r.job.Stop == nil || r.mode != train.Eager {
		return f()
	}
	err := r.stoppable(f)
	if errors.Is(err, tensor.ErrInterrupted) {
		return &train.InterruptedError{Epoch: r.startEpoch}
	}
	return err
}

// stoppable runs f under tensor.Interruptible with Job.Stop, its panics
// returned as errors: one that wraps tensor.ErrInterrupted once Stop is
// closed.
func (r *runner) stoppable(f func() error) error {
	var err error
	if cerr := tensor.Catch(func() { r.dev.Interruptible(r.job.Stop, func() { err = f() }) }); cerr != nil {
		err = cerr
	}
	return err
}

// measuredAMP is what the measured and budget configurations' AMP
// autocasts to.
func (r *runner) measuredAMP() train.AMP {
	if r.cfg.BF16Weights { // which train under BF16 AMP only
		return train.AMPBF16
	}
	if r.job.MeasuredAMP.On() {
		return r.job.MeasuredAMP
	}
	return r.cfg.AMP
}

// allowed says whether the budget may choose v: the user's Job.Allow; for
// BF16 working weights only the AMP configurations; with the update in the
// backward no F16 AMP.
func (r *runner) allowed(v train.Variant) bool {
	return (r.job.Allow == nil || r.job.Allow(v)) && (!r.cfg.BF16Weights || v.AMP.On()) &&
		(!r.cfg.FuseOptimizer || v.AMP != train.AMPF16) // F16's loss scaling cannot update in the backward
}

// timedSteps is how many planned or captured steps of each configuration
// measure times (an eager run's is the measured step's).
const timedSteps = 3

// measure runs one step of each memory configuration and reports their peaks
// (for BF16 working weights, the AMP ones), and the run's own where it
// checkpoints some of the blocks.
func (r *runner) measure() (err error) {
	if !r.job.Measure {
		return nil
	}
	timed := "the measured step's, eager"
	if r.mode != train.Eager {
		timed = fmt.Sprintf("the median of %d %s steps", timedSteps, r.mode)
	}
	fmt.Fprintf(r.say, "memory of one training step of %s on a batch of %d, measured by the pool, and its time (%s):\n", r.cfg.Model, r.cfg.Batch, timed)
	vs := train.Variants(r.job.CheckpointMode, r.measuredAMP())
	chosen := train.VariantName(r.cfg.AMP, r.cfg.Checkpoint)
	if own := (train.Variant{Name: chosen, AMP: r.cfg.AMP, Checkpoint: r.cfg.Checkpoint, Checkpointed: r.cfg.Checkpointed}); own.Checkpointed > 0 ||
		!slices.ContainsFunc(vs, func(v train.Variant) bool { return v.Name == chosen }) { // some blocks, or light ones the budget chose
		vs = append(vs, own)
	}
	withFirstBatch(r.dev, r.trainL, func(x, y *tensor.Tensor) {
		for _, v := range vs {
			if (r.arch.Blocks == 0 && v.Checkpoint != nn.NoCheckpoint) || (r.cfg.BF16Weights && !v.AMP.On()) {
				continue
			}
			if r.stopped() { // between measurements: nothing to save yet
				err = &train.InterruptedError{Epoch: r.startEpoch}
				return
			}
			var m train.Measurement
			if err = r.interruptible(func() (err error) {
				if m, err = train.MeasureStep(r.dev, r.build, r.cfg, v, x, y, r.mode != train.Eager); err != nil || r.mode == train.Eager {
					return err
				}
				m.StepSeconds, err = train.TimeStep(r.dev, r.build, r.cfg, v, x, y, timedSteps)
				if errors.Is(err, memory.ErrOutOfMemory) { // measured eager, but no room for the run's arena beside it: untimed
					m.StepSeconds, err = 0, nil
				}
				return err
			}); err != nil {
				return
			}
			if v.Checkpointed > 0 {
				m.Name = train.SomeCheckpointedName(v.AMP, v.Checkpoint, v.Checkpointed, len(m.Shares))
				chosen = m.Name
			}
			r.report.Measured = append(r.report.Measured, m)
		}
	})
	if err != nil {
		return err
	}
	WriteSavings(r.say, r.report.Measured, chosen)
	for _, m := range r.report.Measured {
		if m.Name == chosen {
			WriteHoldings(r.say, m)
		}
	}
	return nil
}

// trainer builds the model and its trainer, joins the job's group and
// resumes from the checkpoint, if any.
func (r *runner) trainer() (err error) {
	r.model = r.build()
	if r.t, err = train.New(r.model, r.dev, r.cfg, r.trainL.Len()); err != nil {
		return err
	}
	if r.micro > 0 { // the budget's choice; train.New applied Config.MicroBatch
		if err := r.t.Step.SetMicroBatch(r.micro); err != nil {
			return err
		}
	}
	if g := r.job.Group; g != nil {
		if err := r.t.SetGroup(g, r.job.ShardOptimizer); err != nil {
			return err
		}
		red := r.t.Step.Reducer()
		d, err := g.TimeAllReduce(red.Bytes(), 20)
		if err != nil {
			return err
		}
		r.report.DataParallel = &DataParallel{Ranks: g.Size(), Collectives: g.Backend(), Buckets: red.Buckets(),
			BucketBytes: red.Bytes(), AllReduceSeconds: d.Seconds()}
		fmt.Fprintf(r.say, "data parallel: %d ranks over %s, batch %d per rank (%d in all); the gradients take %s (%s), all-reduced in %.3f ms\n",
			g.Size(), g.Backend(), r.cfg.Batch, r.cfg.Batch*g.Size(), buckets(red.Buckets()), memory.Bytes(red.Bytes()), 1e3*d.Seconds())
	}
	r.t.Stop, r.t.Inputs = r.job.Stop, &train.Inputs{Shape: r.input, Classes: r.classes, Mean: r.mean, Std: r.std, Labels: r.labels}
	if r.arch.Text {
		r.t.Inputs.Tokenizer = r.cfg.Tokenizer
	}
	if r.job.Resume != "" {
		info, err := r.t.Resume(r.job.Resume, r.job.ResumeForce)
		if err != nil {
			return err
		}
		r.report.ResumeChanges, r.report.Unverified = info.Changed, info.Unverified
		at := fmt.Sprintf("epoch %d", r.t.Epoch+1)
		if r.arch.Text {
			at = fmt.Sprintf("step %d", r.t.Steps+1)
		} else if p := info.Position; p != nil {
			at += fmt.Sprintf(", batch %d of %d", p.Batch+1, r.trainL.Len())
		}
		fmt.Fprintf(r.say, "resumed from %s at %s\n", r.job.Resume, at)
		if info.Unverified {
			fmt.Fprintf(r.say, "  warning: %s carries no checksums (it was written by an older leangrad): its bytes could not be checked\n", r.job.Resume)
		}
		for _, c := range info.Changed {
			fmt.Fprintf(r.say, "  changed since the checkpoint (-resume-force): %s\n", c)
		}
	}
	r.resumed = len(r.t.History)
	return nil
}

// release frees the model and the trainer, once the run is over.
func (r *runner) release() {
	if r.t != nil {
		r.t.Release()
	}
	if r.model != nil {
		nn.Release(r.model)
	}
}

// fit trains, with the pool's peaks reset and the recordings on.
func (r *runner) fit() error {
	a := r.dev.Allocator()
	a.EmptyCache() // what the measurements cached is not the run's
	a.ResetPeak()  // the summary's peaks are the training run's, not the measurements'
	if r.job.MaxMemory > 0 {
		old := a.Limit()
		if err := a.SetLimit(r.job.MaxMemory); err != nil {
			return err
		}
		defer a.SetLimit(old) // the cap is this run's, not the device's: a later run or a server shares it
	}
	a.RecordTimeline(r.job.RecordTimeline)
	if r.job.RecordHistory {
		a.RecordHistory(true)
	}
	chosen := r.variant()
	mode := r.t.Step.Mode.String() + " steps"
	switch {
	case r.t.Step.HostUpdateInBackward && r.cfg.ClipNorm > 0:
		mode += ", updated on the host after the backward (-fuse-optimizer: clipping needs the gradients' norm first)"
	case r.t.Step.HostUpdateInBackward:
		mode += ", each parameter updated on the host as its gradient arrives, beside the backward (-fuse-optimizer)"
	case r.cfg.FuseOptimizer && r.micro > 0:
		mode += ", updated after the budget's micro-batches (-fuse-optimizer updates in the backward of a whole batch only)"
	case r.cfg.FuseOptimizer && r.cfg.ClipNorm > 0:
		mode += ", each parameter updated in the backward (-fuse-optimizer) of a second forward and backward, the first for the gradients' norm (-clip)"
	case r.cfg.FuseOptimizer:
		mode += ", each parameter updated in the backward (-fuse-optimizer)"
	}
	if r.cfg.MicroBatched() { // the budget's choice is said where it is made
		mode += fmt.Sprintf(", micro-batches of %d (-micro-batch)", r.cfg.MicroBatch)
		if r.cfg.Offloads(r.dev) {
			mode += ", their gradients summed in F32 in host memory"
		}
	}
	if r.arch.Text {
		fmt.Fprintf(r.say, "training %s (%s parameters) on %s's %s tokens, %d steps of %d windows of %d tokens (evaluated every %d), %s, %s\n",
			r.cfg.Model, count(nn.CountParams(r.model)), r.job.Text.Name, count(len(r.job.Text.Train)), r.cfg.Steps,
			r.cfg.Batch, r.cfg.Context, r.cfg.EvalEvery, chosen, mode)
	} else {
		layout := ""
		if c, ok := r.model.(nn.ChannelsLaster); ok && c.ChannelsLast() {
			layout = ", channels last"
		}
		fmt.Fprintf(r.say, "training %s (%s parameters) on %s images, %s of %s, %s%s, %s\n",
			r.cfg.Model, count(nn.CountParams(r.model)), count(r.job.Train.N), plural(r.cfg.Epochs, "epoch"), plural(r.trainL.Len(), "step"), chosen, layout, mode)
	}
	r.report.Title = fmt.Sprintf("%s, %s, batch %d on %s", r.cfg.Model, chosen, r.cfg.Batch, r.dev.Name())
	if g := r.job.Group; g != nil {
		r.report.Title = fmt.Sprintf("%s, %s, batch %d per rank on %d ranks", r.cfg.Model, chosen, r.cfg.Batch, g.Size())
	}
	start := time.Now()
	err := r.t.Fit(r.trainL, r.testL, r.job.Progress, r.job.Save)
	r.wall = time.Since(start)
	a.RecordTimeline(false)
	r.report.Epochs, r.report.Empty, r.report.OOM, r.report.Memory = r.t.History, r.t.Empty, r.t.OOM, r.t.Memory
	for _, e := range r.t.OOM.Events {
		fmt.Fprintf(r.say, "out of memory: %s\n", e)
	}
	return err
}

// summarize makes the figures of this run's epochs (a resumed run's
// earlier ones ran before) and the end-of-run lines, which need the
// trainer: they are written while it is alive and printed by WriteSummary.
func (r *runner) summarize() error {
	t, cfg, a := r.t, r.cfg, r.dev.Allocator()
	var imgs, preds, secs float64
	for _, m := range t.History[r.resumed:] {
		secs += m.Seconds
		imgs += m.ImgPerSec * m.Seconds
		preds += m.PredictionsPerSec * m.Seconds
	}
	last := t.History[len(t.History)-1]
	peakA, peakR := t.Peaks()
	r.report.Final = &Final{TestAcc: last.TestAcc, TestLoss: last.TestLoss, ImgPerSec: train.Float(imgs / secs), TrainSeconds: secs,
		WallSeconds: r.wall.Seconds(), PeakAllocated: peakA, PeakReserved: peakR, EvalPeakAllocated: t.EvalPeak()}

	var lines []string
	add := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	if r.arch.Text {
		r.report.Final.TokensPerSec = train.Float(preds / secs)
		add("\nvalidation     loss %.4f (perplexity %.1f, next token right %.2f%%) after %d steps; training loss %.4f over the last %d",
			last.TestLoss, math.Exp(float64(last.TestLoss)), 100*last.TestAcc, t.Steps, last.TrainLoss, cfg.EvalEvery)
		if secs > 0 {
			flops := ""
			if g, ok := r.model.(*nn.GPT); ok {
				flops = fmt.Sprintf(" (%.1f TFLOP/s of the model's: 6N + 12·L·C·T a token)", preds/secs*g.Cfg.TokenFLOPs(int64(nn.CountParams(g)))/1e12)
			}
			add("throughput     %.0f tokens/s%s over this run's training steps (%.1f s), %.1f s in all with evaluation", preds/secs, flops, secs, r.wall.Seconds())
		}
	} else {
		add("\ntest accuracy  %.2f%% (loss %.4f) after %s", 100*last.TestAcc, last.TestLoss, plural(len(t.History), "epoch"))
		if secs > 0 {
			add("throughput     %.0f img/s over this run's training steps (%.1f s), %.1f s in all with evaluation", imgs/secs, secs, r.wall.Seconds())
		}
	}
	chosen := train.VariantName(cfg.AMP, cfg.Checkpoint)
	line := "peak allocated " + memory.Bytes(peakA).String() + " by the training steps"
	for _, m := range r.report.Measured {
		if m.Name == "fp32" && chosen != "fp32" {
			line += fmt.Sprintf(" (fp32: %s, %s)", memory.Bytes(m.PeakAllocated), Percent(peakA, m.PeakAllocated))
			if cfg.AMP.On() && peakA > m.PeakAllocated {
				line += fmt.Sprintf(": AMP holds a 16-bit copy of the weights (%s) beside the F32 ones, more than it saves on this batch's activations",
					memory.Bytes(2*int64(nn.CountParams(r.model))))
			}
		}
	}
	add("%s", line)
	add("peak reserved  %s by the training steps", memory.Bytes(peakR))
	if o, ok := t.Opt.(*optim.Offloaded); ok {
		f := r.report.Final
		f.HostOptimizerBytes, f.HostStepSeconds, f.HostGradsOverlapped, f.HostOptimizerPinnedBytes = o.HostBytes(), o.MeanStep().Seconds(), o.Overlapped(), o.PinnedBytes()
		f.HostUpdatedInBackward = o.UpdatedInBackward()
		onDevice := "the device held none of it"
		if f.DeviceOptimizerBytes = t.Step.OptimizerStateBytes(); f.DeviceOptimizerBytes > 0 {
			onDevice = fmt.Sprintf("the device held %s of the state, its first parameters' (-device-state %g)", memory.Bytes(f.DeviceOptimizerBytes), cfg.DeviceState)
		}
		add("host memory    %s (%s page-locked, %s pageable) for the offloaded optimizer (F32 copies of the parameters and gradients, %s's state): %s; %.0f%% of the gradients' bytes began to come down during the backward, and %.0f%% of the parameters were updated there; the rest of the update took %.3f s a step after the first (the update on %d cores, parameters up; the first, which allocates the host's memory and page-locks its part, %.3f s)",
			memory.Bytes(f.HostOptimizerBytes), memory.Bytes(f.HostOptimizerPinnedBytes), memory.Bytes(f.HostOptimizerBytes-f.HostOptimizerPinnedBytes), cfg.Optimizer, onDevice,
			100*f.HostGradsOverlapped, 100*f.HostUpdatedInBackward, f.HostStepSeconds, runtime.GOMAXPROCS(0), o.FirstStep().Seconds())
	}
	if o := t.Step.Offloader; o != nil {
		r.report.Final.HostActivationBytes, r.report.Final.HostActivationHeldBytes = o.Bytes(), o.HostBytes()
		add("host memory    %s (page-locked) for what the checkpointed blocks keep, at most, a forward: the device held none of it but while each block recomputed (%s held for the copies, those of the sets that stay on the device too)",
			memory.Bytes(o.Bytes()), memory.Bytes(o.HostBytes()))
	}
	if g, dp := r.job.Group, r.report.DataParallel; g != nil {
		all, err := g.Gather([]float64{float64(peakA), float64(peakR), float64(t.EvalPeak()), float64(t.Step.OptimizerStateBytes())})
		if err != nil {
			return err
		}
		dp.Overlapped, dp.NotOverlapped = t.Step.Reducer().Overlap()
		how := "overlapping the backward"
		if !dp.Overlapped {
			how = "after the backward: " + dp.NotOverlapped
		}
		add("data parallel  %d ranks over %s: the gradients' %s (%s) take %.3f ms to all-reduce, %s",
			dp.Ranks, dp.Collectives, buckets(dp.Buckets), memory.Bytes(dp.BucketBytes), 1e3*dp.AllReduceSeconds, how)
		state := "whole on every rank"
		if dp.Sharded = r.job.ShardOptimizer; dp.Sharded {
			state = fmt.Sprintf("sharded over the %d ranks", dp.Ranks)
		}
		for rank, v := range all {
			p := RankPeak{Rank: rank, PeakAllocated: int64(v[0]), PeakReserved: int64(v[1]), EvalPeakAllocated: int64(v[2]), OptimizerStateBytes: int64(v[3])}
			dp.PerRank = append(dp.PerRank, p)
			add("  rank %d       peak allocated %s, reserved %s by the training steps; evaluation %s; optimizer state %s (%s)",
				rank, memory.Bytes(p.PeakAllocated), memory.Bytes(p.PeakReserved), memory.Bytes(p.EvalPeakAllocated), memory.Bytes(p.OptimizerStateBytes), state)
		}
	}
	_, evalShape, _ := r.testL.Inputs()
	evalBatch := fmt.Sprintf("%d batches of %d", r.testL.Len(), evalShape[0])
	if c := t.EvalChunk(); c > 0 {
		evalBatch += fmt.Sprintf(", run %d examples at a time since the device ran out of memory", c)
	}
	add("evaluation     peak allocated %s (%s; no gradients)", memory.Bytes(t.EvalPeak()), evalBatch)
	if p := t.Step.Plan(r.trainL.Inputs()); p != nil {
		add("planned step   this step needs an arena of %s (%s live at its peak; placed by %s order), on top of the parameters and optimiser state",
			memory.Bytes(p.Size), memory.Bytes(p.Live), p.Order)
	}
	for _, n := range t.Step.Notes() {
		add("step           %s", n)
	}
	if free, total := r.dev.MemInfo(); !r.dev.OnHost() {
		add("device memory  %s free of %s (the driver's view)", memory.Bytes(free), memory.Bytes(total))
	}
	if cfg.EmptyCacheEvery > 0 {
		add("EmptyCache every %d steps: %d calls, %s returned to the device in all, %.3f s inside EmptyCache",
			cfg.EmptyCacheEvery, t.Empty.Calls, memory.Bytes(t.Empty.Released), t.Empty.Seconds)
	}
	add("the pool's summary below covers training and evaluation since the measurements:")
	summary := a.Summary()
	r.report.summary = func(w io.Writer) {
		for _, l := range lines {
			fmt.Fprintln(w, l)
		}
		fmt.Fprint(w, summary)
	}
	return nil
}

// buckets is "1 bucket" or "n buckets".
func buckets(n int) string {
	if n == 1 {
		return "1 bucket"
	}
	return fmt.Sprintf("%d buckets", n)
}

// sample generates Job.Sample tokens with a language model.
func (r *runner) sample() error {
	if r.job.Sample <= 0 || !r.arch.Text {
		return nil
	}
	g, ok := r.model.(interface {
		Generate(dev *tensor.Device, prompt []int32, n int, s nn.Sampling) ([]int32, error)
	})
	if !ok {
		return fmt.Errorf("model %s does not generate text", r.cfg.Model)
	}
	tok := r.job.Text.Tokenizer
	prompt := tok.Encode(r.job.Prompt)
	if r.job.Prompt == "" {
		prompt = r.job.Text.Val[:min(len(r.job.Text.Val), 16, r.cfg.Context/2)]
	}
	var out []int32
	err := r.stoppable(func() (err error) {
		out, err = g.Generate(r.dev, prompt, r.job.Sample, r.job.Sampling)
		return err
	})
	if errors.Is(err, tensor.ErrInterrupted) {
		return fmt.Errorf("sampling stopped after the training had finished (its checkpoint, with -save, and its reports are written): %w", train.ErrInterrupted)
	}
	if err != nil {
		return fmt.Errorf("sampling: %w", err)
	}
	r.report.Sample = &Sample{Prompt: tok.Decode(prompt), Text: tok.Decode(out), Tokens: len(out),
		Temperature: r.job.Sampling.Temperature, TopK: r.job.Sampling.TopK}
	return nil
}

// variant names the run's configuration, with AMP's dtype and the blocks
// checkpointed when not all are: "amp (bf16)+checkpoint of the first 3 blocks".
func (r *runner) variant() string {
	name := train.VariantName(r.cfg.AMP, r.cfg.Checkpoint)
	if r.cfg.AMP.On() {
		name = strings.Replace(name, "amp", "amp ("+r.cfg.AMP.String()+")", 1)
	}
	if k := r.cfg.Checkpointed; k > 0 {
		name += fmt.Sprintf(" of the first %d blocks", k)
	}
	return name
}

// count is n with its thousands apart: "1,234,567".
func count(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// withFirstBatch calls f with the loader's first batch, made on dev.
func withFirstBatch(dev *tensor.Device, l datasets.Batches, f func(x, y *tensor.Tensor)) {
	dev.WithScope(func() {
		ep := l.Epoch(0)
		x, y, _ := ep.Next()
		ep.Close()
		f(x, y)
	})
}

// finish records the pool's statistics and the error, if any, in the
// report: it is valid JSON in every case.
func (rep *Report) finish(dev *tensor.Device, err error) {
	rep.Stats = dev.Allocator().Stats()
	if err != nil {
		rep.Error = err.Error()
		var d *train.DivergedError
		if errors.As(err, &d) {
			rep.Diverged = &Diverged{Epoch: d.Epoch + 1, Step: d.Step, Why: d.Why}
		}
		var ie *train.InterruptedError
		if errors.As(err, &ie) {
			rep.Interrupted = &Interrupted{Epoch: ie.Epoch + 1, Batch: ie.Batch, Step: ie.Step, Saved: ie.Saved}
		}
	}
}
