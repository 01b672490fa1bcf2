package benchmarks

import (
	"fmt"
	"time"

	"github.com/leangrad/leangrad/kernels/cuda"
	"github.com/leangrad/leangrad/tensor"
)

// deviceProfiler is implemented by backends that attribute device time to
// operations (CUDA).
type deviceProfiler interface {
	StartProfile()
	StopProfile() ([]cuda.OpTime, error)
	Delay(time.Duration)
}

// Profile runs o.Steps eager training steps of spec on dev with the
// device's profiler on, and returns each kind of operation's device time
// per step, the most first, and the device time of a step. The steps are
// queued behind a delay kernel, so that the device runs them back to back
// and host gaps do not count: what remains is the device work a captured
// step replays.
func Profile(dev *tensor.Device, spec Spec, o Options) ([]cuda.OpTime, float64, error) {
	p, ok := dev.Backend().(deviceProfiler)
	if !ok {
		return nil, 0, fmt.Errorf("%s has no device profiler", dev.Name())
	}
	m, ok := Models[spec.Model]
	if !ok {
		return nil, 0, fmt.Errorf("unknown model %q", spec.Model)
	}
	c, err := variant(m, spec.Config)
	if err != nil {
		return nil, 0, err
	}
	s, err := newStepper(dev, m, c, spec.Batch, o.Seed, false)
	if err != nil {
		return nil, 0, err
	}
	defer s.release()
	for i := 0; i < max(o.Warmup, 2); i++ {
		if err := s.step(); err != nil {
			return nil, 0, err
		}
	}
	if err := dev.Synchronize(); err != nil {
		return nil, 0, err
	}
	p.Delay(time.Duration(o.Steps) * 20 * time.Millisecond)
	p.StartProfile()
	for i := 0; i < o.Steps; i++ {
		if err := s.step(); err != nil {
			p.StopProfile()
			return nil, 0, err
		}
	}
	ops, err := p.StopProfile()
	if err != nil {
		return nil, 0, err
	}
	var total float64
	for i := range ops {
		ops[i].MS /= float64(o.Steps)
		ops[i].Count /= o.Steps
		total += ops[i].MS
	}
	return ops, total, nil
}
