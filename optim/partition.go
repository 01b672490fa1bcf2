package optim

import (
	"fmt"

	"github.com/leangrad/leangrad/tensor"
)

// Partition returns an optimiser of opt's kind, with its hyper-parameters
// and learning rate, over parts, where parts[k] is a piece (a view of some
// elements) of opt's parameter of[k]: each piece is weight-decayed as its
// parameter is. It is what one rank of a data-parallel job that shards the
// optimiser's state updates (dist.ShardedOptimizer). The new optimiser's
// state starts empty; opt must have none yet. It fails for an optimiser
// it does not know.
func Partition(opt Optimizer, parts []*tensor.Tensor, of []int) (Optimizer, error) {
	if len(parts) != len(of) {
		panic(fmt.Sprintf("optim: %d parts of %d parameters", len(parts), len(of)))
	}
	if len(opt.State()) > 0 {
		return nil, fmt.Errorf("optim: partitioning an optimizer that has taken steps (its state would be lost)")
	}
	n := len(opt.Params())
	for k, i := range of {
		if i < 0 || i >= n {
			panic(fmt.Sprintf("optim: part %d is of parameter %d of %d", k, i, n))
		}
	}
	noDecay := func(nd []bool) []bool {
		if nd == nil {
			return nil
		}
		out := make([]bool, len(of))
		for k, i := range of {
			out[k] = nd[i]
		}
		return out
	}
	switch o := opt.(type) {
	case *SGD:
		p := NewSGD(parts, o.LR(), o.Momentum, o.WeightDecay, o.Nesterov)
		p.Dampening, p.NoDecay = o.Dampening, noDecay(o.NoDecay)
		return p, nil
	case *AdamW:
		if o.qmap != nil {
			return nil, errNot8Bit
		}
		p := NewAdamW(parts, o.LR(), o.WeightDecay)
		p.Beta1, p.Beta2, p.Eps, p.NoDecay = o.Beta1, o.Beta2, o.Eps, noDecay(o.NoDecay)
		return p, nil
	}
	return nil, fmt.Errorf("optim: cannot partition a %T (SGD and AdamW only)", opt)
}

// errNot8Bit is why an AdamW with 8-bit moments is neither partitioned
// (sharded, offloaded) nor told apart by StateKinds: its blocks of codes
// belong to whole parameters on the device.
var errNot8Bit = fmt.Errorf("optim: AdamW's 8-bit moments stay whole on the device: they are not sharded over ranks or offloaded to the host (use adamw)")

// StateKinds are the kinds of tensor opt's State lists (the names before
// the "."), whether or not a step has made them yet: exp_avg and
// exp_avg_sq for AdamW, momentum for SGD with momentum.
func StateKinds(opt Optimizer) ([]string, error) {
	switch o := opt.(type) {
	case *SGD:
		if o.Momentum == 0 {
			return nil, nil
		}
		return []string{"momentum"}, nil
	case *AdamW:
		if o.qmap != nil {
			return nil, errNot8Bit
		}
		return []string{"exp_avg", "exp_avg_sq"}, nil
	}
	return nil, fmt.Errorf("optim: the state of a %T is unknown (SGD and AdamW only)", opt)
}
