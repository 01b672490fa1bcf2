package train

import (
	"bytes"
	"testing"

	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/optim"
	"github.com/leangrad/leangrad/tensor"
)

// TestOffloadedStepMatches: a GPT's steps with AdamW offloaded to a host
// pool of its own end with the on-device optimizer's weights bit for bit,
// in F32 and under BF16 autocast with clipping; every gradient begins to
// come down during the backward (the step gives the optimizer the
// backward's hook); the device holds none of the optimizer's state, the
// host pool exactly the optimizer's copies, state and scalars, and
// nothing once it is released.
func TestOffloadedStepMatches(t *testing.T) {
	dev := tensor.CPU()
	const context, vocab = 16, 64
	xs, ys := gptBatches(dev, 3, context, vocab)
	defer releaseAll(xs)
	defer releaseAll(ys)
	for _, c := range []struct {
		amp  tensor.DType
		clip float64
	}{{0, 0}, {tensor.BF16, 1}} {
		run := func(offload bool) [][]byte {
			dev.Generator().Seed(5)
			g, err := nn.NewGPT(dev, nn.GPTConfig{Layers: 2, Heads: 2, Width: 64, Vocab: vocab, Context: context})
			if err != nil {
				t.Fatal(err)
			}
			defer nn.Release(g)
			adamw := optim.NewAdamW(nn.Parameters(g), 1e-2, 0.1)
			adamw.NoDecay = nn.NoDecay(g)
			var opt optim.Optimizer = adamw
			host := tensor.NewDevice(cpu.New())
			if offload {
				if opt, err = optim.Offload(adamw, host); err != nil {
					t.Fatal(err)
				}
			}
			s := NewStep(dev, g, opt, c.amp, Eager)
			s.ClipNorm = c.clip
			defer s.Release()
			for i := range xs {
				if err := s.Run(xs[i], ys[i]); err != nil {
					t.Fatal(err)
				}
			}
			if off, ok := opt.(*optim.Offloaded); ok {
				if got := off.Overlapped(); got != 1 {
					t.Errorf("autocast %v: %.3f of the gradients' bytes came down during the backward, want all", c.amp, got)
				}
				if n := s.OptimizerStateBytes(); n != 0 {
					t.Errorf("autocast %v: the device holds %d bytes of the offloaded optimizer's state", c.amp, n)
				}
				want := memory.RoundSize(4) // the multiplier
				for _, p := range off.Params() {
					// The copies of the parameter and its gradient, the moments,
					// and its AdamW's learning rate and step count (one F32 each).
					want += 4*memory.RoundSize(p.Bytes()) + 2*memory.RoundSize(4)
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
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				t.Errorf("autocast %v, clip %v: state %d differs with the optimizer offloaded", c.amp, c.clip, i)
			}
		}
	}
}
