package cuda

import (
	"github.com/leangrad/leangrad/kernels"
)

// Batch and layer normalisation (kernels.NormOps; norm.cu).

type (
	bnPartialArgs struct {
		N, C, HW, P                int32
		X, Y, Res, Dy, Gamma, Beta uintptr
		ReLU                       int32
		Mean, InvStd, Partial      uintptr
	}
	bnStatsArgs struct {
		N, C, HW, P                   int32
		X, Partial                    uintptr
		Eps, Momentum                 float32
		Mean, InvStd, RunMean, RunVar uintptr
	}
	bnApplyArgs struct {
		C, HW, N                               int32
		X, Res, Gamma, Beta, Mean, InvStd, Var uintptr
		Eps                                    float32
		ReLU                                   int32
		Y                                      uintptr
	}
	bnGradsArgs struct {
		C, P                   int32
		Partial, Dgamma, Dbeta uintptr
	}
	bnBwdApplyArgs struct {
		N, C, HW, Len                         int32
		X, Y, Res, Dy, Gamma, Beta            uintptr
		ReLU                                  int32
		Mean, InvStd, Dgamma, Dbeta, Dx, Dres uintptr
	}
)

var (
	kBNPartial  = declareTyped[bnPartialArgs]("bn_partial")
	kBNRows     = declareTyped[bnPartialArgs]("bn_partial_rows")
	kBNStats    = declareTyped[bnStatsArgs]("bn_stats")
	kBNApply    = declareTyped[bnApplyArgs]("bn_apply")
	kBNGrads    = declareKernel[bnGradsArgs]("bn_grads")
	kBNBwdApply = declareTyped[bnBwdApplyArgs]("bn_bwd_apply")
)

// warpPerChannel is the launch of a kernel with a warp per channel.
func warpPerChannel(c int) dims {
	return dims{uint32((32*c + blockSize - 1) / blockSize), 1, blockSize}
}

// partitions is how many blocks share each channel's reduction: enough for
// about four blocks per multiprocessor, none with fewer than 256 elements.
// A channels-last batch (HW 1) whose channels divide the block is reduced
// by bn_partial_rows, a block for all channels: then about four blocks per
// multiprocessor, none with fewer than 2048 elements.
func (b *Backend) partitions(p kernels.BNParams) int {
	m := p.N * p.HW
	if byRows(p) {
		return max(1, min(4*b.sms, m*p.C/2048))
	}
	return max(1, min((4*b.sms+p.C-1)/p.C, (m+255)/256))
}

// byRows is whether bn_partial_rows reduces p's batch.
func byRows(p kernels.BNParams) bool { return p.HW == 1 && blockSize%p.C == 0 }

// bnPartial launches the partial sums of the forward (dy invalid in a) or
// the backward: parts blocks per channel, or parts blocks for all channels
// where bn_partial_rows takes the batch.
func (b *Backend) bnPartial(s kernels.DType, p kernels.BNParams, parts int, a bnPartialArgs) {
	if byRows(p) {
		kBNRows.launch(b, s, dims{uint32(parts), 1, blockSize}, a)
		return
	}
	kBNPartial.launch(b, s, dims{uint32(parts), uint32(p.C), blockSize}, a)
}

// BatchNormTrain: partial sums (bnPartial), per-channel statistics and
// running-average update, then the normalisation with the residual and the
// ReLU: three launches.
func (b *Backend) BatchNormTrain(p kernels.BNParams, x, residual, gamma, beta, y, runMean, runVar, saveMean, saveInvStd kernels.Buf) {
	kernels.CheckBN("batch norm", p, x, gamma, beta, runMean, runVar, saveMean, saveInvStd)
	kernels.CheckLen("batch norm output", x.N, y)
	kernels.CheckLike("batch norm residual", x, residual)
	s := floatType("batch norm", x, y)
	b.enter()
	defer b.exit()
	parts := b.partitions(p)
	ws := b.workspace(int64(p.C * parts * 2 * 4))
	defer b.alloc.Free(ws)
	n, c, hw, np := int32(p.N), int32(p.C), int32(p.HW), int32(parts)
	b.bnPartial(s, p, parts, bnPartialArgs{N: n, C: c, HW: hw, P: np, X: ptrOf(x), Partial: ws.Addr()})
	kBNStats.launch(b, s, warpPerChannel(p.C), bnStatsArgs{n, c, hw, np, ptrOf(x), ws.Addr(), p.Eps, p.Momentum,
		ptrOf(saveMean), ptrOf(saveInvStd), ptrOf(runMean), ptrOf(runVar)})
	kBNApply.launch(b, s, b.elems(int64(x.N)), bnApplyArgs{c, hw, int32(x.N), ptrOf(x), ptrOf(residual), ptrOf(gamma), ptrOf(beta),
		ptrOf(saveMean), ptrOf(saveInvStd), 0, p.Eps, boolInt(p.ReLU), ptrOf(y)})
}

// BatchNormApply is BatchNormTrain's last launch, from the saved statistics.
func (b *Backend) BatchNormApply(p kernels.BNParams, x, residual, gamma, beta, saveMean, saveInvStd, y kernels.Buf) {
	b.bnApply("batch norm apply", p, x, residual, gamma, beta, saveMean, saveInvStd, kernels.Buf{}, y)
}

// BatchNormEval normalises with the running statistics in one launch.
func (b *Backend) BatchNormEval(p kernels.BNParams, x, residual, gamma, beta, runMean, runVar, y kernels.Buf) {
	b.bnApply("batch norm eval", p, x, residual, gamma, beta, runMean, kernels.Buf{}, runVar, y)
}

// bnApply launches bn_apply alone, with the batch's mean and 1/σ or the
// running mean and variance (the other one invalid).
func (b *Backend) bnApply(op string, p kernels.BNParams, x, residual, gamma, beta, mean, invStd, variance, y kernels.Buf) {
	stats := invStd
	if !stats.Valid() {
		stats = variance
	}
	kernels.CheckBN(op, p, x, gamma, beta, mean, stats)
	kernels.CheckLen(op+" output", x.N, y)
	kernels.CheckLike(op+" residual", x, residual)
	s := floatType(op, x, y)
	b.enter()
	defer b.exit()
	kBNApply.launch(b, s, b.elems(int64(x.N)), bnApplyArgs{int32(p.C), int32(p.HW), int32(x.N), ptrOf(x), ptrOf(residual),
		ptrOf(gamma), ptrOf(beta), ptrOf(mean), ptrOf(invStd), ptrOf(variance), p.Eps, boolInt(p.ReLU), ptrOf(y)})
}

// BatchNormBackward: partial Σg and Σg·x̂ (g: dy masked by the ReLU), their
// per-channel totals (dβ, dγ), then dx and dresidual: three launches.
func (b *Backend) BatchNormBackward(p kernels.BNParams, x, y, residual, dy, gamma, beta, saveMean, saveInvStd, dx, dresidual, dgamma, dbeta kernels.Buf) {
	kernels.CheckBN("batch norm backward", p, x, gamma, saveMean, saveInvStd, dgamma, dbeta)
	kernels.CheckLen("batch norm backward", x.N, dy, dx)
	kernels.CheckLike("batch norm backward residual gradient", dx, dresidual)
	s := floatType("batch norm backward", x, dy, dx)
	again := kernels.CheckBNMask("batch norm backward", p, x, y, residual, beta, dresidual)
	if p.ReLU && !again {
		kernels.CheckLike("batch norm backward output", x, y)
	}
	res := uintptr(0) // the mask's residual, read only without y
	if again {
		res = ptrOf(residual)
	}
	b.enter()
	defer b.exit()
	parts := b.partitions(p)
	ws := b.workspace(int64(p.C * parts * 2 * 4))
	defer b.alloc.Free(ws)
	n, c, hw, np := int32(p.N), int32(p.C), int32(p.HW), int32(parts)
	relu := boolInt(p.ReLU)
	b.bnPartial(s, p, parts, bnPartialArgs{n, c, hw, np, ptrOf(x), ptrOf(y), res, ptrOf(dy),
		ptrOf(gamma), ptrOf(beta), relu, ptrOf(saveMean), ptrOf(saveInvStd), ws.Addr()})
	kBNGrads.launch(b, 0, warpPerChannel(p.C), bnGradsArgs{c, np, ws.Addr(), ptrOf(dgamma), ptrOf(dbeta)})
	kBNBwdApply.launch(b, s, b.elems(int64(x.N)), bnBwdApplyArgs{n, c, hw, int32(x.N), ptrOf(x), ptrOf(y), res, ptrOf(dy), ptrOf(gamma),
		ptrOf(beta), relu, ptrOf(saveMean), ptrOf(saveInvStd), ptrOf(dgamma), ptrOf(dbeta), ptrOf(dx), ptrOf(dresidual)})
}

type layerNormFwdArgs struct {
	Rows, Cols int32
	X, G, B    uintptr
	Eps        float32
	Y, Mean, R uintptr
}

type layerNormBwdArgs struct {
	Rows, Cols                   int32
	X, G, Mean, R, Dy, Dx, Parts uintptr
	Acc                          int32
	Rounded                      uintptr // dx rounded to dy's dtype, or 0
	Sums                         int32   // the partial sums of dx too
}

type layerNormGradsArgs struct {
	Rows, Cols, Splits, Sets int32
	Parts, Dg, Db, Ds        uintptr
	Stride                   int32
}

var (
	kLayerNormFwd = declareTyped[layerNormFwdArgs]("layernorm_fwd")
	kLayerNormBwd = declareTyped[layerNormBwdArgs]("layernorm_bwd")
)

// The mixed ones take an F32 x (and dx) with y (and dy) of their type.
var (
	kLayerNormFwdMixed = declareTyped[layerNormFwdArgs]("layernorm_fwd_mixed")
	kLayerNormBwdMixed = declareTyped[layerNormBwdArgs]("layernorm_bwd_mixed")
	kLayerNormGrads    = declareKernel[layerNormGradsArgs]("layernorm_grads")
)

// lnWarps is the warps per block of the layer-norm kernels and
// lnBlocksPerSM the blocks a multiprocessor holds at once (their launch
// bounds); lnBlocks the blocks, a fixed number per device, all at once
// (the backward's partial sums are a row per block, or per warp for rows
// longer than lnRegCols, so their count, and the order of the sums,
// depends on the device alone). One wave rather
// than two halves the backward's partial sums: on the H200 at 16384×768
// the backward with its sums took 0.089 ms against 0.096.
const (
	lnWarps       = 8
	lnBlocksPerSM = 2
)

// lnRegCols is the longest row the layer-norm kernels keep in registers
// (32 values a lane): their backward adds its sums a block at a time for
// such rows, a warp at a time for longer ones (LN_REG_COLS).
const lnRegCols = 1024

// lnSplits is how many stretches of its rows of partial sums the
// layer-norm backward adds first, side by side.
const lnSplits = 32

func (b *Backend) lnBlocks(rows int) int {
	return max(1, min((rows+lnWarps-1)/lnWarps, lnBlocksPerSM*b.sms))
}

// LayerNorm normalises a row per warp.
func (b *Backend) LayerNorm(p kernels.LayerNormParams, x, gamma, beta, y, mean, rstd kernels.Buf) {
	kernels.CheckLayerNorm("layer norm", p, x, gamma, mean, rstd, y)
	kernels.CheckLen("layer norm bias", p.Cols, beta)
	kernels.CheckF32("layer norm bias", beta)
	k, s := kLayerNormFwd, floatType("layer norm", x)
	if y.DType != x.DType {
		k, s = kLayerNormFwdMixed, y.DType
	}
	b.enter()
	defer b.exit()
	k.launch(b, s, dims{uint32(b.lnBlocks(p.Rows)), 1, 32 * lnWarps}, layerNormFwdArgs{int32(p.Rows), int32(p.Cols),
		ptrOf(x), ptrOf(gamma), ptrOf(beta), p.Eps, ptrOf(y), ptrOf(mean), ptrOf(rstd)})
}

// LayerNormBackward computes dx a row per warp, the sums for dγ and dβ
// (and, with p.Sums, dx's column sums) in a row of a workspace for each
// block (each warp, for rows longer than lnRegCols), summed over the rows
// in order.
func (b *Backend) LayerNormBackward(p kernels.LayerNormParams, x, gamma, mean, rstd, dy, dx, dgamma, dbeta kernels.Buf) {
	kernels.CheckLayerNorm("layer norm backward", p, x, gamma, mean, rstd, dy, dx)
	kernels.CheckLike("layer norm backward dx", x, dx)
	kernels.CheckLen("layer norm backward gradients", p.Cols, dgamma, dbeta)
	kernels.CheckF32("layer norm backward gradients", dgamma, dbeta)
	kernels.CheckLayerNormRounded("layer norm backward", p, dy, dx)
	k, s := kLayerNormBwd, floatType("layer norm backward", x, dx)
	if dy.DType != x.DType {
		k, s = kLayerNormBwdMixed, dy.DType
	}
	b.enter()
	defer b.exit()
	blocks := b.lnBlocks(p.Rows)
	parts := blocks * lnWarps // rows of partial sums
	if p.Cols <= lnRegCols {
		parts = blocks
	}
	sets := int64(2) // dγ's and dβ's partial sums, and dx's for Sums
	if p.Sums.Valid() {
		sets = 3
	}
	row := sets * int64(p.Cols) // floats
	ws := b.workspace(int64(parts) * row * 4)
	defer b.alloc.Free(ws)
	k.launch(b, s, dims{uint32(blocks), 1, 32 * lnWarps}, layerNormBwdArgs{int32(p.Rows), int32(p.Cols),
		ptrOf(x), ptrOf(gamma), ptrOf(mean), ptrOf(rstd), ptrOf(dy), ptrOf(dx), ws.Addr(), boolInt(p.Accumulate), ptrOf(p.Rounded),
		boolInt(p.Sums.Valid())})
	// The rows' sums in two rounds: stretches of rows side by side, then
	// the stretches in order.
	sums, splits := ws.Addr(), parts
	if parts > 4*lnSplits {
		part := b.workspace(int64(lnSplits) * row * 4)
		defer b.alloc.Free(part)
		at := func(set int) uintptr { return part.Addr() + uintptr(set*p.Cols*4) }
		kLayerNormGrads.launch(b, 0, dims{uint32((p.Cols + 31) / 32), lnSplits, 256},
			layerNormGradsArgs{int32(parts), int32(p.Cols), lnSplits, int32(sets), ws.Addr(), at(0), at(1), at(2), int32(row)})
		sums, splits = part.Addr(), lnSplits
	}
	kLayerNormGrads.launch(b, 0, dims{uint32((p.Cols + 31) / 32), 1, 256},
		layerNormGradsArgs{int32(splits), int32(p.Cols), 1, int32(sets), sums, ptrOf(dgamma), ptrOf(dbeta), ptrOf(p.Sums), 0})
}
