//go:build !amd64 || purego

package half

// HasF16C is false: no assembly conversions here.
const HasF16C = false

// wide is false: no AVX-512 conversions here.
var wide = false

// toFloat converts nothing without amd64 assembly: Table does it all.
func toFloat(dst []float32, src []uint16) int { return 0 }

// toFloatRows converts nothing without amd64 assembly.
func toFloatRows(dst []float32, ldd int, src []uint16, lds int, rows, n int) int { return 0 }

// fromFloat converts nothing without amd64 assembly.
func fromFloat(dst []uint16, src []float32) int { return 0 }

// fromFloatRows converts nothing without amd64 assembly.
func fromFloatRows(dst []uint16, ldd int, src []float32, lds int, rows, n int) int { return 0 }

// copyRows copies nothing without amd64 assembly.
func copyRows(dst []float32, ldd int, src []float32, lds int, rows, n int) bool { return false }

// bf16ToFloatRows converts nothing without amd64 assembly.
func bf16ToFloatRows(dst []float32, ldd int, src []uint16, lds int, rows, n int) bool { return false }

// bf16FromFloatRows converts nothing without amd64 assembly.
func bf16FromFloatRows(dst []uint16, ldd int, src []float32, lds int, rows, n int) bool { return false }
