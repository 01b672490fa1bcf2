package tensor

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
)

// Device is where a tensor's memory lives and its operations run: a backend,
// its caching allocator and its default random generator, shared by every
// handle on the device, and the state of the handle: its open scopes, its
// grad and autocast modes (Modes) and its sync-free sections.
//
// That state belongs to one goroutine at a time. A tensor made on a handle
// carries it, and operations take their mode from their inputs' handles, so
// a goroutine that works on its own handle (Session) never sees another's
// scopes or modes: one goroutine can train on dev while others run
// inference under autograd.NoGrad on dev.Session() handles. See Note
// [sessions].
type Device struct {
	b    kernels.Backend
	gen  *Generator
	base *Device // the handle Sessions were made from (itself for NewDevice's)
	host bool    // on base: the backend's Info().Kind is kernels.KindCPU (OnHost)

	pinnedOnce sync.Once // on base: makes pinned
	pinned     *Device   // on base: the host device over page-locked memory (Pinned)

	scope    *Scope          // the innermost open scope
	modes    Modes           // read and written by autograd
	syncFree atomic.Int32    // > 0 inside sync-free sections
	stop     <-chan struct{} // Interruptible's, while it runs
}

// ErrInterrupted is wrapped by the error of an allocation that found the
// stop of an Interruptible closed (Empty and the operations panic with it,
// TryEmpty returns it).
var ErrInterrupted = errors.New("interrupted")

// Interruptible runs f so that once stop is closed, the next tensor
// allocated on this handle fails with an error wrapping ErrInterrupted (a
// panic that Catch returns, as for running out of memory): work of many
// operations (a training step's forward and backward on a CPU, minutes
// for a large model) stops within one of them instead of at its end. Only
// the handle's goroutine may call it, as for its modes; a nil stop never
// interrupts.
func (d *Device) Interruptible(stop <-chan struct{}, f func()) {
	old := d.stop
	d.stop = stop
	defer func() { d.stop = old }()
	f()
}

// Stopping is the stop of the Interruptible running on the handle, nil
// outside one: an operation that can stop part way watches it (autograd's
// products on a backend that is a kernels.Stoppable), and when it
// stops, panics with an error wrapping ErrInterrupted.
func (d *Device) Stopping() <-chan struct{} { return d.stop }

// interrupted is the error, naming the tensor of dtype and shape it was
// to allocate, once Interruptible's stop is closed; else nil.
func (d *Device) interrupted(dtype DType, shape []int) error {
	if d.stop == nil {
		return nil
	}
	select {
	case <-d.stop:
		return fmt.Errorf("tensor: a %v tensor of shape %v not allocated: %w", dtype, shape, ErrInterrupted)
	default:
		return nil
	}
}

// Note [sessions]: PyTorch keeps grad mode, autocast and the like per
// thread. Go has no goroutine-local state, so here they belong to a Device
// handle, which the tensors made on it carry, and every operation reads
// them from its inputs (autograd.ModeOf: a Session's handle wins over the
// shared device's, so parameters made on dev and activations made on a
// session take the session's modes). The handles share the backend, the
// pool and the generator, which are safe for concurrent use.

// Modes are a handle's counters for the modes autograd switches (each is on
// while above zero) and the hook of the Backward running on it. Only
// autograd and code running on the handle's goroutine touch them.
type Modes struct {
	NoGrad      int32 // recording off (autograd.NoGrad)
	Autocast    int32 // 16-bit matmuls and convolutions (autograd.Autocast)
	AutocastTo  DType // the dtype Autocast runs them in
	Recomputing int32 // a checkpointed function runs again in Backward
	Unread      int32 // ops make a checkpointed function's result, which its recomputation does not read (autograd.Unread)
	// Kept is the running checkpointed function's record of the results
	// its ops keep for the recomputation (autograd's; nil outside one).
	Kept any
	// Offload is the autograd.Offloader whose Forward is running (nil:
	// none): checkpointed functions hand it what they keep.
	Offload any
	// GradReady is the running Backward's autograd.OnGradReady hook, which
	// the passes it runs inside (a checkpointed block's) call too.
	GradReady func(leaf *Tensor)
	// Copies is autograd.CastParameters' record of the parameters' copies
	// in the autocast dtype, which operations read instead of casting
	// (autograd's; nil: none).
	Copies any
	// Packed is autograd.PackParameters' record of the product weights
	// packed ahead, which products read instead (autograd's; nil: none).
	Packed any
	// PassEnd is what the running Backward calls when its pass ends, with
	// ok false when it failed: autograd's gradients gathered to be added to
	// the parameters' at once.
	PassEnd []func(ok bool)
	// LossScale is what the loss a running forward computes will be
	// multiplied by before Backward (a GradScaler's scale; autograd's
	// LossScaled): a loss op that makes its gradients in the forward
	// makes them for the scaled loss (nil: none).
	LossScale *Tensor
	// Seed is the running Backward's implied gradient of its scalar root
	// (a one), while the pass frees the graph as it goes (no RetainGraph):
	// a backward that receives this very tensor need not scale by it, and
	// may hand on a gradient it kept from the forward (autograd's; nil:
	// none).
	Seed *Tensor
}

// NewDevice wraps a backend. Most programs use CPU() or Open.
func NewDevice(b kernels.Backend) *Device {
	d := &Device{b: b, gen: NewGenerator(0), host: b.Info().Kind == kernels.KindCPU}
	d.base = d
	return d
}

// Session returns a new handle on d's device: the same backend, pool and
// generator, with its own scopes, modes and sync-free sections, for one
// goroutine's work. Tensors made on it may mix freely with tensors made on
// d and its other sessions.
func (d *Device) Session() *Device {
	return &Device{b: d.b, gen: d.gen, base: d.base}
}

// Close releases what the device's backend holds (the CUDA backend: its
// pool, library handles, plans, kernels, pinned buffers and stream; the
// CPU's: its pool's cached memory). It fails while tensors on the device
// still hold memory. Neither the device nor its sessions may be used after
// it; a session's Close closes the device.
func (d *Device) Close() error {
	if c, ok := d.b.(interface{ Close() error }); ok {
		if p := d.base.pinned; p != nil {
			if n := p.Allocator().Stats().Allocated[memory.All].Current; n > 0 {
				return fmt.Errorf("tensor: %s: Close while %d bytes of its page-locked host memory are allocated (release those tensors first)", d.Name(), n)
			}
			p.Allocator().EmptyCache()
		}
		if err := c.Close(); err != nil {
			return err
		}
		openMu.Lock()
		for name, e := range devices {
			if e.Same(d) {
				delete(devices, name) // the next Open opens it afresh
			}
		}
		openMu.Unlock()
		return nil
	}
	d.Allocator().EmptyCache()
	return nil
}

// Pinned is the host device whose tensors d's backend copies to and from
// directly (kernels.PinnedCopier: page-locked memory, which a GPU's copy
// engines read and write at the bus's speed, without staging): a CPU
// device of its own pool, which the host's kernels run on as on CPU(). Its
// memory is taken from the host's and cannot be swapped out: keep there
// only what crosses the bus often (an offloaded optimizer's copies). For a
// backend without such memory (the CPU's) it is CPU().
func (d *Device) Pinned() *Device {
	base := d.base
	base.pinnedOnce.Do(func() {
		pc, ok := base.b.(kernels.PinnedCopier)
		if ok {
			base.pinned = NewDevice(cpu.NewWithAllocator(memory.New(pc.PinnedSource(), memory.Config{Device: "cpu (page-locked for " + base.Name() + ")"})))
		}
	})
	if base.pinned == nil {
		return CPU()
	}
	return base.pinned
}

// Same reports whether d and e are handles on the same device.
func (d *Device) Same(e *Device) bool { return d.base == e.base }

// IsSession reports whether d was made by Session.
func (d *Device) IsSession() bool { return d.base != d }

// Modes are the handle's mode counters (see Modes).
func (d *Device) Modes() *Modes { return &d.modes }

var cpuDevice = sync.OnceValue(func() *Device { return NewDevice(cpu.New()) })

// CPU returns the process's CPU device.
func CPU() *Device { return cpuDevice() }

// Name is the device's name: "cpu", "cuda:0".
func (d *Device) Name() string { return d.b.Name() }

// OnHost reports whether the handle's backend computes on the host's cores
// in host memory (kernels.KindCPU): there is no device memory to offload
// from, no copy engine and no graph to capture. It is asked once, when
// the device is made: a GPU's Info asks its driver.
func (d *Device) OnHost() bool { return d.base.host }

func (d *Device) String() string { return d.b.Name() }

// Backend is the device's compute backend.
func (d *Device) Backend() kernels.Backend { return d.b }

// Allocator is the device's caching allocator: its Stats, Summary,
// EmptyCache and timeline are the device's memory report.
func (d *Device) Allocator() *memory.Allocator { return d.b.Allocator() }

// Synchronize waits until the device has finished all queued work.
func (d *Device) Synchronize() error {
	d.mustExchange("Synchronize")
	return d.b.Synchronize()
}

// SyncFree runs f as a sync-free section of the handle d: inside it,
// anything on d's tensors that makes the host wait for the device or
// exchange data with it (Item, Float32s, Raw, FromFloat32, Synchronize, ...)
// panics, naming the call; other handles (Sessions) are not held to it. A
// training step runs in one, so that it can be queued ahead of the device
// and captured.
func (d *Device) SyncFree(f func()) {
	d.syncFree.Add(1)
	defer d.syncFree.Add(-1)
	f()
}

// mustExchange panics inside a sync-free section.
func (d *Device) mustExchange(what string) {
	if d.syncFree.Load() > 0 {
		panic(fmt.Sprintf("tensor: %s on %s inside a sync-free section (a training step): "+
			"it would make the host wait for the device, or bake host data into a captured step", what, d.Name()))
	}
}

// Generator is the device's default random generator.
func (d *Device) Generator() *Generator { return d.gen }

// WithGenerator runs f with g as this handle's random generator: the random
// tensors f makes on d draw from g, and the generator d shares with its
// other handles is neither reseeded nor advanced. Like the rest of a
// handle's state, it belongs to the handle's goroutine while f runs.
func (d *Device) WithGenerator(g *Generator, f func()) {
	old := d.gen
	d.gen = g
	defer func() { d.gen = old }()
	f()
}

// Generator hands out Philox states: every random operation takes the
// current state and advances it past the numbers it uses, so that saving
// State before an operation and restoring it replays the operation exactly.
// It is safe for concurrent use.
//
// Between BeginDevice and EndDevice the generator's position lives on the
// device: the states it hands out are relative to a device counter that the
// operations read when they run, so that work captured once and replayed
// draws new numbers at every replay, as the counter advances.
type Generator struct {
	mu    sync.Mutex
	state kernels.Philox
	host  kernels.Philox // the host state, kept while the position is on the device
	on    bool           // between BeginDevice and EndDevice
}

// NewGenerator returns a generator seeded with seed.
func NewGenerator(seed uint64) *Generator {
	return &Generator{state: kernels.Philox{Seed: seed}}
}

// Seed restarts the generator's stream at seed.
func (g *Generator) Seed(seed uint64) {
	g.SetState(kernels.Philox{Seed: seed})
}

// State is the generator's current state.
func (g *Generator) State() kernels.Philox {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state
}

// SetState restores a state returned by State.
func (g *Generator) SetState(s kernels.Philox) {
	g.mu.Lock()
	g.state = s
	g.mu.Unlock()
}

// BeginDevice makes the generator hand out states relative to base, a
// Counter's buffer that holds the stream position, until EndDevice. Its
// seed stays the host's.
func (g *Generator) BeginDevice(base kernels.Buf) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.on {
		panic("tensor: Generator.BeginDevice twice")
	}
	g.on, g.host = true, g.state
	g.state = kernels.Philox{Seed: g.host.Seed, Base: base}
}

// EndDevice returns to the host state of BeginDevice and reports how many
// Philox blocks were handed out meanwhile: what the device counter must
// advance by.
func (g *Generator) EndDevice() (used uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.on {
		panic("tensor: Generator.EndDevice without BeginDevice")
	}
	used = g.state.Offset
	g.on, g.state = false, g.host
	return used
}

// Next returns the state for an operation over n elements and advances past it.
func (g *Generator) Next(n int) kernels.Philox {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.state
	g.state.Offset += s.Blocks(n)
	return s
}
