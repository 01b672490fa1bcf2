package optim_test

import (
	"fmt"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/optim"
	"github.com/leangrad/leangrad/tensor"
)

// A mixed-precision step: the forward under Autocast, the loss scaled so
// that small F16 gradients survive, the update unscaled and skipped on the
// device when a gradient is not finite. Nothing is read back from the
// device until the end. Here the first step's gradients overflow F16 at the
// initial scale of 2¹⁶ (65,536 > 65,504): that step is skipped and the
// scale halved, and the next two update w.
func ExampleGradScaler() {
	dev := tensor.CPU()
	w := tensor.FromFloat32(dev, []float32{1, -1, 0.5, 2}, 2, 2).SetRequiresGrad(true)
	defer w.Release()
	opt := optim.NewSGD([]*tensor.Tensor{w}, 0.1, 0, 0, false)
	defer opt.Release()
	scaler := optim.NewGradScaler(dev, true)
	defer scaler.Release()

	for step := 0; step < 3; step++ {
		dev.WithScope(func() {
			x := tensor.FromFloat32(dev, []float32{1, 2, 3, 4}, 2, 2)
			var loss *tensor.Tensor
			ag.Autocast(dev, tensor.F16, func() { loss = ag.MeanAll(ag.MatMul(x, w)) }) // F16 product, F32 mean
			ag.Backward(scaler.ScaleLoss(loss))
			scaler.Step(opt) // unscale + inf/NaN check, then the update unless inf/NaN
			scaler.Update()  // back off or grow the scale, on the device
		})
		opt.ZeroGrad()
	}
	fmt.Printf("scale: %v skipped: %d w: %.2f\n", scaler.Scale(), scaler.Skipped(), w.Float32s())
	// Output:
	// scale: 32768 skipped: 1 w: [0.80 -1.20 0.20 1.70]
}
