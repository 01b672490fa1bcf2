package train

import (
	"bytes"
	"math"
	"testing"
	"unsafe"

	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/optim"
	"github.com/leangrad/leangrad/tensor"
)

// TestOffloadedStepMatches: a GPT's steps with AdamW offloaded to a host
// pool of its own end with the on-device optimizer's weights: bit for bit
// in F32, within a millionth under BF16 autocast with clipping (the norm
// is summed a parameter at a time). Every gradient begins to come down
// during the backward (the step gives the optimizer the backward's hook)
// and leaves the device then, so that the step's peak is below the
// on-device one's by the state and some of the gradients; the device holds
// none of the optimizer's state, the host pool exactly the optimizer's
// copies, state and scalars, and nothing once it is released.
func TestOffloadedStepMatches(t *testing.T) {
	dev := tensor.CPU()
	const context, vocab = 16, 64
	xs, ys := gptBatches(dev, 3, context, vocab)
	defer releaseAll(xs)
	defer releaseAll(ys)
	for _, c := range []struct {
		amp  tensor.DType
		clip float64
	}{{0, 0}, {tensor.BF16, 0.05}} {
		var peaks [2]int64
		var params int64
		run := func(offload bool) [][]byte {
			dev.Generator().Seed(5)
			g, err := nn.NewGPT(dev, nn.GPTConfig{Layers: 2, Heads: 4, Width: 128, Vocab: vocab, Context: context})
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
			a := dev.Allocator()
			var peak int64
			for i := range xs {
				a.WindowPeak()
				if err := s.Run(xs[i], ys[i]); err != nil {
					t.Fatal(err)
				}
				if p, _ := a.WindowPeak(); i > 0 {
					peak = max(peak, p)
				}
			}
			params = 0
			for _, p := range opt.Params() {
				params += p.Bytes()
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
		t.Logf("autocast %v: peak %s with the optimizer on the device, %s offloaded; the parameters %s",
			c.amp, memory.Bytes(peaks[0]), memory.Bytes(peaks[1]), memory.Bytes(params))
		if peaks[1] > peaks[0]-2*params-params/8 {
			t.Errorf("autocast %v: the offloaded step's peak is %s, the on-device one's %s: want less by AdamW's state (%s) and an eighth of the gradients at least",
				c.amp, memory.Bytes(peaks[1]), memory.Bytes(peaks[0]), memory.Bytes(2*params))
		}
		for i := range want {
			if c.clip == 0 && !bytes.Equal(got[i], want[i]) {
				t.Errorf("autocast %v: state %d differs with the optimizer offloaded", c.amp, i)
			}
			// The clipped gradients' norm is summed a parameter at a time
			// offloaded: it may differ in its last bit.
			g, w := f32sOf(got[i]), f32sOf(want[i])
			for k := range w {
				if d := math.Abs(float64(g[k] - w[k])); d > 1e-6*(1+math.Abs(float64(w[k]))) {
					t.Fatalf("autocast %v, clip %v: state %d element %d is %v offloaded, %v on the device", c.amp, c.clip, i, k, g[k], w[k])
				}
			}
		}
	}
}

// f32sOf reads b as F32 values.
func f32sOf(b []byte) []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}
