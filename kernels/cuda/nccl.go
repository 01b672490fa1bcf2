package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
)

// NCCL, bound at run time like the other libraries: the collectives of a
// data-parallel step (all-reduce and broadcast, grouped), queued on the
// backend's stream or, started to overlap the backward, on a side stream
// forked from it and joined back with events, so that a captured step
// captures them too (NCCL supports graph capture since 2.9; a side stream
// that waits on an event of a capturing stream joins the capture).

// ncclUniqueID is ncclUniqueId: 128 opaque bytes, passed by value to
// ncclCommInitRank (purego lays it out on the stack as the C ABI says).
type ncclUniqueID struct{ Internal [128]byte }

const (
	ncclInt32    = 2
	ncclFloat16  = 6
	ncclFloat32  = 7
	ncclBfloat16 = 9
	ncclSum      = 0
	ncclAvg      = 4
)

type ncclResult uintptr

// ncclAPI is libnccl's functions; see Note [typed bindings].
type ncclAPI struct {
	version int

	getVersion     func(v unsafe.Pointer) ncclResult
	getUniqueID    func(id unsafe.Pointer) ncclResult
	commInitRank   func(comm *uintptr, nranks int32, id ncclUniqueID, rank int32) int32 // by purego.RegisterFunc: the id is passed by value
	allReduce      func(send, recv uintptr, count uintptr, dtype, op int32, comm, stream uintptr) ncclResult
	reduceScatter  func(send, recv uintptr, recvCount uintptr, dtype, op int32, comm, stream uintptr) ncclResult
	allGather      func(send, recv uintptr, sendCount uintptr, dtype int32, comm, stream uintptr) ncclResult
	broadcast      func(send, recv uintptr, count uintptr, dtype, root int32, comm, stream uintptr) ncclResult
	groupStart     func() ncclResult
	groupEnd       func() ncclResult
	commAbort      func(comm uintptr) ncclResult
	commDestroy    func(comm uintptr) ncclResult
	commFinalize   func(comm uintptr) ncclResult
	getErrorString func(r ncclResult) uintptr
	getLastError   func(comm uintptr) uintptr
}

func (n *ncclAPI) symbols() []symbol {
	return []symbol{
		fn1("ncclGetVersion", &n.getVersion), fn1("ncclGetUniqueId", &n.getUniqueID),
		registered("ncclCommInitRank", &n.commInitRank),
		fn7("ncclAllReduce", &n.allReduce), fn7("ncclBroadcast", &n.broadcast),
		fn7("ncclReduceScatter", &n.reduceScatter), fn6("ncclAllGather", &n.allGather),
		fn0("ncclGroupStart", &n.groupStart), fn0("ncclGroupEnd", &n.groupEnd),
		fn1("ncclCommAbort", &n.commAbort), fn1("ncclCommDestroy", &n.commDestroy), fn1("ncclCommFinalize", &n.commFinalize),
		fn1("ncclGetErrorString", &n.getErrorString), fn1("ncclGetLastError", &n.getLastError),
	}
}

func (n *ncclAPI) init(*library) error {
	var v int32
	if err := n.check("ncclGetVersion", n.getVersion(unsafe.Pointer(&v)), 0); err != nil {
		return err
	}
	n.version = int(v)
	return nil
}

var ncclLib = loader[*ncclAPI]{what: "NCCL (libnccl.so.2, from the NCCL package or pip's nvidia-nccl)",
	names: []string{"libnccl.so.2", "libnccl.so"}, constructor: func() *ncclAPI { return new(ncclAPI) }}

func loadNCCL() (*ncclAPI, error) { return ncclLib.load() }

// NCCLVersion is the version of the NCCL library found ("2.28.3"), or an
// error saying why there is none.
func NCCLVersion() (string, error) {
	n, err := loadNCCL()
	if err != nil {
		return "", err
	}
	v := n.version // major*10000 + minor*100 + patch since 2.9
	return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100), nil
}

// check turns an ncclResult_t into an error with NCCL's own words: its
// error string and, for a communicator, its last error's detail.
func (n *ncclAPI) check(what string, r ncclResult, comm uintptr) error {
	if int32(r) == 0 {
		return nil
	}
	names := map[int32]string{1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
		4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress"}
	e := &Error{Call: what, Code: int(int32(r)), Name: names[int32(r)]}
	if e.Name == "" {
		e.Name = fmt.Sprintf("ncclResult %d", int32(r))
	}
	e.Msg = cStringAt(n.getErrorString(r)) // C strings NCCL owns
	if detail := cStringAt(n.getLastError(comm)); detail != "" {
		e.Msg += ": " + detail
	}
	return e
}

// NCCL is a communicator over the ranks of a group, one per process and
// device. Its collectives run on the backend's stream, in order with the
// rest of the work, or, when started (StartAllReduce), on its own stream,
// until Join.
type NCCL struct {
	b       *Backend
	n       *ncclAPI
	comm    uintptr
	rank    int
	size    int
	aborted atomic.Bool

	side        uintptr // the stream started collectives run on
	forkEv      uintptr // recorded on the backend's stream: the work a started collective waits for
	joinEv      uintptr // recorded on side: what Join makes the backend's stream wait for
	outstanding bool    // a collective was started since the last Join
}

var _ kernels.CollectiveBackend = (*Backend)(nil)

// CollectiveID makes the id of a new NCCL group (on rank 0), to be sent to
// the other ranks.
func (b *Backend) CollectiveID() ([]byte, error) {
	n, err := loadNCCL()
	if err != nil {
		return nil, err
	}
	var id ncclUniqueID
	if err := n.check("ncclGetUniqueId", n.getUniqueID(unsafe.Pointer(&id)), 0); err != nil {
		return nil, err
	}
	return id.Internal[:], nil
}

// NewCollective joins the NCCL group id as rank of size, on this backend's
// device. It blocks until every rank has joined.
func (b *Backend) NewCollective(id []byte, rank, size int) (kernels.Collective, error) {
	n, err := loadNCCL()
	if err != nil {
		return nil, err
	}
	var uid ncclUniqueID
	if len(id) != len(uid.Internal) {
		return nil, fmt.Errorf("cuda: an NCCL id of %d bytes, want %d", len(id), len(uid.Internal))
	}
	if rank < 0 || rank >= size {
		return nil, fmt.Errorf("cuda: rank %d of a group of %d", rank, size)
	}
	copy(uid.Internal[:], id)
	b.enter()
	defer b.exit()
	c := &NCCL{b: b, n: n, rank: rank, size: size}
	d := b.d
	if err := d.check("cuStreamCreate", d.streamCreate(unsafe.Pointer(&c.side), cuStreamNonBlocking)); err != nil {
		return nil, err
	}
	for _, ev := range []*uintptr{&c.forkEv, &c.joinEv} {
		if err := d.check("cuEventCreate", d.eventCreate(unsafe.Pointer(ev), cuEventDisableTiming)); err != nil {
			c.freeStream()
			return nil, err
		}
	}
	if err := n.check("ncclCommInitRank", ncclResult(n.commInitRank(&c.comm, int32(size), uid, int32(rank))), 0); err != nil {
		c.freeStream()
		return nil, err
	}
	return c, nil
}

// freeStream destroys the side stream and its events (with the backend entered).
func (c *NCCL) freeStream() {
	d := c.b.d
	for _, ev := range []uintptr{c.forkEv, c.joinEv} {
		if ev != 0 {
			d.eventDestroy(ev)
		}
	}
	if c.side != 0 { // work still queued on it finishes first (an aborted group's ends at once)
		d.streamDestroy(c.side)
	}
	c.side, c.forkEv, c.joinEv = 0, 0, 0
}

func ncclType(dt kernels.DType) (int32, error) {
	switch dt {
	case kernels.F32:
		return ncclFloat32, nil
	case kernels.F16:
		return ncclFloat16, nil
	case kernels.BF16:
		return ncclBfloat16, nil
	case kernels.I32:
		return ncclInt32, nil
	}
	return 0, fmt.Errorf("cuda: NCCL has no dtype for %v", dt)
}

// group queues op on each buffer between ncclGroupStart and ncclGroupEnd,
// on the backend's stream, or, started, on the side stream after the work
// queued so far on the backend's.
func (c *NCCL) group(what string, bufs []kernels.Buf, started bool, op func(b kernels.Buf, dt int32, stream uintptr) ncclResult) error {
	if c.aborted.Load() {
		return errors.New("cuda: the NCCL group was aborted")
	}
	c.b.enter()
	defer c.b.exit()
	stream := c.b.stream
	if started {
		d := c.b.d
		if err := d.check("cuEventRecord", d.eventRecord(c.forkEv, c.b.stream)); err != nil {
			return err
		}
		if err := d.check("cuStreamWaitEvent", d.streamWaitEvent(c.side, c.forkEv, 0)); err != nil {
			return err
		}
		stream, c.outstanding = c.side, true
	}
	if err := c.n.check("ncclGroupStart", c.n.groupStart(), c.comm); err != nil {
		return err
	}
	var first error
	for _, buf := range bufs {
		dt, err := ncclType(buf.DType)
		if err == nil {
			if started {
				c.b.launches++ // not queued: a profile's events are on the backend's stream
			} else {
				c.b.queued(what)
			}
			err = c.n.check(what, op(buf, dt, stream), c.comm)
		}
		if err != nil && first == nil {
			first = err
		}
	}
	if err := c.n.check("ncclGroupEnd", c.n.groupEnd(), c.comm); err != nil && first == nil {
		first = err
	}
	return first
}

func (c *NCCL) allReduce(bufs []kernels.Buf, mean, started bool) error {
	red := reduction(mean)
	return c.group("ncclAllReduce", bufs, started, func(b kernels.Buf, dt int32, stream uintptr) ncclResult {
		return c.n.allReduce(ptrOf(b), ptrOf(b), uintptr(b.N), dt, red, c.comm, stream)
	})
}

// reduction is NCCL's operation for a sum, or a mean.
func reduction(mean bool) int32 {
	if mean {
		return ncclAvg
	}
	return ncclSum
}

// AllReduce sums (or averages, with ncclAvg) each buffer over the ranks, in
// place, on the backend's stream.
func (c *NCCL) AllReduce(bufs []kernels.Buf, mean bool) error { return c.allReduce(bufs, mean, false) }

// StartAllReduce is AllReduce on the side stream, overlapping the work
// queued after it until Join.
func (c *NCCL) StartAllReduce(bufs []kernels.Buf, mean bool) error {
	return c.allReduce(bufs, mean, true)
}

// Join makes the backend's stream wait for the collectives started so far.
func (c *NCCL) Join() error {
	c.b.enter()
	defer c.b.exit()
	if !c.outstanding {
		return nil
	}
	d := c.b.d
	if err := d.check("cuEventRecord", d.eventRecord(c.joinEv, c.side)); err != nil {
		return err
	}
	if err := d.check("cuStreamWaitEvent", d.streamWaitEvent(c.b.stream, c.joinEv, 0)); err != nil {
		return err
	}
	c.outstanding = false
	return nil
}

// Broadcast copies root's buffers into every rank's, in place.
func (c *NCCL) Broadcast(bufs []kernels.Buf, root int) error {
	return c.group("ncclBroadcast", bufs, false, func(b kernels.Buf, dt int32, stream uintptr) ncclResult {
		return c.n.broadcast(ptrOf(b), ptrOf(b), uintptr(b.N), dt, int32(root), c.comm, stream)
	})
}

// part is the rank-th of the size equal parts of b: its address and length.
func (c *NCCL) part(b kernels.Buf) (uintptr, uintptr) {
	if b.N%c.size != 0 {
		panic(fmt.Sprintf("cuda: a buffer of %d elements split in %d parts", b.N, c.size))
	}
	n := b.N / c.size
	return ptrOf(b) + uintptr(c.rank*n*b.DType.Size()), uintptr(n)
}

// StartReduceScatter reduces each buffer into this rank's part of it, in
// place (NCCL's in-place reduce-scatter: the result where the rank's part
// of the input is), on the side stream until Join.
func (c *NCCL) StartReduceScatter(bufs []kernels.Buf, mean bool) error {
	red := reduction(mean)
	return c.group("ncclReduceScatter", bufs, true, func(b kernels.Buf, dt int32, stream uintptr) ncclResult {
		mine, n := c.part(b)
		return c.n.reduceScatter(ptrOf(b), mine, n, dt, red, c.comm, stream)
	})
}

// AllGather copies each rank's part of each buffer into every rank's, in
// place, on the backend's stream.
func (c *NCCL) AllGather(bufs []kernels.Buf) error {
	return c.group("ncclAllGather", bufs, false, func(b kernels.Buf, dt int32, stream uintptr) ncclResult {
		mine, n := c.part(b)
		return c.n.allGather(mine, ptrOf(b), n, dt, c.comm, stream)
	})
}

// Abort is ncclCommAbort: it ends the communicator's queued and blocked
// work, also a collective waiting for a rank that died. It takes no backend
// lock (the stream may be blocked in one) and may run on any goroutine.
func (c *NCCL) Abort() {
	if c.aborted.Swap(true) {
		return
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c.b.d.ctxSetCurrent(c.b.ctx)
	c.n.commAbort(c.comm)
}

// Close finalises and destroys the communicator (after Abort, only frees
// the side stream).
func (c *NCCL) Close() error {
	c.b.enter()
	defer c.b.exit()
	defer c.freeStream()
	if c.aborted.Swap(true) {
		return nil
	}
	if err := c.n.check("ncclCommFinalize", c.n.commFinalize(c.comm), c.comm); err != nil {
		c.n.commAbort(c.comm)
		return err
	}
	return c.n.check("ncclCommDestroy", c.n.commDestroy(c.comm), 0)
}
