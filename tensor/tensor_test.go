package tensor

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/x448/float16"
)

// newTestDevice returns a CPU device with a pool of its own, so that tests
// can assert exact pool statistics.
func newTestDevice() *Device {
	return NewDevice(cpuBackend(memory.New(memory.NewHeapSource(), memory.Config{Device: "cpu"})))
}

func allocated(d *Device) int64 { return d.Allocator().Stats().Allocated[memory.All].Current }

func mustPanic(t *testing.T, want string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		if r == nil {
			t.Fatalf("no panic; want one containing %q", want)
		}
		if msg, _ := r.(string); !strings.Contains(msg, want) {
			t.Fatalf("panic %v; want one containing %q", r, want)
		}
	}()
	f()
}

func TestRefcountReturnsMemoryAtLastRelease(t *testing.T) {
	d := newTestDevice()
	live := LiveCount()
	x := Zeros(d, F32, 3, 100)
	if LiveCount() != live+1 {
		t.Errorf("LiveCount %d after making one tensor, was %d", LiveCount(), live)
	}
	if got := allocated(d); got != 1536 {
		t.Fatalf("allocated %d, want 1536 (1200 rounded up to 512)", got)
	}
	x.Retain()
	x.Release()
	if allocated(d) == 0 {
		t.Fatal("memory returned while a reference remained")
	}
	v := x.View(300)
	x.Release()
	if allocated(d) != 1536 {
		t.Fatal("memory returned while a view remained")
	}
	if got := v.Float32s(); len(got) != 300 || got[299] != 0 {
		t.Fatalf("view reads %d values", len(got))
	}
	v.Release()
	if got := allocated(d); got != 0 {
		t.Fatalf("allocated %d after the last release", got)
	}
	if LiveCount() != live {
		t.Errorf("LiveCount %d after releasing everything, was %d", LiveCount(), live)
	}
}

func TestUseAfterReleasePanics(t *testing.T) {
	d := newTestDevice()
	SetDebug(true)
	defer SetDebug(false)
	x := Zeros(d, F16, 2, 3)
	x.Release()
	mustPanic(t, "Release of an already released f16 [2 3] tensor on cpu created at", x.Release)
	mustPanic(t, "use of a released f16 [2 3] tensor on cpu created at github.com/leangrad/leangrad/tensor.TestUseAfterReleasePanics", func() { x.Buf() })
	SetDebug(false)
	y := Zeros(d, F32, 4)
	y.Release()
	mustPanic(t, "creation site unknown", func() { y.Float32s() })
}

func TestShapesAndViews(t *testing.T) {
	d := newTestDevice()
	d.WithScope(func() {
		x := FromFloat32(d, []float32{1, 2, 3, 4, 5, 6}, 2, 3)
		if x.NDim() != 2 || x.Dim(-1) != 3 || x.Numel() != 6 || x.Bytes() != 24 {
			t.Errorf("shape accessors: %v", x)
		}
		v := x.View(3, -1)
		if s := v.Shape(); s[0] != 3 || s[1] != 2 || v.Block() != x.Block() {
			t.Errorf("view %v does not share storage", s)
		}
		mustPanic(t, "cannot reshape 6 elements to [4 -1]", func() { x.View(4, -1) })
		mustPanic(t, "6 values for shape [4]", func() { FromFloat32(d, make([]float32, 6), 4) })
		c := x.Clone()
		if c.Block() == x.Block() || c.Float32s()[5] != 6 {
			t.Error("clone shares storage or lost data")
		}
		if got := FromInt32(d, []int32{7, -8}, 2).Int32s(); got[1] != -8 {
			t.Errorf("int32 round trip: %v", got)
		}
		if got := Full(d, F32, 2.5, 1).Item(); got != 2.5 {
			t.Errorf("Item = %v", got)
		}
	})
	if allocated(d) != 0 {
		t.Errorf("scope left %d bytes allocated", allocated(d))
	}
}

func TestScopes(t *testing.T) {
	d := newTestDevice()
	var kept, escaped *Tensor
	outer := d.NewScope()
	d.WithScope(func() {
		a := Zeros(d, F32, 10)
		kept = Zeros(d, F32, 20).Keep()
		inner := d.NewScope()
		escaped = Ones(d, F32, 30)
		inner.Escape(escaped) // to the scope around inner, the WithScope one
		inner.Close()
		if escaped.Released() {
			t.Fatal("escaped tensor released by its own scope")
		}
		a.Release() // released early: the scope must not release it again
	})
	if !escaped.Released() {
		t.Error("escaped tensor outlived the scope it escaped to")
	}
	if kept.Released() {
		t.Error("kept tensor released by the scope")
	}
	mustPanic(t, "scope closed twice", func() {
		s := d.NewScope()
		s.Close()
		s.Close()
	})
	mustPanic(t, "inner scope is still open", func() {
		s1 := d.NewScope()
		d.NewScope()
		s1.Close()
	})
	// Restore the stack the failed Close left behind.
	for d.scope != outer {
		d.scope = d.scope.parent
	}
	outer.Close()
	kept.Release()
	if allocated(d) != 0 {
		t.Errorf("%d bytes left allocated", allocated(d))
	}
}

func TestFinalizerCatchesLeaks(t *testing.T) {
	d := newTestDevice()
	SetDebug(true)
	defer SetDebug(false)
	before := Leaks()
	func() {
		leaked := Zeros(d, F32, 1000)
		_ = leaked
	}()
	live := LiveTensors()
	found := false
	for _, lt := range live {
		if lt.Bytes == 4000 && strings.Contains(lt.Site, "TestFinalizerCatchesLeaks") {
			found = true
		}
	}
	if !found {
		t.Errorf("LiveTensors does not name the creation site: %+v", live)
	}
	if !strings.Contains(LiveReport(), "TestFinalizerCatchesLeaks") {
		t.Errorf("LiveReport does not name the creation site:\n%s", LiveReport())
	}
	for i := 0; i < 20 && Leaks() == before; i++ {
		CollectLeaks()
	}
	if Leaks() != before+1 {
		t.Fatalf("leaks = %d, want %d", Leaks(), before+1)
	}
	if got := allocated(d); got != 0 {
		t.Errorf("leaked tensor's memory not returned: %d bytes allocated", got)
	}
}

// TestF16RoundTrip checks the casts against IEEE 754: every binary16 value
// converts to float32 exactly and back to the same bits; float32 values
// round to nearest even.
func TestF16RoundTrip(t *testing.T) {
	d := newTestDevice()
	d.WithScope(func() {
		raw := make([]byte, 2*65536)
		for i := 0; i < 65536; i++ {
			raw[2*i], raw[2*i+1] = byte(i), byte(i>>8)
		}
		h := FromBytes(d, F16, raw, 65536)
		f := Empty(d, F32, 65536)
		d.Backend().Cast(f.Buf(), h.Buf())
		vals := f.Float32s()
		for i, v := range vals {
			want := float16.Frombits(uint16(i)).Float32()
			if math.Float32bits(v) != math.Float32bits(want) && !(math.IsNaN(float64(v)) && math.IsNaN(float64(want))) {
				t.Fatalf("f16 %#04x -> f32 %v, want %v", i, v, want)
			}
		}
		back := Empty(d, F16, 65536)
		d.Backend().Cast(back.Buf(), f.Buf())
		braw := back.Raw()
		for i := 0; i < 65536; i++ {
			got := uint16(braw[2*i]) | uint16(braw[2*i+1])<<8
			if got != uint16(i) && !float16.Frombits(uint16(i)).IsNaN() {
				t.Fatalf("f16 %#04x -> f32 -> f16 %#04x", i, got)
			}
		}
		// Rounding of float32 values: halfway cases go to even, overflow to inf,
		// tiny values to subnormals or zero.
		cases := []struct {
			in   float32
			want uint16
		}{
			{1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {65520, 0x7c00}, {1e6, 0x7c00},
			{1 + 1.0/2048, 0x3c00},         // halfway between 1 and the next half: to even (1)
			{1 + 3.0/2048, 0x3c02},         // halfway between two: to even
			{5.960464477539063e-8, 0x0001}, // smallest subnormal
			{2.9802322387695312e-8, 0},     // half the smallest subnormal: to even (0)
			{float32(math.Inf(-1)), 0xfc00},
		}
		in := make([]float32, len(cases))
		for i, c := range cases {
			in[i] = c.in
		}
		src := FromFloat32(d, in, len(in))
		dst := Empty(d, F16, len(in))
		d.Backend().Cast(dst.Buf(), src.Buf())
		r := dst.Raw()
		for i, c := range cases {
			if got := uint16(r[2*i]) | uint16(r[2*i+1])<<8; got != c.want {
				t.Errorf("f32 %v -> f16 %#04x, want %#04x", c.in, got, c.want)
			}
		}
		// Random float32s agree with x448/float16's round-to-nearest-even.
		rng := rand.New(rand.NewPCG(3, 4))
		rv := make([]float32, 10000)
		for i := range rv {
			rv[i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(12)-6)))
		}
		rs := FromFloat32(d, rv, len(rv))
		rd := Empty(d, F16, len(rv))
		d.Backend().Cast(rd.Buf(), rs.Buf())
		rr := rd.Raw()
		for i, v := range rv {
			if got, want := uint16(rr[2*i])|uint16(rr[2*i+1])<<8, float16.Fromfloat32(v).Bits(); got != want {
				t.Fatalf("f32 %v -> f16 %#04x, want %#04x", v, got, want)
			}
		}
	})
}

func TestGeneratorReplays(t *testing.T) {
	d := newTestDevice()
	d.WithScope(func() {
		d.Generator().Seed(5)
		st := d.Generator().State()
		a := Rand(d, F32, -1, 1, 37).Float32s()
		b := Randn(d, F32, 0, 1, 37).Float32s()
		if d.Generator().State().Offset != 2*10 {
			t.Errorf("offset %d after two 37-element draws, want 20", d.Generator().State().Offset)
		}
		d.Generator().SetState(st)
		a2 := Rand(d, F32, -1, 1, 37).Float32s()
		b2 := Randn(d, F32, 0, 1, 37).Float32s()
		for i := range a {
			if a[i] != a2[i] || b[i] != b2[i] {
				t.Fatalf("replay differs at %d", i)
			}
			if a[i] < -1 || a[i] >= 1 {
				t.Fatalf("uniform %v outside [-1, 1)", a[i])
			}
		}
		c := Rand(d, F32, -1, 1, 37).Float32s()
		if c[0] == a[0] && c[1] == a[1] {
			t.Error("generator did not advance")
		}
	})
}

func TestToDevice(t *testing.T) {
	d1, d2 := newTestDevice(), newTestDevice()
	d2s := d2.NewScope() // each device handle has its own scopes
	defer d2s.Close()
	d1.WithScope(func() {
		x := FromFloat32(d1, []float32{1, 2, 3}, 3)
		y := x.To(d2)
		if y.Device() != d2 || y.Float32s()[2] != 3 {
			t.Errorf("To: %v %v", y, y.Float32s())
		}
		if allocated(d2) == 0 {
			t.Error("copy not allocated on the target device")
		}
	})
}

func TestTryEmptyReturnsOOM(t *testing.T) {
	a := memory.New(memory.Limit(memory.NewHeapSource(), 4<<20), memory.Config{Device: "cpu"})
	d := NewDevice(cpuBackend(a))
	if _, err := TryEmpty(d, F32, 2<<20); err == nil || !strings.Contains(err.Error(), "Tried to allocate 8.00 MiB") {
		t.Errorf("TryEmpty over capacity: %v", err)
	}
	defer func() {
		if _, ok := recover().(*memory.OOMError); !ok {
			t.Error("Empty over capacity did not panic with *memory.OOMError")
		}
	}()
	Empty(d, F32, 2<<20)
}

// A session is a handle on the same device with its own scopes and sync-free
// sections: a scope of one handle neither collects nor releases the other's
// tensors, and tensors of both mix (On moves a handle across).
func TestSessionsHaveTheirOwnScopes(t *testing.T) {
	d := newTestDevice()
	s := d.Session()
	if !s.IsSession() || d.IsSession() || !s.Same(d) || s.Same(newTestDevice()) || s.Allocator() != d.Allocator() {
		t.Fatal("a session is not a second handle on the same device")
	}
	var onS *Tensor
	d.WithScope(func() {
		onS = Zeros(s, F32, 8) // made on the session while d's scope is open
		Zeros(d, F32, 4)
	})
	if onS.Released() {
		t.Error("the device's scope released a session's tensor")
	}
	s.WithScope(func() {
		v := onS.On(d)
		if v.Device() != d || v.Block() != onS.Block() {
			t.Error("On did not make a handle on d sharing the storage")
		}
		v.Release()
	})
	onS.Release()
	d.SyncFree(func() {
		s.WithScope(func() {
			if got := FromFloat32(s, []float32{1, 2}, 2).Float32s(); got[1] != 2 {
				t.Error("a session's read inside the device's sync-free section")
			}
		})
	})
	d.WithScope(func() {
		mustPanic(t, "inside a sync-free section", func() { d.SyncFree(func() { Zeros(d, F32, 1).Item() }) })
	})
	if got := allocated(d); got != 0 {
		t.Errorf("%d bytes left allocated", got)
	}
}

func TestCPUInfo(t *testing.T) {
	d := CPU()
	in := d.Info()
	if in.Kind != "cpu" || in.Name != "cpu" || in.Index != 0 || in.Memory <= 0 || in.Capability == "" || in.Libraries["sgemm"] != in.Capability {
		t.Errorf("CPU Info %+v", in)
	}
	if e, err := OpenWith("cpu", Options{StrictConvF32: true}); err != nil || e != d {
		t.Errorf("OpenWith(cpu, options) = %v, %v: the CPU has no options to conflict", e, err)
	}
}

// Catch turns an allocation that the pool cannot serve into an error, and
// lets programmer errors panic.
func TestCatch(t *testing.T) {
	d := NewDevice(cpuBackend(memory.New(memory.Limit(memory.NewHeapSource(), 1<<20), memory.Config{Device: "cpu"})))
	err := Catch(func() {
		d.WithScope(func() {
			Zeros(d, F32, 1024)       // fits
			Zeros(d, F32, 1024, 1024) // 4 MiB does not
		})
	})
	var oom *memory.OOMError
	if !errors.As(err, &oom) || !errors.Is(err, memory.ErrOutOfMemory) {
		t.Errorf("Catch returned %v, want the *OOMError", err)
	}
	if got := allocated(d); got != 0 {
		t.Errorf("%d bytes left allocated after the failed scope", got)
	}
	mustPanic(t, "negative dimension", func() { Catch(func() { Zeros(d, F32, -1) }) })
}

// TestSizesThatOverflow: a shape whose elements do not fit an int panics
// naming it, before any memory is asked for; one whose bytes do not fit
// an int64 is the pool's out-of-memory error, which Catch returns; no
// tensor of a wrapped size is ever made.
func TestSizesThatOverflow(t *testing.T) {
	dev := newTestDevice()
	for _, c := range []struct {
		name  string
		make  func()
		panic string // a programmer error's message, or "" for an error
	}{
		{"elements past an int", func() { Zeros(dev, F32, 1<<40, 1<<40) }, "tensor: shape [1099511627776 1099511627776] has more elements than an int holds"},
		{"elements past an int, then a sum", func() { Ones(dev, F32, 1<<62+1, 4) }, "tensor: shape [4611686018427387905 4] has more elements than an int holds"},
		{"a negative dimension", func() { Zeros(dev, F32, -1, 4) }, "tensor: negative dimension in shape [-1 4]"},
		{"bytes past an int64", func() { Zeros(dev, F32, 1<<61) }, ""},
		{"raw bytes past an int", func() { FromBytes(dev, F32, make([]byte, 16), 1<<62) }, "tensor: 16 bytes for f32 shape [4611686018427387904] (4611686018427387904 elements of 4 bytes)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := dev.Allocator().Stats().Allocations[memory.All].Allocated
			var got any
			err := func() (err error) {
				defer func() { got = recover() }()
				return Catch(c.make)
			}()
			if c.panic != "" {
				if got != c.panic {
					t.Errorf("panic %v, want %q", got, c.panic)
				}
			} else if got != nil || !errors.Is(err, memory.ErrOutOfMemory) || !strings.Contains(err.Error(), "more bytes than a 64-bit count holds") {
				t.Errorf("panic %v, error %v: want an out-of-memory error naming the size", got, err)
			}
			if after := dev.Allocator().Stats().Allocations[memory.All].Allocated; after != before {
				t.Errorf("%d allocations asked for", after-before)
			}
		})
	}
}

// TestInterleavedScopesNameSessions: scopes closed out of order, as two
// goroutines that share one device handle close theirs, panic saying to
// give each goroutine its own Session.
func TestInterleavedScopesNameSessions(t *testing.T) {
	dev := newTestDevice()
	first := dev.NewScope()  // one goroutine's
	second := dev.NewScope() // another's, on the same handle
	defer func() {
		r, _ := recover().(string)
		if !strings.Contains(r, "scope closed while an inner scope is still open") || !strings.Contains(r, "its own dev.Session()") {
			t.Errorf("panic %q", r)
		}
		second.Close()
		first.Close()
	}()
	first.Close()
}

// TestOnHost: the CPU backend's handles, sessions included, compute on the
// host (TestCUDAOpen checks a GPU's).
func TestOnHost(t *testing.T) {
	dev := NewDevice(cpu.New())
	if !dev.OnHost() || !dev.Session().OnHost() || dev.Info().Kind != kernels.KindCPU {
		t.Errorf("OnHost of the CPU's handle %v, of its session %v; Info().Kind %q", dev.OnHost(), dev.Session().OnHost(), dev.Info().Kind)
	}
}

// TestInterruptible: inside Interruptible, once its stop is closed, an
// allocation on the handle fails with ErrInterrupted (TryEmpty returns it,
// Empty panics with it, which Catch returns); before that, outside it, on
// another handle, or with a nil stop, allocations succeed.
func TestInterruptible(t *testing.T) {
	dev := NewDevice(cpu.New())
	other := dev.Session()
	stop := make(chan struct{})
	dev.Interruptible(stop, func() {
		Empty(dev, F32, 4).Release()
		close(stop)
		if x, err := TryEmpty(dev, F32, 2, 3); x != nil || !errors.Is(err, ErrInterrupted) || !strings.Contains(err.Error(), "shape [2 3]") {
			t.Errorf("TryEmpty after the stop: %v, %v", x, err)
		}
		if err := Catch(func() { Empty(dev, BF16, 5) }); !errors.Is(err, ErrInterrupted) {
			t.Errorf("Empty after the stop: %v", err)
		}
		Empty(other, F32, 4).Release() // another handle
		dev.Interruptible(nil, func() { Empty(dev, F32, 4).Release() })
		if _, err := TryEmpty(dev, F32, 1); !errors.Is(err, ErrInterrupted) {
			t.Errorf("after a nested Interruptible(nil): %v", err)
		}
	})
	Empty(dev, F32, 4).Release()
}
