package nn

import (
	"fmt"
	"math"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/tensor"
)

// KaimingNormal returns an F32 tensor of shape drawn from N(0, 2/fan) (He
// initialisation for ReLU networks) from dev's generator.
func KaimingNormal(dev *tensor.Device, fan int, shape ...int) *T {
	return tensor.Randn(dev, tensor.F32, 0, float32(math.Sqrt(2/float64(fan))), shape...)
}

// Linear is y = x·Wᵀ + b, with W of Out×In (PyTorch's layout).
type Linear struct {
	Weight, Bias *T
}

// NewLinear returns a Linear layer initialised as PyTorch's: weight and bias
// uniform in ±1/√in.
func NewLinear(dev *tensor.Device, in, out int, bias bool) *Linear {
	if in < 1 || out < 1 {
		panic(fmt.Sprintf("nn: NewLinear(in %d, out %d): want at least one input and one output feature", in, out))
	}
	bound := float32(1 / math.Sqrt(float64(in)))
	l := &Linear{Weight: newParam(tensor.Rand(dev, tensor.F32, -bound, bound, out, in))}
	if bias {
		l.Bias = newParam(tensor.Rand(dev, tensor.F32, -bound, bound, out))
	}
	return l
}

// Forward computes x·Wᵀ + b for x of N×In.
func (l *Linear) Forward(x *T) *T { return ag.Linear(x, l.Weight, l.Bias) }

// State lists weight and bias.
func (l *Linear) State(prefix string) []Named {
	s := []Named{{Name: join(prefix, "weight"), T: l.Weight, Param: true}}
	if l.Bias != nil {
		s = append(s, Named{Name: join(prefix, "bias"), T: l.Bias, Param: true})
	}
	return s
}

// SetTraining does nothing: Linear behaves the same in both modes.
func (l *Linear) SetTraining(bool) {}

// Conv2d is a 2-D convolution with square kernels, stride and zero padding.
// Its weight is K×C×R×S in either layout.
type Conv2d struct {
	Weight, Bias *T
	Stride, Pad  int
	ChannelsLast bool // inputs and outputs N×H×W×C (autograd.Conv2dNHWC)
}

// NewConv2d returns a convolution of in to out channels with k×k kernels,
// Kaiming-normal initialised (fan out, as torchvision's ResNets), bias zero.
func NewConv2d(dev *tensor.Device, in, out, k, stride, pad int, bias bool) *Conv2d {
	if in < 1 || out < 1 || k < 1 || stride < 1 || pad < 0 {
		panic(fmt.Sprintf("nn: NewConv2d(in %d, out %d, kernel %d, stride %d, pad %d): want channels, kernel and stride of at least 1, padding of 0 or more",
			in, out, k, stride, pad))
	}
	c := &Conv2d{Weight: newParam(KaimingNormal(dev, out*k*k, out, in, k, k)), Stride: stride, Pad: pad}
	if bias {
		c.Bias = newParam(tensor.Zeros(dev, tensor.F32, out))
	}
	return c
}

// Forward convolves x (N×C×H×W, or N×H×W×C channels last).
func (c *Conv2d) Forward(x *T) *T {
	if c.ChannelsLast {
		return ag.Conv2dNHWC(x, c.Weight, c.Bias, c.Stride, c.Pad)
	}
	return ag.Conv2d(x, c.Weight, c.Bias, c.Stride, c.Pad)
}

// State lists weight and bias.
func (c *Conv2d) State(prefix string) []Named {
	s := []Named{{Name: join(prefix, "weight"), T: c.Weight, Param: true}}
	if c.Bias != nil {
		s = append(s, Named{Name: join(prefix, "bias"), T: c.Bias, Param: true})
	}
	return s
}

// SetTraining does nothing.
func (c *Conv2d) SetTraining(bool) {}

// BatchNorm2d normalises each channel with batch statistics in training and
// running statistics in evaluation.
type BatchNorm2d struct {
	Weight, Bias            *T // γ and β
	RunningMean, RunningVar *T
	Momentum, Eps           float32
	Training                bool
	ChannelsLast            bool // inputs N×H×W×C (autograd.BatchNormActNHWC)
}

// NewBatchNorm2d returns batch normalisation over c channels with PyTorch's
// defaults: γ = 1, β = 0, momentum 0.1, ε = 1e-5, training mode.
func NewBatchNorm2d(dev *tensor.Device, c int) *BatchNorm2d {
	if c < 1 {
		panic(fmt.Sprintf("nn: NewBatchNorm2d(%d channels): want at least 1", c))
	}
	return &BatchNorm2d{
		Weight:      newParam(tensor.Ones(dev, tensor.F32, c)),
		Bias:        newParam(tensor.Zeros(dev, tensor.F32, c)),
		RunningMean: tensor.Zeros(dev, tensor.F32, c).Keep(),
		RunningVar:  tensor.Ones(dev, tensor.F32, c).Keep(),
		Momentum:    0.1, Eps: 1e-5, Training: true,
	}
}

// Forward normalises x (N×C×H×W, or N×H×W×C channels last).
func (b *BatchNorm2d) Forward(x *T) *T { return b.ForwardAct(x, nil, false) }

// ForwardAct normalises x, adds residual (nil for none) and, with relu,
// applies a ReLU: one fused operation (autograd.BatchNormAct), the tail of a
// residual block.
func (b *BatchNorm2d) ForwardAct(x, residual *T, relu bool) *T {
	if b.ChannelsLast {
		return ag.BatchNormActNHWC(x, residual, b.Weight, b.Bias, b.RunningMean, b.RunningVar, b.Training, b.Momentum, b.Eps, relu)
	}
	return ag.BatchNormAct(x, residual, b.Weight, b.Bias, b.RunningMean, b.RunningVar, b.Training, b.Momentum, b.Eps, relu)
}

// State lists γ, β and the running statistics (buffers).
func (b *BatchNorm2d) State(prefix string) []Named {
	return []Named{
		{Name: join(prefix, "weight"), T: b.Weight, Param: true}, {Name: join(prefix, "bias"), T: b.Bias, Param: true},
		{Name: join(prefix, "running_mean"), T: b.RunningMean, Param: false}, {Name: join(prefix, "running_var"), T: b.RunningVar, Param: false},
	}
}

// SetTraining chooses batch (on) or running (off) statistics.
func (b *BatchNorm2d) SetTraining(on bool) { b.Training = on }

// fn is a stateless module made of a function.
type fn struct {
	name string
	f    func(*T) *T
}

func (m fn) Forward(x *T) *T      { return m.f(x) }
func (m fn) State(string) []Named { return nil }
func (m fn) SetTraining(bool)     {}
func (m fn) String() string       { return m.name }

// ReLU returns the max(x, 0) module.
func ReLU() Module { return fn{"ReLU", ag.ReLU} }

// Flatten returns the module reshaping N×... to N×(rest).
func Flatten() Module { return fn{"Flatten", ag.Flatten} }

// MaxPool2d returns k×k max pooling.
func MaxPool2d(k, stride, pad int) Module {
	return fn{fmt.Sprintf("MaxPool2d(%d,%d,%d)", k, stride, pad), func(x *T) *T { return ag.MaxPool2d(x, k, stride, pad) }}
}

// AvgPool2d returns k×k average pooling.
func AvgPool2d(k, stride, pad int) Module {
	return fn{fmt.Sprintf("AvgPool2d(%d,%d,%d)", k, stride, pad), func(x *T) *T { return ag.AvgPool2d(x, k, stride, pad) }}
}

// GlobalAvgPool returns the module averaging each channel: N×C×H×W to N×C.
func GlobalAvgPool() Module { return fn{"GlobalAvgPool", ag.GlobalAvgPool} }

// Dropout zeroes elements with probability P in training, drawing masks from
// the input's device generator.
type Dropout struct {
	P        float32
	Training bool
}

// NewDropout returns dropout with probability p, in training mode.
func NewDropout(p float32) *Dropout {
	if !(p >= 0 && p < 1) {
		panic(fmt.Sprintf("nn: NewDropout(%v): want a probability in [0, 1)", p))
	}
	return &Dropout{P: p, Training: true}
}

// Forward applies dropout in training and is the identity otherwise.
func (d *Dropout) Forward(x *T) *T {
	if !d.Training || d.P == 0 {
		return ag.Identity(x)
	}
	return ag.Dropout(x, d.P, nil)
}

// State is empty.
func (d *Dropout) State(string) []Named { return nil }

// SetTraining turns dropout on or off.
func (d *Dropout) SetTraining(on bool) { d.Training = on }

// CrossEntropy is the mean cross-entropy of logits (N×K) against I32 labels (N).
func CrossEntropy(logits, labels *T) *T { return ag.CrossEntropy(logits, labels) }
