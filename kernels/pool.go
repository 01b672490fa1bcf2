package kernels

import "fmt"

// PoolOps are 2-D max and average pooling.
type PoolOps interface {
	// MaxPool2d computes y from x.
	MaxPool2d(p PoolParams, x, y Buf)

	// MaxPool2dBackward routes dy to the maximum of each window of x (the first on ties).
	MaxPool2dBackward(p PoolParams, x, dy, dx Buf)

	// AvgPool2d computes y from x.
	AvgPool2d(p PoolParams, x, y Buf)

	// AvgPool2dBackward computes dx from dy.
	AvgPool2dBackward(p PoolParams, dy, dx Buf)
}

// PoolParams describes 2-D max or average pooling of an N×C×H×W input with a
// KH×KW window, stride and zero padding. Average pooling counts the padding
// in its divisor (PyTorch's count_include_pad=True); max pooling ignores it.
type PoolParams struct {
	N, C, H, W int
	KH, KW     int
	SH, SW     int
	PH, PW     int
}

// OutH is the output height.
func (p PoolParams) OutH() int { return (p.H+2*p.PH-p.KH)/p.SH + 1 }

// OutW is the output width.
func (p PoolParams) OutW() int { return (p.W+2*p.PW-p.KW)/p.SW + 1 }

// Validate panics unless the parameters describe a pooling with a non-empty
// output whose windows each hold at least one input element.
func (p PoolParams) Validate() {
	if p.N <= 0 || p.C <= 0 || p.H <= 0 || p.W <= 0 || p.KH <= 0 || p.KW <= 0 || p.SH <= 0 || p.SW <= 0 ||
		p.PH < 0 || p.PW < 0 || 2*p.PH > p.KH || 2*p.PW > p.KW || p.OutH() <= 0 || p.OutW() <= 0 {
		panic(fmt.Sprintf("kernels: invalid pooling %+v", p))
	}
}

// CheckPool checks a pooling's input and output against p.
func CheckPool(op string, p PoolParams, x, y Buf) {
	p.Validate()
	CheckLen(op+" input", p.N*p.C*p.H*p.W, x)
	CheckLen(op+" output", p.N*p.C*p.OutH()*p.OutW(), y)
}

func (o *Observed) MaxPool2d(p PoolParams, x, y Buf) {
	defer o.op("MaxPool2d", "MaxPool2d", x)()
	o.B.MaxPool2d(p, x, y)
}

func (o *Observed) MaxPool2dBackward(p PoolParams, x, dy, dx Buf) {
	defer o.op("MaxPool2dBackward", "MaxPool2dBackward", dy)()
	o.B.MaxPool2dBackward(p, x, dy, dx)
}

func (o *Observed) AvgPool2d(p PoolParams, x, y Buf) {
	defer o.op("AvgPool2d", "AvgPool2d", x)()
	o.B.AvgPool2d(p, x, y)
}

func (o *Observed) AvgPool2dBackward(p PoolParams, dy, dx Buf) {
	defer o.op("AvgPool2dBackward", "AvgPool2dBackward", dy)()
	o.B.AvgPool2dBackward(p, dy, dx)
}
