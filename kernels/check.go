package kernels

import "fmt"

// The argument checks every backend makes before an operation: sizes that
// do not match the parameters are programmer errors, and panic with a
// message naming the operation and the sizes.

// CheckLen panics unless every buffer holds want elements.
func CheckLen(op string, want int, bufs ...Buf) {
	for _, b := range bufs {
		if b.N != want {
			panic(fmt.Sprintf("kernels: %s: buffer of %d elements, want %d", op, b.N, want))
		}
	}
}

// CheckF32 panics unless every buffer is F32.
func CheckF32(op string, bufs ...Buf) {
	for _, b := range bufs {
		if b.DType != F32 {
			panic(fmt.Sprintf("kernels: %s: %v buffer where f32 is required", op, b.DType))
		}
	}
}

// CheckLists checks that the lists of a multi-tensor operation pair up:
// the same number of tensors, the same sizes, all F32.
func CheckLists(op string, lists ...[]Buf) {
	for _, l := range lists[1:] {
		if len(l) != len(lists[0]) {
			panic(fmt.Sprintf("kernels: %s: lists of %d and %d tensors", op, len(lists[0]), len(l)))
		}
	}
	for i := range lists[0] {
		for _, l := range lists {
			if l[i].N != lists[0][i].N || l[i].DType != F32 {
				panic(fmt.Sprintf("kernels: %s: tensor %d: %d %v elements, want %d f32", op, i, l[i].N, l[i].DType, lists[0][i].N))
			}
		}
	}
}

// CheckScalar panics unless every valid buffer among bufs is F32 of one
// element (a device scalar: a learning rate, a loss scale, a flag).
func CheckScalar(op string, bufs ...Buf) {
	for _, b := range bufs {
		if b.Valid() && (b.N != 1 || b.DType != F32) {
			panic(fmt.Sprintf("kernels: %s: %d %v elements where an f32 scalar is required", op, b.N, b.DType))
		}
	}
}

// CheckCounter panics unless c is a counter: I32 of CounterLen elements.
func CheckCounter(op string, c Buf) {
	if !c.Valid() || c.N != CounterLen || c.DType != I32 {
		panic(fmt.Sprintf("kernels: %s: %d %v elements where a counter (%d i32) is required", op, c.N, c.DType, CounterLen))
	}
}

// CheckLike panics unless every valid buffer among bufs has x's length and
// dtype (an optional operand such as a batch norm's residual).
func CheckLike(op string, x Buf, bufs ...Buf) {
	for _, b := range bufs {
		if b.Valid() && (b.N != x.N || b.DType != x.DType) {
			panic(fmt.Sprintf("kernels: %s: %d %v elements beside an input of %d %v", op, b.N, b.DType, x.N, x.DType))
		}
	}
}
