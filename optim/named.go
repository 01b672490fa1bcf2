package optim

import (
	"fmt"
	"slices"
	"strings"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// The optimisers and schedules by name, as configurations and the
// commands give them: the one list of what each name means.

// Hyper are the hyper-parameters an optimiser is made with by name.
// NoDecay, if set, exempts the parameters it marks from the weight decay
// (one entry a parameter).
type Hyper struct {
	LR, Momentum, WeightDecay float64
	Beta2                     float64 // AdamW's (0: its default)
	NoDecay                   []bool
}

var optimizers = []struct {
	name string
	make func(params []*tensor.Tensor, h Hyper) Optimizer
}{
	// SGD, with Nesterov momentum when there is momentum.
	{"sgd", func(ps []*tensor.Tensor, h Hyper) Optimizer {
		o := NewSGD(ps, h.LR, h.Momentum, h.WeightDecay, h.Momentum > 0)
		o.NoDecay = h.NoDecay
		return o
	}},
	{"adamw", adamW(NewAdamW)},
	// AdamW with its larger parameters' moments in 8 bits a value.
	{"adamw8bit", adamW(NewAdamW8bit)},
}

// adamW makes an AdamW by newAdamW with the hyper-parameters h.
func adamW(newAdamW func(params []*tensor.Tensor, lr, weightDecay float64) *AdamW) func([]*tensor.Tensor, Hyper) Optimizer {
	return func(ps []*tensor.Tensor, h Hyper) Optimizer {
		o := newAdamW(ps, h.LR, h.WeightDecay)
		if h.Beta2 > 0 {
			o.Beta2 = h.Beta2
		}
		o.NoDecay = h.NoDecay
		return o
	}
}

var schedules = []struct {
	name string
	make func(lr float64, warmup, total int) Schedule
}{
	// Cosine decay to 0 after a linear warmup.
	{"cosine", func(lr float64, warmup, total int) Schedule {
		return CosineWarmup{Base: lr, Min: 0, Warmup: warmup, Total: total}
	}},
	{"onecycle", func(lr float64, _, total int) Schedule { return NewOneCycle(lr, total) }},
	{"constant", func(lr float64, _, _ int) Schedule { return Constant(lr) }},
}

// OptimizerNames and ScheduleNames list the names, for flags' help.
var OptimizerNames, ScheduleNames []string

func init() {
	for _, o := range optimizers {
		OptimizerNames = append(OptimizerNames, o.name)
	}
	for _, s := range schedules {
		ScheduleNames = append(ScheduleNames, s.name)
	}
}

// or is "a, b or c".
func or(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// CheckOptimizer says whether name is an optimiser's.
func CheckOptimizer(name string) error {
	if !slices.Contains(OptimizerNames, name) {
		return fmt.Errorf("optimizer %q: want %s", name, or(OptimizerNames))
	}
	return nil
}

// CheckSchedule says whether name is a schedule's.
func CheckSchedule(name string) error {
	if !slices.Contains(ScheduleNames, name) {
		return fmt.Errorf("schedule %q: want %s", name, or(ScheduleNames))
	}
	return nil
}

// NewNamed returns the optimiser name over params: "sgd" (with Nesterov
// momentum when h.Momentum > 0), "adamw" or "adamw8bit" (NewAdamW8bit).
func NewNamed(name string, params []*tensor.Tensor, h Hyper) (Optimizer, error) {
	if h.NoDecay != nil && len(h.NoDecay) != len(params) {
		panic(fmt.Sprintf("optim: %d NoDecay entries for %d parameters", len(h.NoDecay), len(params)))
	}
	for _, o := range optimizers {
		if o.name == name {
			return o.make(params, h), nil
		}
	}
	return nil, CheckOptimizer(name)
}

// StateBytes is about the bytes of state the optimiser name keeps for n
// F32 parameters: SGD's momentum 4 a parameter, AdamW's moments 8, and
// adamw8bit's codes 2 and scales 8 a block of kernels.Quant8Block (its
// parameters under Min8Bit elements, a few biases and gains, keep 8).
func StateBytes(name string, n int64) int64 {
	switch name {
	case "sgd":
		return 4 * n
	case "adamw8bit":
		return 2*n + 8*int64(kernels.Quant8Blocks(int(n)))
	}
	return 8 * n
}

// TrainingBytes is what n F32 parameters take with their gradients and
// the optimiser name's state (StateBytes): what the device holds for them
// when nothing is offloaded, and what an offloaded optimiser keeps in
// host memory.
func TrainingBytes(name string, n int64) int64 { return 8*n + StateBytes(name, n) }

// NewNamedSchedule returns the schedule name at peak rate lr over total
// steps: "cosine" (warmup steps rising linearly, then a half cosine to 0),
// "onecycle" or "constant".
func NewNamedSchedule(name string, lr float64, warmup, total int) (Schedule, error) {
	for _, s := range schedules {
		if s.name == name {
			return s.make(lr, warmup, total), nil
		}
	}
	return nil, CheckSchedule(name)
}

// OptimizerName is an optimiser's name (OptimizerNames). It is a
// flag.Value: Set refuses any other.
type OptimizerName string

// Set checks s with CheckOptimizer.
func (n *OptimizerName) Set(s string) error {
	if err := CheckOptimizer(s); err != nil {
		return err
	}
	*n = OptimizerName(s)
	return nil
}

func (n OptimizerName) String() string { return string(n) }

// ScheduleName is a schedule's name (ScheduleNames). It is a flag.Value:
// Set refuses any other.
type ScheduleName string

// Set checks s with CheckSchedule.
func (n *ScheduleName) Set(s string) error {
	if err := CheckSchedule(s); err != nil {
		return err
	}
	*n = ScheduleName(s)
	return nil
}

func (n ScheduleName) String() string { return string(n) }

// Choices is "a, b or c" of names, for flags' help.
func Choices(names []string) string { return or(names) }
