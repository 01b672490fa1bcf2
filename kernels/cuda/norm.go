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
// running-average update, then the normalisation: three launches.
func (b *Backend) BatchNormTrain(p kernels.BNParams, x, gamma, beta, y, runMean, runVar, saveMean, saveInvStd kernels.Buf) {
	kernels.CheckBN("batch norm", p, x, gamma, beta, runMean, runVar, saveMean, saveInvStd)
	kernels.CheckLen("batch norm output", x.N, y)
	s := floatType("batch norm", x, y)
	b.enter()
	defer b.exit()
	parts := b.partitions(p)
	ws := b.workspace(int64(p.C * parts * 2 * 4))
	defer b.alloc.Free(ws)
	b.kernel().i32(p.N).i32(p.C).i32(p.HW).i32(parts).ptr(ptrOf(x)).ptr(0).ptr(0).ptr(0).ptr(ws.Addr())
	b.launch("bn_partial_"+s, uint32(parts), uint32(p.C), 256)
	b.kernel().i32(p.N).i32(p.C).i32(p.HW).i32(parts).ptr(ptrOf(x)).ptr(ws.Addr()).f32(p.Eps).f32(p.Momentum).
		ptr(ptrOf(saveMean)).ptr(ptrOf(saveInvStd)).ptr(ptrOf(runMean)).ptr(ptrOf(runVar))
	b.launch("bn_stats_"+s, uint32((p.C+255)/256), 1, 256)
	b.kernel().i32(p.C).i32(p.HW).i64(int64(x.N)).ptr(ptrOf(x)).ptr(ptrOf(gamma)).ptr(ptrOf(beta)).
		ptr(ptrOf(saveMean)).ptr(ptrOf(saveInvStd)).ptr(0).f32(p.Eps).ptr(ptrOf(y))
	b.launch("bn_apply_"+s, b.grid(int64(x.N), 256), 1, 256)
}

// BatchNormEval normalises with the running statistics in one launch.
func (b *Backend) BatchNormEval(p kernels.BNParams, x, gamma, beta, runMean, runVar, y kernels.Buf) {
	kernels.CheckBN("batch norm eval", p, x, gamma, beta, runMean, runVar)
	kernels.CheckLen("batch norm eval output", x.N, y)
	s := floatType("batch norm eval", x, y)
	b.enter()
	defer b.exit()
	b.kernel().i32(p.C).i32(p.HW).i64(int64(x.N)).ptr(ptrOf(x)).ptr(ptrOf(gamma)).ptr(ptrOf(beta)).
		ptr(ptrOf(runMean)).ptr(0).ptr(ptrOf(runVar)).f32(p.Eps).ptr(ptrOf(y))
	b.launch("bn_apply_"+s, b.grid(int64(x.N), 256), 1, 256)
}

// BatchNormBackward: partial Σdy and Σdy·x̂, their per-channel totals (dβ,
// dγ), then dx: three launches.
func (b *Backend) BatchNormBackward(p kernels.BNParams, x, dy, gamma, saveMean, saveInvStd, dx, dgamma, dbeta kernels.Buf) {
	kernels.CheckBN("batch norm backward", p, x, gamma, saveMean, saveInvStd, dgamma, dbeta)
	kernels.CheckLen("batch norm backward", x.N, dy, dx)
	s := floatType("batch norm backward", x, dy, dx)
	b.enter()
	defer b.exit()
	parts := b.partitions(p)
	ws := b.workspace(int64(p.C * parts * 2 * 4))
	defer b.alloc.Free(ws)
	b.kernel().i32(p.N).i32(p.C).i32(p.HW).i32(parts).ptr(ptrOf(x)).ptr(ptrOf(dy)).ptr(ptrOf(saveMean)).
		ptr(ptrOf(saveInvStd)).ptr(ws.Addr())
	b.launch("bn_partial_"+s, uint32(parts), uint32(p.C), 256)
	b.kernel().i32(p.C).i32(parts).ptr(ws.Addr()).ptr(ptrOf(dgamma)).ptr(ptrOf(dbeta))
	b.launch("bn_grads", uint32((p.C+255)/256), 1, 256)
	b.kernel().i32(p.N).i32(p.C).i32(p.HW).i64(int64(x.N)).ptr(ptrOf(x)).ptr(ptrOf(dy)).ptr(ptrOf(gamma)).
		ptr(ptrOf(saveMean)).ptr(ptrOf(saveInvStd)).ptr(ptrOf(dgamma)).ptr(ptrOf(dbeta)).ptr(ptrOf(dx))
	b.launch("bn_bwd_apply_"+s, b.grid(int64(x.N), 256), 1, 256)
}
