package kernels

import "fmt"

// MaxDims is the most dimensions a Broadcast can describe after collapsing.
const MaxDims = 6

// Broadcast maps every element of an output of Shape to one element of each
// of two inputs: the element of input a at output index (i0, i1, ...) is
// Σ ik·StrideA[k], and likewise for b. A stride of 0 repeats the input along
// that dimension. Dimensions that need no separate stride are collapsed, so
// NDim is small (a bias add over NCHW collapses to 3).
type Broadcast struct {
	NDim             int
	Shape            [MaxDims]int
	StrideA, StrideB [MaxDims]int
}

// Len is the number of output elements.
func (bc Broadcast) Len() int {
	n := 1
	for i := 0; i < bc.NDim; i++ {
		n *= bc.Shape[i]
	}
	return n
}

// Same reports whether both inputs have the output's shape (no broadcasting).
func (bc Broadcast) Same() bool {
	return bc.NDim == 1 && bc.StrideA[0] == 1 && bc.StrideB[0] == 1
}

// Offsets returns the input offsets of output element i.
func (bc Broadcast) Offsets(i int) (oa, ob int) {
	for d := bc.NDim - 1; d >= 0; d-- {
		k := i % bc.Shape[d]
		i /= bc.Shape[d]
		oa += k * bc.StrideA[d]
		ob += k * bc.StrideB[d]
	}
	return oa, ob
}

// BroadcastShape returns the shape two shapes broadcast to, NumPy style
// (aligned at the right; a dimension of 1 stretches), or an error naming
// both shapes.
func BroadcastShape(a, b []int) ([]int, error) {
	n := max(len(a), len(b))
	out := make([]int, n)
	for i := 0; i < n; i++ {
		da, db := dimFromRight(a, n-1-i), dimFromRight(b, n-1-i)
		switch {
		case da == db || db == 1:
			out[i] = da
		case da == 1:
			out[i] = db
		default:
			return nil, fmt.Errorf("shapes %v and %v do not broadcast", a, b)
		}
	}
	return out, nil
}

func dimFromRight(s []int, k int) int {
	if k < len(s) {
		return s[len(s)-1-k]
	}
	return 1
}

// NewBroadcast describes reading inputs of shapes a and b for an output of
// shape out, which must be their broadcast shape.
func NewBroadcast(out, a, b []int) Broadcast {
	n := len(out)
	sa, sb := broadcastStrides(out, a), broadcastStrides(out, b)
	// Collapse dimension i into i-1 when, for both inputs, stepping over the
	// inner one is the same as stepping once in the outer one.
	var bc Broadcast
	for i := 0; i < n; i++ {
		if out[i] == 1 {
			continue
		}
		if bc.NDim > 0 {
			j := bc.NDim - 1
			if bc.StrideA[j] == sa[i]*out[i] && bc.StrideB[j] == sb[i]*out[i] {
				bc.Shape[j] *= out[i]
				bc.StrideA[j], bc.StrideB[j] = sa[i], sb[i]
				continue
			}
		}
		if bc.NDim == MaxDims {
			panic(fmt.Sprintf("kernels: broadcast of %v and %v to %v needs more than %d dimensions", a, b, out, MaxDims))
		}
		bc.Shape[bc.NDim], bc.StrideA[bc.NDim], bc.StrideB[bc.NDim] = out[i], sa[i], sb[i]
		bc.NDim++
	}
	if bc.NDim == 0 {
		bc.NDim, bc.Shape[0] = 1, 1
	}
	return bc
}

// broadcastStrides gives the element strides of a contiguous array of shape s
// read as shape out: 0 along dimensions where s is 1 or missing.
func broadcastStrides(out, s []int) []int {
	st := make([]int, len(out))
	stride := 1
	for i := len(out) - 1; i >= 0; i-- {
		k := len(s) - len(out) + i
		if k >= 0 && s[k] != 1 {
			st[i] = stride
			stride *= s[k]
		}
	}
	return st
}
