//go:build amd64 && !purego

package sgemm

import (
	"github.com/leangrad/leangrad/kernels/cpu/internal/half"
	"golang.org/x/sys/cpu"
)

//go:noescape
func kernel8x48(kc int, a, b, c *float32, ldc int, add bool)

//go:noescape
func kernel6x16(kc int, a, b, c *float32, ldc int, add bool)

//go:noescape
func kernel8x48s(kc int, a, b *float32, offs *int, c *float32, ldc int, add bool)

//go:noescape
func kernel6x16s(kc int, a, b *float32, offs *int, c *float32, ldc int, add bool)

//go:noescape
func dot4x6(steps int, a *float32, aoffs *[4]int, b *float32, boffs *[6]int, out *[24]float32)

//go:noescape
func transpose8x8(dst *float32, ldd int, src *float32, at *[8]int, n int)

//go:noescape
func transpose8x8h(dst *float32, ldd int, src *uint16, at *[8]int, n int)

func fmaLoop512(n int)

func fmaLoop256(n int)

// archKernels are the assembly kernels this CPU runs, fastest first: each is
// offered only where the CPU has its instructions (x/sys/cpu also checks
// that the OS saves the wider registers).
func archKernels() []*microkernel {
	var ks []*microkernel
	if cpu.X86.HasAVX512F {
		ks = append(ks, &microkernel{name: "avx512", mr: 8, nr: 48, run: kernel8x48, shifted: kernel8x48s, dot: dot4x6, peak: fmaLoop512, peakFlops: 24 * 16 * 2})
	}
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		ks = append(ks, &microkernel{name: "avx2", mr: 6, nr: 16, run: kernel6x16, shifted: kernel6x16s, peak: fmaLoop256, peakFlops: 12 * 8 * 2})
	}
	return ks
}

// hasAVX2 turns on the assembly transpose in packing.
var hasAVX2 = cpu.X86.HasAVX2

// transposeVec packs the first multiple of eight of kc values of eight rows
// (see transpose8) with AVX, returning how many.
func transposeVec(panel []float32, r, w int, src []float32, at []int, kc int) int {
	n := kc &^ 7
	if !hasAVX2 || n == 0 {
		return 0
	}
	var rows [8]int
	for i := range rows {
		if at[i]+n > len(src) {
			panic("sgemm: transpose past the end of its rows")
		}
		rows[i] = at[i]
	}
	_ = panel[(n-1)*w+r+7] // the last block's last store
	transpose8x8(&panel[r], w, &src[0], &rows, n)
	return n
}

// transposeVecHalf is transposeVec from rows of halves at src[at[i]:],
// converted as they are loaded (F16C; half.HasF16C implies AVX2).
func transposeVecHalf(panel []float32, r, w int, src []uint16, at *[8]int, kc int) int {
	n := kc &^ 7
	if !half.HasF16C || n == 0 {
		return 0
	}
	for _, o := range at {
		if o < 0 || o+n > len(src) {
			panic("sgemm: transpose past the end of its rows")
		}
	}
	_ = panel[(n-1)*w+r+7] // the last block's last store
	transpose8x8h(&panel[r], w, &src[0], at, n)
	return n
}
