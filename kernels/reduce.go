package kernels

import "fmt"

// ReduceOps reduce along one axis.
type ReduceOps interface {
	// Reduce reduces x along the middle axis of r into dst (r.Outer·r.Inner elements).
	Reduce(op ReduceOp, dst, x Buf, r Reduction)

	// ReduceMaxBackward routes dy to the elements of x equal to their maximum y.
	ReduceMaxBackward(dx, dy, x, y Buf, r Reduction)

	// ArgMax writes, as I32, the index along the middle axis of each maximum (the first on ties).
	ArgMax(dst, x Buf, r Reduction)
}

// ReduceOp is a reduction along one axis.
type ReduceOp uint8

// The reductions.
const (
	Sum ReduceOp = iota + 1
	Mean
	Max
)

// Reductions lists the reductions.
func Reductions() []ReduceOp { return []ReduceOp{Sum, Mean, Max} }

func (op ReduceOp) String() string {
	switch op {
	case Sum:
		return "sum"
	case Mean:
		return "mean"
	case Max:
		return "max"
	}
	return fmt.Sprintf("reduce(%d)", op)
}

// Reduction describes x as an (Outer, Len, Inner) array reduced along its
// middle axis to an (Outer, Inner) result.
type Reduction struct{ Outer, Len, Inner int }

// CheckReduction checks x (Outer·Len·Inner) and dst (Outer·Inner) against r.
func CheckReduction(op string, r Reduction, x, dst Buf) {
	if r.Outer <= 0 || r.Len <= 0 || r.Inner <= 0 {
		panic(fmt.Sprintf("kernels: %s: invalid reduction %+v", op, r))
	}
	CheckLen(op+" input", r.Outer*r.Len*r.Inner, x)
	CheckLen(op+" output", r.Outer*r.Inner, dst)
}

func (o *Observed) Reduce(op ReduceOp, dst, x Buf, r Reduction) {
	defer o.op("Reduce", "Reduce "+op.String(), x)()
	o.B.Reduce(op, dst, x, r)
}

func (o *Observed) ReduceMaxBackward(dx, dy, x, y Buf, r Reduction) {
	defer o.op("ReduceMaxBackward", "ReduceMaxBackward", dy)()
	o.B.ReduceMaxBackward(dx, dy, x, y, r)
}

func (o *Observed) ArgMax(dst, x Buf, r Reduction) {
	defer o.op("ArgMax", "ArgMax", x)()
	o.B.ArgMax(dst, x, r)
}
