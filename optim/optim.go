// Package optim holds optimisers (SGD, AdamW) that update parameters with
// the backends' fused multi-tensor kernels, learning-rate schedules, and
// GradScaler, the loss scaling that makes F16 gradients safe.
//
// Optimisers keep their state (momentum, moments) in F32 tensors beside the
// F32 master weights; ZeroGrad releases the gradients' memory, as PyTorch's
// zero_grad(set_to_none=True) does. Everything an update reads that changes
// from step to step (the learning rate, AdamW's step count, GradScaler's
// scale and found-inf flag) lives on the device, so that a step queues its
// work without waiting for the device and a captured step replays with
// current values: the host never decides whether an update runs.
package optim

import (
	"fmt"
	"slices"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// Optimizer updates parameters from their gradients.
type Optimizer interface {
	// Step updates every parameter that has a gradient.
	Step()
	// StepUnless is Step, except that the update does nothing when skip (an
	// F32 flag of one element, read on the device when the update runs) is
	// not zero: how GradScaler skips a step with inf/NaN gradients without
	// the host reading the flag.
	StepUnless(skip kernels.Buf)
	// ZeroGrad releases every parameter's gradient.
	ZeroGrad()
	// Params are the parameters, in the order given.
	Params() []*tensor.Tensor
	// LR and SetLR read and set the learning rate (schedules call SetLR).
	// SetLR queues a write of the device's copy; it does not wait.
	LR() float64
	SetLR(lr float64)
	// State lists the optimiser's tensors (for checkpoints), named
	// "<kind>.<param index>", and Counters its scalar state.
	State() map[string]*tensor.Tensor
	Counters() map[string]float64
	// LoadState restores what State and Counters returned.
	LoadState(tensors map[string]*tensor.Tensor, counters map[string]float64) error
	// Release frees the optimiser's state on the device.
	Release()
}

// A ScaledStepper's update can read the gradients through a multiplier on
// the device, so that the GradScaler's unscale and the clip's scaling
// need no pass of their own over them (GradScaler.StepClipped).
type ScaledStepper interface {
	// StepScaled is StepUnless with every gradient multiplied by mult
	// (F32, 1 element, read on the device) as the update reads it.
	StepScaled(mult, skip kernels.Buf)
}

// A SquareSummer sums the squares of its gradients itself: an optimiser
// whose gradients leave the device during the backward (Offloaded).
// GradScaler.StepClipped asks it instead of reading the gradients.
type SquareSummer interface {
	// SumGradSquares writes the sum of the squares of the step's gradients
	// into sumsq (F32, 1 element, on the device).
	SumGradSquares(sumsq kernels.Buf)
}

// deviceLR is a learning rate with its device copy.
type deviceLR struct {
	lr  float64
	buf *tensor.Tensor // F32[1]; nil without parameters
}

func newDeviceLR(params []*tensor.Tensor, lr float64) deviceLR {
	d := deviceLR{lr: lr}
	if len(params) > 0 {
		d.buf = tensor.Full(params[0].Device(), tensor.F32, float32(lr), 1).Keep()
	}
	return d
}

// LR is the learning rate.
func (d *deviceLR) LR() float64 { return d.lr }

// SetLR sets the learning rate, queueing the write of its device copy.
func (d *deviceLR) SetLR(lr float64) {
	d.lr = lr
	if d.buf != nil {
		d.buf.Backend().Fill(d.buf.Buf(), float32(lr))
	}
}

func (d *deviceLR) release() {
	if d.buf != nil {
		d.buf.Release()
		d.buf = nil
	}
}

// withGrads returns the indices of the parameters that have gradients.
func withGrads(params []*tensor.Tensor) (idx []int) {
	for i, p := range params {
		if p.Grad() != nil {
			idx = append(idx, i)
		}
	}
	return idx
}

// PerParameter is an optimizer that can update its parameters one at a
// time, as each gradient is finished in the backward (train's
// FuseOptimizer), to the results of Step bit for bit: Begin counts the
// step, once, before the first parameter; StepParam updates parameter i
// (in Params' order) from its gradient, if it has one, and releases the
// gradient.
type PerParameter interface {
	Begin()
	StepParam(i int)
}

// checkParams panics unless params are leaves in F32, or in 16 bits as
// working weights for Offload (Note [working weights in 16 bits]).
func checkParams(params []*tensor.Tensor) {
	for i, p := range params {
		if (p.DType() != tensor.F32 && !p.DType().Half()) || !p.IsLeaf() {
			panic(fmt.Sprintf("optim: parameter %d is a %v %v tensor; want F32 leaves (master weights), or 16-bit working weights to offload", i, p.DType(), p.Shape()))
		}
	}
}

// checkMasters panics when a parameter of idx is a 16-bit working weight:
// its F32 master is an offloaded optimizer's (Offload), and an update of the
// working copy on the device would round most updates away.
func checkMasters(params []*tensor.Tensor, idx []int) {
	for _, i := range idx {
		if p := params[i]; p.DType() != tensor.F32 {
			panic(fmt.Sprintf("optim: stepping parameter %d, a %v %v working weight, on the device: its F32 master needs the optimizer offloaded (Offload)", i, p.DType(), p.Shape()))
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

// ensureState gives the parameters idx state tensors (made like the
// parameter by stateTensor) in each of lists where they have none
// (ensureStates).
func ensureState(params []*tensor.Tensor, idx []int, lists ...[]*tensor.Tensor) {
	sl := make([]stateList, len(lists))
	for k, l := range lists {
		sl[k] = stateList{l: l, make: stateTensor}
	}
	ensureStates(params, idx, sl...)
}

// stateList is a list of state tensors, one a parameter, made by make for
// the parameters i for which of(i) holds (nil: every parameter).
type stateList struct {
	l    []*tensor.Tensor
	of   func(i int) bool
	make func(p *tensor.Tensor) *tensor.Tensor
}

// ensureStates gives the parameters idx state tensors in each of lists
// where they have none, all or none: when an allocation fails (out of
// memory), the ones made here are released before the panic goes on, so
// that a step run again finds the state as it was (a first step rounds
// differently from a later one on zero state, so half-made state would
// change the result).
func ensureStates(params []*tensor.Tensor, idx []int, lists ...stateList) {
	var made []**tensor.Tensor
	ok := false
	defer func() {
		if !ok {
			for _, t := range made {
				(*t).Release()
				*t = nil
			}
		}
	}()
	for _, i := range idx {
		for _, l := range lists {
			if (l.of == nil || l.of(i)) && l.l[i] == nil {
				l.l[i] = l.make(params[i])
				made = append(made, &l.l[i])
			}
		}
	}
	ok = true
}

// SGD is stochastic gradient descent with momentum, Nesterov momentum and
// L2 weight decay, as torch.optim.SGD.
type SGD struct {
	deviceLR
	params                           []*tensor.Tensor
	moms                             []*tensor.Tensor // nil until a parameter's first step
	Momentum, Dampening, WeightDecay float64
	Nesterov                         bool
	// NoDecay, if set, has one entry a parameter: true exempts it from the
	// weight decay (biases, norms' gains, as users choose).
	NoDecay []bool
}

// NewSGD returns SGD over params.
func NewSGD(params []*tensor.Tensor, lr, momentum, weightDecay float64, nesterov bool) *SGD {
	checkParams(params)
	if nesterov && momentum <= 0 {
		panic("optim: Nesterov momentum needs momentum > 0")
	}
	return &SGD{deviceLR: newDeviceLR(params, lr), params: params, moms: make([]*tensor.Tensor, len(params)),
		Momentum: momentum, WeightDecay: weightDecay, Nesterov: nesterov}
}

// Step updates the parameters with gradients.
func (o *SGD) Step() { o.StepUnless(kernels.Buf{}) }

// StepUnless updates the parameters with gradients, unless skip is set when
// the update runs, in one fused launch per group: those whose momentum
// buffer starts now, and the others. Momentum buffers start at zero, so a
// first step that skip cancels leaves a state from which the next step
// computes what a first step would (with Dampening 0, torch's default).
func (o *SGD) StepUnless(skip kernels.Buf) { o.update(withGrads(o.params), skip) }

// Begin starts a step of updates by StepParam (PerParameter): SGD counts
// nothing.
func (o *SGD) Begin() {}

// StepParam updates parameter i from its gradient and releases the
// gradient (PerParameter).
func (o *SGD) StepParam(i int) {
	if o.params[i].Grad() != nil {
		o.update([]int{i}, kernels.Buf{})
		o.params[i].ZeroGrad()
	}
}

// update updates the parameters idx, which have gradients (StepUnless).
func (o *SGD) update(idx []int, skip kernels.Buf) {
	if len(idx) == 0 {
		return
	}
	checkMasters(o.params, idx)
	hp := kernels.SGDParams{LR: o.buf.Buf(), Momentum: float32(o.Momentum), Dampening: float32(o.Dampening),
		Nesterov: o.Nesterov, Skip: skip}
	be := o.params[idx[0]].Backend()
	fresh := make([]bool, len(idx))
	if o.Momentum != 0 {
		for k, i := range idx {
			fresh[k] = o.moms[i] == nil
		}
		ensureState(o.params, idx, o.moms)
	}
	// Groups by (first step, decayed): one launch each.
	var groups [2][2][3][]kernels.Buf
	for k, i := range idx {
		g := &groups[boolIndex(fresh[k])][boolIndex(decays(o.NoDecay, i))]
		g[0], g[1] = append(g[0], o.params[i].Buf()), append(g[1], o.params[i].Grad().Buf())
		if o.Momentum != 0 {
			g[2] = append(g[2], o.moms[i].Buf())
		}
	}
	for f := range groups {
		for d, g := range groups[f] {
			if len(g[0]) == 0 {
				continue
			}
			hp.FirstStep, hp.WeightDecay = f == 1, 0
			if d == 1 {
				hp.WeightDecay = float32(o.WeightDecay)
			}
			be.SGD(hp, g[0], g[1], g[2])
		}
	}
}

// decays reports whether parameter i is weight-decayed under noDecay.
func decays(noDecay []bool, i int) bool { return noDecay == nil || !noDecay[i] }

func boolIndex(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ZeroGrad releases the gradients.
func (o *SGD) ZeroGrad() { zeroGrad(o.params) }

// Params are the parameters.
func (o *SGD) Params() []*tensor.Tensor { return o.params }

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
		o.SetLR(lr)
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

// copyState copies src into *dst (made like p if nil), checking that it
// is F32 of p's shape.
func copyState(dst **tensor.Tensor, p, src *tensor.Tensor, name string) error {
	return loadAs(dst, p.Device(), src, tensor.F32, p.Shape(), name)
}

// Release releases the optimiser's state tensors.
func (o *SGD) Release() {
	for i, b := range o.moms {
		if b != nil {
			b.Release()
			o.moms[i] = nil
		}
	}
	o.release()
}

// AdamW is Adam with decoupled weight decay, as torch.optim.AdamW.
//
// Note (a difference from PyTorch): the step count that drives the bias
// correction is one device counter for all parameters, not one per
// parameter; the two differ only for a parameter that has no gradient in
// some steps.
//
// An AdamW made by NewAdamW8bit holds the moments of each parameter of at
// least Min8Bit elements in 8 bits a value (kernels.OptimOps.AdamW8):
// codes (U8, the parameter's shape and 2) and two scales a block of
// kernels.Quant8Block values (F32, [blocks, 2]), 2.03 bytes a parameter
// where AdamW's F32 moments take 8.
type AdamW struct {
	deviceLR
	params                         []*tensor.Tensor
	m, v                           []*tensor.Tensor // F32 moments (nil until a parameter's first step)
	codes, absmax                  []*tensor.Tensor // 8-bit moments (NewAdamW8bit; nil until a first step)
	qmap                           *tensor.Tensor   // kernels.Quant8Maps on the device (NewAdamW8bit)
	step                           *tensor.Counter  // steps taken (not skipped)
	Beta1, Beta2, Eps, WeightDecay float64
	// NoDecay, if set, has one entry a parameter: true exempts it from the
	// weight decay (AdamW's parameter groups: biases, norms' gains and
	// position embeddings, as users choose).
	NoDecay []bool
}

// NewAdamW returns AdamW over params with PyTorch's defaults for the betas
// (0.9, 0.999) and ε (1e-8).
func NewAdamW(params []*tensor.Tensor, lr, weightDecay float64) *AdamW {
	checkParams(params)
	o := &AdamW{deviceLR: newDeviceLR(params, lr), params: params, m: make([]*tensor.Tensor, len(params)),
		v: make([]*tensor.Tensor, len(params)), Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: weightDecay}
	if len(params) > 0 {
		o.step = tensor.NewCounter(params[0].Device(), 0)
	}
	return o
}

// Min8Bit is the fewest elements for which an AdamW made by NewAdamW8bit
// keeps a parameter's moments in 8 bits: smaller ones (biases, norms'
// gains), whose F32 state costs little, keep it in F32, as bitsandbytes'
// 8-bit optimizers do by default.
const Min8Bit = 4096

// NewAdamW8bit returns AdamW over params whose moments are held in 8 bits
// a value, quantised block by block (kernels.OptimOps.AdamW8), for every
// parameter of at least Min8Bit elements: a quarter of AdamW's state. The
// update itself runs in F32 from the dequantised moments; what the
// quantisation costs is measured beside F32 AdamW in the package's tests
// (a GPT's loss curve) and in docs/benchmarks.md.
func NewAdamW8bit(params []*tensor.Tensor, lr, weightDecay float64) *AdamW {
	o := NewAdamW(params, lr, weightDecay)
	o.codes, o.absmax = make([]*tensor.Tensor, len(params)), make([]*tensor.Tensor, len(params))
	if len(params) > 0 {
		o.qmap = tensor.FromFloat32(params[0].Device(), kernels.Quant8Maps, len(kernels.Quant8Maps)).Keep()
	}
	return o
}

// Is8Bit reports whether parameter i's moments are held in 8 bits.
func (o *AdamW) Is8Bit(i int) bool { return o.qmap != nil && o.params[i].Numel() >= Min8Bit }

// ensure gives the parameters idx their state, all or none
// (ensureStates): F32 moments, or 8-bit codes and scales.
func (o *AdamW) ensure(idx []int) {
	f32 := func(i int) bool { return !o.Is8Bit(i) }
	ensureStates(o.params, idx, stateList{o.m, f32, stateTensor}, stateList{o.v, f32, stateTensor},
		stateList{o.codes, o.Is8Bit, func(p *tensor.Tensor) *tensor.Tensor {
			return tensor.Zeros(p.Device(), tensor.U8, append(p.Shape(), 2)...).Keep()
		}},
		stateList{o.absmax, o.Is8Bit, func(p *tensor.Tensor) *tensor.Tensor {
			return tensor.Zeros(p.Device(), tensor.F32, kernels.Quant8Blocks(p.Numel()), 2).Keep()
		}})
}

// Step updates the parameters with gradients.
func (o *AdamW) Step() { o.StepUnless(kernels.Buf{}) }

// StepUnless counts the step and updates the parameters with gradients in
// one fused launch, unless skip is set when they run.
func (o *AdamW) StepUnless(skip kernels.Buf) { o.StepScaled(kernels.Buf{}, skip) }

// StepScaled is StepUnless with every gradient multiplied by mult (F32, 1
// element, read on the device; invalid: 1) as the update reads it.
func (o *AdamW) StepScaled(mult, skip kernels.Buf) {
	idx := withGrads(o.params)
	if len(idx) == 0 {
		return
	}
	o.ensure(idx)
	o.params[idx[0]].Backend().Increment(o.step.Buf(), 1, skip)
	o.update(idx, mult, skip)
}

// Begin counts a step of updates by StepParam (PerParameter).
func (o *AdamW) Begin() {
	if len(o.params) > 0 {
		o.params[0].Backend().Increment(o.step.Buf(), 1, kernels.Buf{})
	}
}

// StepParam updates parameter i from its gradient and releases the
// gradient (PerParameter).
func (o *AdamW) StepParam(i int) {
	if o.params[i].Grad() != nil {
		o.ensure([]int{i})
		o.update([]int{i}, kernels.Buf{}, kernels.Buf{})
		o.params[i].ZeroGrad()
	}
}

// hyper is the step's hyper-parameters, without weight decay.
func (o *AdamW) hyper(mult, skip kernels.Buf) kernels.AdamWParams {
	return kernels.AdamWParams{LR: o.buf.Buf(), Beta1: float32(o.Beta1), Beta2: float32(o.Beta2),
		Eps: float32(o.Eps), Step: o.step.Buf(), Skip: skip, GradScale: mult}
}

// stepMasters is StepScaled(mult) for an AdamW whose parameters are the
// F32 masters of 16-bit working weights (Note [working weights in 16
// bits]) on a backend that updates them in one pass (kernels.MasterAdamW):
// every parameter's gradient is grads[i], in the working dtype (the
// parameters' own gradients are not read), and its updated master is
// rounded into working[i]. It reports false, having done nothing, where
// the backend has no such pass or the moments are 8-bit.
func (o *AdamW) stepMasters(mult kernels.Buf, grads, working []kernels.Buf) bool {
	if len(o.params) == 0 {
		return true
	}
	be, ok := o.params[0].Backend().(kernels.MasterAdamW)
	if !ok || o.qmap != nil {
		return false
	}
	idx := make([]int, len(o.params))
	for i := range idx {
		idx[i] = i
	}
	o.ensure(idx)
	checkMasters(o.params, idx)
	o.params[0].Backend().Increment(o.step.Buf(), 1, kernels.Buf{})
	hp := o.hyper(mult, kernels.Buf{})
	var groups [2][5][]kernels.Buf // decayed or not: masters, gradients, moments, working weights
	for i, p := range o.params {
		g := &groups[boolIndex(decays(o.NoDecay, i))]
		for k, b := range []kernels.Buf{p.Buf(), grads[i], o.m[i].Buf(), o.v[i].Buf(), working[i]} {
			g[k] = append(g[k], b)
		}
	}
	for d, g := range groups {
		hp.WeightDecay = 0
		if d == 1 {
			hp.WeightDecay = float32(o.WeightDecay)
		}
		if len(g[0]) > 0 {
			be.AdamWMaster(hp, g[0], g[1], g[2], g[3], g[4])
		}
	}
	return true
}

// update updates the parameters idx, which have gradients and state, in
// the step the counter counts (StepScaled).
func (o *AdamW) update(idx []int, mult, skip kernels.Buf) {
	checkMasters(o.params, idx)
	be := o.params[idx[0]].Backend()
	hp := o.hyper(mult, skip)
	// One launch per group: decayed or not, F32 or 8-bit moments.
	var groups [2][2][4][]kernels.Buf
	for _, i := range idx {
		q8 := o.Is8Bit(i)
		g := &groups[boolIndex(decays(o.NoDecay, i))][boolIndex(q8)]
		g[0], g[1] = append(g[0], o.params[i].Buf()), append(g[1], o.params[i].Grad().Buf())
		if q8 {
			g[2], g[3] = append(g[2], o.codes[i].Buf()), append(g[3], o.absmax[i].Buf())
		} else {
			g[2], g[3] = append(g[2], o.m[i].Buf()), append(g[3], o.v[i].Buf())
		}
	}
	for d, byKind := range groups {
		hp.WeightDecay = 0
		if d == 1 {
			hp.WeightDecay = float32(o.WeightDecay)
		}
		for q8, g := range byKind {
			switch {
			case len(g[0]) == 0:
			case q8 == 1:
				be.AdamW8(hp, o.qmap.Buf(), g[0], g[1], g[2], g[3])
			default:
				be.AdamW(hp, g[0], g[1], g[2], g[3])
			}
		}
	}
}

// ZeroGrad releases the gradients.
func (o *AdamW) ZeroGrad() { zeroGrad(o.params) }

// Params are the parameters.
func (o *AdamW) Params() []*tensor.Tensor { return o.params }

// State lists the moment estimates: exp_avg and exp_avg_sq (F32), or for
// 8-bit moments codes8 (U8) and absmax8 (F32), each followed by "." and
// the parameter's index.
func (o *AdamW) State() map[string]*tensor.Tensor {
	s := map[string]*tensor.Tensor{}
	for i := range o.params {
		if o.m[i] != nil {
			s[fmt.Sprintf("exp_avg.%d", i)] = o.m[i]
			s[fmt.Sprintf("exp_avg_sq.%d", i)] = o.v[i]
		}
		if o.codes != nil && o.codes[i] != nil {
			s[fmt.Sprintf("codes8.%d", i)] = o.codes[i]
			s[fmt.Sprintf("absmax8.%d", i)] = o.absmax[i]
		}
	}
	return s
}

// Counters lists the learning rate and the step count (read from the device).
func (o *AdamW) Counters() map[string]float64 {
	c := map[string]float64{"lr": o.lr}
	if o.step != nil {
		c["step"] = float64(o.step.Read())
	}
	return c
}

// LoadState restores moments, the step count and the learning rate.
// Checkpoints with a step count per parameter ("step.<i>", from before the
// count moved to the device) load with the largest. Moments held in 8 bits
// load only into an AdamW that holds that parameter's in 8 bits, and F32
// ones only into one that holds them in F32.
func (o *AdamW) LoadState(ts map[string]*tensor.Tensor, c map[string]float64) error {
	if lr, ok := c["lr"]; ok {
		o.SetLR(lr)
	}
	step, ok := c["step"]
	for i := range o.params {
		pair, other := [2]string{"exp_avg", "exp_avg_sq"}, [2]string{"codes8", "absmax8"}
		if o.Is8Bit(i) {
			pair, other = other, pair
		}
		a, oka := ts[fmt.Sprintf("%s.%d", pair[0], i)]
		b, okb := ts[fmt.Sprintf("%s.%d", pair[1], i)]
		if okb != oka {
			return fmt.Errorf("optimizer state of parameter %d has %s but not %s", i, pair[boolIndex(okb)], pair[boolIndex(oka)])
		}
		if _, found := ts[fmt.Sprintf("%s.%d", other[0], i)]; found {
			want := "F32 (adamw)"
			if o.Is8Bit(i) {
				want = "8 bits (adamw8bit)"
			}
			return fmt.Errorf("optimizer state of parameter %d is %s; this optimizer holds its moments in %s", i, other[0], want)
		}
		if !oka {
			continue
		}
		p := o.params[i]
		if o.Is8Bit(i) {
			if err := loadAs(&o.codes[i], p.Device(), a, tensor.U8, append(p.Shape(), 2), fmt.Sprintf("codes8.%d", i)); err != nil {
				return err
			}
			if err := loadAs(&o.absmax[i], p.Device(), b, tensor.F32, []int{kernels.Quant8Blocks(p.Numel()), 2}, fmt.Sprintf("absmax8.%d", i)); err != nil {
				return err
			}
		} else {
			if err := copyState(&o.m[i], p, a, fmt.Sprintf("exp_avg.%d", i)); err != nil {
				return err
			}
			if err := copyState(&o.v[i], p, b, fmt.Sprintf("exp_avg_sq.%d", i)); err != nil {
				return err
			}
		}
		if !ok {
			step = max(step, c[fmt.Sprintf("step.%d", i)])
		}
	}
	if o.step != nil {
		o.step.Write(int64(step))
	}
	return nil
}

// CheckState says, for a state tensor src named name that a checkpoint
// gives an optimizer, whether it is of dtype and shape: an error naming
// what it is and what was wanted if not.
func CheckState(name string, src *tensor.Tensor, dtype tensor.DType, shape []int) error {
	if src.DType() != dtype || !slices.Equal(src.Shape(), shape) {
		return fmt.Errorf("optimizer state %s is %v %v, want %v %v", name, src.DType(), src.Shape(), dtype, shape)
	}
	return nil
}

// loadAs copies src into *dst (made on dev if nil), checking it is of
// dtype and shape.
func loadAs(dst **tensor.Tensor, dev *tensor.Device, src *tensor.Tensor, dtype tensor.DType, shape []int, name string) error {
	if err := CheckState(name, src, dtype, shape); err != nil {
		return err
	}
	if *dst == nil {
		*dst = tensor.Empty(dev, dtype, shape...).Keep()
	}
	(*dst).Backend().Write((*dst).Buf(), src.Raw())
	return nil
}

// releaseState releases the state tensors of the parameters idx in lists.
func releaseState(idx []int, lists ...[]*tensor.Tensor) {
	for _, i := range idx {
		for _, l := range lists {
			if l[i] != nil {
				l[i].Release()
				l[i] = nil
			}
		}
	}
}

// Release releases the optimiser's state tensors.
func (o *AdamW) Release() {
	all := make([]int, len(o.params))
	for i := range all {
		all[i] = i
	}
	releaseState(all, o.m, o.v)
	if o.qmap != nil {
		releaseState(all, o.codes, o.absmax)
		o.qmap.Release()
		o.qmap = nil
	}
	if o.step != nil {
		o.step.Release()
		o.step = nil
	}
	o.release()
}

// ClipGradNorm scales the gradients of params, in place on the device, so
// that their L2 norm taken together is at most maxNorm, and writes the norm
// before clipping into norm (F32, 1 element), as
// torch.nn.utils.clip_grad_norm_: no device read, so a captured step clips.
// Parameters without a gradient are left out.
func ClipGradNorm(params []*tensor.Tensor, maxNorm float64, norm *tensor.Tensor) {
	if err := ClipShardedGradNorm(params, maxNorm, norm, nil); err != nil {
		panic(err) // no sum, no error
	}
}

// ClipShardedGradNorm is ClipGradNorm where params hold one shard of the
// gradients each (a data-parallel job that shards its optimiser): sum
// replaces the shard's sum of squares (F32, 1 element, on the device) by
// its sum over the shards, an all-reduce queued on the device, before the
// norm is taken from it. Its error is returned; a nil sum is one shard.
func ClipShardedGradNorm(params []*tensor.Tensor, maxNorm float64, norm *tensor.Tensor, sum func(sumsq *tensor.Tensor) error) error {
	var grads []kernels.Buf
	for _, p := range params {
		if g := p.Grad(); g != nil {
			grads = append(grads, g.Buf())
		}
	}
	sumsq := tensor.Empty(norm.Device(), tensor.F32, 1)
	defer sumsq.Release()
	be := norm.Backend()
	be.SumSquares(grads, sumsq.Buf())
	if sum != nil {
		if err := sum(sumsq); err != nil {
			return err
		}
	}
	be.ClipGradNorm(grads, float32(maxNorm), sumsq.Buf(), norm.Buf())
	return nil
}
