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
