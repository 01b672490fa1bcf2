package tensor

import (
	"errors"
	"strings"
	"testing"

	"github.com/leangrad/leangrad/kernels/cuda"
)

// TestCUDAOpenOptionsInfoClose: Info says what the device is without
// parsing its name; asking for an open device with other options is an
// error naming both; after Close, Open opens the device afresh.
func TestCUDAOpenOptionsInfoClose(t *testing.T) {
	if err := cuda.Available(); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	d, err := OpenWith("cuda:0", Options{LeanConvWorkspace: true})
	if err != nil {
		t.Fatal(err)
	}
	in := d.Info()
	t.Logf("%+v", in)
	if in.Kind != "cuda" || in.Index != 0 || in.Name != "cuda:0" || !strings.HasPrefix(in.Capability, "sm_") || in.Memory <= 0 ||
		in.Libraries["driver"] == "" || in.Libraries["nvrtc"] == "" {
		t.Errorf("Info %+v", in)
	}
	if d.OnHost() || !d.Pinned().OnHost() {
		t.Errorf("OnHost: the GPU's %v, its pinned host device's %v", d.OnHost(), d.Pinned().OnHost())
	}
	if e, err := Open("cuda:0"); err != nil || e != d {
		t.Errorf("Open of the open device: %v, %v", e, err)
	}
	if _, err := OpenWith("cuda:0", Options{StrictConvF32: true}); !errors.Is(err, ErrOptionsConflict) || !strings.Contains(err.Error(), "StrictConvF32:true") {
		t.Errorf("OpenWith with other options: %v", err)
	}
	x := Zeros(d, F32, 1024)
	if err := d.Close(); err == nil {
		t.Error("Close with a live tensor succeeded")
	}
	x.Release()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	e, err := OpenWith("cuda:0", Options{StrictConvF32: true})
	if err != nil || e == d {
		t.Fatalf("after Close, OpenWith: %v (same handle %v)", err, e == d)
	}
	y := FromFloat32(e, []float32{1, 2, 3}, 3)
	defer y.Release()
	if got := y.Float32s(); got[2] != 3 {
		t.Errorf("the reopened device reads %v", got)
	}
}
