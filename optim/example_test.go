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

// An optimizer whose state lives in host memory but for the parameters
// kept on the device: here the embedding keeps its AdamW moments beside it
// and the projection's go to a host pool (a GPU's page-locked memory in a
// training run; a CPU pool of its own here). The backward hands each
// finished gradient to Ready, which starts its copy down; the step updates
// each parameter where its state is, to the on-device optimizer's values.
func ExampleOffloadSome() {
	dev, host := tensor.NewDevice(tensor.CPU().Backend()), tensor.NewDevice(tensor.CPU().Backend())
	emb := tensor.FromFloat32(dev, []float32{0.1, -0.2, 0.3, 0.4}, 2, 2).SetRequiresGrad(true)
	proj := tensor.FromFloat32(dev, []float32{1, 0.5}, 2, 1).SetRequiresGrad(true)
	defer emb.Release()
	defer proj.Release()
	opt, err := optim.OffloadSome(optim.NewAdamW([]*tensor.Tensor{emb, proj}, 0.01, 0), host, []bool{true, false})
	if err != nil {
		panic(err)
	}
	defer opt.Release()

	dev.WithScope(func() {
		x := tensor.FromFloat32(dev, []float32{1, 2}, 1, 2)
		loss := ag.MeanAll(ag.MatMul(ag.MatMul(x, emb), proj))
		ag.Backward(loss, ag.OnGradReady(opt.Ready))
	})
	opt.Step()
	opt.ZeroGrad()
	for name, t := range opt.DeviceState() {
		fmt.Println("on the device:", name, t.Device() == dev)
	}
	fmt.Printf("host bytes: %d, emb: %.2f, proj: %.2f\n", opt.HostBytes(), emb.Float32s(), proj.Float32s())
	// Unordered output:
	// on the device: exp_avg.0 true
	// on the device: exp_avg_sq.0 true
	// host bytes: 32, emb: [0.09 -0.21 0.29 0.39], proj: [0.99 0.49]
}
