package benchmarks

import (
	"fmt"
	"time"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// deviceProfiler is implemented by backends that attribute device time to
// operations (CUDA), and by hostProfiler.
type deviceProfiler interface {
	kernels.Profiler
	Delay(time.Duration)
}

// Profile runs o.Steps eager training steps of spec on dev with the
// device's profiler on, and returns each kind of operation's time per step,
// the most first, and the time of a step's operations. On a GPU it is
// device time: the steps are queued behind a delay kernel, so that the
// device runs them back to back and host gaps do not count, and what remains
// is the device work a captured step replays. On the CPU, whose operations
// run as they are called, it is the host time of each (hostProfiler).
func Profile(dev *tensor.Device, spec Spec, o Options) ([]kernels.OpTime, float64, error) {
	p, ok := dev.Backend().(deviceProfiler)
	if !ok {
		if !dev.OnHost() {
			return nil, 0, fmt.Errorf("%s has no device profiler", dev.Name())
		}
		h := newHostProfiler(dev.Backend())
		dev, p = tensor.NewDevice(h), h
	}
	m, err := arch(spec.Model, o)
	if err != nil {
		return nil, 0, err
	}
	c, err := variant(m, spec.Config, o)
	if err != nil {
		return nil, 0, err
	}
	s, err := newStepper(dev, m, c, spec.Batch, o, false)
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
		if ops[i].Op != kernels.IdleOp { // the delay's margin ran out
			total += ops[i].MS
		}
	}
	return ops, total, nil
}
