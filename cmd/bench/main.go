// Command bench runs leangrad's benchmark harness: every model, batch size
// and memory configuration on one device (on a GPU both the captured step
// the trainer runs and the eager one), the seed-claims suite, and PyTorch's
// reference script on the same device (on a GPU eager and torch.compile for
// -compile-configs; on the CPU eager, with as many threads as leangrad's
// goroutines, after the SGEMM figures), then writes bench.json, bench.md (the side-by-side
// table with leangrad/PyTorch ratios) and PNG plots (step time, peak
// memory, and a memory timeline of one step per configuration) into -out.
//
//	bench -device cuda -out results
//	bench -device cpu -specs mlp:32 -steps 3 -pytorch "" -claims=false -out /tmp/b
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/leangrad/leangrad/benchmarks"
	"github.com/leangrad/leangrad/cmd/internal/cmdenv"
	"github.com/leangrad/leangrad/cmd/internal/iopaths"
	"github.com/leangrad/leangrad/cmd/internal/launch"
	"github.com/leangrad/leangrad/fileio"
	"github.com/leangrad/leangrad/kernels/cuda"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
	"github.com/leangrad/leangrad/train"
)

func main() {
	cmdenv.Setup()
	os.Exit(cmdenv.Main("bench", func() int { return run(os.Args[1:], os.Stdout, os.Stderr) }))
}

type options struct {
	set                                        map[string]bool    // the flags given
	interrupts                                 *cmdenv.Interrupts // SIGINT and SIGTERM
	device                                     tensor.DeviceSpec
	ampDType                                   train.AMP
	specs, configs, pytorch, python, out, date string
	compileConfigs, commit, cpuprofile, merge  string
	largestBatch                               string
	largestModel                               string
	vocab                                      int
	planRoom                                   float64
	planTolerance, profileShare                float64
	micro, lean, eager, profile                bool
	warmup, steps, rounds                      int
	claims                                     bool
	seed                                       uint64
	nproc                                      int
	overlap, shardOptimizer                    bool
	matmulF32                                  tensor.F32Matmul
	distTimeout                                time.Duration
}

// hasBlocks says whether a model (known to the registry) has blocks to checkpoint.
func hasBlocks(model string) bool {
	a, _ := train.LookupArch(model)
	return a.Blocks > 0
}

// spec is a model with its batch sizes.
type spec struct {
	model   string
	batches []int
}

// hasText says whether a language model is among specs.
func hasText(specs []spec) bool {
	for _, sp := range specs {
		if a, err := train.LookupArch(sp.model); err == nil && a.Text {
			return true
		}
	}
	return false
}

// parseSpecs reads -specs: model:batch[,batch] specs, apart by spaces,
// semicolons or commas ("resnet20:256,1024 mlp:64" and "mlp:64,resnet20:32"
// both name two models).
func parseSpecs(s string) ([]spec, error) {
	var out []spec
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == ';' || r == ',' }) {
		name, b, ok := strings.Cut(f, ":")
		if !ok {
			if len(out) == 0 {
				return nil, fmt.Errorf("-specs %q: want model:batch[,batch], with model %s", f, train.ModelNames)
			}
			b = f // another batch of the spec before
		} else {
			if _, err := train.LookupArch(name); err != nil {
				return nil, fmt.Errorf("-specs %q: %v", f, err)
			}
			out = append(out, spec{model: name})
		}
		n, err := strconv.Atoi(b)
		if err != nil || n < 1 || n > maxSpecBatch {
			return nil, fmt.Errorf("-specs %q: batch %q: want a number of examples from 1 to %d", f, b, maxSpecBatch)
		}
		sp := &out[len(out)-1]
		sp.batches = append(sp.batches, n)
	}
	if len(out) == 0 {
		return nil, errors.New("-specs is empty")
	}
	return out, nil
}

// maxSpecBatch bounds a spec's batch: 2^20 examples, far past any
// device's memory for every model here (a GPT's are windows of its
// context), and far below what the harness's random batches can count.
const maxSpecBatch = 1 << 20

func run(args []string, stdout, stderr io.Writer) int {
	o := options{device: "auto", ampDType: train.AMPF16}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Var(&o.device, "device", "device: "+tensor.DeviceSpecs)
	fs.StringVar(&o.specs, "specs", "resnet20:256,1024 resnet18:256 mlp:256", "models and batch sizes: model:batch[,batch] ... (\"\" with -largest-model or -largest-batch: only that search)")
	fs.StringVar(&o.configs, "configs", "fp32,amp,checkpoint,amp+checkpoint", "memory configurations, comma separated: "+strings.Join(benchmarks.ConfigNames(), ", ")+" (amp: in -amp-dtype; the others named by a dtype, in that dtype)")
	fs.TextVar(&o.ampDType, "amp-dtype", o.ampDType, "what the amp configurations (and -largest-batch's AMP) compute in: "+train.AMPDTypes)
	fs.Float64Var(&o.planRoom, "plan-room", -1, "planned and captured steps: how far convolution workspaces may raise the arena above the other buffers' extent, as a fraction (-1: the default, "+
		fmt.Sprint(memory.DefaultPlanOptions.MaxSlack)+", within "+fmt.Sprint(memory.DefaultPlanOptions.TimeTolerance*100)+"% of the fastest algorithms)")
	fs.Float64Var(&o.planTolerance, "plan-tolerance", -1, "planned and captured steps: how much longer, as a fraction, the convolutions' algorithms may take than the fastest's when their workspaces make the arena smaller (-1: the default, "+
		fmt.Sprint(memory.DefaultPlanOptions.TimeTolerance)+")")
	fs.IntVar(&o.vocab, "vocab", 0, "language models: this vocabulary instead of the preset's (50304: GPT-2's padded to a multiple of 64, as nanoGPT trains it; 0: the preset's)")
	fs.StringVar(&o.largestModel, "largest-model", "", "GIB or GIB:CONTEXT:BATCH:MODEL,... (24, or 0.25:32:2:gpt-mini,gpt-small): also find the largest language model that trains with the pool capped at GIB GiB, in bf16 with checkpointed blocks, its optimizer and then its activations in host memory where it needs (a seed claim; default: the GPT family from gpt2 to gpt3-6.7b in batches of 8 × 1024 tokens)")
	fs.StringVar(&o.largestBatch, "largest-batch", "", "MODEL:CONTEXT:GIB (gpt2:512:24): also find the largest batch that trains in fp32 and with AMP with the pool capped at GIB GiB (a seed claim)")
	fs.IntVar(&o.warmup, "warmup", 5, "untimed steps before timing")
	fs.IntVar(&o.steps, "steps", 30, "timed steps (the median is reported)")
	fs.IntVar(&o.rounds, "rounds", 1, "time leangrad and PyTorch this many times each, alternating which runs first (and the order of the configurations); each result is its median round, and notes give the ratios to PyTorch and to fp32 round by round")
	fs.StringVar(&o.pytorch, "pytorch", "benchmarks/pytorch/ref.py", `PyTorch reference script ("" to skip)`)
	fs.StringVar(&o.python, "python", "python3", "Python interpreter with PyTorch")
	fs.BoolVar(&o.claims, "claims", true, "run the seed-claims suite")
	fs.StringVar(&o.out, "out", "bench-results", "folder for bench.json, bench.md and the plots")
	fs.StringVar(&o.date, "date", time.Now().UTC().Format("2006-01-02"), "date written into the report")
	fs.Uint64Var(&o.seed, "seed", 1, "random seed")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a Go CPU profile of the leangrad benchmarks (the first round's, and -largest-model's and -largest-batch's searches) to this file")
	fs.BoolVar(&o.micro, "micro", false, "also time the host cost of single operations (launch, tensor, recorded op)")
	fs.StringVar(&o.merge, "merge", "", "render the report (bench.json, bench.md, plots) into -out from these bench.json files, comma separated, instead of running")
	fs.BoolVar(&o.profile, "profile", false, "also report each kind of operation's time per eager step, for every spec (device time on a GPU, host time on the CPU)")
	fs.Float64Var(&o.profileShare, "profile-share", 1, "with -profile, list the kinds of operation taking at least this `percent` of the step, and the rest as one sum")
	fs.BoolVar(&o.lean, "lean", false, "on a GPU, also run the eager step with lean convolution workspaces (engine leangrad-lean)")
	fs.BoolVar(&o.eager, "eager", true, "on a GPU, also run the eager step beside the captured one (engine leangrad-eager)")
	fs.StringVar(&o.compileConfigs, "compile-configs", "fp32,amp", `configurations PyTorch also runs under torch.compile (mode "reduce-overhead"; a language model's default) ("" for none)`)
	fs.BoolVar(&o.shardOptimizer, "shard-optimizer", false, "with -nproc: shard the optimizer state over the ranks (ZeRO stage 1)")
	fs.BoolVar(&o.overlap, "overlap", true, "with -nproc: overlap the gradients' all-reduce with the backward (false: all-reduce after it, to measure the difference)")
	fs.IntVar(&o.nproc, "nproc", 1, "data parallelism: start N ranks of this command, one per GPU, and time the data-parallel step of every spec and configuration (leangrad only; batch per rank); writes ddp.json")
	fs.DurationVar(&o.distTimeout, "dist-timeout", 10*time.Minute, "data-parallel runs: how long a rank waits for the others")
	fs.TextVar(&o.matmulF32, "matmul-f32", tensor.F32TF32x3, "on a GPU, how leangrad multiplies F32 matrices: tf32x3 (three TF32 tensor-core products, at F32's accuracy), strict (F32 on the FMA units, PyTorch's default, which the PyTorch runs keep) or tf32")
	fs.StringVar(&o.commit, "commit", buildCommit(), "leangrad's commit, written into the report (default: the one the binary was built from)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: bench [flags]\n\nRuns leangrad's benchmark harness beside PyTorch and writes bench.json, bench.md and plots into -out.\n%s\nFlags:\n", cmdenv.ExitStatuses("after writing the report of what was measured", map[int]string{cmdenv.ExitFailed: "", cmdenv.ExitNothingRan: "nothing ran (the device could not be opened)"}))
		fs.PrintDefaults()
	}
	problems, refused, err := cmdenv.ParseFlags(fs, args)
	if err != nil {
		return 0 // -h
	}
	o.set = cmdenv.Given(fs)
	specs, more := o.check(fs)
	problems = append(problems, cmdenv.Unsaid(more, refused)...)
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintf(stderr, "bench: %s\n", p)
		}
		return cmdenv.ExitUsage
	}
	if o.merge != "" {
		if err := merge(o, stdout, stderr); err != nil {
			fmt.Fprintf(stderr, "bench: %v\n", err)
			return cmdenv.ExitFailed
		}
		return 0
	}
	if o.nproc > 1 {
		return launch.Run(o.nproc, launch.WithoutFlag(args, "nproc"), stdout, stderr)
	}
	place, ok, err := cmdenv.Job()
	if err != nil {
		fmt.Fprintf(stderr, "bench: data-parallel job: %v\n", err)
		return cmdenv.ExitUsage
	}
	if ok {
		place.Timeout = o.distTimeout
		if err := dataParallel(o, specs, &place, stdout, stderr); err != nil {
			fmt.Fprintf(stderr, "bench: rank %d: %v\n", place.Rank, err)
			return cmdenv.ExitFailed
		}
		return 0
	}
	if o.shardOptimizer {
		fmt.Fprintln(stderr, "bench: -shard-optimizer: not a data-parallel job (start one with -nproc N, or under torchrun)")
		return cmdenv.ExitUsage
	}
	interrupts := cmdenv.CatchInterrupts("bench", "after the measurement under way, keeping the results so far", stderr)
	defer interrupts.Release()
	o.interrupts = interrupts
	if err := bench(o, specs, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		if errors.Is(err, train.ErrInterrupted) {
			return cmdenv.ExitSignal(interrupts.Signal())
		}
		var nr nothingRan
		if errors.As(err, &nr) {
			return cmdenv.ExitNothingRan
		}
		return cmdenv.ExitFailed
	}
	return 0
}

// largestBatch is -largest-batch: a model, a context and a cap.
type largestBatch struct {
	model   string
	context int
	bytes   int64
}

func parseLargestBatch(s string) (largestBatch, error) {
	var lb largestBatch
	var gib float64
	if _, err := fmt.Sscanf(strings.ReplaceAll(s, ":", " "), "%s %d %g", &lb.model, &lb.context, &gib); err != nil || gib <= 0 || lb.context < 1 {
		return lb, errors.New("want MODEL:CONTEXT:GIB, as gpt2:512:24")
	}
	if err := languageModel(lb.model); err != nil {
		return lb, err
	}
	lb.bytes = int64(gib * (1 << 30))
	return lb, nil
}

// largestModel is -largest-model: a cap, the windows' context and batch,
// and the models to search.
type largestModel struct {
	bytes          int64
	context, batch int
	models         []string
}

func parseLargestModel(s string) (largestModel, error) {
	lm := largestModel{context: 1024, batch: 8, models: train.GPTFamily()}
	parts := strings.Split(s, ":")
	if len(parts) != 1 && len(parts) != 4 {
		return lm, errors.New("want GIB or GIB:CONTEXT:BATCH:MODEL,..., as 24 or 0.25:32:2:gpt-mini,gpt-small")
	}
	gib, err := strconv.ParseFloat(parts[0], 64)
	if err != nil || !(gib > 0) || gib > 1<<20 {
		return lm, fmt.Errorf("%q: want a cap in GiB above 0", parts[0])
	}
	lm.bytes = int64(gib * (1 << 30))
	if len(parts) == 1 {
		return lm, nil
	}
	if lm.context, err = strconv.Atoi(parts[1]); err != nil || lm.context < 1 {
		return lm, fmt.Errorf("context %q: want a number of tokens", parts[1])
	}
	if lm.batch, err = strconv.Atoi(parts[2]); err != nil || lm.batch < 1 {
		return lm, fmt.Errorf("batch %q: want a number of windows", parts[2])
	}
	lm.models = strings.Split(parts[3], ",")
	for _, m := range lm.models {
		if err := languageModel(m); err != nil {
			return lm, err
		}
	}
	return lm, nil
}

// languageModel says why name is not a language model of the registry,
// or nil.
func languageModel(name string) error {
	if a, err := train.LookupArch(name); err != nil || !a.Text {
		return fmt.Errorf("%s is not a language model (want %s)", name, strings.Join(train.LanguageModels(), ", "))
	}
	return nil
}

// cpuSpecs, cpuSteps and cpuWarmup are bench's defaults on a CPU, where
// the GPU's (-specs "resnet20:256,1024 resnet18:256 mlp:256", 30 steps)
// take an hour: a few minutes instead.
const (
	cpuSpecs  = "resnet20:32 mlp:64"
	cpuSteps  = 10
	cpuWarmup = 2
)

// cpuDefaults sets, on a CPU, the specs and steps not given to CPU-sized
// ones, and says what it set.
func (o *options) cpuDefaults(specs []spec) ([]spec, string) {
	var said []string
	if !o.set["specs"] {
		specs, _ = parseSpecs(cpuSpecs)
		said = append(said, fmt.Sprintf("-specs %q", cpuSpecs))
	}
	if !o.set["steps"] {
		o.steps = cpuSteps
		said = append(said, fmt.Sprintf("-steps %d", cpuSteps))
	}
	if !o.set["warmup"] {
		o.warmup = cpuWarmup
		said = append(said, fmt.Sprintf("-warmup %d", cpuWarmup))
	}
	if len(said) == 0 {
		return specs, ""
	}
	return specs, "CPU run: " + strings.Join(said, " ") + " (the defaults suit a GPU; give these flags to choose)"
}

// stopped says whether SIGINT or SIGTERM asked bench to stop.
func (o *options) stopped() bool { return o.interrupts != nil && o.interrupts.Stopped() }

// nothingRan is bench's error when the device could not be opened.
type nothingRan struct{ error }

func (e nothingRan) Unwrap() error { return e.error }

// check validates every flag before any work, -out and -cpuprofile among
// them (where writing is tried), and returns the specs and every problem.
func (o *options) check(fs *flag.FlagSet) ([]spec, []string) {
	var bad []string
	say := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	if fs.NArg() > 0 {
		say("unexpected argument %q (flags start with -; quote a list of specs)", fs.Arg(0))
	}
	if !o.ampDType.On() {
		say("-amp-dtype %v: want %s", o.ampDType, train.AMPDTypes)
	}
	var paths iopaths.Set
	for _, f := range strings.Split(o.merge, ",") {
		paths.Input("-merge", f)
	}
	if err := iopaths.Folder(o.out); err != nil {
		say("-out %s: %v", o.out, err)
	} else { // the files in it, where it can be written
		for _, f := range []string{"bench.json", "bench.md", "ddp.json"} {
			paths.Output("-out", filepath.Join(o.out, f), false)
		}
	}
	paths.Output("-cpuprofile", o.cpuprofile, false)
	bad = append(bad, paths.Problems()...)
	if o.merge != "" {
		return nil, bad
	}
	var specs []spec
	if o.specs != "" || o.largestModel == "" && o.largestBatch == "" { // "" runs only the searches
		var err error
		if specs, err = parseSpecs(o.specs); err != nil {
			say("%v", err)
		}
	}
	if err := benchmarks.CheckConfigs(o.configs); err != nil {
		say("-configs %s: %v", o.configs, err)
	}
	if o.compileConfigs != "" {
		if err := benchmarks.CheckConfigs(o.compileConfigs); err != nil {
			say("-compile-configs %s: %v", o.compileConfigs, err)
		}
	}
	if o.warmup < 0 {
		say("-warmup %d: want 0 or more steps", o.warmup)
	}
	if o.steps < 1 {
		say("-steps %d: want 1 or more", o.steps)
	}
	if o.rounds < 1 {
		say("-rounds %d: want 1 or more", o.rounds)
	}
	if o.nproc < 1 {
		say("-nproc %d: want 1 or more processes", o.nproc)
	}
	if !(o.planRoom >= 0) && o.planRoom != -1 || math.IsInf(o.planRoom, 0) {
		say("-plan-room %v: want a fraction of 0 or more, or -1 for the default", o.planRoom)
	}
	if o.profileShare < 0 || o.profileShare > 100 {
		say("-profile-share %v: want a percent from 0 to 100", o.profileShare)
	}
	if !(o.planTolerance >= 0) && o.planTolerance != -1 || math.IsInf(o.planTolerance, 0) {
		say("-plan-tolerance %v: want a fraction of 0 or more, or -1 for the default", o.planTolerance)
	}
	if o.vocab < 0 || o.vocab == 1 {
		say("-vocab %d: want 0 (the preset's) or at least 2 tokens", o.vocab)
	}
	if o.largestBatch != "" {
		if _, err := parseLargestBatch(o.largestBatch); err != nil {
			say("-largest-batch %s: %v", o.largestBatch, err)
		}
	}
	if o.largestModel != "" {
		if _, err := parseLargestModel(o.largestModel); err != nil {
			say("-largest-model %s: %v", o.largestModel, err)
		}
	}
	return specs, bad
}

// buildCommit is the VCS revision the binary was built from, marked
// "-dirty" when the tree had changes, or "" when the build recorded none.
func buildCommit() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev == "" {
		return ""
	}
	return rev + dirty
}

func bench(o options, specs []spec, stdout, stderr io.Writer) error {
	dev, err := cmdenv.OpenDevice(o.device, o.deviceOptions(tensor.Options{}), io.Discard)
	if err != nil {
		return nothingRan{err}
	}
	rep := &benchmarks.Report{Date: o.date, Device: dev.Name(), Commit: o.commit}
	if dev.OnHost() {
		var said string
		if specs, said = o.cpuDefaults(specs); said != "" {
			fmt.Fprintln(stderr, said)
			rep.Notes = append(rep.Notes, said+".")
		}
	}
	if n, ok := dev.Backend().(interface{ DeviceName() string }); ok {
		rep.Device = fmt.Sprintf("%s (%s)", dev.Name(), n.DeviceName())
	}
	if c, ok := dev.Backend().(interface{ ConvEngine() string }); ok {
		rep.Notes = append(rep.Notes, "leangrad convolutions: "+c.ConvEngine()+".")
	}
	if m := dev.Info().Matmul; m != "" {
		rep.Notes = append(rep.Notes, "leangrad matrix products: "+m+".")
	}
	if a, ok := dev.Backend().(interface{ AttnEngine() string }); ok && hasText(specs) {
		rep.Notes = append(rep.Notes, "leangrad attention: "+a.AttnEngine()+".")
	}
	configs := strings.Split(o.configs, ",")
	bo := o.harness()
	if o.vocab > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("Language models ran with a vocabulary of %d tokens instead of their presets'.", o.vocab))
	}
	if o.planRoom >= 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("Planned steps gave convolution workspaces room of at most %g of the arena (the default: %g).", o.planRoom, memory.DefaultPlanOptions.MaxSlack))
	}
	if o.planTolerance >= 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("Planned steps took convolution algorithms up to %g slower than the fastest for a smaller arena (the default: %g).", o.planTolerance, memory.DefaultPlanOptions.TimeTolerance))
	}
	if o.micro {
		for _, line := range benchmarks.Micro(dev) {
			fmt.Fprintln(stderr, "micro:", line)
			rep.Notes = append(rep.Notes, "Host cost: "+line+".")
		}
	}
	if dev.OnHost() {
		for _, line := range benchmarks.SGEMM([]int{256, 512, 1024}, max(o.steps, 3)) {
			fmt.Fprintln(stderr, line)
			rep.Notes = append(rep.Notes, line+".")
		}
		rep.Notes = append(rep.Notes, fmt.Sprintf("leangrad ran on GOMAXPROCS = %d goroutines.", runtime.GOMAXPROCS(0)))
	}
	if o.profile {
		if err := profile(dev, specs, configs, o.profileShare, bo, rep, stderr); err != nil {
			return err
		}
	}
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	torch := o.pytorch != ""
	if torch {
		if err := exec.Command(o.python, "-c", "import torch").Run(); err != nil {
			note := fmt.Sprintf("No PyTorch reference: %s -c 'import torch' failed (%v).", o.python, err)
			fmt.Fprintln(stderr, note)
			rep.Notes = append(rep.Notes, note)
			torch = false
		}
	}
	// Each round times every spec in both engines, the first engine
	// alternating (leangrad first, then PyTorch first, …), and leangrad's
	// configurations in turn forwards and backwards: on a shared machine
	// whose speed drifts, no engine or configuration always runs in the
	// later, or the earlier, part of the run.
	var rounds [][]benchmarks.Result
	for round := range o.rounds {
		var lg, pt []benchmarks.Result
		timeLeangrad := func() error {
			order := configs
			if round%2 == 1 {
				order = slices.Clone(configs)
				slices.Reverse(order)
			}
			var err error
			lg, err = runLeangrad(o, dev, specs, order, bo, stderr)
			return err
		}
		timePyTorch := func() error {
			if !torch || len(specs) == 0 {
				return nil
			}
			dev.Allocator().EmptyCache()
			var err error
			rep.PyTorch, pt, err = runPyTorch(o, dev.OnHost(), specs, stderr)
			return err
		}
		first, second := timeLeangrad, timePyTorch
		if round%2 == 1 {
			first, second = second, first
		}
		err := first()
		if o.cpuprofile != "" && round == 0 && o.largestModel == "" && o.largestBatch == "" {
			pprof.StopCPUProfile() // the first round's leangrad steps are enough; the searches run later
		}
		if err == nil && !o.stopped() {
			err = second()
		}
		if errors.Is(err, train.ErrInterrupted) || err == nil && o.stopped() {
			// What was measured is kept: this round's results so far, and
			// the report of them written before exiting.
			if r := append(lg, pt...); len(r) > 0 {
				rounds = append(rounds, r)
			}
			note := fmt.Sprintf("Interrupted (SIGINT or SIGTERM) in round %d of %d: the report holds what was measured before.", round+1, o.rounds)
			fmt.Fprintln(stderr, note)
			rep.Notes = append(rep.Notes, note)
			rep.Results, _ = benchmarks.MedianRounds(rounds)
			benchmarks.Relate(rep.Results)
			return errors.Join(train.ErrInterrupted, write(o, rep, stdout, stderr))
		}
		if err != nil {
			return err
		}
		rounds = append(rounds, append(lg, pt...))
	}
	if torch && dev.OnHost() {
		rep.Notes = append(rep.Notes, fmt.Sprintf("PyTorch ran on the CPU with torch.set_num_threads(%d), on the same cores.", runtime.GOMAXPROCS(0)))
	}
	var roundNotes []string
	rep.Results, roundNotes = benchmarks.MedianRounds(rounds)
	for _, n := range roundNotes {
		fmt.Fprintln(stderr, n)
	}
	rep.Notes = append(rep.Notes, roundNotes...)
	if !dev.OnHost() && slices.ContainsFunc(rep.Results, func(r benchmarks.Result) bool { return r.FLOPsPerStep > 0 }) {
		notes, err := mfu(dev, o.ampDType, rep.Results)
		if err != nil {
			return err
		}
		for _, n := range notes {
			fmt.Fprintln(stderr, n)
		}
		rep.Notes = append(rep.Notes, notes...)
	}
	if o.lean && !dev.OnHost() {
		if err := runLean(dev, o.deviceOptions(tensor.Options{}), specs, configs, bo, rep, stderr); err != nil {
			return err
		}
	}
	if o.largestBatch != "" {
		lb, _ := parseLargestBatch(o.largestBatch) // checked by check
		c, err := benchmarks.LargestBatch(dev, lb.model, lb.context, lb.bytes, bo)
		if err != nil {
			return fmt.Errorf("-largest-batch: %w", err)
		}
		fmt.Fprintf(stderr, "claim %s: %s: %s\n", c.Name, c.Verdict, c.Summary)
		rep.Claims = append(rep.Claims, c)
	}
	if o.largestModel != "" {
		lm, _ := parseLargestModel(o.largestModel) // checked by check
		c, fits, err := benchmarks.LargestModel(dev, lm.models, lm.bytes, lm.context, lm.batch, 3, bo, func(f benchmarks.ModelFit) {
			if f.Config == "" {
				fmt.Fprintf(stderr, "largest model: %s does not train: %s\n", f.Model, strings.Join(f.Tried, "; "))
				return
			}
			host := ""
			if f.HostStepS > 0 {
				host = fmt.Sprintf(", the host's update %.3f s a step", f.HostStepS)
			}
			fmt.Fprintf(stderr, "largest model: %s trains in %s: %.0f tokens/s (%.1f TFLOP/s of the model's), peak %s%s\n",
				f.Model, f.Config, f.TokensPerS, f.TFLOPs, memory.Bytes(f.PeakAllocated), host)
		})
		rep.LargestModel = fits
		if err != nil {
			return fmt.Errorf("-largest-model: %w", err)
		}
		if !dev.OnHost() && len(fits) > 0 {
			peak, err := benchmarks.GemmPeak(dev, tensor.BF16, 8192, 10)
			if err != nil {
				return fmt.Errorf("-largest-model: measuring the bf16 product peak: %w", err)
			}
			dev.Allocator().EmptyCache()
			for _, f := range fits {
				if f.TFLOPs > 0 {
					fmt.Fprintf(stderr, "largest model: %s: MFU %.1f%% of the measured bf16 8192³ product peak (%.0f TFLOP/s)\n", f.Model, 100*f.TFLOPs/peak, peak)
				}
			}
		}
		fmt.Fprintf(stderr, "claim %s: %s: %s\n", c.Name, c.Verdict, c.Summary)
		rep.Claims = append(rep.Claims, c)
	}
	if o.claims && len(specs) > 0 {
		if err := claims(dev, rep, specs, bo, stderr); err != nil {
			return err
		}
	}
	benchmarks.Relate(rep.Results)
	if o.claims && len(specs) > 0 {
		rep.Claims = append(benchmarks.ClaimsFromResults(rep.Results, specs[0].model, specs[0].batches[0]), rep.Claims...)
	}
	return write(o, rep, stdout, stderr)
}

// runLeangrad times every spec and configuration in leangrad (on a GPU the
// captured step and, with -eager, the eager one).
func runLeangrad(o options, dev *tensor.Device, specs []spec, configs []string, bo benchmarks.Options, stderr io.Writer) ([]benchmarks.Result, error) {
	var out []benchmarks.Result
	for _, sp := range specs {
		for _, b := range sp.batches {
			for _, c := range configs {
				if strings.Contains(c, "checkpoint") && !hasBlocks(sp.model) {
					continue
				}
				eagerToo := []bool{false}
				if o.eager && !dev.OnHost() {
					eagerToo = append(eagerToo, true)
				}
				for _, eager := range eagerToo {
					if o.stopped() {
						return out, train.ErrInterrupted
					}
					dev.Allocator().EmptyCache() // each configuration's reserved peak is its own
					bo.Eager = eager
					r, err := benchmarks.Run(dev, benchmarks.Spec{Model: sp.model, Batch: b, Config: c}, bo)
					if err != nil {
						return nil, fmt.Errorf("%s batch %d %s: %w", sp.model, b, c, err)
					}
					fmt.Fprintf(stderr, "%s (%s) %s batch %d %s: %.2f ms (host %.2f ms, %.0f launches), peak %s, reserved %s\n",
						r.Engine, r.Mode, sp.model, b, c, r.MedianMS, r.HostMS, r.LaunchesPerStep, memory.Bytes(r.PeakAllocated), memory.Bytes(r.PeakReserved))
					for _, n := range r.Notes {
						fmt.Fprintf(stderr, "  %s\n", n)
					}
					out = append(out, r)
				}
			}
		}
	}
	return out, nil
}

// profile reports where each spec's step time goes, by kind of operation.
func profile(dev *tensor.Device, specs []spec, configs []string, share float64, bo benchmarks.Options, rep *benchmarks.Report, stderr io.Writer) error {
	for _, sp := range specs {
		for _, b := range sp.batches {
			for _, c := range configs {
				if strings.Contains(c, "checkpoint") && !hasBlocks(sp.model) {
					continue
				}
				ops, total, err := benchmarks.Profile(dev, benchmarks.Spec{Model: sp.model, Batch: b, Config: c}, bo)
				if err != nil {
					return err
				}
				var parts []string
				var rest float64
				var others int
				for _, op := range ops {
					if op.MS >= share/100*total {
						parts = append(parts, fmt.Sprintf("%s %.3f ms (%d×)", op.Op, op.MS, op.Count))
					} else {
						rest, others = rest+op.MS, others+1
					}
				}
				if others > 0 {
					parts = append(parts, fmt.Sprintf("%d more kinds %.3f ms", others, rest))
				}
				what := "Device time"
				if dev.OnHost() {
					what = "Host time of the operations" // they run as they are called
				}
				line := fmt.Sprintf("%s of an eager %s batch %d %s step: %.3f ms: %s.", what, sp.model, b, c, total, strings.Join(parts, ", "))
				fmt.Fprintln(stderr, "profile:", line)
				rep.Notes = append(rep.Notes, line)
			}
		}
	}
	return nil
}

// runLean repeats the specs on a second backend of the same GPU, opened
// with opts, whose convolutions keep their workspaces no larger than their
// activations.
func runLean(dev *tensor.Device, opts tensor.Options, specs []spec, configs []string, bo benchmarks.Options, rep *benchmarks.Report, stderr io.Writer) error {
	opts.LeanConvWorkspace = true
	be, err := cuda.OpenSeparate(dev.Info().Index, opts)
	if err != nil {
		return err
	}
	lean := tensor.NewDevice(be)
	for _, sp := range specs {
		if a, _ := train.LookupArch(sp.model); !a.CNN {
			continue // no convolutions
		}
		for _, b := range sp.batches {
			for _, c := range configs {
				lean.Allocator().EmptyCache()
				bo.Eager = true
				r, err := benchmarks.Run(lean, benchmarks.Spec{Model: sp.model, Batch: b, Config: c}, bo)
				if err != nil {
					return err
				}
				r.Engine = "leangrad-lean"
				fmt.Fprintf(stderr, "leangrad-lean %s batch %d %s: %.2f ms, %s\n", sp.model, b, c, r.MedianMS, memory.Bytes(r.PeakAllocated))
				rep.Results = append(rep.Results, r)
			}
		}
	}
	lean.Allocator().EmptyCache()
	return nil
}

func claims(dev *tensor.Device, rep *benchmarks.Report, specs []spec, bo benchmarks.Options, stderr io.Writer) error {
	model, batch := specs[0].model, specs[0].batches[0]
	ec, err := benchmarks.EmptyCacheEveryBatch(dev, model, batch, bo)
	if err != nil {
		return err
	}
	lk, err := benchmarks.LeakyLoop(dev, model, batch, 3, max(4, bo.Steps/2), bo.Seed)
	if err != nil {
		return err
	}
	fr, err := benchmarks.Fragmentation(dev, model, batch, max(8, bo.Steps), 5, bo.Seed)
	if err != nil {
		return err
	}
	for _, c := range []benchmarks.Claim{ec, lk, fr} {
		fmt.Fprintf(stderr, "claim %s: %s: %s\n", c.Name, c.Verdict, c.Summary)
	}
	rep.Claims = append(rep.Claims, ec, lk, fr)
	return nil
}

// runPyTorch runs the reference script with the same specs (a language
// model's shape and recipe given as ReferenceLM has them) and returns
// PyTorch's version and its results. On the CPU it runs there with as many
// threads as leangrad's goroutines (and on the same cores: it inherits the
// process's affinity), without torch.compile.
func runPyTorch(o options, cpu bool, specs []spec, stderr io.Writer) (string, []benchmarks.Result, error) {
	if _, err := os.Stat(o.pytorch); err != nil {
		return "", nil, fmt.Errorf("-pytorch %s: %w", o.pytorch, err)
	}
	args := []string{o.pytorch, "--warmup", strconv.Itoa(o.warmup), "--steps", strconv.Itoa(o.steps), "--configs", o.configs,
		"--amp-dtype", o.ampDType.String()}
	lms := map[string]benchmarks.LMReference{}
	for _, sp := range specs {
		if lm, ok := benchmarks.ReferenceLM(sp.model, o.harness()); ok {
			lms[sp.model] = lm
		}
	}
	if len(lms) > 0 {
		js, err := json.Marshal(lms)
		if err != nil {
			return "", nil, err
		}
		args = append(args, "--lm", string(js))
	}
	if cpu {
		args = append(args, "--device", "cpu", "--threads", strconv.Itoa(runtime.GOMAXPROCS(0)))
	} else {
		args = append(args, "--compile-configs", o.compileConfigs)
	}
	args = append(args, "--specs")
	for _, sp := range specs {
		var bs []string
		for _, b := range sp.batches {
			bs = append(bs, strconv.Itoa(b))
		}
		args = append(args, sp.model+":"+strings.Join(bs, ","))
	}
	var out bytes.Buffer
	cmd := exec.Command(o.python, args...)
	cmd.Stdout, cmd.Stderr = &out, stderr
	if err := cmd.Run(); err != nil {
		return "", nil, fmt.Errorf("PyTorch reference (%s %s): %w", o.python, o.pytorch, err)
	}
	var pt struct {
		PyTorch string              `json:"pytorch"`
		Results []benchmarks.Result `json:"results"`
	}
	if err := json.Unmarshal(out.Bytes(), &pt); err != nil {
		return "", nil, fmt.Errorf("PyTorch reference printed no valid JSON: %v", err)
	}
	return pt.PyTorch, pt.Results, nil
}

// merge renders one report from several runs' bench.json: their results
// side by side (a later run's result for the same engine and spec replaces
// an earlier one's), the first run's date, device and claims, every note.
func merge(o options, stdout, stderr io.Writer) error {
	var rep *benchmarks.Report
	for _, path := range strings.Split(o.merge, ",") {
		data, err := fileio.ReadFile(path, 1<<30)
		if err != nil {
			return fmt.Errorf("-merge: %w", err)
		}
		var r benchmarks.Report
		if err := json.Unmarshal(data, &r); err != nil {
			return fmt.Errorf("-merge %s: %w", path, err)
		}
		if rep == nil {
			rep = &r
			continue
		}
		for _, x := range r.Results {
			replaced := false
			for i, y := range rep.Results {
				if y.Engine == x.Engine && y.Model == x.Model && y.Batch == x.Batch && y.Config == x.Config {
					rep.Results[i], replaced = x, true
				}
			}
			if !replaced {
				rep.Results = append(rep.Results, x)
			}
		}
		rep.Claims = append(rep.Claims, r.Claims...)
		for _, n := range r.Notes {
			if !slices.Contains(rep.Notes, n) {
				rep.Notes = append(rep.Notes, n)
			}
		}
		if rep.PyTorch == "" {
			rep.PyTorch = r.PyTorch
		}
	}
	benchmarks.Relate(rep.Results)
	// The claims judged on the table's numbers are judged again on the merged table.
	kept := rep.Claims[:0]
	for _, c := range rep.Claims {
		if c.Name != "amp-memory" && c.Name != "checkpoint-tradeoff" {
			kept = append(kept, c)
		}
	}
	if len(rep.Results) > 0 {
		first := rep.Results[0]
		rep.Claims = append(benchmarks.ClaimsFromResults(rep.Results, first.Model, first.Batch), kept...)
	}
	if o.commit != "" {
		rep.Commit = o.commit
	}
	return write(o, rep, stdout, stderr)
}

// write writes the report into -out (bench.json, bench.md, the plots),
// the Markdown on stdout too, and a line per file written on said.
func write(o options, rep *benchmarks.Report, stdout, said io.Writer) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	var written []string
	defer func() {
		for _, p := range written {
			fmt.Fprintf(said, "wrote %s\n", p)
		}
	}()
	data, err := json.MarshalIndent(rep, "", " ")
	if err != nil {
		return err
	}
	file := func(name string, write func(path string) error) error {
		p := filepath.Join(o.out, name)
		if err := write(p); err != nil {
			return err
		}
		written = append(written, p)
		return nil
	}
	if err := file("bench.json", func(p string) error { return fileio.WriteFile(p, append(data, '\n')) }); err != nil {
		return err
	}
	var md bytes.Buffer
	rep.Markdown(&md)
	if err := file("bench.md", func(p string) error { return fileio.WriteFile(p, md.Bytes()) }); err != nil {
		return err
	}
	stdout.Write(md.Bytes())
	if len(rep.Results) == 0 { // only searches ran: nothing to plot
		return nil
	}
	if err := file("step_time.png", func(p string) error {
		return rep.PlotBars(p, "median step time", "ms", func(r benchmarks.Result) float64 { return r.MedianMS })
	}); err != nil {
		return err
	}
	if err := file("peak_memory.png", func(p string) error {
		return rep.PlotBars(p, "peak allocated", "MiB", func(r benchmarks.Result) float64 { return memory.Bytes(r.PeakAllocated).MiB() })
	}); err != nil {
		return err
	}
	timelines, err := rep.PlotTimelines(o.out)
	written = append(written, timelines...)
	return err
}

// mfu measures the device's matrix-product peaks in the dtypes the
// language models ran in (8192³ products) and notes each language-model
// result's model FLOPs rate and its share of that peak.
func mfu(dev *tensor.Device, amp train.AMP, results []benchmarks.Result) ([]string, error) {
	const n = 8192
	peaks, names := map[tensor.DType]float64{}, map[tensor.DType]string{}
	var notes []string
	for _, r := range results {
		d := benchmarks.ConfigDType(r.Config, amp)
		if _, done := peaks[d]; done || r.FLOPsPerStep == 0 {
			continue
		}
		p, err := benchmarks.GemmPeak(dev, d, n, 10)
		if err != nil {
			return nil, fmt.Errorf("measuring the %v product peak: %w", d, err)
		}
		peaks[d], names[d] = p, fmt.Sprintf("%v %d³ product", d, n)
		notes = append(notes, fmt.Sprintf("Measured peak of the %s: %.1f TFLOP/s.", names[d], p))
	}
	dev.Allocator().EmptyCache() // the operands are not what later measurements should find cached
	return append(notes, benchmarks.MFU(results, amp, peaks, names)...), nil
}

// deviceOptions is opts with the flags' device settings and the
// environment's kernel cache.
func (o *options) deviceOptions(opts tensor.Options) tensor.Options {
	opts.MatmulF32 = o.matmulF32
	return opts
}

// harness is the benchmark harness's options the flags give, for one
// device or a data-parallel job.
func (o *options) harness() benchmarks.Options {
	bo := benchmarks.Options{Warmup: o.warmup, Steps: o.steps, Seed: o.seed, AMP: o.ampDType, Vocab: o.vocab}
	if o.planRoom >= 0 || o.planTolerance >= 0 {
		p := memory.DefaultPlanOptions
		if o.planRoom >= 0 {
			p.MaxSlack = o.planRoom
		}
		if o.planTolerance >= 0 {
			p.TimeTolerance = o.planTolerance
		}
		bo.Planning = &p
	}
	return bo
}
