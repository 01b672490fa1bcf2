package tensor

import (
	"math"
	"testing"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cuda"
	"github.com/leangrad/leangrad/memory"
)

func testCounter(t *testing.T, dev *Device) {
	before := dev.Allocator().Stats().Allocated[memory.All].Current
	for _, v := range []int64{0, 1, -1, math.MaxInt64, math.MinInt64, 1 << 40} {
		c := NewCounter(dev, v)
		if got := c.Read(); got != v {
			t.Errorf("NewCounter(%d).Read() = %d", v, got)
		}
		dev.Backend().Increment(c.Buf(), 3, kernels.Buf{})
		if got := c.Read(); got != v+3 {
			t.Errorf("counter at %d, incremented by 3 on the device: %d", v, got)
		}
		c.Write(-v)
		if got := c.Read(); got != -v {
			t.Errorf("Write(%d): %d", -v, got)
		}
		c.Release()
	}
	// A counter at 0 is made without the host: inside a sync-free section.
	dev.SyncFree(func() { NewCounter(dev, 0).Release() })
	if after := dev.Allocator().Stats().Allocated[memory.All].Current; after != before {
		t.Errorf("allocated %d bytes after the counters were released, %d before", after, before)
	}
}

func TestCounter(t *testing.T) { testCounter(t, CPU()) }

func TestCUDACounter(t *testing.T) {
	if err := cuda.Available(); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	d, err := Open("cuda:0")
	if err != nil {
		t.Fatal(err)
	}
	testCounter(t, d)
	// Closed, so that the package's other tests open it with their options.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}
