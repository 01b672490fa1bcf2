package autograd

import (
	"fmt"
	"slices"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

func emptyLike(x *T) *T { return tensor.Empty(x.Device(), x.DType(), x.Shape()...) }

func sameDevice(op string, a, b *T) {
	required(op, a, b)
	if !a.Device().Same(b.Device()) {
		if a.Device().Name() == b.Device().Name() {
			panic(fmt.Sprintf("autograd: %s of tensors on two different %s devices (each tensor.NewDevice makes another; make both on one)", op, a.Device()))
		}
		panic(fmt.Sprintf("autograd: %s of tensors on %s and %s", op, a.Device(), b.Device()))
	}
}

// required panics, naming op and the operand, when a tensor an operation
// needs is nil (a programmer error, named rather than a nil dereference).
func required(op string, xs ...*T) {
	for i, x := range xs {
		if x == nil {
			panic(fmt.Sprintf("autograd: %s: operand %d of %d is nil", op, i+1, len(xs)))
		}
	}
}

// promote is the dtype of a binary result: F32 if either input is F32.
func promote(a, b tensor.DType) tensor.DType {
	if a == b {
		return a
	}
	return tensor.F32
}

// castRaw returns x converted to dt, recording nothing.
func castRaw(x *T, dt tensor.DType) *T { return castRawOn(x.Device(), x, dt) }

// castRawOn is castRaw making the copy on the handle dev.
func castRawOn(dev *tensor.Device, x *T, dt tensor.DType) *T {
	y := tensor.Empty(dev, dt, x.Shape()...)
	x.Backend().Cast(y.Buf(), x.Buf())
	return y
}

// asDType returns x if it has dtype dt (a new handle on dev, in dev's
// current scope), the copy of x CastParameters made in dt (a new handle,
// recording nothing: the caller computes x's gradient itself), or a
// converted copy made on dev. dev is the handle of the operation (ModeOf):
// a parameter made on the device and used by a session's operation must
// not leave its temporary in the device's scope, which another goroutine
// closes.
func asDType(dev *tensor.Device, x *T, dt tensor.DType) *T {
	if x.DType() == dt {
		return x.On(dev)
	}
	if copies, _ := dev.Modes().Copies.(map[*T]*T); copies != nil {
		if y := copies[x]; y != nil && y.DType() == dt {
			return y.On(dev) // a handle of its own: no graph
		}
	}
	return castRawOn(dev, x, dt)
}

// binaryRaw computes a op b with broadcasting, recording nothing.
func binaryRaw(op kernels.BinaryOp, a, b *T) *T {
	y := binaryResult(op, a, b)
	binaryInto(op, y, a, b)
	return y
}

// binaryResult is the (unwritten) result of op on a and b: their broadcast
// shape, in their promoted dtype.
func binaryResult(op kernels.BinaryOp, a, b *T) *T {
	sameDevice(op.String(), a, b)
	shape, err := kernels.BroadcastShape(a.Shape(), b.Shape())
	if err != nil {
		panic(fmt.Sprintf("autograd: %s: %v", op, err))
	}
	return tensor.Empty(ModeOf(a, b), promote(a.DType(), b.DType()), shape...)
}

// binaryInto writes op(a, b) to y, binaryResult's tensor.
func binaryInto(op kernels.BinaryOp, y, a, b *T) {
	// With one operand of the result's dtype (F32) the backend reads the
	// other as it is (kernels.Backend.Binary); two other dtypes are cast.
	dt, dev := y.DType(), y.Device()
	ac, bc := a, b
	if a.DType() != dt && b.DType() != dt {
		ac, bc = castRawOn(dev, a, dt), castRawOn(dev, b, dt)
		defer ac.Release()
		defer bc.Release()
	}
	a.Backend().Binary(op, y.Buf(), ac.Buf(), bc.Buf(), kernels.NewBroadcast(y.Shape(), a.Shape(), b.Shape()))
}

// sumTo sums g over the dimensions along which a tensor of shape was
// broadcast to g's shape, returning a tensor of shape (a new handle, in the
// current scope).
func sumTo(g *T, shape []int) *T {
	gs := g.Shape()
	if slices.Equal(gs, shape) {
		return g.View(gs...)
	}
	n := len(gs)
	target := make([]int, n)
	for i := range target {
		target[i] = 1
		if k := i - (n - len(shape)); k >= 0 {
			target[i] = shape[k]
		}
	}
	// Groups of adjacent reduced dimensions, reduced innermost first so the
	// positions of the outer ones do not move.
	type group struct{ lo, hi int }
	var groups []group
	for i := 0; i < n; i++ {
		if target[i] == 1 && gs[i] != 1 {
			if len(groups) > 0 && groups[len(groups)-1].hi == i {
				groups[len(groups)-1].hi = i + 1
			} else {
				groups = append(groups, group{i, i + 1})
			}
		} else if target[i] != gs[i] {
			panic(fmt.Sprintf("autograd: gradient of shape %v cannot be summed to shape %v", gs, shape))
		}
	}
	cur := g.View(gs...)
	curShape := slices.Clone(gs)
	for k := len(groups) - 1; k >= 0; k-- {
		gr := groups[k]
		r := kernels.Reduction{Outer: prod(curShape[:gr.lo]), Len: prod(curShape[gr.lo:gr.hi]), Inner: prod(curShape[gr.hi:])}
		curShape = slices.Delete(curShape, gr.lo, gr.hi)
		next := tensor.Empty(g.Device(), g.DType(), curShape...)
		g.Backend().Reduce(kernels.Sum, next.Buf(), cur.Buf(), r)
		cur.Release()
		cur = next
	}
	out := cur.View(shape...)
	cur.Release()
	return out
}

func prod(s []int) int {
	p := 1
	for _, d := range s {
		p *= d
	}
	return p
}

// Add returns a + b, broadcasting NumPy style.
func Add(a, b *T) *T { return binary(kernels.Add, a, b) }

// Sub returns a − b, broadcasting.
func Sub(a, b *T) *T { return binary(kernels.Sub, a, b) }

// Mul returns a·b elementwise, broadcasting.
func Mul(a, b *T) *T { return binary(kernels.Mul, a, b) }

// Div returns a/b elementwise, broadcasting.
func Div(a, b *T) *T { return binary(kernels.Div, a, b) }

func binary(op kernels.BinaryOp, a, b *T) *T {
	y := binaryResult(op, a, b)
	rec := begin(op.String(), a, b)
	if linear := op == kernels.Add || op == kernels.Sub; !linear || !rec.leavesUnwritten() { // a sum's backward reads neither term
		binaryInto(op, y, a, b)
	}
	if rec == nil {
		return y
	}
	aShape, bShape := a.Shape(), b.Shape()
	aType, bType := a.DType(), b.DType()
	var as, bs *T // saved only where a gradient needs them
	switch op {
	case kernels.Mul:
		if rec.needs(0) {
			bs = rec.save(b)
		}
		if rec.needs(1) {
			as = rec.save(a)
		}
	case kernels.Div:
		bs = rec.save(b)
		if rec.needs(1) {
			as = rec.save(a)
		}
	}
	// reduce brings a gradient of y's shape back to an input's shape and dtype.
	reduce := func(g *T, shape []int, dt tensor.DType) *T {
		s := sumTo(g, shape)
		defer s.Release()
		return asDType(s.Device(), s, dt)
	}
	rec.finish(y, func(g *T) []*T {
		grads := make([]*T, 2)
		switch op {
		case kernels.Add, kernels.Sub:
			if rec.needs(0) {
				grads[0] = reduce(g, aShape, aType)
			}
			if rec.needs(1) {
				gb := g
				if op == kernels.Sub {
					gb = affineRaw(g, -1, 0)
					defer gb.Release()
				}
				grads[1] = reduce(gb, bShape, bType)
			}
		case kernels.Mul:
			if rec.needs(0) && rec.isSeed(g) && slices.Equal(bs.Shape(), aShape) && bs.DType() == aType {
				grads[0] = bs.View(aShape...) // 1·b: b itself (a loss times a GradScaler's scale)
			} else if rec.needs(0) {
				t := binaryRaw(kernels.Mul, g, bs)
				grads[0] = reduce(t, aShape, aType)
				t.Release()
			}
			if rec.needs(1) {
				t := binaryRaw(kernels.Mul, g, as)
				grads[1] = reduce(t, bShape, bType)
				t.Release()
			}
		case kernels.Div:
			gOverB := binaryRaw(kernels.Div, g, bs)
			defer gOverB.Release()
			if rec.needs(0) {
				grads[0] = reduce(gOverB, aShape, aType)
			}
			if rec.needs(1) {
				// d(a/b)/db = −a/b² : −(g/b)·(a/b)
				t := binaryRaw(kernels.Mul, gOverB, as)
				u := binaryRaw(kernels.Div, t, bs)
				t.Release()
				v := affineRaw(u, -1, 0)
				u.Release()
				grads[1] = reduce(v, bShape, bType)
				v.Release()
			}
		}
		return grads
	})
	return y
}

func affineRaw(x *T, alpha, beta float32) *T {
	y := emptyLike(x)
	x.Backend().Affine(y.Buf(), x.Buf(), alpha, beta)
	return y
}

// Affine returns alpha·x + beta elementwise (Scale and AddScalar in one).
func Affine(x *T, alpha, beta float32) *T {
	y := affineRaw(x, alpha, beta)
	if rec := begin("affine", x); rec != nil {
		rec.finish(y, func(g *T) []*T { return []*T{affineRaw(g, alpha, 0)} })
	}
	return y
}

// Scale returns alpha·x.
func Scale(x *T, alpha float32) *T { return Affine(x, alpha, 0) }

// Unary returns op(x) elementwise (kernels.UnaryOps lists the ops), saving
// for the backward the one of x and op(x) that op's derivative reads.
func Unary(op kernels.UnaryOp, x *T) *T { return unary(op, x) }

func unary(op kernels.UnaryOp, x *T) *T {
	required(op.String(), x)
	y := emptyLike(x)
	x.Backend().Unary(op, y.Buf(), x.Buf())
	if rec := begin(op.String(), x); rec != nil {
		var xs, ys *T
		switch op.Def().Uses {
		case kernels.UsesInput:
			xs = rec.save(x)
		case kernels.UsesOutput:
			ys = rec.save(y)
		}
		rec.finish(y, func(g *T) []*T {
			dx := emptyLike(g)
			var xb, yb kernels.Buf
			if xs != nil {
				xb = xs.Buf()
			}
			if ys != nil {
				yb = ys.Buf()
			}
			g.Backend().UnaryBackward(op, dx.Buf(), g.Buf(), xb, yb)
			return []*T{dx}
		})
	}
	return y
}

// Neg returns −x.
func Neg(x *T) *T { return unary(kernels.Neg, x) }

// Exp returns eˣ.
func Exp(x *T) *T { return unary(kernels.Exp, x) }

// Log returns ln x.
func Log(x *T) *T { return unary(kernels.Log, x) }

// Sqrt returns √x.
func Sqrt(x *T) *T { return unary(kernels.Sqrt, x) }

// Abs returns |x|.
func Abs(x *T) *T { return unary(kernels.Abs, x) }

// Square returns x².
func Square(x *T) *T { return unary(kernels.Square, x) }

// ReLU returns max(x, 0). Its backward needs only the output's sign, so it
// saves the output, which the next operation usually saves anyway.
func ReLU(x *T) *T { return unary(kernels.ReLU, x) }

// Sigmoid returns 1/(1+e⁻ˣ).
func Sigmoid(x *T) *T { return unary(kernels.Sigmoid, x) }

// Tanh returns tanh x.
func Tanh(x *T) *T { return unary(kernels.Tanh, x) }

// Recip returns 1/x.
func Recip(x *T) *T { return unary(kernels.Recip, x) }

// GELU returns the Gaussian error linear unit of x in GPT-2's tanh form,
// ½x(1 + tanh(√(2/π)(x + 0.044715x³))).
func GELU(x *T) *T { return unary(kernels.GELU, x) }

// Cast returns x converted to dt; the gradient is converted back.
func Cast(x *T, dt tensor.DType) *T { return castOn(x.Device(), x, dt) }

// castOn is Cast following the modes of, and making the copy on, the handle
// dev: autocast converts a parameter made on a device for an operation
// that runs on one of its sessions.
func castOn(dev *tensor.Device, x *T, dt tensor.DType) *T {
	if x.DType() == dt {
		return identityOn(dev, x)
	}
	y := castRawOn(dev, x, dt)
	if rec := beginOn(dev, "cast", x); rec != nil {
		src := x.DType()
		rec.finish(y, func(g *T) []*T { return []*T{castRaw(g, src)} })
	}
	return y
}

// Identity returns a new handle on x's storage that passes gradients through.
func Identity(x *T) *T { return identityOn(ModeOf(x), x) }

// identityOn is Identity making the new handle on dev.
func identityOn(dev *tensor.Device, x *T) *T {
	y := x.On(dev)
	if rec := beginOn(dev, "identity", x); rec != nil {
		rec.finish(y, func(g *T) []*T { return []*T{g.Retain()} })
	}
	return y
}

// Reshape returns a view of x with a new shape (one dimension may be −1).
func Reshape(x *T, shape ...int) *T {
	y := x.View(shape...)
	if rec := begin("reshape", x); rec != nil {
		in := x.Shape()
		back := func(g *T) *T { return g.View(in...) }
		rec.passesRounding(back)
		rec.finish(y, func(g *T) []*T { return []*T{back(g)} })
	}
	return y
}

// Flatten reshapes an N×... tensor to N×(rest).
func Flatten(x *T) *T { return Reshape(x, x.Dim(0), -1) }

// Detach returns a new handle on x's storage that records nothing: gradients
// stop there.
func Detach(x *T) *T { return x.View(x.Shape()...) }
