package cuda

import (
	"github.com/leangrad/leangrad/kernels"
)

// Convolutions run on cuDNN when it is present (cudnn.go); otherwise by
// im2col and cuBLAS, in chunks of images whose column matrix fits the
// workspace cap. 1×1, stride-1, unpadded convolutions skip im2col.

// The im2col kernels (conv.cu). The geometry's fields are the kernels'
// leading parameters.
type convGeom struct {
	Nb, C, H, W, R, S, Sh, Sw, Ph, Pw, OH, OW int32
}

type colArgs struct { // im2col: x → col; col2im: col → dx
	convGeom
	In, Out  uintptr
	SN, SCRS int64
}

type nklToKnlArgs struct {
	Nb, K, L int32
	X, Y     uintptr
}

var (
	kIm2col   = declareTyped[colArgs]("im2col")
	kCol2im   = declareTyped[colArgs]("col2im")
	kNklToKnl = declareTyped[nklToKnlArgs]("nkl_to_knl")
)

// channelsFirst runs a direction of a channels-last convolution that
// cuDNN did not take on channels-first copies (kernels.ConvChannelsFirst),
// through conv, the direction's im2col and cuBLAS path (the caller holds
// the lock).
func (b *Backend) channelsFirst(p kernels.ConvParams, ops [3]kernels.Buf, out int, conv func(kernels.ConvParams, [3]kernels.Buf)) {
	temp := func(n int, dt kernels.DType) (kernels.Buf, func()) {
		blk := b.workspace(int64(n * dt.Size()))
		return kernels.Buf{Block: blk, N: n, DType: dt}, func() { b.alloc.Free(blk) }
	}
	tr := func(dst, src kernels.Buf, t kernels.Transposition) { b.transpose(src.DType, dst, src, t) }
	kernels.ConvChannelsFirst(p, ops, out, temp, tr, conv)
}

func geom(p kernels.ConvParams, nb int) convGeom {
	return convGeom{int32(nb), int32(p.C), int32(p.H), int32(p.W), int32(p.R), int32(p.S), int32(p.StrideH), int32(p.StrideW),
		int32(p.PadH), int32(p.PadW), int32(p.OutH()), int32(p.OutW())}
}

func checkConv(op string, p kernels.ConvParams, x, w, y kernels.Buf) kernels.DType {
	kernels.CheckConv(op, p, x, w, y)
	return floatType(op, x, w, y)
}

func direct(p kernels.ConvParams) bool {
	return p.R == 1 && p.S == 1 && p.StrideH == 1 && p.StrideW == 1 && p.PadH == 0 && p.PadW == 0
}

// chunk is how many images' columns (perImage bytes each) fit the cap.
func (b *Backend) chunk(p kernels.ConvParams, perImage int64) int {
	return int(max(1, min(int64(p.N), b.opts.ConvWorkspace/max(perImage, 1))))
}

// im2col gathers images [n0, n0+cnt) into col with the given strides (caller holds the lock).
func (b *Backend) im2col(s kernels.DType, p kernels.ConvParams, n0, cnt int, x kernels.Buf, col uintptr, sN, sCRS int64) {
	es := uintptr(x.DType.Size())
	chw := uintptr(p.C * p.H * p.W)
	kIm2col.launch(b, s, b.elems(int64(cnt)*int64(p.C*p.R*p.S*p.OutH()*p.OutW())),
		colArgs{geom(p, cnt), ptrOf(x) + uintptr(n0)*chw*es, col, sN, sCRS})
}

// Conv2d computes y = w ⊛ x.
func (b *Backend) Conv2d(p kernels.ConvParams, x, w, y kernels.Buf) {
	s := checkConv("conv2d", p, x, w, y)
	b.enter()
	defer b.exit()
	if b.dnn != nil && b.dnnConv(p, x.DType, 0, ptrOf(x), ptrOf(w), ptrOf(y)) {
		return
	}
	if p.ChannelsLast {
		b.channelsFirst(p, [3]kernels.Buf{x, w, y}, 2, func(q kernels.ConvParams, o [3]kernels.Buf) { b.forwardByColumns(s, q, o[0], o[1], o[2]) })
		return
	}
	b.forwardByColumns(s, p, x, w, y)
}

// forwardByColumns is Conv2d by im2col and cuBLAS (the caller holds the lock).
func (b *Backend) forwardByColumns(s kernels.DType, p kernels.ConvParams, x, w, y kernels.Buf) {
	es := int64(x.DType.Size())
	l, crs := p.OutH()*p.OutW(), p.C*p.R*p.S
	g := gemmCall{m: p.K, n: l, k: crs, alpha: 1, a: ptrOf(w), strideA: 0, strideB: int64(crs * l),
		strideC: int64(p.K * l), ab: x.DType, cType: y.DType}
	if direct(p) {
		g.b, g.c, g.batch = ptrOf(x), ptrOf(y), p.N
		b.gemm(g)
		return
	}
	nb := b.chunk(p, int64(crs*l)*es)
	ws := b.workspace(int64(nb*crs*l) * es)
	defer b.alloc.Free(ws)
	for n0 := 0; n0 < p.N; n0 += nb {
		cnt := min(nb, p.N-n0)
		b.im2col(s, p, n0, cnt, x, ws.Addr(), int64(crs*l), int64(l))
		g.b, g.c, g.batch = ws.Addr(), ptrOf(y)+uintptr(int64(n0*p.K*l)*es), cnt
		b.gemm(g)
	}
}

// Conv2dBackwardData computes dx: columns wᵀ·dy per image, then col2im.
func (b *Backend) Conv2dBackwardData(p kernels.ConvParams, dy, w, dx kernels.Buf) {
	s := checkConv("conv2d backward data", p, dx, w, dy)
	b.enter()
	defer b.exit()
	if b.dnn != nil && b.dnnConv(p, dx.DType, 1, ptrOf(w), ptrOf(dy), ptrOf(dx)) {
		return
	}
	if p.ChannelsLast {
		b.channelsFirst(p, [3]kernels.Buf{dx, w, dy}, 0, func(q kernels.ConvParams, o [3]kernels.Buf) { b.dataByColumns(s, q, o[2], o[1], o[0]) })
		return
	}
	b.dataByColumns(s, p, dy, w, dx)
}

// dataByColumns is Conv2dBackwardData by cuBLAS and col2im (the caller
// holds the lock).
func (b *Backend) dataByColumns(s kernels.DType, p kernels.ConvParams, dy, w, dx kernels.Buf) {
	es := int64(dx.DType.Size())
	l, crs := p.OutH()*p.OutW(), p.C*p.R*p.S
	g := gemmCall{transA: true, m: crs, n: l, k: p.K, alpha: 1, a: ptrOf(w), strideA: 0, strideB: int64(p.K * l),
		strideC: int64(crs * l), ab: dy.DType, cType: dx.DType}
	if direct(p) {
		g.b, g.c, g.batch = ptrOf(dy), ptrOf(dx), p.N
		b.gemm(g)
		return
	}
	nb := b.chunk(p, int64(crs*l)*es)
	ws := b.workspace(int64(nb*crs*l) * es)
	defer b.alloc.Free(ws)
	chw := int64(p.C * p.H * p.W)
	for n0 := 0; n0 < p.N; n0 += nb {
		cnt := min(nb, p.N-n0)
		g.b, g.c, g.batch = ptrOf(dy)+uintptr(int64(n0*p.K*l)*es), ws.Addr(), cnt
		b.gemm(g)
		kCol2im.launch(b, s, b.elems(int64(cnt)*chw), colArgs{geom(p, cnt), ws.Addr(), ptrOf(dx) + uintptr(int64(n0)*chw*es),
			int64(crs * l), int64(l)})
	}
}

// Conv2dBackwardFilter computes dw = Σ dy·colᵀ as one product per chunk: the
// chunk's columns are laid out (C·R·S × nb·L) and dy is rearranged to
// (K × nb·L), so the sum over images and pixels is the product's inner
// dimension. Chunks after the first accumulate (β = 1).
func (b *Backend) Conv2dBackwardFilter(p kernels.ConvParams, x, dy, dw kernels.Buf) {
	s := checkConv("conv2d backward filter", p, x, dw, dy)
	b.enter()
	defer b.exit()
	if b.dnn != nil && b.dnnConv(p, x.DType, 2, ptrOf(x), ptrOf(dy), ptrOf(dw)) {
		return
	}
	if p.ChannelsLast {
		b.channelsFirst(p, [3]kernels.Buf{x, dw, dy}, 1, func(q kernels.ConvParams, o [3]kernels.Buf) { b.filterByColumns(s, q, o[0], o[2], o[1]) })
		return
	}
	b.filterByColumns(s, p, x, dy, dw)
}

// filterByColumns is Conv2dBackwardFilter by im2col and cuBLAS (the caller
// holds the lock).
func (b *Backend) filterByColumns(s kernels.DType, p kernels.ConvParams, x, dy, dw kernels.Buf) {
	es := int64(x.DType.Size())
	l, crs := p.OutH()*p.OutW(), p.C*p.R*p.S
	nb := b.chunk(p, int64(crs*l+p.K*l)*es)
	ws := b.workspace(int64(nb*(crs*l+p.K*l)) * es)
	defer b.alloc.Free(ws)
	col, dyT := ws.Addr(), ws.Addr()+uintptr(int64(nb*crs*l)*es)
	for n0 := 0; n0 < p.N; n0 += nb {
		cnt := min(nb, p.N-n0)
		b.im2col(s, p, n0, cnt, x, col, int64(l), int64(cnt*l))
		kNklToKnl.launch(b, s, b.elems(int64(cnt*p.K*l)), nklToKnlArgs{int32(cnt), int32(p.K), int32(l),
			ptrOf(dy) + uintptr(int64(n0*p.K*l)*es), dyT})
		beta := float32(1)
		if n0 == 0 {
			beta = 0
		}
		b.gemm(gemmCall{transB: true, m: p.K, n: crs, k: cnt * l, alpha: 1, beta: beta,
			a: dyT, b: col, c: ptrOf(dw), batch: 1, ab: x.DType, cType: dw.DType})
	}
}
