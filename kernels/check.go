package kernels

import "fmt"

// The argument checks every backend makes before an operation: sizes that
// do not match the parameters are programmer errors, and panic with a
// message naming the operation and the sizes.

// CheckLen panics unless every buffer holds want elements.
func CheckLen(op string, want int, bufs ...Buf) {
	for _, b := range bufs {
		if b.N != want {
			panic(fmt.Sprintf("kernels: %s: buffer of %d elements, want %d", op, b.N, want))
		}
	}
}

// CheckF32 panics unless every buffer is F32.
func CheckF32(op string, bufs ...Buf) {
	for _, b := range bufs {
		if b.DType != F32 {
			panic(fmt.Sprintf("kernels: %s: %v buffer where f32 is required", op, b.DType))
		}
	}
}

// CheckReduction checks x (Outer·Len·Inner) and dst (Outer·Inner) against r.
func CheckReduction(op string, r Reduction, x, dst Buf) {
	if r.Outer <= 0 || r.Len <= 0 || r.Inner <= 0 {
		panic(fmt.Sprintf("kernels: %s: invalid reduction %+v", op, r))
	}
	CheckLen(op+" input", r.Outer*r.Len*r.Inner, x)
	CheckLen(op+" output", r.Outer*r.Inner, dst)
}

// CheckGemm checks the operands' sizes and dtypes against p.
func CheckGemm(p GemmParams, a, b, c Buf) {
	batch := max(p.Batch, 1)
	if p.M <= 0 || p.N <= 0 || p.K <= 0 {
		panic(fmt.Sprintf("kernels: gemm with M=%d N=%d K=%d", p.M, p.N, p.K))
	}
	for _, o := range []struct {
		name         string
		buf          Buf
		size, stride int
	}{{"A", a, p.M * p.K, p.StrideA}, {"B", b, p.K * p.N, p.StrideB}, {"C", c, p.M * p.N, p.StrideC}} {
		if n := (batch-1)*o.stride + o.size; o.buf.N < n {
			panic(fmt.Sprintf("kernels: gemm %s has %d elements, needs %d (%+v)", o.name, o.buf.N, n, p))
		}
	}
	if a.DType != b.DType {
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

// CheckConv checks a convolution's input x, weight w and output y against p.
func CheckConv(op string, p ConvParams, x, w, y Buf) {
	p.Validate()
	CheckLen(op+" input", p.N*p.C*p.H*p.W, x)
	CheckLen(op+" weight", p.K*p.C*p.R*p.S, w)
	CheckLen(op+" output", p.N*p.K*p.OutH()*p.OutW(), y)
	if x.DType != w.DType || x.DType != y.DType {
		panic(fmt.Sprintf("kernels: %s of %v input, %v weight, %v output", op, x.DType, w.DType, y.DType))
	}
}

// CheckTranspose checks a transposition's buffers: one dtype, t.Len()
// elements each, and no axis empty.
func CheckTranspose(t Transposition, dst, src Buf) {
	if t.Outer <= 0 || t.Rows <= 0 || t.Cols <= 0 {
		panic(fmt.Sprintf("kernels: transpose: invalid %+v", t))
	}
	CheckLen("transpose", t.Len(), dst, src)
	if dst.DType != src.DType {
		panic(fmt.Sprintf("kernels: transpose of a %v source into a %v destination", src.DType, dst.DType))
	}
}

// CheckPool checks a pooling's input and output against p.
func CheckPool(op string, p PoolParams, x, y Buf) {
	p.Validate()
	CheckLen(op+" input", p.N*p.C*p.H*p.W, x)
	CheckLen(op+" output", p.N*p.C*p.OutH()*p.OutW(), y)
}

// CheckBN checks batch norm's input against p and its per-channel buffers
// (parameters, statistics), which are F32 of C elements. Inputs hold fewer
// than 2³¹ elements (the CUDA kernels index them in 32 bits).
func CheckBN(op string, p BNParams, x Buf, channel ...Buf) {
	if p.N <= 0 || p.C <= 0 || p.HW <= 0 || int64(p.N)*int64(p.C)*int64(p.HW) >= 1<<31 {
		panic(fmt.Sprintf("kernels: %s: invalid parameters %+v", op, p))
	}
	CheckLen(op+" input", p.N*p.C*p.HW, x)
	CheckLen(op+" per-channel buffer", p.C, channel...)
	CheckF32(op+" per-channel buffer", channel...)
}

// CheckCrossEntropy checks logits (n×k), I32 labels (n) and the F32 row
// log-sum-exps (n).
func CheckCrossEntropy(op string, logits, labels, lse Buf, n, k int) {
	if n <= 0 || k <= 0 {
		panic(fmt.Sprintf("kernels: %s of %d rows of %d classes", op, n, k))
	}
	CheckLen(op+" logits", n*k, logits)
	CheckLen(op+" labels", n, labels)
	CheckLen(op+" log-sum-exp", n, lse)
	if labels.DType != I32 {
		panic(fmt.Sprintf("kernels: %s labels are %v, want i32", op, labels.DType))
	}
	CheckF32(op, lse)
}

// CheckLists checks that the lists of a multi-tensor operation pair up:
// the same number of tensors, the same sizes, all F32.
func CheckLists(op string, lists ...[]Buf) {
	for _, l := range lists[1:] {
		if len(l) != len(lists[0]) {
			panic(fmt.Sprintf("kernels: %s: lists of %d and %d tensors", op, len(lists[0]), len(l)))
		}
	}
	for i := range lists[0] {
		for _, l := range lists {
			if l[i].N != lists[0][i].N || l[i].DType != F32 {
				panic(fmt.Sprintf("kernels: %s: tensor %d: %d %v elements, want %d f32", op, i, l[i].N, l[i].DType, lists[0][i].N))
			}
		}
	}
}

// CheckCastLists checks the lists of a multi-tensor conversion and returns
// their dtypes: as many tensors in dst as in src, the same sizes pairwise,
// every src of one dtype and every dst of another, F32 on one side and F16
// or BF16 on the other (0, 0 for empty lists).
func CheckCastLists(op string, dst, src []Buf) (from, to DType) {
	if len(dst) != len(src) {
		panic(fmt.Sprintf("kernels: %s: lists of %d and %d tensors", op, len(dst), len(src)))
	}
	if len(dst) == 0 {
		return 0, 0
	}
	from, to = src[0].DType, dst[0].DType
	if !(from == F32 && to.Half() || from.Half() && to == F32) {
		panic(fmt.Sprintf("kernels: %s from %v to %v: want f32 to f16 or bf16, or back", op, from, to))
	}
	for i := range dst {
		if src[i].DType != from || dst[i].DType != to || src[i].N != dst[i].N {
			panic(fmt.Sprintf("kernels: %s: tensor %d: %d %v elements into %d %v, want %v into %v of the same length",
				op, i, src[i].N, src[i].DType, dst[i].N, dst[i].DType, from, to))
		}
	}
	return from, to
}

// CheckAccumulateLists is CheckCastLists for an addition into F32
// tensors: it returns the dtype of src, F16 or BF16 (0 for empty lists).
func CheckAccumulateLists(op string, dst, src []Buf) DType {
	from, to := CheckCastLists(op, dst, src)
	if len(dst) > 0 && to != F32 {
		panic(fmt.Sprintf("kernels: %s of %v into %v: want f16 or bf16 into f32", op, from, to))
	}
	return from
}

// CheckScalar panics unless every valid buffer among bufs is F32 of one
// element (a device scalar: a learning rate, a loss scale, a flag).
func CheckScalar(op string, bufs ...Buf) {
	for _, b := range bufs {
		if b.Valid() && (b.N != 1 || b.DType != F32) {
			panic(fmt.Sprintf("kernels: %s: %d %v elements where an f32 scalar is required", op, b.N, b.DType))
		}
	}
}

// CheckCounter panics unless c is a counter: I32 of CounterLen elements.
func CheckCounter(op string, c Buf) {
	if !c.Valid() || c.N != CounterLen || c.DType != I32 {
		panic(fmt.Sprintf("kernels: %s: %d %v elements where a counter (%d i32) is required", op, c.N, c.DType, CounterLen))
	}
}

// CheckLike panics unless every valid buffer among bufs has x's length and
// dtype (an optional operand such as a batch norm's residual).
func CheckLike(op string, x Buf, bufs ...Buf) {
	for _, b := range bufs {
		if b.Valid() && (b.N != x.N || b.DType != x.DType) {
			panic(fmt.Sprintf("kernels: %s: %d %v elements beside an input of %d %v", op, b.N, b.DType, x.N, x.DType))
		}
	}
}

// CheckMetrics checks AccumulateMetrics' operands: F32 sums of 3, an F32
// loss and right count of 1 each, and n > 0 predictions.
func CheckMetrics(sums, loss, right Buf, n int) {
	if n <= 0 {
		panic(fmt.Sprintf("kernels: metrics of %d predictions", n))
	}
	CheckLen("metrics sums", 3, sums)
	CheckLen("metrics loss", 1, loss, right)
	CheckF32("metrics", sums, loss, right)
}

// CheckCountCorrect checks CountCorrect's operands: an F32 count of 1,
// logits of n×k and I32 labels of n.
func CheckCountCorrect(right, logits, labels Buf, n, k int) {
	if n <= 0 || k <= 0 {
		panic(fmt.Sprintf("kernels: count correct of %d rows of %d classes", n, k))
	}
	CheckLen("count correct", 1, right)
	CheckF32("count correct", right)
	CheckLen("count correct logits", n*k, logits)
	CheckLen("count correct labels", n, labels)
	if labels.DType != I32 {
		panic(fmt.Sprintf("kernels: count correct labels are %v, want i32", labels.DType))
	}
}

// CheckBNMask checks how a batch norm backward finds its ReLU's mask, and
// reports whether it writes the forward's output again for it: with
// p.ReLU and no y, from x, beta and the forward's residual (which must then
// be given, beta always and the residual when there is a residual
// gradient, x's length and dtype); with y, y must be x's length.
func CheckBNMask(op string, p BNParams, x, y, residual, beta, dresidual Buf) (again bool) {
	switch {
	case !p.ReLU:
		return false
	case y.Valid():
		CheckLen(op+" output", x.N, y)
		return false
	case !beta.Valid() || dresidual.Valid() && !residual.Valid():
		panic(fmt.Sprintf("kernels: %s without the ReLU's output: want beta (given: %v) and, with a residual gradient (given: %v), the residual (given: %v)", op, beta.Valid(), dresidual.Valid(), residual.Valid()))
	}
	CheckLike(op+" residual", x, residual)
	CheckLen(op+" beta", p.C, beta)
	return true
}
