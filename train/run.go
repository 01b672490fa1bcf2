package train

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/dist"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
)

// Job is a training run to do: the Config its checkpoints record, the data,
// and what to measure, fit, save and record on the way. cmd/train fills it
// from its flags; a Go program fills it itself and calls Run.
type Job struct {
	Config
	Train, Test *datasets.Dataset
	// Augment takes random crops (padding 2, or 4 for 32×32 images) and
	// horizontal flips for ResNets.
	Augment bool
	// Measure runs one step of fp32, AMP, checkpointing and both first,
	// and reports each one's peak (Report.Measured).
	Measure bool
	// CheckpointMode is what the measured and budget configurations
	// checkpoint: "blocks" (the default) or "sqrt".
	CheckpointMode string
	// MaxMemory caps the pool at this many bytes and fits the step into it
	// (FitBudget; 0: no cap). Allow, if set, rules out candidates.
	MaxMemory int64
	Allow     func(Variant) bool
	// Save writes a checkpoint after every epoch; Resume starts from one
	// (with ResumeForce, even one of another configuration).
	Save, Resume string
	ResumeForce  bool
	// RecordTimeline and RecordHistory turn on the allocator's recordings
	// for the training (memory.Allocator.RecordTimeline, RecordHistory).
	RecordTimeline, RecordHistory bool
	// Progress follows the epochs (nil: nothing); Log hears what the run
	// says as it goes: measurements, the budget, resume (nil: nothing).
	Progress Observer
	Log      io.Writer
	// Group, if set, makes the run one rank of a data-parallel job
	// (Trainer.SetGroup): the batch is per rank, each rank trains on its
	// share of every epoch and evaluates its share of the test set, and
	// the figures are the job's. Only rank 0 saves.
	Group *dist.Group
}

// CPUDefaults shrinks the job to a few minutes on a CPU, where given says
// the user did not choose: the first 2000 training images ("limit") and
// 1000 test images ("test-limit"), one epoch ("epochs"), and a batch of 32
// ("batch") with the learning rate ("lr") scaled linearly. It returns what
// it changed, to be said.
func (j *Job) CPUDefaults(given func(name string) bool) []string {
	var notes []string
	if !given("limit") && j.Train.N > 2000 {
		j.Train = j.Train.Subset(2000)
		notes = append(notes, "the first 2000 training images")
	}
	if !given("test-limit") && j.Test.N > 1000 {
		j.Test = j.Test.Subset(1000)
		notes = append(notes, "1000 test images")
	}
	if !given("epochs") && j.Epochs > 1 {
		j.Epochs = 1
		notes = append(notes, "1 epoch")
	}
	if !given("batch") && j.Batch > 32 {
		if !given("lr") {
			j.LR *= 32 / float64(j.Batch) // the linear scaling rule
			notes = append(notes, fmt.Sprintf("lr %g", j.LR))
		}
		j.Batch = 32
		notes = append(notes, "batch 32")
	}
	return notes
}

// Final is a finished run's figures.
type Final struct {
	TestAcc           Float   `json:"test_acc"`
	TestLoss          Float   `json:"test_loss"`
	ImgPerSec         Float   `json:"img_per_sec"`   // this run's training steps (not a resumed run's earlier ones)
	TrainSeconds      float64 `json:"train_seconds"` // this run's
	WallSeconds       float64 `json:"wall_seconds"`
	PeakAllocated     int64   `json:"peak_allocated"` // by the training steps
	PeakReserved      int64   `json:"peak_reserved"`
	EvalPeakAllocated int64   `json:"eval_peak_allocated"`
}

// Diverged says where a run diverged (see DivergedError).
type Diverged struct {
	Epoch int    `json:"epoch"` // from 1
	Step  int    `json:"step"`
	Why   string `json:"why"`
}

// Report is what a run did, as cmd/train's -json writes it: always valid
// JSON, also for a run that failed (Error) or diverged (Diverged); numbers
// that are not finite are null.
type Report struct {
	Config        Config            `json:"config"`
	Device        string            `json:"device"`
	Dataset       string            `json:"dataset"`
	DataDir       string            `json:"data_dir,omitempty"` // the folder the dataset was read from
	TrainImages   int               `json:"train_images"`
	TestImages    int               `json:"test_images"`
	Budget        *BudgetChoice     `json:"budget,omitempty"`
	Measured      []Measurement     `json:"measured_step_peaks,omitempty"`
	ResumeChanges []string          `json:"resume_changes,omitempty"`
	Epochs        []EpochMetrics    `json:"epochs"`
	Final         *Final            `json:"final,omitempty"`
	OOM           OOMReport         `json:"out_of_memory"`
	Empty         EmptyCacheReport  `json:"empty_cache"`
	Stats         memory.Stats      `json:"pool_stats"`
	DataParallel  *DataParallel     `json:"data_parallel,omitempty"`
	Error         string            `json:"error,omitempty"`
	Diverged      *Diverged         `json:"diverged,omitempty"`
	Memory        []MemSample       `json:"-"` // the pool after every step
	Title         string            `json:"-"` // "resnet20, amp+checkpoint, batch 128 on cuda:0"
	summary       func(w io.Writer) // the end-of-run lines, while the trainer was alive
}

// DataParallel is what a data-parallel run's report adds: the job, its
// gradient reduction and every rank's memory.
type DataParallel struct {
	Ranks       int    `json:"ranks"`
	Collectives string `json:"collectives"` // "nccl 2.28.3" or "tcp"
	Buckets     int    `json:"buckets"`
	BucketBytes int64  `json:"bucket_bytes"` // the gradients' buckets, memory each rank adds for them
	// AllReduceSeconds is one all-reduce of all the buckets, measured
	// before training with the device synchronised around it: what a step
	// would spend reducing if nothing overlapped it.
	AllReduceSeconds float64 `json:"all_reduce_seconds"`
	// Overlapped says whether the steps' all-reduces overlapped their
	// backward (dist.Reducer); NotOverlapped says why not.
	Overlapped    bool       `json:"overlapped"`
	NotOverlapped string     `json:"not_overlapped,omitempty"`
	PerRank       []RankPeak `json:"per_rank,omitempty"`
}

// RankPeak is one rank's memory over the run.
type RankPeak struct {
	Rank              int   `json:"rank"`
	PeakAllocated     int64 `json:"peak_allocated"`
	PeakReserved      int64 `json:"peak_reserved"`
	EvalPeakAllocated int64 `json:"eval_peak_allocated"`
}

// WriteSummary writes the end of a finished run's report: accuracy,
// throughput, the peaks, the plan, the step's notes and the pool's summary.
func (r *Report) WriteSummary(w io.Writer) {
	if r.summary != nil {
		r.summary(w)
	}
}

// Run trains job.Config's model on dev and reports what happened. The
// report is returned also with an error, saying as much as the run got to.
func Run(dev *tensor.Device, job Job) (report *Report, err error) {
	say := job.Log
	if say == nil {
		say = io.Discard
	}
	cfg, trainSet, testSet := job.Config, job.Train, job.Test
	report = &Report{Config: cfg, Device: dev.Name(), Dataset: trainSet.Name, DataDir: trainSet.Dir, TrainImages: trainSet.N, TestImages: testSet.N}
	defer func() {
		report.Stats = dev.Allocator().Stats()
		if err != nil {
			report.Error = err.Error()
			var d *DivergedError
			if errors.As(err, &d) {
				report.Diverged = &Diverged{Epoch: d.Epoch + 1, Step: d.Step, Why: d.Why}
			}
		}
	}()
	build := func() nn.Module {
		m, err := BuildModel(dev, cfg.Model, trainSet.C, trainSet.H, trainSet.W, trainSet.Classes, cfg.Seed)
		if err != nil {
			panic(err) // the name was checked first
		}
		return m
	}
	if err := CheckModel(cfg.Model); err != nil {
		return report, err
	}
	resnet := cfg.Model != "mlp" // has residual blocks to checkpoint

	mean, std := trainSet.MeanStd()
	lc := datasets.LoaderConfig{Batch: cfg.Batch, Shuffle: true, Seed: cfg.Seed, Mean: mean, Std: std}
	if job.Augment && resnet {
		lc.CropPad, lc.Flip = 2, true
		if trainSet.H >= 32 {
			lc.CropPad = 4
		}
	}
	tc := datasets.LoaderConfig{Batch: 500, Mean: mean, Std: std}
	if g := job.Group; g != nil {
		lc.Rank, lc.Ranks, lc.EvenShards = g.Rank(), g.Size(), true
		tc.Rank, tc.Ranks = g.Rank(), g.Size()
	}
	trainL := datasets.NewLoader(trainSet, dev, lc)
	testL := datasets.NewLoader(testSet, dev, tc)

	planned := cfg.Capture && dev.Name() != "cpu"
	micro := 0
	if job.MaxMemory > 0 {
		var choice BudgetChoice
		withFirstBatch(dev, trainL, func(x, y *tensor.Tensor) {
			choice, err = FitBudget(say, dev, build, cfg, BudgetVariants(resnet, job.Allow), x, y, planned, job.MaxMemory)
		})
		report.Budget = &choice
		if err != nil {
			return report, err
		}
		cfg.AMP, cfg.Checkpoint, micro = choice.Chosen.AMP, choice.Chosen.Checkpoint, choice.Chosen.MicroBatch
		report.Config = cfg
		fmt.Fprintf(say, "chose %s: the pool is capped at %s\n", choice.Chosen.Name, memory.Bytes(job.MaxMemory))
		if micro > 0 {
			fmt.Fprintf(say, "  with micro-batches of %d: each batch of %d accumulates their gradients before one update; batch norm normalises each micro-batch on its own\n", micro, cfg.Batch)
		}
	}
	chosen := VariantName(cfg.AMP, cfg.Checkpoint)
	if job.Measure {
		fmt.Fprintf(say, "memory of one training step of %s on a batch of %d, measured by the pool:\n", cfg.Model, cfg.Batch)
		withFirstBatch(dev, trainL, func(x, y *tensor.Tensor) {
			for _, v := range Variants(job.CheckpointMode) {
				if !resnet && v.Checkpoint != "none" {
					continue
				}
				var m Measurement
				if m, err = MeasureStep(dev, build, cfg, v, x, y, planned); err != nil {
					return
				}
				report.Measured = append(report.Measured, m)
			}
		})
		if err != nil {
			return report, err
		}
		WriteSavings(say, report.Measured, chosen)
	}

	model := build()
	defer nn.Release(model)
	t, err := New(model, dev, cfg, trainL.Len())
	if err != nil {
		return report, err
	}
	defer t.Release()
	if err := t.Step.SetMicroBatch(micro); err != nil {
		return report, err
	}
	if g := job.Group; g != nil {
		if err := t.SetGroup(g); err != nil {
			return report, err
		}
		r := t.Step.Reducer()
		d, err := g.TimeAllReduce(r.Bytes(), 20)
		if err != nil {
			return report, err
		}
		report.DataParallel = &DataParallel{Ranks: g.Size(), Collectives: g.Backend(), Buckets: r.Buckets(),
			BucketBytes: r.Bytes(), AllReduceSeconds: d.Seconds()}
		fmt.Fprintf(say, "data parallel: %d ranks over %s, batch %d per rank (%d in all); the gradients take %s (%s), all-reduced in %.3f ms\n",
			g.Size(), g.Backend(), cfg.Batch, cfg.Batch*g.Size(), buckets(r.Buckets()), memory.Bytes(r.Bytes()), 1e3*d.Seconds())
	}
	if job.Resume != "" {
		changed, err := t.Resume(job.Resume, job.ResumeForce)
		if err != nil {
			return report, err
		}
		report.ResumeChanges = changed
		fmt.Fprintf(say, "resumed from %s at epoch %d\n", job.Resume, t.Epoch+1)
		for _, c := range changed {
			fmt.Fprintf(say, "  changed since the checkpoint (-resume-force): %s\n", c)
		}
	}
	resumedEpochs := len(t.History)
	a := dev.Allocator()
	a.EmptyCache() // what the measurements cached is not the run's
	a.ResetPeak()  // the summary's peaks are the training run's, not the measurements'
	if job.MaxMemory > 0 {
		if err := a.SetLimit(job.MaxMemory); err != nil {
			return report, err
		}
	}
	a.RecordTimeline(job.RecordTimeline)
	if job.RecordHistory {
		a.RecordHistory(true)
	}
	fmt.Fprintf(say, "training %s (%d parameters) on %d images, %d epochs of %d steps, %s, %s steps\n",
		cfg.Model, nn.CountParams(model), trainSet.N, cfg.Epochs, trainL.Len(), chosen, t.Step.Mode)
	report.Title = fmt.Sprintf("%s, %s, batch %d on %s", cfg.Model, chosen, cfg.Batch, dev.Name())
	if g := job.Group; g != nil {
		report.Title = fmt.Sprintf("%s, %s, batch %d per rank on %d ranks", cfg.Model, chosen, cfg.Batch, g.Size())
	}
	start := time.Now()
	err = t.Fit(trainL, testL, job.Progress, job.Save)
	wall := time.Since(start)
	a.RecordTimeline(false)
	report.Epochs, report.Empty, report.OOM, report.Memory = t.History, t.Empty, t.OOM, t.Memory
	for _, e := range t.OOM.Events {
		fmt.Fprintf(say, "out of memory: %s\n", e)
	}
	if err != nil {
		return report, err
	}

	// The figures: of this run's epochs (a resumed run's earlier ones ran before).
	var imgs, secs float64
	for _, m := range t.History[resumedEpochs:] {
		secs += float64(m.Seconds)
		imgs += float64(m.ImgPerSec) * float64(m.Seconds)
	}
	last := t.History[len(t.History)-1]
	peakA, peakR := t.Peaks()
	report.Final = &Final{TestAcc: last.TestAcc, TestLoss: last.TestLoss, ImgPerSec: Float(imgs / secs), TrainSeconds: secs,
		WallSeconds: wall.Seconds(), PeakAllocated: peakA, PeakReserved: peakR, EvalPeakAllocated: t.EvalPeak()}

	// The end-of-run lines need the trainer's plan and notes: written now.
	var lines []string
	add := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	add("\ntest accuracy  %.2f%% (loss %.4f) after %d epochs", 100*last.TestAcc, last.TestLoss, len(t.History))
	if secs > 0 {
		add("throughput     %.0f img/s over this run's training steps (%.1f s), %.1f s in all with evaluation", imgs/secs, secs, wall.Seconds())
	}
	line := "peak allocated " + memory.Bytes(peakA).String() + " by the training steps"
	for _, m := range report.Measured {
		if m.Name == "fp32" && chosen != "fp32" {
			line += fmt.Sprintf(" (fp32: %s, %s)", memory.Bytes(m.PeakAllocated), Percent(peakA, m.PeakAllocated))
		}
	}
	add("%s", line)
	add("peak reserved  %s by the training steps", memory.Bytes(peakR))
	if g, dp := job.Group, report.DataParallel; g != nil {
		all, err := g.Gather([]float64{float64(peakA), float64(peakR), float64(t.EvalPeak())})
		if err != nil {
			return report, err
		}
		dp.Overlapped, dp.NotOverlapped = t.Step.Reducer().Overlap()
		how := "overlapping the backward"
		if !dp.Overlapped {
			how = "after the backward: " + dp.NotOverlapped
		}
		add("data parallel  %d ranks over %s: the gradients' %s (%s) take %.3f ms to all-reduce, %s",
			dp.Ranks, dp.Collectives, buckets(dp.Buckets), memory.Bytes(dp.BucketBytes), 1e3*dp.AllReduceSeconds, how)
		for r, v := range all {
			p := RankPeak{Rank: r, PeakAllocated: int64(v[0]), PeakReserved: int64(v[1]), EvalPeakAllocated: int64(v[2])}
			dp.PerRank = append(dp.PerRank, p)
			add("  rank %d       peak allocated %s, reserved %s by the training steps; evaluation %s",
				r, memory.Bytes(p.PeakAllocated), memory.Bytes(p.PeakReserved), memory.Bytes(p.EvalPeakAllocated))
		}
	}
	evalBatch := fmt.Sprintf("batches of %d", min(testL.BatchShape()[0], testSet.N))
	if c := t.EvalChunk(); c > 0 {
		evalBatch += fmt.Sprintf(", run %d examples at a time since the device ran out of memory", c)
	}
	add("evaluation     peak allocated %s (%s; no gradients)", memory.Bytes(t.EvalPeak()), evalBatch)
	if p := t.Step.Plan(trainL.BatchShape(), trainL.BatchShape()[:1]); p != nil {
		add("planned step   this step needs an arena of %s (%s live at its peak; placed by %s order), on top of the parameters and optimiser state",
			memory.Bytes(p.Size), memory.Bytes(p.Live), p.Order)
	}
	for _, n := range t.Step.Notes() {
		add("step           %s", n)
	}
	if free, total := dev.MemInfo(); dev.Name() != "cpu" {
		add("device memory  %s free of %s (the driver's view)", memory.Bytes(free), memory.Bytes(total))
	}
	if cfg.EmptyCacheEvery > 0 {
		add("EmptyCache every %d steps: %d calls, %s returned to the device in all, %.3f s inside EmptyCache",
			cfg.EmptyCacheEvery, t.Empty.Calls, memory.Bytes(t.Empty.Released), t.Empty.Seconds)
	}
	add("the pool's summary below covers training and evaluation since the measurements:")
	summary := a.Summary()
	report.summary = func(w io.Writer) {
		for _, l := range lines {
			fmt.Fprintln(w, l)
		}
		fmt.Fprint(w, summary)
	}
	return report, nil
}

// buckets is "1 bucket" or "n buckets".
func buckets(n int) string {
	if n == 1 {
		return "1 bucket"
	}
	return fmt.Sprintf("%d buckets", n)
}

// withFirstBatch calls f with the loader's first batch, made on dev.
func withFirstBatch(dev *tensor.Device, l *datasets.Loader, f func(x, y *tensor.Tensor)) {
	dev.WithScope(func() {
		ep := l.Epoch(0)
		x, y, _ := ep.Next()
		ep.Close()
		f(x, y)
	})
}
