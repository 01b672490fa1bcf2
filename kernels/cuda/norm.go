package cuda

import (
	"github.com/leangrad/leangrad/kernels"
)

// partitions is how many blocks share each channel's reduction: enough for
// about four blocks per multiprocessor, none with fewer than 256 elements.
func (b *Backend) partitions(p kernels.BNParams) int {
	m := p.N * p.HW
	return max(1, min((4*b.sms+p.C-1)/p.C, (m+255)/256))
}

// BatchNormTrain: partial sums over a (P, C) grid, per-channel statistics and
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
	b.kernel().i32(p.N).i32(p.C).i32(p.HW).i32(parts).ptr(ptrOf(x)).ptr(0).ptr(0).ptr(0).ptr(0).ptr(ws.Addr())
	b.launch("bn_partial_"+s, uint32(parts), uint32(p.C), 256)
	b.kernel().i32(p.N).i32(p.C).i32(p.HW).i32(parts).ptr(ptrOf(x)).ptr(ws.Addr()).f32(p.Eps).f32(p.Momentum).
		ptr(ptrOf(saveMean)).ptr(ptrOf(saveInvStd)).ptr(ptrOf(runMean)).ptr(ptrOf(runVar))
	b.launch("bn_stats_"+s, uint32((p.C+255)/256), 1, 256)
	b.kernel().i32(p.C).i32(p.HW).i32(x.N).ptr(ptrOf(x)).ptr(ptrOf(residual)).ptr(ptrOf(gamma)).ptr(ptrOf(beta)).
		ptr(ptrOf(saveMean)).ptr(ptrOf(saveInvStd)).ptr(0).f32(p.Eps).i32(boolInt(p.ReLU)).ptr(ptrOf(y))
	b.launch("bn_apply_"+s, b.grid(int64(x.N), 256), 1, 256)
}

// BatchNormEval normalises with the running statistics in one launch.
func (b *Backend) BatchNormEval(p kernels.BNParams, x, residual, gamma, beta, runMean, runVar, y kernels.Buf) {
	kernels.CheckBN("batch norm eval", p, x, gamma, beta, runMean, runVar)
	kernels.CheckLen("batch norm eval output", x.N, y)
	kernels.CheckLike("batch norm eval residual", x, residual)
	s := floatType("batch norm eval", x, y)
	b.enter()
	defer b.exit()
	b.kernel().i32(p.C).i32(p.HW).i32(x.N).ptr(ptrOf(x)).ptr(ptrOf(residual)).ptr(ptrOf(gamma)).ptr(ptrOf(beta)).
		ptr(ptrOf(runMean)).ptr(0).ptr(ptrOf(runVar)).f32(p.Eps).i32(boolInt(p.ReLU)).ptr(ptrOf(y))
	b.launch("bn_apply_"+s, b.grid(int64(x.N), 256), 1, 256)
}

// BatchNormBackward: partial Σg and Σg·x̂ (g: dy masked by the ReLU), their
// per-channel totals (dβ, dγ), then dx and dresidual: three launches.
func (b *Backend) BatchNormBackward(p kernels.BNParams, x, y, dy, gamma, saveMean, saveInvStd, dx, dresidual, dgamma, dbeta kernels.Buf) {
	kernels.CheckBN("batch norm backward", p, x, gamma, saveMean, saveInvStd, dgamma, dbeta)
	kernels.CheckLen("batch norm backward", x.N, dy, dx)
	kernels.CheckLike("batch norm backward residual gradient", dx, dresidual)
	s := floatType("batch norm backward", x, dy, dx)
	var yp uintptr
	if p.ReLU {
		kernels.CheckLike("batch norm backward output", x, y)
		yp = ptrOf(y)
	}
	b.enter()
	defer b.exit()
	parts := b.partitions(p)
	ws := b.workspace(int64(p.C * parts * 2 * 4))
	defer b.alloc.Free(ws)
	b.kernel().i32(p.N).i32(p.C).i32(p.HW).i32(parts).ptr(ptrOf(x)).ptr(yp).ptr(ptrOf(dy)).ptr(ptrOf(saveMean)).
		ptr(ptrOf(saveInvStd)).ptr(ws.Addr())
	b.launch("bn_partial_"+s, uint32(parts), uint32(p.C), 256)
	b.kernel().i32(p.C).i32(parts).ptr(ws.Addr()).ptr(ptrOf(dgamma)).ptr(ptrOf(dbeta))
	b.launch("bn_grads", uint32((p.C+255)/256), 1, 256)
	b.kernel().i32(p.N).i32(p.C).i32(p.HW).i32(x.N).ptr(ptrOf(x)).ptr(yp).ptr(ptrOf(dy)).ptr(ptrOf(gamma)).
		ptr(ptrOf(saveMean)).ptr(ptrOf(saveInvStd)).ptr(ptrOf(dgamma)).ptr(ptrOf(dbeta)).ptr(ptrOf(dx)).ptr(ptrOf(dresidual))
	b.launch("bn_bwd_apply_"+s, b.grid(int64(x.N), 256), 1, 256)
}
