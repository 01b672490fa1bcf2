package kernels

import (
	"fmt"
	"strings"
)

// GemmOps are the matrix products.
type GemmOps interface {
	// Gemm computes a (batched) matrix product; see GemmParams. C is read when Beta != 0.
	Gemm(p GemmParams, a, b, c Buf)

	// GemmEpilogue computes a matrix product and its epilogue in one
	// pass where the backend can fuse them; see Epilogue.
	GemmEpilogue(p GemmParams, e Epilogue, a, b, c Buf)
}

// GemmParams describes C = Alpha·op(A)·op(B) + Beta·C for row-major matrices,
// op(A) being M×K and op(B) K×N. A is stored M×K, or K×M when TransA; B is
// stored K×N, or N×K when TransB. With Batch > 1 the product is repeated for
// Batch matrices StrideA, StrideB, StrideC elements apart (a stride of 0
// reuses one matrix). A and B share a dtype (F32, F16 or BF16); C is F32,
// or A's 16-bit dtype (cuBLAS has no F32×F32→F16 product); accumulation is
// in float32.
type GemmParams struct {
	TransA, TransB            bool
	M, N, K                   int
	Alpha, Beta               float32
	Batch                     int
	StrideA, StrideB, StrideC int
	// PackedB says B is a Prepacker's packing of the K×N operand (see
	// Prepacker), not a matrix: TransB and StrideB do not apply, and the
	// product is unbatched. Only a Prepacker takes it.
	PackedB bool
}

// Prepacker is a backend whose products can read a B operand packed once
// ahead of them, in the layout its products pack B into for themselves
// (the CPU's: a served model's weights are read by every decoding step,
// whose few rows of A make packing B cost about as much as the product).
// The packing is a copy: it goes stale if B changes.
type Prepacker interface {
	// PrepackLen is the F32 elements the packing of a K×N B takes.
	PrepackLen(k, n int) int
	// Prepack packs b, a product's k×n B (stored n×k when trans), into
	// dst (F32, PrepackLen(k, n) elements), for products with PackedB.
	Prepack(dst, b Buf, k, n int, trans bool)
}

// Epilogue is what a single (unbatched, Beta = 0) matrix product does to
// its result on the way to memory, in the pass that stores C (cuBLASLt's
// epilogues on CUDA): a linear layer's bias, its activation, their
// gradients and the residual connection after it cost no pass of their own
// over C. The zero Epilogue does nothing.
//
// Forward (Grad false): C = Act(Alpha·op(A)·op(B) + Bias), the bias
// broadcast over the rows and, for a 16-bit C, rounded to C's dtype (as
// autocast rounds a bias); with an Act, Aux receives its input, the
// pre-activation the backward needs.
//
// Backward (Grad true): C = Alpha·op(A)·op(B) · Act′(Aux), the gradient
// through the activation whose input Aux holds, into the product that
// computed it.
//
// Forward with a Residual (and no Act): C = Alpha·op(A)·op(B) + Bias +
// Residual, the bias rounded as above (not at all for an F32 C) and the
// sum rounded once into C: under autocast, a 16-bit product summed into
// the F32 residual stream without being rounded to 16 bits first.
//
// Either way BiasGrad, when valid, receives the column sums of the stored C
// (the gradient of the bias that made the activation's input), and
// BiasGradA the sums of op(A) over K (the gradient of the bias of a layer
// whose weight gradient the product is, A being that layer's output
// gradient, transposed). A backend may round them to C's or A's 16-bit
// dtype, as a bias gradient of that dtype would be.
type Epilogue struct {
	Bias      Buf     // F32 or C's dtype, N elements; forward only (a 16-bit C adds it rounded to its dtype)
	Act       UnaryOp // 0: none; else an op whose derivative reads its input (UsesInput)
	Grad      bool
	Aux       Buf // C's dtype, M×N
	BiasGrad  Buf // F32, N elements
	BiasGradA Buf // F32, M elements
	Residual  Buf // C's dtype, M×N, apart from C; forward only
}

// String names what the epilogue does, as profiles show it: "bias+gelu",
// "gelu′+bias grad".
func (e Epilogue) String() string {
	var parts []string
	if e.Bias.Valid() {
		parts = append(parts, "bias")
	}
	if e.Act != 0 {
		parts = append(parts, e.Act.String()+map[bool]string{true: "′"}[e.Grad])
	}
	if e.BiasGrad.Valid() {
		parts = append(parts, "bias grad")
	}
	if e.BiasGradA.Valid() {
		parts = append(parts, "bias grad of A")
	}
	if e.Residual.Valid() {
		parts = append(parts, "residual")
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "+")
}

// F32Matmul is how a backend multiplies F32 matrices on a GPU.
type F32Matmul uint8

const (
	// F32TF32x3, the default, splits each operand into two TF32 parts, x
	// = big + small, and multiplies on TF32 tensor cores as three products
	// (small·big, big·small, big·big; small·small is below F32's
	// rounding), summed in F32, as CUTLASS's 3xTF32 and PyTorch's F32
	// memory-efficient attention do: on the H200 the products' errors are
	// below strict F32's and GPT-2 small's fp32 step is 1.13 times
	// PyTorch's strict one (docs/benchmarks.md; the CUDA backend's Note [F32
	// products as three TF32 ones]). A device without TF32 tensor cores (or the
	// shared memory its kernels ask) multiplies strictly.
	F32TF32x3 F32Matmul = iota
	// F32Strict multiplies in F32 on the FMA units: PyTorch's default
	// (torch.set_float32_matmul_precision("highest")).
	F32Strict
	// F32TF32 multiplies on TF32 tensor cores once: inputs rounded to
	// 10-bit mantissas, as PyTorch's torch.backends.cuda.matmul.allow_tf32.
	F32TF32
)

var f32MatmulNames = [...]string{F32Strict: "strict", F32TF32x3: "tf32x3", F32TF32: "tf32"}

// String is the mode's flag value: strict, tf32x3 or tf32.
func (m F32Matmul) String() string {
	if int(m) < len(f32MatmulNames) {
		return f32MatmulNames[m]
	}
	return fmt.Sprintf("F32Matmul(%d)", m)
}

// MarshalText is the mode's String, for flag.TextVar.
func (m F32Matmul) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText reads a mode from its String.
func (m *F32Matmul) UnmarshalText(text []byte) error {
	for v, name := range f32MatmulNames {
		if string(text) == name {
			*m = F32Matmul(v)
			return nil
		}
	}
	return fmt.Errorf("F32 matmul mode %q: want strict, tf32x3 or tf32", text)
}

// CheckGemm checks the operands' sizes and dtypes against p, which must
// not have PackedB.
func CheckGemm(p GemmParams, a, b, c Buf) {
	if p.PackedB {
		panic(fmt.Sprintf("kernels: gemm of a packed B on a backend that packs none (%+v)", p))
	}
	checkGemm(p, a, b, c, p.K*p.N)
}

// CheckGemmPacked is CheckGemm for a product with PackedB whose B a
// Prepacker packed into packedLen elements.
func CheckGemmPacked(packedLen int, p GemmParams, a, b, c Buf) {
	if !p.PackedB || max(p.Batch, 1) != 1 {
		panic(fmt.Sprintf("kernels: checking a packed gemm of %+v: want PackedB and no batch", p))
	}
	CheckF32("gemm packed B", b)
	checkGemm(p, a, b, c, packedLen)
}

// checkGemm is CheckGemm with B's elements (a matrix's, one of a batch)
// given: bSize.
func checkGemm(p GemmParams, a, b, c Buf, bSize int) {
	batch := max(p.Batch, 1)
	if p.M <= 0 || p.N <= 0 || p.K <= 0 {
		panic(fmt.Sprintf("kernels: gemm with M=%d N=%d K=%d", p.M, p.N, p.K))
	}
	for _, o := range []struct {
		name         string
		buf          Buf
		size, stride int
	}{{"A", a, p.M * p.K, p.StrideA}, {"B", b, bSize, p.StrideB}, {"C", c, p.M * p.N, p.StrideC}} {
		if n := (batch-1)*o.stride + o.size; o.buf.N < n {
			panic(fmt.Sprintf("kernels: gemm %s has %d elements, needs %d (%+v)", o.name, o.buf.N, n, p))
		}
	}
	if a.DType != b.DType && !p.PackedB { // a packed B is F32 panels
		panic(fmt.Sprintf("kernels: gemm of %v A and %v B", a.DType, b.DType))
	}
	if c.DType != F32 && c.DType != a.DType {
		panic(fmt.Sprintf("kernels: gemm of %v operands into a %v result: want f32 C or the operands' dtype", a.DType, c.DType))
	}
}

// CheckGemmEpilogue checks a product with an epilogue: the product as
// CheckGemm does, and the epilogue's buffers against p.
func CheckGemmEpilogue(p GemmParams, e Epilogue, a, b, c Buf) {
	CheckGemm(p, a, b, c)
	CheckEpilogue(p, e, c)
}

// CheckEpilogue checks an epilogue's buffers against p and C: the
// epilogue's part of CheckGemmEpilogue.
func CheckEpilogue(p GemmParams, e Epilogue, c Buf) {
	if max(p.Batch, 1) != 1 || p.Beta != 0 {
		panic(fmt.Sprintf("kernels: gemm epilogue of a batched product or one with β ≠ 0 (%+v)", p))
	}
	if e.Act != 0 {
		if e.Act.Def().Uses != UsesInput {
			panic(fmt.Sprintf("kernels: gemm epilogue with %v, whose derivative does not read its input", e.Act))
		}
		if !e.Aux.Valid() || e.Aux.DType != c.DType {
			panic(fmt.Sprintf("kernels: gemm epilogue with %v needs an Aux of C's dtype %v (have %v)", e.Act, c.DType, e.Aux.DType))
		}
		CheckLen("gemm epilogue aux", p.M*p.N, e.Aux)
	} else if e.Grad || e.Aux.Valid() {
		panic("kernels: gemm epilogue with Grad or an Aux but no Act")
	}
	if e.Bias.Valid() {
		if e.Grad {
			panic("kernels: gemm epilogue with both Grad and a Bias")
		}
		if e.Bias.DType != F32 && e.Bias.DType != c.DType {
			panic(fmt.Sprintf("kernels: gemm epilogue bias of %v for a %v C: want f32 or C's dtype", e.Bias.DType, c.DType))
		}
		CheckLen("gemm epilogue bias", p.N, e.Bias)
	}
	if e.BiasGrad.Valid() {
		CheckF32("gemm epilogue bias gradient", e.BiasGrad)
		CheckLen("gemm epilogue bias gradient", p.N, e.BiasGrad)
	}
	if e.BiasGradA.Valid() {
		CheckF32("gemm epilogue bias gradient of A", e.BiasGradA)
		CheckLen("gemm epilogue bias gradient of A", p.M, e.BiasGradA)
	}
	if r := e.Residual; r.Valid() {
		switch {
		case e.Grad || e.Act != 0:
			panic(fmt.Sprintf("kernels: gemm epilogue with a residual and %v (grad %v): a residual is added only to a linear product", e.Act, e.Grad))
		case r.DType != c.DType:
			panic(fmt.Sprintf("kernels: gemm epilogue residual of %v for a %v C", r.DType, c.DType))
		case r.Block == c.Block && r.Off < c.Off+c.Bytes() && c.Off < r.Off+r.Bytes():
			panic(fmt.Sprintf("kernels: gemm epilogue residual (bytes %d+%d) overlaps C (%d+%d)", r.Off, r.Bytes(), c.Off, c.Bytes()))
		}
		CheckLen("gemm epilogue residual", p.M*p.N, r)
	}
}

func (o *Observed) Gemm(p GemmParams, a, b, c Buf) {
	defer o.op("Gemm", "Gemm", a)()
	o.B.Gemm(p, a, b, c)
}

func (o *Observed) GemmEpilogue(p GemmParams, e Epilogue, a, b, c Buf) {
	defer o.op("GemmEpilogue", "GemmEpilogue "+e.String(), a)()
	o.B.GemmEpilogue(p, e, a, b, c)
}
