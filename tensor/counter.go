package tensor

import (
	"encoding/binary"

	"github.com/leangrad/leangrad/kernels"
)

// Counter is a device-resident int64 that operations read and advance
// without the host: the random generator's position during a captured step
// (Generator.BeginDevice), AdamW's step count, the Philox bases. On the
// device it is kernels.CounterLen I32 elements holding a little-endian
// two's-complement int64; Buf is what operations take.
type Counter struct{ t *Tensor }

// NewCounter returns a counter at v on dev, outside any scope: Release it.
// A counter at 0 is made on the device, without a host exchange.
func NewCounter(dev *Device, v int64) *Counter {
	c := &Counter{Zeros(dev, I32, kernels.CounterLen).Keep()}
	if v != 0 {
		c.Write(v)
	}
	return c
}

// Buf is the counter's device buffer.
func (c *Counter) Buf() kernels.Buf { return c.t.Buf() }

// Read waits for the device and returns the counter's value.
func (c *Counter) Read() int64 { return int64(binary.LittleEndian.Uint64(c.t.Raw())) }

// Write queues a write of v into the counter.
func (c *Counter) Write(v int64) {
	c.t.dev.mustExchange("Counter.Write")
	var raw [8]byte
	binary.LittleEndian.PutUint64(raw[:], uint64(v))
	c.t.Backend().Write(c.t.Buf(), raw[:])
}

// Release frees the counter's memory.
func (c *Counter) Release() { c.t.Release() }
