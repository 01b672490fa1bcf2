package autograd_test

import (
	"math"
	"testing"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
)

// TestResNet20StepMemory is the step-memory contract on a real network
// shape, F32 and under autocast: after the step and releasing gradients,
// exactly the parameters and running statistics are allocated, step after step.
func TestResNet20StepMemory(t *testing.T) { testResNet20StepMemory(t, tensor.CPU()) }

func testResNet20StepMemory(t *testing.T, dev *tensor.Device) {
	for _, amp := range []bool{false, true} {
		net, err := nn.NewCIFARResNet(dev, 20, 1, 10)
		if err != nil {
			t.Fatal(err)
		}
		a := dev.Allocator()
		base := a.Stats().Allocated[memory.All].Current
		for step := 0; step < 4; step++ {
			dev.WithScope(func() {
				x := tensor.Randn(dev, tensor.F32, 0, 1, 2, 1, 28, 28)
				var loss *tensor.Tensor
				run := func() { loss = ag.CrossEntropy(net.Forward(x), tensor.FromInt32(dev, []int32{3, 7}, 2)) }
				if amp {
					ag.Autocast(dev, tensor.F16, run)
				} else {
					run()
				}
				ag.Backward(loss)
				if v := loss.Item(); math.IsNaN(float64(v)) || v <= 0 {
					t.Fatalf("amp=%v: loss = %v", amp, v)
				}
			})
			for _, p := range nn.Parameters(net) {
				if p.Grad() == nil {
					t.Fatalf("amp=%v: parameter %v got no gradient", amp, p.Shape())
				}
			}
			nn.ZeroGrad(net)
			if got := a.Stats().Allocated[memory.All].Current; got != base {
				t.Errorf("amp=%v step %d: %d bytes allocated after the step, %d before it", amp, step, got, base)
			}
		}
		nn.Release(net)
	}
}

// A residual block keeps exactly three activations for its backward, in
// F32 and under autocast in F16: its input and its two convolutions' outputs,
// with the batch statistics; not its first batch norm's output (Note [what
// a batch norm and its convolution keep]) nor its own (Note [where a batch
// norm's mask comes from]: the second batch norm's mask comes from its input
// and the shortcut, the block's input); under autocast the F16 copies of
// its weights too. Under autocast the input is F16, as a network's blocks
// pass it on.
func TestBasicBlockSaves(t *testing.T) {
	dev := tensor.CPU()
	const n, c, hw = 2, 8, 6 * 6
	for _, amp := range []tensor.DType{0, tensor.F16} {
		b := nn.NewBasicBlock(dev, c, c, 1)
		params := map[*memory.Block]bool{}
		for _, p := range nn.Parameters(b) {
			params[p.Block()] = true
		}
		var saved int64
		dev.WithScope(func() {
			x := tensor.Randn(dev, tensor.F32, 0, 1, n, c, 6, 6)
			if amp != 0 {
				x = ag.Cast(x, amp)
			}
			x.SetRequiresGrad(true)
			run := func() {
				out := b.Forward(x)
				for _, s := range ag.Saved(out, func(blk *memory.Block) bool { return params[blk] }) {
					saved += s.Bytes
				}
			}
			if amp != 0 {
				ag.Autocast(dev, amp, run)
			} else {
				run()
			}
		})
		act := memory.RoundSize(4 * n * c * hw)
		stats := 4 * memory.RoundSize(4*c) // two batch norms' mean and 1/σ
		want := 3*act + stats
		if amp != 0 {
			half := memory.RoundSize(2 * n * c * hw)
			weight := memory.RoundSize(2 * c * c * 9)
			want = 3*half + 2*weight + stats
		}
		if saved != want {
			t.Errorf("autocast %v: a block saves %d bytes for its backward, want %d", amp, saved, want)
		}
		nn.Release(b)
	}
}

// TestResNet20Saves: what ResNet-20 keeps for the backward, to the byte,
// in F32 and under F16 autocast, with and without checkpointed blocks.
// Without, the batch norms keep nine activations of each stage's size but
// the first's eight (Note [a batch norm's output written again]): in the
// first stage its three blocks' two convolutions' outputs and two of the
// block outputs (the stem's and the second block's are written again, and
// so is the stem convolution's output, Note [a convolution of the data
// written again]); in the others their three blocks' convolutions' outputs, the
// projection shortcut's, the first block's output and the third's (the
// second's written again, and the last block's output kept for its mask);
// with two statistics of each of the 21 batch norms. With checkpointed
// blocks, the checkpoints keep the inputs of blocks 2 to 9 (the first
// block's, the stem's output, is written again), three of the first and
// second stages' sizes and two of the third's, and the stem's batch norm
// its statistics.
func TestResNet20Saves(t *testing.T) {
	dev := tensor.CPU()
	const n = 2
	for _, tc := range []struct {
		amp        tensor.DType
		checkpoint bool
	}{{0, false}, {tensor.F16, false}, {0, true}, {tensor.F16, true}} {
		net, err := nn.NewCIFARResNet(dev, 20, 1, 10)
		if err != nil {
			t.Fatal(err)
		}
		if tc.checkpoint {
			net.Checkpoint = nn.CheckpointBlocks
		}
		params := map[*memory.Block]bool{}
		for _, p := range nn.Parameters(net) {
			params[p.Block()] = true
		}
		saved := map[string]int64{}
		dev.WithScope(func() {
			x := tensor.Randn(dev, tensor.F32, 0, 1, n, 1, 28, 28)
			run := func() {
				for _, s := range ag.Saved(net.Forward(x), func(blk *memory.Block) bool { return params[blk] }) {
					saved[s.Op] += s.Bytes
				}
			}
			if tc.amp != 0 {
				ag.Autocast(dev, tc.amp, run)
			} else {
				run()
			}
		})
		size := int64(4)
		if tc.amp != 0 {
			size = 2
		}
		stages := []struct{ c, hw int64 }{{16, 28 * 28}, {32, 14 * 14}, {64, 7 * 7}}
		act := func(st int) int64 { return memory.RoundSize(size * n * stages[st].c * stages[st].hw) }
		stats := func(st int) int64 { return 2 * memory.RoundSize(4*stages[st].c) }
		want := map[string]int64{}
		if tc.checkpoint {
			want["checkpoint"] = 3*act(0) + 3*act(1) + 2*act(2)
			want["batch_norm"] = stats(0)
		} else {
			for st := range stages {
				want["batch_norm"] += 9*act(st) + 7*stats(st)
			}
			want["batch_norm"] -= act(0)
		}
		for op, w := range want {
			if saved[op] != w {
				t.Errorf("autocast %v, checkpointed %v: %s keeps %d bytes, want %d (all kept: %v)", tc.amp, tc.checkpoint, op, saved[op], w, saved)
			}
		}
		nn.Release(net)
	}
}
