package autograd_test

import (
	"bytes"
	"testing"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
)

// TestOffloaderMatchesAndMoves: six checkpointed attention blocks run with
// an Offloader give the gradients of the same blocks kept on the device,
// bit for bit; after the forward the device holds beyond what lived before
// it only the output and the sets of the last two blocks, which the
// backward reads first (stayLast: every other block's input but the
// first, which shares the caller's storage, and kept attention results
// are in the host pool, exactly their bytes, and Bytes says so); the
// backward's peak is below the plain one's by all blocks' sets but three
// (the device holds two, the one recomputing and the one coming back, and
// the two peaks fall at different blocks of the pass, with different
// weight gradients alive); a second pass gives the same gradients
// through the same host memory, which holds every block's set; and the
// host pool is empty after Release.
func TestOffloaderMatchesAndMoves(t *testing.T) {
	const blocks, batch, steps, width, heads = 6, 4, 64, 16, 2
	dev, host := tensor.NewDevice(cpu.New()), tensor.NewDevice(cpu.New())
	a := dev.Allocator()
	x := tensor.Randn(dev, tensor.F32, 0, 1, batch*steps, width).Keep().SetRequiresGrad(true)
	defer x.Release()
	var ws []*tensor.Tensor
	for range blocks {
		ws = append(ws, tensor.Randn(dev, tensor.F32, 0, 0.3, 3*width, width).Keep().SetRequiresGrad(true),
			tensor.Randn(dev, tensor.F32, 0, 0.3, width, width).Keep().SetRequiresGrad(true))
	}
	defer func() {
		for _, w := range ws {
			w.Release()
		}
	}()
	forward := func() *tensor.Tensor {
		h := ag.Identity(x)
		for k := range blocks {
			qkv, proj := ws[2*k], ws[2*k+1]
			next := ag.Checkpoint(func(in []*tensor.Tensor) *tensor.Tensor {
				att := ag.CausalAttention(ag.Reshape(ag.Linear(in[0], qkv, nil), batch, steps, 3*width), heads)
				return ag.Add(in[0], ag.Linear(ag.Reshape(att, batch*steps, width), proj, nil))
			}, h)
			h.Release()
			h = next
		}
		return h
	}
	grads := func(o *ag.Offloader) (out [][]byte, held, peak int64) {
		before := a.Stats().Allocated[memory.All].Current
		dev.WithScope(func() {
			var y *tensor.Tensor
			if o != nil {
				o.Forward(func() { y = forward() })
			} else {
				y = forward()
			}
			held = a.Stats().Allocated[memory.All].Current - before - y.Block().Size()
			a.WindowPeak()
			ag.Backward(ag.SumAll(ag.Mul(y, y)))
			peak, _ = a.WindowPeak()
			if o != nil {
				o.End()
			}
		})
		for _, p := range append([]*tensor.Tensor{x}, ws...) {
			out = append(out, p.Grad().Raw())
			p.SetGrad(nil)
		}
		return out, held, peak - before
	}
	want, keptPlain, peakPlain := grads(nil)
	o := ag.NewOffloader(dev, host)
	got, keptOff, peakOff := grads(o)
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Errorf("gradient %d differs with the checkpoints offloaded", i)
		}
	}
	hostBytes := func() int64 { return host.Allocator().Stats().Allocated[memory.All].Current }
	held := hostBytes()
	again, _, _ := grads(o) // into the same host memory
	for i := range want {
		if !bytes.Equal(again[i], want[i]) {
			t.Errorf("gradient %d differs in the second offloaded pass", i)
		}
	}
	// Each block keeps its input (B·T·C floats; the first is x, the
	// caller's) and its attention's output and log-sum-exps (B·T·C and
	// B·H·T floats).
	perBlock := int64(4 * (2*batch*steps*width + batch*heads*steps))
	const stay = 2
	if want := int64(blocks-stay)*perBlock - x.Bytes(); o.Bytes() != want {
		t.Errorf("Bytes() = %d, want %d: every block's input but the first (x's storage, held by the caller) and attention results, but the last two blocks'", o.Bytes(), want)
	}
	if keptOff != stay*perBlock {
		t.Errorf("the device holds %d bytes beyond the output after the offloaded forward, want the last two blocks' sets, %d (%d kept on the device)", keptOff, stay*perBlock, keptPlain)
	}
	if peakOff > peakPlain-(blocks-3)*perBlock {
		t.Errorf("the offloaded backward's peak is %d bytes above what lived before it, the plain one's %d: want less by the sets of all blocks but three (%d bytes each)",
			peakOff, peakPlain, perBlock)
	}
	t.Logf("after the forward: %d bytes kept on the device, %d offloaded; backward's peak %d and %d; Bytes %d", keptPlain, keptOff, peakPlain, peakOff, o.Bytes())
	// The Offloader keeps the host memory of every block's set, those that
	// stayed on the device too, for the next pass, which takes no more.
	if n := hostBytes(); n != held || n != o.HostBytes() || n != blocks*perBlock {
		t.Errorf("the host pool holds %d bytes after the second pass, %d after the first, HostBytes %d: want the sets of all %d blocks, %d each",
			n, held, o.HostBytes(), blocks, perBlock)
	}
	o.Release()
	if n := hostBytes(); n != 0 || o.HostBytes() != 0 {
		t.Errorf("the host pool holds %d bytes after Release (HostBytes %d)", n, o.HostBytes())
	}
}
