package benchmarks

import (
	"fmt"
	"time"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/tensor"
)

// Micro times the host side of single operations on dev, on tiny tensors so
// that the device is never the bottleneck: a raw backend launch, a tensor
// made and released, an operation with recording off, and a recorded one.
func Micro(dev *tensor.Device) []string {
	const n = 20000
	x := tensor.Ones(dev, tensor.F32, 64).Keep()
	defer x.Release()
	w := tensor.Ones(dev, tensor.F32, 64).Keep().SetRequiresGrad(true)
	defer w.Release()
	be := dev.Backend()
	timeIt := func(name string, f func()) string {
		for i := 0; i < 200; i++ {
			f()
		}
		dev.Synchronize()
		t0 := time.Now()
		for i := 0; i < n; i++ {
			f()
		}
		dev.Synchronize()
		return fmt.Sprintf("%s %.2f µs", name, float64(time.Since(t0).Nanoseconds())/n/1e3)
	}
	return []string{
		timeIt("backend launch (Affine in place)", func() { be.Affine(x.Buf(), x.Buf(), 1, 0) }),
		timeIt("tensor made and released", func() { tensor.Empty(dev, tensor.F32, 64).Release() }),
		timeIt("operation, recording off", func() { ag.NoGrad(dev, func() { ag.Affine(x, 1, 0).Release() }) }),
		timeIt("operation, recorded", func() { ag.Affine(w, 1, 0).Release() }),
	}
}
