// Command train trains a model (ResNet-20 on Fashion-MNIST by default) on
// the GPU when there is one and on the CPU otherwise, with a progress bar,
// and ends with test accuracy, throughput and a memory report whose savings
// are measured by the allocator: before training, one step of the same
// model and batch runs in each of fp32, AMP, checkpointing and both.
//
//	train -model resnet -amp -checkpoint
//	train -model resnet -depth 56 -epochs 30 -device cuda:0 -json run.json -memplot mem.png
//	train -model mlp -dataset synthetic -device cpu
//
// Run train -h for every flag.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/internal/atomicfile"
	"github.com/leangrad/leangrad/kernels/cuda"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
	"github.com/leangrad/leangrad/train"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// options are the command's flags.
type options struct {
	model, device, dataset, data           string
	depth, epochs, batch, limit, testLimit int
	lr, momentum, wd, warmup               float64
	optimizer, schedule, ckptMode          string
	amp, ckpt, download, augment, measure  bool
	capture, tf32                          bool
	emptyCache                             int
	seed                                   uint64
	jsonOut, memlog, memplot, save, resume string
	convWorkspace                          string
	set                                    map[string]bool // flags given on the command line
}

func parse(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("train", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: train [flags]\n\nTrains a model and reports accuracy, throughput and memory, with the savings of -amp and\n-checkpoint measured by the allocator. Defaults: ResNet-20 on Fashion-MNIST, on the GPU if there is one.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&o.model, "model", "resnet", "model: resnet (CIFAR-style, see -depth), resnet18 or mlp")
	fs.IntVar(&o.depth, "depth", 20, "ResNet depth, 6n+2 (20, 32, 44, 56, 110, 1202)")
	fs.StringVar(&o.device, "device", "auto", "device: cpu, cuda, cuda:N or auto (the GPU if there is one)")
	fs.StringVar(&o.dataset, "dataset", datasets.FashionMNIST, "dataset: fashion-mnist, cifar10 or synthetic")
	fs.StringVar(&o.data, "data", "", "folder holding the dataset's files (searched first)")
	fs.BoolVar(&o.download, "download", false, "download Fashion-MNIST (checksums verified) if it is not found")
	fs.IntVar(&o.epochs, "epochs", 15, "epochs")
	fs.IntVar(&o.batch, "batch", 128, "batch size")
	fs.Float64Var(&o.lr, "lr", 0.1, "peak learning rate")
	fs.Float64Var(&o.momentum, "momentum", 0.9, "SGD momentum (Nesterov)")
	fs.Float64Var(&o.wd, "wd", 5e-4, "weight decay")
	fs.StringVar(&o.optimizer, "optimizer", "sgd", "optimizer: sgd or adamw")
	fs.StringVar(&o.schedule, "schedule", "cosine", "learning-rate schedule: cosine (with warmup), onecycle or constant")
	fs.Float64Var(&o.warmup, "warmup", 1, "warmup epochs of the cosine schedule (at most a tenth of the run)")
	fs.Uint64Var(&o.seed, "seed", 1, "random seed (initialisation, shuffling, augmentation, dropout)")
	fs.IntVar(&o.limit, "limit", 0, "train on the first N images only (0: all; on a CPU the default is 2000)")
	fs.IntVar(&o.testLimit, "test-limit", 0, "evaluate on the first N test images only (0: all; on a CPU the default is 1000)")
	fs.BoolVar(&o.amp, "amp", false, "mixed precision: F16 convolutions and matmuls, F32 master weights, loss scaling")
	fs.BoolVar(&o.ckpt, "checkpoint", false, "checkpoint the residual blocks: recompute them in the backward instead of keeping their activations")
	fs.StringVar(&o.ckptMode, "checkpoint-mode", "blocks", "what -checkpoint checkpoints: blocks (every block) or sqrt (sqrt(n) segments)")
	fs.BoolVar(&o.augment, "augment", true, "random crops (padding 2, 4 on CIFAR) and horizontal flips for ResNets")
	fs.BoolVar(&o.measure, "measure", true, "measure one step of fp32, amp, checkpoint and amp+checkpoint before training")
	fs.IntVar(&o.emptyCache, "empty-cache", 0, "call EmptyCache every N steps (0: never) and report what it cost")
	fs.StringVar(&o.jsonOut, "json", "", "write metrics as JSON to this file")
	fs.StringVar(&o.memlog, "memlog", "", "write the allocator's timeline of every alloc and free as CSV to this file")
	fs.StringVar(&o.memplot, "memplot", "", "plot allocated and reserved memory over the run to this PNG")
	fs.StringVar(&o.save, "save", "", "write a training checkpoint to this file after every epoch (atomically)")
	fs.StringVar(&o.resume, "resume", "", "resume from a training checkpoint written by -save")
	fs.StringVar(&o.convWorkspace, "conv-workspace", "fast", "eager GPU convolutions: fast (the fastest cuDNN algorithms) or lean (workspaces no larger than the activations: less peak memory, slower); a captured step picks with its memory plan")
	fs.BoolVar(&o.capture, "capture", true, "on a GPU, plan the step's memory and capture it as a CUDA graph after two eager steps, then replay it (false: every step eager, for debugging)")
	fs.BoolVar(&o.tf32, "tf32", true, "on a GPU, let cuDNN run F32 convolutions on TF32 tensor cores, as PyTorch does by default (false: strict F32)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (flags start with -)", fs.Arg(0))
	}
	o.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	switch {
	case o.model != "resnet" && o.model != "resnet18" && o.model != "mlp":
		return nil, fmt.Errorf("-model %q: want resnet, resnet18 or mlp", o.model)
	case o.epochs < 1:
		return nil, fmt.Errorf("-epochs %d: want at least 1", o.epochs)
	case o.batch < 1:
		return nil, fmt.Errorf("-batch %d: want at least 1", o.batch)
	case o.lr <= 0:
		return nil, fmt.Errorf("-lr %v: want a positive learning rate", o.lr)
	case o.limit < 0 || o.testLimit < 0:
		return nil, fmt.Errorf("-limit and -test-limit count images: want 0 or more")
	case o.emptyCache < 0:
		return nil, fmt.Errorf("-empty-cache %d: want 0 (never) or a number of steps", o.emptyCache)
	case o.ckpt && o.model == "mlp":
		return nil, fmt.Errorf("-checkpoint needs a ResNet: its residual blocks are what is checkpointed")
	}
	if o.model == "resnet" && (o.depth < 8 || (o.depth-2)%6 != 0) {
		return nil, fmt.Errorf("-depth %d: want 6n+2 (20, 32, 44, 56, 110, 1202)", o.depth)
	}
	if o.convWorkspace != "fast" && o.convWorkspace != "lean" {
		return nil, fmt.Errorf("-conv-workspace %q: want fast or lean", o.convWorkspace)
	}
	if _, err := nn.ParseCheckpointMode(o.ckptMode); err != nil {
		return nil, fmt.Errorf("-checkpoint-mode: %v", err)
	}
	return o, nil
}

func run(args []string, stdout, stderr io.Writer) int {
	o, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "train: %v\n", err)
		return 2
	}
	if err := trainRun(o, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "train: %v\n", err)
		return 1
	}
	return 0
}

// trainRun does the work.
func trainRun(o *options, stdout, stderr io.Writer) error {
	err := trainOn(o, stdout, stderr)
	if errors.Is(err, memory.ErrOutOfMemory) {
		return fmt.Errorf("%w\n(try a smaller -batch, or -amp and -checkpoint)", err)
	}
	return err
}

func trainOn(o *options, stdout, stderr io.Writer) error {
	dev, err := openDevice(o, stdout)
	if err != nil {
		return err
	}
	trainSet, testSet, err := openData(o, dev, stdout)
	if err != nil {
		return err
	}
	build := func() nn.Module {
		dev.Generator().Seed(o.seed)
		switch o.model {
		case "resnet18":
			return nn.NewResNet18(dev, trainSet.C, trainSet.Classes)
		case "mlp":
			return nn.NewMLP(dev, []int{trainSet.C * trainSet.H * trainSet.W, 256, 256, trainSet.Classes}, 0)
		}
		r, _ := nn.NewCIFARResNet(dev, o.depth, trainSet.C, trainSet.Classes)
		return r
	}
	modelName := o.model
	if o.model == "resnet" {
		modelName = fmt.Sprintf("resnet%d", o.depth)
	}
	ckpt := "none"
	if o.ckpt {
		ckpt = o.ckptMode
	}
	cfg := train.Config{Model: modelName, Epochs: o.epochs, Batch: o.batch, LR: o.lr, Momentum: o.momentum,
		WeightDecay: o.wd, Optimizer: o.optimizer, Schedule: o.schedule, WarmupEpochs: o.warmup, AMP: o.amp,
		Checkpoint: ckpt, EmptyCacheEvery: o.emptyCache, Seed: o.seed, Capture: o.capture}

	mean, std := trainSet.MeanStd()
	lc := datasets.LoaderConfig{Batch: o.batch, Shuffle: true, Seed: o.seed, Mean: mean, Std: std}
	if o.augment && o.model != "mlp" {
		lc.CropPad, lc.Flip = 2, true
		if trainSet.H >= 32 {
			lc.CropPad = 4
		}
	}
	trainL := datasets.NewLoader(trainSet, dev, lc)
	testL := datasets.NewLoader(testSet, dev, datasets.LoaderConfig{Batch: 500, Mean: mean, Std: std})

	report := &jsonReport{Config: cfg, Device: dev.Name(), Dataset: trainSet.Name, TrainImages: trainSet.N, TestImages: testSet.N}
	chosen := train.VariantName(o.amp, ckpt)
	planned := o.capture && dev.Name() != "cpu"
	if o.measure {
		fmt.Fprintf(stdout, "memory of one training step of %s on a batch of %d, measured by the pool:\n", modelName, o.batch)
		report.Measured, err = measure(dev, build, cfg, trainL, o.model != "mlp", o.ckptMode, planned)
		if err != nil {
			return err
		}
		train.WriteSavings(stdout, report.Measured, chosen)
	}

	model := build()
	defer nn.Release(model)
	t, err := train.New(model, dev, cfg, trainL.Len())
	if err != nil {
		return err
	}
	defer t.Release()
	if o.resume != "" {
		if err := t.Resume(o.resume); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "resumed from %s at epoch %d\n", o.resume, t.Epoch+1)
	}
	a := dev.Allocator()
	a.EmptyCache() // what the measurements cached is not the run's
	a.ResetPeak()  // the summary's peaks are the training run's, not the measurements'
	if o.memlog != "" {
		a.RecordTimeline(true)
	}
	fmt.Fprintf(stdout, "training %s (%d parameters) on %d images, %d epochs of %d steps, %s, %s steps\n",
		modelName, nn.CountParams(model), trainSet.N, o.epochs, trainL.Len(), chosen, t.Step.Mode)
	start := time.Now()
	if err := t.Fit(trainL, testL, newProgress(stderr, o.epochs), o.save); err != nil {
		return err
	}
	wall := time.Since(start)
	a.RecordTimeline(false)

	// The report.
	var imgs, secs float64
	for _, m := range t.History {
		secs += m.Seconds
		imgs += m.ImgPerSec * m.Seconds
	}
	last := t.History[len(t.History)-1]
	peakA, peakR := t.Peaks()
	fmt.Fprintf(stdout, "\ntest accuracy  %.2f%% (loss %.4f) after %d epochs\n", 100*last.TestAcc, last.TestLoss, len(t.History))
	fmt.Fprintf(stdout, "throughput     %.0f img/s over the training steps (%.1f s), %.1f s in all with evaluation\n", imgs/secs, secs, wall.Seconds())
	line := "peak allocated " + train.MiB(peakA)
	for _, m := range report.Measured {
		if m.Name == "fp32" && chosen != "fp32" {
			line += fmt.Sprintf(" (fp32: %s, %s)", train.MiB(m.PeakAllocated), train.Percent(peakA, m.PeakAllocated))
		}
	}
	fmt.Fprintln(stdout, line)
	fmt.Fprintf(stdout, "peak reserved  %s\n", train.MiB(peakR))
	if p := t.Step.Plan(trainL.BatchShape(), trainL.BatchShape()[:1]); p != nil {
		fmt.Fprintf(stdout, "planned step   this step needs an arena of %s (%s live at its peak; placed by %s order), on top of the parameters and optimiser state\n",
			train.MiB(p.Size), train.MiB(p.Live), p.Order)
	}
	for _, n := range t.Step.Notes() {
		fmt.Fprintf(stdout, "step           %s\n", n)
	}
	if free, total := dev.MemInfo(); dev.Name() != "cpu" {
		fmt.Fprintf(stdout, "device memory  %s free of %s (the driver's view)\n", train.MiB(free), train.MiB(total))
	}
	if o.emptyCache > 0 {
		fmt.Fprintf(stdout, "EmptyCache every %d steps: %d calls, %s returned to the device in all, %.3f s inside EmptyCache\n",
			o.emptyCache, t.Empty.Calls, train.MiB(t.Empty.Released), t.Empty.Seconds)
	}
	fmt.Fprint(stdout, a.Summary())

	report.Epochs, report.Empty = t.History, t.Empty
	report.Final = finalReport{TestAcc: last.TestAcc, TestLoss: last.TestLoss, ImgPerSec: imgs / secs, TrainSeconds: secs,
		WallSeconds: wall.Seconds(), PeakAllocated: peakA, PeakReserved: peakR}
	report.Stats = a.Stats()
	if o.jsonOut != "" {
		data, _ := json.MarshalIndent(report, "", "  ")
		if err := atomicfile.WriteFile(o.jsonOut, append(data, '\n')); err != nil {
			return fmt.Errorf("-json %s: %w", o.jsonOut, err)
		}
	}
	if o.memlog != "" {
		err := atomicfile.Write(o.memlog, func(w io.Writer) error { return memory.WriteTimelineCSV(w, a.Timeline()) })
		if err != nil {
			return fmt.Errorf("-memlog %s: %w", o.memlog, err)
		}
		if a.TimelineTruncated() {
			fmt.Fprintf(stdout, "memlog: the timeline stopped after %d events\n", memory.TimelineLimit)
		}
	}
	if o.memplot != "" {
		title := fmt.Sprintf("%s, %s, batch %d on %s", modelName, chosen, o.batch, dev.Name())
		if err := train.PlotMemory(t.Memory, title, o.memplot); err != nil {
			return fmt.Errorf("-memplot %s: %w", o.memplot, err)
		}
	}
	return nil
}

func openDevice(o *options, stdout io.Writer) (*tensor.Device, error) {
	opts := cuda.Options{LeanConvWorkspace: o.convWorkspace == "lean", StrictConvF32: !o.tf32}
	if o.device == "auto" {
		dev, why := tensor.OpenAutoWith(opts)
		if why != "" {
			fmt.Fprintf(stdout, "device: cpu (no usable GPU: %s)\n", firstLine(why))
		} else {
			fmt.Fprintf(stdout, "device: %s\n", describe(dev))
		}
		return dev, nil
	}
	dev, err := tensor.OpenWith(o.device, opts)
	if err != nil {
		return nil, fmt.Errorf("-device %s: %w", o.device, err)
	}
	fmt.Fprintf(stdout, "device: %s\n", describe(dev))
	return dev, nil
}

func describe(dev *tensor.Device) string {
	if n, ok := dev.Backend().(interface {
		DeviceName() string
		Arch() string
		ConvEngine() string
	}); ok {
		return fmt.Sprintf("%s (%s, %s; convolutions by %s)", dev.Name(), n.DeviceName(), n.Arch(), n.ConvEngine())
	}
	return dev.Name()
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// openData loads the dataset (falling back to the synthetic set, and saying
// why, when the default Fashion-MNIST is not found) and applies the CPU
// defaults that keep a CPU run to a few minutes.
func openData(o *options, dev *tensor.Device, stdout io.Writer) (trainSet, testSet *datasets.Dataset, err error) {
	trainSet, testSet, err = datasets.Open(o.dataset, o.data, o.download, o.seed)
	if err != nil {
		if o.set["dataset"] || !errors.Is(err, datasets.ErrNotFound) {
			return nil, nil, fmt.Errorf("-dataset %s: %w", o.dataset, err)
		}
		fmt.Fprintf(stdout, "dataset: %v; using the synthetic set instead (install dataset-fashion-mnist, pass -data DIR, or -download)\n", err)
		trainSet, testSet, _ = datasets.Open(datasets.SyntheticSet, "", false, o.seed)
	}
	if dev.Name() == "cpu" {
		var notes []string
		if !o.set["limit"] && trainSet.N > 2000 {
			o.limit = 2000
			notes = append(notes, "the first 2000 training images")
		}
		if !o.set["test-limit"] && testSet.N > 1000 {
			o.testLimit = 1000
			notes = append(notes, "1000 test images")
		}
		if !o.set["epochs"] && o.epochs > 1 {
			o.epochs = 1
			notes = append(notes, "1 epoch")
		}
		if !o.set["batch"] && o.batch > 32 {
			if !o.set["lr"] {
				o.lr *= 32 / float64(o.batch) // the linear scaling rule
				notes = append(notes, fmt.Sprintf("lr %g", o.lr))
			}
			o.batch = 32
			notes = append(notes, "batch 32")
		}
		if len(notes) > 0 {
			fmt.Fprintf(stdout, "CPU run: %s, to finish in a few minutes (set -limit 0 -test-limit 0 -epochs 15 -batch 128 for the full run)\n", strings.Join(notes, ", "))
		}
	}
	trainSet, testSet = trainSet.Subset(o.limit), testSet.Subset(o.testLimit)
	fmt.Fprintf(stdout, "dataset: %s, %d training and %d test images of %dx%dx%d\n", trainSet.Name, trainSet.N, testSet.N, trainSet.C, trainSet.H, trainSet.W)
	return trainSet, testSet, nil
}

// measure runs the one-step measurement of every variant on the first
// training batch (for an MLP, only with and without AMP).
func measure(dev *tensor.Device, build func() nn.Module, cfg train.Config, l *datasets.Loader, resnet bool, mode string, plan bool) ([]train.Measurement, error) {
	var out []train.Measurement
	var err error
	tensor.WithScope(func() {
		ep := l.Epoch(0)
		x, y, _ := ep.Next()
		ep.Close()
		for _, v := range train.Variants(mode) {
			if !resnet && v.Checkpoint != "none" {
				continue
			}
			var m train.Measurement
			if m, err = train.MeasureStep(dev, build, cfg, v, x, y, plan); err != nil {
				return
			}
			out = append(out, m)
		}
	})
	return out, err
}

type finalReport struct {
	TestAcc       float64 `json:"test_acc"`
	TestLoss      float64 `json:"test_loss"`
	ImgPerSec     float64 `json:"img_per_sec"`
	TrainSeconds  float64 `json:"train_seconds"`
	WallSeconds   float64 `json:"wall_seconds"`
	PeakAllocated int64   `json:"peak_allocated"`
	PeakReserved  int64   `json:"peak_reserved"`
}

type jsonReport struct {
	Config      train.Config           `json:"config"`
	Device      string                 `json:"device"`
	Dataset     string                 `json:"dataset"`
	TrainImages int                    `json:"train_images"`
	TestImages  int                    `json:"test_images"`
	Measured    []train.Measurement    `json:"measured_step_peaks,omitempty"`
	Epochs      []train.EpochMetrics   `json:"epochs"`
	Final       finalReport            `json:"final"`
	Empty       train.EmptyCacheReport `json:"empty_cache"`
	Stats       memory.Stats           `json:"pool_stats"`
}
