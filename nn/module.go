// Package nn holds neural-network modules built on autograd: layers
// (Linear, Conv2d, BatchNorm2d, pooling, ReLU, Dropout, Flatten), containers
// (Sequential), the ResNet family, an MLP, a GPT (with generation from a
// key-value cache), losses, initialisation, and weights I/O in the
// safetensors format (and in Hugging Face GPT-2's layout).
//
// A module's Forward takes a tensor it does not own and returns a new one
// the caller owns; containers release the intermediates they create as soon
// as the next layer has consumed them, so that only what autograd saved for
// the backward stays alive. Parameters are created outside any scope: they
// live until Release(m).
package nn

import (
	"fmt"
	"sort"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/tensor"
)

// T is shorthand for *tensor.Tensor in this package's signatures.
type T = tensor.Tensor

// Named is one tensor of a module's state.
type Named struct {
	Name  string
	T     *tensor.Tensor
	Param bool // trainable; false for buffers such as batch norm's running statistics
	// NoDecay exempts a parameter from weight decay (a transformer's biases
	// and layer norms; see NoDecay).
	NoDecay bool
}

// NoDecay lists, for each of m's parameters in Parameters' order, whether
// it is exempt from weight decay, or nil when none is: the optimiser's
// parameter groups (optim.Hyper.NoDecay).
func NoDecay(m Module) []bool {
	var out []bool
	some := false
	for _, n := range m.State("") {
		if n.Param {
			out = append(out, n.NoDecay)
			some = some || n.NoDecay
		}
	}
	if !some {
		return nil
	}
	return out
}

// Module is a layer or a network.
type Module interface {
	// Forward computes the module's output for x, which it does not take over.
	Forward(x *T) *T
	// State lists the module's parameters and buffers, named with prefix.
	State(prefix string) []Named
	// SetTraining switches training behaviour (batch statistics, dropout) on or off.
	SetTraining(on bool)
}

// Model is a network with its objective: what train.Step trains. Loss
// returns, for a batch x with targets y, the mean loss over the batch's
// predictions (F32 [1], recorded for Backward), how many of them were
// right (F32 [1], not recorded) and how many there are, reading nothing
// back from the device. Classifiers' Loss is Classify.
type Model interface {
	Module
	Loss(x, y *T) (loss, right *T, n int)
}

// Classify is the objective of a classifier m: the cross-entropy of its
// logits for x against the I32 labels y (one per example), and its right
// predictions (each row's first maximum at its label).
func Classify(m Module, x, y *T) (loss, right *T, n int) {
	logits := m.Forward(x)
	defer logits.Release()
	return ag.CrossEntropy(logits, y), ag.CountCorrect(logits, y), logits.Dim(0)
}

// Parameters returns m's trainable tensors, in State order.
func Parameters(m Module) []*T {
	var ps []*T
	for _, n := range m.State("") {
		if n.Param {
			ps = append(ps, n.T)
		}
	}
	return ps
}

// ZeroGrad releases the gradients of m's parameters.
func ZeroGrad(m Module) {
	for _, p := range Parameters(m) {
		p.ZeroGrad()
	}
}

// Release releases every tensor of m's state (and their gradients) and
// what else the module holds.
func Release(m Module) {
	for _, n := range m.State("") {
		n.T.Release()
	}
	if o, ok := m.(owner); ok {
		o.releaseOwned()
	}
}

// owner is a module that holds tensors besides its state (GPT's position
// table), which Release frees too.
type owner interface{ releaseOwned() }

// CountParams is the number of trainable scalars in m.
func CountParams(m Module) int {
	n := 0
	for _, p := range Parameters(m) {
		n += p.Numel()
	}
	return n
}

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// newParam makes a trainable leaf outside any scope.
func newParam(t *T) *T { return t.Keep().SetRequiresGrad(true) }

// Sequential runs modules one after another, releasing each intermediate
// as soon as the next module has used it.
type Sequential struct {
	Layers []Module
}

// NewSequential returns a Sequential of layers.
func NewSequential(layers ...Module) *Sequential { return &Sequential{Layers: layers} }

// Forward runs the layers in order.
func (s *Sequential) Forward(x *T) *T { return forwardAll(s.Layers, x) }

// Loss is Classify: the layers end in logits.
func (s *Sequential) Loss(x, y *T) (loss, right *T, n int) { return Classify(s, x, y) }

// forwardAll runs layers in order, releasing each intermediate as soon as
// the next layer has used it; x stays the caller's, and the result is always
// a new reference.
func forwardAll(layers []Module, x *T) *T {
	h := x
	for _, l := range layers {
		next := l.Forward(h)
		if h != x {
			h.Release()
		}
		h = next
	}
	if h == x {
		return x.View(x.Shape()...)
	}
	return h
}

// State lists the layers' state, prefixed with their index.
func (s *Sequential) State(prefix string) []Named {
	var out []Named
	for i, l := range s.Layers {
		out = append(out, l.State(join(prefix, fmt.Sprint(i)))...)
	}
	return out
}

// SetTraining sets every layer's mode.
func (s *Sequential) SetTraining(on bool) {
	for _, l := range s.Layers {
		l.SetTraining(on)
	}
}

// stateMap indexes a state list by name, rejecting duplicates (a programmer error).
func stateMap(state []Named) map[string]Named {
	m := make(map[string]Named, len(state))
	for _, n := range state {
		if _, dup := m[n.Name]; dup {
			panic(fmt.Sprintf("nn: two state tensors named %q", n.Name))
		}
		m[n.Name] = n
	}
	return m
}

func sortedNames(m map[string]Named) []string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}
