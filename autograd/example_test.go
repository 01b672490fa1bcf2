package autograd_test

import (
	"fmt"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/tensor"
)

// Build two tensors, multiply them, reduce to a scalar and differentiate.
func Example() {
	dev := tensor.CPU()
	w := tensor.FromFloat32(dev, []float32{1, 2, 3, 4}, 2, 2).SetRequiresGrad(true)
	defer w.Release()

	dev.WithScope(func() { // everything made in here is released at the end
		x := tensor.FromFloat32(dev, []float32{1, 1, 0, 1}, 2, 2)
		y := ag.ReLU(ag.MatMul(x, w)) // [[4 6] [3 4]]
		loss := ag.SumAll(y)
		ag.Backward(loss) // frees each node right after its backward
		fmt.Println("loss:", loss.Item())
		fmt.Println("dloss/dw:", w.Grad().Float32s())
	})
	w.ZeroGrad() // releases the gradient's memory
	// Output:
	// loss: 17
	// dloss/dw: [1 1 2 2]
}

// Under NoGrad nothing is recorded and nothing is saved for a backward.
func ExampleNoGrad() {
	dev := tensor.CPU()
	w := tensor.FromFloat32(dev, []float32{2}, 1).SetRequiresGrad(true)
	defer w.Release()
	var y *tensor.Tensor
	ag.NoGrad(dev, func() {
		dev.WithScope(func() {
			y = ag.Mul(w, w).Keep() // not recorded: no graph, nothing saved
		})
	})
	defer y.Release()
	fmt.Println(y.Item(), y.RequiresGrad())
	// Output: 4 false
}

// Checkpoint saves only a function's inputs and runs it again in the
// backward: the same gradients, less memory held between forward and
// backward.
func ExampleCheckpoint() {
	dev := tensor.CPU()
	w := tensor.FromFloat32(dev, []float32{0.5, -1, 2, 0.25}, 2, 2).SetRequiresGrad(true)
	defer w.Release()
	block := func(in []*tensor.Tensor) *tensor.Tensor { return ag.ReLU(ag.MatMul(ag.ReLU(ag.MatMul(in[0], w)), w)) }
	fmt.Println(gradOf(w, func(x *tensor.Tensor) *tensor.Tensor { return block([]*tensor.Tensor{x}) }))
	fmt.Println(gradOf(w, func(x *tensor.Tensor) *tensor.Tensor {
		return ag.Checkpoint(block, x) // x is saved; the inside runs again in Backward
	}))
	// Output:
	// [16 0 3 0]
	// [16 0 3 0]
}

// CheckpointLight keeps, besides a function's inputs, the results of the
// products it marks Keepable: the backward runs the rest of the function
// again and reads those, for the same gradients.
func ExampleCheckpointLight() {
	dev := tensor.CPU()
	w := tensor.FromFloat32(dev, []float32{0.5, -1, 2, 0.25}, 2, 2).SetRequiresGrad(true)
	defer w.Release()
	block := func(in []*tensor.Tensor) *tensor.Tensor {
		h := ag.Keepable(dev, func() *tensor.Tensor { return ag.Linear(in[0], w, nil) }) // kept, not run again
		return ag.ReLU(ag.Linear(ag.ReLU(h), w, nil))                                    // run again in Backward
	}
	fmt.Println(gradOf(w, func(x *tensor.Tensor) *tensor.Tensor { return block([]*tensor.Tensor{x}) }))
	fmt.Println(gradOf(w, func(x *tensor.Tensor) *tensor.Tensor { return ag.CheckpointLight(block, x) }))
	// Output:
	// [0 0 1 11]
	// [0 0 1 11]
}

// gradOf is w's gradient of the sum of forward's output for the input
// [[1 2] [3 4]], w's gradient zeroed after.
func gradOf(w *tensor.Tensor, forward func(x *tensor.Tensor) *tensor.Tensor) []float32 {
	dev := w.Device()
	var g []float32
	dev.WithScope(func() {
		ag.Backward(ag.SumAll(forward(tensor.FromFloat32(dev, []float32{1, 2, 3, 4}, 2, 2))))
		g = w.Grad().Float32s()
	})
	w.ZeroGrad()
	return g
}

// Modes belong to a device handle: a goroutine that serves a model under
// NoGrad on its own Session does not stop another from recording on the
// device.
func ExampleNoGrad_session() {
	dev := tensor.CPU()
	w := tensor.FromFloat32(dev, []float32{2}, 1).SetRequiresGrad(true)
	defer w.Release()
	serving := dev.Session() // one per goroutine
	ag.NoGrad(serving, func() {
		serving.WithScope(func() {
			x := tensor.FromFloat32(serving, []float32{3}, 1)
			fmt.Println("served, recorded:", ag.Mul(w, x).RequiresGrad())
		})
		dev.WithScope(func() {
			fmt.Println("on the device, recorded:", ag.Mul(w, w).RequiresGrad())
		})
	})
	// Output:
	// served, recorded: false
	// on the device, recorded: true
}
