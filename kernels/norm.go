package kernels

import "fmt"

// NormOps are batch and layer normalisation.
type NormOps interface {
	// BatchNormTrain normalises x with its batch statistics, writes them to
	// saveMean and saveInvStd (F32, C each) and updates runMean and runVar
	// in place; y = γ·x̂ + β + residual, through a ReLU with p.ReLU. The
	// residual (x's length and dtype) is optional.
	BatchNormTrain(p BNParams, x, residual, gamma, beta, y, runMean, runVar, saveMean, saveInvStd Buf)

	// BatchNormEval normalises x with the running statistics, adding the
	// optional residual and applying the ReLU as BatchNormTrain does.
	BatchNormEval(p BNParams, x, residual, gamma, beta, runMean, runVar, y Buf)

	// BatchNormApply writes BatchNormTrain's y again, bit for bit, from the
	// batch statistics it saved: how a backward that did not keep y
	// recomputes it.
	BatchNormApply(p BNParams, x, residual, gamma, beta, saveMean, saveInvStd, y Buf)

	// BatchNormBackward computes dx, dgamma and dbeta of BatchNormTrain, and
	// the optional dresidual; with p.ReLU, dy is masked where the forward
	// output y was not positive (y is read only then). Without y, the mask
	// is BatchNormApply's y's, computed from x, beta and the forward's
	// residual (if it had one) as it writes it: a backward need not keep y.
	// dx may be dy itself (in place) when there is no dresidual, and
	// dresidual may be dy itself.
	BatchNormBackward(p BNParams, x, y, residual, dy, gamma, beta, saveMean, saveInvStd, dx, dresidual, dgamma, dbeta Buf)

	// LayerNorm normalises each row of x: y = (x−μ)·rstd·γ + β (γ, β F32
	// of Cols), and writes each row's μ and rstd = 1/√(σ²+ε) (F32 of Rows)
	// for the backward. y is in x's dtype, or F16 or BF16 for an F32 x:
	// the F32 result rounded once, as a cast of it would be.
	LayerNorm(p LayerNormParams, x, gamma, beta, y, mean, rstd Buf)

	// LayerNormBackward computes dx (x's dtype) and writes dgamma and dbeta
	// (F32 of Cols, summed over the rows in a fixed order) from dy (the
	// forward's y's dtype) and what the forward saved. With p.Accumulate,
	// dx (F32) holds a gradient and x's is added to it: prev + dx, as a
	// separate F32 addition would round it, in one pass.
	LayerNormBackward(p LayerNormParams, x, gamma, mean, rstd, dy, dx, dgamma, dbeta Buf)
}

// BNParams describes batch normalisation of an N×C×HW input over its N and
// HW axes, per channel. Momentum weights the new batch statistics in the
// running averages, as in PyTorch; the running variance is unbiased. With
// ReLU the output is max(0, ·) of the normalised value plus the residual:
// batch norm fused with the ReLU (and the residual addition) after it, as
// in a ResNet block.
type BNParams struct {
	N, C, HW int
	Eps      float32
	Momentum float32
	ReLU     bool
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

// LayerNormParams describes layer normalisation of a Rows×Cols array over
// its rows. Accumulate (backward, F32 x only) adds dx to what dx holds
// instead of overwriting it: a residual stream's two gradients summed by
// the norm's backward, without a pass of their own. Rounded (backward, an
// F32 x with a 16-bit dy; or invalid) is a buffer of dx's length in dy's
// dtype into which the backward also writes dx, as it leaves it, rounded
// as Cast would: the copy of the gradient a 16-bit product reads, with no
// pass of its own. Sums (backward, an F32 dx; or invalid), F32 of Cols,
// receives the column sums of dx as the backward leaves it: the bias
// gradient of the product whose result dx is the gradient of, with no
// pass of its own.
type LayerNormParams struct {
	Rows, Cols int
	Eps        float32
	Accumulate bool
	Rounded    Buf
	Sums       Buf
}

// CheckLayerNorm checks a layer norm's operands against p: x and out (y,
// or dy and dx) of Rows×Cols, each out in x's dtype or, for an F32 x, F16
// or BF16; γ and β (and their gradients) F32 of Cols, the statistics F32
// of Rows.
func CheckLayerNorm(op string, p LayerNormParams, x, gamma, mean, rstd Buf, rows ...Buf) {
	for _, y := range rows {
		if y.DType != x.DType && (x.DType != F32 || (y.DType != F16 && y.DType != BF16)) {
			panic(fmt.Sprintf("kernels: %s of %v rows into %v: want %v, or f16 or bf16 from f32", op, x.DType, y.DType, x.DType))
		}
	}
	if p.Rows <= 0 || p.Cols <= 0 || !(p.Eps > 0) {
		panic(fmt.Sprintf("kernels: %s: invalid parameters %+v", op, p))
	}
	if p.Accumulate && x.DType != F32 {
		panic(fmt.Sprintf("kernels: %s accumulating into a %v gradient: want f32", op, x.DType))
	}
	CheckLen(op+" input", p.Rows*p.Cols, append([]Buf{x}, rows...)...)
	CheckLen(op+" gain", p.Cols, gamma)
	CheckLen(op+" statistics", p.Rows, mean, rstd)
	CheckF32(op, gamma, mean, rstd)
}

// CheckLayerNormRounded panics unless p.Rounded is invalid or fits a
// backward of F32 dx from the 16-bit dy, and p.Sums is invalid or F32 of
// p.Cols for an F32 dx (LayerNormParams).
func CheckLayerNormRounded(op string, p LayerNormParams, dy, dx Buf) {
	if s := p.Sums; s.Valid() {
		if dx.DType != F32 {
			panic(fmt.Sprintf("kernels: %s: column sums of a %v dx: want f32", op, dx.DType))
		}
		CheckF32(op+" column sums", s)
		CheckLen(op+" column sums", p.Cols, s)
	}
	r := p.Rounded
	if !r.Valid() {
		return
	}
	if dx.DType != F32 || dy.DType == F32 || r.DType != dy.DType {
		panic(fmt.Sprintf("kernels: %s: %v dx rounded into %v from a %v dy: want f32 dx rounded into dy's 16-bit dtype", op, dx.DType, r.DType, dy.DType))
	}
	CheckLen(op+" rounded dx", dx.N, r)
}

func (o *Observed) BatchNormTrain(p BNParams, x, residual, gamma, beta, y, runMean, runVar, saveMean, saveInvStd Buf) {
	defer o.op("BatchNormTrain", "BatchNormTrain", x)()
	o.B.BatchNormTrain(p, x, residual, gamma, beta, y, runMean, runVar, saveMean, saveInvStd)
}

func (o *Observed) BatchNormApply(p BNParams, x, residual, gamma, beta, saveMean, saveInvStd, y Buf) {
	defer o.op("BatchNormApply", "BatchNormApply", x)()
	o.B.BatchNormApply(p, x, residual, gamma, beta, saveMean, saveInvStd, y)
}

func (o *Observed) BatchNormEval(p BNParams, x, residual, gamma, beta, runMean, runVar, y Buf) {
	defer o.op("BatchNormEval", "BatchNormEval", x)()
	o.B.BatchNormEval(p, x, residual, gamma, beta, runMean, runVar, y)
}

func (o *Observed) BatchNormBackward(p BNParams, x, y, residual, dy, gamma, beta, saveMean, saveInvStd, dx, dresidual, dgamma, dbeta Buf) {
	defer o.op("BatchNormBackward", "BatchNormBackward", dy)()
	o.B.BatchNormBackward(p, x, y, residual, dy, gamma, beta, saveMean, saveInvStd, dx, dresidual, dgamma, dbeta)
}

func (o *Observed) LayerNorm(p LayerNormParams, x, gamma, beta, y, mean, rstd Buf) {
	defer o.op("LayerNorm", "LayerNorm", x)()
	o.B.LayerNorm(p, x, gamma, beta, y, mean, rstd)
}

func (o *Observed) LayerNormBackward(p LayerNormParams, x, gamma, mean, rstd, dy, dx, dgamma, dbeta Buf) {
	defer o.op("LayerNormBackward", "LayerNormBackward", dy)()
	o.B.LayerNormBackward(p, x, gamma, mean, rstd, dy, dx, dgamma, dbeta)
}
