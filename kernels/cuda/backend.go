package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/memory"
)

// Options configure a backend; see kernels.Options.
type Options = kernels.Options

// Backend is the CUDA backend of one device: the primary context, one
// non-blocking stream all work is queued on, the kernels compiled by NVRTC,
// a cuBLAS handle and a caching allocator over cuMemAlloc.
//
// Its methods may be called from any goroutine: each takes the backend's
// lock, pins the goroutine to its OS thread and makes the context current
// there for the duration of the call.
type Backend struct {
	index   int
	name    string
	devName string
	arch    string // sm_XY
	sms     int
	// sharedPerSM and sharedPerBlock are the shared memory a multiprocessor
	// has and a block may opt in to (launchShared).
	sharedPerSM, sharedPerBlock int
	// chunkBudget caps one chunk of attention's or the classifier's
	// workspace (defaultChunkBudget).
	chunkBudget int
	// x3 runs F32 products as three TF32 ones (Options.MatmulF32 is
	// F32TF32x3, and the device has TF32 tensor cores and the shared
	// memory x3_gemm asks; gemmX3); x3Shared is what the x3_gemm kernels
	// ask for the target they were compiled for.
	x3       bool
	x3Shared int
	// halves (tests): every convolution of an even batch offers its halves,
	// and an eager call takes them (Note [a convolution in two halves]).
	halves bool
	// tensorCores says the device runs mma.sync on F16, BF16 and TF32
	// (sm_80 on), which the flash attention kernels need; noFlash (tests)
	// runs the chunked attention instead.
	tensorCores, noFlash bool
	// programmatic launches the module's kernels as programmatic
	// dependents (Note [programmatic dependent launch]): compute capability
	// 9.0 and later, with cuLaunchKernelEx.
	programmatic bool
	// noLt (tests) runs products with epilogues unfused; ltSums fuses
	// their bias gradients too (Note [the fused epilogues]).
	noLt, ltSums bool
	// ltTimed (tests) hears each product plan's candidate times and choice
	// (Note [products' algorithms timed]).
	ltTimed func(key ltKey, ms []float32, chosen int)
	opts    Options
	asked   Options // opts as given to Open, for the conflict check

	d      *driverAPI
	cb     *cublasAPI
	ctx    uintptr
	stream uintptr
	alloc  *memory.Allocator

	mu          sync.Mutex // guards everything below
	module      uintptr
	funcs       [][]uintptr     // the module's functions, by kernel and instantiation (newFunctionTable)
	funcShared  map[uintptr]int // the dynamic shared memory a function was allowed past 48 KiB (launchShared)
	blas        uintptr
	blasWS      *memory.Block // cuBLAS's and cuBLASLt's workspace (its first blasWSBytes), and reduceDone
	blasWSBytes uintptr
	// reduceDone is the counters of the kernels whose last block to finish
	// combines the others' results (reduce_cols_split: one a tile of
	// outputs; sumsq_finish: the first), zero between launches, which run
	// one at a time on the stream: n words at addr, the tail of blasWS.
	reduceDone struct {
		addr uintptr
		n    int
	}
	lt          *cublasLtAPI // nil: products with epilogues run unfused (ltReason says why)
	ltHandle    uintptr
	ltReason    string
	ltPlans     map[ltKey]*ltPlan
	args        *launchArgs
	staging     [2]staging
	nextStage   int
	pinned      *pinnedSource // nil until PinnedSource is first asked for
	copies      *copyStreams  // nil until StartRead or StartWrite is first called
	pinnedOnce  sync.Once
	dnn         *cudnnAPI // nil: convolutions by im2col + cuBLAS
	dnnHandle   uintptr
	dnnReason   string // why cuDNN is not used
	plans       map[planKey]*convPlan
	dnnAttn     map[dnnAttnKey]*dnnAttnPlan // attention's plans (Note [cuDNN's attention])
	noDNNAttn   bool                        // tests: attention by the flash kernels
	dnnFailures []string
	alpha       float32 // cuBLAS and cuDNN read their scalars through host pointers
	beta        float32
	launches    uint64     // kernels, library calls, copies and graphs queued on the stream
	capturing   bool       // the stream is being captured into a graph
	captureTid  int        // the OS thread of the goroutine capturing
	captureDone *sync.Cond // on mu: signalled when a capture ends
	closed      bool
	prof        *profiler
	CompileLog  string // how the kernels were obtained: compiled, or loaded from the cache, and how long it took
}

var _ kernels.Backend = (*Backend)(nil)

var (
	openMu sync.Mutex
	opened = map[int]*Backend{}
)

// Open returns the backend of CUDA device index, opening it on first use
// (later calls return the same backend and ignore opts). It fails with an
// error naming what is missing when the driver, a device, cuBLAS or NVRTC
// is not there, and with NVRTC's log if the kernels do not compile.
func Open(index int, opts Options) (*Backend, error) {
	openMu.Lock()
	defer openMu.Unlock()
	if b := opened[index]; b != nil {
		return b, nil
	}
	b, err := open(index, opts)
	if err != nil {
		return nil, err
	}
	opened[index] = b
	return b, nil
}

// OpenSeparate opens another backend on device index, with its own stream,
// pool and library handles, beside the one Open returns: for comparing
// options in one process.
func OpenSeparate(index int, opts Options) (*Backend, error) { return open(index, opts) }

func open(index int, opts Options) (*Backend, error) {
	asked := opts
	if opts.ConvWorkspace <= 0 {
		opts.ConvWorkspace = 64 << 20
	}
	n, err := DeviceCount()
	if err != nil {
		return nil, err
	}
	if index < 0 || index >= n {
		return nil, fmt.Errorf("cuda:%d does not exist: the driver reports %d device(s)", index, n)
	}
	d, _ := loadDriver() // DeviceCount loaded it
	cb, err := loadCUBLAS()
	if err != nil {
		return nil, err
	}
	if _, err := loadNVRTC(); err != nil {
		return nil, err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	b := &Backend{index: index, name: fmt.Sprintf("cuda:%d", index), opts: opts, asked: asked, d: d, cb: cb,
		funcs: newFunctionTable(), funcShared: map[uintptr]int{}, args: new(launchArgs), plans: map[planKey]*convPlan{},
		dnnAttn: map[dnnAttnKey]*dnnAttnPlan{}}
	b.captureDone = sync.NewCond(&b.mu)
	var dev int32
	if err := d.check("cuDeviceGet", d.deviceGet(unsafe.Pointer(&dev), int32(index))); err != nil {
		return nil, err
	}
	nameBuf := make([]byte, 256)
	d.deviceGetName(unsafe.Pointer(&nameBuf[0]), int32(len(nameBuf)), dev)
	b.devName = cString(unsafe.Pointer(&nameBuf[0]))
	attr := func(a int32) int {
		var v int32
		d.must("cuDeviceGetAttribute", d.deviceGetAttribute(unsafe.Pointer(&v), a, dev))
		return int(v)
	}
	b.arch = fmt.Sprintf("sm_%d%d", attr(attrComputeCapMajor), attr(attrComputeCapMinor))
	b.tensorCores = attr(attrComputeCapMajor) >= 8
	b.programmatic = attr(attrComputeCapMajor) >= 9 && d.launchKernelEx != nil
	b.sms = attr(attrMultiprocessorCount)
	b.sharedPerSM, b.sharedPerBlock = attr(attrSharedPerSM), attr(attrSharedPerBlockOptin)
	b.chunkBudget = defaultChunkBudget
	if err := d.check("cuDevicePrimaryCtxRetain", d.primaryCtxRetain(unsafe.Pointer(&b.ctx), dev)); err != nil {
		return nil, err
	}
	if err := d.check("cuCtxSetCurrent", d.ctxSetCurrent(b.ctx)); err != nil {
		return nil, err
	}
	if err := d.check("cuStreamCreate", d.streamCreate(unsafe.Pointer(&b.stream), cuStreamNonBlocking)); err != nil {
		return nil, err
	}

	start := time.Now()
	cubin, target, cached, err := compileCached(b.arch, opts.KernelCache)
	if err != nil {
		return nil, err
	}
	b.x3Shared = max(x3Shared, x3EpiShared)
	if target == "sm_90a" {
		b.x3Shared = max(x3WGShared, x3EpiShared)
	}
	b.x3 = opts.MatmulF32 == kernels.F32TF32x3 && b.tensorCores && b.x3Shared <= b.sharedPerBlock
	how := "compiled by NVRTC"
	if cached {
		how = "loaded from the cache in " + cacheDir(opts.KernelCache)
	}
	b.CompileLog = fmt.Sprintf("kernels for %s %s in %v", target, how, time.Since(start).Round(time.Millisecond))
	if err := d.check("cuModuleLoadData", d.moduleLoadData(unsafe.Pointer(&b.module), unsafe.Pointer(&cubin[0]))); err != nil {
		return nil, err
	}

	if err := cb.check("cublasCreate", cb.create(unsafe.Pointer(&b.blas))); err != nil {
		return nil, err
	}
	cb.must("cublasSetStream", cb.setStream(b.blas, b.stream))
	mode := int32(cublasDefaultMath)
	if opts.MatmulF32 == kernels.F32TF32 {
		mode = cublasTF32TensorOpMath
	}
	cb.must("cublasSetMathMode", cb.setMathMode(b.blas, mode))
	if lt, err := cublasLtLib.load(); err != nil {
		b.ltReason = err.Error()
	} else if err := cb.check("cublasLtCreate", lt.create(unsafe.Pointer(&b.ltHandle))); err != nil {
		b.ltReason = err.Error()
	} else {
		b.lt, b.ltPlans = lt, map[ltKey]*ltPlan{}
	}

	switch dnn, err := loadCUDNN(); {
	case opts.NoCuDNN:
		b.dnnReason = "disabled"
	case err != nil:
		b.dnnReason = err.Error()
	default:
		if err := dnn.check("cudnnCreate", dnn.create(unsafe.Pointer(&b.dnnHandle))); err != nil {
			b.dnnReason = err.Error()
			break
		}
		dnn.must("cudnnSetStream", dnn.setStream(b.dnnHandle, b.stream))
		b.dnn = dnn
	}

	if err := b.usePool(&deviceSource{b: b}, memory.Config{Device: b.name}); err != nil {
		return nil, err
	}
	for i := range b.staging {
		if err := d.check("cuEventCreate", d.eventCreate(unsafe.Pointer(&b.staging[i].event), cuEventDisableTiming)); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// usePool makes the backend's pool an allocator over src and takes
// cuBLAS's workspace from it, so that the pool's numbers account for it, as
// PyTorch's do. Its size is the smallest the pool gives a segment of its own
// (a smaller request would share a 20 MiB segment that stays reserved for
// good). The split column reductions' counters (Reduce) are its last bytes.
func (b *Backend) usePool(src memory.Source, cfg memory.Config) error {
	b.alloc = memory.New(src, cfg)
	const blasWorkspace = memory.MinLargeAlloc
	var err error
	if b.blasWS, err = b.alloc.Alloc(blasWorkspace, memory.Stream(b.stream)); err != nil {
		return err
	}
	// A split column reduction has at most fill/16 outputs (Reduce), and a
	// tile at least one.
	b.reduceDone.n = b.sms * 2048 / 16
	b.blasWSBytes = blasWorkspace - uintptr(b.reduceDone.n*4+255)&^255
	b.reduceDone.addr = b.blasWS.Addr() + b.blasWSBytes
	b.d.must("cuMemsetD32Async", b.d.memsetD32Async(b.reduceDone.addr, 0, uintptr(b.reduceDone.n), b.stream))
	b.cb.must("cublasSetWorkspace", b.cb.setWorkspace(b.blas, b.blasWS.Addr(), b.blasWSBytes))
	return nil
}

// Close gives back everything the backend holds: its pool's memory, the
// cuBLAS workspace and handle, the cuDNN handle and the descriptors of its
// convolution plans, the kernels' module, the pinned staging buffers and
// their events, the stream and its hold on the device's primary context. It
// fails, closing nothing, while tensors still hold memory of its pool
// (release them first; arenas and graphs too). A closed backend must not be
// used again; Open opens a new one.
func (b *Backend) Close() error {
	if err := b.Synchronize(); err != nil {
		return err
	}
	b.enter()
	defer b.exit()
	if b.closed {
		return nil
	}
	if st := b.alloc.Stats(); st.Allocated[memory.All].Current > b.blasWS.Size() {
		return fmt.Errorf("cuda: %s: Close while %d bytes of its pool are allocated (release the tensors, arenas and graphs first)",
			b.name, st.Allocated[memory.All].Current-b.blasWS.Size())
	}
	if b.pinned != nil {
		if free, total := b.pinned.MemInfo(); free < total {
			return fmt.Errorf("cuda: %s: Close while %d bytes of page-locked host memory are allocated (empty the pinned host pool first)",
				b.name, total-free)
		}
	}
	b.closed = true
	openMu.Lock()
	if opened[b.index] == b {
		delete(opened, b.index)
	}
	openMu.Unlock()
	var errs []error
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if dnn := b.dnn; dnn != nil {
		for _, pl := range b.plans {
			for _, desc := range []struct {
				name    string
				destroy func(uintptr) cudnnStatus
				h       uintptr
			}{{"cudnnDestroyTensorDescriptor", dnn.destroyTensorDescriptor, pl.x}, {"cudnnDestroyFilterDescriptor", dnn.destroyFilterDescriptor, pl.w},
				{"cudnnDestroyTensorDescriptor", dnn.destroyTensorDescriptor, pl.y}} {
				if desc.h != 0 {
					keep(dnn.check(desc.name, desc.destroy(desc.h)))
				}
			}
			for _, c := range pl.conv {
				if c != 0 {
					keep(dnn.check("cudnnDestroyConvolutionDescriptor", dnn.destroyConvolutionDescriptor(c)))
				}
			}
		}
		for _, pl := range b.dnnAttn {
			keep(destroyDescs(dnn, pl.descs))
		}
		keep(dnn.check("cudnnDestroy", dnn.destroy(b.dnnHandle)))
	}
	b.plans, b.dnnAttn = nil, nil
	if lt := b.lt; lt != nil {
		for _, pl := range b.ltPlans {
			for _, l := range []uintptr{pl.a, pl.b, pl.d} {
				if l != 0 {
					keep(b.cb.check("cublasLtMatrixLayoutDestroy", lt.layoutDestroy(l)))
				}
			}
			if pl.desc != 0 {
				keep(b.cb.check("cublasLtMatmulDescDestroy", lt.descDestroy(pl.desc)))
			}
		}
		keep(b.cb.check("cublasLtDestroy", lt.destroy(b.ltHandle)))
		b.lt, b.ltPlans = nil, nil
	}
	keep(b.cb.check("cublasDestroy", b.cb.destroy(b.blas)))
	b.alloc.Free(b.blasWS)
	b.alloc.EmptyCache()
	d := b.d
	for i := range b.staging {
		s := &b.staging[i]
		if s.ptr != nil {
			keep(d.check("cuMemFreeHost", d.memFreeHost(s.ptr)))
			s.ptr, s.mem = nil, nil
		}
		keep(d.check("cuEventDestroy", d.eventDestroy(s.event)))
	}
	keep(b.closeCopies())
	keep(d.check("cuModuleUnload", d.moduleUnload(b.module)))
	keep(d.check("cuStreamDestroy", d.streamDestroy(b.stream)))
	var dev int32
	if d.check("cuDeviceGet", d.deviceGet(unsafe.Pointer(&dev), int32(b.index))) == nil {
		keep(d.check("cuDevicePrimaryCtxRelease", d.primaryCtxRelease(dev)))
	}
	return errors.Join(errs...)
}

// Name is "cuda:N".
func (b *Backend) Name() string { return b.name }

// Options are the options the backend was opened with, as given (before
// defaults were filled in).
func (b *Backend) Options() Options { return b.asked }

// Info describes the GPU and the libraries bound.
func (b *Backend) Info() kernels.Info {
	_, total := b.MemInfo()
	libs := map[string]string{"driver": fmt.Sprintf("CUDA %d.%d", b.d.version/1000, b.d.version%1000/10)}
	if n, err := loadNVRTC(); err == nil {
		libs["nvrtc"] = fmt.Sprintf("%d.%d", n.major, n.minor)
	}
	if b.dnn != nil {
		v := b.dnn.version
		libs["cudnn"] = fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100)
	}
	libs["cublas"] = b.cb.lib.name // the file bound: its name carries the version
	if b.lt != nil {
		libs["cublaslt"] = b.lt.name
	}
	if v, err := NCCLVersion(); err == nil {
		libs["nccl"] = v
	}
	return kernels.Info{Kind: kernels.KindCUDA, Index: b.index, Name: b.name, Model: b.devName, Capability: b.arch,
		Memory: total, Convolutions: b.ConvEngine(), Matmul: b.MatmulEngine(), ChannelsLast: b.dnn != nil, Libraries: libs}
}

// MatmulEngine names what runs matrix products, and how F32 ones
// (Options.MatmulF32), for reports.
func (b *Backend) MatmulEngine() string {
	f32 := "F32 strictly"
	switch {
	case b.x3:
		return "cuBLAS and cuBLASLt; F32 in leangrad's kernels as three TF32 products (tf32x3)"
	case b.opts.MatmulF32 == kernels.F32TF32:
		f32 = "F32 as TF32"
	case b.opts.MatmulF32 == kernels.F32TF32x3:
		f32 = "F32 strictly (the device lacks the TF32 tensor cores or the shared memory of tf32x3)"
	}
	return "cuBLAS and cuBLASLt, " + f32
}

// DeviceName is the device's marketing name, as nvidia-smi shows it.
func (b *Backend) DeviceName() string { return b.devName }

// Arch is the device's architecture ("sm_90"); the kernels are compiled
// for Target(Arch, NVRTC's major version), which CompileLog names.
func (b *Backend) Arch() string { return b.arch }

// Allocator is the device's caching allocator over cuMemAlloc.
func (b *Backend) Allocator() *memory.Allocator { return b.alloc }

// Stream is the stream all of the backend's work runs on.
func (b *Backend) Stream() memory.Stream { return memory.Stream(b.stream) }

// Synchronize waits for the stream and reports any error raised by queued work.
func (b *Backend) Synchronize() error {
	b.enter()
	defer b.exit()
	if b.capturing {
		return errors.New("cuda: Synchronize while capturing a graph")
	}
	defer b.mark(kernels.IdleOp)
	return b.d.check("cuStreamSynchronize", b.d.streamSynchronize(b.stream))
}

// MemInfo reports the device's free and total bytes, as the driver (and
// nvidia-smi) sees them.
func (b *Backend) MemInfo() (free, total int64) { return b.alloc.Source().MemInfo() }

// enter takes the lock and makes the context current on this OS thread.
//
// Note [one goroutine captures]: while a goroutine captures the stream
// (BeginCapture to EndCapture, on one OS thread), every other goroutine's
// call waits here until the capture ends. Otherwise the work of a session
// serving on the same device would be recorded into the step's graph
// instead of running, and replayed with every step.
func (b *Backend) enter() {
	b.mu.Lock()
	runtime.LockOSThread()
	for b.capturing && syscall.Gettid() != b.captureTid {
		b.captureDone.Wait()
	}
	b.d.must("cuCtxSetCurrent", b.d.ctxSetCurrent(b.ctx))
}

func (b *Backend) exit() {
	runtime.UnlockOSThread()
	b.mu.Unlock()
}

// deviceSource is the raw allocator under the device pool. It takes no
// backend lock (the pool may call it from inside an operation) and makes the
// context current itself.
type deviceSource struct{ b *Backend }

// withContext runs f on a locked OS thread with the backend's context
// current, without the backend lock: for raw allocators, which the pools
// may call from inside an operation.
func (b *Backend) withContext(f func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.d.must("cuCtxSetCurrent", b.d.ctxSetCurrent(b.ctx))
	f()
}

func (s *deviceSource) Alloc(size int64) (memory.Segment, error) {
	var ptr uintptr
	var err error
	s.b.withContext(func() {
		err = s.b.d.check("cuMemAlloc", s.b.d.memAlloc(unsafe.Pointer(&ptr), uintptr(size)))
	})
	if isOOM(err) {
		return memory.Segment{}, fmt.Errorf("%v: %w", err, memory.ErrOutOfMemory)
	}
	if err != nil {
		return memory.Segment{}, err
	}
	return memory.Segment{Addr: ptr, Size: size}, nil
}

// Granularity is the driver's: cuMemAlloc maps device memory in pages of
// 2 MiB (PyTorch rounds its large segments to them too), so a segment of
// another size holds the rest of its last page (memory.Granular).
func (s *deviceSource) Granularity() int64 { return 2 << 20 }

func (s *deviceSource) Free(seg memory.Segment) error {
	var err error
	s.b.withContext(func() { err = s.b.d.check("cuMemFree", s.b.d.memFree(seg.Addr)) })
	return err
}

func (s *deviceSource) MemInfo() (free, total int64) {
	var f, t uintptr
	s.b.withContext(func() {
		s.b.d.must("cuMemGetInfo", s.b.d.memGetInfo(unsafe.Pointer(&f), unsafe.Pointer(&t)))
	})
	return int64(f), int64(t)
}

// Launches is the number of kernels, library calls (cuBLAS) and copies the
// backend has queued so far: per training step, the figure that bounds how
// fast a launch-bound model can go.
func (b *Backend) Launches() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.launches
}

// ptrOf is the device address of a buffer.
func ptrOf(buf kernels.Buf) uintptr {
	if buf.Block == nil {
		return 0
	}
	if buf.Block.Bytes() != nil {
		panic("cuda: a host buffer was passed to the CUDA backend")
	}
	return buf.Block.Addr() + uintptr(buf.Off)
}

// notCapturing panics when the stream is being captured: a captured graph
// cannot wait for the host, and a host copy in it would replay stale bytes.
func (b *Backend) notCapturing(what string) {
	if b.capturing {
		panic("cuda: " + what + " while capturing a graph: a captured step must not exchange data with the host")
	}
}

// workspace takes a scratch block from the pool. Freeing it right after the
// work using it is queued is safe: the pool hands it out again only to later
// work on the same stream.
func (b *Backend) workspace(bytes int64) *memory.Block {
	blk, err := b.alloc.Alloc(bytes, memory.Stream(b.stream))
	if err != nil {
		panic(err)
	}
	return blk
}

// scratch is an operation's workspaces, taken one by one and given back
// together by release, deferred before the first is taken: one that runs
// out of memory (workspace panics) leaves none of those before it taken
// (Note [operations out of memory] in kernels/kerneltest).
type scratch struct {
	b      *Backend
	blocks []*memory.Block
}

// take is a workspace of bytes, given back by release.
func (w *scratch) take(bytes int64) *memory.Block {
	blk := w.b.workspace(bytes)
	w.blocks = append(w.blocks, blk)
	return blk
}

// addr is the address of a workspace of bytes, given back by release.
func (w *scratch) addr(bytes int64) uintptr { return w.take(bytes).Addr() }

// release gives back every workspace taken.
func (w *scratch) release() {
	for _, blk := range w.blocks {
		w.b.alloc.Free(blk)
	}
	w.blocks = nil
}
