package train

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/optim"
	"github.com/leangrad/leangrad/tensor"
)

// TestFusedOptimizerMatchesAndSaves: a GPT's steps with its AdamW update
// fused into the backward (FuseOptimizer) end with the plain steps'
// weights bit for bit, in F32 and under BF16 autocast, and their peak holds
// less, by at least a quarter of the gradients' bytes: the plain step
// holds them all before its update, the fused one only those not yet
// applied, and its peak moves to where the backward begins (the
// activations, and under autocast the BF16 copies of the weights, alive):
// 66% of the gradients here in F32, 30% under BF16.
func TestFusedOptimizerMatchesAndSaves(t *testing.T) { testFusedOptimizer(t, tensor.CPU()) }

func testFusedOptimizer(t *testing.T, dev *tensor.Device) {
	const context, vocab = 16, 64
	xs, ys := gptBatches(t, dev, 3, context, vocab)
	for _, amp := range []tensor.DType{0, tensor.BF16} {
		run := func(fused bool) (state [][]byte, peak, grads int64) {
			g, opt, s, release := gptStep(t, dev, nn.GPTConfig{Layers: 4, Heads: 4, Width: 256, Vocab: vocab, Context: context}, amp, Eager, fused, 0)
			defer release()
			peak = peakAfterFirst(t, s, xs, ys)
			for _, p := range opt.Params() {
				grads += p.Bytes()
			}
			return snapshotState(g), peak, grads
		}
		want, plain, grads := run(false)
		got, fused, _ := run(true)
		sameState(t, got, want, fmt.Sprintf("with the update fused into the backward under autocast %v", amp))
		t.Logf("autocast %v: peak %s plain, %s fused; the gradients %s", amp, memory.Bytes(plain), memory.Bytes(fused), memory.Bytes(grads))
		if plain-fused < grads/4 {
			t.Errorf("autocast %v: the fused step's peak is %s, the plain one's %s: want at least a quarter of the gradients' %s less",
				amp, memory.Bytes(fused), memory.Bytes(plain), memory.Bytes(grads))
		}
	}
}

// TestFuseOptimizerRefuses: a configuration whose update cannot run in the
// backward is refused by New, saying why.
func TestFuseOptimizerRefuses(t *testing.T) {
	dev := tensor.CPU()
	for _, c := range []struct {
		name string
		set  func(*Config)
		want string
	}{
		{"F16 AMP", func(c *Config) { c.AMP = AMPF16 }, "with -amp-dtype f16: F16's loss scaling"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := baseConfig("tiny")
			cfg.Optimizer, cfg.FuseOptimizer = "adamw", true
			c.set(&cfg)
			m := nn.NewResNet(dev, "tiny", 1, 10, []int{8, 16}, []int{1, 1})
			defer nn.Release(m)
			tr, err := New(m, dev, cfg, 4)
			if err == nil {
				tr.Release()
				t.Fatal("not refused")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("refused with %q, want it to say %q", err, c.want)
			}
		})
	}
}

// TestFusedStepThatFailsSaysSo: a fused step that runs out of memory
// before its first update leaves no trace, as any step; one that fails
// after it says the parameters are partly updated (ErrPartlyUpdated), and
// the Trainer does not run it again.
func TestFusedStepThatFailsSaysSo(t *testing.T) {
	dev, src := faultyDevice(true)
	xs, ys := batches(dev, 2, 16, 3)
	defer releaseAll(xs)
	defer releaseAll(ys)
	r := newRig(dev, Variant{Name: "fp32", Checkpoint: nn.NoCheckpoint}, Eager, 0)
	defer r.release()
	r.step.FuseOptimizer = true
	if err := r.step.Run(xs[0], ys[0]); err != nil { // the optimizer's state exists from here on
		t.Fatal(err)
	}
	clean, partly := 0, 0
	for fault := 1; ; fault++ {
		src.Set(memory.Faults{Every: fault, Burst: 3, Max: 1})
		err := r.step.Run(xs[1], ys[1])
		src.Set(memory.Faults{})
		if err == nil {
			break
		}
		if !errors.Is(err, memory.ErrOutOfMemory) {
			t.Fatalf("fault at allocation %d: %v", fault, err)
		}
		if errors.Is(err, ErrPartlyUpdated) {
			partly++
		} else {
			clean++
		}
	}
	if clean == 0 || partly == 0 {
		t.Fatalf("%d failures before the first update, %d after: want some of each", clean, partly)
	}
	cfg := baseConfig("tiny")
	cfg.Optimizer, cfg.FuseOptimizer = "adamw", true
	m := nn.NewResNet(dev, "tiny", 1, 10, []int{8, 16}, []int{1, 1})
	defer nn.Release(m)
	tr, err := New(m, dev, cfg, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Release()
	if err := tr.RunStep(xs[0], ys[0]); err != nil {
		t.Fatal(err)
	}
	// Every allocation from the fault on fails, the Trainer's attempts
	// again included: a step that failed cleanly is tried again, one
	// partly updated is not.
	for fault := 1; ; fault++ {
		before := tr.OOM.Recoveries
		src.Set(memory.Faults{Every: fault, Burst: 1 << 20, Max: 1})
		err := tr.RunStep(xs[1], ys[1])
		src.Set(memory.Faults{})
		tried := tr.OOM.Recoveries - before
		if err == nil {
			t.Fatalf("fault at allocation %d: the step ran", fault)
		}
		if errors.Is(err, ErrPartlyUpdated) {
			if tried != 0 {
				t.Errorf("fault at allocation %d: the Trainer ran a partly updated step again", fault)
			}
			break
		}
		if tried != 1 {
			t.Fatalf("fault at allocation %d, before the first update: %d attempts to recover, want 1 (%v)", fault, tried, err)
		}
		if err := tr.Step.SetMicroBatch(0); err != nil { // the recovery's micro-batches update after the last: whole batches again
			t.Fatal(err)
		}
	}
}

// gptBatches is n batches of 2 random token windows of context+1 tokens
// below vocab: the inputs and their next tokens, released when t ends.
func gptBatches(t testing.TB, dev *tensor.Device, n, context, vocab int) (xs, ys []*tensor.Tensor) {
	t.Cleanup(func() {
		releaseAll(xs)
		releaseAll(ys)
	})
	const batch = 2
	rng := rand.New(rand.NewPCG(3, 4))
	for range n {
		tok := make([]int32, batch*(context+1))
		for i := range tok {
			tok[i] = int32(rng.IntN(vocab))
		}
		var x, y []int32
		for b := range batch {
			w := tok[b*(context+1) : (b+1)*(context+1)]
			x, y = append(x, w[:context]...), append(y, w[1:]...)
		}
		xs, ys = append(xs, tensor.FromInt32(dev, x, batch, context).Keep()), append(ys, tensor.FromInt32(dev, y, batch, context).Keep())
	}
	return xs, ys
}

// peakAfterFirst runs s on each batch and returns the pool's highest
// peak in the steps after the first (the optimizer's state exists then).
func peakAfterFirst(t *testing.T, s *Step, xs, ys []*tensor.Tensor) (peak int64) {
	t.Helper()
	a := s.dev.Allocator()
	for i := range xs {
		a.WindowPeak()
		if err := s.Run(xs[i], ys[i]); err != nil {
			t.Fatal(err)
		}
		if p, _ := a.WindowPeak(); i > 0 {
			peak = max(peak, p)
		}
	}
	return peak
}

// seededGPT is a GPT of cfg on dev, its weights drawn from the generator
// seeded with 5 (the same for every run of a comparison).
func seededGPT(t *testing.T, dev *tensor.Device, cfg nn.GPTConfig) *nn.GPT {
	t.Helper()
	dev.Generator().Seed(5)
	g, err := nn.NewGPT(dev, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// gptStep is a seeded GPT of cfg, its AdamW (no decay on its norms and
// biases) and a Step of it in mode under autocast amp, updating in the
// backward when fused, clipped to clip; release gives them back.
func gptStep(t *testing.T, dev *tensor.Device, cfg nn.GPTConfig, amp tensor.DType, mode Mode, fused bool, clip float64) (*nn.GPT, *optim.AdamW, *Step, func()) {
	t.Helper()
	g := seededGPT(t, dev, cfg)
	opt := optim.NewAdamW(nn.Parameters(g), 1e-3, 0.1)
	opt.NoDecay = nn.NoDecay(g)
	s := NewStep(dev, g, opt, amp, mode)
	s.FuseOptimizer, s.ClipNorm = fused, clip
	return g, opt, s, func() {
		s.Release()
		opt.Release()
		nn.Release(g)
	}
}

// runSteps runs s on the batches xs, ys from the generator's seed 9, checks
// that no step of a planned or captured s fell back to eager, syncs s's
// generator position to the host's, and returns the size of its plan for
// the batches' shape (0: none).
func runSteps(t *testing.T, s *Step, xs, ys []*tensor.Tensor) int64 {
	t.Helper()
	s.dev.Generator().Seed(9)
	for i := range xs {
		if err := s.Run(xs[i], ys[i]); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Notes(); s.Mode != Eager && strings.Contains(strings.Join(n, "\n"), "eagerly") {
		t.Errorf("%v step fell back: %v", s.Mode, n)
	}
	s.SyncRNG()
	if p := s.Plan(xs[0].DType(), xs[0].Shape(), ys[0].Shape()); p != nil {
		return p.Size
	}
	return 0
}

// TestFusedClippedStepMatches: a GPT's clipped steps (with dropout) with
// the update fused into the backward (Note [the norm in a first pass]) end
// with the plain clipped steps' weights within a millionth and the same
// gradients' norm within a hundred-thousandth (the norm's squares are
// summed a parameter at a time), in F32 and under BF16 autocast, with a
// clip that bites; their peak is the unclipped fused step's but for the
// rows of squares (below the plain step's), and the metrics count one
// pass.
func TestFusedClippedStepMatches(t *testing.T) {
	dev := tensor.CPU()
	const context, vocab, clip = 16, 64, 0.05
	xs, ys := gptBatches(t, dev, 3, context, vocab)
	for _, amp := range []tensor.DType{0, tensor.BF16} {
		run := func(fused bool, clip float64) (state [][]byte, peak, grads int64, norm, loss float64) {
			g, opt, s, release := gptStep(t, dev, nn.GPTConfig{Layers: 2, Heads: 4, Width: 128, Vocab: vocab, Context: context, Dropout: 0.1}, amp, Eager, fused, clip)
			defer release()
			dev.Generator().Seed(9)
			peak = peakAfterFirst(t, s, xs, ys)
			for _, p := range opt.Params() {
				grads += p.Bytes()
			}
			sums := s.metrics.Float32s()
			return snapshotState(g), peak, grads, s.GradNorm(), float64(sums[0])
		}
		want, plain, grads, wantNorm, wantLoss := run(false, clip)
		got, fused, _, gotNorm, gotLoss := run(true, clip)
		_, unclipped, _, _, _ := run(true, 0)
		if wantNorm <= clip {
			t.Fatalf("autocast %v: the gradients' norm %v does not pass the clip %v", amp, wantNorm, clip)
		}
		if math.Abs(gotNorm-wantNorm) > 1e-5*wantNorm || gotLoss != wantLoss {
			t.Errorf("autocast %v: norm %v and loss sum %v fused, %v and %v plain", amp, gotNorm, gotLoss, wantNorm, wantLoss)
		}
		closeState(t, got, want, fmt.Sprintf("under autocast %v fused, against plain", amp))
		t.Logf("autocast %v: peak %s plain, %s fused, %s fused unclipped; the gradients %s; norm %v",
			amp, memory.Bytes(plain), memory.Bytes(fused), memory.Bytes(unclipped), memory.Bytes(grads), gotNorm)
		if rows := 3 * memory.RoundSize(4*32); fused > unclipped+rows || fused >= plain { // the rows, the coefficient and their sum
			t.Errorf("autocast %v: the fused clipped step's peak is %s, the unclipped one's %s, the plain clipped one's %s: want at most the unclipped one's and its rows of squares, their sum and the coefficient (%s)",
				amp, memory.Bytes(fused), memory.Bytes(unclipped), memory.Bytes(plain), memory.Bytes(rows))
		}
	}
}

// TestFusedPlannedStepsMatchEager: a GPT's steps with the update fused into
// the backward (with dropout; unclipped, and clipped through a first pass)
// run planned as they run eagerly, in F32 and under BF16 autocast: the same
// weights bit for bit, the same loss sums, gradients' norm and generator
// position, no step fallen back to eager; and the plan holds the fused
// step's saving, its arena below the unfused planned step's by at least an
// eighth of the gradients' bytes (31% here in F32, 15% under BF16, whose
// copies of the weights are alive where the backward begins).
func TestFusedPlannedStepsMatchEager(t *testing.T) { testFusedPlannedSteps(t, tensor.CPU(), Planned) }

// testFusedPlannedSteps runs on dev with planMode: Planned on the CPU,
// Captured on the GPU.
func testFusedPlannedSteps(t *testing.T, dev *tensor.Device, planMode Mode) {
	const context, vocab = 16, 64
	xs, ys := gptBatches(t, dev, 6, context, vocab)
	for _, c := range []struct {
		name string
		amp  tensor.DType
		clip float64
	}{
		{"f32", 0, 0},
		{"f32 clipped", 0, 0.05},
		{"bf16", tensor.BF16, 0},
		{"bf16 clipped", tensor.BF16, 0.05},
	} {
		t.Run(c.name, func(t *testing.T) {
			type result struct {
				state        [][]byte
				loss, norm   float64
				offset       uint64
				arena, grads int64
			}
			run := func(mode Mode, fused bool) (r result) {
				g, opt, s, release := gptStep(t, dev, nn.GPTConfig{Layers: 2, Heads: 4, Width: 128, Vocab: vocab, Context: context, Dropout: 0.1}, c.amp, mode, fused, c.clip)
				defer release()
				defer sameAlgorithms(dev, s)()
				r.arena = runSteps(t, s, xs, ys)
				for _, p := range opt.Params() {
					r.grads += p.Bytes()
				}
				sums := s.metrics.Float32s()
				r.state, r.loss, r.norm, r.offset = snapshotState(g), float64(sums[0]), s.GradNorm(), dev.Generator().State().Offset
				return r
			}
			want, got := run(Eager, true), run(planMode, true)
			sameState(t, got.state, want.state, fmt.Sprintf("%v fused steps against eager ones", planMode))
			if got.loss != want.loss || got.norm != want.norm || got.offset != want.offset {
				t.Errorf("%v: loss sum %v, norm %v, generator offset %d; eager %v, %v, %d", planMode, got.loss, got.norm, got.offset, want.loss, want.norm, want.offset)
			}
			plain := run(planMode, false)
			t.Logf("arena %s fused, %s unfused; the gradients %s", memory.Bytes(got.arena), memory.Bytes(plain.arena), memory.Bytes(got.grads))
			if got.arena == 0 || plain.arena-got.arena < got.grads/8 {
				t.Errorf("the fused step's arena is %s, the unfused one's %s: want at least an eighth of the gradients' %s less",
					memory.Bytes(got.arena), memory.Bytes(plain.arena), memory.Bytes(got.grads))
			}
		})
	}
}
