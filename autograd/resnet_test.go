package autograd_test

import (
	"fmt"
	"math"
	"os"
	"testing"
	"time"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
)

// A ResNet-20 (CIFAR layout: 3 stages of 3 basic blocks, 16-32-64 channels,
// 1×1 projection shortcuts where the shape changes) assembled from autograd
// operations, for measuring one training step on any device.

type convBN struct {
	w, g, b, rm, rv *tensor.Tensor
	stride, pad     int
}

func newConvBN(dev *tensor.Device, cin, cout, k, stride int) convBN {
	std := float32(math.Sqrt(2 / float64(cin*k*k)))
	return convBN{
		w:      tensor.Randn(dev, tensor.F32, 0, std, cout, cin, k, k).Keep().SetRequiresGrad(true),
		g:      tensor.Ones(dev, tensor.F32, cout).Keep().SetRequiresGrad(true),
		b:      tensor.Zeros(dev, tensor.F32, cout).Keep().SetRequiresGrad(true),
		rm:     tensor.Zeros(dev, tensor.F32, cout).Keep(),
		rv:     tensor.Ones(dev, tensor.F32, cout).Keep(),
		stride: stride, pad: k / 2,
	}
}

// forward computes bn(conv(x)), the weight cast to x's dtype (AMP: F16).
func (c convBN) forward(x *tensor.Tensor) *tensor.Tensor {
	w := ag.Cast(c.w, x.DType())
	h := ag.Conv2d(x, w, nil, c.stride, c.pad)
	w.Release()
	y := ag.BatchNorm2d(h, c.g, c.b, c.rm, c.rv, true, 0.1, 1e-5)
	h.Release()
	return y
}

func (c convBN) tensors() []*tensor.Tensor { return []*tensor.Tensor{c.w, c.g, c.b, c.rm, c.rv} }

type resBlock struct {
	a, b  convBN
	short *convBN
}

type resnet20 struct {
	stem   convBN
	blocks []resBlock
	fcW    *tensor.Tensor
	fcB    *tensor.Tensor
}

func newResNet20(dev *tensor.Device, inC, classes int) *resnet20 {
	r := &resnet20{stem: newConvBN(dev, inC, 16, 3, 1)}
	cin := 16
	for stage, cout := range []int{16, 32, 64} {
		for i := 0; i < 3; i++ {
			stride := 1
			if i == 0 && stage > 0 {
				stride = 2
			}
			blk := resBlock{a: newConvBN(dev, cin, cout, 3, stride), b: newConvBN(dev, cout, cout, 3, 1)}
			if stride != 1 || cin != cout {
				s := newConvBN(dev, cin, cout, 1, stride)
				blk.short = &s
			}
			r.blocks = append(r.blocks, blk)
			cin = cout
		}
	}
	r.fcW = tensor.Randn(dev, tensor.F32, 0, 0.1, classes, 64).Keep().SetRequiresGrad(true)
	r.fcB = tensor.Zeros(dev, tensor.F32, classes).Keep().SetRequiresGrad(true)
	return r
}

func (r *resnet20) tensors() []*tensor.Tensor {
	ts := append(r.stem.tensors(), r.fcW, r.fcB)
	for _, b := range r.blocks {
		ts = append(ts, b.a.tensors()...)
		ts = append(ts, b.b.tensors()...)
		if b.short != nil {
			ts = append(ts, b.short.tensors()...)
		}
	}
	return ts
}

func (r *resnet20) release() {
	for _, t := range r.tensors() {
		t.Release()
	}
}

// loss runs the network on x in x's dtype and returns the F32 mean cross entropy.
func (r *resnet20) loss(x, labels *tensor.Tensor) *tensor.Tensor {
	then := func(h *tensor.Tensor, f func(*tensor.Tensor) *tensor.Tensor) *tensor.Tensor {
		y := f(h)
		h.Release()
		return y
	}
	h := ag.ReLU(r.stem.forward(x))
	for _, b := range r.blocks {
		u := then(b.a.forward(h), ag.ReLU)
		u = then(u, b.b.forward)
		s := h.Retain()
		if b.short != nil {
			s.Release()
			s = b.short.forward(h)
		}
		h.Release()
		v := ag.Add(u, s)
		u.Release()
		s.Release()
		h = then(v, ag.ReLU)
	}
	h = then(h, ag.GlobalAvgPool)
	w, bias := ag.Cast(r.fcW, h.DType()), ag.Cast(r.fcB, h.DType())
	logits := then(h, func(h *tensor.Tensor) *tensor.Tensor { return ag.Linear(h, w, bias) })
	w.Release()
	bias.Release()
	logits = then(logits, func(l *tensor.Tensor) *tensor.Tensor { return ag.Cast(l, tensor.F32) })
	return then(logits, func(l *tensor.Tensor) *tensor.Tensor { return ag.CrossEntropy(l, labels) })
}

// benchDevice is $LEANGRAD_DEVICE, or the first GPU if there is one.
func benchDevice(b *testing.B) *tensor.Device {
	spec := os.Getenv("LEANGRAD_DEVICE")
	if spec == "" {
		spec = "auto"
	}
	d, err := tensor.Open(spec)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkResNet20Step times one forward + backward of ResNet-20 on a
// batch of 1×28×28 images, F32 and with F16 activations (AMP), synchronised
// with the device, and reports the step's peak allocated bytes.
func BenchmarkResNet20Step(b *testing.B) {
	dev := benchDevice(b)
	batch := 256
	if dev.Name() == "cpu" {
		batch = 32
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.F16} {
		b.Run(fmt.Sprintf("%s/batch%d/%v", dev.Name(), batch, dt), func(b *testing.B) {
			net := newResNet20(dev, 1, 10)
			defer net.release()
			lv := make([]int32, batch)
			for i := range lv {
				lv[i] = int32(i % 10)
			}
			step := func() {
				tensor.WithScope(func() {
					x := tensor.Randn(dev, tensor.F32, 0, 1, batch, 1, 28, 28)
					if dt == tensor.F16 {
						x = ag.Cast(x, tensor.F16)
					}
					loss := net.loss(x, tensor.FromInt32(dev, lv, batch))
					ag.Backward(loss)
				})
				for _, p := range net.tensors() {
					p.ZeroGrad()
				}
			}
			step() // warm-up: kernels loaded, pool filled
			if err := dev.Synchronize(); err != nil {
				b.Fatal(err)
			}
			a := dev.Allocator()
			a.ResetPeak()
			base := a.Stats().Allocated[memory.All].Current
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				step()
			}
			if err := dev.Synchronize(); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			s := a.Stats()
			b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N)/1000, "ms/step")
			b.ReportMetric(float64(s.Allocated[memory.All].Peak-base)/(1<<20), "peak-MiB-above-params")
			b.ReportMetric(float64(s.Allocated[memory.All].Peak)/(1<<20), "peak-alloc-MiB")
			b.ReportMetric(float64(s.Reserved[memory.All].Peak)/(1<<20), "peak-reserved-MiB")
			b.ReportMetric(float64(batch*b.N)/time.Since(start).Seconds(), "img/s")
		})
	}
}

// TestResNet20StepMemory is the step-memory contract on a real network shape,
// F32 and F16: after the step and releasing gradients, exactly the
// parameters and running statistics are allocated, step after step.
func TestResNet20StepMemory(t *testing.T) {
	dev := testDevice()
	for _, dt := range []tensor.DType{tensor.F32, tensor.F16} {
		net := newResNet20(dev, 1, 10)
		a := dev.Allocator()
		base := a.Stats().Allocated[memory.All].Current
		var after []int64
		for step := 0; step < 4; step++ {
			tensor.WithScope(func() {
				x := tensor.Randn(dev, tensor.F32, 0, 1, 2, 1, 28, 28)
				if dt == tensor.F16 {
					x = ag.Cast(x, tensor.F16)
				}
				loss := net.loss(x, tensor.FromInt32(dev, []int32{3, 7}, 2))
				ag.Backward(loss)
				if v := loss.Item(); math.IsNaN(float64(v)) || v <= 0 {
					t.Fatalf("%v loss = %v", dt, v)
				}
			})
			for _, p := range net.tensors() {
				if p.RequiresGrad() && p.Grad() == nil {
					t.Fatalf("%v: parameter %v got no gradient", dt, p.Shape())
				}
				p.ZeroGrad()
			}
			after = append(after, a.Stats().Allocated[memory.All].Current)
		}
		for i, v := range after {
			if v != base {
				t.Errorf("%v step %d: %d bytes allocated after the step, %d before it", dt, i, v, base)
			}
		}
		net.release()
	}
}
