//go:build amd64 && !purego

package cpu

import (
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
	"golang.org/x/sys/cpu"
)

//go:noescape
func sum16(x *float32, n int) float32

//go:noescape
func sumSqDev16(x *float32, n int, mean float32) float32

//go:noescape
func affine16(y, x, res *float32, n int, scale, shift float32, relu bool)

//go:noescape
func bnGrad16(dy, y, x *float32, n int, mean float32, gout *float32) (sumG, sumGX float32)

//go:noescape
func bnApply16(dx, dy, y, x *float32, n int, a, b, c float32)

//go:noescape
func sgdMomentum16(p, grad, buf *float32, n int, lr, wd, mom, damp float32, nesterov bool)

//go:noescape
func unscale16(grad *float32, n int, inv float32) (bad bool)

//go:noescape
func sum16h(x *uint16, n int) float32

//go:noescape
func sumSqDev16h(x *uint16, n int, mean float32) float32

//go:noescape
func affine16h(y, x, res *uint16, n int, scale, shift float32, relu bool)

//go:noescape
func bnGrad16h(dy, y, x *uint16, n int, mean float32, gout *uint16) (sumG, sumGX float32)

//go:noescape
func bnApply16h(dx, dy, y, x *uint16, n int, a, b, c float32)

//go:noescape
func reluGrad16(dx, dy, y *float32, n int)

//go:noescape
func relu16(y, x *float32, n int)

// hasAVX512 turns on the AVX-512 passes: batch norm (norm_amd64.s), the SGD
// update and the scaler's unscale (optim_amd64.s) and ReLU
// (elementwise_amd64.s). Each Go wrapper
// below runs its pass over the leading multiple of 16 values and returns
// how many it took; the caller's Go loop does the rest.
var hasAVX512 = cpu.X86.HasAVX512F

// halfPasses turns on batch norm's passes over F16 planes in place (AMP's
// activations, loaded with VCVTPH2PS and stored with VCVTPS2PH) instead of
// over float32 copies of them (norm.go). Tests turn it off to compare.
var halfPasses = hasAVX512

// vecLen is how many leading values of n the AVX-512 passes take: a
// multiple of 16, or none without AVX-512.
func vecLen(n int) int {
	if !hasAVX512 {
		return 0
	}
	return n &^ 15
}

// ptr is &x[0], or nil for an empty or missing slice.
func ptr(x []float32) *float32 {
	if len(x) == 0 {
		return nil
	}
	return unsafe.SliceData(x)
}

// sumVec returns how many leading values of x it summed, and their sum.
func sumVec(x []float32) (int, float32) {
	n := vecLen(len(x))
	if n == 0 {
		return 0, 0
	}
	return n, sum16(ptr(x), n)
}

// sumSqDevVec is sumVec for Σ (x − mean)².
func sumSqDevVec(x []float32, mean float32) (int, float32) {
	n := vecLen(len(x))
	if n == 0 {
		return 0, 0
	}
	return n, sumSqDev16(ptr(x), n, mean)
}

// affineVec writes the leading values of affineAct's output, returning how
// many.
func affineVec(y, x, res []float32, scale, shift float32, relu bool) int {
	n := vecLen(len(x))
	if n > 0 {
		affine16(ptr(y[:n]), ptr(x), ptr(res), n, scale, shift, relu)
	}
	return n
}

// bnGradVec runs the batch-norm backward's reduction over the leading
// values (see bnGrad), returning how many with their Σ g and Σ g·(x − mean).
func bnGradVec(dy, y, x []float32, mean float32, g []float32) (int, float32, float32) {
	n := vecLen(len(dy))
	if n == 0 {
		return 0, 0, 0
	}
	if g != nil {
		g = g[:n]
	}
	sb, sx := bnGrad16(ptr(dy), ptr(y), ptr(x[:n]), n, mean, ptr(g))
	return n, sb, sx
}

// bnApplyVec writes the leading values of the batch-norm backward's dx (see
// bnApply), returning how many.
func bnApplyVec(dx, dy, y, x []float32, a, b, c float32) int {
	n := vecLen(len(dy))
	if n > 0 {
		bnApply16(ptr(dx[:n]), ptr(dy), ptr(y), ptr(x[:n]), n, a, b, c)
	}
	return n
}

// sgdMomentumVec updates the leading parameters with SGD's momentum rule
// past the first step (see sgdUpdate), returning how many.
func sgdMomentumVec(hp kernels.SGDParams, lr float32, p, g, buf []float32) int {
	n := vecLen(len(p))
	if n > 0 {
		sgdMomentum16(ptr(p), ptr(g[:n]), ptr(buf[:n]), n, lr, hp.WeightDecay, hp.Momentum, 1-hp.Dampening, hp.Nesterov)
	}
	return n
}

// reluGradVec writes the leading values of ReLU's gradient (dy where y > 0),
// returning how many.
func reluGradVec(dx, dy, y []float32) int {
	n := vecLen(len(dx))
	if n > 0 {
		reluGrad16(ptr(dx), ptr(dy[:n]), ptr(y[:n]), n)
	}
	return n
}

// reluVec writes the leading values of max(x, 0), returning how many.
func reluVec(y, x []float32) int {
	n := vecLen(len(x))
	if n > 0 {
		relu16(ptr(y[:n]), ptr(x), n)
	}
	return n
}

// unscaleVec multiplies the leading values of g by inv in place, returning
// how many and whether any product is infinite or NaN.
func unscaleVec(g []float32, inv float32) (int, bool) {
	n := vecLen(len(g))
	if n == 0 {
		return 0, false
	}
	return n, unscale16(ptr(g), n, inv)
}

// ptrH is &x[0], or nil for an empty or missing slice.
func ptrH(x []uint16) *uint16 {
	if len(x) == 0 {
		return nil
	}
	return unsafe.SliceData(x)
}

// The same passes over F16 values (halfPasses), each returning how many
// leading values it took.

func sumHalfVec(x []uint16) (int, float32) {
	n := vecLen(len(x))
	if n == 0 {
		return 0, 0
	}
	return n, sum16h(ptrH(x), n)
}

func sumSqDevHalfVec(x []uint16, mean float32) (int, float32) {
	n := vecLen(len(x))
	if n == 0 {
		return 0, 0
	}
	return n, sumSqDev16h(ptrH(x), n, mean)
}

func affineHalfVec(y, x, res []uint16, scale, shift float32, relu bool) int {
	n := vecLen(len(x))
	if n > 0 {
		affine16h(ptrH(y[:n]), ptrH(x), ptrH(res), n, scale, shift, relu)
	}
	return n
}

func bnGradHalfVec(dy, y, x []uint16, mean float32, g []uint16) (int, float32, float32) {
	n := vecLen(len(dy))
	if n == 0 {
		return 0, 0, 0
	}
	if g != nil {
		g = g[:n]
	}
	sb, sx := bnGrad16h(ptrH(dy), ptrH(y), ptrH(x[:n]), n, mean, ptrH(g))
	return n, sb, sx
}

func bnApplyHalfVec(dx, dy, y, x []uint16, a, b, c float32) int {
	n := vecLen(len(dy))
	if n > 0 {
		bnApply16h(ptrH(dx[:n]), ptrH(dy), ptrH(y), ptrH(x[:n]), n, a, b, c)
	}
	return n
}
