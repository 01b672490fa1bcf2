package tensor

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cuda"
)

// Options configure a device when it is opened; see kernels.Options.
type Options = kernels.Options

// F32Matmul is how a GPU multiplies F32 matrices (Options.MatmulF32); see
// kernels.F32Matmul.
type F32Matmul = kernels.F32Matmul

// The F32 matmul modes; see kernels.F32TF32x3 (the default), F32Strict
// and F32TF32.
const (
	F32TF32x3 = kernels.F32TF32x3
	F32Strict = kernels.F32Strict
	F32TF32   = kernels.F32TF32
)

var (
	openMu  sync.Mutex
	devices = map[string]*Device{}
)

// ErrOptionsConflict is wrapped by the error of an OpenWith whose options
// differ from those the device is already open with.
var ErrOptionsConflict = errors.New("the device is already open with other options")

// Open returns the device named by spec: "cpu", "cuda" (the first GPU),
// "cuda:N", or "auto" (the first GPU when one is usable, else the CPU; use
// OpenAuto to learn why it fell back). Opening a GPU binds the CUDA libraries
// and compiles the kernels on first use; the error says which library was
// not found, and where it was looked for.
// A device already open is returned as it is.
func Open(spec string) (*Device, error) { return open(spec, nil) }

// OpenWith is Open with options (the CPU has none to apply). Opening a
// device that is already open with other options is an error naming both:
// one process has one handle per device, and its backend one
// configuration.
func OpenWith(spec string, opts Options) (*Device, error) { return open(spec, &opts) }

// DeviceSpecs names what Open takes, for messages and -h.
const DeviceSpecs = "cpu, cuda, cuda:N or auto (the GPU if there is one)"

// DeviceSpec names a device as Open reads it: "cpu", "cuda", "cuda:N" or
// "auto". It is a flag.Value: Set refuses any other name.
type DeviceSpec string

// ParseDeviceSpec checks s's grammar and returns it as a DeviceSpec.
func ParseDeviceSpec(s string) (DeviceSpec, error) {
	if _, _, err := parseSpec(s); err != nil {
		return "", err
	}
	return DeviceSpec(s), nil
}

// Set reads s as ParseDeviceSpec does.
func (d *DeviceSpec) Set(s string) error {
	v, err := ParseDeviceSpec(s)
	if err == nil {
		*d = v
	}
	return err
}

func (d DeviceSpec) String() string { return string(d) }

// CUDA reports whether d names a GPU ("cuda", "cuda:N", or "auto" on a
// machine with a usable one) and, for cuda:N, its number (-1 otherwise).
func (d DeviceSpec) CUDA() (ok bool, index int) {
	kind, index, _ := parseSpec(string(d))
	switch kind {
	case "cuda":
		return true, index
	case "auto":
		return cuda.Available() == nil, -1
	}
	return false, -1
}

// parseSpec splits a device spec into its kind ("cpu", "cuda", "auto")
// and, for cuda:N, N (else -1).
func parseSpec(spec string) (kind string, index int, err error) {
	switch {
	case spec == "cpu":
		return "cpu", -1, nil
	case spec == "auto" || spec == "":
		return "auto", -1, nil
	case spec == "cuda":
		return "cuda", -1, nil
	case strings.HasPrefix(spec, "cuda:"):
		i, err := strconv.Atoi(strings.TrimPrefix(spec, "cuda:"))
		if err != nil || i < 0 {
			return "", 0, fmt.Errorf("device %q: want cuda:N with N a device number", spec)
		}
		return "cuda", i, nil
	}
	return "", 0, fmt.Errorf("unknown device %q: want %s", spec, DeviceSpecs)
}

func open(spec string, opts *Options) (*Device, error) {
	kind, index, err := parseSpec(spec)
	switch {
	case err != nil:
		return nil, err
	case kind == "cpu":
		return CPU(), nil
	case kind == "auto":
		if cuda.Available() == nil {
			d, err := openCUDA(0, opts)
			if err == nil || errors.Is(err, ErrOptionsConflict) {
				return d, err // a conflict is an error, not a reason to fall back
			}
		}
		return CPU(), nil
	}
	return openCUDA(max(index, 0), opts)
}

// OpenAuto returns the first GPU if one can be used, and otherwise the CPU
// with the reason the GPU could not be used.
func OpenAuto() (dev *Device, fallback string) { return openAuto(nil) }

// OpenAutoWith is OpenAuto with options for a GPU.
func OpenAutoWith(opts Options) (dev *Device, fallback string) { return openAuto(&opts) }

func openAuto(opts *Options) (dev *Device, fallback string) {
	if err := cuda.Available(); err != nil {
		return CPU(), err.Error()
	}
	d, err := openCUDA(0, opts)
	if err != nil {
		return CPU(), err.Error()
	}
	return d, ""
}

// openCUDA opens cuda:index, with opts (nil: the defaults, or whatever the
// device is already open with).
func openCUDA(index int, opts *Options) (*Device, error) {
	openMu.Lock()
	defer openMu.Unlock()
	name := fmt.Sprintf("cuda:%d", index)
	if d := devices[name]; d != nil {
		if have := d.b.(*cuda.Backend).Options(); opts != nil && *opts != have {
			return nil, fmt.Errorf("%w: device %s is open with %+v, not %+v", ErrOptionsConflict, name, have, *opts)
		}
		return d, nil
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	b, err := cuda.Open(index, o)
	if err != nil {
		return nil, fmt.Errorf("device %s: %w", name, err)
	}
	d := NewDevice(b)
	devices[name] = d
	return d, nil
}

// Info describes the device: its kind and number, model, capability,
// memory, and the libraries its backend runs on.
func (d *Device) Info() kernels.Info { return d.b.Info() }

// MemInfo reports the device's free and total bytes as its driver sees them
// (for a GPU, what nvidia-smi shows), beside the pool's own statistics.
func (d *Device) MemInfo() (free, total int64) { return d.Allocator().Source().MemInfo() }
