package cuda

import (
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
)

// Note [cuDNN's attention]: where cuDNN is loaded, a causal attention
// with as many queries as keys runs as cuDNN's graphs, forward and
// backward, built with cuDNN's backend API: the graphs cuDNN's C++
// frontend makes of its scaled-dot-product attention for cuDNN before
// 9.21 (which we cannot link), whose fused flash-attention engines cuDNN
// picks for them. The forward: s = q·kᵀ (F32), s·scale, the causal mask
// (the row and column indices, row ≥ column, and -∞ elsewhere by a binary
// select), the softmax with its statistics (the rows' maxima, exp(s −
// max), their sums, max + log sum: the log-sum-exp the backward reads,
// which the flash kernels' forward writes too), the probabilities in the
// operands' dtype, and o = p·v. The backward: Σ do·o a row, p again from
// q·kᵀ and the log-sum-exp, dv = pᵀ·do, ds = p·(do·vᵀ − Σ do·o)·scale, dk
// = dsᵀ·q and dq = ds·k through an F32 accumulator (cuDNN 9.6 or later,
// which clears it itself). q, k, v, o and their gradients keep their
// strides (k's and v's transposed by their strides), so c_attn's packed
// output and its packed gradient are read and written in place. Each
// direction's plan for a shape is built once (cuDNN compiles its kernels
// then: most of a second a shape on the H200), the first engine
// configuration of cuDNN's heuristic that finalizes, and never while a
// graph is being captured (a shape first seen then takes the flash
// kernels, whose results differ from cuDNN's in the last bits); the other
// shapes, and any cuDNN refuses, keep the flash
// kernels, with the reason kept (Backend.DNNAttention).

// The backend API's enums (cudnn_graph.h).
const (
	dnnPointwiseDesc   = 0
	dnnEngineCfgDesc   = 3
	dnnEngineHeurDesc  = 4
	dnnPlanDesc        = 5
	dnnOpPointwiseDesc = 13
	dnnOpGraphDesc     = 15
	dnnVariantPackDesc = 16
	dnnTensorDesc      = 17
	dnnMatmulDesc      = 18
	dnnOpMatmulDesc    = 19
	dnnReductionDesc   = 21
	dnnOpReductionDesc = 22
	dnnOpReshapeDesc   = 31

	dnnTypeHandle     = 0
	dnnTypeDataType   = 1
	dnnTypeBoolean    = 2
	dnnTypeInt64      = 3
	dnnTypeVoidPtr    = 6
	dnnTypeHeurMode   = 8
	dnnTypePointwise  = 14
	dnnTypeDescriptor = 15
	dnnTypeReduceOp   = 18

	dnnAttrPointwiseMode     = 0
	dnnAttrPointwisePrec     = 1
	dnnAttrPointwiseAxis     = 9
	dnnAttrHeurMode          = 200
	dnnAttrHeurGraph         = 201
	dnnAttrHeurResults       = 202
	dnnAttrPlanHandle        = 400
	dnnAttrPlanConfig        = 401
	dnnAttrPlanWorkspace     = 402
	dnnAttrOpPointwiseDesc   = 750
	dnnAttrOpPointwiseX      = 751
	dnnAttrOpPointwiseB      = 752
	dnnAttrOpPointwiseY      = 753
	dnnAttrOpPointwiseT      = 758
	dnnAttrGraphHandle       = 800
	dnnAttrGraphOps          = 801
	dnnAttrTensorAlignment   = 900
	dnnAttrTensorDataType    = 901
	dnnAttrTensorDims        = 902
	dnnAttrTensorStrides     = 903
	dnnAttrTensorUID         = 906
	dnnAttrTensorVirtual     = 907
	dnnAttrTensorByValue     = 908
	dnnAttrPackUIDs          = 1000
	dnnAttrPackPointers      = 1001
	dnnAttrPackWorkspace     = 1003
	dnnAttrMatmulCompType    = 1500
	dnnAttrOpMatmulA         = 1520
	dnnAttrOpMatmulB         = 1521
	dnnAttrOpMatmulC         = 1522
	dnnAttrOpMatmulDesc      = 1523
	dnnAttrReductionOperator = 1600
	dnnAttrReductionCompType = 1601
	dnnAttrOpReductionX      = 1610
	dnnAttrOpReductionY      = 1611
	dnnAttrOpReductionDesc   = 1612
	dnnAttrOpReshapeX        = 2200
	dnnAttrOpReshapeY        = 2201

	dnnDataInt32   = 4
	dnnDataBoolean = 11

	dnnPwAdd          = 0
	dnnPwMul          = 1
	dnnPwDiv          = 6
	dnnPwSub          = 9
	dnnPwExp          = 13
	dnnPwLog          = 15
	dnnPwIdentity     = 21
	dnnPwCmpGE        = 303
	dnnPwGenIndex     = 501
	dnnPwBinarySelect = 601

	dnnReduceAdd = 0
	dnnReduceMax = 3

	dnnHeurModeA = 3
)

// dnnGraph builds backend descriptors, keeping the first error and every
// descriptor made, for free.
type dnnGraph struct {
	c    *cudnnAPI
	made []uintptr
	err  error
}

// check keeps r as g's error, named by what, unless g has one already.
func (g *dnnGraph) check(what string, r cudnnStatus) {
	if g.err == nil {
		g.err = g.c.check(what, r)
	}
}

// desc creates a descriptor of type typ.
func (g *dnnGraph) desc(typ int32) uintptr {
	var d uintptr
	if g.err != nil {
		return 0
	}
	g.check(fmt.Sprintf("cudnnBackendCreateDescriptor(%d)", typ), g.c.backendCreate(typ, unsafe.Pointer(&d)))
	if g.err == nil {
		g.made = append(g.made, d)
	}
	return d
}

// set sets attribute name of d to the n values of type typ at p.
func (g *dnnGraph) set(d uintptr, name, typ int32, n int, p unsafe.Pointer) {
	if g.err != nil {
		return
	}
	g.check(fmt.Sprintf("cudnnBackendSetAttribute(%d)", name), g.c.backendSetAttribute(d, name, typ, int64(n), p))
}

// setInt, setEnum and setDesc set an attribute of d to one value: an
// int64, an enum of attribute type typ, or a descriptor.
func (g *dnnGraph) setInt(d uintptr, name int32, v int64) {
	g.set(d, name, dnnTypeInt64, 1, unsafe.Pointer(&v))
}
func (g *dnnGraph) setEnum(d uintptr, name, typ, v int32) { g.set(d, name, typ, 1, unsafe.Pointer(&v)) }
func (g *dnnGraph) setDesc(d uintptr, name int32, v uintptr) {
	g.set(d, name, dnnTypeDescriptor, 1, unsafe.Pointer(&v))
}

// finalize finalizes d, what naming it in an error.
func (g *dnnGraph) finalize(d uintptr, what string) {
	if g.err == nil {
		g.check("cudnnBackendFinalize("+what+")", g.c.backendFinalize(d))
	}
}

// tensor is a finalized tensor descriptor: uid, data type dt (cuDNN's),
// 4-D dims and strides (elements); virtual tensors live only inside the
// fused kernel, and byValue ones are host scalars.
func (g *dnnGraph) tensor(uid int64, dt int32, dims, strides [4]int64, virtual, byValue bool) uintptr {
	d := g.desc(dnnTensorDesc)
	g.setInt(d, dnnAttrTensorUID, uid)
	g.setEnum(d, dnnAttrTensorDataType, dnnTypeDataType, dt)
	g.setInt(d, dnnAttrTensorAlignment, 16)
	g.set(d, dnnAttrTensorDims, dnnTypeInt64, 4, unsafe.Pointer(&dims[0]))
	g.set(d, dnnAttrTensorStrides, dnnTypeInt64, 4, unsafe.Pointer(&strides[0]))
	if virtual {
		v := true
		g.set(d, dnnAttrTensorVirtual, dnnTypeBoolean, 1, unsafe.Pointer(&v))
	}
	if byValue {
		v := true
		g.set(d, dnnAttrTensorByValue, dnnTypeBoolean, 1, unsafe.Pointer(&v))
	}
	g.finalize(d, "tensor")
	return d
}

// pointwise is the operation y = mode(x, b, t) (b and t 0 where the mode
// takes fewer operands) computed in prec, along axis where GEN_INDEX.
func (g *dnnGraph) pointwise(mode, prec int32, axis int64, x, b, t, y uintptr) uintptr {
	pw := g.desc(dnnPointwiseDesc)
	g.setEnum(pw, dnnAttrPointwiseMode, dnnTypePointwise, mode)
	g.setEnum(pw, dnnAttrPointwisePrec, dnnTypeDataType, prec)
	if mode == dnnPwGenIndex {
		g.setInt(pw, dnnAttrPointwiseAxis, axis)
	}
	g.finalize(pw, "pointwise")
	op := g.desc(dnnOpPointwiseDesc)
	g.setDesc(op, dnnAttrOpPointwiseDesc, pw)
	g.setDesc(op, dnnAttrOpPointwiseX, x)
	if b != 0 {
		g.setDesc(op, dnnAttrOpPointwiseB, b)
	}
	if t != 0 {
		g.setDesc(op, dnnAttrOpPointwiseT, t)
	}
	g.setDesc(op, dnnAttrOpPointwiseY, y)
	g.finalize(op, fmt.Sprintf("pointwise operation %d", mode))
	return op
}

// matmul is the operation c = a·b, batched over the first two dims, in F32.
func (g *dnnGraph) matmul(a, b, c uintptr) uintptr {
	mm := g.desc(dnnMatmulDesc)
	g.setEnum(mm, dnnAttrMatmulCompType, dnnTypeDataType, cudnnDataFloat)
	g.finalize(mm, "matmul")
	op := g.desc(dnnOpMatmulDesc)
	g.setDesc(op, dnnAttrOpMatmulA, a)
	g.setDesc(op, dnnAttrOpMatmulB, b)
	g.setDesc(op, dnnAttrOpMatmulC, c)
	g.setDesc(op, dnnAttrOpMatmulDesc, mm)
	g.finalize(op, "matmul operation")
	return op
}

// reduction is the operation y = op(x) over the dims where y has 1, in F32.
func (g *dnnGraph) reduction(op int32, x, y uintptr) uintptr {
	r := g.desc(dnnReductionDesc)
	g.setEnum(r, dnnAttrReductionOperator, dnnTypeReduceOp, op)
	g.setEnum(r, dnnAttrReductionCompType, dnnTypeDataType, cudnnDataFloat)
	g.finalize(r, "reduction")
	o := g.desc(dnnOpReductionDesc)
	g.setDesc(o, dnnAttrOpReductionX, x)
	g.setDesc(o, dnnAttrOpReductionY, y)
	g.setDesc(o, dnnAttrOpReductionDesc, r)
	g.finalize(o, "reduction operation")
	return o
}

// reshape is the operation y = x seen through y's dims and strides.
func (g *dnnGraph) reshape(x, y uintptr) uintptr {
	op := g.desc(dnnOpReshapeDesc)
	g.setDesc(op, dnnAttrOpReshapeX, x)
	g.setDesc(op, dnnAttrOpReshapeY, y)
	g.finalize(op, "reshape operation")
	return op
}

// plan finalizes the operation graph of ops and returns the execution
// plan of the first of cuDNN's heuristic's engine configurations that
// finalizes, and its workspace bytes.
func (g *dnnGraph) plan(handle uintptr, ops []uintptr) (uintptr, int64) {
	graph := g.desc(dnnOpGraphDesc)
	g.set(graph, dnnAttrGraphHandle, dnnTypeHandle, 1, unsafe.Pointer(&handle))
	g.set(graph, dnnAttrGraphOps, dnnTypeDescriptor, len(ops), unsafe.Pointer(&ops[0]))
	g.finalize(graph, "operation graph")
	heur := g.desc(dnnEngineHeurDesc)
	g.setDesc(heur, dnnAttrHeurGraph, graph)
	g.setEnum(heur, dnnAttrHeurMode, dnnTypeHeurMode, dnnHeurModeA)
	g.finalize(heur, "engine heuristic")
	if g.err != nil {
		return 0, 0
	}
	var n int64
	g.check("cudnnBackendGetAttribute(engine heuristic results, count)",
		g.c.backendGetAttribute(heur, dnnAttrHeurResults, dnnTypeDescriptor, 0, unsafe.Pointer(&n), nil))
	if g.err == nil && n == 0 {
		g.err = fmt.Errorf("cuDNN's heuristic has no engine for the graph")
	}
	if g.err != nil {
		return 0, 0
	}
	cfgs := make([]uintptr, n)
	for i := range cfgs {
		cfgs[i] = g.desc(dnnEngineCfgDesc)
	}
	g.check("cudnnBackendGetAttribute(engine heuristic results)",
		g.c.backendGetAttribute(heur, dnnAttrHeurResults, dnnTypeDescriptor, n, unsafe.Pointer(&n), unsafe.Pointer(&cfgs[0])))
	if g.err != nil {
		return 0, 0
	}
	var last error
	for _, cfg := range cfgs[:n] {
		plan := g.desc(dnnPlanDesc)
		g.set(plan, dnnAttrPlanHandle, dnnTypeHandle, 1, unsafe.Pointer(&handle))
		g.setDesc(plan, dnnAttrPlanConfig, cfg)
		if g.err != nil {
			return 0, 0
		}
		if err := g.c.check("cudnnBackendFinalize(execution plan)", g.c.backendFinalize(plan)); err != nil {
			last = err
			continue
		}
		var ws, got int64
		g.check("cudnnBackendGetAttribute(workspace size)",
			g.c.backendGetAttribute(plan, dnnAttrPlanWorkspace, dnnTypeInt64, 1, unsafe.Pointer(&got), unsafe.Pointer(&ws)))
		return plan, ws
	}
	g.err = fmt.Errorf("none of cuDNN's %d engine configurations finalized: %w", n, last)
	return 0, 0
}

// free destroys every descriptor made.
func (g *dnnGraph) free() error {
	err := destroyDescs(g.c, g.made)
	g.made = nil
	return err
}

// destroyDescs destroys the backend descriptors ds, returning the first error.
func destroyDescs(c *cudnnAPI, ds []uintptr) error {
	var first error
	for _, d := range ds {
		if err := c.check("cudnnBackendDestroyDescriptor", c.backendDestroy(d)); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// dnnAttnKey is a direction, shape and layout of attention.
type dnnAttnKey struct {
	backward                       bool
	dt                             kernels.DType
	b, h, t, d                     int
	qRow, kRow, vRow, oRow         int
	qBatch, kBatch, vBatch, oBatch int
}

// dnnAttnPlan is a key's execution plan and workspace, or why cuDNN has
// none, and the descriptors the plan was built from, destroyed with it.
type dnnAttnPlan struct {
	plan    uintptr
	ws      int64
	refused string
	descs   []uintptr
}

// The graphs' tensors' unique ids: the ones the variant packs name, then
// the virtual ones.
const (
	uidQ = iota + 1
	uidK
	uidV
	uidO
	uidStats
	uidScale
	uidNegInf
	uidDO
	uidDQ
	uidDK
	uidDV
	uidOne
	uidRowDot  // the backward's Σ do·o of each row, F32
	uidDQAccum // the backward's F32 dq before its rounding
	uidVirtual = 100
)

// dnnAttnPlanFor returns key's plan, building it on first use (the caller
// holds the lock; nil while capturing a graph before the plan exists).
func (b *Backend) dnnAttnPlanFor(key dnnAttnKey) *dnnAttnPlan {
	if pl, ok := b.dnnAttn[key]; ok {
		return pl
	}
	if b.capturing {
		return nil
	}
	a := &attnGraph{dnnGraph: dnnGraph{c: b.dnn}, k: key, uid: uidVirtual}
	var ops []uintptr
	if key.backward {
		ops = a.backward()
	} else {
		ops = a.forward()
	}
	var plan uintptr
	var ws int64
	if a.err == nil {
		plan, ws = a.plan(b.dnnHandle, ops)
	}
	pl := &dnnAttnPlan{plan: plan, ws: ws, descs: a.made}
	if a.err != nil {
		pl.refused = a.err.Error()
		if err := a.free(); err != nil {
			pl.refused += "; " + err.Error()
		}
		pl.descs = nil
	}
	b.dnnAttn[key] = pl
	return pl
}

// attnGraph builds the graphs of Note [cuDNN's attention] for k.
type attnGraph struct {
	dnnGraph
	k   dnnAttnKey
	uid int64 // the last virtual tensor's
}

// dt is the operands' cuDNN data type.
func (a *attnGraph) dt() int32 {
	if a.k.dt == kernels.F16 {
		return cudnnDataHalf
	}
	return cudnnDataBF16
}

// operand is a [B, H, T, D] operand of a's dtype with rows row and
// batches batch elements apart, or (transposed) its [B, H, D, T] view;
// a virtual one takes the next virtual uid.
func (a *attnGraph) operand(uid int64, row, batch int, transposed, virtual bool) uintptr {
	B, H, T, D := int64(a.k.b), int64(a.k.h), int64(a.k.t), int64(a.k.d)
	if virtual {
		a.uid++
		uid = a.uid
	}
	if transposed {
		return a.tensor(uid, a.dt(), [4]int64{B, H, D, T}, [4]int64{int64(batch), D, 1, int64(row)}, virtual, false)
	}
	return a.tensor(uid, a.dt(), [4]int64{B, H, T, D}, [4]int64{int64(batch), D, int64(row), 1}, virtual, false)
}

// virtual is a new virtual tensor of type dt.
func (a *attnGraph) virtual(dt int32, dims, strides [4]int64) uintptr {
	a.uid++
	return a.tensor(a.uid, dt, dims, strides, true, false)
}

// scores is a virtual [B, H, T, T] tensor of type dt, row-major or (transposed) column-major.
func (a *attnGraph) scores(dt int32, transposed bool) uintptr {
	B, H, T := int64(a.k.b), int64(a.k.h), int64(a.k.t)
	if transposed {
		return a.virtual(dt, [4]int64{B, H, T, T}, [4]int64{H * T * T, T * T, 1, T})
	}
	return a.virtual(dt, [4]int64{B, H, T, T}, [4]int64{H * T * T, T * T, T, 1})
}

// rows is a [B, H, T, 1] F32 tensor: uid's, or virtual when uid is 0.
func (a *attnGraph) rows(uid int64) uintptr {
	B, H, T := int64(a.k.b), int64(a.k.h), int64(a.k.t)
	dims, strides := [4]int64{B, H, T, 1}, [4]int64{H * T, T, 1, 1}
	if uid == 0 {
		return a.virtual(cudnnDataFloat, dims, strides)
	}
	return a.tensor(uid, cudnnDataFloat, dims, strides, false, false)
}

// scalar is an F32 scalar passed by value.
func (a *attnGraph) scalar(uid int64) uintptr {
	one := [4]int64{1, 1, 1, 1}
	return a.tensor(uid, cudnnDataFloat, one, one, false, true)
}

// causal returns s with -∞ where a key follows its query, and the operations.
func (a *attnGraph) causal(s uintptr) (uintptr, []uintptr) {
	f32 := int32(cudnnDataFloat)
	row, col := a.scores(dnnDataInt32, false), a.scores(dnnDataInt32, false)
	seen, masked := a.scores(dnnDataBoolean, false), a.scores(f32, false)
	return masked, []uintptr{a.pointwise(dnnPwGenIndex, f32, 2, s, 0, 0, row), a.pointwise(dnnPwGenIndex, f32, 3, s, 0, 0, col),
		a.pointwise(dnnPwCmpGE, dnnDataBoolean, 0, row, col, 0, seen),
		a.pointwise(dnnPwBinarySelect, f32, 0, s, a.scalar(uidNegInf), seen, masked)}
}

// forward is the forward graph's operations.
func (a *attnGraph) forward() []uintptr {
	k, f32 := a.k, int32(cudnnDataFloat)
	q, kt := a.operand(uidQ, k.qRow, k.qBatch, false, false), a.operand(uidK, k.kRow, k.kBatch, true, false)
	v, o := a.operand(uidV, k.vRow, k.vBatch, false, false), a.operand(uidO, k.oRow, k.oBatch, false, false)
	s, scaled := a.scores(f32, false), a.scores(f32, false)
	ops := []uintptr{a.matmul(q, kt, s), a.pointwise(dnnPwMul, f32, 0, s, a.scalar(uidScale), 0, scaled)}
	masked, mask := a.causal(scaled)
	ops = append(ops, mask...)
	mx, sum, lg := a.rows(0), a.rows(0), a.rows(0)
	sub, ex := a.scores(f32, false), a.scores(f32, false)
	p := a.scores(a.dt(), false) // the probabilities in the operands' dtype, as the second product reads them
	return append(ops, a.reduction(dnnReduceMax, masked, mx), a.pointwise(dnnPwSub, f32, 0, masked, mx, 0, sub),
		a.pointwise(dnnPwExp, f32, 0, sub, 0, 0, ex), a.reduction(dnnReduceAdd, ex, sum),
		a.pointwise(dnnPwLog, f32, 0, sum, 0, 0, lg), a.pointwise(dnnPwAdd, f32, 0, mx, lg, 0, a.rows(uidStats)),
		a.pointwise(dnnPwDiv, f32, 0, ex, sum, 0, p), a.matmul(p, v, o))
}

// backward is the backward graph's operations: p recomputed from the
// log-sum-exp, dv = pᵀ·do, ds = p·(do·vᵀ − Σ do·o)·scale, dk = dsᵀ·q and
// dq = ds·k, dq through an F32 accumulator (uidDQAccum) and Σ do·o kept
// in uidRowDot, both given by the caller, as the frontend's graph has them.
func (a *attnGraph) backward() []uintptr {
	k, f32 := a.k, int32(cudnnDataFloat)
	B, H, T, D := int64(k.b), int64(k.h), int64(k.t), int64(k.d)
	q, kt := a.operand(uidQ, k.qRow, k.qBatch, false, false), a.operand(uidK, k.kRow, k.kBatch, true, false)
	vt, o := a.operand(uidV, k.vRow, k.vBatch, true, false), a.operand(uidO, k.oRow, k.oBatch, false, false)
	do := a.operand(uidDO, k.oRow, k.oBatch, false, false)
	dq, dk := a.operand(uidDQ, k.qRow, k.qBatch, false, false), a.operand(uidDK, k.kRow, k.kBatch, false, false)
	dv := a.operand(uidDV, k.vRow, k.vBatch, false, false)
	scale, stats := a.scalar(uidScale), a.rows(uidStats)

	prod := a.virtual(f32, [4]int64{B, H, T, D}, [4]int64{H * T * D, T * D, H * D, 1})
	dot, rowDot := a.rows(0), a.rows(uidRowDot)
	ops := []uintptr{a.pointwise(dnnPwMul, f32, 0, do, o, 0, prod), a.reduction(dnnReduceAdd, prod, dot),
		a.pointwise(dnnPwMul, f32, 0, dot, a.scalar(uidOne), 0, rowDot)}

	s, scaled, centred := a.scores(f32, false), a.scores(f32, false), a.scores(f32, false)
	ops = append(ops, a.matmul(q, kt, s), a.pointwise(dnnPwMul, f32, 0, s, scale, 0, scaled),
		a.pointwise(dnnPwSub, f32, 0, scaled, stats, 0, centred))
	masked, mask := a.causal(centred)
	ops = append(ops, mask...)
	p, pt := a.scores(f32, false), a.scores(a.dt(), true)
	ops = append(ops, a.pointwise(dnnPwExp, f32, 0, masked, 0, 0, p), a.reshape(p, pt), a.matmul(pt, do, dv))

	dp, dpc, ds, dss := a.scores(f32, false), a.scores(f32, false), a.scores(f32, false), a.scores(f32, false)
	dst := a.scores(a.dt(), true)
	ops = append(ops, a.matmul(do, vt, dp), a.pointwise(dnnPwSub, f32, 0, dp, rowDot, 0, dpc),
		a.pointwise(dnnPwMul, f32, 0, dpc, p, 0, ds), a.pointwise(dnnPwMul, f32, 0, ds, scale, 0, dss),
		a.reshape(dss, dst), a.matmul(dst, q, dk))

	kr := a.operand(0, k.kRow, k.kBatch, false, true)
	acc := a.tensor(uidDQAccum, f32, [4]int64{B, H, T, D}, [4]int64{H * T * D, T * D, D, 1}, false, false)
	return append(ops, a.reshape(kt, kr), a.matmul(dss, kr, acc), a.pointwise(dnnPwIdentity, f32, 0, acc, 0, 0, dq))
}

// dnnAttention runs Attention's forward as cuDNN's graph (Note [cuDNN's
// attention]) and reports whether it did: F16 or BF16, as many
// queries as keys, the flash kernels' layout conditions (the caller's
// b.flash), cuDNN loaded and not b.noDNNAttn.
func (b *Backend) dnnAttention(p kernels.AttentionParams, s kernels.DType, q, k, v, o, lse kernels.Buf) bool {
	return b.dnnAttnRun(false, p, s, map[int64]uintptr{uidQ: ptrOf(q), uidK: ptrOf(k), uidV: ptrOf(v), uidO: ptrOf(o),
		uidStats: ptrOf(lse)})
}

// dnnAttentionBackward is dnnAttention for AttentionBackward; cuDNN 9.6
// or later (before, the frontend clears the F32 dq first).
func (b *Backend) dnnAttentionBackward(p kernels.AttentionParams, s kernels.DType, q, k, v, o, lse, do, dq, dk, dv kernels.Buf) bool {
	if b.dnn == nil || b.dnn.version < 90600 {
		return false
	}
	return b.dnnAttnRun(true, p, s, map[int64]uintptr{uidQ: ptrOf(q), uidK: ptrOf(k), uidV: ptrOf(v), uidO: ptrOf(o),
		uidStats: ptrOf(lse), uidDO: ptrOf(do), uidDQ: ptrOf(dq), uidDK: ptrOf(dk), uidDV: ptrOf(dv)})
}

// dnnAttnRun runs the graph of p in direction backward on the tensors
// ptrs names, with the scalars and the backward's F32 buffers added, and
// reports whether it did.
func (b *Backend) dnnAttnRun(backward bool, p kernels.AttentionParams, s kernels.DType, ptrs map[int64]uintptr) bool {
	if b.dnn == nil || b.noDNNAttn || p.Tq != p.Tk {
		return false
	}
	pl := b.dnnAttnPlanFor(dnnAttnKey{backward: backward, dt: s, b: p.B, h: p.H, t: p.Tq, d: p.D, qRow: p.QRow, kRow: p.KRow,
		vRow: p.VRow, oRow: p.ORow, qBatch: p.QBatch, kBatch: p.KBatch, vBatch: p.VBatch, oBatch: p.OBatch})
	if pl == nil || pl.refused != "" {
		return false
	}
	w := &scratch{b: b}
	defer w.release()
	space := w.addr
	var ws uintptr
	if pl.ws > 0 {
		ws = space(pl.ws)
	}
	if backward {
		rows := int64(p.B * p.H * p.Tq)
		ptrs[uidRowDot], ptrs[uidDQAccum] = space(rows*4), space(rows*int64(p.D)*4)
	}
	// The scalars go by value: cuDNN reads them from host memory during
	// the call, from a heap object, which does not move.
	scalars := &[3]float32{p.Scale, float32(math.Inf(-1)), 1}
	ptrs[uidScale], ptrs[uidNegInf] = uintptr(unsafe.Pointer(&scalars[0])), uintptr(unsafe.Pointer(&scalars[1]))
	if backward {
		ptrs[uidOne] = uintptr(unsafe.Pointer(&scalars[2]))
	}
	uids, addrs := make([]int64, 0, len(ptrs)), make([]uintptr, 0, len(ptrs))
	for u, a := range ptrs {
		uids, addrs = append(uids, u), append(addrs, a)
	}
	g := &dnnGraph{c: b.dnn}
	pack := g.desc(dnnVariantPackDesc)
	g.set(pack, dnnAttrPackUIDs, dnnTypeInt64, len(uids), unsafe.Pointer(&uids[0]))
	g.set(pack, dnnAttrPackPointers, dnnTypeVoidPtr, len(addrs), unsafe.Pointer(&addrs[0]))
	g.set(pack, dnnAttrPackWorkspace, dnnTypeVoidPtr, 1, unsafe.Pointer(&ws))
	g.finalize(pack, "variant pack")
	if g.err == nil {
		what := "forward"
		if backward {
			what = "backward"
		}
		b.queued("cudnn attention " + what + " " + s.String())
		g.check("cudnnBackendExecute(attention "+what+")", b.dnn.backendExecute(b.dnnHandle, pl.plan, pack))
	}
	runtime.KeepAlive(scalars)
	if err := g.free(); g.err == nil {
		g.err = err
	}
	if g.err != nil {
		panic(g.err)
	}
	return true
}

// DNNAttention says whether cuDNN's graphs ran the attentions of the
// shapes seen so far: each direction and shape's refusal, or "" when
// every one ran.
func (b *Backend) DNNAttention() string {
	b.enter()
	defer b.exit()
	if b.dnn == nil {
		return "cuDNN is not loaded: " + b.dnnReason
	}
	msg := ""
	for k, pl := range b.dnnAttn {
		if pl.refused != "" {
			msg += fmt.Sprintf("%+v: %s; ", k, pl.refused)
		}
	}
	return msg
}

// AttnEngine names what runs causal attention: of F16 and BF16 operands,
// cuDNN's graphs and the version (Note [cuDNN's attention]), the flash
// kernels for what they do not take; of F32 ones, the F32 flash kernels;
// the chunked path (cuBLAS and a softmax kernel) for the rest.
func (b *Backend) AttnEngine() string {
	if !b.tensorCores {
		return "the chunked path (no tensor cores for the flash kernels)"
	}
	const f32 = "; F32: flash kernels, three TF32 products each"
	if b.dnn == nil {
		return "flash kernels (cuDNN is not loaded: " + b.dnnReason + ")" + f32
	}
	v := b.dnn.version
	dirs := "forward and backward"
	if v < 90600 {
		dirs = "forward"
	}
	return fmt.Sprintf("cuDNN %d.%d.%d graphs (%s) where queries and keys are as many, else flash kernels%s",
		v/10000, v/100%100, v%100, dirs, f32)
}
