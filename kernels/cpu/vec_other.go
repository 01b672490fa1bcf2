//go:build !amd64 || purego

package cpu

import "github.com/leangrad/leangrad/kernels"

// Without amd64 assembly the vector passes (SGD, AdamW, ReLU, unscale) take no
// values: the Go loops that call them do all the work.

func sgdMomentumVec(hp kernels.SGDParams, lr float32, p, g, buf []float32) int { return 0 }

func adamwVec(a *adamw, p, g, m, v []float32) int { return 0 }

func reluGradVec(dx, dy, y []float32) int { return 0 }

func unscaleVec(g []float32, inv float32) (int, bool) { return 0, false }

// maskedPasses and halfPasses are off: batch norm runs its Go loops over
// float32 planes (F16 ones converted first), and never calls the passes.
var maskedPasses, halfPasses = false, false

func sumPass(x channel) float64                                               { panic(noPasses) }
func sumSqDevPass(x channel, mean float32) float64                            { panic(noPasses) }
func affinePass(y, x, res channel, scale, shift float32, relu bool)           { panic(noPasses) }
func bnGradPass(dy, y, x channel, mean float32, g channel) (float64, float64) { panic(noPasses) }
func bnApplyPass(dx, dy, y, x channel, a, b, c float32)                       { panic(noPasses) }

const noPasses = "cpu: batch norm's passes without amd64 assembly"

func reluVec(y, x []float32) int { return 0 }

func dotVec(a, b []float32) (float32, bool) { return 0, false }

func geluInVec(t, x []float32) bool { return false }

func addVec(y, x []float32) bool { return false }

func geluOutVec(y, x, t []float32) bool { return false }

func axpyVec(y []float32, w float32, x []float32) bool { return false }

func expShiftVec(z []float32, shift float32) (int, float32) { return 0, 0 }

func dealVec(dst []float32, wp, plane int, src []float32, w, h int) bool { return false }

func binaryVec(op kernels.BinaryOp, y, a, b values, ya, aa, ba, n int) bool { return false }

func reluGradHalf(dx, dy, y []uint16) bool { return false }

func sumRowsVec(acc []float64, x values, off, ld, rows int) bool { return false }
