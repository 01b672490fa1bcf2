// Package testdev gives tests the GPU: CUDA opens cuda:0 or skips the test,
// naming why, so that the same test binaries pass on CPU-only machines.
//
// A behaviour has one test body that takes the device (and whatever differs
// between devices, such as a batch size, as arguments): TestX runs it on
// tensor.CPU(), TestCUDAX on CUDA(t). No package global is swapped, so
// tests may run in parallel.
package testdev

import (
	"fmt"
	"net"
	"testing"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/kernels/cuda"
	"github.com/leangrad/leangrad/tensor"
)

// CUDA returns the cuda:0 device, or skips t when there is no usable GPU.
func CUDA(t testing.TB) *tensor.Device {
	t.Helper()
	if err := cuda.Available(); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	d, err := tensor.Open("cuda:0")
	if err != nil {
		t.Fatalf("cuda:0 is present but does not open: %v", err)
	}
	return d
}

// FakeGPU is a new device of the CPU backend under a GPU's name and kind:
// not the host's memory (tensor.Device.OnHost), as far as the plans of a
// run are concerned (an offloaded optimizer's host copies go to
// tensor.CPU, through the backend's reads and writes), with the CPU's
// arithmetic.
func FakeGPU() *tensor.Device { return tensor.NewDevice(gpuNamed{cpu.New()}) }

// gpuNamed is the CPU backend under a GPU's name and kind.
type gpuNamed struct{ *cpu.Backend }

func (gpuNamed) Name() string { return "cuda:0" }

func (g gpuNamed) Info() kernels.Info {
	in := g.Backend.Info()
	in.Kind, in.Name = kernels.KindCUDA, "cuda:0"
	return in
}

// CUDAs returns the first n GPUs (cuda:0 ... cuda:n-1), or skips t when
// there are fewer.
func CUDAs(t testing.TB, n int) []*tensor.Device {
	t.Helper()
	first := CUDA(t)
	count, err := cuda.DeviceCount()
	if err != nil || count < n {
		t.Skipf("%d GPUs wanted, %d here (%v)", n, count, err)
	}
	devs := []*tensor.Device{first}
	for i := 1; i < n; i++ {
		d, err := tensor.Open(fmt.Sprintf("cuda:%d", i))
		if err != nil {
			t.Fatalf("cuda:%d is present but does not open: %v", i, err)
		}
		devs = append(devs, d)
	}
	return devs
}

// CUDAWith returns a device of its own on cuda:0 opened with opts (not the
// shared cuda:0 of Open), closed when t ends, or skips t without a GPU.
// With LeanConvWorkspace, tests that compare memory peaks are not at the
// mercy of cuDNN's fastest algorithms, whose workspaces vary from run to
// run.
func CUDAWith(t testing.TB, opts tensor.Options) *tensor.Device {
	t.Helper()
	return CUDAsWith(t, 1, opts)[0]
}

// CUDAsWith is CUDAWith on cuda:0 to cuda:n-1, or skips t when there are
// fewer GPUs.
func CUDAsWith(t testing.TB, n int, opts tensor.Options) []*tensor.Device {
	t.Helper()
	CUDAs(t, n)
	var devs []*tensor.Device
	for i := range n {
		be, err := cuda.OpenSeparate(i, opts)
		if err != nil {
			t.Fatal(err)
		}
		d := tensor.NewDevice(be)
		t.Cleanup(func() {
			if err := d.Close(); err != nil {
				t.Errorf("closing cuda:%d: %v", i, err)
			}
		})
		devs = append(devs, d)
	}
	return devs
}

// FreeAddr is a loopback address whose port nothing listens on, for a
// data-parallel job's rendezvous in a test.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// RunWithoutLeaks runs a package's tests (from its TestMain) and then fails
// the run if the garbage collector finds tensors that were never released.
// A leaked tensor's memory returns to its pool whenever the collector gets
// to it, so a leak in one test makes the memory checks of whichever test
// runs then fail at random.
func RunWithoutLeaks(m *testing.M) int {
	code := m.Run()
	if n := tensor.CollectLeaks(); n > 0 && code == 0 {
		fmt.Printf("FAIL: %d tensors were never released (tensor.SetDebug(true) and tensor.LiveReport say where they were made)\n", n)
		return 1
	}
	return code
}
