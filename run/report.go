package run

import (
	"fmt"
	"image/color"
	"io"
	"path/filepath"
	"slices"
	"strings"

	"github.com/leangrad/leangrad/fileio"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/train"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Final is a finished run's figures.
type Final struct {
	TestAcc           train.Float `json:"test_acc"`
	TestLoss          train.Float `json:"test_loss"`
	ImgPerSec         train.Float `json:"img_per_sec"`              // examples (images, windows) per second of this run's training steps (not a resumed run's earlier ones)
	TokensPerSec      train.Float `json:"tokens_per_sec,omitempty"` // a language model's
	TrainSeconds      float64     `json:"train_seconds"`            // this run's
	WallSeconds       float64     `json:"wall_seconds"`
	PeakAllocated     int64       `json:"peak_allocated"` // by the training steps
	PeakReserved      int64       `json:"peak_reserved"`
	EvalPeakAllocated int64       `json:"eval_peak_allocated"`
	// HostOptimizerBytes is the host memory an offloaded optimizer held
	// (train.Config.OffloadOptimizer), and HostStepSeconds its update's
	// mean time a step after the backward, over the steps after the first
	// (which makes the state): the gradients not yet down, the update,
	// parameters up; HostGradsOverlapped is the share of the
	// gradients' bytes that began to come down during the backward;
	// HostOptimizerPinnedBytes is the part of it in page-locked memory.
	HostOptimizerBytes  int64   `json:"host_optimizer_bytes,omitempty"`
	HostStepSeconds     float64 `json:"host_step_seconds,omitempty"`
	HostGradsOverlapped float64 `json:"host_grads_overlapped,omitempty"`
	// HostUpdatedInBackward is the share of the parameters' bytes the host
	// updated during the backward (no clipping, no loss scaling).
	HostUpdatedInBackward    float64 `json:"host_updated_in_backward,omitempty"`
	HostOptimizerPinnedBytes int64   `json:"host_optimizer_pinned_bytes,omitempty"`
	// DeviceOptimizerBytes is the offloaded optimizer's state kept on the
	// device (train.Config.DeviceState).
	DeviceOptimizerBytes int64 `json:"device_optimizer_bytes,omitempty"`
	// HostActivationBytes is the most host memory one forward's
	// checkpointed blocks kept there (train.Config.OffloadActivations).
	HostActivationBytes int64 `json:"host_activation_bytes,omitempty"`
	// HostActivationHeldBytes is the page-locked memory held for those
	// copies (autograd.Offloader.HostBytes).
	HostActivationHeldBytes int64 `json:"host_activation_held_bytes,omitempty"`
}

// Diverged says where a run diverged (see train.DivergedError).
type Diverged struct {
	Epoch int    `json:"epoch"` // from 1
	Step  int    `json:"step"`
	Why   string `json:"why"`
}

// Report is what a run did, as cmd/train's -json writes it: always valid
// JSON, also for a run that failed (Error) or diverged (Diverged); numbers
// that are not finite are null.
type Report struct {
	Config        train.Config           `json:"config"`
	Device        string                 `json:"device"`
	Dataset       string                 `json:"dataset"`
	DataDir       string                 `json:"data_dir,omitempty"` // the folder the dataset was read from
	TrainImages   int                    `json:"train_images,omitempty"`
	TestImages    int                    `json:"test_images,omitempty"`
	Tokenizer     string                 `json:"tokenizer,omitempty"` // a language model's corpus: its tokenizer and split
	TrainTokens   int                    `json:"train_tokens,omitempty"`
	ValTokens     int                    `json:"val_tokens,omitempty"`
	Sample        *Sample                `json:"sample,omitempty"`
	Budget        *train.BudgetChoice    `json:"budget,omitempty"`
	Measured      []train.Measurement    `json:"measured_step_peaks,omitempty"`
	ResumeChanges []string               `json:"resume_changes,omitempty"`
	Epochs        []train.EpochMetrics   `json:"epochs"`
	Final         *Final                 `json:"final,omitempty"`
	OOM           train.OOMReport        `json:"out_of_memory"`
	Empty         train.EmptyCacheReport `json:"empty_cache"`
	Stats         memory.Stats           `json:"pool_stats"`
	DataParallel  *DataParallel          `json:"data_parallel,omitempty"`
	Error         string                 `json:"error,omitempty"`
	Diverged      *Diverged              `json:"diverged,omitempty"`
	Interrupted   *Interrupted           `json:"interrupted,omitempty"`
	// Unverified says the checkpoint resumed carried no checksums.
	Unverified bool              `json:"resumed_unverified,omitempty"`
	Memory     []train.MemSample `json:"-"` // the pool after every step
	Title      string            `json:"-"` // "resnet20, amp+checkpoint, batch 128 on cuda:0"
	summary    func(w io.Writer) // the end-of-run lines, while the trainer was alive
}

// Interrupted says where a run stopped when asked to (Job.Stop; see
// train.InterruptedError).
type Interrupted struct {
	Epoch int    `json:"epoch"` // from 1
	Batch int    `json:"batch"` // batches of it done (0: it stopped before it)
	Step  int    `json:"step"`
	Saved string `json:"saved,omitempty"` // the checkpoint that holds the run there
}

// Sample is text a language model generated at the end of its run.
type Sample struct {
	Prompt      string  `json:"prompt"`
	Text        string  `json:"text"` // what followed the prompt
	Tokens      int     `json:"tokens"`
	Temperature float64 `json:"temperature"`
	TopK        int     `json:"top_k"`
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
	// Sharded says the optimiser's state was sharded over the ranks
	// (each rank's is in PerRank).
	Sharded bool `json:"sharded,omitempty"`
}

// RankPeak is one rank's memory over the run.
type RankPeak struct {
	Rank              int   `json:"rank"`
	PeakAllocated     int64 `json:"peak_allocated"`
	PeakReserved      int64 `json:"peak_reserved"`
	EvalPeakAllocated int64 `json:"eval_peak_allocated"`
	// OptimizerStateBytes is the optimiser's state on the rank's device.
	OptimizerStateBytes int64 `json:"optimizer_state_bytes"`
}

// WriteSummary writes the end of a finished run's report: accuracy,
// throughput, the peaks, the plan, the step's notes and the pool's summary.
func (r *Report) WriteSummary(w io.Writer) {
	if r.summary != nil {
		r.summary(w)
	}
}

// Percent formats the change from base to v: "-63%".
func Percent(v, base int64) string {
	if base == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%+.0f%%", 100*(float64(v)/float64(base)-1))
}

// WriteSavings prints the measured one-step peaks of the variants, marking
// the one chosen: an eager step's, and a planned step's where it was
// planned; and what each costs, its step's time where it was timed.
func WriteSavings(w io.Writer, ms []train.Measurement, chosen string) {
	var fp32, fp32Planned int64
	var fp32Seconds float64
	for _, m := range ms {
		if m.Name == "fp32" {
			fp32, fp32Planned, fp32Seconds = m.PeakAllocated, m.Planned, m.StepSeconds
		}
	}
	width := 15
	for _, m := range ms {
		width = max(width, len(m.Name))
	}
	for _, m := range ms {
		mark := ""
		if m.Name == chosen {
			mark = "  <- this run"
		}
		vs := ""
		if m.Name != "fp32" && fp32 > 0 { // none measured for BF16 working weights
			vs = fmt.Sprintf("  (%s vs fp32)", Percent(m.PeakAllocated, fp32))
		}
		line := fmt.Sprintf("  %-*s %10s%-17s", width, m.Name, memory.Bytes(m.PeakAllocated), vs)
		if m.Planned > 0 {
			pvs := ""
			if m.Name != "fp32" && fp32Planned > 0 {
				pvs = fmt.Sprintf(" (%s)", Percent(m.Planned, fp32Planned))
			}
			line += fmt.Sprintf("  planned %10s%s", memory.Bytes(m.Planned), pvs)
		}
		if m.StepSeconds > 0 {
			tvs := ""
			if m.Name != "fp32" && fp32Seconds > 0 {
				tvs = fmt.Sprintf(" (%+.0f%%)", 100*(m.StepSeconds/fp32Seconds-1))
			}
			line += fmt.Sprintf("  step %9s%s", stepTime(m.StepSeconds), tvs)
		}
		fmt.Fprintf(w, "%s%s\n", strings.TrimRight(line, " "), mark)
	}
}

// WriteHoldings writes what a measured step held at the end of its forward
// and at its peak (and, planned, at its arena's peak), by kind, and the
// operations whose saved tensors take the most.
func WriteHoldings(w io.Writer, m train.Measurement) {
	if h := m.Holds; h != nil {
		fmt.Fprintf(w, "what the %s step holds at the end of its forward, %s in all (its peak %s more):\n",
			m.Name, memory.Bytes(h.Allocated), memory.Bytes(h.Backward))
		writeKinds(w, h)
	}
	if h := m.Peak; h != nil {
		fmt.Fprintf(w, "at its peak, %s, during %s:\n", memory.Bytes(h.Allocated), orUnknown(h.Phase))
		writeKinds(w, h)
	}
	if h := m.PlannedPeak; h != nil {
		fmt.Fprintf(w, "planned, %s at the arena's peak, during %s:\n", memory.Bytes(h.Allocated), orUnknown(h.Phase))
		writeKinds(w, h)
	}
}

func orUnknown(phase string) string {
	if phase == "" {
		return "the step"
	}
	return phase
}

// writeKinds writes a breakdown's kinds and what saved the most.
func writeKinds(w io.Writer, h *train.Breakdown) {
	fmt.Fprintf(w, "  %s\n", h.Kinds())
	if by := h.SavedBy(6); by != "" {
		fmt.Fprintf(w, "  saved by: %s\n", by)
	}
}

// PlotFormats are the file types PlotMemory (and the harness's plots)
// write, by extension.
var PlotFormats = []string{"png", "svg", "pdf"}

// PlotFile is a path PlotMemory can write: its extension one of
// PlotFormats. It is a flag.Value: Set refuses any other path.
type PlotFile string

// Set checks s's extension.
func (p *PlotFile) Set(s string) error {
	ext := strings.ToLower(strings.TrimPrefix(filepath.Ext(s), "."))
	if !slices.Contains(PlotFormats, ext) {
		return fmt.Errorf("plot file %q: want a .%s or .%s file", s, strings.Join(PlotFormats[:len(PlotFormats)-1], ", ."), PlotFormats[len(PlotFormats)-1])
	}
	*p = PlotFile(s)
	return nil
}

func (p PlotFile) String() string { return string(p) }

// PlotMemory draws allocated, reserved and each step's peak allocated bytes
// over the run's steps, as a PNG (or SVG, PDF by path's extension), written
// atomically.
func PlotMemory(samples []train.MemSample, title, path string) error {
	if len(samples) == 0 {
		return fmt.Errorf("no memory samples to plot")
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "step"
	p.Y.Label.Text = "MiB"
	series := func(f func(train.MemSample) int64) plotter.XYs {
		xy := make(plotter.XYs, len(samples))
		for i, s := range samples {
			xy[i].X, xy[i].Y = float64(s.Step), memory.Bytes(f(s)).MiB()
		}
		return xy
	}
	lines := []struct {
		name string
		f    func(train.MemSample) int64
	}{
		{"peak allocated within the step", func(s train.MemSample) int64 { return s.PeakAllocated }},
		{"reserved (segments held)", func(s train.MemSample) int64 { return s.Reserved }},
		{"allocated after the step", func(s train.MemSample) int64 { return s.Allocated }},
	}
	top := 0.0
	for i, l := range lines {
		xy := series(l.f)
		line, err := plotter.NewLine(xy)
		if err != nil {
			return err
		}
		line.Color = plotColors[i]
		line.Width = vg.Points(1.2)
		p.Add(line)
		p.Legend.Add(l.name, line)
		for _, v := range xy {
			top = max(top, v.Y)
		}
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Y.Min = 0
	p.Y.Max = top * (1 + 0.09*float64(len(lines)) + 0.05) // the legend above the lines, not over them
	format := "png"
	if i := strings.LastIndexByte(path, '.'); i >= 0 {
		format = strings.ToLower(path[i+1:])
	}
	wt, err := p.WriterTo(8*vg.Inch, 4*vg.Inch, format)
	if err != nil {
		return err
	}
	return fileio.Write(path, func(w io.Writer) error {
		_, err := wt.WriteTo(w)
		return err
	})
}

var plotColors = []color.Color{
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
}

// stepTime is a step's time to three figures: "12.3 ms", "2.07 s".
func stepTime(seconds float64) string {
	if seconds >= 1 {
		return fmt.Sprintf("%.3g s", seconds)
	}
	return fmt.Sprintf("%.3g ms", 1000*seconds)
}
