// Package optim holds optimisers (SGD, AdamW) that update parameters with
// the backends' fused multi-tensor kernels, learning-rate schedules, and
// GradScaler, the loss scaling that makes F16 gradients safe.
//
// Optimisers keep their state (momentum, moments) in F32 tensors beside the
// F32 master weights; ZeroGrad releases the gradients' memory, as PyTorch's
// zero_grad(set_to_none=True) does.
package optim

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// Optimizer updates parameters from their gradients.
type Optimizer interface {
	// Step updates every parameter that has a gradient.
	Step()
	// ZeroGrad releases every parameter's gradient.
	ZeroGrad()
	// Params are the parameters, in the order given.
	Params() []*tensor.Tensor
	// LR and SetLR read and set the learning rate (schedules call SetLR).
	LR() float64
	SetLR(lr float64)
	// State lists the optimiser's tensors (for checkpoints), named
	// "<kind>.<param index>", and Counters its scalar state.
	State() map[string]*tensor.Tensor
	Counters() map[string]float64
	// LoadState restores what State and Counters returned.
	LoadState(tensors map[string]*tensor.Tensor, counters map[string]float64) error
}

// withGrads returns the parameters that have gradients, with their indices.
func withGrads(params []*tensor.Tensor) (idx []int, ps, gs []kernels.Buf) {
	for i, p := range params {
		if g := p.Grad(); g != nil {
			idx = append(idx, i)
			ps = append(ps, p.Buf())
			gs = append(gs, g.Buf())
		}
	}
	return idx, ps, gs
}

func checkParams(params []*tensor.Tensor) {
	for i, p := range params {
		if p.DType() != tensor.F32 || !p.IsLeaf() {
			panic(fmt.Sprintf("optim: parameter %d is a %v %v tensor; want F32 leaves (master weights)", i, p.DType(), p.Shape()))
		}
	}
}

func zeroGrad(params []*tensor.Tensor) {
	for _, p := range params {
		p.ZeroGrad()
	}
}

// stateTensor makes an optimiser state tensor like p, outside any scope.
func stateTensor(p *tensor.Tensor) *tensor.Tensor {
	return tensor.Zeros(p.Device(), tensor.F32, p.Shape()...).Keep()
}

// SGD is stochastic gradient descent with momentum, Nesterov momentum and
// L2 weight decay, as torch.optim.SGD.
type SGD struct {
	params                           []*tensor.Tensor
	moms                             []*tensor.Tensor // nil until a parameter's first step
	lr                               float64
	Momentum, Dampening, WeightDecay float64
	Nesterov                         bool
}

// NewSGD returns SGD over params.
func NewSGD(params []*tensor.Tensor, lr, momentum, weightDecay float64, nesterov bool) *SGD {
	checkParams(params)
	if nesterov && momentum <= 0 {
		panic("optim: Nesterov momentum needs momentum > 0")
	}
	return &SGD{params: params, moms: make([]*tensor.Tensor, len(params)), lr: lr, Momentum: momentum,
		WeightDecay: weightDecay, Nesterov: nesterov}
}

// Step updates the parameters with gradients in one fused launch per group:
// those whose momentum buffer starts now, and the others.
func (o *SGD) Step() {
	idx, ps, gs := withGrads(o.params)
	if len(idx) == 0 {
		return
	}
	hp := kernels.SGDParams{LR: float32(o.lr), Momentum: float32(o.Momentum), Dampening: float32(o.Dampening),
		WeightDecay: float32(o.WeightDecay), Nesterov: o.Nesterov}
	be := o.params[idx[0]].Backend()
	if o.Momentum == 0 {
		be.SGD(hp, ps, gs, nil)
		return
	}
	var first, rest [3][]kernels.Buf
	for k, i := range idx {
		group := &rest
		if o.moms[i] == nil {
			o.moms[i] = stateTensor(o.params[i])
			group = &first
		}
		group[0] = append(group[0], ps[k])
		group[1] = append(group[1], gs[k])
		group[2] = append(group[2], o.moms[i].Buf())
	}
	if len(first[0]) > 0 {
		hp.FirstStep = true
		be.SGD(hp, first[0], first[1], first[2])
	}
	if len(rest[0]) > 0 {
		hp.FirstStep = false
		be.SGD(hp, rest[0], rest[1], rest[2])
	}
}

// ZeroGrad releases the gradients.
func (o *SGD) ZeroGrad() { zeroGrad(o.params) }

// Params are the parameters.
func (o *SGD) Params() []*tensor.Tensor { return o.params }

// LR is the learning rate.
func (o *SGD) LR() float64 { return o.lr }

// SetLR sets the learning rate.
func (o *SGD) SetLR(lr float64) { o.lr = lr }

// State lists the momentum buffers.
func (o *SGD) State() map[string]*tensor.Tensor {
	m := map[string]*tensor.Tensor{}
	for i, b := range o.moms {
		if b != nil {
			m[fmt.Sprintf("momentum.%d", i)] = b
		}
	}
	return m
}

// Counters lists the learning rate.
func (o *SGD) Counters() map[string]float64 { return map[string]float64{"lr": o.lr} }

// LoadState restores momentum buffers (copied) and the learning rate.
func (o *SGD) LoadState(ts map[string]*tensor.Tensor, c map[string]float64) error {
	if lr, ok := c["lr"]; ok {
		o.lr = lr
	}
	for i := range o.moms {
		t, ok := ts[fmt.Sprintf("momentum.%d", i)]
		if !ok {
			continue
		}
		if err := copyState(&o.moms[i], o.params[i], t, fmt.Sprintf("momentum.%d", i)); err != nil {
			return err
		}
	}
	return nil
}

// copyState copies src into *dst (made like p if nil), checking the shape.
func copyState(dst **tensor.Tensor, p, src *tensor.Tensor, name string) error {
	if !src.SameShape(p) || src.DType() != tensor.F32 {
		return fmt.Errorf("optimizer state %s is %v %v, its parameter is f32 %v", name, src.DType(), src.Shape(), p.Shape())
	}
	if *dst == nil {
		*dst = stateTensor(p)
	}
	raw := src.Raw()
	(*dst).Backend().Write((*dst).Buf(), raw)
	return nil
}

// Release releases the optimiser's state tensors.
func (o *SGD) Release() {
	for i, b := range o.moms {
		if b != nil {
			b.Release()
			o.moms[i] = nil
		}
	}
}

// AdamW is Adam with decoupled weight decay, as torch.optim.AdamW.
type AdamW struct {
	params                         []*tensor.Tensor
	m, v                           []*tensor.Tensor
	steps                          []int
	lr                             float64
	Beta1, Beta2, Eps, WeightDecay float64
}

// NewAdamW returns AdamW over params with PyTorch's defaults for the betas
// (0.9, 0.999) and ε (1e-8).
func NewAdamW(params []*tensor.Tensor, lr, weightDecay float64) *AdamW {
	checkParams(params)
	return &AdamW{params: params, m: make([]*tensor.Tensor, len(params)), v: make([]*tensor.Tensor, len(params)),
		steps: make([]int, len(params)), lr: lr, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: weightDecay}
}

// Step updates the parameters with gradients, one fused launch per group of
// parameters at the same step count (usually one group).
func (o *AdamW) Step() {
	idx, ps, gs := withGrads(o.params)
	groups := map[int]*[4][]kernels.Buf{}
	for k, i := range idx {
		if o.m[i] == nil {
			o.m[i], o.v[i] = stateTensor(o.params[i]), stateTensor(o.params[i])
		}
		o.steps[i]++
		g := groups[o.steps[i]]
		if g == nil {
			g = new([4][]kernels.Buf)
			groups[o.steps[i]] = g
		}
		g[0], g[1] = append(g[0], ps[k]), append(g[1], gs[k])
		g[2], g[3] = append(g[2], o.m[i].Buf()), append(g[3], o.v[i].Buf())
	}
	for step, g := range groups {
		hp := kernels.AdamWParams{LR: float32(o.lr), Beta1: float32(o.Beta1), Beta2: float32(o.Beta2),
			Eps: float32(o.Eps), WeightDecay: float32(o.WeightDecay), Step: step}
		o.params[idx[0]].Backend().AdamW(hp, g[0], g[1], g[2], g[3])
	}
}

// ZeroGrad releases the gradients.
func (o *AdamW) ZeroGrad() { zeroGrad(o.params) }

// Params are the parameters.
func (o *AdamW) Params() []*tensor.Tensor { return o.params }

// LR is the learning rate.
func (o *AdamW) LR() float64 { return o.lr }

// SetLR sets the learning rate.
func (o *AdamW) SetLR(lr float64) { o.lr = lr }

// State lists the moment estimates.
func (o *AdamW) State() map[string]*tensor.Tensor {
	s := map[string]*tensor.Tensor{}
	for i := range o.params {
		if o.m[i] != nil {
			s[fmt.Sprintf("exp_avg.%d", i)] = o.m[i]
			s[fmt.Sprintf("exp_avg_sq.%d", i)] = o.v[i]
		}
	}
	return s
}

// Counters lists the learning rate and each parameter's step count.
func (o *AdamW) Counters() map[string]float64 {
	c := map[string]float64{"lr": o.lr}
	for i, s := range o.steps {
		if s > 0 {
			c[fmt.Sprintf("step.%d", i)] = float64(s)
		}
	}
	return c
}

// LoadState restores moments, step counts and the learning rate.
func (o *AdamW) LoadState(ts map[string]*tensor.Tensor, c map[string]float64) error {
	if lr, ok := c["lr"]; ok {
		o.lr = lr
	}
	for i := range o.params {
		m, okm := ts[fmt.Sprintf("exp_avg.%d", i)]
		v, okv := ts[fmt.Sprintf("exp_avg_sq.%d", i)]
		if okm != okv {
			return fmt.Errorf("optimizer state of parameter %d has one moment but not the other", i)
		}
		if !okm {
			continue
		}
		if err := copyState(&o.m[i], o.params[i], m, fmt.Sprintf("exp_avg.%d", i)); err != nil {
			return err
		}
		if err := copyState(&o.v[i], o.params[i], v, fmt.Sprintf("exp_avg_sq.%d", i)); err != nil {
			return err
		}
		o.steps[i] = int(c[fmt.Sprintf("step.%d", i)])
	}
	return nil
}

// Release releases the optimiser's state tensors.
func (o *AdamW) Release() {
	for i := range o.params {
		if o.m[i] != nil {
			o.m[i].Release()
			o.v[i].Release()
			o.m[i], o.v[i] = nil, nil
		}
	}
}
