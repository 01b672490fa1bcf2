package cuda

import (
	"fmt"
	"math"

	"github.com/leangrad/leangrad/kernels"
)

// The elementwise operations (kernels.ElementwiseOps), whose kernels
// (elementwise.cu) switch over the ops of package kernels' tables.

type unaryArgs struct {
	Op   int32
	N    int64
	X, Y uintptr
}

type unaryBwdArgs struct {
	Op           int32
	N            int64
	Dy, X, Y, Dx uintptr
}

type affineArgs struct {
	N           int64
	X, Y        uintptr
	Alpha, Beta float32
}

type binaryArgs struct {
	Op      int32
	N       int64
	Bc      bcast
	A, B, Y uintptr
}

type binaryMixedArgs struct { // binary_mixed: A and Y F32, B of the instantiation's type
	Op, Swap int32
	N        int64
	Bc       bcast
	A, B, Y  uintptr
}

var (
	kUnary     = declareTyped[unaryArgs]("unary")
	kUnaryBwd  = declareTyped[unaryBwdArgs]("unary_bwd")
	kAffine    = declareTyped[affineArgs]("affine")
	kBinary    = declareTyped[binaryArgs]("binary")
	kBinaryMix = declareTyped[binaryMixedArgs]("binary_mixed")
)

// Unary computes dst = op(x).
func (b *Backend) Unary(op kernels.UnaryOp, dst, x kernels.Buf) {
	kernels.CheckLen("unary "+op.String(), x.N, dst)
	s := floatType("unary "+op.String(), dst, x)
	b.enter()
	defer b.exit()
	kUnary.launch(b, s, b.elems(int64(x.N)), unaryArgs{int32(op), int64(x.N), ptrOf(x), ptrOf(dst)})
}

// UnaryBackward computes dx = dy·op'(x or y).
func (b *Backend) UnaryBackward(op kernels.UnaryOp, dx, dy, x, y kernels.Buf) {
	kernels.CheckLen("unary backward "+op.String(), dy.N, dx)
	s := floatType("unary backward "+op.String(), dx, dy, x, y)
	if x.Valid() {
		kernels.CheckLen("unary backward x", dy.N, x)
	}
	if y.Valid() {
		kernels.CheckLen("unary backward y", dy.N, y)
	}
	b.enter()
	defer b.exit()
	kUnaryBwd.launch(b, s, b.elems(int64(dy.N)), unaryBwdArgs{int32(op), int64(dy.N), ptrOf(dy), ptrOf(x), ptrOf(y), ptrOf(dx)})
}

// Affine computes dst = alpha·x + beta.
func (b *Backend) Affine(dst, x kernels.Buf, alpha, beta float32) {
	kernels.CheckLen("affine", x.N, dst)
	s := floatType("affine", dst, x)
	b.enter()
	defer b.exit()
	kAffine.launch(b, s, b.elems(int64(x.N)), affineArgs{int64(x.N), ptrOf(x), ptrOf(dst), alpha, beta})
}

// bcast is the kernels' struct Bcast (kernels.Broadcast in 32 bits).
type bcast struct {
	ndim          int32
	shape, sa, sb [kernels.MaxDims]int32
}

// Binary computes dst = a op b with broadcasting; a, b and dst share a
// dtype, or dst is F32 and so is one of a and b (binary_mixed reads the
// other as stored).
func (b *Backend) Binary(op kernels.BinaryOp, dst, a, bb kernels.Buf, bc kernels.Broadcast) {
	n := bc.Len()
	kernels.CheckLen("binary "+op.String(), n, dst)
	if n > math.MaxInt32 {
		panic(fmt.Sprintf("cuda: binary of %d elements", n))
	}
	var c bcast
	c.ndim = int32(bc.NDim)
	for i := 0; i < bc.NDim; i++ {
		c.shape[i], c.sa[i], c.sb[i] = int32(bc.Shape[i]), int32(bc.StrideA[i]), int32(bc.StrideB[i])
	}
	if dst.DType == kernels.F32 && a.DType != bb.DType && (a.DType == kernels.F32 || bb.DType == kernels.F32) {
		swap, f32, other := int32(0), a, bb
		if a.DType != kernels.F32 {
			swap, f32, other = 1, bb, a
			c.sa, c.sb = c.sb, c.sa
		}
		s := floatType("binary "+op.String(), other)
		b.enter()
		defer b.exit()
		kBinaryMix.launch(b, s, b.elems(int64(n)), binaryMixedArgs{int32(op), swap, int64(n), c, ptrOf(f32), ptrOf(other), ptrOf(dst)})
		return
	}
	s := floatType("binary "+op.String(), dst, a, bb)
	b.enter()
	defer b.exit()
	kBinary.launch(b, s, b.elems(int64(n)), binaryArgs{int32(op), int64(n), c, ptrOf(a), ptrOf(bb), ptrOf(dst)})
}
