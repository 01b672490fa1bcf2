//go:build !amd64 || purego

package cpu

// hasF16C is false: no assembly conversions here.
const hasF16C = false

// convertHalf converts nothing without amd64 assembly: the caller's portable
// loop does it all.
func convertHalf(dst []float32, src []uint16) int { return 0 }

// convertFloat converts nothing without amd64 assembly.
func convertFloat(dst []uint16, src []float32) int { return 0 }
