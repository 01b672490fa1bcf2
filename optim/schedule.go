package optim

import "math"

// Schedule gives the learning rate of each step (counted from 0).
type Schedule interface {
	LR(step int) float64
}

// Constant is a fixed learning rate.
type Constant float64

// LR returns the rate.
func (c Constant) LR(int) float64 { return float64(c) }

// CosineWarmup rises linearly from 0 to Base over Warmup steps, then
// follows a half cosine down to Min at Total steps.
type CosineWarmup struct {
	Base, Min     float64
	Warmup, Total int
}

// LR returns the rate at step.
func (c CosineWarmup) LR(step int) float64 {
	if step < c.Warmup {
		return c.Base * float64(step+1) / float64(c.Warmup)
	}
	if step >= c.Total {
		return c.Min
	}
	p := float64(step-c.Warmup) / float64(max(1, c.Total-c.Warmup))
	return c.Min + (c.Base-c.Min)*0.5*(1+math.Cos(math.Pi*p))
}

// OneCycle is torch.optim.lr_scheduler.OneCycleLR with cosine annealing: from
// Max/DivFactor up to Max over the first PctStart of Total steps, then down
// to Max/(DivFactor·FinalDivFactor).
type OneCycle struct {
	Max                                 float64
	Total                               int
	PctStart, DivFactor, FinalDivFactor float64
}

// NewOneCycle returns OneCycle with PyTorch's defaults (30% rising, divisors 25 and 1e4).
func NewOneCycle(maxLR float64, total int) OneCycle {
	return OneCycle{Max: maxLR, Total: total, PctStart: 0.3, DivFactor: 25, FinalDivFactor: 1e4}
}

// LR returns the rate at step.
func (o OneCycle) LR(step int) float64 {
	initial := o.Max / o.DivFactor
	final := initial / o.FinalDivFactor
	up := o.PctStart*float64(o.Total) - 1
	anneal := func(from, to, p float64) float64 { return to + (from-to)/2*(1+math.Cos(math.Pi*p)) }
	s := float64(min(step, o.Total-1))
	if s <= up {
		return anneal(initial, o.Max, s/up)
	}
	return anneal(o.Max, final, (s-up)/(float64(o.Total-1)-up))
}
