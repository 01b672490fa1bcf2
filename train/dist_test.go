package train

import (
	"bytes"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/dist"
	"github.com/leangrad/leangrad/internal/testdev"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/optim"
	"github.com/leangrad/leangrad/tensor"
)

// onRanks runs f as rank r of a job over devs, one goroutine each.
func onRanks(t *testing.T, devs []*tensor.Device, f func(g *dist.Group) error) {
	addr := testdev.FreeAddr(t)
	errs := make([]error, len(devs))
	var wg sync.WaitGroup
	for r, dev := range devs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := dist.Join(dev, dist.Config{Rank: r, Size: len(devs), Addr: addr, Timeout: time.Minute})
			if err != nil {
				errs[r] = err
				return
			}
			if err := f(g); err != nil {
				g.Abort(fmt.Errorf("rank %d: %v", r, err))
				errs[r] = err
				return
			}
			errs[r] = g.Close()
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// sgdStep is an fp32 step of m (SGD, Nesterov momentum 0.9, learning rate
// 0.1, weight decay wd) in mode, the function that releases it with m, and
// one that reads m's parameters.
func sgdStep(dev *tensor.Device, m nn.Model, wd float64, mode Mode) (*Step, func(), func() [][]float32) {
	opt := optim.NewSGD(nn.Parameters(m), 0.1, 0.9, wd, true)
	s := NewStep(dev, m, opt, 0, mode)
	release := func() { s.Release(); opt.Release(); nn.Release(m) }
	params := func() [][]float32 {
		var ps [][]float32
		for _, p := range nn.Parameters(m) {
			ps = append(ps, p.Float32s())
		}
		return ps
	}
	return s, release, params
}

// checkRanksMatch fails t unless every rank's parameters got are within
// 1e-5 of want, one process's on the whole batches, and bit for bit rank 0's.
func checkRanksMatch(t *testing.T, got [][][]float32, want [][]float32) {
	t.Helper()
	if t.Failed() {
		return
	}
	for r := range got {
		for i := range want {
			if e := relDiff(got[r][i], want[i]); e > 1e-5 {
				t.Errorf("rank %d, parameter %d: relative difference %.3g from one step on the whole batch", r, i, e)
			}
			if r > 0 && relDiff(got[r][i], got[0][i]) != 0 {
				t.Errorf("rank %d, parameter %d differs from rank 0's", r, i)
			}
		}
	}
}

// TestDataParallelStepMatchesOneBigStep: two ranks, each stepping on its
// half of every batch, end with the same parameters as each other (bit for
// bit) and as one process stepping on the whole batches, within 1e-5: an
// MLP (no batch norm), fp32, SGD with momentum, four steps.
func TestDataParallelStepMatchesOneBigStep(t *testing.T) {
	testDataParallelStep(t, []*tensor.Device{tensor.NewDevice(cpu.New()), tensor.NewDevice(cpu.New())}, Eager)
}

// testDataParallelStep runs the comparison on devs (one rank each) with
// the steps in mode (Captured on GPUs: the all-reduce is in the graph).
func testDataParallelStep(t *testing.T, devs []*tensor.Device, mode Mode) {
	const steps, batch = 4, 16
	build := func(dev *tensor.Device, seed uint64) (*Step, func(), func() [][]float32) {
		dev.Generator().Seed(seed)
		return sgdStep(dev, nn.NewMLP(dev, []int{144, 32, 10}, 0), 5e-4, mode)
	}
	flat := func(x *tensor.Tensor) *tensor.Tensor { return x.View(x.Dim(0), 144) } // a new handle, to release

	// One process, whole batches.
	xs, ys := batches(devs[0], steps, batch, 3)
	ref, release, refParams := build(devs[0], 7)
	for i := range xs {
		x := flat(xs[i])
		err := ref.Run(x, ys[i])
		x.Release()
		if err != nil {
			t.Fatal(err)
		}
	}
	want := refParams()
	release()
	releaseAll(xs)
	releaseAll(ys)

	got := make([][][]float32, len(devs))
	onRanks(t, devs, func(g *dist.Group) error {
		dev := g.Device()
		s, release, params := build(dev, 7+uint64(g.Rank())) // rank 1 starts elsewhere: SetGroup gives it rank 0's
		defer release()
		if err := s.SetGroup(g, false); err != nil {
			return err
		}
		xs, ys := batches(dev, steps, batch, 3)
		defer releaseAll(xs)
		defer releaseAll(ys)
		per := batch / g.Size()
		a := dev.Allocator()
		var held []int64 // bytes allocated after each step
		for i := range xs {
			lo := g.Rank() * per
			whole := flat(xs[i])
			x, y := whole.Rows(lo, lo+per), ys[i].Rows(lo, lo+per)
			whole.Release()
			err := s.Run(x, y)
			x.Release()
			y.Release()
			if err != nil {
				return err
			}
			held = append(held, a.Stats().Allocated[memory.All].Current)
		}
		// The gradients are views into the buckets (released after each
		// step), so a step leaves nothing behind: no growth once the
		// optimiser's state and (captured) the arena exist.
		if held[steps-1] != held[steps-2] {
			return fmt.Errorf("allocated after the last two steps: %s, then %s", memory.Bytes(held[steps-2]), memory.Bytes(held[steps-1]))
		}
		if ok, why := s.Reducer().Overlap(); !ok {
			return fmt.Errorf("the all-reduces did not overlap the backward: %s", why)
		}
		got[g.Rank()] = params()
		return nil
	})
	checkRanksMatch(t, got, want)
}

// TestDataParallelFit: two ranks train a ResNet (batch norm, AMP) for an
// epoch: they end with identical parameters, report the same job-wide
// figures (the loss and accuracy of every rank's examples, the test
// accuracy of the whole test set), and only rank 0 writes the checkpoint.
// With the optimiser's state sharded, the checkpoint is the unsharded
// job's, byte for byte.
func TestDataParallelFit(t *testing.T) {
	dir := t.TempDir()
	for _, shard := range []bool{false, true} {
		t.Run(fmt.Sprintf("shard-%v", shard), func(t *testing.T) {
			testDataParallelFit(t, filepath.Join(dir, fmt.Sprint(shard)), shard)
		})
	}
	unsharded, _, err := readCheckpoint(filepath.Join(dir, "false", "rank0.ckpt"))
	if err != nil {
		t.Fatal(err)
	}
	sharded, _, err := readCheckpoint(filepath.Join(dir, "true", "rank0.ckpt"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := slices.Sorted(maps.Keys(sharded.Tensors)), slices.Sorted(maps.Keys(unsharded.Tensors)); !slices.Equal(got, want) {
		t.Fatalf("the sharded job's checkpoint holds %v, the unsharded job's %v", got, want)
	}
	for name, s := range unsharded.Tensors {
		if !bytes.Equal(sharded.Tensors[name].Data, s.Data) {
			t.Errorf("tensor %s of the sharded job's checkpoint differs from the unsharded job's", name)
		}
	}
}

func testDataParallelFit(t *testing.T, dir string, shard bool) {
	trainSet, testSet := datasets.SyntheticSize(256, 1, 12), datasets.SyntheticSize(101, 2, 12) // an odd test set: uneven shares
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	type result struct {
		params  [][]float32
		history []EpochMetrics
	}
	devs := []*tensor.Device{tensor.NewDevice(cpu.New()), tensor.NewDevice(cpu.New())}
	results := make([]result, len(devs))
	onRanks(t, devs, func(g *dist.Group) error {
		dev := g.Device()
		dev.Generator().Seed(11 + uint64(g.Rank()))
		m := nn.NewResNet(dev, "tiny", 1, 10, []int{8, 16}, []int{1, 1})
		defer nn.Release(m)
		cfg := baseConfig("tiny")
		cfg.AMP, cfg.Batch = AMPF16, 16
		mean, std := trainSet.MeanStd()
		trainL := datasets.NewLoader(trainSet, dev, datasets.LoaderConfig{Batch: cfg.Batch, Shuffle: true, Seed: 1, Mean: mean, Std: std,
			Rank: g.Rank(), Ranks: g.Size(), EvenShards: true})
		testL := datasets.NewLoader(testSet, dev, datasets.LoaderConfig{Batch: 20, Mean: mean, Std: std, Rank: g.Rank(), Ranks: g.Size()})
		tr, err := New(m, dev, cfg, trainL.Len())
		if err != nil {
			return err
		}
		defer tr.Release()
		if err := tr.SetGroup(g, shard); err != nil {
			return err
		}
		if err := tr.Fit(trainL, testL, nil, filepath.Join(dir, fmt.Sprintf("rank%d.ckpt", g.Rank()))); err != nil {
			return err
		}
		var ps [][]float32
		for _, p := range nn.Parameters(m) {
			ps = append(ps, p.Float32s())
		}
		results[g.Rank()] = result{ps, tr.History}
		return nil
	})
	if t.Failed() {
		return
	}
	for i := range results[0].params {
		if relDiff(results[1].params[i], results[0].params[i]) != 0 {
			t.Errorf("parameter %d differs between the ranks after an epoch", i)
		}
	}
	h0, h1 := results[0].history[0], results[1].history[0]
	if h0.TrainLoss != h1.TrainLoss || h0.TrainAcc != h1.TrainAcc || h0.TestAcc != h1.TestAcc || h0.TestLoss != h1.TestLoss {
		t.Errorf("the ranks report different figures: %+v and %+v", h0, h1)
	}
	if acc := float64(h0.TestAcc) * 101; math.Abs(acc-math.Round(acc)) > 1e-3 {
		t.Errorf("test accuracy %v is not a count out of the 101 test images", h0.TestAcc)
	}
	if _, err := os.Stat(filepath.Join(dir, "rank0.ckpt")); err != nil {
		t.Errorf("rank 0 wrote no checkpoint: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "rank1.ckpt")); err == nil {
		t.Error("rank 1 wrote a checkpoint")
	}
}

// stepTolerance bounds how far a two-rank ResNet update may be from the
// whole-batch one, relative to the update's size, with batch norm in
// training mode (TestDataParallelResNetStep).
const stepTolerance = 0.25

// TestDataParallelResNetStep: a ResNet's update on two ranks against one
// process's on the whole batches (fp32, two steps: the second overlaps its
// all-reduces with the backward). With batch norm in evaluation mode they
// agree within 1e-5, also with checkpointed blocks (whose parameters'
// gradients are finished inside the blocks' recomputation); in training
// mode each rank normalises its own half of the batch, as in PyTorch's DDP
// without SyncBatchNorm, and the update stays within stepTolerance of the
// whole-batch one (relative to its size, over all parameters). The ranks
// agree bit for bit either way.
func TestDataParallelResNetStep(t *testing.T) {
	fresh := func() *tensor.Device { return tensor.NewDevice(cpu.New()) }
	testDataParallelResNetStep(t, fresh(), []*tensor.Device{fresh(), fresh()}, Eager, 2, 1e-5)
}

// testDataParallelResNetStep compares steps of ranks (one device each)
// with steps on ref, in mode; exact is the bound with batch norm in
// evaluation mode.
func testDataParallelResNetStep(t *testing.T, ref *tensor.Device, ranks []*tensor.Device, mode Mode, steps int, exact float64) {
	for _, tc := range []struct {
		training bool
		ckpt     nn.CheckpointMode
		max      float64
	}{{false, nn.NoCheckpoint, exact}, {false, nn.CheckpointBlocks, exact}, {true, nn.NoCheckpoint, stepTolerance}} {
		diff := dataParallelResNetStep(t, ref, ranks, mode, steps, tc.training, tc.ckpt)
		t.Logf("batch norm training %v, checkpoint %v: the two-rank update is %.3g away from the whole-batch one, relative to its size", tc.training, tc.ckpt, diff)
		if diff > tc.max || (tc.training && diff == 0) {
			t.Errorf("batch norm training %v, checkpoint %v: relative difference of the updates %.3g, want at most %g", tc.training, tc.ckpt, diff, tc.max)
		}
	}
}

// dataParallelResNetStep returns ‖two-rank update − whole-batch update‖ /
// ‖whole-batch update‖ over steps of a small ResNet.
func dataParallelResNetStep(t *testing.T, refDev *tensor.Device, ranks []*tensor.Device, mode Mode, steps int, training bool, ckpt nn.CheckpointMode) float64 {
	const batch = 32
	build := func(dev *tensor.Device, seed uint64) (*Step, func(), func() [][]float32) {
		dev.Generator().Seed(seed)
		m := nn.NewResNet(dev, "tiny", 1, 10, []int{8, 16}, []int{1, 1})
		m.SetTraining(training)
		m.Checkpoint = ckpt
		return sgdStep(dev, m, 0, mode)
	}
	xs, ys := batches(refDev, steps, batch, 5)
	ref, release, refParams := build(refDev, 7)
	start := refParams()
	for i := range xs {
		if err := ref.Run(xs[i], ys[i]); err != nil {
			t.Fatal(err)
		}
	}
	want := refParams()
	release()
	releaseAll(xs)
	releaseAll(ys)

	got := make([][][]float32, len(ranks))
	onRanks(t, ranks, func(g *dist.Group) error {
		s, release, params := build(g.Device(), 7)
		defer release()
		if err := s.SetGroup(g, false); err != nil {
			return err
		}
		xs, ys := batches(g.Device(), steps, batch, 5)
		defer releaseAll(xs)
		defer releaseAll(ys)
		lo := g.Rank() * batch / 2
		for i := range xs {
			x, y := xs[i].Rows(lo, lo+batch/2), ys[i].Rows(lo, lo+batch/2)
			err := s.Run(x, y)
			x.Release()
			y.Release()
			if err != nil {
				return err
			}
		}
		if ok, why := s.Reducer().Overlap(); !ok {
			return fmt.Errorf("the all-reduces did not overlap the backward: %s", why)
		}
		got[g.Rank()] = params()
		return nil
	})
	if t.Failed() {
		t.FailNow()
	}
	var num, den float64
	for i := range want {
		if relDiff(got[1][i], got[0][i]) != 0 {
			t.Errorf("parameter %d differs between the ranks", i)
		}
		for j := range want[i] {
			d := float64(got[0][i][j]) - float64(want[i][j])
			u := float64(want[i][j]) - float64(start[i][j])
			num, den = num+d*d, den+u*u
		}
	}
	return math.Sqrt(num / den)
}

// TestDataParallelGPTStep: a GPT (tied embeddings: the table's gradient
// comes from the embedding and the classifier) on two ranks, each on its
// half of every batch, with its gradients clipped after the all-reduce,
// ends with the parameters of one process stepping on the
// whole batches, within 1e-5, the ranks bit for bit alike.
func TestDataParallelGPTStep(t *testing.T) {
	const steps, batch, T, V, clip = 3, 4, 8, 13, 1.0
	rng := rand.New(rand.NewPCG(4, 4))
	tokens := make([][]int32, steps)
	for i := range tokens {
		tokens[i] = make([]int32, batch*(T+1))
		for j := range tokens[i] {
			tokens[i][j] = int32(rng.IntN(V))
		}
	}
	// window is rows [lo, hi) of step i's batch: inputs and next tokens.
	window := func(dev *tensor.Device, i, lo, hi int) (x, y *tensor.Tensor) {
		var xs, ys []int32
		for r := lo; r < hi; r++ {
			row := tokens[i][r*(T+1) : (r+1)*(T+1)]
			xs, ys = append(xs, row[:T]...), append(ys, row[1:]...)
		}
		return tensor.FromInt32(dev, xs, hi-lo, T), tensor.FromInt32(dev, ys, hi-lo, T)
	}
	build := func(dev *tensor.Device, seed uint64) (*Step, func(), func() [][]float32) {
		dev.Generator().Seed(seed)
		g, err := nn.NewGPT(dev, nn.GPTConfig{Layers: 2, Heads: 2, Width: 16, Vocab: V, Context: T})
		if err != nil {
			t.Fatal(err)
		}
		s, release, params := sgdStep(dev, g, 0, Eager)
		s.ClipNorm = clip
		return s, release, params
	}
	run := func(s *Step, dev *tensor.Device, i, lo, hi int) error {
		var err error
		dev.WithScope(func() {
			x, y := window(dev, i, lo, hi)
			err = s.Run(x, y)
		})
		return err
	}
	dev := tensor.NewDevice(cpu.New())
	ref, release, refParams := build(dev, 7)
	var norms []float64
	for i := range steps {
		if err := run(ref, dev, i, 0, batch); err != nil {
			t.Fatal(err)
		}
		norms = append(norms, ref.GradNorm())
	}
	// Some steps clip and some do not, so that neither the clipping nor
	// the averaging can be wrong unnoticed (a sum's direction clips alike).
	if slices.Max(norms) <= clip || slices.Min(norms) >= clip {
		t.Fatalf("gradient norms %v: want some above and some below %v", norms, clip)
	}
	t.Logf("gradient norms of the whole batches: %.3g", norms)
	want := refParams()
	release()

	got := make([][][]float32, 2)
	onRanks(t, []*tensor.Device{tensor.NewDevice(cpu.New()), tensor.NewDevice(cpu.New())}, func(g *dist.Group) error {
		dev := g.Device()
		s, release, params := build(dev, 7+uint64(g.Rank()))
		defer release()
		if err := s.SetGroup(g, false); err != nil {
			return err
		}
		per := batch / g.Size()
		for i := range steps {
			if err := run(s, dev, i, g.Rank()*per, (g.Rank()+1)*per); err != nil {
				return err
			}
		}
		got[g.Rank()] = params()
		return nil
	})
	checkRanksMatch(t, got, want)
}
