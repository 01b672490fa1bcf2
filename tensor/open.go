package tensor

import (
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/leangrad/leangrad/kernels/cuda"
)

var (
	openMu  sync.Mutex
	devices = map[string]*Device{}
)

// Open returns the device named by spec: "cpu", "cuda" (the first GPU),
// "cuda:N", or "auto" (the first GPU when one is usable, else the CPU; use
// OpenAuto to learn why it fell back). Opening a GPU binds the CUDA libraries
// and compiles the kernels on first use; the error says which library was
// not found, and where it was looked for.
func Open(spec string) (*Device, error) { return OpenWith(spec, cuda.Options{}) }

// OpenWith is Open with options for a GPU (ignored for the CPU). A device
// already opened keeps the options it was first opened with.
func OpenWith(spec string, opts cuda.Options) (*Device, error) {
	switch {
	case spec == "cpu":
		return CPU(), nil
	case spec == "auto" || spec == "":
		d, _ := OpenAutoWith(opts)
		return d, nil
	case spec == "cuda" || strings.HasPrefix(spec, "cuda:"):
		index := 0
		if rest, ok := strings.CutPrefix(spec, "cuda:"); ok {
			i, err := strconv.Atoi(rest)
			if err != nil || i < 0 {
				return nil, fmt.Errorf("device %q: want cuda:N with N a device number", spec)
			}
			index = i
		}
		return openCUDA(index, opts)
	}
	return nil, fmt.Errorf("unknown device %q: want cpu, cuda, cuda:N or auto", spec)
}

// OpenAuto returns the first GPU if one can be used, and otherwise the CPU
// with the reason the GPU could not be used.
func OpenAuto() (dev *Device, fallback string) { return OpenAutoWith(cuda.Options{}) }

// OpenAutoWith is OpenAuto with options for a GPU.
func OpenAutoWith(opts cuda.Options) (dev *Device, fallback string) {
	if err := cuda.Available(); err != nil {
		return CPU(), err.Error()
	}
	d, err := openCUDA(0, opts)
	if err != nil {
		return CPU(), err.Error()
	}
	return d, ""
}

func openCUDA(index int, opts cuda.Options) (*Device, error) {
	openMu.Lock()
	defer openMu.Unlock()
	name := fmt.Sprintf("cuda:%d", index)
	if d := devices[name]; d != nil {
		return d, nil
	}
	b, err := cuda.Open(index, opts)
	if err != nil {
		return nil, fmt.Errorf("device %s: %w", name, err)
	}
	d := NewDevice(b)
	devices[name] = d
	return d, nil
}

// MemInfo reports the device's free and total bytes as its driver sees them
// (for a GPU, what nvidia-smi shows), beside the pool's own statistics.
func (d *Device) MemInfo() (free, total int64) { return d.Allocator().Source().MemInfo() }
