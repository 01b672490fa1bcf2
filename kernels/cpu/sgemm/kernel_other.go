//go:build !amd64 || purego

package sgemm

// archKernels is empty: without amd64 assembly (another architecture, or the
// purego build tag) the plain Go kernel is the only one.
func archKernels() []*microkernel { return nil }

// transposeVec transposes nothing: transpose8's Go loop does it all.
func transposeVec(panel []float32, r, w int, src []float32, at []int, kc int) int { return 0 }

// transposeVecHalf transposes nothing: Half.Pack's Go loop does it all.
func transposeVecHalf(panel []float32, r, w int, src []uint16, at *[8]int, kc int) int { return 0 }
