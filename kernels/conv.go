package kernels

import "fmt"

// ConvOps are 2-D convolutions and their gradients.
type ConvOps interface {
	// Conv2d computes y (N×K×OH×OW) from x (N×C×H×W) and w (K×C×R×S).
	Conv2d(p ConvParams, x, w, y Buf)

	// Conv2dBackwardData computes dx from dy and w.
	Conv2dBackwardData(p ConvParams, dy, w, dx Buf)

	// Conv2dBackwardFilter computes dw from x and dy.
	Conv2dBackwardFilter(p ConvParams, x, dy, dw Buf)
}

// ConvParams describes a 2-D convolution (cross-correlation, as in every deep
// learning framework) of an N×C×H×W input with K filters of C×R×S, with
// zero padding and stride. There is no bias: add one with Binary.
//
// With ChannelsLast the tensors are laid out channels innermost (NHWC):
// the input N×H×W×C, the output N×OH×OW×K and the filters K×R×S×C, the
// layout in which cuDNN's 16-bit tensor-core kernels read them without
// transposing around themselves (Note [channels last], layout.go).
type ConvParams struct {
	N, C, H, W       int
	K, R, S          int
	StrideH, StrideW int
	PadH, PadW       int
	ChannelsLast     bool
}

// OutH is the output height.
func (p ConvParams) OutH() int { return (p.H+2*p.PadH-p.R)/p.StrideH + 1 }

// OutW is the output width.
func (p ConvParams) OutW() int { return (p.W+2*p.PadW-p.S)/p.StrideW + 1 }

// Validate panics unless the parameters describe a convolution with a
// non-empty output.
func (p ConvParams) Validate() {
	if p.N <= 0 || p.C <= 0 || p.H <= 0 || p.W <= 0 || p.K <= 0 || p.R <= 0 || p.S <= 0 ||
		p.StrideH <= 0 || p.StrideW <= 0 || p.PadH < 0 || p.PadW < 0 || p.OutH() <= 0 || p.OutW() <= 0 {
		panic(fmt.Sprintf("kernels: invalid convolution %+v", p))
	}
}

// CheckConv checks a convolution's input x, weight w and output y against p.
func CheckConv(op string, p ConvParams, x, w, y Buf) {
	p.Validate()
	CheckLen(op+" input", p.N*p.C*p.H*p.W, x)
	CheckLen(op+" weight", p.K*p.C*p.R*p.S, w)
	CheckLen(op+" output", p.N*p.K*p.OutH()*p.OutW(), y)
	if x.DType != w.DType || x.DType != y.DType {
		panic(fmt.Sprintf("kernels: %s of %v input, %v weight, %v output", op, x.DType, w.DType, y.DType))
	}
}

func (o *Observed) Conv2d(p ConvParams, x, w, y Buf) {
	defer o.op("Conv2d", "Conv2d", x)()
	o.B.Conv2d(p, x, w, y)
}

func (o *Observed) Conv2dBackwardData(p ConvParams, dy, w, dx Buf) {
	defer o.op("Conv2dBackwardData", "Conv2dBackwardData", dy)()
	o.B.Conv2dBackwardData(p, dy, w, dx)
}

func (o *Observed) Conv2dBackwardFilter(p ConvParams, x, dy, dw Buf) {
	defer o.op("Conv2dBackwardFilter", "Conv2dBackwardFilter", dy)()
	o.B.Conv2dBackwardFilter(p, x, dy, dw)
}
