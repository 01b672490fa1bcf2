//go:build !amd64 || purego

package cpu

import "github.com/leangrad/leangrad/kernels"

// Without amd64 assembly the vector passes (batch norm, SGD, ReLU) take no
// values: the Go loops that call them do all the work.

func sumVec(x []float32) (int, float32)                                  { return 0, 0 }
func sumSqDevVec(x []float32, mean float32) (int, float32)               { return 0, 0 }
func affineVec(y, x, res []float32, scale, shift float32, relu bool) int { return 0 }
func bnGradVec(dy, y, x []float32, mean float32, g []float32) (int, float32, float32) {
	return 0, 0, 0
}
func bnApplyVec(dx, dy, y, x []float32, a, b, c float32) int { return 0 }

func sgdMomentumVec(hp kernels.SGDParams, lr float32, p, g, buf []float32) int { return 0 }

func reluGradVec(dx, dy, y []float32) int { return 0 }

func unscaleVec(g []float32, inv float32) (int, bool) { return 0, false }

// halfPasses is off: batch norm converts F16 planes into float32 copies.
var halfPasses = false

func sumHalfVec(x []uint16) (int, float32)                                  { return 0, 0 }
func sumSqDevHalfVec(x []uint16, mean float32) (int, float32)               { return 0, 0 }
func affineHalfVec(y, x, res []uint16, scale, shift float32, relu bool) int { return 0 }
func bnGradHalfVec(dy, y, x []uint16, mean float32, g []uint16) (int, float32, float32) {
	return 0, 0, 0
}
func bnApplyHalfVec(dx, dy, y, x []uint16, a, b, c float32) int { return 0 }

func reluVec(y, x []float32) int { return 0 }
