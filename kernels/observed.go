package kernels

import "github.com/leangrad/leangrad/memory"

// Observed is a Backend that runs every operation on B and calls Hook
// around it. The benchmark harness times a synchronous backend's
// operations through it (the CPU profile), and the conformance suite finds
// through it which methods its cases run. Each family's wrappers stand
// beside the family's interface (kernels/X.go). Observed does not embed
// Backend: an operation added without its wrapper does not compile, rather
// than pass by unobserved.
type Observed struct {
	B Backend
	// Hook, when not nil, is called as each operation starts with the
	// Backend method that runs it ("GemmEpilogue"), what it is, as a
	// profile names it ("GemmEpilogue bias+gelu", "gelu backward"), and
	// the dtype of its principal operand; the function it returns, if not
	// nil, is called when the operation returns.
	Hook func(method, op string, dt DType) func()
}

var _ Backend = (*Observed)(nil)

// The methods that run no operation pass straight through.

func (o *Observed) Name() string                 { return o.B.Name() }
func (o *Observed) Info() Info                   { return o.B.Info() }
func (o *Observed) Allocator() *memory.Allocator { return o.B.Allocator() }
func (o *Observed) Stream() memory.Stream        { return o.B.Stream() }
func (o *Observed) Synchronize() error           { return o.B.Synchronize() }

// op calls the hook for an operation on operands of b's dtype and returns
// what ends it.
func (o *Observed) op(method, op string, b Buf) func() {
	if o.Hook == nil {
		return func() {}
	}
	if done := o.Hook(method, op, b.DType); done != nil {
		return done
	}
	return func() {}
}

// first is the first of bufs, or none.
func first(bufs []Buf) Buf {
	if len(bufs) == 0 {
		return Buf{}
	}
	return bufs[0]
}
