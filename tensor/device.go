package tensor

import (
	"sync"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
)

// Device is where a tensor's memory lives and its operations run: a backend,
// its caching allocator and its default random generator.
type Device struct {
	b   kernels.Backend
	gen *Generator
}

// NewDevice wraps a backend. Most programs use CPU() or Open.
func NewDevice(b kernels.Backend) *Device {
	return &Device{b: b, gen: NewGenerator(0)}
}

var cpuDevice = sync.OnceValue(func() *Device { return NewDevice(cpu.New()) })

// CPU returns the process's CPU device.
func CPU() *Device { return cpuDevice() }

// Name is the device's name: "cpu", "cuda:0".
func (d *Device) Name() string { return d.b.Name() }

func (d *Device) String() string { return d.b.Name() }

// Backend is the device's compute backend.
func (d *Device) Backend() kernels.Backend { return d.b }

// Allocator is the device's caching allocator: its Stats, Summary,
// EmptyCache and timeline are the device's memory report.
func (d *Device) Allocator() *memory.Allocator { return d.b.Allocator() }

// Synchronize waits until the device has finished all queued work.
func (d *Device) Synchronize() error { return d.b.Synchronize() }

// Generator is the device's default random generator.
func (d *Device) Generator() *Generator { return d.gen }

// Generator hands out Philox states: every random operation takes the
// current state and advances it past the numbers it uses, so that saving
// State before an operation and restoring it replays the operation exactly.
// It is safe for concurrent use.
type Generator struct {
	mu    sync.Mutex
	state kernels.Philox
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

// Next returns the state for an operation over n elements and advances past it.
func (g *Generator) Next(n int) kernels.Philox {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.state
	g.state.Offset += s.Blocks(n)
	return s
}
