package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
)

// CUDA graphs: the work queued on the backend's stream between BeginCapture
// and EndCapture is recorded and instantiated once; each Launch then
// replays every kernel, library call and copy with one driver call. A graph
// keeps the device addresses it was captured with: the memory it uses must
// stay where it was (a planned arena).
//
// Note [thread-local capture]: the capture runs in the thread-local mode.
// A call that is not allowed while capturing (a cuMemAlloc, a
// synchronisation) made by the capturing goroutine, which stays on its OS
// thread from BeginCapture to EndCapture, fails instead of silently
// breaking the graph, as in the global mode; calls from other threads are
// not refused. The global mode refuses them too, and so cannot drive two
// devices from one process: one rank's goroutine uploading a batch while
// another device's step is captured would fail with
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (TestCUDADataParallelStep runs two
// such ranks). The backend's stream is non-blocking, so no other thread's
// call synchronises with it implicitly, and other goroutines' calls on this
// backend wait for the capture to end (Note [one goroutine captures] in
// backend.go).

const captureModeThreadLocal = 1

var _ kernels.Capturer = (*Backend)(nil)

// BeginCapture starts recording the stream's work instead of running it.
// The driver ends a capture only on the OS thread that began it, so the
// calling goroutine stays locked to its thread until EndCapture, which it
// must call itself.
func (b *Backend) BeginCapture() error {
	b.enter()
	defer b.exit()
	if b.capturing {
		return errors.New("cuda: BeginCapture while already capturing")
	}
	runtime.LockOSThread()
	if err := b.d.check("cuStreamBeginCapture", b.d.streamBeginCapture(b.stream, captureModeThreadLocal)); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	b.capturing, b.captureTid = true, syscall.Gettid()
	return nil
}

// EndCapture ends the recording and instantiates the graph. The stream
// leaves capture mode even when it fails (after an error in the captured
// work, say), so that the backend can go on eagerly.
func (b *Backend) EndCapture() (kernels.Graph, error) {
	b.enter()
	defer b.exit()
	if !b.capturing {
		return nil, errors.New("cuda: EndCapture without BeginCapture")
	}
	b.capturing = false
	b.captureDone.Broadcast()      // Note [one goroutine captures]
	defer runtime.UnlockOSThread() // BeginCapture's lock
	g := &graph{b: b}
	if err := b.d.check("cuStreamEndCapture", b.d.streamEndCapture(b.stream, unsafe.Pointer(&g.graph))); err != nil {
		return nil, fmt.Errorf("capturing a graph: %w", err)
	}
	var n uintptr
	if err := b.d.check("cuGraphGetNodes", b.d.graphGetNodes(g.graph, nil, unsafe.Pointer(&n))); err != nil {
		b.d.graphDestroy(g.graph)
		return nil, err
	}
	g.nodes = int(n)
	if err := b.d.check("cuGraphInstantiate", b.d.graphInstantiate(unsafe.Pointer(&g.exec), g.graph, 0)); err != nil {
		b.d.graphDestroy(g.graph)
		return nil, err
	}
	return g, nil
}

// Capturing reports whether the stream is being captured.
func (b *Backend) Capturing() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.capturing
}

// graph is an instantiated CUDA graph of the backend's stream.
type graph struct {
	b           *Backend
	graph, exec uintptr
	nodes       int
}

// Launch queues one replay of the graph on the stream.
func (g *graph) Launch() error {
	b := g.b
	b.enter()
	defer b.exit()
	if g.exec == 0 {
		panic("cuda: launch of a released graph")
	}
	b.queued("graph replay")
	return b.d.check("cuGraphLaunch", b.d.graphLaunch(g.exec, b.stream))
}

// Nodes is the number of operations the graph holds.
func (g *graph) Nodes() int { return g.nodes }

// Release destroys the graph. Replays already queued finish first (the
// driver defers the destruction).
func (g *graph) Release() {
	b := g.b
	b.enter()
	defer b.exit()
	if g.exec != 0 {
		b.d.graphExecDestroy(g.exec)
		b.d.graphDestroy(g.graph)
		g.exec, g.graph = 0, 0
	}
}
