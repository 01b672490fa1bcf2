package kernels

import (
	"fmt"
	"math"
)

// ElementwiseOps apply the functions of the op tables (UnaryOps, BinaryOps)
// element by element.
type ElementwiseOps interface {
	// Unary computes dst = op(x).
	Unary(op UnaryOp, dst, x Buf)

	// UnaryBackward computes dx = dy·op'(x), from x or the forward output y.
	UnaryBackward(op UnaryOp, dx, dy, x, y Buf)

	// Affine computes dst = alpha·x + beta.
	Affine(dst, x Buf, alpha, beta float32)

	// Binary computes dst = a op b, broadcasting as bc says. a and b have
	// dst's dtype, or dst and one of them are F32 and the other is read in
	// its own (a 16-bit residual branch added to an F32 stream, uncast).
	Binary(op BinaryOp, dst, a, b Buf, bc Broadcast)
}

// The elementwise operations are defined here, each in one declaration: its
// name, its function and derivative on the CPU (float32), the same two as
// CUDA C expressions, and a float64 reference the tests hold every backend
// to. The CPU backend runs F and Grad; the CUDA backend compiles the
// expressions into its kernels (package cuda generates the switch over the
// ops from this table, so no enum is mirrored by hand); the conformance
// suite, the gradient checks and the profiles iterate over UnaryOps.
//
// Adding an op is one more declaration below, one function in package
// autograd (func Name(x *T) *T { return unary(kernels.Name, x) }), and its
// tests follow from the table (docs/adding-an-op.md).

// UnaryOp is an elementwise function of one argument.
type UnaryOp uint8

// Uses says which of a unary op's forward input x and output y its
// derivative is computed from: autograd saves that one for the backward.
type Uses uint8

// What a derivative reads.
const (
	UsesNone   Uses = iota // the derivative is a constant (Neg)
	UsesInput              // from x
	UsesOutput             // from y, which is often saved anyway
)

// Domain is where a unary op is tested: finite differences must not step
// across a kink (|x|, ReLU at 0) or out of the domain (ln, √ below 0).
type Domain uint8

// The domains.
const (
	AnyReal      Domain = iota
	Positive            // [0.25, 2.25]
	AwayFromZero        // |x| ≥ 0.1
)

// UnaryDef is the definition of a unary operation.
type UnaryDef struct {
	Name string
	Uses Uses
	// F is the function and Grad its backward, dy·f′, from the forward's
	// input x or output y (Uses says which is valid), in float32: the CPU
	// backend's.
	F    func(x float32) float32
	Grad func(dy, x, y float32) float32
	// CUDA is F as a CUDA C++ expression of float x; CUDAGrad is Grad as
	// one of float dy, x and y (an expression that needs a temporary can
	// be a lambda called in place).
	CUDA, CUDAGrad string
	// Ref and RefDeriv are f and f′ in float64, written from the
	// definition: the tests' reference for every backend.
	Ref, RefDeriv func(x float64) float64
	Domain        Domain
}

var unaryDefs = []UnaryDef{{}} // index 0 is no op

// defineUnary registers an operation and returns its code.
func defineUnary(d UnaryDef) UnaryOp {
	if d.Name == "" || d.F == nil || d.Grad == nil || d.CUDA == "" || d.CUDAGrad == "" || d.Ref == nil || d.RefDeriv == nil {
		panic(fmt.Sprintf("kernels: incomplete definition of unary op %q", d.Name))
	}
	unaryDefs = append(unaryDefs, d)
	return UnaryOp(len(unaryDefs) - 1)
}

// The unary operations.
var (
	// Neg is −x.
	Neg = defineUnary(UnaryDef{Name: "neg", Uses: UsesNone,
		F: func(x float32) float32 { return -x }, Grad: func(dy, x, y float32) float32 { return -dy },
		CUDA: "-x", CUDAGrad: "-dy",
		Ref: func(x float64) float64 { return -x }, RefDeriv: func(float64) float64 { return -1 }})
	// Exp is eˣ.
	Exp = defineUnary(UnaryDef{Name: "exp", Uses: UsesOutput,
		F: func(x float32) float32 { return float32(math.Exp(float64(x))) }, Grad: func(dy, x, y float32) float32 { return dy * y },
		CUDA: "expf(x)", CUDAGrad: "dy * y",
		Ref: math.Exp, RefDeriv: math.Exp})
	// Log is ln x.
	Log = defineUnary(UnaryDef{Name: "log", Uses: UsesInput,
		F: func(x float32) float32 { return float32(math.Log(float64(x))) }, Grad: func(dy, x, y float32) float32 { return dy / x },
		CUDA: "logf(x)", CUDAGrad: "dy / x",
		Ref: math.Log, RefDeriv: func(x float64) float64 { return 1 / x }, Domain: Positive})
	// Sqrt is √x.
	Sqrt = defineUnary(UnaryDef{Name: "sqrt", Uses: UsesOutput,
		F: func(x float32) float32 { return float32(math.Sqrt(float64(x))) }, Grad: func(dy, x, y float32) float32 { return dy * 0.5 / y },
		CUDA: "sqrtf(x)", CUDAGrad: "dy * 0.5f / y",
		Ref: math.Sqrt, RefDeriv: func(x float64) float64 { return 0.5 / math.Sqrt(x) }, Domain: Positive})
	// Abs is |x|; its derivative at 0 is 0.
	Abs = defineUnary(UnaryDef{Name: "abs", Uses: UsesInput,
		F: func(x float32) float32 { return float32(math.Abs(float64(x))) }, Grad: func(dy, x, y float32) float32 {
			switch {
			case x > 0:
				return dy
			case x < 0:
				return -dy
			}
			return 0
		},
		CUDA: "fabsf(x)", CUDAGrad: "x > 0.f ? dy : (x < 0.f ? -dy : 0.f)",
		Ref: math.Abs, RefDeriv: func(x float64) float64 { return sign(x) }, Domain: AwayFromZero})
	// Square is x².
	Square = defineUnary(UnaryDef{Name: "square", Uses: UsesInput,
		F: func(x float32) float32 { return x * x }, Grad: func(dy, x, y float32) float32 { return 2 * x * dy },
		CUDA: "x * x", CUDAGrad: "2.f * x * dy",
		Ref: func(x float64) float64 { return x * x }, RefDeriv: func(x float64) float64 { return 2 * x }})
	// ReLU is max(x, 0), NaN passing through; its derivative is read from
	// the output's sign (a NaN output passes no gradient).
	ReLU = defineUnary(UnaryDef{Name: "relu", Uses: UsesOutput,
		F: func(x float32) float32 { return max(x, 0) }, Grad: func(dy, x, y float32) float32 {
			if y > 0 {
				return dy
			}
			return 0
		},
		CUDA: "fmaxf(x, 0.f)", CUDAGrad: "y > 0.f ? dy : 0.f",
		Ref: func(x float64) float64 { return math.Max(x, 0) }, RefDeriv: func(x float64) float64 { return max(sign(x), 0) },
		Domain: AwayFromZero})
	// Sigmoid is 1/(1+e⁻ˣ).
	Sigmoid = defineUnary(UnaryDef{Name: "sigmoid", Uses: UsesOutput,
		F: func(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }, Grad: func(dy, x, y float32) float32 { return dy * y * (1 - y) },
		CUDA: "1.f / (1.f + expf(-x))", CUDAGrad: "dy * y * (1.f - y)",
		Ref: sigmoid, RefDeriv: func(x float64) float64 { return sigmoid(x) * (1 - sigmoid(x)) }})
	// Tanh is tanh x.
	Tanh = defineUnary(UnaryDef{Name: "tanh", Uses: UsesOutput,
		F: func(x float32) float32 { return float32(math.Tanh(float64(x))) }, Grad: func(dy, x, y float32) float32 { return dy * (1 - y*y) },
		CUDA: "tanhf(x)", CUDAGrad: "dy * (1.f - y * y)",
		Ref: math.Tanh, RefDeriv: func(x float64) float64 { return 1 - math.Tanh(x)*math.Tanh(x) }})
	// Recip is 1/x.
	Recip = defineUnary(UnaryDef{Name: "recip", Uses: UsesOutput,
		F: func(x float32) float32 { return 1 / x }, Grad: func(dy, x, y float32) float32 { return -dy * y * y },
		CUDA: "1.f / x", CUDAGrad: "-dy * y * y",
		Ref: func(x float64) float64 { return 1 / x }, RefDeriv: func(x float64) float64 { return -1 / (x * x) }, Domain: Positive})
	// GELU is the Gaussian error linear unit in GPT-2's tanh form,
	// ½x(1 + tanh(√(2/π)(x + 0.044715x³))), as PyTorch's
	// gelu(approximate="tanh").
	GELU = defineUnary(UnaryDef{Name: "gelu", Uses: UsesInput,
		F:    func(x float32) float32 { return float32(geluRef(float64(x))) },
		Grad: func(dy, x, y float32) float32 { return dy * float32(geluDeriv(float64(x))) },
		CUDA: "0.5f * x * (1.f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)))",
		CUDAGrad: "dy * [=] { float t = tanhf(0.7978845608f * (x + 0.044715f * x * x * x)); " +
			"return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * 0.7978845608f * (1.f + 0.134145f * x * x); }()",
		Ref: geluTanh, RefDeriv: geluTanhDeriv})
)

func sign(x float64) float64 {
	switch {
	case x > 0:
		return 1
	case x < 0:
		return -1
	}
	return 0
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// geluC is √(2/π), the tanh form's scale.
const geluC = 0.7978845608028654

// geluRef and geluDeriv are the CPU backend's GELU: the tanh form in
// float64, rounded by the caller.
func geluRef(x float64) float64 { return 0.5 * x * (1 + math.Tanh(geluC*(x+0.044715*x*x*x))) }

func geluDeriv(x float64) float64 {
	t := math.Tanh(geluC * (x + 0.044715*x*x*x))
	return 0.5*(1+t) + 0.5*x*(1-t*t)*geluC*(1+3*0.044715*x*x)
}

// geluTanh and geluTanhDeriv are the reference, written through the
// logistic function and cosh (½(1 + tanh u) = σ(2u)) rather than tanh, so
// that they are not the backends' own formula.
func geluTanh(x float64) float64 { return x * sigmoid(2*geluC*(x+0.044715*x*x*x)) }

func geluTanhDeriv(x float64) float64 {
	u := geluC * (x + 0.044715*x*x*x)
	du := geluC * (1 + 3*0.044715*x*x)
	c := math.Cosh(u)
	// d/dx [x·σ(2u)] = σ(2u) + x·2σ(2u)(1−σ(2u))·u′, with 2σ(1−σ) = 1/(2cosh²u).
	return sigmoid(2*u) + x*du/(2*c*c)
}

// UnaryOps lists every unary operation, in definition order.
func UnaryOps() []UnaryOp {
	ops := make([]UnaryOp, 0, len(unaryDefs)-1)
	for i := 1; i < len(unaryDefs); i++ {
		ops = append(ops, UnaryOp(i))
	}
	return ops
}

// Def is op's definition. It panics for an unknown op.
func (op UnaryOp) Def() *UnaryDef {
	if op == 0 || int(op) >= len(unaryDefs) {
		panic(fmt.Sprintf("kernels: unknown unary op %d", op))
	}
	return &unaryDefs[op]
}

func (op UnaryOp) String() string {
	if op == 0 || int(op) >= len(unaryDefs) {
		return fmt.Sprintf("unary(%d)", op)
	}
	return unaryDefs[op].Name
}

// BinaryOp is an elementwise function of two arguments, with broadcasting.
type BinaryOp uint8

// BinaryDef is the definition of a binary operation: its function on the
// CPU, as a CUDA C expression of float a and b, and in float64.
type BinaryDef struct {
	Name string
	F    func(a, b float32) float32
	CUDA string
	Ref  func(a, b float64) float64
	// PositiveB says the op is tested with b in [0.25, 2.25] (a divisor).
	PositiveB bool
}

var binaryDefs = []BinaryDef{{}}

func defineBinary(d BinaryDef) BinaryOp {
	if d.Name == "" || d.F == nil || d.CUDA == "" || d.Ref == nil {
		panic(fmt.Sprintf("kernels: incomplete definition of binary op %q", d.Name))
	}
	binaryDefs = append(binaryDefs, d)
	return BinaryOp(len(binaryDefs) - 1)
}

// The binary operations. Their gradients are compositions of the ops
// themselves (package autograd).
var (
	Add = defineBinary(BinaryDef{Name: "add", F: func(a, b float32) float32 { return a + b }, CUDA: "a + b",
		Ref: func(a, b float64) float64 { return a + b }})
	Sub = defineBinary(BinaryDef{Name: "sub", F: func(a, b float32) float32 { return a - b }, CUDA: "a - b",
		Ref: func(a, b float64) float64 { return a - b }})
	Mul = defineBinary(BinaryDef{Name: "mul", F: func(a, b float32) float32 { return a * b }, CUDA: "a * b",
		Ref: func(a, b float64) float64 { return a * b }})
	Div = defineBinary(BinaryDef{Name: "div", F: func(a, b float32) float32 { return a / b }, CUDA: "a / b",
		Ref: func(a, b float64) float64 { return a / b }, PositiveB: true})
)

// BinaryOps lists every binary operation, in definition order.
func BinaryOps() []BinaryOp {
	ops := make([]BinaryOp, 0, len(binaryDefs)-1)
	for i := 1; i < len(binaryDefs); i++ {
		ops = append(ops, BinaryOp(i))
	}
	return ops
}

// Def is op's definition. It panics for an unknown op.
func (op BinaryOp) Def() *BinaryDef {
	if op == 0 || int(op) >= len(binaryDefs) {
		panic(fmt.Sprintf("kernels: unknown binary op %d", op))
	}
	return &binaryDefs[op]
}

func (op BinaryOp) String() string {
	if op == 0 || int(op) >= len(binaryDefs) {
		return fmt.Sprintf("binary(%d)", op)
	}
	return binaryDefs[op].Name
}

func (o *Observed) Unary(op UnaryOp, dst, x Buf) {
	defer o.op("Unary", op.String(), x)()
	o.B.Unary(op, dst, x)
}

func (o *Observed) UnaryBackward(op UnaryOp, dx, dy, x, y Buf) {
	defer o.op("UnaryBackward", op.String()+" backward", dy)()
	o.B.UnaryBackward(op, dx, dy, x, y)
}

func (o *Observed) Affine(dst, x Buf, alpha, beta float32) {
	defer o.op("Affine", "Affine", x)()
	o.B.Affine(dst, x, alpha, beta)
}

func (o *Observed) Binary(op BinaryOp, dst, a, b Buf, bc Broadcast) {
	defer o.op("Binary", op.String(), dst)()
	o.B.Binary(op, dst, a, b, bc)
}
