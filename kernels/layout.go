package kernels

import "fmt"

// Transposition describes the swap of the two inner axes of an
// Outer×Rows×Cols array: dst[o][c][r] = src[o][r][c].
type Transposition struct {
	Outer, Rows, Cols int
}

// Len is the number of elements of either side.
func (t Transposition) Len() int { return t.Outer * t.Rows * t.Cols }

// ToChannelsLast is the transposition of an N×C×HW array into N×HW×C.
func ToChannelsLast(n, c, hw int) Transposition { return Transposition{n, c, hw} }

// ToChannelsFirst is the transposition of an N×HW×C array into N×C×HW.
func ToChannelsFirst(n, c, hw int) Transposition { return Transposition{n, hw, c} }

// Note [channels last]
// cuDNN's F16 and BF16 convolutions run on tensor cores in NHWC; given NCHW
// they transpose their operands around the product, and for the few
// channels of a CIFAR ResNet (16 to 64) that costs more than the product:
// on the H200 at batch 128, a 3×3 convolution of 16 channels at 28×28 took
// 30.6, 36.3 and 47.0 µs (forward, data and filter gradients) in F16 NCHW,
// 15.3, 20.2 and 31.9 in F16 NHWC, and 43.1, 42.7 and 50.8 in TF32 NCHW
// (scripts/nhwc-bench.py). So on a backend that says so
// (Info.ChannelsLast), a step under autocast (train.NewStep) runs a
// ResNet's activations channels last from its input to the pooling
// (nn.ResNet.SetChannelsLast, autograd's NHWC operations): batch norm
// then reduces the columns of an (N·H·W)×C matrix (BNParams with HW 1; a
// backend reads it by rows), ReLU and the residual add do not care, and
// each convolution reads its filters' autocast copy transposed into
// K×R×S×C. The parameters keep PyTorch's K×C×R×S, so a model's state does
// not depend on the layout it ran in. On the H200 it took ResNet-1202's
// AMP step at batch 128 from 167 ms to 144 ms, against fp32's 160 ms
// (docs/benchmarks.md).
//
// Limitations: the filter transposes are two small launches per
// convolution a step (one forward, one for the gradient), and through the
// forward the filters have two F16 copies, the autocast one and the
// transposed one; a cast that wrote the copies transposed would remove
// both. F32 convolutions stay channels first: their layouts were not
// measured.

// ConvChannelsFirst runs conv, a convolution of channels-first operands,
// on the channels-last operands of p (p.ChannelsLast set) through
// channels-first copies: ops are p's input, filters and output, out the
// index of the one the direction writes (0, 1 or 2; the other two are
// read). temp allocates a scratch buffer and returns its release;
// transpose is the backend's Transpose. It is the way a backend runs
// channels-last convolutions it has no kernels of its own for.
func ConvChannelsFirst(p ConvParams, ops [3]Buf, out int, temp func(n int, dt DType) (Buf, func()),
	transpose func(dst, src Buf, t Transposition), conv func(p ConvParams, ops [3]Buf)) {
	if !p.ChannelsLast || out < 0 || out > 2 {
		panic(fmt.Sprintf("kernels: channels-first run of %+v writing operand %d", p, out))
	}
	oh, ow := p.OutH(), p.OutW()
	shapes := [3][3]int{{p.N, p.C, p.H * p.W}, {p.K, p.C, p.R * p.S}, {p.N, p.K, oh * ow}} // each as N×C×HW
	var first [3]Buf
	for i, b := range ops {
		t, release := temp(b.N, b.DType)
		defer release()
		first[i] = t
		if i != out {
			s := shapes[i]
			transpose(t, b, ToChannelsFirst(s[0], s[1], s[2]))
		}
	}
	q := p
	q.ChannelsLast = false
	conv(q, first)
	s := shapes[out]
	transpose(ops[out], first[out], ToChannelsLast(s[0], s[1], s[2]))
}
