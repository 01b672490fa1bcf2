package cuda

import (
	"fmt"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
)

// cuBLASLt, bound at run time: every single 16-bit product, with its
// epilogue (kernels.Epilogue) or none. A product's descriptors and
// algorithm (Note [products' algorithms timed]) are made once per shape,
// strides, alignment and epilogue (ltPlan) and reused; only the pointers
// are set per call, so a step's products cost the host no more than
// cublasGemmEx's and are captured the same way.
//
// Note [the fused epilogues]: cuBLASLt fuses a bias, GELU in its tanh
// form with its input written to an auxiliary matrix, and GELU's
// derivative from that matrix into the product's own kernel. A 16-bit
// product's bias is of its dtype (cuBLASLt's heuristic refuses an F32 one
// with CUBLAS_STATUS_INVALID_VALUE on the H200 with cuBLAS 13, even with
// CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE set to it): an F32 bias is cast
// into a scratch vector first, one small launch, as PyTorch's autocast
// casts it, unless the caller gives it in C's dtype (autograd's copies,
// cast with the weights at once). cuBLASLt can also fuse the bias gradients (BGRADB,
// DGELU_BGRAD), but they are not fused by default (ltSums): on the H200
// (BenchmarkCUDAGemmEpilogues, GPT-2 small's shapes in BF16, the timed
// algorithms, each time with the column sums of reduce_cols when unfused)
// the c_proj input gradient through GELU′ took 432 µs with DGELU_BGRAD
// against 165 µs with DGELU, and the weight gradients with BGRADB 137, 114
// and 112 µs against 121, 105 and 104 µs (c_fc, c_attn, mlp.c_proj),
// faster only for attn.c_proj's 768×768 (47 against 49 µs); BGRADB also
// has no algorithm unless A is transposed. With strict F32 operands GELU′
// runs unfused: there the same product took 1945 µs with DGELU and 1854
// unfused, the other epilogues still paying for themselves
// (c_fc's bias and GELU 1707 against 1744, attn.c_proj's residual 408
// against 463). What cuBLASLt does not fuse (another activation, N not a
// multiple of 8 with GELU's auxiliary matrix, strict F32's GELU′), a shape
// its heuristic has no algorithm for, or a machine without the library
// runs the product with cublasGemmEx and the epilogue as one pass of
// gemm_epilogue over C: the same results within
// rounding, one more pass. A residual is cuBLASLt's C, read with β = 1,
// and our C its D: a transformer block's residual add costs no pass of
// its own, and its F32 D takes the F32 bias as it is (no scratch cast);
// unfused, C is first a copy of the residual.

// cuBLASLt's enums (cublasLt.h).
const (
	ltDescTransA      = 3
	ltDescTransB      = 4
	ltDescEpilogue    = 7
	ltDescBiasPointer = 8
	ltDescAuxPointer  = 11
	ltDescAuxLD       = 12

	ltPrefAlignA    = 5 // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES; B, C, D follow
	ltPrefWorkspace = 1

	ltEpilogueDefault    = 1
	ltEpilogueBias       = 4
	ltEpilogueGELUAux    = 160
	ltEpilogueGELUAuxB   = 164 // GELU_AUX_BIAS
	ltEpilogueDGELU      = 192
	ltEpilogueDGELUBGrad = 208
	ltEpilogueBGradB     = 512
)

// ltHeuristic is cublasLtMatmulHeuristicResult_t.
type ltHeuristic struct {
	algo      [8]uint64
	workspace uintptr
	state     int32
	waves     float32
	reserved  [4]int32
}

// cublasLtAPI is libcublasLt's functions; see Note [typed bindings].
type cublasLtAPI struct {
	name string // the file bound

	create        func(handle unsafe.Pointer) cublasStatus
	destroy       func(handle uintptr) cublasStatus
	descCreate    func(desc unsafe.Pointer, compute, scale int32) cublasStatus
	descDestroy   func(desc uintptr) cublasStatus
	descSet       func(desc uintptr, attr int32, buf unsafe.Pointer, size uintptr) cublasStatus
	layoutCreate  func(layout unsafe.Pointer, dt int32, rows, cols uint64, ld int64) cublasStatus
	layoutDestroy func(layout uintptr) cublasStatus
	prefCreate    func(pref unsafe.Pointer) cublasStatus
	prefDestroy   func(pref uintptr) cublasStatus
	prefSet       func(pref uintptr, attr int32, buf unsafe.Pointer, size uintptr) cublasStatus
	heuristic     func(handle, desc, a, b, c, d, pref uintptr, requested int32, results unsafe.Pointer, returned unsafe.Pointer) cublasStatus
	matmul        func(handle, desc uintptr, alpha unsafe.Pointer, a, aDesc, b, bDesc uintptr, beta unsafe.Pointer, c, cDesc, d, dDesc uintptr, algo unsafe.Pointer, ws, wsSize, stream uintptr) cublasStatus
}

func (c *cublasLtAPI) symbols() []symbol {
	return []symbol{
		fn1("cublasLtCreate", &c.create), fn1("cublasLtDestroy", &c.destroy),
		fn3("cublasLtMatmulDescCreate", &c.descCreate), fn1("cublasLtMatmulDescDestroy", &c.descDestroy),
		fn4("cublasLtMatmulDescSetAttribute", &c.descSet),
		fn5("cublasLtMatrixLayoutCreate", &c.layoutCreate), fn1("cublasLtMatrixLayoutDestroy", &c.layoutDestroy),
		fn1("cublasLtMatmulPreferenceCreate", &c.prefCreate), fn1("cublasLtMatmulPreferenceDestroy", &c.prefDestroy),
		fn4("cublasLtMatmulPreferenceSetAttribute", &c.prefSet),
		fn10("cublasLtMatmulAlgoGetHeuristic", &c.heuristic),
		fn16("cublasLtMatmul", &c.matmul),
	}
}

func (c *cublasLtAPI) init(lib *library) error { c.name = lib.name; return nil }

var cublasLtLib = loader[*cublasLtAPI]{what: "cuBLASLt (libcublasLt, from the CUDA toolkit or pip's nvidia-cublas)",
	names:       []string{"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"},
	constructor: func() *cublasLtAPI { return new(cublasLtAPI) }}

// ltKey is what a product's descriptors and algorithm depend on.
type ltKey struct {
	transA, transB bool
	m, n, k        int
	lda, ldb, ldc  int // the operands' row strides
	ab, c          kernels.DType
	epilogue       int32
	tf32           bool
	align          [4]uint8 // log2 of the alignment (up to 256 bytes) of A, B, C and the bias or aux pointer
}

// ltPlan is a product's descriptors and algorithms, or why cuBLASLt has none.
type ltPlan struct {
	desc, a, b, d uintptr
	algos         []ltHeuristic // the heuristic's candidates, its favourite first
	algo          int           // the candidate the product runs
	settled       bool          // algo is final: timed, or first run while capturing
	refused       string        // non-empty: run unfused
}

// ltCandidates is how many of its heuristic's algorithms cuBLASLt is asked
// for, and ltMargin how much faster than the heuristic's favourite another
// must run to replace it (Note [products' algorithms timed]).
const (
	ltCandidates = 8
	ltMargin     = 0.03
)

// ltEpilogue maps e onto one of cuBLASLt's epilogues, fusing the bias
// gradients too with sums (Note [the fused epilogues]); fused says which
// of e's bias gradients it fuses, and why, when non-empty, why there is
// nothing for cuBLASLt to do. strict says g's F32 products are strict F32.
func ltEpilogue(g gemmCall, e kernels.Epilogue, sums, strict bool) (epi int32, fused bool, why string) {
	switch {
	case e.Act != 0 && e.Act != kernels.GELU:
		return 0, false, "cuBLASLt fuses only GELU"
	case e.Act != 0 && g.n%8 != 0:
		return 0, false, "GELU's auxiliary matrix needs N a multiple of 8"
	case e.Grad && g.ab == kernels.F32 && strict:
		return 0, false, "strict F32's GELU′ runs faster unfused"
	case e.Grad && sums && e.BiasGrad.Valid():
		return ltEpilogueDGELUBGrad, true, ""
	case e.Grad:
		return ltEpilogueDGELU, false, ""
	case e.Act != 0 && e.Bias.Valid():
		return ltEpilogueGELUAuxB, false, ""
	case e.Act != 0:
		return ltEpilogueGELUAux, false, ""
	case e.Bias.Valid():
		return ltEpilogueBias, false, ""
	case e.Residual.Valid():
		return ltEpilogueDefault, false, ""
	case sums && g.transA && e.BiasGradA.Valid() && !e.BiasGrad.Valid(): // cuBLAS's B is our A (gemm's Note)
		return ltEpilogueBGradB, true, ""
	}
	return ltEpilogueDefault, false, ""
}

// alignLog2 is log2 of the largest power of two, up to 256, dividing addr.
func alignLog2(addr uintptr) uint8 {
	var l uint8
	for l < 8 && addr&(1<<l) == 0 {
		l++
	}
	return l
}

// ltPlanFor returns the plan of key, making it on first use (the caller
// holds the lock). vec and aux are the call's bias (or bias gradient) and
// auxiliary pointers (0: none), set before the heuristic runs, which
// checks their alignment.
func (b *Backend) ltPlanFor(key ltKey, vec, aux uintptr) *ltPlan {
	if pl, ok := b.ltPlans[key]; ok {
		return pl
	}
	lt := b.lt
	pl := &ltPlan{}
	b.ltPlans[key] = pl
	fail := func(what string, r cublasStatus) bool {
		if r == 0 {
			return false
		}
		pl.refused = b.cb.check(what, r).Error()
		return true
	}
	compute := int32(cublasComputeF32)
	if key.tf32 {
		compute = cublasComputeF32FastTF32
	}
	if fail("cublasLtMatmulDescCreate", lt.descCreate(unsafe.Pointer(&pl.desc), compute, cudaR32F)) {
		return pl
	}
	set := func(attr int32, v int32) bool {
		return fail("cublasLtMatmulDescSetAttribute", lt.descSet(pl.desc, attr, unsafe.Pointer(&v), 4))
	}
	// Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLAS's
	// A is our B and its B our A (gemm's Note), C is N×M with ld N.
	opA, opB := int32(cublasOpN), int32(cublasOpN)
	aRows, aCols, bRows, bCols := key.n, key.k, key.k, key.m
	if key.transB {
		opA, aRows, aCols = cublasOpT, key.k, key.n
	}
	if key.transA {
		opB, bRows, bCols = cublasOpT, key.m, key.k
	}
	if set(ltDescTransA, opA) || set(ltDescTransB, opB) || set(ltDescEpilogue, key.epilogue) {
		return pl
	}
	if vec != 0 && fail("cublasLtMatmulDescSetAttribute", lt.descSet(pl.desc, ltDescBiasPointer, unsafe.Pointer(&vec), 8)) {
		return pl
	}
	if aux != 0 {
		ld := int64(key.ldc)
		if fail("cublasLtMatmulDescSetAttribute", lt.descSet(pl.desc, ltDescAuxPointer, unsafe.Pointer(&aux), 8)) ||
			fail("cublasLtMatmulDescSetAttribute", lt.descSet(pl.desc, ltDescAuxLD, unsafe.Pointer(&ld), 8)) {
			return pl
		}
	}
	ta, tc := cudaType(key.ab), cudaType(key.c)
	if fail("cublasLtMatrixLayoutCreate", lt.layoutCreate(unsafe.Pointer(&pl.a), ta, uint64(aRows), uint64(aCols), int64(key.ldb))) ||
		fail("cublasLtMatrixLayoutCreate", lt.layoutCreate(unsafe.Pointer(&pl.b), ta, uint64(bRows), uint64(bCols), int64(key.lda))) ||
		fail("cublasLtMatrixLayoutCreate", lt.layoutCreate(unsafe.Pointer(&pl.d), tc, uint64(key.n), uint64(key.m), int64(key.ldc))) {
		return pl
	}
	var pref uintptr
	if fail("cublasLtMatmulPreferenceCreate", lt.prefCreate(unsafe.Pointer(&pref))) {
		return pl
	}
	defer lt.prefDestroy(pref)
	ws := uint64(b.blasWSBytes)
	if fail("cublasLtMatmulPreferenceSetAttribute", lt.prefSet(pref, ltPrefWorkspace, unsafe.Pointer(&ws), 8)) {
		return pl
	}
	// cuBLAS's A, B, C and D are our B, A, C and C.
	for i, al := range []uint8{key.align[1], key.align[0], key.align[2], key.align[2]} {
		bytes := uint32(1) << al
		if fail("cublasLtMatmulPreferenceSetAttribute", lt.prefSet(pref, ltPrefAlignA+int32(i), unsafe.Pointer(&bytes), 4)) {
			return pl
		}
	}
	var found int32
	pl.algos = make([]ltHeuristic, ltCandidates)
	if fail("cublasLtMatmulAlgoGetHeuristic", lt.heuristic(b.ltHandle, pl.desc, pl.a, pl.b, pl.d, pl.d, pref, ltCandidates,
		unsafe.Pointer(&pl.algos[0]), unsafe.Pointer(&found))) {
		return pl
	}
	pl.algos = pl.algos[:found]
	if found == 0 {
		pl.refused = "cuBLASLt's heuristic has no algorithm for it"
	}
	return pl
}

// ltOperands are one call's device pointers: cuBLASLt's B and A (our a and
// b, gemm's Note), C (the residual, or d) and D.
type ltOperands struct{ a, b, c, d uintptr }

// ltMatmul queues the product of pl on x with its candidate i (the caller
// has set b.alpha and b.beta).
func (b *Backend) ltMatmul(pl *ltPlan, i int, x ltOperands) cublasStatus {
	return b.lt.matmul(b.ltHandle, pl.desc, unsafe.Pointer(&b.alpha), x.b, pl.a, x.a, pl.b, unsafe.Pointer(&b.beta),
		x.c, pl.d, x.d, pl.d, unsafe.Pointer(&pl.algos[i].algo), b.blasWS.Addr(), b.blasWSBytes, b.stream)
}

// Note [products' algorithms timed]: cuBLASLt's heuristic ranks its
// algorithms by a model of the device, and its favourite is not always the
// fastest: on the H200, for GPT-2 small's products with a bias and a
// residual (73 µs against 44), GELU's derivative (146 against 132) and the
// classifier's logits (523 against 445; BenchmarkCUDAGemmCandidates). A
// plan's first call outside a capture therefore times the heuristic's
// first ltCandidates on the call's own operands (each once to warm up,
// then ltTimedRuns times between two events) and keeps the fastest, but
// the heuristic's favourite unless another is faster by ltMargin, so that
// close calls, which timing noise could flip from one process to the
// next, keep one answer. This is
// what PyTorch's TunableOp does for its products. The candidates write the
// call's D, which the chosen algorithm then writes again; a call whose D is
// also its C (a residual added in place, β = 1) cannot be repeated and
// keeps the favourite, as does a plan first run while capturing. Once
// settled a plan's algorithm never changes, so an eager step and its
// captured graph run the same one and give the same bits.

// ltTimedRuns is how many times each candidate runs between its events.
const ltTimedRuns = 3

// ltSettle chooses pl's algorithm by timing its candidates on x (Note
// [products' algorithms timed]); the caller holds the lock and has set
// b.alpha and b.beta.
func (b *Backend) ltSettle(key ltKey, pl *ltPlan, x ltOperands) {
	pl.settled = true
	if b.capturing || len(pl.algos) < 2 || (x.c == x.d && b.beta != 0) {
		return
	}
	times := b.ltTimes(pl, x)
	best := 0
	for i, t := range times {
		if t > 0 && (times[best] <= 0 || t < times[best]) {
			best = i
		}
	}
	if best != 0 && times[0] > 0 && times[best] > (1-ltMargin)*times[0] {
		best = 0
	}
	pl.algo = best
	if b.ltTimed != nil {
		b.ltTimed(key, times, best)
	}
}

// ltTimes returns each candidate's device time in ms per product on x, 0
// for one cuBLASLt refuses.
func (b *Backend) ltTimes(pl *ltPlan, x ltOperands) []float32 {
	d := b.d
	var start, end uintptr
	d.must("cuEventCreate", d.eventCreate(unsafe.Pointer(&start), 0))
	defer d.eventDestroy(start)
	d.must("cuEventCreate", d.eventCreate(unsafe.Pointer(&end), 0))
	defer d.eventDestroy(end)
	times := make([]float32, len(pl.algos))
	for i := range pl.algos {
		if b.ltMatmul(pl, i, x) != 0 {
			continue
		}
		d.must("cuEventRecord", d.eventRecord(start, b.stream))
		for range ltTimedRuns {
			b.ltMatmul(pl, i, x)
		}
		d.must("cuEventRecord", d.eventRecord(end, b.stream))
		d.must("cuEventSynchronize", d.eventSynchronize(end))
		d.must("cuEventElapsedTime", d.eventElapsedTime(unsafe.Pointer(&times[i]), start, end))
		times[i] /= ltTimedRuns
	}
	return times
}

// gemmLt runs the product g (one, not a batch) with what cuBLASLt fuses of
// its epilogue e in one call, reporting whether it did and whether that
// included the bias gradients (the caller holds the lock and does the
// rest; Note [the fused epilogues]).
func (b *Backend) gemmLt(g gemmCall, e kernels.Epilogue) (ran, sums bool) {
	if b.lt == nil || b.noLt || g.batch > 1 {
		return false, false
	}
	epi, sums, why := ltEpilogue(g, e, b.ltSums, !b.tf32(g))
	if why != "" {
		return false, false
	}
	// vec is the bias or the fused bias gradient, in C's dtype: where it
	// has another, a scratch vector.
	var vec, aux uintptr
	var scratch kernels.Buf
	v := e.Bias
	if sums {
		v = e.BiasGrad
		if !v.Valid() {
			v = e.BiasGradA
		}
	}
	if v.Valid() {
		vec = ptrOf(v)
		if v.DType != g.cType {
			blk := b.workspace(int64(v.N * g.cType.Size()))
			defer b.alloc.Free(blk)
			scratch = kernels.Buf{Block: blk, N: v.N, DType: g.cType}
			vec = blk.Addr()
		}
	}
	if e.Aux.Valid() {
		aux = ptrOf(e.Aux)
	}
	// A residual is cuBLASLt's C, read with β = 1, beside the D we call C.
	in, beta := g.c, g.beta
	if e.Residual.Valid() {
		in, beta = ptrOf(e.Residual), 1
	}
	key := ltKey{transA: g.transA, transB: g.transB, m: g.m, n: g.n, k: g.k, ab: g.ab, c: g.cType, epilogue: epi,
		tf32:  b.tf32(g),
		align: [4]uint8{alignLog2(g.a), alignLog2(g.b), min(alignLog2(g.c), alignLog2(in)), min(alignLog2(vec|1<<8), alignLog2(aux|1<<8))}}
	key.lda, key.ldb, key.ldc = g.lds()
	pl := b.ltPlanFor(key, vec, aux)
	if pl.refused != "" {
		return false, false
	}
	lt := b.lt
	if vec != 0 {
		lt.descSet(pl.desc, ltDescBiasPointer, unsafe.Pointer(&vec), 8)
	}
	if aux != 0 {
		lt.descSet(pl.desc, ltDescAuxPointer, unsafe.Pointer(&aux), 8)
	}
	if scratch.Valid() && e.Bias.Valid() {
		b.cast(scratch, e.Bias)
	}
	b.alpha, b.beta = g.alpha, beta
	if b.prof != nil {
		b.queued(fmt.Sprintf("cublasLt gemm %v→%v %d×%d×%d %s%s", g.ab, g.cType, g.m, g.n, g.k, e, map[bool]string{true: " (β=1)"}[beta != 0]))
	} else {
		b.queued("cublasLt gemm")
	}
	x := ltOperands{a: g.a, b: g.b, c: in, d: g.c}
	if !pl.settled {
		b.ltSettle(key, pl, x)
	}
	// A call cuBLASLt refuses (it checks before queuing anything) leaves
	// the shape to the unfused path from then on.
	if r := b.ltMatmul(pl, pl.algo, x); r != 0 {
		pl.refused = b.cb.check("cublasLtMatmul", r).Error()
		return false, false
	}
	if scratch.Valid() && sums {
		b.cast(v, scratch)
	}
	return true, sums
}
