package cuda

import (
	"cmp"
	"fmt"
	"slices"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/memory"
)

// cuDNN 9, optional: when libcudnn.so.9 is present, convolutions use it
// (the legacy convolution API, which cuDNN 9 still ships). Each shape's
// algorithms are benchmarked by cudnnFind*AlgorithmEx, as PyTorch does
// under torch.backends.cudnn.benchmark, but cudnnFindRounds times, each
// algorithm ranked by its median time (rankAlgos); every acceptable one is
// kept, fastest first (with, for large workspaces, the same algorithms on
// halves of the batch: Note [a convolution in two halves]), and each call
// asks the pool for a workspace that may take the size of any of them
// (memory.Allocator.AllocWorkspace): an eager call gets the one its policy
// picks, a planned step the fastest that fits its arena.
// Without cuDNN, the im2col + cuBLAS path in conv.go does the work.

const (
	cudnnDataFloat         = 0
	cudnnDataHalf          = 2
	cudnnDataBF16          = 9
	cudnnTensorNCHW        = 0
	cudnnTensorNHWC        = 1
	cudnnCrossCorrelation  = 1
	cudnnTensorOpMath      = 1
	cudnnFMAMath           = 3 // FMA kernels only: no TF32 for F32 data
	cudnnStatusSuccess     = 0
	cudnnMaxAlgos          = 8
	cudnnWorkspaceCapBytes = 256 << 20
	// cudnnFindRounds is how many times each shape's algorithms are timed.
	// One timing each (PyTorch's) let the F16 algorithms of ResNet-1202's
	// small convolutions swap places from run to run, and its AMP step
	// took 162 ms in one run and 216 ms in the next.
	cudnnFindRounds = 3
)

type cudnnStatus uintptr

// cudnnAPI is libcudnn's functions; see Note [typed bindings]. The
// algorithm searches and the convolutions take, after the handle, the two
// operands' descriptors and data, the convolution descriptor, the result's
// descriptor and data, then (searches) how many results are wanted, a
// count and the results, or (convolutions) the algorithm; then the
// workspace and its size.
type cudnnAPI struct {
	lib     *library
	version int

	getVersion                                        func() uintptr
	create                                            func(handle unsafe.Pointer) cudnnStatus
	destroy                                           func(handle uintptr) cudnnStatus
	setStream                                         func(handle, stream uintptr) cudnnStatus
	getErrorString                                    func(s cudnnStatus) uintptr
	createTensorDescriptor                            func(d unsafe.Pointer) cudnnStatus
	destroyTensorDescriptor                           func(d uintptr) cudnnStatus
	setTensor4dDescriptor                             func(d uintptr, format, dtype, n, c, h, w int32) cudnnStatus
	createFilterDescriptor                            func(d unsafe.Pointer) cudnnStatus
	destroyFilterDescriptor                           func(d uintptr) cudnnStatus
	setFilter4dDescriptor                             func(d uintptr, dtype, format, k, c, h, w int32) cudnnStatus
	createConvolutionDescriptor                       func(d unsafe.Pointer) cudnnStatus
	destroyConvolutionDescriptor                      func(d uintptr) cudnnStatus
	setConvolution2dDescriptor                        func(d uintptr, padH, padW, strideH, strideW, dilH, dilW, mode, dtype int32) cudnnStatus
	setConvolutionMathType                            func(d uintptr, math int32) cudnnStatus
	findForward, findBackwardData, findBackwardFilter func(handle, aDesc, a, bDesc, b, convDesc, yDesc, y uintptr,
		requested int32, returned, results unsafe.Pointer, ws, wsSize uintptr) cudnnStatus
	forward, backwardData, backwardFilter func(handle uintptr, alpha unsafe.Pointer, aDesc, a, bDesc, b, convDesc uintptr,
		algo int32, ws, wsSize uintptr, beta unsafe.Pointer, yDesc, y uintptr) cudnnStatus

	// The backend (graph) API, for attention (sdpa.go): a descriptor's
	// type or attribute name, an attribute's type, a count of elements and
	// where they are.
	backendCreate       func(typ int32, d unsafe.Pointer) cudnnStatus
	backendDestroy      func(d uintptr) cudnnStatus
	backendSetAttribute func(d uintptr, name, typ int32, n int64, elems unsafe.Pointer) cudnnStatus
	backendGetAttribute func(d uintptr, name, typ int32, requested int64, n, elems unsafe.Pointer) cudnnStatus
	backendFinalize     func(d uintptr) cudnnStatus
	backendExecute      func(handle, plan, pack uintptr) cudnnStatus
}

func (c *cudnnAPI) symbols() []symbol {
	return []symbol{
		fn0("cudnnGetVersion", &c.getVersion), fn1("cudnnCreate", &c.create), fn1("cudnnDestroy", &c.destroy),
		fn2("cudnnSetStream", &c.setStream), fn1("cudnnGetErrorString", &c.getErrorString),
		fn1("cudnnCreateTensorDescriptor", &c.createTensorDescriptor), fn1("cudnnDestroyTensorDescriptor", &c.destroyTensorDescriptor),
		fn7("cudnnSetTensor4dDescriptor", &c.setTensor4dDescriptor),
		fn1("cudnnCreateFilterDescriptor", &c.createFilterDescriptor), fn1("cudnnDestroyFilterDescriptor", &c.destroyFilterDescriptor),
		fn7("cudnnSetFilter4dDescriptor", &c.setFilter4dDescriptor),
		fn1("cudnnCreateConvolutionDescriptor", &c.createConvolutionDescriptor),
		fn1("cudnnDestroyConvolutionDescriptor", &c.destroyConvolutionDescriptor),
		fn9("cudnnSetConvolution2dDescriptor", &c.setConvolution2dDescriptor),
		fn2("cudnnSetConvolutionMathType", &c.setConvolutionMathType),
		fn13("cudnnFindConvolutionForwardAlgorithmEx", &c.findForward),
		fn13("cudnnFindConvolutionBackwardDataAlgorithmEx", &c.findBackwardData),
		fn13("cudnnFindConvolutionBackwardFilterAlgorithmEx", &c.findBackwardFilter),
		fn13("cudnnConvolutionForward", &c.forward), fn13("cudnnConvolutionBackwardData", &c.backwardData),
		fn13("cudnnConvolutionBackwardFilter", &c.backwardFilter),
		fn2("cudnnBackendCreateDescriptor", &c.backendCreate), fn1("cudnnBackendDestroyDescriptor", &c.backendDestroy),
		fn5("cudnnBackendSetAttribute", &c.backendSetAttribute), fn6("cudnnBackendGetAttribute", &c.backendGetAttribute),
		fn1("cudnnBackendFinalize", &c.backendFinalize), fn3("cudnnBackendExecute", &c.backendExecute),
	}
}

func (c *cudnnAPI) init(lib *library) error {
	c.lib = lib
	c.version = int(c.getVersion())
	if c.version < 90000 {
		return fmt.Errorf("%s is cuDNN %d; leangrad binds cuDNN 9", lib.name, c.version)
	}
	return nil
}

var cudnnLib = loader[*cudnnAPI]{what: "cuDNN 9 (libcudnn.so.9, optional)", names: []string{"libcudnn.so.9"},
	companions: []string{"libcudnn_*.so.9"}, constructor: func() *cudnnAPI { return new(cudnnAPI) }}

func loadCUDNN() (*cudnnAPI, error) { return cudnnLib.load() }

func (c *cudnnAPI) check(what string, r cudnnStatus) error {
	if r == cudnnStatusSuccess {
		return nil
	}
	e := &Error{Call: what, Code: int(r), Name: "CUDNN_STATUS"}
	if s := cStringAt(c.getErrorString(r)); s != "" {
		e.Name = s
	}
	return e
}

func (c *cudnnAPI) must(what string, r cudnnStatus) {
	if err := c.check(what, r); err != nil {
		panic(err)
	}
}

// algoPerf mirrors cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t.
type algoPerf struct {
	algo, status int32
	time         float32
	_            int32
	memory       uintptr
	determinism  int32
	mathType     int32
	reserved     [3]int32
}

// algoChoice is one algorithm a direction may run, as cuDNN's search found it.
type algoChoice struct {
	algo, math int32
	ws         uintptr // workspace bytes
	ms         float32 // the search's timing (of both halves, with half)
	// half, when set, runs the algorithm on each half of the batch in turn
	// with half's descriptors (Note [a convolution in two halves]).
	half *convPlan
}

// convPlan is everything cuDNN needs for one convolution shape and dtype:
// descriptors made once, and each direction's acceptable algorithms once
// found.
type convPlan struct {
	x, w, y   uintptr
	conv      [3]uintptr      // one descriptor per direction
	math      [3]int32        // the math type set on each descriptor now
	cands     [3][]algoChoice // forward, backward data, backward filter: fastest first
	eager     [3]int          // the candidate an eager call takes
	found     [3]bool
	halved    [3]bool // the halves were considered (Note [a convolution in two halves])
	fallback  [3]bool // cuDNN offers no acceptable algorithm: use im2col + cuBLAS
	strictF32 bool    // F32 data without TF32: FMA-math algorithms only
	wsBudget  uintptr // the workspace an eager call's algorithm may take
}

type planKey struct {
	p    kernels.ConvParams
	dt   kernels.DType
	half bool // a half of a batch of twice p.N: offers no halves of its own
}

// dnnPlan returns the cached plan for p, making its descriptors on first use
// (the caller holds the lock).
func (b *Backend) dnnPlan(p kernels.ConvParams, dt kernels.DType) *convPlan {
	return b.dnnPlanOf(planKey{p: p, dt: dt})
}

func (b *Backend) dnnPlanOf(k planKey) *convPlan {
	p, dt := k.p, k.dt
	if pl := b.plans[k]; pl != nil {
		return pl
	}
	c := b.dnn
	pl := &convPlan{}
	dtype, math := int32(cudnnDataFloat), int32(cudnnFMAMath)
	if dt == kernels.F16 {
		dtype, math = cudnnDataHalf, cudnnTensorOpMath
	} else if dt == kernels.BF16 {
		dtype, math = cudnnDataBF16, cudnnTensorOpMath
	} else if !b.opts.StrictConvF32 {
		math = cudnnTensorOpMath // TF32 allowed, as PyTorch's cudnn.allow_tf32
	} else {
		pl.strictF32 = true
	}
	for _, d := range []*uintptr{&pl.x, &pl.y} {
		c.must("cudnnCreateTensorDescriptor", c.createTensorDescriptor(unsafe.Pointer(d)))
	}
	c.must("cudnnCreateFilterDescriptor", c.createFilterDescriptor(unsafe.Pointer(&pl.w)))
	for i := range pl.conv {
		c.must("cudnnCreateConvolutionDescriptor", c.createConvolutionDescriptor(unsafe.Pointer(&pl.conv[i])))
		c.must("cudnnSetConvolution2dDescriptor", c.setConvolution2dDescriptor(pl.conv[i],
			int32(p.PadH), int32(p.PadW), int32(p.StrideH), int32(p.StrideW), 1, 1, cudnnCrossCorrelation, cudnnDataFloat))
		c.must("cudnnSetConvolutionMathType", c.setConvolutionMathType(pl.conv[i], math))
		pl.math[i] = math
	}
	// The eager workspace budget: anything the search may use (the fastest
	// algorithm wins), or with LeanConvWorkspace the larger of input and
	// output counted in F32 bytes, so that no call's workspace dwarfs the
	// activations.
	pl.wsBudget = cudnnWorkspaceCapBytes
	if b.opts.LeanConvWorkspace {
		pl.wsBudget = uintptr(max(p.N*p.C*p.H*p.W, p.N*p.K*p.OutH()*p.OutW()) * 4)
	}
	format := int32(cudnnTensorNCHW) // of all three: NHWC filters are K×R×S×C
	if p.ChannelsLast {
		format = cudnnTensorNHWC
	}
	c.must("cudnnSetTensor4dDescriptor", c.setTensor4dDescriptor(pl.x, format, dtype,
		int32(p.N), int32(p.C), int32(p.H), int32(p.W)))
	c.must("cudnnSetTensor4dDescriptor", c.setTensor4dDescriptor(pl.y, format, dtype,
		int32(p.N), int32(p.K), int32(p.OutH()), int32(p.OutW())))
	c.must("cudnnSetFilter4dDescriptor", c.setFilter4dDescriptor(pl.w, dtype, format,
		int32(p.K), int32(p.C), int32(p.R), int32(p.S)))
	b.plans[k] = pl
	return pl
}

// dnnFind benchmarks direction dir's algorithms once, on the real buffers
// (the output is overwritten, then computed again by the caller), and keeps
// the acceptable ones that succeeded, fastest first. The search's scratch
// space (up to cudnnWorkspaceCapBytes) is taken from the device directly,
// not from the pool: it is one-time tuning, not part of any step's memory.
// The chosen algorithm's own workspace comes from the pool at every call.
func (b *Backend) dnnFind(pl *convPlan, dir int, a, bb, out uintptr) {
	if pl.found[dir] {
		return
	}
	c := b.dnn
	src := b.alloc.Source()
	seg, err := src.Alloc(cudnnWorkspaceCapBytes)
	wsAddr, wsSize := seg.Addr, uintptr(cudnnWorkspaceCapBytes)
	if err != nil {
		wsAddr, wsSize = 0, 0 // search the algorithms that need no workspace
	} else {
		defer src.Free(seg)
	}
	rounds := make([][]algoPerf, cudnnFindRounds)
	for i := range rounds {
		perf := new([cudnnMaxAlgos]algoPerf)
		n := new(int32)
		var r cudnnStatus
		switch dir {
		case 0: // x, w -> y
			r = c.findForward(b.dnnHandle, pl.x, a, pl.w, bb, pl.conv[0], pl.y, out, cudnnMaxAlgos, unsafe.Pointer(n), unsafe.Pointer(perf), wsAddr, wsSize)
		case 1: // w, dy -> dx
			r = c.findBackwardData(b.dnnHandle, pl.w, a, pl.y, bb, pl.conv[1], pl.x, out, cudnnMaxAlgos, unsafe.Pointer(n), unsafe.Pointer(perf), wsAddr, wsSize)
		case 2: // x, dy -> dw
			r = c.findBackwardFilter(b.dnnHandle, pl.x, a, pl.y, bb, pl.conv[2], pl.w, out, cudnnMaxAlgos, unsafe.Pointer(n), unsafe.Pointer(perf), wsAddr, wsSize)
		}
		c.must("cudnnFindConvolutionAlgorithmEx", r)
		rounds[i] = perf[:*n]
	}
	perf := rankAlgos(rounds)
	// Deterministic algorithms, so that runs (and resumed runs) repeat bit
	// for bit (any kind if none is), fastest first.
	// Strict F32 takes only FMA-math algorithms (others may round inputs to
	// TF32). An eager call takes the fastest whose workspace fits the
	// budget (a workspace is allocated at every call, and the largest set
	// the step's peak), else the one with the smallest workspace.
	pl.found[dir] = true
	for _, deterministic := range []bool{true, false} {
		var cands []algoChoice
		for _, pr := range perf {
			if pr.status != cudnnStatusSuccess || (deterministic && pr.determinism != 1) || (pl.strictF32 && pr.mathType != cudnnFMAMath) {
				continue
			}
			cands = append(cands, algoChoice{algo: pr.algo, math: pr.mathType, ws: pr.memory, ms: pr.time})
		}
		if len(cands) == 0 {
			continue
		}
		pl.cands[dir], pl.eager[dir] = cands, eagerChoice(cands, pl.wsBudget)
		return
	}
	pl.fallback[dir] = true
}

// eagerChoice is the candidate an eager call takes: the fastest whose
// workspace fits budget, else the one with the smallest workspace.
func eagerChoice(cands []algoChoice, budget uintptr) int {
	for i, c := range cands {
		if c.ws <= budget {
			return i
		}
	}
	eager := 0
	for i, c := range cands {
		if c.ws < cands[eager].ws {
			eager = i
		}
	}
	return eager
}

// dnnHalves adds to direction dir's candidates for p those that run on
// each half of the batch in turn, once, when the fastest algorithm's
// workspace is half the larger operand or more (Note [a convolution in two
// halves]). a, bb and out are the call's operands, as dnnFind takes them:
// the halves' search runs on their first halves.
func (b *Backend) dnnHalves(pl *convPlan, p kernels.ConvParams, dt kernels.DType, dir int, a, bb, out uintptr) {
	if pl.halved[dir] || pl.fallback[dir] {
		return
	}
	pl.halved[dir] = true
	es := uintptr(dt.Size())
	act := uintptr(max(p.N*p.C*p.H*p.W, p.N*p.K*p.OutH()*p.OutW())) * es
	if p.N%2 != 0 || 2*pl.cands[dir][0].ws < act && !b.halves {
		return
	}
	hp := p
	hp.N /= 2
	half := b.dnnPlanOf(planKey{p: hp, dt: dt, half: true})
	b.dnnFind(half, dir, a, bb, out) // the first half of each batched operand
	if half.fallback[dir] {
		return
	}
	cands := slices.Clone(pl.cands[dir])
	for _, c := range half.cands[dir] {
		c.ms *= 2
		c.half = half
		cands = append(cands, c)
	}
	slices.SortStableFunc(cands, func(x, y algoChoice) int { return cmp.Compare(x.ms, y.ms) })
	pl.cands[dir], pl.eager[dir] = cands, eagerChoice(cands, pl.wsBudget)
	if i := slices.IndexFunc(cands, func(c algoChoice) bool { return c.half != nil }); b.halves && i >= 0 {
		pl.eager[dir] = i
	}
}

// Note [a convolution in two halves]: cuDNN's deterministic algorithms for
// a large convolution may all want a workspace of twice an activation (on
// the H200, F32 ResNet-18's 64-channel 32×32 filter gradient at batch 256:
// 130 MiB for either of them, against 64 MiB for the batch's input), and
// the algorithms without one are many times slower; when such a call sits
// at the step's busiest moment, the workspace is a fifth of the peak. Run
// on each half of the batch in turn (the filter gradient of the second
// half accumulated onto the first's, β = 1), the same algorithms need
// about half the workspace, for a time their own search measures (on the
// H200, ResNet-18's F16 forward of 64 channels at batch 256 took 0.36 ms
// on halves against 0.21 whole, with 32 MiB against 64). So a shape whose
// fastest algorithm's workspace is half an activation or more also offers
// every algorithm on halves, timed by its own search on the halves (twice
// the half's time), and the pool or a plan picks among them by size and
// time as among any candidates (memory.Allocator.AllocWorkspace): a plan
// takes halves where its workspace shaving finds them worth their time.
// The halves' plans offer no halves of their own.

// rankAlgos merges the results of several searches of one direction: each
// algorithm (and math type) that succeeded in every round, once, its time
// the median of its rounds', fastest first (ties in the first round's
// order). One that failed or was missing in any round is left out.
func rankAlgos(rounds [][]algoPerf) []algoPerf {
	if len(rounds) == 0 {
		return nil
	}
	type key struct{ algo, math int32 }
	times := map[key][]float32{}
	for _, round := range rounds {
		for _, pr := range round {
			if pr.status == cudnnStatusSuccess {
				k := key{pr.algo, pr.mathType}
				times[k] = append(times[k], pr.time)
			}
		}
	}
	var out []algoPerf
	for _, pr := range rounds[0] {
		ts := times[key{pr.algo, pr.mathType}]
		if pr.status != cudnnStatusSuccess || len(ts) != len(rounds) {
			continue
		}
		ts = slices.Clone(ts)
		slices.Sort(ts)
		pr.time = ts[len(ts)/2]
		out = append(out, pr)
	}
	slices.SortStableFunc(out, func(a, b algoPerf) int { return cmp.Compare(a.time, b.time) })
	return out
}

// dnnConv runs direction dir with cuDNN: y = conv(x, w), dx = convᵀ(dy, w)
// or dw = Σ dy ⊗ x (the caller holds the lock). It reports false when cuDNN
// has no acceptable algorithm for this shape, and the caller falls back.
func (b *Backend) dnnConv(p kernels.ConvParams, dt kernels.DType, dir int, a, bb, out uintptr) bool {
	pl := b.dnnPlan(p, dt)
	b.dnnFind(pl, dir, a, bb, out)
	b.dnnHalves(pl, p, dt, dir, a, bb, out)
	if pl.fallback[dir] {
		return false
	}
	// The workspace may take the size of any candidate; the allocator says
	// which (the eager policy's, or a plan's).
	cands := pl.cands[dir]
	choice := pl.eager[dir]
	var ws uintptr
	if needsWorkspace(cands) {
		opts := make([]memory.WorkspaceOption, len(cands))
		for i, c := range cands {
			opts[i] = memory.WorkspaceOption{Size: int64(c.ws), Time: c.ms}
		}
		blk, ci, err := b.alloc.AllocWorkspace(opts, choice, memory.Stream(b.stream))
		if err != nil {
			panic(err)
		}
		defer b.alloc.Free(blk)
		choice, ws = ci, blk.Addr()
	}
	ch := cands[choice]
	run := pl
	parts, xStep, yStep := 1, uintptr(0), uintptr(0) // the halves, and their offsets in x and y
	if ch.half != nil {
		run, parts = ch.half, 2
		es := uintptr(dt.Size())
		xStep = uintptr(p.N/2*p.C*p.H*p.W) * es
		yStep = uintptr(p.N/2*p.K*p.OutH()*p.OutW()) * es
	}
	if run.math[dir] != ch.math {
		c := b.dnn
		c.must("cudnnSetConvolutionMathType", c.setConvolutionMathType(run.conv[dir], ch.math))
		run.math[dir] = ch.math
	}
	c := b.dnn
	var err error
	for h := range uintptr(parts) {
		b.alpha, b.beta = 1, 0
		if dir == 2 && h > 0 {
			b.beta = 1 // the filter gradient of the second half adds to the first's
		}
		alpha, beta := unsafe.Pointer(&b.alpha), unsafe.Pointer(&b.beta)
		b.queued([...]string{"cudnn forward", "cudnn backward data", "cudnn backward filter"}[dir])
		switch dir {
		case 0:
			err = c.check("cudnnConvolutionForward", c.forward(b.dnnHandle, alpha, run.x, a+h*xStep, run.w, bb, run.conv[0], ch.algo, ws, ch.ws, beta, run.y, out+h*yStep))
		case 1:
			err = c.check("cudnnConvolutionBackwardData", c.backwardData(b.dnnHandle, alpha, run.w, a, run.y, bb+h*yStep, run.conv[1], ch.algo, ws, ch.ws, beta, run.x, out+h*xStep))
		case 2:
			err = c.check("cudnnConvolutionBackwardFilter", c.backwardFilter(b.dnnHandle, alpha, run.x, a+h*xStep, run.y, bb+h*yStep, run.conv[2], ch.algo, ws, ch.ws, beta, run.w, out))
		}
		if err != nil {
			break
		}
	}
	if err != nil {
		// cuDNN refused the algorithm it chose: this shape and direction
		// use im2col + cuBLAS from now on, and the failure is on record.
		pl.fallback[dir] = true
		b.dnnFailures = append(b.dnnFailures, fmt.Sprintf("%v for %+v %v", err, p, dt))
		return false
	}
	return true
}

// CuDNNFailures lists the cuDNN calls that failed (each shape and direction
// then fell back to im2col + cuBLAS). Empty when cuDNN did all it was asked.
func (b *Backend) CuDNNFailures() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.dnnFailures...)
}

// needsWorkspace reports whether any candidate takes workspace memory.
func needsWorkspace(cands []algoChoice) bool {
	for _, c := range cands {
		if c.ws > 0 {
			return true
		}
	}
	return false
}

// ConvEngine names what runs convolutions: cuDNN and its version, the eager
// workspace policy, whether F32 may use TF32 and the 16-bit layout, or
// im2col + cuBLAS.
func (b *Backend) ConvEngine() string {
	if b.dnn != nil {
		v := b.dnn.version
		policy := "fastest algorithms"
		if b.opts.LeanConvWorkspace {
			policy = "lean workspaces"
		}
		tf32 := "F32 as TF32"
		if b.opts.StrictConvF32 {
			tf32 = "strict F32"
		}
		return fmt.Sprintf("cuDNN %d.%d.%d, %s when eager, %s, F16 and BF16 channels last", v/10000, v/100%100, v%100, policy, tf32)
	}
	return "im2col + cuBLAS (cuDNN: " + b.dnnReason + ")"
}
