package train

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/optim"
	"github.com/leangrad/leangrad/tensor"
)

// tokenBatches makes n batches of b windows of T tokens below vocab, and
// their next tokens.
func tokenBatches(dev *tensor.Device, n, b, T, vocab int, seed uint64) (xs, ys []*tensor.Tensor) {
	rng := rand.New(rand.NewPCG(seed, 9))
	for range n {
		x, y := make([]int32, b*T), make([]int32, b*T)
		for i := range x {
			x[i], y[i] = int32(rng.IntN(vocab)), int32(rng.IntN(vocab))
		}
		xs = append(xs, tensor.FromInt32(dev, x, b, T).Keep())
		ys = append(ys, tensor.FromInt32(dev, y, b, T).Keep())
	}
	return xs, ys
}

// TestGPTPlannedStepsMatchEager: a GPT's planned (on a GPU, captured)
// steps, with AdamW's groups, gradient clipping and dropout, leave the
// parameters, metrics and scale bit for bit where eager steps do, in fp32,
// under f16 (scaled) and bf16 autocast, and checkpointed (every block, √n
// segments, the first block; lightly, every block and the first), with a shorter last batch beside the full
// ones; and the pool holds no more after the steps than before them but
// the optimiser's state.
func TestGPTPlannedStepsMatchEager(t *testing.T) {
	testGPTPlannedStepsMatchEager(t, tensor.CPU(), Planned)
}

// testGPTPlannedStepsMatchEager runs on dev with planMode, Planned on the CPU and Captured on the GPU.
func testGPTPlannedStepsMatchEager(t *testing.T, dev *tensor.Device, planMode Mode) {
	const T, V = 16, 97
	xs, ys := tokenBatches(dev, 6, 4, T, V, 1)
	defer releaseAll(xs)
	defer releaseAll(ys)
	tail, tailY := tokenBatches(dev, 1, 3, T, V, 2)
	defer releaseAll(tail)
	defer releaseAll(tailY)
	for _, v := range []struct {
		name, amp, ckpt string
		first           int // the blocks checkpointed, of two (0: all)
	}{{"fp32", "", "none", 0}, {"amp f16", "f16", "none", 0}, {"amp bf16", "bf16", "none", 0}, {"checkpoint", "", "blocks", 0},
		{"amp bf16+sqrt", "bf16", "sqrt", 0}, {"amp bf16+the first block", "bf16", "blocks", 1},
		{"amp bf16+light", "bf16", "light", 0}, {"light, the first block", "", "light", 1}} {
		t.Run(v.name, func(t *testing.T) {
			amp, _ := ParseAMP(v.amp)
			cfg := Config{AMP: amp}
			run := func(mode Mode) (params [][]float32, loss float64, right int, scale float64, norm float64) {
				dev.Generator().Seed(3)
				g, err := nn.NewGPT(dev, nn.GPTConfig{Layers: 2, Heads: 2, Width: 32, Vocab: V, Context: T, Dropout: 0.1})
				if err != nil {
					t.Fatal(err)
				}
				defer nn.Release(g)
				ck, _ := nn.ParseCheckpointMode(v.ckpt)
				g.SetCheckpoint(ck)
				g.SetCheckpointed(v.first)
				opt := optim.NewAdamW(nn.Parameters(g), 1e-3, 0.1)
				opt.NoDecay = nn.NoDecay(g)
				defer opt.Release()
				s := NewStep(dev, g, opt, cfg.Autocast(), mode)
				s.ClipNorm = 0.5
				defer s.Release()
				s.Planning.AsTraced = true
				a := dev.Allocator()
				for i := range xs {
					if err := s.Run(xs[i], ys[i]); err != nil {
						t.Fatal(err)
					}
					if i%3 == 2 {
						if err := s.Run(tail[0], tailY[0]); err != nil {
							t.Fatal(err)
						}
					}
					if i == 3 {
						dev.Synchronize()
						before := a.Stats().Allocated[memory.All].Current
						for range 2 {
							if err := s.Run(xs[i], ys[i]); err != nil {
								t.Fatal(err)
							}
						}
						dev.Synchronize()
						if after := a.Stats().Allocated[memory.All].Current; after != before {
							t.Errorf("%v: %d bytes allocated after two more steps, %d before", mode, after, before)
						}
					}
				}
				if n := s.Notes(); mode != Eager && (s.Plan(tensor.I32, []int{4, T}, []int{4, T}) == nil || strings.Contains(strings.Join(n, "\n"), "eagerly")) {
					t.Errorf("%v step was not planned: %v", mode, n)
				}
				for _, p := range nn.Parameters(g) {
					params = append(params, p.Float32s())
				}
				tally, _ := s.Metrics()
				return params, tally.LossSum, int(tally.Right), s.Scaler.Scale(), s.GradNorm()
			}
			ep, el, er, es, en := run(Eager)
			pp, pl, pr, ps, pn := run(planMode)
			for i := range ep {
				if !equalBits(pp[i], ep[i]) {
					t.Errorf("parameter %d: %v steps differ from eager by %.3g", i, planMode, relDiff(pp[i], ep[i]))
				}
			}
			if pl != el || pr != er || ps != es || pn != en {
				t.Errorf("%v: loss sum %v, right %d, scale %v, grad norm %v; eager %v %d %v %v", planMode, pl, pr, ps, pn, el, er, es, en)
			}
			if !(en > 0.5) {
				t.Errorf("the gradient norm %v is not above the clip of 0.5: the test does not clip", en)
			}
		})
	}
}

// mulCounter counts the backend's multiplications of n elements.
type mulCounter struct {
	kernels.Backend
	n, muls int
}

func (c *mulCounter) Binary(op kernels.BinaryOp, y, a, b kernels.Buf, bc kernels.Broadcast) {
	if op == kernels.Mul && y.N == c.n {
		c.muls++
	}
	c.Backend.Binary(op, y, a, b, bc)
}

// TestGPTStepScalesTheClassifierInItsForward: in an fp16 step the
// classifier makes its gradients for the loss times the GradScaler's
// scale (GradScaler.Forward), and the backward multiplies no gradient of
// its table's size by the scale.
func TestGPTStepScalesTheClassifierInItsForward(t *testing.T) {
	const T, V, C = 8, 37, 16
	mc := &mulCounter{Backend: cpu.New(), n: V * C}
	dev := tensor.NewDevice(mc)
	xs, ys := tokenBatches(dev, 2, 2, T, V, 1)
	defer releaseAll(xs)
	defer releaseAll(ys)
	g, err := nn.NewGPT(dev, nn.GPTConfig{Layers: 1, Heads: 2, Width: C, Vocab: V, Context: T})
	if err != nil {
		t.Fatal(err)
	}
	defer nn.Release(g)
	opt := optim.NewAdamW(nn.Parameters(g), 1e-3, 0.1)
	defer opt.Release()
	s := NewStep(dev, g, opt, tensor.F16, Eager)
	defer s.Release()
	if !s.Scaler.Enabled() {
		t.Fatal("an fp16 step without a GradScaler")
	}
	for i := range xs {
		if err := s.Run(xs[i], ys[i]); err != nil {
			t.Fatal(err)
		}
	}
	if mc.muls != 0 {
		t.Errorf("the steps multiplied %d tensors of the token table's %d elements, want none", mc.muls, V*C)
	}
}

// BenchmarkCheckpointModes times an eager training step of a GPT of four
// blocks of width 512 (context 128, batch 32, F32, AdamW: its products
// outweigh its attention, as GPT-2's on a GPU do) without
// checkpoints, with its blocks checkpointed lightly and checkpointed, and
// reports each step's peak of allocated bytes beyond what lived before it
// (Note [light checkpoints] in package autograd):
//
//	go test ./train -run XXX -bench CheckpointModes
func BenchmarkCheckpointModes(b *testing.B) {
	const T, V, batch = 128, 256, 32
	dev := tensor.CPU()
	xs, ys := tokenBatches(dev, 1, batch, T, V, 1)
	defer releaseAll(xs)
	defer releaseAll(ys)
	for _, mode := range []nn.CheckpointMode{nn.NoCheckpoint, nn.CheckpointLight, nn.CheckpointBlocks} {
		b.Run(mode.String(), func(b *testing.B) {
			dev.Generator().Seed(3)
			g, err := nn.NewGPT(dev, nn.GPTConfig{Layers: 4, Heads: 8, Width: 512, Vocab: V, Context: T})
			if err != nil {
				b.Fatal(err)
			}
			defer nn.Release(g)
			g.SetCheckpoint(mode)
			opt := optim.NewAdamW(nn.Parameters(g), 1e-3, 0.1)
			defer opt.Release()
			s := NewStep(dev, g, opt, 0, Eager)
			defer s.Release()
			if err := s.Run(xs[0], ys[0]); err != nil { // the optimiser's state
				b.Fatal(err)
			}
			a := dev.Allocator()
			before := a.Stats().Allocated[memory.All].Current
			a.WindowPeak()
			b.ResetTimer()
			for range b.N {
				if err := s.Run(xs[0], ys[0]); err != nil {
					b.Fatal(err)
				}
			}
			peak, _ := a.WindowPeak()
			b.ReportMetric(float64(peak-before), "peak-bytes")
		})
	}
}
