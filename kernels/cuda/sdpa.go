package cuda

import (
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
)

// Note [cuDNN's attention forward]: where cuDNN is loaded, a causal
// attention's forward with as many queries as keys runs as one cuDNN
// graph, built with cuDNN's backend API: the graph cuDNN's C++ frontend
// makes of its scaled-dot-product attention for cuDNN before 9.21 (which
// we cannot link), whose fused flash-attention engine cuDNN picks for it.
// Its nodes: s = q·kᵀ (F32), s·scale, the causal mask (the row and column
// indices, row ≥ column, and -∞ elsewhere by a binary select), the
// softmax with its statistics (the rows' maxima, exp(s − max), their sums,
// max + log sum: the log-sum-exp the backward reads, which the flash
// kernels' forward writes too), the probabilities in the operands' dtype,
// and o = p·v. q, k, v and o keep their strides (k's transposed by its
// strides), so c_attn's packed output is read in place. The backward stays
// the flash kernels' (cuDNN 9.14, the GPU machine's, has no backward
// operation of its own, and the frontend's backward graph is not built
// here). Each shape's plan is built once, the first engine configuration
// of cuDNN's heuristic that finalizes, and never while a graph is being
// captured (a shape first seen then takes the flash kernels); a shape
// cuDNN refuses keeps the flash kernels, with the reason kept
// (Backend.DNNAttention).

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

	dnnDataInt32   = 4
	dnnDataBoolean = 11

	dnnPwAdd          = 0
	dnnPwMul          = 1
	dnnPwDiv          = 6
	dnnPwSub          = 9
	dnnPwExp          = 13
	dnnPwLog          = 15
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

func (g *dnnGraph) setInt(d uintptr, name int32, v int64) {
	g.set(d, name, dnnTypeInt64, 1, unsafe.Pointer(&v))
}
func (g *dnnGraph) setEnum(d uintptr, name, typ, v int32) { g.set(d, name, typ, 1, unsafe.Pointer(&v)) }
func (g *dnnGraph) setDesc(d uintptr, name int32, v uintptr) {
	g.set(d, name, dnnTypeDescriptor, 1, unsafe.Pointer(&v))
}

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

// dnnAttnKey is a shape and layout of attention forward.
type dnnAttnKey struct {
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

// The graph's tensors' unique ids: the ones the variant pack names, then
// the virtual ones.
const (
	uidQ = iota + 1
	uidK
	uidV
	uidO
	uidStats
	uidScale
	uidNegInf
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
	g := &dnnGraph{c: b.dnn}
	plan, ws := buildAttnForward(g, b.dnnHandle, key)
	pl := &dnnAttnPlan{plan: plan, ws: ws, descs: g.made}
	if g.err != nil {
		pl.refused = g.err.Error()
		if err := g.free(); err != nil {
			pl.refused += "; " + err.Error()
		}
		pl.descs = nil
	}
	b.dnnAttn[key] = pl
	return pl
}

// buildAttnForward builds the forward graph of Note [cuDNN's attention
// forward] for key and returns its plan.
func buildAttnForward(g *dnnGraph, handle uintptr, k dnnAttnKey) (uintptr, int64) {
	dt := int32(cudnnDataBF16)
	if k.dt == kernels.F16 {
		dt = cudnnDataHalf
	}
	B, H, T, D := int64(k.b), int64(k.h), int64(k.t), int64(k.d)
	q := g.tensor(uidQ, dt, [4]int64{B, H, T, D}, [4]int64{int64(k.qBatch), D, int64(k.qRow), 1}, false, false)
	kt := g.tensor(uidK, dt, [4]int64{B, H, D, T}, [4]int64{int64(k.kBatch), D, 1, int64(k.kRow)}, false, false)
	v := g.tensor(uidV, dt, [4]int64{B, H, T, D}, [4]int64{int64(k.vBatch), D, int64(k.vRow), 1}, false, false)
	o := g.tensor(uidO, dt, [4]int64{B, H, T, D}, [4]int64{int64(k.oBatch), D, int64(k.oRow), 1}, false, false)
	rowDims, rowStrides := [4]int64{B, H, T, 1}, [4]int64{H * T, T, 1, 1}
	stats := g.tensor(uidStats, cudnnDataFloat, rowDims, rowStrides, false, false)
	one := [4]int64{1, 1, 1, 1}
	scale := g.tensor(uidScale, cudnnDataFloat, one, one, false, true)
	negInf := g.tensor(uidNegInf, cudnnDataFloat, one, one, false, true)
	uid := int64(uidVirtual)
	virtual := func(dt int32, dims, strides [4]int64) uintptr {
		uid++
		return g.tensor(uid, dt, dims, strides, true, false)
	}
	sDims, sStrides := [4]int64{B, H, T, T}, [4]int64{H * T * T, T * T, T, 1}
	score := func() uintptr { return virtual(cudnnDataFloat, sDims, sStrides) }
	rowVec := func() uintptr { return virtual(cudnnDataFloat, rowDims, rowStrides) }
	f32 := int32(cudnnDataFloat)

	s := score()
	ops := []uintptr{g.matmul(q, kt, s)}
	scaled := score()
	ops = append(ops, g.pointwise(dnnPwMul, f32, 0, s, scale, 0, scaled))
	row, col := virtual(dnnDataInt32, sDims, sStrides), virtual(dnnDataInt32, sDims, sStrides)
	ops = append(ops, g.pointwise(dnnPwGenIndex, f32, 2, scaled, 0, 0, row), g.pointwise(dnnPwGenIndex, f32, 3, scaled, 0, 0, col))
	seen := virtual(dnnDataBoolean, sDims, sStrides)
	ops = append(ops, g.pointwise(dnnPwCmpGE, dnnDataBoolean, 0, row, col, 0, seen))
	masked := score()
	ops = append(ops, g.pointwise(dnnPwBinarySelect, f32, 0, scaled, negInf, seen, masked))
	mx := rowVec()
	ops = append(ops, g.reduction(dnnReduceMax, masked, mx))
	sub, ex := score(), score()
	ops = append(ops, g.pointwise(dnnPwSub, f32, 0, masked, mx, 0, sub), g.pointwise(dnnPwExp, f32, 0, sub, 0, 0, ex))
	sum, lg := rowVec(), rowVec()
	ops = append(ops, g.reduction(dnnReduceAdd, ex, sum), g.pointwise(dnnPwLog, f32, 0, sum, 0, 0, lg))
	ops = append(ops, g.pointwise(dnnPwAdd, f32, 0, mx, lg, 0, stats))
	p := virtual(dt, sDims, sStrides) // the probabilities in the operands' dtype, as the second product reads them
	ops = append(ops, g.pointwise(dnnPwDiv, f32, 0, ex, sum, 0, p))
	ops = append(ops, g.matmul(p, v, o))
	if g.err != nil {
		return 0, 0
	}
	return g.plan(handle, ops)
}

// dnnAttention runs Attention's forward as cuDNN's graph (Note [cuDNN's
// attention forward]) and reports whether it did: F16 or BF16, as many
// queries as keys, the flash kernels' layout conditions (the caller's
// b.flash), cuDNN loaded and not b.noDNNAttn.
func (b *Backend) dnnAttention(p kernels.AttentionParams, s kernels.DType, q, k, v, o, lse kernels.Buf) bool {
	if b.dnn == nil || b.noDNNAttn || p.Tq != p.Tk {
		return false
	}
	pl := b.dnnAttnPlanFor(dnnAttnKey{dt: s, b: p.B, h: p.H, t: p.Tq, d: p.D, qRow: p.QRow, kRow: p.KRow, vRow: p.VRow,
		oRow: p.ORow, qBatch: p.QBatch, kBatch: p.KBatch, vBatch: p.VBatch, oBatch: p.OBatch})
	if pl == nil || pl.refused != "" {
		return false
	}
	var ws uintptr
	if pl.ws > 0 {
		blk := b.workspace(pl.ws)
		defer b.alloc.Free(blk)
		ws = blk.Addr()
	}
	// The scalars go by value: cuDNN reads them from host memory during
	// the call, from a heap object, which does not move.
	scalars := &[2]float32{p.Scale, float32(math.Inf(-1))}
	uids := [...]int64{uidQ, uidK, uidV, uidO, uidStats, uidScale, uidNegInf}
	ptrs := [...]uintptr{ptrOf(q), ptrOf(k), ptrOf(v), ptrOf(o), ptrOf(lse),
		uintptr(unsafe.Pointer(&scalars[0])), uintptr(unsafe.Pointer(&scalars[1]))}
	g := &dnnGraph{c: b.dnn}
	pack := g.desc(dnnVariantPackDesc)
	g.set(pack, dnnAttrPackUIDs, dnnTypeInt64, len(uids), unsafe.Pointer(&uids[0]))
	g.set(pack, dnnAttrPackPointers, dnnTypeVoidPtr, len(ptrs), unsafe.Pointer(&ptrs[0]))
	g.set(pack, dnnAttrPackWorkspace, dnnTypeVoidPtr, 1, unsafe.Pointer(&ws))
	g.finalize(pack, "variant pack")
	if g.err == nil {
		b.queued("cudnn attention forward " + s.String())
		g.check("cudnnBackendExecute(attention forward)", b.dnn.backendExecute(b.dnnHandle, pl.plan, pack))
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

// DNNAttention says whether cuDNN's graph ran the attention forwards of
// the shapes seen so far: each shape's refusal, or "" when every one ran.
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
