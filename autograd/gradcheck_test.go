package autograd_test

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"testing"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// src draws a test's inputs, on one device.
type src struct {
	*rand.Rand
	dev *tensor.Device
}

// newSrc is a source on dev seeded with (a, b).
func newSrc(dev *tensor.Device, a, b uint64) src { return src{rand.New(rand.NewPCG(a, b)), dev} }

// param returns a leaf F32 tensor of shape with values from gen, requiring grad.
func param(rng src, gen func(*rand.Rand) float32, shape ...int) *tensor.Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = gen(rng.Rand)
	}
	return tensor.FromFloat32(rng.dev, v, shape...).Keep().SetRequiresGrad(true)
}

func normal(r *rand.Rand) float32   { return float32(r.NormFloat64()) }
func positive(r *rand.Rand) float32 { return 0.5 + 1.5*r.Float32() }
func small(r *rand.Rand) float32    { return 0.05 + 0.1*r.Float32() }

// farFromZero is at least 1.5 in size, either sign.
func farFromZero(r *rand.Rand) float32 {
	v := 1.5 + r.Float32()
	if r.IntN(2) == 0 {
		return -v
	}
	return v
}

// awayFromZero keeps |x| >= 0.1 so that ±eps never crosses a kink at 0.
func awayFromZero(r *rand.Rand) float32 {
	v := 0.1 + r.Float32()
	if r.IntN(2) == 0 {
		return -v
	}
	return v
}

// distinct returns a generator of values at least 0.05 apart (a shuffled
// ramp), so that the maximum of any window is unique by more than 2·eps.
func distinct(n int) func(*rand.Rand) float32 {
	var vals []float32
	return func(r *rand.Rand) float32 {
		if vals == nil {
			vals = make([]float32, n)
			for i := range vals {
				vals[i] = float32(i)*0.05 - float32(n)*0.025
			}
			r.Shuffle(n, func(i, j int) { vals[i], vals[j] = vals[j], vals[i] })
		}
		v := vals[0]
		vals = vals[1:]
		return v
	}
}

func labels(rng src, n, k int) *tensor.Tensor {
	l := make([]int32, n)
	for i := range l {
		l[i] = int32(rng.IntN(k))
	}
	return tensor.FromInt32(rng.dev, l, n).Keep()
}

type gradCase struct {
	name   string
	inputs func(r src) []*tensor.Tensor
	f      func(in []*tensor.Tensor) *tensor.Tensor
	opt    ag.GradCheckOptions
}

func unaryCase(name string, gen func(*rand.Rand) float32, f func(*tensor.Tensor) *tensor.Tensor) gradCase {
	return gradCase{name: name,
		inputs: func(r src) []*tensor.Tensor { return []*tensor.Tensor{param(r, gen, 3, 5, 7)} },
		f:      func(in []*tensor.Tensor) *tensor.Tensor { return f(in[0]) }}
}

func binaryCase(name string, a, b []int, gen func(*rand.Rand) float32, f func(x, y *tensor.Tensor) *tensor.Tensor) gradCase {
	return gradCase{name: fmt.Sprintf("%s%v%v", name, a, b),
		inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, a...), param(r, gen, b...)}
		},
		f: func(in []*tensor.Tensor) *tensor.Tensor { return f(in[0], in[1]) }}
}

func convCase(n, c, h, w, k, r, stride, pad int, bias, last bool) gradCase {
	name, shape, conv := "conv2d", []int{n, c, h, w}, ag.Conv2d
	if last {
		name, shape, conv = "conv2d-nhwc", []int{n, h, w, c}, ag.Conv2dNHWC
	}
	return gradCase{
		name: fmt.Sprintf("%s/x%dx%dx%dx%d/w%dx%dx%d/s%d/p%d/bias=%v", name, n, c, h, w, k, r, r, stride, pad, bias),
		inputs: func(rng src) []*tensor.Tensor {
			in := []*tensor.Tensor{param(rng, normal, shape...), param(rng, normal, k, c, r, r)}
			if bias {
				in = append(in, param(rng, normal, k))
			}
			return in
		},
		f: func(in []*tensor.Tensor) *tensor.Tensor {
			var b *tensor.Tensor
			if bias {
				b = in[2]
			}
			return conv(in[0], in[1], b, stride, pad)
		},
	}
}

func gradCases() []gradCase {
	var cases []gradCase
	// Every unary op of the kernels' table, on inputs from its domain.
	for _, op := range kernels.UnaryOps() {
		gen := map[kernels.Domain]func(*rand.Rand) float32{kernels.AnyReal: normal, kernels.Positive: positive,
			kernels.AwayFromZero: awayFromZero}[op.Def().Domain]
		cases = append(cases, unaryCase(op.String(), gen, func(x *tensor.Tensor) *tensor.Tensor { return ag.Unary(op, x) }))
	}
	for _, last := range []bool{false, true} {
		cases = append(cases,
			convCase(2, 3, 7, 6, 4, 3, 1, 1, true, last),
			convCase(1, 2, 9, 9, 3, 3, 2, 1, false, last),
			convCase(2, 3, 8, 8, 5, 1, 2, 0, false, last),
			convCase(3, 2, 5, 7, 2, 1, 1, 0, true, last),
			convCase(1, 1, 6, 5, 2, 3, 2, 0, true, last))
	}
	cases = append(cases, []gradCase{
		unaryCase("affine", normal, func(x *tensor.Tensor) *tensor.Tensor { return ag.Affine(x, -1.5, 0.25) }),
		unaryCase("reshape", normal, func(x *tensor.Tensor) *tensor.Tensor { return ag.Reshape(x, 7, -1) }),
		unaryCase("flatten", normal, ag.Flatten),
		binaryCase("add", []int{4, 5}, []int{4, 5}, normal, ag.Add),
		binaryCase("add", []int{3, 4, 5}, []int{4, 1}, normal, ag.Add),
		binaryCase("add", []int{2, 3, 4, 5}, []int{1, 3, 1, 1}, normal, ag.Add),
		binaryCase("sub", []int{3, 1}, []int{1, 4}, normal, ag.Sub),
		binaryCase("mul", []int{3, 4, 5}, []int{5}, normal, ag.Mul),
		binaryCase("mul", []int{1}, []int{2, 3}, normal, ag.Mul),
		binaryCase("div", []int{3, 4}, []int{3, 4}, positive, ag.Div),
		binaryCase("div", []int{2, 3, 4}, []int{3, 1}, positive, ag.Div),
		{name: "sum/axis1", inputs: func(r src) []*tensor.Tensor { return []*tensor.Tensor{param(r, normal, 3, 4, 5)} },
			f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.Sum(in[0], 1) }},
		{name: "mean/axis-1", inputs: func(r src) []*tensor.Tensor { return []*tensor.Tensor{param(r, normal, 3, 4, 5)} },
			f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.Mean(in[0], -1) }},
		{name: "max/axis0", inputs: func(r src) []*tensor.Tensor { return []*tensor.Tensor{param(r, distinct(60), 3, 4, 5)} },
			f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.Max(in[0], 0) }},
		{name: "sumall", inputs: func(r src) []*tensor.Tensor { return []*tensor.Tensor{param(r, normal, 3, 7)} },
			f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.SumAll(in[0]) }},
		{name: "meanall", inputs: func(r src) []*tensor.Tensor { return []*tensor.Tensor{param(r, normal, 3, 7)} },
			f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.MeanAll(in[0]) }},
		binaryCase("matmul", []int{3, 4}, []int{4, 5}, normal, ag.MatMul),
		binaryCase("matmul", []int{1, 7}, []int{7, 1}, normal, ag.MatMul),
		binaryCase("matmul/batched", []int{2, 3, 4}, []int{2, 4, 5}, normal, ag.MatMul),
		{name: "linear/bias", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 5, 7), param(r, normal, 3, 7), param(r, normal, 3)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.Linear(in[0], in[1], in[2]) }},
		{name: "linear+residual", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 5, 3), param(r, normal, 5, 7), param(r, normal, 3, 7), param(r, normal, 3)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.AddLinear(in[0], in[1], in[2], in[3]) }},
		{name: "linear+residual/nobias", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 2, 4), param(r, normal, 2, 6), param(r, normal, 4, 6)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.AddLinear(in[0], in[1], in[2], nil) }},
		{name: "linear/nobias/batch1", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 1, 6), param(r, normal, 4, 6)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.Linear(in[0], in[1], nil) }},
		{name: "batchnorm/train", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 3, 4, 3, 5), param(r, positive, 4), param(r, normal, 4)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor {
			rm, rv := tensor.Zeros(in[0].Device(), tensor.F32, 4), tensor.Ones(in[0].Device(), tensor.F32, 4)
			return ag.BatchNorm2d(in[0], in[1], in[2], rm, rv, true, 0.1, 1e-5)
		}, opt: ag.GradCheckOptions{Eps: 1e-2, RTol: 5e-2}},
		{name: "batchnorm/train/batch1", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 1, 2, 5, 5), param(r, positive, 2), param(r, normal, 2)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor {
			rm, rv := tensor.Zeros(in[0].Device(), tensor.F32, 2), tensor.Ones(in[0].Device(), tensor.F32, 2)
			return ag.BatchNorm2d(in[0], in[1], in[2], rm, rv, true, 0.1, 1e-5)
		}, opt: ag.GradCheckOptions{Eps: 1e-2, RTol: 5e-2}},
		// The fused ReLU's kink must stay out of reach of ±Eps: a small γ and a
		// residual (or β) of at least 1 in size keep the sums away from zero.
		{name: "batchnorm/train/residual+relu", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 3, 4, 3, 5), param(r, small, 4), param(r, normal, 4), param(r, farFromZero, 3, 4, 3, 5)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor {
			rm, rv := tensor.Zeros(in[0].Device(), tensor.F32, 4), tensor.Ones(in[0].Device(), tensor.F32, 4)
			return ag.BatchNormAct(in[0], in[3], in[1], in[2], rm, rv, true, 0.1, 1e-5, true)
		}, opt: ag.GradCheckOptions{Eps: 1e-2, RTol: 5e-2}},
		// The residual held elsewhere too (as a block's input is, by its
		// first convolution): the mask comes from x and the residual.
		{name: "batchnorm/train/residual+relu/shared", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 3, 4, 3, 5), param(r, small, 4), param(r, normal, 4), param(r, farFromZero, 3, 4, 3, 5)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor {
			rm, rv := tensor.Zeros(in[0].Device(), tensor.F32, 4), tensor.Ones(in[0].Device(), tensor.F32, 4)
			held := in[3].Alias()
			defer held.Release()
			return ag.BatchNormAct(in[0], in[3], in[1], in[2], rm, rv, true, 0.1, 1e-5, true)
		}, opt: ag.GradCheckOptions{Eps: 1e-2, RTol: 5e-2}},
		{name: "batchnorm/train/relu", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 2, 4, 4, 4), param(r, small, 4), param(r, farFromZero, 4)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor {
			rm, rv := tensor.Zeros(in[0].Device(), tensor.F32, 4), tensor.Ones(in[0].Device(), tensor.F32, 4)
			return ag.BatchNormAct(in[0], nil, in[1], in[2], rm, rv, true, 0.1, 1e-5, true)
		}, opt: ag.GradCheckOptions{Eps: 1e-2, RTol: 5e-2}},
		{name: "batchnorm/eval/residual+relu", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 2, 3, 4, 4), param(r, small, 3), param(r, normal, 3), param(r, farFromZero, 2, 3, 4, 4)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor {
			rm := tensor.FromFloat32(in[0].Device(), []float32{0.1, -0.2, 0.3}, 3)
			rv := tensor.FromFloat32(in[0].Device(), []float32{0.5, 1.5, 2}, 3)
			return ag.BatchNormAct(in[0], in[3], in[1], in[2], rm, rv, false, 0.1, 1e-5, true)
		}},
		{name: "batchnorm/eval", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 2, 3, 4, 4), param(r, positive, 3), param(r, normal, 3)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor {
			rm := tensor.FromFloat32(in[0].Device(), []float32{0.1, -0.2, 0.3}, 3)
			rv := tensor.FromFloat32(in[0].Device(), []float32{0.5, 1.5, 2}, 3)
			return ag.BatchNorm2d(in[0], in[1], in[2], rm, rv, false, 0.1, 1e-5)
		}},
		{name: "maxpool/k2s2", inputs: func(r src) []*tensor.Tensor { return []*tensor.Tensor{param(r, distinct(2*3*6*6), 2, 3, 6, 6)} },
			f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.MaxPool2d(in[0], 2, 2, 0) }},
		{name: "maxpool/k3s2p1/odd", inputs: func(r src) []*tensor.Tensor { return []*tensor.Tensor{param(r, distinct(1*2*7*5), 1, 2, 7, 5)} },
			f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.MaxPool2d(in[0], 3, 2, 1) }},
		{name: "avgpool/k2s2", inputs: func(r src) []*tensor.Tensor { return []*tensor.Tensor{param(r, normal, 2, 3, 6, 6)} },
			f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.AvgPool2d(in[0], 2, 2, 0) }},
		{name: "avgpool/k3s2p1/odd", inputs: func(r src) []*tensor.Tensor { return []*tensor.Tensor{param(r, normal, 1, 2, 7, 5)} },
			f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.AvgPool2d(in[0], 3, 2, 1) }},
		{name: "globalavgpool", inputs: func(r src) []*tensor.Tensor { return []*tensor.Tensor{param(r, normal, 2, 3, 5, 3)} },
			f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.GlobalAvgPool(in[0]) }},
		{name: "crossentropy", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 6, 5), labels(r, 6, 5)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.CrossEntropy(in[0], in[1]) }},
		{name: "crossentropy/batch1", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 1, 10), labels(r, 1, 10)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.CrossEntropy(in[0], in[1]) }},
		{name: "dropout", inputs: func(r src) []*tensor.Tensor { return []*tensor.Tensor{param(r, normal, 4, 9)} },
			f: func(in []*tensor.Tensor) *tensor.Tensor {
				return ag.Dropout(in[0], 0.3, tensor.NewGenerator(7)) // same mask on every call
			}},
		{name: "cast/f16/roundtrip", inputs: func(r src) []*tensor.Tensor { return []*tensor.Tensor{param(r, normal, 3, 5)} },
			f: func(in []*tensor.Tensor) *tensor.Tensor {
				return ag.Cast(ag.Mul(ag.Cast(in[0], tensor.F16), ag.Cast(in[0], tensor.F16)), tensor.F32)
			}, opt: ag.GradCheckOptions{Eps: 5e-2, RTol: 5e-2, ATol: 1e-2}},
		{name: "smallnet", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 2, 1, 6, 6), param(r, normal, 3, 1, 3, 3), param(r, positive, 3),
				param(r, normal, 3), param(r, normal, 4, 3), labels(r, 2, 4)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor {
			rm, rv := tensor.Zeros(in[0].Device(), tensor.F32, 3), tensor.Ones(in[0].Device(), tensor.F32, 3)
			h := ag.Conv2d(in[0], in[1], nil, 1, 1)
			h = ag.BatchNorm2d(h, in[2], in[3], rm, rv, true, 0.1, 1e-5)
			h = ag.Tanh(h)
			h = ag.GlobalAvgPool(ag.AvgPool2d(h, 2, 2, 0))
			return ag.CrossEntropy(ag.Linear(h, in[4], nil), in[5])
		}, opt: ag.GradCheckOptions{RTol: 5e-2}},
		{name: "embedding/repeated-ids", inputs: func(r src) []*tensor.Tensor {
			ids := tensor.FromInt32(r.dev, []int32{2, 0, 2, 4, 2, 1}, 2, 3).Keep()
			return []*tensor.Tensor{param(r, normal, 5, 4), ids}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.Embedding(in[0], in[1]) }},
		{name: "layernorm", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 2, 3, 7), param(r, positive, 7), param(r, normal, 7)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.LayerNorm(in[0], in[1], in[2], 1e-5) },
			opt: ag.GradCheckOptions{Eps: 1e-2, RTol: 5e-2}},
		{name: "causal-attention", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 2, 5, 3*6)} // two heads of 3
		}, f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.CausalAttention(in[0], 2) },
			opt: ag.GradCheckOptions{RTol: 5e-2}},
		{name: "classifier-loss", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 2, 3, 4), param(r, normal, 9, 4), labels(r, 6, 9)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor { l, _ := ag.ClassifierLoss(in[0], in[1], in[2]); return l }},
		// A tied embedding: the same table embeds the tokens and classifies
		// the positions, its gradient the sum of both uses.
		{name: "tied-embedding", inputs: func(r src) []*tensor.Tensor {
			ids := tensor.FromInt32(r.dev, []int32{3, 1, 3, 0}, 4).Keep()
			return []*tensor.Tensor{param(r, normal, 5, 6), ids, labels(r, 4, 5), param(r, positive, 6), param(r, normal, 6)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor {
			h := ag.LayerNorm(ag.Embedding(in[0], in[1]), in[3], in[4], 1e-5)
			l, _ := ag.ClassifierLoss(h, in[0], in[2])
			return l
		}, opt: ag.GradCheckOptions{Eps: 1e-2, RTol: 5e-2}},
		// Linear, GELU and Linear as one op, the activation and biases in
		// the products' epilogues.
		{name: "mlp", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 5, 4), param(r, normal, 6, 4), param(r, normal, 6), param(r, normal, 3, 6), param(r, normal, 3)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.MLP(in[0], in[1], in[2], in[3], in[4]) }},
		{name: "mlp+residual", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 5, 3), param(r, normal, 5, 4), param(r, normal, 6, 4), param(r, normal, 6), param(r, normal, 3, 6), param(r, normal, 3)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.AddMLP(in[0], in[1], in[2], in[3], in[4], in[5]) }},
		// Channels last: the layout changes, the batch norm and pooling over
		// the last axis, and a block (Note [channels last] in package kernels).
		unaryCase("to_nhwc", normal, func(x *tensor.Tensor) *tensor.Tensor { return ag.ToNHWC(ag.Reshape(x, 3, 5, 7, 1)) }),
		{name: "to_nhwc/to_nchw", inputs: func(r src) []*tensor.Tensor { return []*tensor.Tensor{param(r, normal, 2, 3, 4, 5)} },
			f: func(in []*tensor.Tensor) *tensor.Tensor {
				return ag.Mul(ag.ToNCHW(ag.Tanh(ag.ToNHWC(in[0]))), in[0])
			}},
		{name: "batchnorm-nhwc/train/residual+relu", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 3, 3, 5, 4), param(r, small, 4), param(r, normal, 4), param(r, farFromZero, 3, 3, 5, 4)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor {
			rm, rv := tensor.Zeros(in[0].Device(), tensor.F32, 4), tensor.Ones(in[0].Device(), tensor.F32, 4)
			return ag.BatchNormActNHWC(in[0], in[3], in[1], in[2], rm, rv, true, 0.1, 1e-5, true)
		}, opt: ag.GradCheckOptions{Eps: 1e-2, RTol: 5e-2}},
		{name: "batchnorm-nhwc/train", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 2, 4, 3, 5), param(r, positive, 5), param(r, normal, 5)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor {
			rm, rv := tensor.Zeros(in[0].Device(), tensor.F32, 5), tensor.Ones(in[0].Device(), tensor.F32, 5)
			return ag.BatchNormActNHWC(in[0], nil, in[1], in[2], rm, rv, true, 0.1, 1e-5, false)
		}, opt: ag.GradCheckOptions{Eps: 1e-2, RTol: 5e-2}},
		{name: "batchnorm-nhwc/eval/residual+relu", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 2, 4, 4, 3), param(r, small, 3), param(r, normal, 3), param(r, farFromZero, 2, 4, 4, 3)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor {
			rm := tensor.FromFloat32(in[0].Device(), []float32{0.1, -0.2, 0.3}, 3)
			rv := tensor.FromFloat32(in[0].Device(), []float32{0.5, 1.5, 2}, 3)
			return ag.BatchNormActNHWC(in[0], in[3], in[1], in[2], rm, rv, false, 0.1, 1e-5, true)
		}},
		{name: "globalavgpool-nhwc", inputs: func(r src) []*tensor.Tensor { return []*tensor.Tensor{param(r, normal, 2, 5, 3, 3)} },
			f: func(in []*tensor.Tensor) *tensor.Tensor { return ag.GlobalAvgPoolNHWC(in[0]) }},
		{name: "conv2d+batchnorm+residual+relu+conv2d-nhwc/train", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, farFromZero, 2, 5, 4, 3), param(r, normal, 3, 3, 3, 3), param(r, small, 3), param(r, normal, 3), param(r, normal, 4, 3, 3, 3)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor {
			rm, rv := tensor.Zeros(in[0].Device(), tensor.F32, 3), tensor.Ones(in[0].Device(), tensor.F32, 3)
			h := ag.Conv2dNHWC(in[0], in[1], nil, 1, 1) // saves in[0], the shortcut
			y := ag.BatchNormActNHWC(h, in[0], in[2], in[3], rm, rv, true, 0.1, 1e-5, true)
			return ag.Conv2dNHWC(y, in[4], nil, 1, 1)
		}, opt: ag.GradCheckOptions{Eps: 3e-3, RTol: 5e-2}}, // at ±1e-2 a ReLU kink is in reach
		// A block's first batch norm and ReLU with its second convolution,
		// the batch norm's output written again in the convolution's
		// backward; and a block's second batch norm, its shortcut held by
		// the first convolution, with the next block's first convolution.
		{name: "batchnorm+relu+conv2d/train", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, normal, 2, 3, 5, 4), param(r, small, 3), param(r, farFromZero, 3), param(r, normal, 4, 3, 3, 3)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor {
			rm, rv := tensor.Zeros(in[0].Device(), tensor.F32, 3), tensor.Ones(in[0].Device(), tensor.F32, 3)
			return ag.Conv2d(ag.BatchNormAct(in[0], nil, in[1], in[2], rm, rv, true, 0.1, 1e-5, true), in[3], nil, 2, 1)
		}, opt: ag.GradCheckOptions{Eps: 1e-2, RTol: 5e-2}},
		{name: "conv2d+batchnorm+residual+relu+conv2d/train", inputs: func(r src) []*tensor.Tensor {
			return []*tensor.Tensor{param(r, farFromZero, 2, 3, 5, 4), param(r, normal, 3, 3, 3, 3), param(r, small, 3), param(r, normal, 3), param(r, normal, 4, 3, 3, 3)}
		}, f: func(in []*tensor.Tensor) *tensor.Tensor {
			rm, rv := tensor.Zeros(in[0].Device(), tensor.F32, 3), tensor.Ones(in[0].Device(), tensor.F32, 3)
			h := ag.Conv2d(in[0], in[1], nil, 1, 1) // saves in[0], the shortcut
			y := ag.BatchNormAct(h, in[0], in[2], in[3], rm, rv, true, 0.1, 1e-5, true)
			return ag.Conv2d(y, in[4], nil, 1, 1)
		}, opt: ag.GradCheckOptions{Eps: 1e-2, RTol: 5e-2}},
	}...)
	return cases
}

func TestGradCheck(t *testing.T) { testGradCheck(t, tensor.CPU()) }

func testGradCheck(t *testing.T, dev *tensor.Device) {
	for _, tc := range gradCases() {
		t.Run(tc.name, func(t *testing.T) {
			// Seeded by the case's name: adding a case draws no other's inputs anew.
			h := fnv.New64a()
			h.Write([]byte(tc.name))
			seed := h.Sum64()
			rng := newSrc(dev, seed, 11)
			var inputs []*tensor.Tensor
			dev.WithScope(func() { inputs = tc.inputs(rng) })
			defer func() {
				for _, x := range inputs {
					x.Release()
				}
			}()
			opt := tc.opt
			opt.Seed = seed
			if err := ag.GradCheck(tc.f, inputs, opt); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestGradCheckCatchesWrongGradient makes sure the checker can fail: a
// function whose recorded backward is wrong (it scales by 2 but claims 3).
func TestGradCheckCatchesWrongGradient(t *testing.T) {
	rng := newSrc(tensor.CPU(), 1, 2)
	x := param(rng, normal, 4, 3)
	defer x.Release()
	wrong := func(in []*tensor.Tensor) *tensor.Tensor {
		// 2x computed as x + x, but with the second term detached: Backward sees 1x.
		return ag.Add(in[0], ag.Detach(in[0]))
	}
	if err := ag.GradCheck(wrong, []*tensor.Tensor{x}, ag.GradCheckOptions{}); err == nil {
		t.Error("gradcheck passed a function whose gradient is half the true one")
	}
}
