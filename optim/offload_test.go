package optim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
)

// TestOffloaded: an optimiser offloaded to host memory takes the steps the
// on-device one takes, bit for bit on the CPU (the same arithmetic), with
// weight decay groups, skipped steps, a gradient multiplier, a parameter
// without a gradient, and gradients handed to Ready as a backward
// finishes them (once, twice, in a step then skipped, or not at all),
// which releases them on the device once they are down; its state is named as the on-device one's,
// so that each resumes from the other's; a GPU holds none of its state.
func TestOffloaded(t *testing.T) {
	testOffloaded(t, tensor.NewDevice(tensor.CPU().Backend()), tensor.CPU(), 0)
}

// testOffloaded runs the comparison on dev with the state on host, the
// parameters within tol of the on-device optimiser's (relative; 0: bit for
// bit).
func testOffloaded(t *testing.T, dev, host *tensor.Device, tol float64) {
	shapes := [][]int{{33, 7}, {7}, {5000}} // a matrix, a bias (no decay), one large enough to split over threads
	for _, c := range []struct {
		name string
		make func(ps []*tensor.Tensor) Optimizer
	}{
		{"adamw", func(ps []*tensor.Tensor) Optimizer {
			o := NewAdamW(ps, 0.01, 0.1)
			o.NoDecay = []bool{false, true, false}
			return o
		}},
		{"sgd", func(ps []*tensor.Tensor) Optimizer {
			o := NewSGD(ps, 0.1, 0.9, 0.01, true)
			o.NoDecay = []bool{false, true, false}
			return o
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(len(c.name))))
			random := func(shape []int, scale float64) []float32 { return normals(rng, shape, scale) }
			var on, off []*tensor.Tensor
			for _, s := range shapes {
				v := random(s, 1)
				on = append(on, tensor.FromFloat32(dev, v, s...).Keep().SetRequiresGrad(true))
				off = append(off, tensor.FromFloat32(dev, v, s...).Keep().SetRequiresGrad(true))
			}
			defer func() {
				for _, p := range append(on, off...) {
					p.Release()
				}
			}()
			ref := c.make(on)
			defer ref.Release()
			flag := tensor.Zeros(dev, tensor.F32, 1).Keep()
			mult := tensor.Zeros(dev, tensor.F32, 1).Keep()
			defer flag.Release()
			defer mult.Release()
			stranger := tensor.Zeros(dev, tensor.F32, 3).Keep().SetRequiresGrad(true)
			defer stranger.Release()
			stranger.SetGrad(tensor.Zeros(dev, tensor.F32, 3))
			before := dev.Allocator().Stats().Allocated[memory.All].Current
			o, err := Offload(c.make(off), host)
			if err != nil {
				t.Fatal(err)
			}
			defer o.Release()
			if pinned := host != tensor.CPU(); o.Pinned() != pinned {
				t.Errorf("Pinned() = %v: want %v", o.Pinned(), pinned)
			}
			var early, total int64 // gradients' bytes handed to Ready, and in all, in the steps taken
			for step := range 6 {
				for i, s := range shapes {
					if step == 3 && i == 2 && c.name == "sgd" {
						continue // no gradient this step (AdamW counts steps once for all on the device: Note [the offloaded step])
					}
					g := random(s, 0.1)
					on[i].SetGrad(tensor.FromFloat32(dev, g, s...))
					off[i].SetGrad(tensor.FromFloat32(dev, g, s...))
					if step != 2 {
						total += int64(4 * len(g))
					}
					if (step%2 == 1 || step == 2) && i != 1 { // as the backward finishes them
						o.Ready(off[i])
						if step == 5 && i == 0 {
							o.Ready(off[i]) // finished twice
						}
						if step != 2 {
							early += int64(4 * len(g))
						}
					}
				}
				o.Ready(stranger) // not a parameter: ignored
				if step == 5 && off[0].Grad() != nil {
					t.Error("parameter 0's gradient is still on the device after it came down and a larger one followed it")
				}
				lr := 0.01 * float64(step+1)
				ref.SetLR(lr)
				o.SetLR(lr)
				skip := float32(0)
				if step == 2 {
					skip = 1
				}
				flag.Backend().Fill(flag.Buf(), skip)
				mult.Backend().Fill(mult.Buf(), 0.5+0.25*float32(step))
				switch {
				case step%2 == 0:
					ref.StepUnless(flag.Buf())
					o.StepUnless(flag.Buf())
				case c.name == "adamw":
					ref.(ScaledStepper).StepScaled(mult.Buf(), kernels.Buf{})
					o.StepScaled(mult.Buf(), kernels.Buf{})
				default:
					ref.Step()
					o.Step()
				}
				ref.ZeroGrad()
				o.ZeroGrad()
				for i := range shapes {
					same(t, fmt.Sprintf("step %d, parameter %d", step, i), off[i].Float32s(), on[i].Float32s(), tol)
				}
			}
			if got, want := o.Overlapped(), float64(early)/float64(total); got != want {
				t.Errorf("Overlapped() = %v: want %v (%d of %d bytes handed to Ready)", got, want, early, total)
			}
			var refState int64
			for _, v := range ref.State() {
				refState += v.Block().Size()
			}
			// Beside it the offloaded one holds each gradient's sum of
			// squares, two F32s a parameter (the device's and the host's).
			if now, squares := dev.Allocator().Stats().Allocated[memory.All].Current, memory.RoundSize(8*int64(len(shapes))); dev.Allocator() != tensor.CPU().Allocator() && now-before != refState+squares {
				t.Errorf("the device holds %d bytes more after the steps, the on-device optimizer's state %d and the offloaded one's sums of squares %d: want only those",
					now-before, refState, squares)
			}
			st, rs := o.State(), ref.State()
			if len(st) != len(rs) {
				t.Fatalf("state %d tensors, on the device %d", len(st), len(rs))
			}
			for k, v := range rs {
				same(t, "state "+k, st[k].Float32s(), v.Float32s(), tol)
			}
			if c.name == "adamw" {
				if got, want := o.Counters()["step"], ref.Counters()["step"]; got != want {
					t.Errorf("step count %v, on the device %v", got, want)
				}
				if h := o.HostBytes(); h != 4*4*int64(33*7+7+5000) {
					t.Errorf("host bytes %d: want four F32 copies of every parameter", h)
				}
			}
			// Each resumes from the other's state.
			back := c.make(on)
			defer back.Release()
			if err := back.LoadState(o.State(), o.Counters()); err != nil {
				t.Fatal(err)
			}
			again, err := Offload(c.make(off), host)
			if err != nil {
				t.Fatal(err)
			}
			defer again.Release()
			// A resumed run loads the model's weights after making its
			// optimizer: LoadState takes them up as the host's masters.
			for i, s := range shapes {
				v := random(s, 1)
				raw := unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
				on[i].Backend().Write(on[i].Buf(), raw)
				off[i].Backend().Write(off[i].Buf(), raw)
			}
			if err := again.LoadState(ref.State(), ref.Counters()); err != nil {
				t.Fatal(err)
			}
			for i, s := range shapes {
				g := random(s, 0.1)
				on[i].SetGrad(tensor.FromFloat32(dev, g, s...))
				off[i].SetGrad(tensor.FromFloat32(dev, g, s...))
			}
			back.Step()
			again.Step()
			for i := range shapes {
				same(t, fmt.Sprintf("resumed, parameter %d", i), off[i].Float32s(), on[i].Float32s(), tol)
			}
			back.ZeroGrad()
			again.ZeroGrad()
		})
	}
}

// same fails t where got and want differ: in any bit (tol 0), or by more
// than tol relative to want.
func same(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	for i := range want {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if (tol == 0 && math.Float32bits(got[i]) != math.Float32bits(want[i])) || d > tol*(1e-3+math.Abs(float64(want[i]))) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

// TestOffloadRefuses: an optimiser that has stepped keeps its state on the
// device, with a message.
func TestOffloadRefuses(t *testing.T) {
	p := param(tensor.CPU(), 1, 2)
	defer p.Release()
	o := NewAdamW([]*tensor.Tensor{p}, 0.1, 0)
	defer o.Release()
	setGrad(p, 1, 1)
	o.Step()
	if _, err := Offload(o, tensor.CPU()); err == nil {
		t.Error("an optimizer with state was offloaded")
	}
}

// TestOffloadedRefusesAGradientFinishedTwice: a gradient the backward
// finishes again after its first part left the device (a parameter read in
// several checkpointed blocks) is refused, naming the parameter, not
// updated from its second part alone.
func TestOffloadedRefusesAGradientFinishedTwice(t *testing.T) {
	dev, host := tensor.NewDevice(tensor.CPU().Backend()), tensor.CPU()
	small := tensor.Zeros(dev, tensor.F32, 4).Keep().SetRequiresGrad(true)
	large := tensor.Zeros(dev, tensor.F32, 1000).Keep().SetRequiresGrad(true)
	defer small.Release()
	defer large.Release()
	o, err := Offload(NewAdamW([]*tensor.Tensor{small, large}, 0.01, 0), host)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Release()
	small.SetGrad(tensor.Ones(dev, tensor.F32, 4))
	large.SetGrad(tensor.Ones(dev, tensor.F32, 1000))
	o.Ready(small)
	o.Ready(large) // past a sixteenth in flight: small's gradient leaves the device
	if small.Grad() != nil {
		t.Fatal("the first gradient is still on the device")
	}
	small.SetGrad(tensor.Ones(dev, tensor.F32, 4)) // the backward adds another part
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "gradient of parameter 0 (shape [4]) was finished twice") {
			t.Errorf("Ready of a gradient finished twice: %v, want a panic naming parameter 0", r)
		}
		o.ZeroGrad()
	}()
	o.Ready(small)
}

// TestOffloadedHalfWeights: AdamW offloaded over 16-bit working weights
// (Note [working weights in 16 bits]) keeps F32 masters that are, bit for
// bit, what F32 AdamW makes of the gradients widened, and the device's
// weights are those masters rounded, through plain steps, gradients handed
// to Ready and ReadyAndUpdate, a multiplier, a skipped step, and a resume
// from State; with the host's one-pass update (kernels.MasterAdamW) and
// with the passes of their own that other optimizers take.
func TestOffloadedHalfWeights(t *testing.T) {
	defer func(on bool) { fuseMasters = on }(fuseMasters)
	for _, dt := range []tensor.DType{tensor.BF16, tensor.F16} {
		for _, fuse := range []bool{true, false} {
			t.Run(fmt.Sprintf("%v/one pass=%v", dt, fuse), func(t *testing.T) {
				fuseMasters = fuse
				testOffloadedHalf(t, tensor.NewDevice(tensor.CPU().Backend()), tensor.NewDevice(tensor.CPU().Backend()), dt)
			})
		}
	}
}

// testOffloadedHalf runs TestOffloadedHalfWeights' comparison with the
// weights on dev in dt and the state on host.
func testOffloadedHalf(t *testing.T, dev, host *tensor.Device, dt tensor.DType) {
	ref := tensor.NewDevice(tensor.CPU().Backend()) // F32 AdamW's, on the CPU
	rng := rand.New(rand.NewPCG(3, uint64(dt)))
	random := func(shape []int, scale float64) []float32 { return normals(rng, shape, scale) }
	shapes, types, work, master := workingWeights(t, dev, ref, rng, dt)
	adamw := func(ps []*tensor.Tensor) Optimizer { return newWorkingOptimizer("adamw", ps) }
	want, o := offloadedPair(t, adamw, work, master, host, nil)
	rounded := func(v []float32, dt tensor.DType) []float32 {
		f := asDType(ref, v, dt, []int{len(v)})
		defer f.Release()
		return f.Float32s()
	}
	check := func(what string) {
		t.Helper()
		st := o.State()
		for i := range shapes {
			m := master[i].Float32s()
			same(t, fmt.Sprintf("%s, the weight on the device %d", what, i), work[i].Float32s(), rounded(m, types[i]), 0)
			if types[i] == tensor.F32 {
				if _, ok := st[fmt.Sprintf("master.%d", i)]; ok {
					t.Errorf("%s: State holds a master copy of the F32 parameter %d", what, i)
				}
				continue
			}
			same(t, fmt.Sprintf("%s, master %d", what, i), st[fmt.Sprintf("master.%d", i)].Float32s(), m, 0)
		}
	}
	mult := tensor.FromFloat32(dev, []float32{0.75}, 1).Keep()
	refMult := tensor.FromFloat32(ref, []float32{0.75}, 1).Keep()
	skip := tensor.FromFloat32(dev, []float32{1}, 1).Keep()
	sumsq := tensor.Zeros(dev, tensor.F32, 1).Keep()
	defer releaseAll(mult, refMult, skip, sumsq)
	for step := range 5 {
		var squares float64
		for i, s := range shapes {
			g := asDType(dev, random(s, 0.1), types[i], s)
			work[i].SetGrad(g)
			wide := g.Float32s()
			master[i].SetGrad(tensor.FromFloat32(ref, wide, s...))
			for _, v := range wide {
				squares += float64(v) * float64(v)
			}
			switch step {
			case 1:
				o.Ready(work[i])
			case 2:
				o.ReadyAndUpdate(work[i])
			}
		}
		o.SumGradSquares(sumsq.Buf())
		if got := sumsq.Float32s()[0]; math.Abs(float64(got)-squares) > 1e-5*squares {
			t.Errorf("step %d: the gradients' sum of squares %v, want %v", step, got, squares)
		}
		stepBoth(o, want, step == 1, step == 3, mult, refMult, skip)
		check(fmt.Sprintf("step %d", step))
	}
	half, f32 := int64(33*7+5001+1), int64(7)
	held := OffloadedHostBytes("adamw", half, int64(dt.Size())*half) + OffloadedHostBytes("adamw", f32, 4*f32)
	if !fuseMasters { // the gradients in F32 for the passes
		held = 16 * (half + f32)
	}
	if h := o.HostBytes(); h != held {
		t.Errorf("host bytes %d, want %d: F32 masters and moments, and gradients in two bytes where the update reads them so", h, held)
	}
	// Page-locked: an F32 parameter's copy, gradient and moments (the
	// copies read the first two), and a 16-bit one's gradient alone.
	pinned := 16*f32 + int64(dt.Size())*half
	if !fuseMasters {
		pinned = 16*f32 + 4*half
	}
	if !o.Pinned() {
		pinned = 0
	}
	if got := o.PinnedBytes(); got != pinned {
		t.Errorf("page-locked bytes %d of %d, want %d", got, o.HostBytes(), pinned)
	}
	// A resumed run takes the masters from the state, not the rounded
	// weights.
	again, err := Offload(adamw(work), host)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Release()
	if err := again.LoadState(o.State(), o.Counters()); err != nil {
		t.Fatal(err)
	}
	for i, s := range shapes {
		g := asDType(dev, random(s, 0.1), types[i], s)
		work[i].SetGrad(g)
		master[i].SetGrad(tensor.FromFloat32(ref, g.Float32s(), s...))
	}
	again.Step()
	want.Step()
	again.ZeroGrad()
	want.ZeroGrad()
	o = again
	check("resumed")
	bad := map[string]*tensor.Tensor{"master.0": tensor.Zeros(ref, tensor.F32, 7, 33).Keep()}
	defer bad["master.0"].Release()
	if err := again.LoadState(bad, nil); err == nil || !strings.Contains(err.Error(), "master.0") {
		t.Errorf("a master of the wrong shape loaded: %v, want an error naming it", err)
	}
}

// TestOffloadedParts: a step's gradient in parts, micro-batches', summed
// on the host (Note [parts summed on the host]), gives the steps of the
// on-device optimizer over the F32 sums of the parts: bit for bit for F32
// parameters under AdamW and SGD, and for 16-bit working weights under
// AdamW, the F32 masters of those sums, in one pass and in passes; with
// the last part handed to Ready and to ReadyAndUpdate, a gradient
// multiplier, a skipped step, a parameter without a last part and one
// with only a last part; the device holds no part after PartsDown, the
// sum of squares is the sums', and the host holds the sums beside the
// rest. With some F32 parameters' state kept on the device (OffloadSome:
// one with no last part in a step, one with only a last part, a bias
// beside 16-bit weights), their parts add up on the device, their state
// is the on-device optimizer's there, and the host holds none of it.
func TestOffloadedParts(t *testing.T) {
	defer func(on bool) { fuseMasters = on }(fuseMasters)
	for _, c := range []struct {
		name string
		dt   tensor.DType // the working weights'
		fuse bool
		keep []bool // workingWeights' parameters whose state stays on the device
	}{
		{"adamw", tensor.F32, true, nil}, {"sgd", tensor.F32, true, nil}, {"adamw", tensor.BF16, true, nil}, {"adamw", tensor.F16, false, nil},
		{"adamw", tensor.F32, true, []bool{true, false, false, true}}, {"sgd", tensor.F32, true, []bool{true, true, false, false}},
		{"adamw", tensor.BF16, true, []bool{false, true, false, false}},
	} {
		t.Run(fmt.Sprintf("%s/%v/one pass=%v/kept=%v", c.name, c.dt, c.fuse, c.keep), func(t *testing.T) {
			fuseMasters = c.fuse
			testOffloadedParts(t, tensor.NewDevice(tensor.CPU().Backend()), tensor.NewDevice(tensor.CPU().Backend()), c.name, c.dt, c.keep)
		})
	}
}

// testOffloadedParts runs TestOffloadedParts' comparison with the
// parameters on dev, the working ones in dt, and the state on host but
// for those keep keeps on dev.
func testOffloadedParts(t *testing.T, dev, host *tensor.Device, kind string, dt tensor.DType, keep []bool) {
	ref := tensor.NewDevice(tensor.CPU().Backend()) // the on-device optimizer's, over F32 masters
	rng := rand.New(rand.NewPCG(11, uint64(dt)))
	shapes, types, work, master := workingWeights(t, dev, ref, rng, dt)
	newOpt := func(ps []*tensor.Tensor) Optimizer { return newWorkingOptimizer(kind, ps) }
	want, o := offloadedPair(t, newOpt, work, master, host, keep)
	kept := func(i int) bool { return keep != nil && keep[i] }
	held := o.HostBytes()
	mult := tensor.FromFloat32(dev, []float32{0.75}, 1).Keep()
	refMult := tensor.FromFloat32(ref, []float32{0.75}, 1).Keep()
	skip := tensor.FromFloat32(dev, []float32{1}, 1).Keep()
	sumsq := tensor.Zeros(dev, tensor.F32, 1).Keep()
	defer releaseAll(mult, refMult, skip, sumsq)
	const parts = 3
	for step := range 5 {
		sums := make([][]float32, len(shapes))
		for part := range parts {
			last := part == parts-1
			for i, s := range shapes {
				if step == 3 && (i == 3 && last || i == 1 && !last) {
					continue // parameter 3 has no last part, parameter 1 only a last
				}
				g := asDType(dev, normals(rng, s, 0.1), types[i], s)
				if sums[i] == nil {
					sums[i] = g.Float32s()
				} else {
					for k, v := range g.Float32s() {
						sums[i][k] += v // as the device adds a backward's parts, in F32
					}
				}
				if kept(i) { // added to the part before on the device, in F32, as a backward adds
					g.Release()
					g = tensor.FromFloat32(dev, sums[i], s...)
				}
				work[i].SetGrad(g)
				switch {
				case !last:
					o.Part(work[i])
				case step == 2 && kind == "adamw":
					o.ReadyAndUpdate(work[i])
				default:
					o.Ready(work[i])
				}
			}
			if !last {
				o.PartsDown()
				for i, w := range work {
					if (w.Grad() != nil) != (kept(i) && sums[i] != nil) {
						t.Fatalf("step %d, part %d: parameter %d (kept on the device: %v) has a gradient there after PartsDown: %v", step, part, i, kept(i), w.Grad() != nil)
					}
				}
			}
		}
		var squares float64
		for i, s := range shapes {
			master[i].SetGrad(tensor.FromFloat32(ref, sums[i], s...))
			for _, v := range sums[i] {
				squares += float64(v) * float64(v)
			}
		}
		if step != 2 { // ReadyAndUpdate's steps need no norm
			o.SumGradSquares(sumsq.Buf())
			if got := sumsq.Float32s()[0]; math.Abs(float64(got)-squares) > 1e-5*squares {
				t.Errorf("step %d: the sums' sum of squares %v, want %v", step, got, squares)
			}
		}
		stepBoth(o, want, step == 1, step == 4, mult, refMult, skip)
		for i := range shapes {
			m := master[i].Float32s()
			if types[i] != tensor.F32 {
				r := asDType(ref, m, types[i], shapes[i])
				m = r.Float32s()
				r.Release()
				same(t, fmt.Sprintf("step %d, master %d", step, i), o.Master(work[i]).Float32s(), master[i].Float32s(), 0)
			}
			same(t, fmt.Sprintf("step %d, the weight on the device %d", step, i), work[i].Float32s(), m, 0)
		}
	}
	var state int64 // made at the first step
	for _, s := range o.innerState(func(i int) bool { return !kept(i) }) {
		state += s.Bytes()
	}
	var summed int64 // the values of the parameters whose parts the host sums
	for i, w := range work {
		if !kept(i) {
			summed += int64(w.Numel())
		}
	}
	if got, want := o.HostBytes()-held-state, OffloadedSumBytes(summed); got != want {
		t.Errorf("the host holds %d bytes more after micro-batched steps than its copies and state: want the sums' %d", got, want)
	}
	ds, ws := o.DeviceState(), want.State()
	for k, v := range o.State() {
		i, err := strconv.Atoi(k[strings.LastIndexByte(k, '.')+1:])
		if err != nil {
			t.Fatal(err)
		}
		if d, ok := ds[k]; ok != kept(i) || ok && d != v || v.Device() != dev && kept(i) || v.Device() == dev && !kept(i) {
			t.Errorf("state %s (parameter %d kept: %v) on %v; in DeviceState: %v", k, i, kept(i), v.Device(), ok)
		}
		if w, ok := ws[k]; ok && types[i] == tensor.F32 {
			same(t, "state "+k, v.Float32s(), w.Float32s(), 0)
		}
	}
	if per, n := map[string]int{"adamw": 2, "sgd": 1}[kind], len(slices.DeleteFunc(slices.Clone(keep), func(k bool) bool { return !k })); len(ds) != per*n {
		t.Errorf("%d tensors of state on the device: want %d for each of the %d parameters kept", len(ds), per, n)
	}
	again, err := OffloadSome(newOpt(work), host, keep) // resumed from the state, each part where it was
	if err != nil {
		t.Fatal(err)
	}
	defer again.Release()
	if err := again.LoadState(o.State(), o.Counters()); err != nil {
		t.Fatal(err)
	}
	for k, v := range o.State() {
		w := again.State()[k]
		if w == nil {
			t.Fatalf("resumed state %s missing", k)
		}
		if w.Device() != v.Device() {
			t.Errorf("resumed state %s on %v: want it on %v", k, w.Device(), v.Device())
		}
		same(t, "resumed state "+k, w.Float32s(), v.Float32s(), 0)
	}
}

// workingWeights are the comparisons' parameters: a matrix, an F32 bias
// (no decay), a weight of an odd length whose widening takes many passes,
// and one of a single value, drawn from rng; work in their types (dt but
// the bias) on dev, master their F32 values on ref, both released when t
// ends.
func workingWeights(t *testing.T, dev, ref *tensor.Device, rng *rand.Rand, dt tensor.DType) (shapes [][]int, types []tensor.DType, work, master []*tensor.Tensor) {
	shapes = [][]int{{33, 7}, {7}, {5001}, {1}}
	types = []tensor.DType{dt, tensor.F32, dt, dt}
	for i, s := range shapes {
		w := asDType(dev, normals(rng, s, 1), types[i], s).Keep().SetRequiresGrad(true)
		work = append(work, w)
		master = append(master, tensor.FromFloat32(ref, w.Float32s(), s...).Keep().SetRequiresGrad(true))
	}
	t.Cleanup(func() { releaseAll(append(work, master...)...) })
	return shapes, types, work, master
}

// newWorkingOptimizer is an optimizer of kind over workingWeights'
// parameters: the bias not decayed.
func newWorkingOptimizer(kind string, ps []*tensor.Tensor) Optimizer {
	if kind == "sgd" {
		o := NewSGD(ps, 0.1, 0.9, 0.01, true)
		o.NoDecay = []bool{false, true, false, false}
		return o
	}
	o := NewAdamW(ps, 0.01, 0.1)
	o.NoDecay = []bool{false, true, false, false}
	return o
}

// offloadedPair is newOpt's optimizer over master, the reference, and over
// work offloaded to host, both released when t ends.
func offloadedPair(t *testing.T, newOpt func([]*tensor.Tensor) Optimizer, work, master []*tensor.Tensor, host *tensor.Device, keep []bool) (Optimizer, *Offloaded) {
	want := newOpt(master)
	t.Cleanup(want.Release)
	o, err := OffloadSome(newOpt(work), host, keep)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Release)
	return want, o
}

// stepBoth steps o and its reference want: with the gradients multiplied
// by mult (refMult on want's device; before the step for an optimizer that
// is no ScaledStepper, SGD) when scaled, o alone under the set
// flag skip (want not at all) when skipped; then zeroes both's gradients.
func stepBoth(o *Offloaded, want Optimizer, scaled, skipped bool, mult, refMult, skip *tensor.Tensor) {
	switch {
	case scaled:
		o.StepScaled(mult.Buf(), kernels.Buf{})
		if ss, ok := want.(ScaledStepper); ok {
			ss.StepScaled(refMult.Buf(), kernels.Buf{})
			break
		}
		for _, p := range want.Params() { // SGD's gradients multiplied first
			if g := p.Grad(); g != nil {
				g.Backend().Affine(g.Buf(), g.Buf(), refMult.Float32s()[0], 0)
			}
		}
		want.Step()
	case skipped:
		o.StepUnless(skip.Buf())
	default:
		o.Step()
		want.Step()
	}
	o.ZeroGrad()
	want.ZeroGrad()
}

// asDType is v, of shape, on d in dt: rounded from F32 for a 16-bit dt.
func asDType(d *tensor.Device, v []float32, dt tensor.DType, shape []int) *tensor.Tensor {
	f := tensor.FromFloat32(d, v, shape...)
	if dt == tensor.F32 {
		return f
	}
	defer f.Release()
	h := tensor.Empty(d, dt, shape...)
	d.Backend().Cast(h.Buf(), f.Buf())
	return h
}

// normals are values of shape drawn from a normal distribution of
// standard deviation scale.
func normals(rng *rand.Rand, shape []int, scale float64) []float32 {
	n := 1
	for _, d := range shape {
		n *= d
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * scale)
	}
	return v
}

// releaseAll releases ts.
func releaseAll(ts ...*tensor.Tensor) {
	for _, t := range ts {
		t.Release()
	}
}

// TestOffloadedStepsLeaveNoGarbage: once the first step has made the
// state, a step of an offloaded AdamW over micro-batches (their parts
// summed on the host, the last updated in the backward) allocates next to
// nothing on the Go heap, whatever the parameters' count: on a host
// holding 100 GiB of state, garbage of a fraction of a byte a parameter
// a step is gigabytes for the collector to find room for.
func TestOffloadedStepsLeaveNoGarbage(t *testing.T) {
	defer func(on bool) { fuseMasters = on }(fuseMasters)
	fuseMasters = true
	const n, params, parts = 1 << 22, 4, 3
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			dev, host := tensor.NewDevice(tensor.CPU().Backend()), tensor.NewDevice(tensor.CPU().Backend())
			rng := rand.New(rand.NewPCG(5, uint64(dt)))
			var ps []*tensor.Tensor
			for range params {
				ps = append(ps, asDType(dev, normals(rng, []int{n / params}, 1), dt, []int{n / params}).Keep().SetRequiresGrad(true))
			}
			defer releaseAll(ps...)
			grads := make([]*tensor.Tensor, params)
			for i := range grads {
				grads[i] = asDType(dev, normals(rng, []int{n / params}, 0.01), dt, []int{n / params}).Keep()
			}
			defer releaseAll(grads...)
			o, err := Offload(NewAdamW(ps, 1e-4, 0.1), host)
			if err != nil {
				t.Fatal(err)
			}
			defer o.Release()
			var ms runtime.MemStats
			var garbage uint64
			for step := range 3 {
				runtime.ReadMemStats(&ms)
				before := ms.TotalAlloc
				for part := range parts {
					for i, p := range ps {
						g := tensor.Empty(dev, dt, n/params)
						dev.Backend().Copy(g.Buf(), grads[i].Buf())
						p.SetGrad(g)
						if part < parts-1 {
							o.Part(p)
						} else {
							o.ReadyAndUpdate(p)
						}
					}
					if part < parts-1 {
						o.PartsDown()
					}
				}
				o.Step()
				o.ZeroGrad()
				runtime.ReadMemStats(&ms)
				if step > 0 {
					garbage = max(garbage, ms.TotalAlloc-before)
				}
			}
			if garbage > 256<<10 {
				t.Errorf("a step over %d parameters allocated %d bytes on the Go heap (%.3f a parameter): want next to nothing", n, garbage, float64(garbage)/n)
			}
		})
	}
}
