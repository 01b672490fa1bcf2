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
