package cpu

import (
	"math/bits"
	"sync"

	"github.com/leangrad/leangrad/kernels"
)

// Scratch (F16 operands converted to float32, padded convolution grids,
// product outputs) comes from pools of power-of-two sizes, so a training step
// does not hand the garbage collector megabytes to clear and free per
// operation. It lives on the Go heap, outside the tensor pool, like all CPU
// scratch.
var scratchPools [64]sync.Pool

// getScratch returns n float32s of undefined contents; give them back with
// putScratch.
func getScratch(n int) []float32 {
	if n == 0 {
		return nil
	}
	class := bits.Len(uint(n - 1))
	if s, ok := scratchPools[class].Get().(*[]float32); ok {
		return (*s)[:n]
	}
	return make([]float32, n, 1<<class)
}

// putScratch gives back a slice from getScratch.
func putScratch(s []float32) {
	if cap(s) == 0 || cap(s)&(cap(s)-1) != 0 {
		return // not from getScratch
	}
	s = s[:cap(s)]
	scratchPools[bits.Len(uint(cap(s)-1))].Put(&s)
}

// view is in(b) for an operation that gives the values back when it is
// done: F32 buffers are read in place; F16 ones are converted into scratch.
func view(b kernels.Buf) (x []float32, done func()) {
	if b.DType != kernels.F16 {
		return in(b), func() {}
	}
	x = getScratch(b.N)
	halfInto(x, u16s(b))
	return x, func() { putScratch(x) }
}
