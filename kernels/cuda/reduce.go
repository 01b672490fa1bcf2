package cuda

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels"
)

// The reductions (kernels.ReduceOps; reduce.cu).

type reduceRowsArgs struct {
	Op, Outer, Len int32
	X, Y           uintptr
}

type reduceColsArgs struct {
	Op, Outer, Len, Inner int32
	X, Y                  uintptr
}

type reduceColsSplitArgs struct {
	Op, Outer, Len, Inner, Splits int32
	OutF32                        int32 // Y is F32 whatever X's dtype
	X, Part, Done, Y              uintptr
}

type reduceMaxBwdArgs struct {
	Len, Inner   int32
	N            int64
	Dy, X, Y, Dx uintptr
}

type argmaxArgs struct {
	Outer, Len, Inner int32
	X, Y              uintptr
}

var (
	kReduceRows   = declareTyped[reduceRowsArgs]("reduce_rows")
	kReduceCols   = declareTyped[reduceColsArgs]("reduce_cols")
	kReduceColsS  = declareTyped[reduceColsSplitArgs]("reduce_cols_split")
	kReduceColsS4 = declareTyped[reduceColsSplitArgs]("reduce_cols_split4")
	kReduceMaxBwd = declareTyped[reduceMaxBwdArgs]("reduce_max_bwd")
	kArgmax       = declareTyped[argmaxArgs]("argmax")
)

// Reduce reduces along the middle axis: a block per row when the axis is
// innermost, a thread per output when there are outputs enough to fill the
// device, and otherwise the axis split into stretches that blocks reduce
// to partials, the last block of each tile of outputs combining them in
// order (reduce_cols_split).
func (b *Backend) Reduce(op kernels.ReduceOp, dst, x kernels.Buf, r kernels.Reduction) {
	kernels.CheckReduction("reduce "+op.String(), r, x, dst)
	floatType("reduce "+op.String(), dst, x)
	b.enter()
	defer b.exit()
	b.reduce(op, dst, x, r)
}

// reduce is Reduce for a checked call (the caller holds the lock), dst of
// x's dtype or, where x is 16-bit, F32: the split columns write it
// directly, the other paths through a scratch of x's dtype and a cast.
func (b *Backend) reduce(op kernels.ReduceOp, dst, x kernels.Buf, r kernels.Reduction) {
	s := x.DType
	outputs := r.Outer * r.Inner
	fill := b.sms * 2048 // threads the device runs at once
	splits := min((r.Len+63)/64, fill/(8*outputs))
	if r.Inner > 1 && splits >= 2 {
		// Four columns a lane where the rows allow, the axis in up to four
		// times as many stretches, so that as many blocks fill the device,
		// but each of at least 512 rows: more, shorter stretches wait
		// longer than they read (on the H200, 16384 bf16 rows of 768, 2304
		// and 3072 columns took 24.2, 34.7 and 39.9 µs in 176, 56 and 44
		// stretches, 20.4, 33.2 and 38.5 in 32).
		k, vec := kReduceColsS, 1
		if r.Inner%4 == 0 && ptrOf(x)%uintptr(4*x.DType.Size()) == 0 {
			k, vec = kReduceColsS4, 4
			splits = max(1, min((r.Len+511)/512, 4*splits))
		}
		tiles := (r.Inner + 32*vec - 1) / (32 * vec)
		if tiles*r.Outer > b.reduceDone.n {
			panic(fmt.Sprintf("cuda: reduce of %+v: %d tiles of outputs, %d counters", r, tiles*r.Outer, b.reduceDone.n))
		}
		part := b.workspace(int64(splits*outputs) * 4)
		defer b.alloc.Free(part)
		outF32 := int32(0)
		if dst.DType != s {
			outF32 = 1
		}
		k.launch(b, s, dims{uint32(tiles * splits), uint32(r.Outer), 32 * 8},
			reduceColsSplitArgs{int32(op), int32(r.Outer), int32(r.Len), int32(r.Inner), int32(splits), outF32,
				ptrOf(x), part.Addr(), b.reduceDone.addr, ptrOf(dst)})
		return
	}
	if dst.DType != s {
		blk := b.workspace(int64(dst.N * s.Size()))
		defer b.alloc.Free(blk)
		scratch := kernels.Buf{Block: blk, N: dst.N, DType: s}
		b.reduce(op, scratch, x, r)
		b.cast(dst, scratch)
		return
	}
	if r.Inner == 1 {
		threads := min(blockSize, (r.Len+31)/32*32)
		kReduceRows.launch(b, s, dims{uint32(min(r.Outer, 1<<16)), 1, uint32(threads)},
			reduceRowsArgs{int32(op), int32(r.Outer), int32(r.Len), ptrOf(x), ptrOf(dst)})
		return
	}
	kReduceCols.launch(b, s, b.elems(int64(outputs)),
		reduceColsArgs{int32(op), int32(r.Outer), int32(r.Len), int32(r.Inner), ptrOf(x), ptrOf(dst)})
}

// ReduceMaxBackward routes dy to the elements equal to their maximum.
func (b *Backend) ReduceMaxBackward(dx, dy, x, y kernels.Buf, r kernels.Reduction) {
	kernels.CheckReduction("reduce max backward", r, x, dy)
	kernels.CheckLen("reduce max backward", x.N, dx)
	kernels.CheckLen("reduce max backward", dy.N, y)
	s := floatType("reduce max backward", dx, dy, x, y)
	b.enter()
	defer b.exit()
	kReduceMaxBwd.launch(b, s, b.elems(int64(x.N)),
		reduceMaxBwdArgs{int32(r.Len), int32(r.Inner), int64(x.N), ptrOf(dy), ptrOf(x), ptrOf(y), ptrOf(dx)})
}

// ArgMax writes the index of the first maximum along the middle axis.
func (b *Backend) ArgMax(dst, x kernels.Buf, r kernels.Reduction) {
	kernels.CheckReduction("argmax", r, x, dst)
	if dst.DType != kernels.I32 {
		panic("cuda: argmax into a " + dst.DType.String() + " buffer")
	}
	s := floatType("argmax", x)
	b.enter()
	defer b.exit()
	kArgmax.launch(b, s, b.elems(int64(r.Outer*r.Inner)), argmaxArgs{int32(r.Outer), int32(r.Len), int32(r.Inner), ptrOf(x), ptrOf(dst)})
}
