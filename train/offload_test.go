package train

import (
	"bytes"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/internal/testdev"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/optim"
	"github.com/leangrad/leangrad/tensor"
)

// TestOffloadedStepMatches: a GPT's steps with AdamW offloaded to a host
// pool of its own end with the on-device optimizer's weights: bit for bit
// in F32, within a millionth under BF16 autocast with clipping (the norm
// is summed a parameter at a time); in micro-batches, their gradients
// summed on the host, under SGD, within a millionth (the tied embedding's
// parts add in another order). Every gradient begins to come down
// during the backward (the step gives the optimizer the backward's hook)
// and leaves the device then, and without clipping every parameter is
// updated there too (HostUpdateInBackward), so that the step's peak is below the
// on-device one's by the state and some of the gradients; the device holds
// none of the optimizer's state, the host pool exactly the optimizer's
// copies, state and scalars, and nothing once it is released. With the
// first parameters' state kept on the device (Config.DeviceState), the
// same, but the device holds their state and the host nothing of them.
func TestOffloadedStepMatches(t *testing.T) {
	dev := tensor.CPU()
	const context, vocab = 16, 64
	xs, ys := gptBatches(t, dev, 3, context, vocab)
	for _, c := range []struct {
		amp   tensor.DType
		clip  float64
		micro int     // micro-batches of this many examples (0: none)
		keep  float64 // the share of the parameters' bytes whose state stays on the device
	}{{0, 0, 0, 0}, {tensor.BF16, 0.05, 0, 0}, {0, 0, 1, 0}, {tensor.BF16, 0.05, 1, 0}, {0, 0, 0, 0.4}, {tensor.BF16, 0.05, 1, 0.4}} {
		var peaks [2]int64
		var params, offParams int64 // all the parameters' bytes, those offloaded
		run := func(offload bool) [][]byte {
			g := seededGPT(t, dev, nn.GPTConfig{Layers: 2, Heads: 4, Width: 128, Vocab: vocab, Context: context})
			defer nn.Release(g)
			adamw := optim.NewAdamW(nn.Parameters(g), 1e-2, 0.1)
			adamw.NoDecay = nn.NoDecay(g)
			var opt optim.Optimizer = adamw
			if c.micro > 0 {
				adamw.Release()
				sgd := optim.NewSGD(nn.Parameters(g), 1e-1, 0.9, 0.1, true)
				sgd.NoDecay = nn.NoDecay(g)
				opt = sgd
			}
			host := tensor.NewDevice(cpu.New())
			if offload {
				off, err := optim.OffloadSome(opt, host, KeptOnDevice(opt.Params(), c.keep))
				if err != nil {
					t.Fatal(err)
				}
				opt = off
			}
			s := NewStep(dev, g, opt, c.amp, Eager)
			s.ClipNorm, s.HostUpdateInBackward = c.clip, true
			defer s.Release()
			if err := s.SetMicroBatch(c.micro); err != nil {
				t.Fatal(err)
			}
			peak := peakAfterFirst(t, s, xs, ys)
			params, offParams = 0, 0
			kept := KeptOnDevice(opt.Params(), c.keep)
			for i, p := range opt.Params() {
				params += p.Bytes()
				if !kept[i] {
					offParams += p.Bytes()
				}
			}
			if c.keep > 0 && (offParams == params || float64(params-offParams) > c.keep*float64(params)) {
				t.Fatalf("%s of %s kept on the device: want some, at most %v of them", memory.Bytes(params-offParams), memory.Bytes(params), c.keep)
			}
			if offload {
				peaks[1] = peak
			} else {
				peaks[0] = peak
			}
			if off, ok := opt.(*optim.Offloaded); ok {
				if got := off.Overlapped(); got != 1 {
					t.Errorf("autocast %v: %.3f of the gradients' bytes came down during the backward, want all", c.amp, got)
				}
				if got, want := off.UpdatedInBackward(), map[bool]float64{true: 1, false: 0}[c.clip == 0]; got != want {
					t.Errorf("autocast %v, clip %v: %.3f of the parameters' bytes updated during the backward, want %v", c.amp, c.clip, got, want)
				}
				var keptState int64 // AdamW's moments; SGD's momentum
				for i, p := range off.Params() {
					if kept[i] {
						keptState += map[bool]int64{true: 2, false: 1}[c.micro == 0] * memory.RoundSize(p.Bytes())
					}
				}
				if n := s.OptimizerStateBytes(); n != keptState {
					t.Errorf("autocast %v, kept %v: the device holds %d bytes of the offloaded optimizer's state, want %d", c.amp, c.keep, n, keptState)
				}
				want := memory.RoundSize(4) // the multiplier
				for i, p := range off.Params() {
					if kept[i] {
						continue
					}
					// The copies of the parameter and its gradient, the moments,
					// and its AdamW's learning rate and step count (one F32 each);
					// under SGD, its momentum, learning rate, and the gradient's
					// sum over the micro-batches.
					want += 4*memory.RoundSize(p.Bytes()) + 2*memory.RoundSize(4)
					if c.micro > 0 {
						want -= memory.RoundSize(4)
					}
				}
				if held := host.Allocator().Stats().Allocated[memory.All].Current; held != want {
					t.Errorf("autocast %v: the host pool holds %d bytes, want %d: the optimizer's copies, state and multiplier (%s)",
						c.amp, held, want, memory.Bytes(off.HostBytes()))
				}
			}
			opt.Release()
			if n := host.Allocator().Stats().Allocated[memory.All].Current; n != 0 {
				t.Errorf("autocast %v: the host pool holds %d bytes after the optimizer's release", c.amp, n)
			}
			return snapshotState(g)
		}
		want, got := run(false), run(true)
		t.Logf("autocast %v, kept %v: peak %s with the optimizer on the device, %s offloaded; the parameters %s",
			c.amp, c.keep, memory.Bytes(peaks[0]), memory.Bytes(peaks[1]), memory.Bytes(params))
		state := 2 * offParams // AdamW's moments; SGD's momentum
		if c.micro > 0 {
			state = offParams
		}
		if peaks[1] > peaks[0]-state-offParams/8 {
			t.Errorf("autocast %v, micro-batches of %d: the offloaded step's peak is %s, the on-device one's %s: want less by the optimizer's state (%s) and an eighth of the gradients at least",
				c.amp, c.micro, memory.Bytes(peaks[1]), memory.Bytes(peaks[0]), memory.Bytes(state))
		}
		for i := range want {
			if c.clip == 0 && c.micro == 0 && !bytes.Equal(got[i], want[i]) {
				t.Errorf("autocast %v: state %d differs with the optimizer offloaded", c.amp, i)
			}
		}
		// The clipped gradients' norm is summed a parameter at a time
		// offloaded: it may differ in its last bit. The tied token
		// embedding's parts add in another order on the host (its
		// micro-batch's two first, then the sum so far) than on the device
		// (each into the sum as the backward makes it): its last bits
		// differ, and AdamW would turn that into whole steps where a
		// gradient is rounding alone (the keys' bias's), so micro-batches
		// take SGD.
		closeState(t, got, want, fmt.Sprintf("under autocast %v, clip %v, micro-batches of %d, offloaded against on the device", c.amp, c.clip, c.micro))
	}
}

// f32sOf reads b as F32 values.
func f32sOf(b []byte) []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

// TestOffloadedActivationsMatch: a checkpointed GPT's steps with an
// Offloader to a host pool of their own (Step.Offloader) end with the
// weights of the same steps keeping their checkpoints on the device, bit
// for bit, in F32 and under BF16 autocast, with every block checkpointed
// and the first four of six; the Offloader moves what nn's estimate says;
// the backward's peak is lower; and the host pool holds the Offloader's
// copies after the steps (hostHeld).
func TestOffloadedActivationsMatch(t *testing.T) {
	dev := tensor.CPU()
	const layers, context, vocab = 6, 256, 64
	xs, ys := gptBatches(t, dev, 3, context, vocab)
	for _, c := range []struct {
		amp   tensor.DType
		first int // the blocks checkpointed (0: all)
	}{{0, 0}, {tensor.BF16, 0}, {tensor.BF16, 4}} {
		amp, checkpointed := c.amp, layers
		if c.first > 0 {
			checkpointed = c.first
		}
		var offloaded int64
		run := func(offload bool) (state [][]byte, peak, held int64) {
			g := seededGPT(t, dev, nn.GPTConfig{Layers: layers, Heads: 2, Width: 16, Vocab: vocab, Context: context})
			defer nn.Release(g)
			g.SetCheckpoint(nn.CheckpointBlocks)
			g.SetCheckpointed(c.first)
			opt := optim.NewSGD(nn.Parameters(g), 0.1, 0, 0, false) // no state: the backward sets the peak
			defer opt.Release()
			s := NewStep(dev, g, opt, amp, Eager)
			defer s.Release()
			host := tensor.NewDevice(cpu.New())
			if offload {
				s.Offloader = ag.NewOffloader(dev, host)
			}
			a := dev.Allocator()
			s.Observe = func(*tensor.Tensor) { // after the forward: the backward's window begins
				held = a.Stats().Allocated[memory.All].Current
				a.WindowPeak()
			}
			for i := range xs {
				if err := s.Run(xs[i], ys[i]); err != nil {
					t.Fatal(err)
				}
				p, _ := a.WindowPeak()
				peak = max(peak, p)
			}
			if offload {
				offloaded = s.Offloader.Bytes()
			}
			hostHeld(t, s, host)
			return snapshotState(g), peak, held
		}
		want, plain, heldPlain := run(false)
		got, off, heldOff := run(true)
		sameState(t, got, want, fmt.Sprintf("with the checkpoints offloaded under autocast %v", amp))
		t.Logf("autocast %v: the backward's peak %s kept on the device, %s offloaded (%s a forward in host memory)", amp, memory.Bytes(plain), memory.Bytes(off), memory.Bytes(offloaded))
		// nn's estimate of what the blocks keep but the last two's (they
		// stay for the backward to read first), less the first block's
		// input (the embeddings', shared with the caller: it stays).
		gc := nn.GPTConfig{Layers: layers, Heads: 2, Width: 16, Vocab: vocab, Context: context}
		if want := int64(checkpointed-2)*gc.CheckpointBytes(2, amp) - 2*context*16*4; offloaded != want {
			t.Errorf("autocast %v, %d blocks checkpointed: the Offloader moved %d bytes a forward, nn.GPTConfig.CheckpointBytes says %d", amp, checkpointed, offloaded, want)
		}
		if offloaded == 0 || heldPlain-heldOff != offloaded {
			t.Errorf("autocast %v: after the forward the device holds %d bytes offloaded, %d kept: want less by exactly the %d the Offloader moved", amp, heldOff, heldPlain, offloaded)
		}
		if off >= plain {
			t.Errorf("autocast %v: the backward's peak is %s offloaded, %s kept: want less", amp, memory.Bytes(off), memory.Bytes(plain))
		}
	}
}

// hostHeld checks the host pool of s's Offloader (if any) after its
// steps: it holds exactly the Offloader's copies (HostBytes), and nothing
// once s is released, which releases its Offloader; s is released.
func hostHeld(t *testing.T, s *Step, host *tensor.Device) {
	t.Helper()
	held := func() int64 { return host.Allocator().Stats().Allocated[memory.All].Current }
	if s.Offloader != nil && (held() != s.Offloader.HostBytes() || held() == 0) {
		t.Errorf("the host pool holds %d bytes after the steps, the Offloader's copies %d", held(), s.Offloader.HostBytes())
	}
	s.Release()
	if n := held(); n != 0 {
		t.Errorf("the host pool holds %d bytes after the step was released", n)
	}
}

// TestOffloadedPlannedStepsMatchEager: a checkpointed GPT's steps (with
// dropout; light checkpoints too under BF16) with an Offloader to a host
// pool of their own run planned as they run eagerly, in F32 and under
// BF16 autocast: the same weights bit
// for bit, the same loss sums and generator position, no step fallen back
// to eager; the plan holds what offloading saves, its arena below the
// planned step's that keeps the checkpoints on the device by at least a
// third of what the Offloader moves a forward, which is more for light
// checkpoints; and the host pool holds the Offloader's copies, then
// nothing (hostHeld).
func TestOffloadedPlannedStepsMatchEager(t *testing.T) {
	testOffloadedPlannedSteps(t, tensor.CPU(), func() *tensor.Device { return tensor.NewDevice(cpu.New()) }, Planned)
}

// testOffloadedPlannedSteps runs on dev, offloading to the host devices
// that host makes, with planMode: Planned on the CPU, Captured on the GPU.
func testOffloadedPlannedSteps(t *testing.T, dev *tensor.Device, host func() *tensor.Device, planMode Mode) {
	const context, vocab = 256, 64
	xs, ys := gptBatches(t, dev, 3, context, vocab) // a warm-up, a traced step and a planned one
	offloaded := map[nn.CheckpointMode]int64{}
	for _, c := range []struct {
		amp  tensor.DType
		mode nn.CheckpointMode
	}{{0, nn.CheckpointBlocks}, {tensor.BF16, nn.CheckpointBlocks}, {tensor.BF16, nn.CheckpointLight}} {
		amp := c.amp
		t.Run(fmt.Sprint(amp, " ", c.mode), func(t *testing.T) {
			type result struct {
				state            [][]byte
				loss             float64
				offset           uint64
				arena, offloaded int64
			}
			run := func(mode Mode, offload bool) (r result) {
				g, _, s, release := gptStep(t, dev, nn.GPTConfig{Layers: 8, Heads: 2, Width: 16, Vocab: vocab, Context: context, Dropout: 0.1}, amp, mode, false, 0)
				defer release()
				defer sameAlgorithms(dev, s)()
				g.SetCheckpoint(c.mode)
				h := host()
				if offload {
					s.Offloader = ag.NewOffloader(dev, h)
				}
				r.arena = runSteps(t, s, xs, ys)
				if offload {
					r.offloaded = s.Offloader.Bytes()
				}
				sums := s.metrics.Float32s()
				r.state, r.loss, r.offset = snapshotState(g), float64(sums[0]), dev.Generator().State().Offset
				hostHeld(t, s, h)
				return r
			}
			want, got := run(Eager, true), run(planMode, true)
			sameState(t, got.state, want.state, fmt.Sprintf("%v offloaded steps against eager ones", planMode))
			if got.loss != want.loss || got.offset != want.offset {
				t.Errorf("%v: loss sum %v, generator offset %d; eager %v, %d", planMode, got.loss, got.offset, want.loss, want.offset)
			}
			if amp != 0 {
				offloaded[c.mode] = got.offloaded
			}
			kept := run(planMode, false)
			t.Logf("arena %s offloaded (%s a forward in host memory), %s kept on the device", memory.Bytes(got.arena), memory.Bytes(got.offloaded), memory.Bytes(kept.arena))
			// Measured here: 300 of 376 KiB a forward moved (F32), 200 of
			// 280 (BF16) and, with light checkpoints' larger sets, 230 of
			// 664.
			if got.arena == 0 || got.offloaded == 0 || kept.arena-got.arena < got.offloaded/3 {
				t.Errorf("the offloaded step's arena is %s, the one keeping its checkpoints %s: want at least a third of the %s offloaded less",
					memory.Bytes(got.arena), memory.Bytes(kept.arena), memory.Bytes(got.offloaded))
			}
		})
	}
	// A light checkpoint's set holds its products' results too.
	if b, l := offloaded[nn.CheckpointBlocks], offloaded[nn.CheckpointLight]; l <= b {
		t.Errorf("light checkpoints offloaded %s a forward, checkpointed blocks %s: want more", memory.Bytes(l), memory.Bytes(b))
	}
}

// TestOffloaderFollowsMicroBatches: a step whose batch goes to
// micro-batches (as a run's steps do after running out of memory) gives
// back its Offloader's host memory for the whole batch's forwards: the
// host pool then holds what a step that only ran those micro-batches
// holds, less than the whole batch's.
func TestOffloaderFollowsMicroBatches(t *testing.T) {
	dev := tensor.CPU()
	const context, vocab = 64, 64
	xs, ys := gptBatches(t, dev, 2, context, vocab)
	run := func(whole bool) (before, after int64) {
		_, _, s, release := gptStep(t, dev, nn.GPTConfig{Layers: 4, Heads: 2, Width: 16, Vocab: vocab, Context: context}, 0, Eager, false, 0)
		defer release()
		s.Model.(*nn.GPT).SetCheckpoint(nn.CheckpointBlocks)
		host := tensor.NewDevice(cpu.New())
		s.Offloader = ag.NewOffloader(dev, host)
		held := func() int64 { return host.Allocator().Stats().Allocated[memory.All].Current }
		if whole {
			if err := s.Run(xs[0], ys[0]); err != nil {
				t.Fatal(err)
			}
			before = held()
		}
		if err := s.SetMicroBatch(1); err != nil {
			t.Fatal(err)
		}
		if err := s.Run(xs[1], ys[1]); err != nil {
			t.Fatal(err)
		}
		if held() != s.Offloader.HostBytes() {
			t.Errorf("the host pool holds %d bytes, the Offloader's copies %d", held(), s.Offloader.HostBytes())
		}
		return before, held()
	}
	whole, after := run(true)
	_, micro := run(false)
	t.Logf("host memory: %d bytes for whole batches, %d after going to micro-batches, %d for micro-batches alone", whole, after, micro)
	if after != micro || micro >= whole {
		t.Errorf("after going to micro-batches the host pool holds %d bytes, a step of micro-batches alone %d, of whole batches %d: want the second, below the third", after, micro, whole)
	}
}

// TestOffloadedStepThatFailsLeavesNoTrace: a checkpointed GPT's step with
// its checkpoints offloaded that runs out of memory at any of its
// allocations (the copies brought back ahead of a recomputation among
// them) gives back every byte of the device's pool, and of the host's but
// the Offloader's copies (nothing once it is released), and the steps run
// again end as steps that never failed do, bit for bit.
func TestOffloadedStepThatFailsLeavesNoTrace(t *testing.T) {
	const context, vocab = 16, 64
	run := func(faulty bool) [][]byte {
		dev, src := faultyDevice(true)
		xs, ys := gptBatches(t, dev, 2, context, vocab)
		g := seededGPT(t, dev, nn.GPTConfig{Layers: 4, Heads: 2, Width: 32, Vocab: vocab, Context: context}) // the last two blocks' sets stay on the device
		defer nn.Release(g)
		g.SetCheckpoint(nn.CheckpointBlocks)
		opt := optim.NewSGD(nn.Parameters(g), 0.1, 0.9, 0, false)
		defer opt.Release()
		s := NewStep(dev, g, opt, tensor.BF16, Eager)
		defer s.Release()
		host := tensor.NewDevice(cpu.New())
		s.Offloader = ag.NewOffloader(dev, host)
		for i := range xs {
			if !faulty {
				if err := s.Run(xs[i], ys[i]); err != nil {
					t.Fatal(err)
				}
				continue
			}
			failEveryAllocation(t, dev, src, i, func() error { return s.Run(xs[i], ys[i]) }, func(fault int) {
				if n := host.Allocator().Stats().Allocated[memory.All].Current; n != s.Offloader.HostBytes() {
					t.Fatalf("step %d, fault at allocation %d: the host pool holds %d bytes after the failed step, the Offloader's copies %d", i, fault, n, s.Offloader.HostBytes())
				}
			})
		}
		if s.Offloader.Bytes() == 0 {
			t.Error("the Offloader moved nothing")
		}
		state := snapshotState(g)
		hostHeld(t, s, host)
		return state
	}
	want, got := run(false), run(true)
	sameState(t, got, want, "after failed steps run again")
}

// TestOffloadedBF16WeightsFollowF32: a GPT whose blocks' weights are BF16
// working copies on the device, their F32 masters with AdamW in a host pool
// (nn.GPTConfig.ProductWeights), trains under BF16 autocast as the F32
// model with AdamW on the device does: the same products, whose weights'
// gradients come rounded to BF16. After three steps, with clipping and with
// the update in the backward, the loss on a fourth batch is within 2e-3 of
// the F32 model's and the masters within 1% of its weights; the device
// holds two bytes for each of those weights, and train.New refuses them
// without an offloaded optimizer.
func TestOffloadedBF16WeightsFollowF32(t *testing.T) {
	testBF16Weights(t, tensor.CPU(), tensor.NewDevice(cpu.New()))
	cfg := nn.GPTConfig{Layers: 1, Heads: 2, Width: 32, Vocab: 64, Context: 8, ProductWeights: tensor.BF16}
	g := seededGPT(t, tensor.CPU(), cfg)
	defer nn.Release(g)
	if _, err := New(g, tensor.CPU(), Config{Model: "gpt", Optimizer: "adamw", LR: 1e-3, AMP: AMPBF16}, 1); err == nil || !strings.Contains(err.Error(), "-offload-optimizer") {
		t.Errorf("train.New of BF16 working weights on the CPU: %v, want a refusal naming -offload-optimizer", err)
	}
}

// testBF16Weights runs TestOffloadedBF16WeightsFollowF32's comparison on
// dev, the masters and state on host.
func testBF16Weights(t *testing.T, dev, host *tensor.Device) {
	const context, vocab = 16, 64
	xs, ys := gptBatches(t, dev, 4, context, vocab)
	shape := nn.GPTConfig{Layers: 2, Heads: 4, Width: 128, Vocab: vocab, Context: context}
	for _, clip := range []float64{0, 0.05} {
		run := func(dt tensor.DType) (weights []float32, loss float32, paramBytes int64) {
			cfg := shape
			cfg.ProductWeights = dt
			g := seededGPT(t, dev, cfg)
			defer nn.Release(g)
			adamw := optim.NewAdamW(nn.Parameters(g), 1e-2, 0.1)
			adamw.NoDecay = nn.NoDecay(g)
			var opt optim.Optimizer = adamw
			if dt == tensor.BF16 {
				off, err := optim.Offload(adamw, host)
				if err != nil {
					t.Fatal(err)
				}
				opt = off
			}
			defer opt.Release()
			s := NewStep(dev, g, opt, tensor.BF16, Eager)
			s.ClipNorm, s.HostUpdateInBackward = clip, true
			defer s.Release()
			for i := range 3 {
				if err := s.Run(xs[i], ys[i]); err != nil {
					t.Fatal(err)
				}
			}
			if off, ok := opt.(*optim.Offloaded); ok { // the host holds what was planned, to the byte
				var n, onDevice int64
				want := memory.RoundSize(4) // the multiplier
				for _, p := range off.Params() {
					n, onDevice = n+int64(p.Numel()), onDevice+p.Bytes()
					// The master, its moments, the gradient in the weight's
					// dtype, and AdamW's learning rate and step count.
					want += 3*memory.RoundSize(4*int64(p.Numel())) + memory.RoundSize(p.Bytes()) + 2*memory.RoundSize(4)
				}
				if got, plan := off.HostBytes(), optim.OffloadedHostBytes("adamw", n, onDevice); got != plan {
					t.Errorf("clip %v: the offloaded optimizer holds %d host bytes, %d planned", clip, got, plan)
				}
				if held := host.Allocator().Stats().Allocated[memory.All].Current; !off.Pinned() && held != want {
					t.Errorf("clip %v: the host pool holds %d bytes, want %d", clip, held, want)
				}
			}
			state := opt.State()
			for i, p := range opt.Params() {
				paramBytes += p.Bytes()
				if m, ok := state[fmt.Sprintf("master.%d", i)]; ok {
					weights = append(weights, m.Float32s()...)
				} else {
					weights = append(weights, p.Float32s()...)
				}
			}
			ag.NoGrad(dev, func() {
				ag.Autocast(dev, tensor.BF16, func() {
					l, right, _ := g.Loss(xs[3], ys[3])
					loss = l.Float32s()[0]
					l.Release()
					right.Release()
				})
			})
			return weights, loss, paramBytes
		}
		want, wantLoss, f32Bytes := run(0)
		got, gotLoss, bf16Bytes := run(tensor.BF16)
		t.Logf("clip %v: loss %.6f, F32 %.6f; weights %.3g apart (relative)", clip, gotLoss, wantLoss, relDiff(got, want))
		if d := relDiff(got, want); d > 1e-2 {
			t.Errorf("clip %v: the masters are %.2g from the F32 model's weights (relative): want within 1%%", clip, d)
		}
		if math.Abs(float64(gotLoss-wantLoss)) > 2e-3 {
			t.Errorf("clip %v: loss %v, the F32 model's %v: want within 2e-3", clip, gotLoss, wantLoss)
		}
		products := int64(12 * shape.Layers * shape.Width * shape.Width)
		if f32Bytes-bf16Bytes != 2*products {
			t.Errorf("clip %v: the device's parameters take %d bytes, %d in F32: want two bytes less for each of the %d product weights", clip, bf16Bytes, f32Bytes, products)
		}
	}
}

// TestBF16WeightsCheckpoint: a run with BF16 working weights (on a device
// that plans as a GPU) saves each one's F32 master as the model's weight,
// and no master beside the optimizer's state (Note [16-bit weights in a
// checkpoint]); resumed, it takes the masters back, its device weights
// their rounding, and its next steps are the uninterrupted run's bit for
// bit; an F32 run resumes from the same file.
func TestBF16WeightsCheckpoint(t *testing.T) {
	dev := testdev.FakeGPU()
	const context, vocab = 16, 64
	xs, ys := gptBatches(t, dev, 4, context, vocab)
	shape := nn.GPTConfig{Layers: 2, Heads: 4, Width: 64, Vocab: vocab, Context: context}
	cfg := Config{Model: "gpt", Optimizer: "adamw", LR: 1e-2, WeightDecay: 0.1, ClipNorm: 1, Schedule: "constant", Epochs: 1, Batch: 2,
		AMP: AMPBF16, OffloadOptimizer: true, BF16Weights: true}
	trainer := func(cfg Config, seed uint64) *Trainer {
		g := shape
		if cfg.BF16Weights {
			g.ProductWeights = tensor.BF16
		}
		dev.Generator().Seed(seed)
		m, err := nn.NewGPT(dev, g)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := New(m, dev, cfg, 4)
		if err != nil {
			nn.Release(m)
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Release(); nn.Release(m) })
		return tr
	}
	step := func(tr *Trainer, i int) {
		if err := tr.RunStep(xs[i], ys[i]); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "run.ckpt")
	a := trainer(cfg, 1)
	step(a, 0)
	step(a, 1)
	if err := a.Save(path); err != nil {
		t.Fatal(err)
	}
	st, err := nn.ReadSafetensors(path)
	if err != nil {
		t.Fatal(err)
	}
	off := a.Opt.(*optim.Offloaded)
	halves := 0
	for _, n := range a.Model.State("model") {
		s := st.Tensors[n.Name]
		if s.DType != tensor.F32 {
			t.Errorf("the checkpoint holds %s in %v: want F32", n.Name, s.DType)
		}
		if n.T.DType() == tensor.BF16 {
			halves++
			if !bytes.Equal(s.Data, off.Master(n.T).Raw()) {
				t.Errorf("the checkpoint's %s is not the optimizer's master", n.Name)
			}
		}
	}
	if halves != 4*shape.Layers {
		t.Errorf("%d weights in bf16: want the %d of the blocks' products", halves, 4*shape.Layers)
	}
	for name := range st.Tensors {
		if strings.HasPrefix(name, "optim."+optim.MasterKind) {
			t.Errorf("the checkpoint holds %s beside the model's weights", name)
		}
	}
	b := trainer(cfg, 99) // another initialisation, which Resume overwrites
	if _, err := b.Resume(path, false); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{2, 3} {
		step(a, i)
		step(b, i)
	}
	as, bs := a.Model.State(""), b.Model.State("")
	for i := range as {
		if !bytes.Equal(as[i].T.Raw(), bs[i].T.Raw()) {
			t.Errorf("after the resumed steps, %s differs from the uninterrupted run's", as[i].Name)
		}
		if m := off.Master(as[i].T); as[i].T.DType() == tensor.BF16 && !bytes.Equal(m.Raw(), b.Opt.(*optim.Offloaded).Master(bs[i].T).Raw()) {
			t.Errorf("after the resumed steps, %s's master differs from the uninterrupted run's", as[i].Name)
		}
	}
	f32 := cfg
	f32.BF16Weights, f32.OffloadOptimizer = false, false
	c := trainer(f32, 5)
	if _, err := c.Resume(path, true); err != nil {
		t.Fatalf("an F32 run resuming from BF16 weights' checkpoint: %v", err)
	}
}
