//go:build amd64 && !purego

package cpu

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
	"golang.org/x/sys/cpu"
)

//go:noescape
func sum16(x *float32, planes, ld, n int) float64

//go:noescape
func sumSqDev16(x *float32, planes, ld, n int, mean float32) float64

//go:noescape
func affine16(y, x, res *float32, planes, ld, n int, scale, shift float32, relu bool)

//go:noescape
func bnGrad16(dy, y, x *float32, planes, ld, n int, mean float32, gout *float32) (sumG, sumGX float64)

//go:noescape
func bnApply16(dx, dy, y, x *float32, planes, ld, n int, a, b, c float32)

//go:noescape
func sgdMomentum16(p, grad, buf *float32, n int, lr, wd, mom, damp float32, nesterov bool)

//go:noescape
func unscale16(grad *float32, n int, inv float32) (bad bool)

//go:noescape
func adamw16(p, grad, m, v *float32, n int, a *adamw)

//go:noescape
func sum16h(x *uint16, planes, ld, n int) float64

//go:noescape
func sumSqDev16h(x *uint16, planes, ld, n int, mean float32) float64

//go:noescape
func affine16h(y, x, res *uint16, planes, ld, n int, scale, shift float32, relu bool)

//go:noescape
func bnGrad16h(dy, y, x *uint16, planes, ld, n int, mean float32, gout *uint16) (sumG, sumGX float64)

//go:noescape
func bnApply16h(dx, dy, y, x *uint16, planes, ld, n int, a, b, c float32)

//go:noescape
func reluGrad16(dx, dy, y *float32, n int)

//go:noescape
func relu16(y, x *float32, n int)

//go:noescape
func add16(y, a, b *float32, n int)

//go:noescape
func sub16(y, a, b *float32, n int)

//go:noescape
func mul16(y, a, b *float32, n int)

//go:noescape
func div16(y, a, b *float32, n int)

//go:noescape
func add16h(y, a, b *uint16, n int)

//go:noescape
func sub16h(y, a, b *uint16, n int)

//go:noescape
func mul16h(y, a, b *uint16, n int)

//go:noescape
func div16h(y, a, b *uint16, n int)

//go:noescape
func reluGrad32h(dx, dy, y *uint16, n int)

//go:noescape
func sumRows16(acc *float64, x *float32, rows, ld, n int)

//go:noescape
func sumRows16h(acc *float64, x *uint16, rows, ld, n int)

// hasAVX512 turns on the AVX-512 passes: the SGD and AdamW updates and the scaler's
// unscale (optim_amd64.s) and ReLU (elementwise_amd64.s). Each Go wrapper
// below runs its pass over the leading multiple of 16 values and returns
// how many it took; the caller's Go loop does the rest.
var hasAVX512 = cpu.X86.HasAVX512F

// maskedPasses turns on the passes that take every value, the last few by
// masked loads and stores (AVX-512F and BW): batch norm's (norm_amd64.s:
// one call a channel, over all its planes), the elementwise arithmetic, the
// column sums and ReLU's gradient on F16 bits (elementwise_amd64.s).
var maskedPasses = hasAVX512 && cpu.X86.HasAVX512BW

// halfPasses turns on batch norm's passes over F16 planes in place (AMP's
// activations, loaded with VCVTPH2PS and stored with VCVTPS2PH) instead of
// over float32 copies of them (norm.go). Tests turn it off to compare.
var halfPasses = maskedPasses

//go:noescape
func deal2(dst *float32, wp, plane int, src *float32, w, h int)

// dealEven and dealOdd are the lanes of thirty-two pixels that go to the
// even and to the odd phase (deal2's VPERMI2PS indices).
var (
	dealEven = [16]int32{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}
	dealOdd  = [16]int32{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31}
)

// dealVec deals an h×w image out to its four stride-2 phases in dst (see
// grid.deal), phase (a, b)'s row r at dst[(a·2 + b)·plane + r·wp:], and
// reports whether it did: with masked passes (AVX-512F and BW) only.
func dealVec(dst []float32, wp, plane int, src []float32, w, h int) bool {
	if !maskedPasses || w <= 0 || h <= 0 {
		return false
	}
	if len(src) < w*h || len(dst) <= 3*plane+(h-1)/2*wp+(w-1)/2 || wp < (w+1)/2 {
		panic(fmt.Sprintf("cpu: dealing a %d×%d image from %d values into %d with row stride %d and phase stride %d", h, w, len(src), len(dst), wp, plane))
	}
	deal2(unsafe.SliceData(dst), wp, plane, unsafe.SliceData(src), w, h)
	return true
}

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

// sgdMomentumVec updates the parameters with SGD's momentum rule past the
// first step (see sgdUpdate), returning how many: all of them with
// AVX-512, the last len(p) mod 16 through the same instructions on copies.
// Its multiply-adds round once where Go's loop rounds twice, so a
// parameter's update must not depend on where a stretch ends (a sharded
// optimizer's stretches end elsewhere than the whole parameter).
func sgdMomentumVec(hp kernels.SGDParams, lr float32, p, g, buf []float32) int {
	if !hasAVX512 {
		return 0
	}
	n := vecLen(len(p))
	if n > 0 {
		sgdMomentum16(ptr(p), ptr(g[:n]), ptr(buf[:n]), n, lr, hp.WeightDecay, hp.Momentum, 1-hp.Dampening, hp.Nesterov)
	}
	if t := len(p) - n; t > 0 {
		var tp, tg, tb [16]float32
		copy(tp[:], p[n:])
		copy(tg[:], g[n:len(p)])
		copy(tb[:], buf[n:len(p)])
		sgdMomentum16(&tp[0], &tg[0], &tb[0], 16, lr, hp.WeightDecay, hp.Momentum, 1-hp.Dampening, hp.Nesterov)
		copy(p[n:], tp[:t])
		copy(buf[n:len(p)], tb[:t])
	}
	return len(p)
}

// adamwVec updates the leading values of p (a multiple of 16) with AdamW's
// rule, returning how many: the same bits as adamw.update's loop.
func adamwVec(a *adamw, p, g, m, v []float32) int {
	n := vecLen(len(p))
	if n > 0 {
		adamw16(ptr(p), ptr(g[:n]), ptr(m[:n]), ptr(v[:n]), n, a)
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

//go:noescape
func expShift8(z *float32, n int, shift float32, c *[13][8]float32) (sum float32)

// expConsts are expShift8's constants, eight lanes each: the clamps,
// log2 e, ½, ln 2 in two parts, expf's polynomial, 1, and 127 as an int32.
var expConsts = func() (c [13][8]float32) {
	for i, v := range []float32{-87.33654, 88.37626, 1.44269504088896341, 0.5, 0.693359375, -2.12194440e-4,
		1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 1} {
		for l := range c[i] {
			c[i][l] = v
		}
	}
	for l := range c[12] {
		c[12][l] = math.Float32frombits(127)
	}
	return c
}()

var hasAVX2FMA = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// expShiftVec replaces the leading values of z (a multiple of 8) by
// exp(z − shift), returning how many and their sum.
func expShiftVec(z []float32, shift float32) (int, float32) {
	n := len(z) &^ 7
	if !hasAVX2FMA || n == 0 {
		return 0, 0
	}
	return n, expShift8(ptr(z), n, shift, &expConsts)
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

//go:noescape
func dot16(a, b *float32, n int) float32

//go:noescape
func axpy16(y, x *float32, w float32, n int)

// dotVec is dot's AVX-512 pass over all of a and b (as long as a), and
// whether it ran.
func dotVec(a, b []float32) (float32, bool) {
	if !hasAVX512 || len(a) == 0 {
		return 0, false
	}
	return dot16(ptr(a), ptr(b), len(a)), true
}

// axpyVec is axpy's AVX-512 pass over all of y and x (as long as y), and
// whether it ran.
func axpyVec(y []float32, w float32, x []float32) bool {
	if !hasAVX512 || len(y) == 0 {
		return false
	}
	axpy16(ptr(y), ptr(x), w, len(y))
	return true
}

//go:noescape
func geluIn16(t, x *float32, n int, c1, c3 float32)

//go:noescape
func geluOut16(y, x, t *float32, n int)

// geluInVec is geluRow's first pass, −2·√(2/π)·(x + 0.044715·x³) into t,
// with AVX-512 (the bits of the Go loop), and whether it ran.
func geluInVec(t, x []float32) bool {
	if !hasAVX512 || len(x) == 0 {
		return false
	}
	geluIn16(ptr(t[:len(x)]), ptr(x), len(x), -2*geluC, 0.044715)
	return true
}

// geluOutVec is geluRow's last pass, y = x / (1 + t), with AVX-512 (the
// bits of the Go loop), and whether it ran.
func geluOutVec(y, x, t []float32) bool {
	if !hasAVX512 || len(x) == 0 {
		return false
	}
	geluOut16(ptr(y[:len(x)]), ptr(x), ptr(t[:len(x)]), len(x))
	return true
}

// addVec adds x to y (as long) with add16, and reports whether it did.
func addVec(y, x []float32) bool {
	if !maskedPasses || len(y) == 0 {
		return false
	}
	add16(ptr(y), ptr(y), ptr(x), len(y))
	return true
}

// ptrH is &x[0], or nil for an empty or missing slice.
func ptrH(x []uint16) *uint16 {
	if len(x) == 0 {
		return nil
	}
	return unsafe.SliceData(x)
}

// The batch-norm passes over a channel (see norm.go): float32 planes or, on
// the half path, F16 ones; every channel given has the same layout.

func sumPass(x channel) float64 {
	if x.h != nil {
		return sum16h(ptrH(x.h), x.planes, x.ld, x.hw)
	}
	return sum16(ptr(x.f), x.planes, x.ld, x.hw)
}

func sumSqDevPass(x channel, mean float32) float64 {
	if x.h != nil {
		return sumSqDev16h(ptrH(x.h), x.planes, x.ld, x.hw, mean)
	}
	return sumSqDev16(ptr(x.f), x.planes, x.ld, x.hw, mean)
}

func affinePass(y, x, res channel, scale, shift float32, relu bool) {
	if x.h != nil {
		affine16h(ptrH(y.h), ptrH(x.h), ptrH(res.h), x.planes, x.ld, x.hw, scale, shift, relu)
		return
	}
	affine16(ptr(y.f), ptr(x.f), ptr(res.f), x.planes, x.ld, x.hw, scale, shift, relu)
}

func bnGradPass(dy, y, x channel, mean float32, g channel) (sumG, sumGX float64) {
	if dy.h != nil {
		return bnGrad16h(ptrH(dy.h), ptrH(y.h), ptrH(x.h), dy.planes, dy.ld, dy.hw, mean, ptrH(g.h))
	}
	return bnGrad16(ptr(dy.f), ptr(y.f), ptr(x.f), dy.planes, dy.ld, dy.hw, mean, ptr(g.f))
}

func bnApplyPass(dx, dy, y, x channel, a, b, c float32) {
	if dy.h != nil {
		bnApply16h(ptrH(dx.h), ptrH(dy.h), ptrH(y.h), ptrH(x.h), dy.planes, dy.ld, dy.hw, a, b, c)
		return
	}
	bnApply16(ptr(dx.f), ptr(dy.f), ptr(y.f), ptr(x.f), dy.planes, dy.ld, dy.hw, a, b, c)
}

// binaryVec computes y = a op b over n values from offsets ya, aa and ba of
// y, a and b in assembly, returning false (doing nothing) when the CPU lacks
// the passes or the operands are not all F32 or all F16.
func binaryVec(op kernels.BinaryOp, y, a, b values, ya, aa, ba, n int) bool {
	if !maskedPasses || n == 0 {
		return false
	}
	var f32 func(y, a, b *float32, n int)
	var f16 func(y, a, b *uint16, n int)
	switch op {
	case kernels.Add:
		f32, f16 = add16, add16h
	case kernels.Sub:
		f32, f16 = sub16, sub16h
	case kernels.Mul:
		f32, f16 = mul16, mul16h
	case kernels.Div:
		f32, f16 = div16, div16h
	default:
		return false
	}
	switch {
	case y.f32 != nil && a.f32 != nil && b.f32 != nil:
		f32(ptr(y.f32[ya:ya+n]), ptr(a.f32[aa:aa+n]), ptr(b.f32[ba:ba+n]), n)
	case y.f16 != nil && a.f16 != nil && b.f16 != nil:
		f16(ptrH(y.f16[ya:ya+n]), ptrH(a.f16[aa:aa+n]), ptrH(b.f16[ba:ba+n]), n)
	default:
		return false
	}
	return true
}

// reluGradHalf writes ReLU's gradient on F16 values in place (see
// reluGrad32h), returning false when the CPU lacks the pass.
func reluGradHalf(dx, dy, y []uint16) bool {
	if !maskedPasses {
		return false
	}
	n := len(dy)
	if n > 0 {
		reluGrad32h(ptrH(dx[:n]), ptrH(dy), ptrH(y[:n]), n)
	}
	return true
}

// sumRowsVec adds, for each of rows rows of x (the first at off, ld apart) in
// turn, its first len(acc)−16 values to acc, widened to float64, in
// assembly (acc's last sixteen are padding the tail may write), returning
// false when the CPU lacks the pass.
func sumRowsVec(acc []float64, x values, off, ld, rows int) bool {
	n := len(acc) - 16
	if !maskedPasses || n <= 0 {
		return false
	}
	if rows == 0 {
		return true
	}
	end := off + (rows-1)*ld + n
	switch {
	case x.f32 != nil:
		sumRows16(&acc[0], ptr(x.f32[off:end]), rows, ld, n)
	case x.f16 != nil:
		sumRows16h(&acc[0], ptrH(x.f16[off:end]), rows, ld, n)
	default:
		return false
	}
	return true
}
