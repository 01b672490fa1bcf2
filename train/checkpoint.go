package train

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/optim"
	"github.com/leangrad/leangrad/tensor"
)

// A training checkpoint is one safetensors file: the model's state under
// "model.", the optimiser's under "optim.", and in the metadata, as JSON
// under "leangrad.train", the configuration, the epoch to resume at (and,
// for a run interrupted inside an epoch, the position in it), the step
// count, the optimiser's and the scaler's counters, the random generator's
// state and the history so far. It is written atomically, with the
// checksums of every tensor and of the metadata (nn.ChecksumKey), which
// Resume checks.

const metaKey = "leangrad.train"

type checkpointMeta struct {
	Version int                `json:"version"`
	Config  Config             `json:"config"`
	Epoch   int                `json:"epoch"`
	Step    int                `json:"step"`
	Optim   map[string]float64 `json:"optim"`
	Scaler  map[string]float64 `json:"scaler"`
	RNG     kernels.Philox     `json:"rng"`
	History []EpochMetrics     `json:"history"`
	// Position is where in Epoch an interrupted run stopped (nil: at its
	// start).
	Position *Position `json:"position,omitempty"`
	Inputs   *Inputs   `json:"inputs,omitempty"`
}

// Inputs are what a model was trained on, as its checkpoint records them
// for a program that serves it: one example's shape, the classes (a
// language model's vocabulary, and its tokenizer), and for images the
// per-channel mean and standard deviation the pixels (in [0, 1]) were
// normalised with.
type Inputs struct {
	Shape     []int     `json:"shape"`
	Classes   int       `json:"classes"`
	Mean      []float32 `json:"mean,omitempty"`
	Std       []float32 `json:"std,omitempty"`
	Tokenizer string    `json:"tokenizer,omitempty"`
	// Labels are the classes' names where the dataset has them (Classes
	// of them), for a server's answers.
	Labels []string `json:"labels,omitempty"`
}

// Position is how far into an epoch a run got: what Fit needs to go on
// from there as though it had not stopped.
type Position struct {
	Batch   int       `json:"batch"`   // the epoch's batches done
	Seen    int       `json:"seen"`    // this rank's examples in them
	Seconds float64   `json:"seconds"` // the time they took
	Metrics []float32 `json:"metrics"` // the step's running sums (Step.Metrics) over them
	// Skipped is the scaler's count of skipped steps when the epoch began.
	Skipped                     int   `json:"skipped"`
	PeakAllocated, PeakReserved int64 `json:"-"`
}

// checkpointVersion is the format Save writes: 2 added Position.
const checkpointVersion = 2

// CheckpointInfo is what a training checkpoint says about its run.
type CheckpointInfo struct {
	Config   Config
	Inputs   *Inputs   // nil in checkpoints written before they were recorded
	Epoch    int       // the epoch it resumes at, from 0
	Position *Position // where in it (nil: at its start)
	Verified bool      // it carried checksums, and they matched
}

// ReadCheckpointInfo reads the run a training checkpoint records, its
// checksums checked, without touching a device: what a run compares its
// configuration with before any work. The file is memory-mapped, not read
// into the heap.
func ReadCheckpointInfo(path string) (CheckpointInfo, error) {
	st, unmap, err := nn.MapSafetensors(path)
	if err != nil {
		return CheckpointInfo{}, err
	}
	defer unmap()
	return InfoOf(st, path)
}

// InfoOf is the run a training checkpoint records, from its content (read
// or memory-mapped by the caller); path names it in errors.
func InfoOf(st *nn.Safetensors, path string) (CheckpointInfo, error) {
	meta, err := metaOf(st, path)
	if err != nil {
		return CheckpointInfo{}, err
	}
	return CheckpointInfo{Config: meta.Config, Inputs: meta.Inputs, Epoch: meta.Epoch, Position: meta.Position, Verified: st.Verified}, nil
}

// readCheckpoint reads and checks a checkpoint file and its metadata.
func readCheckpoint(path string) (*nn.Safetensors, *checkpointMeta, error) {
	st, err := nn.ReadSafetensors(path)
	if err != nil {
		return nil, nil, err
	}
	meta, err := metaOf(st, path)
	return st, meta, err
}

func metaOf(st *nn.Safetensors, path string) (*checkpointMeta, error) {
	raw, ok := st.Metadata[metaKey]
	if !ok {
		return nil, fmt.Errorf("%s: not a leangrad training checkpoint (no %q metadata)", path, metaKey)
	}
	var meta checkpointMeta
	if err := json.Unmarshal([]byte(raw), &meta); err != nil {
		return nil, fmt.Errorf("%s: training metadata: %v", path, err)
	}
	if meta.Version > checkpointVersion {
		return nil, fmt.Errorf("%s: a checkpoint of format %d, newer than this build reads (%d)", path, meta.Version, checkpointVersion)
	}
	return &meta, nil
}

// ResumeInfo is what Resume found.
type ResumeInfo struct {
	// Changed lists the configuration's differences that force accepted.
	Changed []string
	// Unverified says the checkpoint carried no checksums (it was written
	// before they were recorded): its bytes could not be checked.
	Unverified bool
	// Position is where in the epoch it resumes (nil: at its start).
	Position *Position
}

// Save writes a training checkpoint to path, atomically. With an optimiser
// sharded over a job's ranks (dist.ShardedOptimizer), every rank calls its
// Gather first.
func (t *Trainer) Save(path string) error { return t.saveAt(path, t.Epoch, t.position) }

// saveAt is Save of a checkpoint that resumes at epoch and, within it, pos
// (nil: its start).
func (t *Trainer) saveAt(path string, epoch int, pos *Position) error {
	st := &nn.Safetensors{Tensors: map[string]nn.Stored{}, Metadata: map[string]string{}}
	off, _ := t.Opt.(*optim.Offloaded)
	for _, n := range t.Model.State("model") {
		w := n.T
		if m := masterOf(off, w); m != nil { // Note [16-bit weights in a checkpoint]
			w = m
		}
		st.Tensors[n.Name] = nn.Stored{DType: w.DType(), Shape: w.Shape(), Data: w.Raw()}
	}
	for k, v := range t.Opt.State() {
		if off != nil && strings.HasPrefix(k, optim.MasterKind+".") { // the model's weights above
			continue
		}
		st.Tensors["optim."+k] = nn.Stored{DType: v.DType(), Shape: v.Shape(), Data: v.Raw()}
	}
	t.Step.SyncRNG()
	meta, err := json.Marshal(checkpointMeta{Version: checkpointVersion, Config: t.Cfg, Epoch: epoch, Step: t.Steps,
		Optim: t.Opt.Counters(), Scaler: t.Step.Scaler.Counters(), RNG: t.Dev.Generator().State(), History: t.History,
		Position: pos, Inputs: t.Inputs})
	if err != nil {
		return err
	}
	st.Metadata[metaKey] = string(meta)
	if err := nn.WriteSafetensors(path, st); err != nil {
		return fmt.Errorf("saving the training checkpoint: %w", err)
	}
	return nil
}

// masterOf is the F32 master of w, a 16-bit working weight of the
// offloaded optimizer off (nil: none), or nil.
func masterOf(off *optim.Offloaded, w *tensor.Tensor) *tensor.Tensor {
	if off == nil || !w.DType().Half() {
		return nil
	}
	return off.Master(w)
}

// Note [16-bit weights in a checkpoint]
// A run with its product weights in BF16 on the device (Config.BF16Weights)
// saves each one's F32 master as the model's weight, as an F32 run saves
// its weights: the checkpoint is an F32 model, which serve loads and an F32
// run resumes. Resuming into BF16 weights rounds each to the device and
// takes the F32 values as the optimizer's masters.

// Resume restores a checkpoint written by Save, its checksums checked:
// model, optimiser, scaler, random generator, epoch (and the position in
// it), step and history. The checkpoint's configuration must be the
// trainer's in everything that shapes the run (CheckResume); with force,
// differences other than the model are accepted and listed in the result,
// for the report. The epochs may differ: that is how a run is extended.
func (t *Trainer) Resume(path string, force bool) (info ResumeInfo, err error) {
	st, meta, err := readCheckpoint(path)
	if err != nil {
		return info, err
	}
	if info.Changed, err = CheckResume(path, meta.Config, t.Cfg, force); err != nil {
		return info, err
	}
	info.Unverified, info.Position = !st.Verified, meta.Position
	if meta.Position != nil && meta.Config.Batch != t.Cfg.Batch {
		return info, fmt.Errorf("%s: the run stopped inside epoch %d at batch %d of %d examples; it resumes there with the same batch only",
			path, meta.Epoch+1, meta.Position.Batch, meta.Config.Batch)
	}
	if meta.Config.Optimizer != t.Cfg.Optimizer {
		// Another optimiser's state does not carry over: it starts afresh.
		for name := range st.Tensors {
			if strings.HasPrefix(name, "optim.") {
				delete(st.Tensors, name)
			}
		}
		meta.Optim = map[string]float64{"lr": t.Cfg.LR}
	}
	model := &nn.Safetensors{Tensors: map[string]nn.Stored{}}
	optState := map[string]*tensor.Tensor{}
	defer func() {
		for _, v := range optState {
			v.Release()
		}
	}()
	for name, s := range st.Tensors {
		switch {
		case strings.HasPrefix(name, "model."):
			model.Tensors[strings.TrimPrefix(name, "model.")] = s
		case strings.HasPrefix(name, "optim."):
			optState[strings.TrimPrefix(name, "optim.")] = tensor.FromBytes(t.Dev, s.DType, s.Data, s.Shape...).Keep()
		default:
			return info, fmt.Errorf("%s: unexpected tensor %q", path, name)
		}
	}
	masters, err := t.narrowWeights(model)
	if err != nil {
		return info, fmt.Errorf("%s: %w", path, err)
	}
	if err := nn.LoadStateDict(t.Model, model, path); err != nil {
		return info, err
	}
	if err := t.Opt.LoadState(optState, meta.Optim); err != nil {
		return info, fmt.Errorf("%s: %w", path, err)
	}
	for w, data := range masters {
		copy(masterOf(t.Opt.(*optim.Offloaded), w).HostBytes(), data)
	}
	if meta.Config.AMP.On() && t.Cfg.AMP.On() {
		if err := t.Step.Scaler.LoadCounters(meta.Scaler); err != nil {
			return info, fmt.Errorf("%s: %w", path, err)
		}
	}
	t.Dev.Generator().SetState(meta.RNG)
	t.Step.rngFresh = false // the next step takes the restored position
	t.Epoch, t.Steps, t.History, t.position = meta.Epoch, meta.Step, meta.History, meta.Position
	return info, nil
}

// narrowWeights rounds, in st, each F32 weight that the model holds in 16
// bits to the model's dtype, and returns the F32 values by weight, the
// optimizer's masters (Note [16-bit weights in a checkpoint]).
func (t *Trainer) narrowWeights(st *nn.Safetensors) (map[*tensor.Tensor][]byte, error) {
	masters := map[*tensor.Tensor][]byte{}
	off, _ := t.Opt.(*optim.Offloaded)
	for _, n := range t.Model.State("") {
		s, ok := st.Tensors[n.Name]
		dt := n.T.DType()
		if !ok || !dt.Half() || s.DType != tensor.F32 || masterOf(off, n.T) == nil {
			continue
		}
		if !slices.Equal(s.Shape, n.T.Shape()) {
			return nil, fmt.Errorf("tensor %q is %v %v, the model's is %v %v", n.Name, s.DType, s.Shape, dt, n.T.Shape())
		}
		var narrow []byte
		t.Dev.WithScope(func() {
			wide := tensor.FromBytes(t.Dev, tensor.F32, s.Data, s.Shape...)
			h := tensor.Empty(t.Dev, dt, s.Shape...)
			t.Dev.Backend().Cast(h.Buf(), wide.Buf())
			narrow = h.Raw()
		})
		masters[n.T] = s.Data
		st.Tensors[n.Name] = nn.Stored{DType: dt, Shape: s.Shape, Data: narrow}
	}
	return masters, nil
}

// CheckResume compares the configuration a checkpoint at path was saved
// with to the run's: the model must be the same, and the rest too unless
// force, which accepts the differences and returns them.
func CheckResume(path string, saved, now Config, force bool) (changed []string, err error) {
	if saved.Model != now.Model {
		return nil, fmt.Errorf("%s: checkpoint of model %q, this run trains %q", path, saved.Model, now.Model)
	}
	changed = Mismatches(saved, now)
	if len(changed) > 0 && !force {
		return nil, fmt.Errorf("%s: the checkpoint was trained with another configuration:\n  %s\n(pass the same flags, or -resume-force to resume anyway)",
			path, strings.Join(changed, "\n  "))
	}
	return changed, nil
}

// Mismatches lists, as "name: saved -> now", where b differs from a in what
// shapes a run: the model, optimiser, AMP, checkpointing, batch, dataset,
// learning-rate schedule and its hyperparameters, and the seed. The number
// of epochs, the capture mode and EmptyCache are not among them.
func Mismatches(a, b Config) []string {
	var out []string
	diff := func(name string, x, y any) {
		if x != y {
			out = append(out, fmt.Sprintf("%s: %v -> %v", name, x, y))
		}
	}
	diff("model", a.Model, b.Model)
	diff("dataset", a.Dataset, b.Dataset)
	if a.Examples > 0 { // older checkpoints did not record it
		diff("examples", a.Examples, b.Examples)
	}
	diff("optimizer", a.Optimizer, b.Optimizer)
	diff("amp", a.AMP, b.AMP)
	diff("bf16_weights", a.BF16Weights, b.BF16Weights)
	diff("checkpoint", a.Checkpoint, b.Checkpoint)
	diff("checkpointed", a.Checkpointed, b.Checkpointed)
	diff("batch", a.Batch, b.Batch)
	diff("schedule", a.Schedule, b.Schedule)
	diff("lr", a.LR, b.LR)
	diff("momentum", a.Momentum, b.Momentum)
	diff("weight_decay", a.WeightDecay, b.WeightDecay)
	diff("warmup_epochs", a.WarmupEpochs, b.WarmupEpochs)
	diff("warmup_steps", a.WarmupSteps, b.WarmupSteps)
	diff("seed", a.Seed, b.Seed)
	diff("beta2", a.Beta2, b.Beta2)
	diff("clip_norm", a.ClipNorm, b.ClipNorm)
	diff("context", a.Context, b.Context)
	diff("tokenizer", a.Tokenizer, b.Tokenizer)
	diff("eval_every", a.EvalEvery, b.EvalEvery)
	return out
}
