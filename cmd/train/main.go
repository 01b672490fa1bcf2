// Command train trains a model (ResNet-20 on Fashion-MNIST by default) on
// the GPU when there is one and on the CPU otherwise, with a progress bar,
// and ends with test accuracy, throughput and a memory report whose savings
// are measured by the allocator: before training, one step of the same
// model and batch runs in each of fp32, AMP, checkpointing and both.
//
//	train -model resnet -amp -checkpoint
//	train -model gpt -amp -amp-dtype bf16 -sample 100   # a GPT on the Brown corpus
//	train -model gpt2 -data mytexts/ -context 512 -steps 5000
//	train -model resnet -depth 56 -epochs 30 -device cuda:0 -json run.json -memplot mem.png
//	train -model mlp -dataset synthetic -device cpu
//	train -model resnet -max-memory 200MiB -memsnapshot mem.pickle
//	train -nproc 2 -amp -batch 256        # data parallel over two GPUs (-batch per rank)
//	torchrun --no-python --nproc-per-node 2 train -amp
//
// Every flag is checked, and every output path tried against the run's
// inputs and the other outputs, before anything is loaded: all problems
// are reported together, exit status 64. A run that cannot start (the
// device, the data, the checkpoint) exits 4, one that fails 1, one that
// diverges 3, and one that SIGINT or SIGTERM stops, after saving where it
// got to, 130 or 143; in every case -json is written (valid JSON, saying
// why; with bad flags, unless its own path was refused) and the last good
// -save checkpoint is left as it was.
//
// Data-parallel jobs: a process is one rank when WORLD_SIZE is set (as
// torchrun sets it; see dist.ConfigFromEnv); -nproc N starts N ranks on
// this machine itself. Rank 0 prints, saves and writes the reports.
//
// Run train -h for every flag.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/leangrad/leangrad/cmd/internal/cmdenv"
	"github.com/leangrad/leangrad/cmd/internal/iopaths"
	"github.com/leangrad/leangrad/cmd/internal/launch"
	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/dist"
	"github.com/leangrad/leangrad/fileio"
	"github.com/leangrad/leangrad/kernels/cuda"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/optim"
	"github.com/leangrad/leangrad/run"
	"github.com/leangrad/leangrad/tensor"
	"github.com/leangrad/leangrad/train"
)

func main() {
	cmdenv.Setup()
	os.Exit(cmdenv.Main("train", func() int { return command(os.Args[1:], os.Stdout, os.Stderr) }))
}

// options are the command's flags.
type options struct {
	model                                  train.ModelName
	device                                 tensor.DeviceSpec
	dataset                                datasets.DatasetName
	data                                   string
	depth, epochs, batch, limit, testLimit int
	lr, momentum, wd, warmup               float64
	optimizer                              optim.OptimizerName
	schedule                               optim.ScheduleName
	ckptMode                               nn.CheckpointMode
	ckptFirst                              int
	amp, ckpt, download, augment, measure  bool
	ampDType                               train.AMP
	capture, tf32, offload, fuse, acts     bool
	hostThreads                            int
	deviceState                            float64
	micro                                  int
	bf16Weights                            bool
	matmulF32                              tensor.F32Matmul
	emptyCache                             int
	seed                                   uint64
	jsonOut, memlog, save, resume          string
	memplot                                run.PlotFile
	memsnapshot, convWorkspace             string
	maxMemory                              memory.Budget
	resumeForce                            bool
	tokenizer, prompt                      string
	context, steps, evalEvery, evalBatches int
	warmupSteps, sample, topK              int
	clip, temperature                      float64
	nproc                                  int
	shardOptimizer                         bool
	distTimeout                            time.Duration
	set                                    map[string]bool // flags given on the command line
	stdout                                 io.Writer       // the command's standard output, where -json - goes
	text                                   bool            // the model is a language model
}

// The image classifiers' default batch and the learning rate it goes with.
const (
	defaultBatch = 128
	defaultLR    = 0.1
)

// textFlags are the flags of language models only.
var textFlags = []string{"tokenizer", "context", "steps", "eval-every", "eval-batches", "warmup-steps", "sample", "prompt", "temperature", "top-k"}

// imageFlags are the flags of image classifiers only.
var imageFlags = []string{"dataset", "epochs", "limit", "test-limit", "warmup", "depth", "augment"}

// checkText checks the flags that differ between language models and image
// classifiers.
func (o *options) checkText(arch train.Arch, bad func(string, ...any)) {
	other, what := textFlags, "classifies images"
	if arch.Text {
		other, what = imageFlags, "is a language model"
	}
	for _, f := range other {
		if o.set[f] {
			bad("-%s: -model %s %s, which -%s is not for", f, modelName(o), what, f)
		}
	}
	if !arch.Text {
		return
	}
	if _, err := datasets.NewTokenizer(o.tokenizer); err != nil {
		bad("-%v", err)
	}
	for _, v := range []struct {
		name string
		v    int
		zero string // what 0 means
	}{
		{"context", o.context, "the preset's"}, {"steps", o.steps, "the preset's"}, {"eval-every", o.evalEvery, "the preset's"},
		{"eval-batches", o.evalBatches, "the preset's"}, {"warmup-steps", o.warmupSteps, "the preset's"}, {"sample", o.sample, "none"},
		{"top-k", o.topK, "every token"},
	} {
		if v.v < 0 {
			bad("-%s %d: want 0 (%s) or more", v.name, v.v, v.zero)
		}
	}
	if !(o.temperature >= 0) || math.IsInf(o.temperature, 0) {
		bad("-temperature %v: want 0 (greedy) or more", o.temperature)
	}
	a, _ := train.LookupArch(o.trainedModel())
	r := o.recipe(a)
	if r.Steps%r.EvalEvery != 0 {
		bad("-steps %d: want a multiple of -eval-every %d (each ends in a validation)", r.Steps, r.EvalEvery)
	}
	if o.sample > nn.MaxGenerate {
		bad("-sample %d: want at most %d tokens", o.sample, nn.MaxGenerate)
	}
}

// trainedModel is the model the run trains: -model's, or on a CPU the
// one run.CPUModel says for it.
func (o *options) trainedModel() string {
	if gpu, _ := o.device.CUDA(); !gpu {
		m, _ := run.CPUModel(modelName(o))
		return m
	}
	return modelName(o)
}

// recipe is a language model's recipe with the flags given instead of its
// defaults.
func (o *options) recipe(a train.Arch) train.Recipe {
	r := *a.Recipe
	for _, f := range []struct {
		flag string
		v    *int
		to   int
	}{
		{"batch", &r.Batch, o.batch}, {"steps", &r.Steps, o.steps}, {"eval-every", &r.EvalEvery, o.evalEvery},
		{"eval-batches", &r.EvalBatches, o.evalBatches}, {"warmup-steps", &r.WarmupSteps, o.warmupSteps},
	} {
		if o.set[f.flag] && (f.to > 0 || f.flag == "eval-batches" || f.flag == "warmup-steps") {
			*f.v = f.to
		}
	}
	if o.set["steps"] && !o.set["eval-every"] && r.Steps%r.EvalEvery != 0 {
		r.EvalEvery = largestDivisor(r.Steps, r.EvalEvery) // the preset's period, cut to fit -steps
	}
	if o.set["lr"] {
		r.LR = o.lr
	}
	if o.set["wd"] {
		r.WeightDecay = o.wd
	}
	if o.set["optimizer"] {
		r.Optimizer = string(o.optimizer)
	}
	if o.set["clip"] {
		r.ClipNorm = max(o.clip, 0)
	} else if o.fuse {
		r.ClipNorm = 0 // a clipped fused step runs its forward and backward twice: asked for only
	}
	return r
}

func parse(args []string, stderr io.Writer) (*options, error) {
	o := &options{model: "resnet", device: "auto", dataset: datasets.FashionMNIST, optimizer: "sgd", schedule: "cosine"}
	fs := flag.NewFlagSet("train", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: train [flags]\n\nTrains a model and reports accuracy, throughput and memory, with the savings of -amp and\n-checkpoint measured by the allocator. Defaults: ResNet-20 on Fashion-MNIST, on the GPU if there is one.\n%s\n%s\nFlags:\n", run.CPUPolicy, cmdenv.ExitStatuses("after saving where it got to", map[int]string{cmdenv.ExitFailed: "", cmdenv.ExitDiverged: "", cmdenv.ExitNothingRan: ""}))
		fs.PrintDefaults()
	}
	fs.Var(&o.model, "model", "model: "+train.ModelNames+" (resnet: see -depth)")
	fs.IntVar(&o.depth, "depth", 20, "ResNet depth, 6n+2 (20, 32, 44, 56, 110, 1202)")
	fs.Var(&o.device, "device", "device: "+tensor.DeviceSpecs)
	fs.Var(&o.dataset, "dataset", "dataset: "+datasets.DatasetNames)
	fs.StringVar(&o.data, "data", "", "folder holding the dataset's files (searched first); for a GPT, a text file or a folder of them (default: the Brown corpus)")
	fs.BoolVar(&o.download, "download", false, "download Fashion-MNIST (checksums verified) if it is not found")
	fs.IntVar(&o.epochs, "epochs", 15, "epochs")
	fs.IntVar(&o.batch, "batch", defaultBatch, "batch size (per rank in a data-parallel job)")
	fs.Float64Var(&o.lr, "lr", defaultLR, "peak learning rate, at -batch 128: with another -batch and no -lr, scaled linearly (0.05 at 64)")
	fs.Float64Var(&o.momentum, "momentum", 0.9, "SGD momentum (Nesterov)")
	fs.Float64Var(&o.wd, "wd", 5e-4, "weight decay")
	fs.Var(&o.optimizer, "optimizer", "optimizer: "+optim.Choices(optim.OptimizerNames))
	fs.Var(&o.schedule, "schedule", "learning-rate schedule: "+optim.Choices(optim.ScheduleNames)+" (cosine warms up first)")
	fs.Float64Var(&o.warmup, "warmup", 1, "warmup epochs of the cosine schedule (at most a tenth of the run)")
	fs.Uint64Var(&o.seed, "seed", 1, "random seed (initialisation, shuffling, augmentation, dropout)")
	fs.IntVar(&o.limit, "limit", 0, "train on the first N images only (0: all; on a CPU the default is 2000)")
	fs.IntVar(&o.testLimit, "test-limit", 0, "evaluate on the first N test images only (0: all; on a CPU the default is 1000)")
	fs.BoolVar(&o.amp, "amp", false, "mixed precision: F16 convolutions and matmuls, F32 master weights, loss scaling (see -amp-dtype)")
	o.ampDType = train.AMPF16
	fs.TextVar(&o.ampDType, "amp-dtype", o.ampDType, "what -amp computes in: "+train.AMPDTypes)
	fs.StringVar(&o.tokenizer, "tokenizer", datasets.GPT2Tokens, "GPTs: "+datasets.TokenizerNames)
	preset := func(f func(train.Arch) int) string {
		return "(0: the preset's: " + train.PresetDefaults(func(a train.Arch) string {
			if n := f(a); n > 0 {
				return fmt.Sprint(n)
			}
			return "all"
		}) + ")"
	}
	fs.IntVar(&o.context, "context", 0, "GPTs: tokens a window "+preset(func(a train.Arch) int { return a.Input[0] }))
	fs.IntVar(&o.steps, "steps", 0, "GPTs: training steps "+preset(func(a train.Arch) int { return a.Recipe.Steps }))
	fs.IntVar(&o.evalEvery, "eval-every", 0, "GPTs: steps between validations "+preset(func(a train.Arch) int { return a.Recipe.EvalEvery })+
		"; with -steps alone, the largest divisor of -steps up to it")
	fs.IntVar(&o.evalBatches, "eval-batches", 0, "GPTs: batches of the validation split each validation reads "+preset(func(a train.Arch) int { return a.Recipe.EvalBatches }))
	fs.IntVar(&o.warmupSteps, "warmup-steps", 0, "GPTs: warmup steps of the cosine schedule "+preset(func(a train.Arch) int { return a.Recipe.WarmupSteps }))
	fs.Float64Var(&o.clip, "clip", 0, "clip the gradients' global norm to this before each update (GPTs' default: 1; negative: never)")
	fs.IntVar(&o.sample, "sample", 0, "GPTs: print N tokens the trained model generates at the end")
	fs.StringVar(&o.prompt, "prompt", "", "GPTs: the text -sample continues (default: the validation split's first tokens)")
	fs.Float64Var(&o.temperature, "temperature", 0.8, "GPTs: -sample's temperature (0: the most likely token each time)")
	fs.IntVar(&o.topK, "top-k", 40, "GPTs: -sample draws from the K most likely tokens (0: all)")
	fs.BoolVar(&o.ckpt, "checkpoint", false, "checkpoint the residual blocks: recompute them in the backward instead of keeping their activations")
	fs.TextVar(&o.ckptMode, "checkpoint-mode", nn.CheckpointBlocks, "what -checkpoint checkpoints: "+nn.CheckpointModes+" (blocks: every block; light: every block of a GPT, keeping its products' results; sqrt: sqrt(n) segments)")
	fs.IntVar(&o.ckptFirst, "checkpoint-blocks", 0, "with -checkpoint: checkpoint only the first N blocks, the others keeping their activations (less recomputation, more memory; 0: every block; -max-memory chooses N itself)")
	fs.BoolVar(&o.augment, "augment", true, "random crops (padding 2, 4 on CIFAR) and horizontal flips for ResNets")
	fs.BoolVar(&o.measure, "measure", true, "measure one step of fp32, amp, checkpoint and amp+checkpoint before training (and the run's own where it is none of those: -checkpoint-blocks, or what -max-memory chose)")
	fs.IntVar(&o.emptyCache, "empty-cache", 0, "call EmptyCache every N steps (0: never) and report what it cost")
	fs.StringVar(&o.jsonOut, "json", "", "write metrics as JSON to this file (-: to standard output, and what the run says to standard error)")
	fs.StringVar(&o.memlog, "memlog", "", "write the allocator's timeline of every alloc and free as CSV to this file")
	fs.Var(&o.memplot, "memplot", "plot allocated and reserved memory over the run to this file (."+strings.Join(run.PlotFormats, ", .")+")")
	fs.StringVar(&o.save, "save", "", "write a training checkpoint to this file after every epoch (atomically)")
	fs.StringVar(&o.resume, "resume", "", "resume from a training checkpoint written by -save (its model, optimiser, AMP, checkpointing, batch, dataset and schedule must be this run's)")
	fs.BoolVar(&o.resumeForce, "resume-force", false, "resume even where the checkpoint's configuration differs from this run's (the report lists what changed)")
	fs.Var(&o.maxMemory, "max-memory", "memory budget: cap the pool at SIZE (200MiB, 2GiB) or a fraction of the device (0.5), and pick the fastest of fp32, AMP, checkpointing, both, sqrt segments, offloaded activations (on a GPU) and micro-batches whose measured step fits; a language model whose AdamW state cannot fit beside its parameters, or no step beside them, holds its moments in 8 bits where that fits (-optimizer adamw8bit), else keeps the state in host memory (-offload-optimizer; the first parameters' on the device as far as the chosen step leaves room, -device-state), updated beside the backward where clipping is off (-fuse-optimizer); -amp, -checkpoint, -optimizer, -offload-optimizer, -fuse-optimizer and -micro-batch given on the command line are kept")
	fs.StringVar(&o.memsnapshot, "memsnapshot", "", "write the allocator's segments and its trace of allocations (with Go call sites) as a pickle that pytorch.org/memory_viz opens")
	fs.StringVar(&o.convWorkspace, "conv-workspace", "fast", "eager GPU convolutions: fast (the fastest cuDNN algorithms) or lean (workspaces no larger than the activations: less peak memory, slower); a captured step picks with its memory plan")
	fs.BoolVar(&o.offload, "offload-optimizer", false, "on a GPU, keep the optimizer's state in host memory and update the parameters on the host's cores: each gradient streams down as the backward finishes it, and the device holds the parameters and the gradients in flight only (steps then run eagerly)")
	fs.BoolVar(&o.acts, "offload-activations", false, "on a GPU, with -checkpoint: move what the checkpointed blocks keep for their recomputation (their inputs, attention's results) to host memory during the forward, and bring it back ahead of each block's recomputation (steps then run eagerly: faster than their graphs)")
	fs.BoolVar(&o.bf16Weights, "bf16-weights", false, "GPTs on a GPU, with -offload-optimizer and -amp -amp-dtype bf16: hold the blocks' weights in bf16 on the device, their F32 masters with the optimizer's state in host memory (half the device's bytes for weights and gradients, which come rounded to bf16); checkpoints hold the F32 masters")
	fs.BoolVar(&o.fuse, "fuse-optimizer", false, "update each parameter in the backward as soon as its gradient is finished, and free the gradient there: no step holds them all (AdamW or SGD, same results; a GPT's default -clip 1 is off, and a -clip given runs the forward and backward twice, the first for the gradients' norm; not with F16 AMP or -nproc); with -offload-optimizer, the host updates each parameter as its gradient arrives, beside the backward (after it with -clip)")
	fs.IntVar(&o.micro, "micro-batch", 0, "run each batch as micro-batches of N examples whose gradients are summed before one update: the batch's update in a micro-batch's activations (0: whole batches; with -offload-optimizer the sums are kept in F32 in host memory, 4 bytes a parameter, and leave the device as each backward finishes them)")
	fs.Float64Var(&o.deviceState, "device-state", 0, "with -offload-optimizer, the share (0 to 1) of the parameters' bytes whose optimizer state stays on the device and is updated there: the first F32 parameters (a GPT's embeddings, which its backward finishes last and whose host update would be left after it); they hold their gradients and state on the device")
	fs.IntVar(&o.hostThreads, "host-threads", 0, "with -offload-optimizer and -fuse-optimizer or -micro-batch on a GPU: the host's cores its work beside the backward (the update, the micro-batches' sums) spreads over (default all but one, which queues the GPU's kernels)")
	fs.BoolVar(&o.capture, "capture", true, "on a GPU, plan the step's memory and capture it as a CUDA graph after two eager steps, then replay it (false: every step eager, for debugging)")
	fs.BoolVar(&o.tf32, "tf32", true, "on a GPU, let cuDNN run F32 convolutions on TF32 tensor cores, as PyTorch does by default (false: strict F32)")
	fs.TextVar(&o.matmulF32, "matmul-f32", tensor.F32TF32x3, "on a GPU, how F32 matrices are multiplied: tf32x3 (three TF32 tensor-core products: F32's accuracy, faster), strict (F32 on the FMA units, as PyTorch by default) or tf32 (one TF32 product: 10-bit mantissas)")
	fs.IntVar(&o.nproc, "nproc", 1, "data parallelism on this machine: start N ranks of this command, one per GPU (torchrun-style; a job launched by torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT instead); -batch is per rank")
	fs.BoolVar(&o.shardOptimizer, "shard-optimizer", false, "data-parallel jobs: each rank keeps the optimizer state of its shard of the parameters only (ZeRO stage 1: gradients reduce-scattered, parameters all-gathered); checkpoints still hold it whole")
	fs.DurationVar(&o.distTimeout, "dist-timeout", 10*time.Minute, "data-parallel jobs: how long a rank waits for the others to join, at a barrier, or for a collective over TCP")
	problems, refused, err := cmdenv.ParseFlags(fs, args)
	if err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		problems = append(problems, fmt.Sprintf("unexpected argument %q (flags start with -)", fs.Arg(0)))
	}
	o.set = cmdenv.Given(fs)
	problems = append(problems, cmdenv.Unsaid(o.check(), refused)...)
	if len(problems) > 0 {
		return o, errors.New(strings.Join(problems, "\n")) // o for -json, which says why too
	}
	return o, nil
}

// check validates the flags together before anything is loaded or
// trained, and returns every problem it finds, one a line.
func (o *options) check() []string {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	arch, archErr := train.LookupArch(modelName(o))
	switch {
	case archErr != nil:
		bad("-depth %d: want 6n+2 (20, 32, 44, 56, 110, 1202)", o.depth)
	default:
		o.text = arch.Text
		o.checkText(arch, bad)
	}
	if o.amp && !o.ampDType.On() {
		bad("-amp-dtype %v with -amp: want %s", o.ampDType, train.AMPDTypes)
	}
	if _, inJob, _ := cmdenv.Job(); o.shardOptimizer && o.nproc == 1 && !inJob {
		bad("-shard-optimizer: not a data-parallel job (start one with -nproc N, or under torchrun)")
	}
	if o.fuse {
		amp := train.NoAMP
		if o.amp {
			amp = o.ampDType
		}
		if why := train.FuseRefusal(amp, o.nproc); why != "" {
			bad("-fuse-optimizer with %s", why)
		}
	}
	micro := train.Config{Batch: o.batch, MicroBatch: o.micro}.MicroBatched()
	switch {
	case o.deviceState < 0 || o.deviceState > 1 || math.IsNaN(o.deviceState):
		bad("-device-state %v: want a share of the parameters' bytes from 0 to 1", o.deviceState)
	case o.deviceState > 0 && !o.offload:
		bad("-device-state %v keeps part of an offloaded optimizer's state on the device: add -offload-optimizer", o.deviceState)
	}
	switch {
	case o.hostThreads < 0:
		bad("-host-threads %d: want a count of cores, or 0 for all but one", o.hostThreads)
	case o.set["host-threads"] && !(o.offload && (o.fuse || micro)):
		bad("-host-threads sizes the host's work beside the backward: it needs -offload-optimizer with -fuse-optimizer or -micro-batch")
	}
	switch {
	case o.micro < 0 || o.set["micro-batch"] && o.micro == 0 || o.batch >= 1 && o.micro > o.batch: // a bad -batch is said alone
		bad("-micro-batch %d: want a count of examples from 1 to -batch's %d", o.micro, o.batch)
	case micro && o.fuse && !o.offload:
		bad("-micro-batch %d with -fuse-optimizer on the device: the update fused into the backward needs the whole batch's gradients in one backward (with -offload-optimizer the host sums them and updates in the last)", o.micro)
	}
	if o.acts && !o.ckpt {
		bad("%s", train.ActivationsRefusal)
	}
	if o.bf16Weights {
		switch {
		case !o.text:
			bad("-bf16-weights: model %s is not a GPT", o.model)
		case !o.offload:
			bad("-bf16-weights keeps the F32 masters with the optimizer's state in host memory: add -offload-optimizer")
		case !o.amp || o.ampDType != train.AMPBF16:
			bad("-bf16-weights trains the bf16 weights under bf16 autocast: add -amp -amp-dtype bf16")
		}
	}
	if o.shardOptimizer && o.offload {
		bad("-shard-optimizer with -offload-optimizer: choose one (the state sharded over the ranks' GPUs, or kept whole in host memory)")
	}
	if o.optimizer == "adamw8bit" && (o.offload || o.shardOptimizer) {
		bad("-optimizer adamw8bit with %s: 8-bit moments stay whole on the device (use -optimizer adamw)", map[bool]string{true: "-offload-optimizer", false: "-shard-optimizer"}[o.offload])
	}
	gpu, index := o.device.CUDA()
	switch {
	case o.nproc < 1:
		bad("-nproc %d: want 1 or more processes", o.nproc)
	case o.nproc > 1 && index >= 0:
		bad("-nproc %d with -device %s: each rank takes its own GPU (cuda:RANK); use -device cuda or auto", o.nproc, o.device)
	case o.nproc > 1 && gpu:
		if n, err := cuda.DeviceCount(); err != nil || n < o.nproc {
			bad("-nproc %d: one GPU per rank, and this machine has %d (%v)", o.nproc, n, err)
		}
	}
	if !(o.distTimeout > 0) {
		bad("-dist-timeout %v: want a positive duration", o.distTimeout)
	}
	if o.data != "" {
		if st, err := os.Stat(o.data); err != nil {
			bad("-data %s: %v", o.data, fileio.Cause(err))
		} else if !st.IsDir() && !o.text {
			bad("-data %s: not a folder", o.data)
		}
	}
	for _, v := range []struct {
		name string
		v    int
		min  int
		want string
	}{
		{"epochs", o.epochs, 1, "at least 1"},
		{"batch", o.batch, 1, "at least 1"},
		{"limit", o.limit, 0, "0 (all) or a number of images"},
		{"test-limit", o.testLimit, 0, "0 (all) or a number of images"},
		{"empty-cache", o.emptyCache, 0, "0 (never) or a number of steps"},
	} {
		if v.v < v.min {
			bad("-%s %d: want %s", v.name, v.v, v.want)
		}
	}
	for _, v := range []struct {
		name     string
		v        float64
		ok       bool
		interval string
	}{
		{"lr", o.lr, o.lr > 0, "a positive learning rate"},
		{"momentum", o.momentum, o.momentum >= 0 && o.momentum < 1, "a momentum in [0, 1)"},
		{"wd", o.wd, o.wd >= 0, "a weight decay of 0 or more"},
		{"warmup", o.warmup, o.warmup >= 0, "0 or more warmup epochs"},
	} {
		if math.IsNaN(v.v) || math.IsInf(v.v, 0) || !v.ok {
			bad("-%s %v: want %s", v.name, v.v, v.interval)
		}
	}
	if o.ckpt && archErr == nil && arch.Blocks == 0 {
		bad("-checkpoint needs a model with blocks to checkpoint: %s has none", modelName(o))
	}
	if o.ckptMode == nn.CheckpointLight && archErr == nil && !arch.Text {
		bad("-checkpoint-mode light keeps the products of a GPT's blocks: %s is not a GPT (give blocks or sqrt)", modelName(o))
	}
	if k := o.ckptFirst; o.set["checkpoint-blocks"] {
		switch {
		case k < 1:
			bad("-checkpoint-blocks %d: want a count of blocks, 1 or more", k)
		case archErr == nil && k > arch.Blocks:
			bad("-checkpoint-blocks %d: %s has %d blocks", k, modelName(o), arch.Blocks)
		case !o.ckpt || o.ckptMode != nn.CheckpointBlocks && o.ckptMode != nn.CheckpointLight:
			bad("-checkpoint-blocks %d needs -checkpoint with -checkpoint-mode blocks or light", k)
		case o.maxMemory.IsSet():
			bad("-checkpoint-blocks %d with -max-memory: the budget chooses how many blocks to checkpoint", k)
		}
	}
	if o.convWorkspace != "fast" && o.convWorkspace != "lean" {
		bad("-conv-workspace %q: want fast or lean", o.convWorkspace)
	}
	if o.download && o.data != "" {
		bad("-download fetches into the user cache folder, and -data %s says where the dataset is: give one of them", o.data)
	}
	if o.resume != "" {
		if st, err := os.Stat(o.resume); err != nil {
			bad("-resume %s: %v", o.resume, fileio.Cause(err))
		} else if st.IsDir() {
			bad("-resume %s: a folder, not a checkpoint file", o.resume)
		} else if info, err := train.ReadCheckpointInfo(o.resume); err != nil {
			bad("-resume %s: %v", o.resume, strings.TrimPrefix(fileio.Cause(err).Error(), o.resume+": "))
		} else if model := o.trainedModel(); archErr == nil && info.Config.Model != model {
			bad("-resume %s: a checkpoint of %s, and this run trains %s", o.resume, info.Config.Model, model)
		}
	} else if o.resumeForce {
		bad("-resume-force without -resume")
	}
	for _, p := range o.paths(arch).Problems() {
		bad("%s", p)
	}
	return errs
}

// paths are the run's inputs and outputs, for iopaths to check: the
// checkpoint resumed (which -save may replace: that is how a resumed run
// goes on), the dataset's folder or the corpus and its token files, and
// the five outputs.
func (o *options) paths(arch train.Arch) *iopaths.Set {
	var s iopaths.Set
	if o.resume != "" && !sameFile(o.resume, o.save) {
		s.Input("-resume", o.resume)
	}
	src := datasets.Source{Dir: o.data, Roots: cmdenv.DataRoots()}
	switch {
	case arch.Text:
		corpus, err := datasets.FindBrown(src)
		if err == nil {
			s.Input("the corpus", corpus)
			if tok, err := datasets.NewTokenizer(o.tokenizer); err == nil {
				s.Input("the corpus's token file", datasets.TokenFile(corpus, tok))
			}
		}
	case o.data != "":
		s.Input("-data", o.data)
	case o.dataset != datasets.SyntheticSet:
		if dir, err := datasets.Find(string(o.dataset), src.Roots...); err == nil {
			s.Input("the dataset in", dir)
		}
	}
	s.Output("-save", o.save, false)
	s.Output("-json", o.jsonOut, true)
	s.Output("-memlog", o.memlog, false)
	s.Output("-memplot", string(o.memplot), false)
	s.Output("-memsnapshot", o.memsnapshot, false)
	return &s
}

// sameFile reports whether a and b name one existing file.
func sameFile(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

func command(args []string, stdout, stderr io.Writer) int {
	o, err := parse(args, stderr)
	if err != nil {
		code := cmdenv.Refused("train", stderr, err)
		if o != nil && o.jsonOut != "" && !strings.Contains(err.Error(), "-json") { // a -json path that is good says why nothing ran
			o.stdout = stdout
			writeReports(o, nil, &run.Report{Error: err.Error()}, stderr)
		}
		return code
	}
	if o.nproc > 1 {
		return launch.Run(o.nproc, launch.WithoutFlag(args, "nproc"), stdout, stderr)
	}
	o.stdout = stdout
	if o.jsonOut == iopaths.Stdout { // the JSON alone on standard output, what is said on standard error
		stdout = stderr
	}
	interrupts := cmdenv.CatchInterrupts("train", "within the operation under way, then saving and writing the reports", stderr)
	defer interrupts.Release()
	err = trainRun(o, stdout, stderr, interrupts.C)
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "train: %v\n", err)
	var setup *run.SetupError
	switch {
	case errors.Is(err, train.ErrInterrupted):
		if ie := (*train.InterruptedError)(nil); errors.As(err, &ie) && ie.Saved != "" {
			fmt.Fprintf(stderr, "train: -resume %s goes on from there\n", ie.Saved)
		}
		return cmdenv.ExitSignal(interrupts.Signal())
	case errors.Is(err, train.ErrDiverged):
		return cmdenv.ExitDiverged
	case errors.As(err, &setup):
		return cmdenv.ExitNothingRan
	}
	return cmdenv.ExitFailed
}

// trainRun does the work and writes the reports, also when the work fails:
// the JSON report then says why (error, diverged), and the memory logs
// show what led there.
//
// In a data-parallel job (WORLD_SIZE set) every rank trains and rank 0
// alone prints, saves and writes the reports.
func trainRun(o *options, stdout, stderr io.Writer, stop <-chan struct{}) (err error) {
	place, err := jobPlace(o)
	if err != nil {
		return &run.SetupError{Err: err}
	}
	rank0 := place == nil || place.Rank == 0
	if !rank0 {
		stdout = io.Discard
	}
	early := func(err error) error { // before any training: the JSON report alone, saying why
		err = &run.SetupError{Err: err}
		if !rank0 {
			return err
		}
		return errors.Join(err, writeReports(o, nil, &run.Report{Error: err.Error()}, stdout))
	}
	o.device = launch.Device(o.device, place)
	dev, err := openDevice(o, stdout)
	if err != nil {
		return early(err)
	}
	var job run.Job
	if o.text {
		job, err = textJob(o, dev, stdout, stop)
	} else {
		job, err = imageJob(o, dev, stdout)
	}
	if err != nil {
		return early(err)
	}
	var group *dist.Group
	if place != nil {
		if group, err = launch.Join(dev, place, stderr); err != nil {
			return early(err)
		}
		defer func() {
			if err != nil && !errors.Is(err, train.ErrInterrupted) { // an interrupt stops every rank at one step: nothing failed
				group.Abort(fmt.Errorf("rank %d: %v", place.Rank, firstLine(err.Error())))
			}
			if cerr := group.Close(); err == nil && cerr != nil {
				err = fmt.Errorf("data-parallel job: %w", cerr)
			}
		}()
	}
	job.Group, job.ShardOptimizer, job.Log, job.Stop = group, o.shardOptimizer, stdout, stop
	if job.OffloadOptimizer && !job.Offloads(dev) {
		fmt.Fprintln(stdout, "CPU run: -offload-optimizer changes nothing here (the device's memory is the host's)")
	}
	if job.OffloadActivations && !job.OffloadsActivations(dev) {
		fmt.Fprintln(stdout, "CPU run: -offload-activations changes nothing here (the device's memory is the host's)")
	}
	if o.maxMemory.IsSet() {
		job.MaxMemory = cmdenv.MemoryBudget(dev, o.maxMemory)
		job.KeepOptimizer, job.KeepUnfused = o.set["optimizer"], o.set["fuse-optimizer"] && !o.fuse
		job.KeepOptimizerOnDevice = o.set["offload-optimizer"] && !o.offload
		job.KeepDeviceState = o.set["device-state"]
		job.Allow = func(v train.Variant) bool { // the flags given are kept
			ok := !o.set["amp"] || v.AMP.On() == o.amp
			if o.set["checkpoint"] { // every block, or none
				ok = ok && (v.Checkpoint != nn.NoCheckpoint) == o.ckpt && !v.Some
			}
			if o.set["checkpoint-mode"] && v.Checkpoint != nn.NoCheckpoint {
				ok = ok && v.Checkpoint == o.ckptMode
			}
			if o.set["offload-activations"] && !o.acts {
				ok = ok && !v.OffloadActivations
			}
			return ok
		}
	}
	if rank0 {
		job.Progress = newProgress(stderr, job.Periods(), o.text)
	}
	report, err := run.Train(dev, job)
	if err == nil {
		report.WriteSummary(stdout)
		if s := report.Sample; s != nil {
			fmt.Fprintf(stdout, "\nsample (%d tokens, temperature %g, top-k %d) after %q:\n%s\n", s.Tokens, s.Temperature, s.TopK, s.Prompt, s.Text)
		}
	}
	if errors.Is(err, memory.ErrOutOfMemory) {
		err = fmt.Errorf("%w\n(try -max-memory with the device's size, a smaller -batch, or -amp and -checkpoint)", err)
	}
	if !rank0 {
		return err
	}
	return errors.Join(err, writeReports(o, dev, report, stdout))
}

// config is the run's configuration from the flags, for either kind of model.
func (o *options) config(model string) train.Config {
	var ckpt nn.CheckpointMode
	if o.ckpt {
		ckpt = o.ckptMode
	}
	var amp train.AMP
	if o.amp {
		amp = o.ampDType
	}
	return train.Config{Model: model, Epochs: o.epochs, Batch: o.batch, LR: o.lr, Momentum: o.momentum,
		WeightDecay: o.wd, Optimizer: string(o.optimizer), Schedule: string(o.schedule), WarmupEpochs: o.warmup, AMP: amp,
		ClipNorm: max(o.clip, 0), Checkpoint: ckpt, Checkpointed: o.ckptFirst, EmptyCacheEvery: o.emptyCache, Seed: o.seed, Capture: o.capture, OffloadOptimizer: o.offload, OffloadActivations: o.acts, BF16Weights: o.bf16Weights,
		FuseOptimizer: o.fuse, HostThreads: o.hostThreads, MicroBatch: o.micro, DeviceState: o.deviceState}
}

// imageJob is an image classifier's run: its dataset opened, and on a CPU
// shrunk to minutes.
func imageJob(o *options, dev *tensor.Device, stdout io.Writer) (run.Job, error) {
	trainSet, testSet, err := openData(o, stdout)
	if err != nil {
		return run.Job{}, err
	}
	job := o.job(o.config(modelName(o)))
	job.Dataset, job.Train, job.Test, job.Augment = trainSet.Name, trainSet, testSet, o.augment
	if o.set["batch"] && !o.set["lr"] && o.batch != defaultBatch {
		job.LR = defaultLR * float64(o.batch) / defaultBatch // the linear scaling rule, as the CPU defaults apply it
		fmt.Fprintf(stdout, "lr %g: -lr's %g for a batch of %d, scaled to -batch %d (set -lr to choose it)\n", job.LR, defaultLR, defaultBatch, o.batch)
	}
	if dev.OnHost() {
		if notes := job.CPUDefaults(func(flag string) bool { return o.set[flag] }); len(notes) > 0 {
			fmt.Fprintf(stdout, "CPU run: %s, to finish in a few minutes (set -limit 0 -test-limit 0 -epochs 15 -batch 128 for the full run)\n", strings.Join(notes, ", "))
		}
	}
	from := "generated from -seed"
	if job.Train.Dir != "" {
		from = "read from " + job.Train.Dir
	}
	fmt.Fprintf(stdout, "dataset: %s, %d training and %d test images of %dx%dx%d, %s\n",
		job.Train.Name, job.Train.N, job.Test.N, job.Train.C, job.Train.H, job.Train.W, from)
	return job, nil
}

// textJob is a language model's run: its recipe with the flags given, and
// its corpus opened (tokenized, the first time, until stop closes).
func textJob(o *options, dev *tensor.Device, stdout io.Writer, stop <-chan struct{}) (run.Job, error) {
	model := modelName(o)
	if dev.OnHost() {
		var why string
		if model, why = run.CPUModel(model); why != "" {
			fmt.Fprintf(stdout, "CPU run: %s\n", why)
		}
	}
	arch, _ := train.LookupArch(model) // checked by parse
	r := o.recipe(arch)
	cfg := o.config(model)
	cfg.Optimizer, cfg.LR, cfg.Beta2, cfg.WeightDecay, cfg.ClipNorm, cfg.Batch = r.Optimizer, r.LR, r.Beta2, r.WeightDecay, r.ClipNorm, r.Batch
	cfg.Epochs, cfg.WarmupEpochs = 0, 0
	cfg.Steps, cfg.WarmupSteps, cfg.EvalEvery, cfg.EvalBatches = r.Steps, r.WarmupSteps, r.EvalEvery, r.EvalBatches
	cfg.Context, cfg.Tokenizer = o.context, o.tokenizer
	tok, err := datasets.NewTokenizer(o.tokenizer)
	if err != nil {
		return run.Job{}, fmt.Errorf("-tokenizer: %w", err)
	}
	if err := run.CheckResumeBeforeData(o.job(cfg), o.maxMemory.IsSet()); err != nil { // before the corpus, which can take minutes to tokenize
		return run.Job{}, err
	}
	ctx, cancel := cmdenv.StopContext(stop)
	defer cancel()
	var c *datasets.Corpus
	if o.data != "" {
		c, err = datasets.OpenCorpus(ctx, o.data, tok)
	} else {
		c, err = datasets.OpenBrown(ctx, datasets.Source{Roots: cmdenv.DataRoots()}, tok)
	}
	if errors.Is(err, context.Canceled) {
		return run.Job{}, fmt.Errorf("%w while reading the text, before any training", train.ErrInterrupted)
	}
	if err != nil {
		return run.Job{}, fmt.Errorf("-data: %w", err)
	}
	cfg.Dataset = c.Name
	job := o.job(cfg)
	job.Text, job.Sample, job.Prompt = c, o.sample, o.prompt
	job.Sampling = nn.Sampling{Temperature: o.temperature, TopK: o.topK, Rand: rand.New(rand.NewPCG(o.seed, 0x5a))}
	fmt.Fprintf(stdout, "text: %s, %d training and %d validation tokens (%s tokenizer), read from %s (tokens in %s)\n",
		c.Name, len(c.Train), len(c.Val), tok.Name(), c.Path, c.Cache)
	return job, nil
}

// job is a run of cfg with the flags' outputs, measurements and resume.
func (o *options) job(cfg train.Config) run.Job {
	return run.Job{Config: cfg, Measure: o.measure, CheckpointMode: o.ckptMode, MeasuredAMP: o.ampDType,
		Save: o.save, Resume: o.resume, ResumeForce: o.resumeForce,
		RecordTimeline: o.memlog != "", RecordHistory: o.memsnapshot != ""}
}

// largestDivisor is the largest divisor of n that is at most most.
func largestDivisor(n, most int) int {
	for d := min(n, most); d > 1; d-- {
		if n%d == 0 {
			return d
		}
	}
	return 1
}

// modelName is the model -model and -depth name ("resnet20").
func modelName(o *options) string {
	if o.model == "resnet" {
		return fmt.Sprintf("resnet%d", o.depth)
	}
	return string(o.model)
}

// writeReports writes the reports that were asked for, with what the run
// got to; it returns every error, naming the flag.
func writeReports(o *options, dev *tensor.Device, r *run.Report, stdout io.Writer) error {
	var errs []error
	wrote := func(flag, path, what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", flag, path, err))
		} else if path != iopaths.Stdout {
			fmt.Fprintf(stdout, "wrote %s (%s)\n", path, what)
		}
	}
	if o.save != "" && (len(r.Epochs) > 0 || r.Interrupted != nil && r.Interrupted.Saved != "") {
		wrote("-save", o.save, "the training checkpoint: -resume goes on from it, serve serves it", nil)
	}
	if o.jsonOut != "" {
		data, err := json.MarshalIndent(r, "", "  ")
		if err == nil && o.jsonOut == iopaths.Stdout {
			_, err = o.stdout.Write(append(data, '\n'))
		} else if err == nil {
			err = fileio.WriteFile(o.jsonOut, append(data, '\n'))
		}
		wrote("-json", o.jsonOut, "the run's report", err)
	}
	if dev == nil {
		return errors.Join(errs...) // nothing ran: there is no memory to report
	}
	a := dev.Allocator()
	if o.memlog != "" {
		err := fileio.Write(o.memlog, func(w io.Writer) error { return memory.WriteTimelineCSV(w, a.Timeline()) })
		wrote("-memlog", o.memlog, "the pool's timeline, CSV", err)
		if err == nil && a.TimelineTruncated() {
			fmt.Fprintf(stdout, "memlog: the timeline stopped after %d events\n", memory.TimelineLimit)
		}
	}
	if o.memplot != "" && len(r.Memory) > 0 {
		wrote("-memplot", string(o.memplot), "the memory plot", run.PlotMemory(r.Memory, r.Title, string(o.memplot)))
	}
	if o.memsnapshot != "" {
		err := fileio.Write(o.memsnapshot, func(w io.Writer) error { return memory.WriteSnapshot(w, a.Snapshot()) })
		wrote("-memsnapshot", o.memsnapshot, "the pool's snapshot, PyTorch's pickle", err)
	}
	return errors.Join(errs...)
}

func openDevice(o *options, stdout io.Writer) (*tensor.Device, error) {
	opts := tensor.Options{LeanConvWorkspace: o.convWorkspace == "lean", StrictConvF32: !o.tf32, MatmulF32: o.matmulF32}
	return cmdenv.OpenDevice(o.device, opts, stdout)
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// openData loads the dataset from -data, or from $LEANGRAD_DATA and the
// system folders (falling back to the synthetic set, and saying why, when
// the default Fashion-MNIST is not found), limited by -limit and -test-limit.
func openData(o *options, stdout io.Writer) (trainSet, testSet *datasets.Dataset, err error) {
	src := datasets.Source{Dir: o.data, Roots: cmdenv.DataRoots(), Download: o.download}
	trainSet, testSet, err = datasets.Open(string(o.dataset), src, o.seed)
	if err != nil {
		if o.set["dataset"] || o.data != "" || !errors.Is(err, datasets.ErrNotFound) {
			return nil, nil, fmt.Errorf("-dataset %s: %w", o.dataset, err)
		}
		fmt.Fprintf(stdout, "dataset: %v; using the synthetic set instead (install dataset-fashion-mnist, pass -data DIR, or -download)\n", err)
		trainSet, testSet, _ = datasets.Open(datasets.SyntheticSet, datasets.Source{}, o.seed)
	}
	return trainSet.Subset(o.limit), testSet.Subset(o.testLimit), nil
}
