package nn

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
)

func TestShapes(t *testing.T) { testShapes(t, tensor.CPU()) }

func testShapes(t *testing.T, dev *tensor.Device) {
	r20, err := NewCIFARResNet(dev, 20, 1, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer Release(r20)
	r18 := NewResNet18(dev, 3, 7)
	defer Release(r18)
	mlp := NewMLP(dev, []int{784, 64, 10}, 0.1)
	defer Release(mlp)
	for _, tc := range []struct {
		m   Module
		in  []int
		out []int
	}{
		{r20, []int{2, 1, 28, 28}, []int{2, 10}},
		{r18, []int{1, 3, 32, 32}, []int{1, 7}},
		{mlp, []int{3, 1, 28, 28}, []int{3, 10}},
	} {
		dev.WithScope(func() {
			ag.NoGrad(dev, func() {
				y := tc.m.Forward(tensor.Randn(dev, tensor.F32, 0, 1, tc.in...))
				if got := y.Shape(); !slices.Equal(got, tc.out) {
					t.Errorf("%T: output %v, want %v", tc.m, got, tc.out)
				}
			})
		})
	}
	if got := CountParams(mlp); got != 784*64+64+64*10+10 {
		t.Errorf("MLP has %d parameters", got)
	}
	// ResNet-20 for 1-channel input with 1×1 projection shortcuts.
	want := 16*1*9 + 2*16 // stem
	for s, w := range []int{16, 32, 64} {
		in := []int{16, 16, 32}[s]
		for i := 0; i < 3; i++ {
			cin := w
			if i == 0 {
				cin = in
			}
			want += cin*w*9 + w*w*9 + 4*w
			if cin != w {
				want += cin*w + 2*w
			}
		}
	}
	want += 64*10 + 10
	if got := CountParams(r20); got != want {
		t.Errorf("ResNet-20 has %d parameters, want %d", got, want)
	}
	if _, err := NewCIFARResNet(dev, 21, 1, 10); err == nil || !strings.Contains(err.Error(), "6n+2") {
		t.Errorf("depth 21 accepted: %v", err)
	}
}

func relErr(a, b []float32) float64 {
	var num, den float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	return math.Sqrt(num / math.Max(den, 1e-30))
}

// step runs one forward and backward of m on a fixed batch and returns the
// peak allocated bytes of the step.
func step(m Module, dev *tensor.Device, amp bool, batch int) int64 {
	a := dev.Allocator()
	a.ResetPeak()
	dev.WithScope(func() {
		g := tensor.NewGenerator(42)
		x := tensor.Empty(dev, tensor.F32, batch, 1, 28, 28)
		dev.Backend().Normal(x.Buf(), 0, 1, g.Next(x.Numel()))
		lv := make([]int32, batch)
		for i := range lv {
			lv[i] = int32(i % 10)
		}
		y := tensor.FromInt32(dev, lv, batch)
		run := func() {
			logits := m.Forward(x)
			loss := ag.CrossEntropy(logits, y)
			logits.Release()
			ag.Backward(loss)
		}
		if amp {
			ag.Autocast(dev, tensor.F16, run)
		} else {
			run()
		}
	})
	return a.Stats().Allocated[memory.All].Peak
}

// TestCheckpointMatchesPlain: a checkpointed ResNet-20 (with dropout in its
// blocks and batch norm in training mode), every block, √n segments or its
// first stage's blocks only, gives the gradients of the plain one, updates
// the running statistics once, and peaks lower; the first stage alone
// peaks between every block and none.
//
// The CUDA variant runs a larger batch: at 8 images sqrt(n) segments save 2%
// of the peak, about as much as cuDNN's and cuBLAS's workspaces vary between
// algorithms.
func TestCheckpointMatchesPlain(t *testing.T) { testCheckpointMatchesPlain(t, tensor.CPU(), 8) }

func testCheckpointMatchesPlain(t *testing.T, dev *tensor.Device, ckBatch int) {
	build := func(mode CheckpointMode, first int) *ResNet {
		dev.Generator().Seed(7)
		r, _ := NewCIFARResNet(dev, 20, 1, 10)
		r.SetDropout(0.2)
		r.SetCheckpoint(mode)
		r.SetCheckpointed(first)
		return r
	}
	plain := build(NoCheckpoint, 0)
	defer Release(plain)
	dev.Generator().Seed(99)
	peakPlain := step(plain, dev, false, ckBatch)
	peaks := map[string]int64{}
	for _, tc := range []struct {
		name  string
		mode  CheckpointMode
		first int
	}{{"blocks", CheckpointBlocks, 0}, {"sqrt", CheckpointSqrt, 0}, {"first stage", CheckpointBlocks, 3}} {
		ck := build(tc.mode, tc.first)
		dev.Generator().Seed(99) // the same dropout masks
		peakCk := step(ck, dev, false, ckBatch)
		peaks[tc.name] = peakCk
		ps, cs := plain.State(""), ck.State("")
		for i := range ps {
			a, b := cs[i].T, ps[i].T
			if ps[i].Param {
				if e := relErr(a.Grad().Float32s(), b.Grad().Float32s()); e > 1e-5 {
					t.Errorf("%s: gradient of %s differs: relative error %.3g", tc.name, ps[i].Name, e)
				}
			} else if e := relErr(a.Float32s(), b.Float32s()); e > 1e-6 {
				t.Errorf("%s: %s differs after one step (updated twice?): relative error %.3g", tc.name, ps[i].Name, e)
			}
		}
		if peakCk >= peakPlain {
			t.Errorf("%s: checkpointed peak %d bytes, plain %d: no saving", tc.name, peakCk, peakPlain)
		}
		t.Logf("%s: peak allocated %d bytes, plain %d (%.0f%%)", tc.name, peakCk, peakPlain, 100*float64(peakCk-peakPlain)/float64(peakPlain))
		Release(ck)
	}
	if some := peaks["first stage"]; some <= peaks["blocks"] {
		t.Errorf("the first stage checkpointed peaks at %d bytes, every block at %d: want more", some, peaks["blocks"])
	}
}

// TestAMPSavesMemory: ResNet-20 under autocast peaks at least 35% below F32
// on the same batch, by the pool's statistics.
//
// The CUDA variant measures a larger batch: at 16 images the device's fixed
// workspaces (cuBLAS's, cuDNN's) are a large share of the peak.
func TestAMPSavesMemory(t *testing.T) { testAMPSavesMemory(t, tensor.CPU(), 16) }

func testAMPSavesMemory(t *testing.T, dev *tensor.Device, ampBatch int) {
	r, _ := NewCIFARResNet(dev, 20, 1, 10)
	defer Release(r)
	fp32 := step(r, dev, false, ampBatch)
	ZeroGrad(r)
	amp := step(r, dev, true, ampBatch)
	ZeroGrad(r)
	saving := 1 - float64(amp)/float64(fp32)
	t.Logf("peak allocated: f32 %d bytes, amp %d bytes (%.1f%% less)", fp32, amp, 100*saving)
	if saving < 0.35 {
		t.Errorf("AMP peak %d is only %.1f%% below F32's %d; want at least 35%%", amp, 100*saving, fp32)
	}
}

func TestSaveLoadRoundTrip(t *testing.T) { testSaveLoadRoundTrip(t, tensor.CPU()) }

func testSaveLoadRoundTrip(t *testing.T, dev *tensor.Device) {
	a, _ := NewCIFARResNet(dev, 8, 1, 10)
	defer Release(a)
	// Run a training step so the running statistics are not their initial values.
	step(a, dev, false, 4)
	ZeroGrad(a)
	path := filepath.Join(t.TempDir(), "m.safetensors")
	if err := Save(a, path); err != nil {
		t.Fatal(err)
	}
	dev.Generator().Seed(12345)
	b, _ := NewCIFARResNet(dev, 8, 1, 10)
	defer Release(b)
	if err := Load(b, path); err != nil {
		t.Fatal(err)
	}
	as, bs := a.State(""), b.State("")
	for i := range as {
		if !bytes.Equal(as[i].T.Raw(), bs[i].T.Raw()) {
			t.Errorf("%s differs after a save/load round trip", as[i].Name)
		}
	}
	// A model of another shape refuses the file, naming it and the tensor.
	c, _ := NewCIFARResNet(dev, 14, 1, 10)
	defer Release(c)
	if err := Load(c, path); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "layers.") {
		t.Errorf("loading into a deeper model: %v", err)
	}
	// Corrupt files give errors naming the file, never a panic.
	data, _ := os.ReadFile(path)
	for name, bad := range map[string][]byte{
		"truncated":   data[:len(data)-10],
		"short":       data[:5],
		"huge header": append(binary.LittleEndian.AppendUint64(nil, 1<<40), data[8:]...),
	} {
		p := filepath.Join(t.TempDir(), "bad.safetensors")
		os.WriteFile(p, bad, 0o644)
		if err := Load(b, p); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("%s file: err = %v", name, err)
		}
	}
}

// The file layout, byte for byte, for a known tensor: what Python's
// safetensors writes for {"a": torch.tensor([1., 2.])}, with the
// checksums as metadata (CRC-32C of the 8 bytes, worked out by a plain
// bitwise reference: 28c0c9b1; of "123456789" it gives the standard check
// value e3069283).
func TestSafetensorsLayout(t *testing.T) {
	st := &Safetensors{Tensors: map[string]Stored{"a": {DType: tensor.F32, Shape: []int{2}, Data: []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0x40}}}}
	var buf bytes.Buffer
	if err := st.Encode(&buf); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	n := binary.LittleEndian.Uint64(b)
	header := strings.TrimRight(string(b[8:8+n]), " ")
	want := `{"__metadata__":{"leangrad.crc32c":"{\"tensors\":{\"a\":\"28c0c9b1\"},\"metadata\":{}}"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	if header != want || (8+n)%8 != 0 {
		t.Errorf("header %q (length %d)", header, n)
	}
	back, err := ParseSafetensors(b)
	if err != nil || !bytes.Equal(back.Tensors["a"].Data, st.Tensors["a"].Data) || !back.Verified || len(back.Metadata) != 0 {
		t.Errorf("round trip: %v, verified %v, metadata %v", err, back.Verified, back.Metadata)
	}
	python := append(binary.LittleEndian.AppendUint64(nil, 56), `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}  `...)
	python = append(python, st.Tensors["a"].Data...)
	if back, err := ParseSafetensors(python); err != nil || back.Verified {
		t.Errorf("a file without checksums: %v, verified %v; want it read, unverified", err, back.Verified)
	}
	if crcHex([]byte("123456789")) != "e3069283" {
		t.Errorf("CRC-32C of 123456789 = %s", crcHex([]byte("123456789")))
	}
}

// Every dtype a tensor has is written under its safetensors name and read
// back as itself (an 8-bit optimizer's U8 codes among them).
func TestSafetensorsEveryDType(t *testing.T) {
	for _, c := range []struct {
		dt   tensor.DType
		name string
	}{{tensor.F32, "F32"}, {tensor.F16, "F16"}, {tensor.BF16, "BF16"}, {tensor.I32, "I32"}, {tensor.U8, "U8"}} {
		data := make([]byte, 3*c.dt.Size())
		for i := range data {
			data[i] = byte(7 * i)
		}
		st := &Safetensors{Tensors: map[string]Stored{"x": {DType: c.dt, Shape: []int{3}, Data: data}}}
		var buf bytes.Buffer
		if err := st.Encode(&buf); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(buf.String(), `"dtype":"`+c.name+`"`) {
			t.Errorf("%v written without its name %s", c.dt, c.name)
		}
		back, err := ParseSafetensors(buf.Bytes())
		if err != nil || back.Tensors["x"].DType != c.dt || !bytes.Equal(back.Tensors["x"].Data, data) {
			t.Errorf("%v read back as %v (%v)", c.dt, back.Tensors["x"].DType, err)
		}
	}
}

// A flipped byte anywhere is found and named: in a tensor, in the metadata,
// in the checksums, or a tensor added to the header afterwards.
func TestSafetensorsChecksumsFindCorruption(t *testing.T) {
	st := &Safetensors{
		Tensors: map[string]Stored{
			"conv.weight": {DType: tensor.F32, Shape: []int{64}, Data: bytes.Repeat([]byte{1, 2, 3, 4}, 64)},
			"fc.bias":     {DType: tensor.F32, Shape: []int{4}, Data: make([]byte, 16)},
		},
		Metadata: map[string]string{"leangrad.train": `{"epoch":3}`},
	}
	var buf bytes.Buffer
	st.Encode(&buf)
	good := buf.Bytes()
	n := int(binary.LittleEndian.Uint64(good))
	at := func(s string) int { return bytes.Index(good, []byte(s)) }
	for _, tc := range []struct {
		name string
		at   int
		want string
	}{
		{"a tensor's bytes", 8 + n + 100, `tensor "conv.weight" is corrupted`},
		{"the last tensor", len(good) - 1, `tensor "fc.bias" is corrupted`},
		{"the metadata", at(`epoch\":3`) + 9, `metadata "leangrad.train" is corrupted`},
	} {
		bad := bytes.Clone(good)
		bad[tc.at] ^= 0x10
		if _, err := ParseSafetensors(bad); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s flipped: err = %v, want %q", tc.name, err, tc.want)
		}
	}
	if back, err := ParseSafetensors(good); err != nil || !back.Verified {
		t.Errorf("the intact file: %v, verified %v", err, back.Verified)
	}
}

func FuzzParseSafetensors(f *testing.F) {
	st := &Safetensors{
		Tensors: map[string]Stored{
			"w": {DType: tensor.F32, Shape: []int{2, 2}, Data: make([]byte, 16)},
			"h": {DType: tensor.F16, Shape: []int{3}, Data: make([]byte, 6)},
			"n": {DType: tensor.I32, Shape: []int{}, Data: make([]byte, 4)},
		},
		Metadata: map[string]string{"epoch": "3"},
	}
	var buf bytes.Buffer
	st.Encode(&buf)
	f.Add(buf.Bytes())
	f.Add([]byte{})
	f.Add([]byte("\x02\x00\x00\x00\x00\x00\x00\x00{}"))
	f.Add(append(binary.LittleEndian.AppendUint64(nil, 52), []byte(`{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`)...))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := ParseSafetensors(data)
		if err != nil {
			return
		}
		// What parses re-encodes and parses to the same tensors.
		var out bytes.Buffer
		if err := st.Encode(&out); err != nil {
			t.Fatal(err)
		}
		again, err := ParseSafetensors(out.Bytes())
		if err != nil {
			t.Fatalf("re-encoded file does not parse: %v", err)
		}
		for k, v := range st.Tensors {
			w := again.Tensors[k]
			if w.DType != v.DType || !slices.Equal(w.Shape, v.Shape) || !bytes.Equal(w.Data, v.Data) {
				t.Fatalf("tensor %q changed in a round trip", k)
			}
		}
	})
}

// Layers with impossible shapes panic at construction, naming the values,
// instead of failing later (a zero stride used to panic with "integer
// divide by zero" in the first forward).
func TestConstructorsRefuseImpossibleShapes(t *testing.T) {
	testConstructorsRefuseImpossibleShapes(t, tensor.CPU())
}

func testConstructorsRefuseImpossibleShapes(t *testing.T, dev *tensor.Device) {
	for _, tc := range []struct {
		want string
		make func()
	}{
		{"NewConv2d(in 3, out 8, kernel 3, stride 0, pad 1)", func() { NewConv2d(dev, 3, 8, 3, 0, 1, false) }},
		{"NewConv2d(in 0, out 8", func() { NewConv2d(dev, 0, 8, 3, 1, 1, false) }},
		{"NewConv2d(in 3, out 0", func() { NewConv2d(dev, 3, 0, 3, 1, 1, false) }},
		{"pad -1", func() { NewConv2d(dev, 3, 8, 3, 1, -1, false) }},
		{"NewLinear(in 0, out 10)", func() { NewLinear(dev, 0, 10, true) }},
		{"NewBatchNorm2d(0 channels)", func() { NewBatchNorm2d(dev, 0) }},
		{"NewDropout(1)", func() { NewDropout(1) }},
	} {
		func() {
			defer func() {
				msg, _ := recover().(string)
				if !strings.Contains(msg, tc.want) {
					t.Errorf("panic %q, want %q", msg, tc.want)
				}
			}()
			tc.make()
		}()
	}
}

// castCounter counts the backend's casts of F32 to a 16-bit dtype by
// length, and its multi-tensor casts.
type castCounter struct {
	kernels.Backend
	single map[int]int
	many   int
	biases int // F32 biases given to 16-bit products, which cast them
	sums   int // products that sum their bias's gradient
}

func (c *castCounter) GemmEpilogue(p kernels.GemmParams, e kernels.Epilogue, a, b, out kernels.Buf) {
	if e.Bias.DType == kernels.F32 && out.DType.Half() {
		c.biases++
	}
	if e.BiasGrad.Valid() || e.BiasGradA.Valid() {
		c.sums++
	}
	c.Backend.GemmEpilogue(p, e, a, b, out)
}

func (c *castCounter) Cast(dst, src kernels.Buf) {
	if src.DType == kernels.F32 && dst.DType.Half() {
		c.single[src.N]++
	}
	c.Backend.Cast(dst, src)
}

func (c *castCounter) CastMany(dst, src []kernels.Buf) {
	c.many++
	c.Backend.CastMany(dst, src)
}

// TestResNetCastsItsConvolutionsAtOnce: an AMP step of a ResNet without
// checkpointing casts no convolution's weight on its own (they are cast at
// once, autograd.CastParameters); with checkpointed blocks each
// convolution casts its own, in the forward and again in the
// recomputation, and nothing is cast at once.
func TestResNetCastsItsConvolutionsAtOnce(t *testing.T) {
	for _, tc := range []struct {
		mode      CheckpointMode
		perWeight int // single casts of a block's 16×16×3×3 weights
		atOnce    bool
	}{
		{NoCheckpoint, 0, true},
		{CheckpointBlocks, 2 * 2 * 3, false}, // two weights a block, three blocks of 16 channels, forward and recomputation
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			cc := &castCounter{Backend: cpu.New(), single: map[int]int{}}
			dev := tensor.NewDevice(cc)
			r, err := NewCIFARResNet(dev, 20, 1, 10)
			if err != nil {
				t.Fatal(err)
			}
			defer Release(r)
			r.SetCheckpoint(tc.mode)
			dev.WithScope(func() {
				x := tensor.Randn(dev, tensor.F32, 0, 1, 3, 1, 12, 12)
				y := tensor.FromInt32(dev, []int32{1, 4, 7}, 3)
				var loss *tensor.Tensor
				ag.Autocast(dev, tensor.F16, func() { loss, _, _ = r.Loss(x, y) })
				ag.Backward(loss)
			})
			ZeroGrad(r)
			if got := cc.single[16*16*9]; got != tc.perWeight {
				t.Errorf("%d single casts of a 16×16×3×3 weight, want %d", got, tc.perWeight)
			}
			if (cc.many > 0) != tc.atOnce {
				t.Errorf("%d multi-tensor casts, want some: %v", cc.many, tc.atOnce)
			}
		})
	}
}

// TestChannelsLastMatchesChannelsFirst: a ResNet-20 run channels last
// (SetChannelsLast) gives the loss, gradients and running statistics of the
// same network run channels first, on a three-channel input (transposed, not
// viewed): in F32 within tol, and under autocast no further from the F32
// run than channels first is (within twice its error, or tol).
func TestChannelsLastMatchesChannelsFirst(t *testing.T) { testChannelsLast(t, tensor.CPU(), 1e-5) }

func testChannelsLast(t *testing.T, dev *tensor.Device, tol float64) {
	a := dev.Allocator()
	base := a.Stats().Allocated[memory.All].Current
	held := map[bool]int64{} // by autocast: the bytes a step leaves, channels first
	run := func(amp, last bool) (loss float32, state [][]float32, names []string) {
		dev.Generator().Seed(7)
		r, _ := NewCIFARResNet(dev, 20, 3, 10)
		defer func() {
			Release(r)
			if now := a.Stats().Allocated[memory.All].Current; now != base {
				t.Errorf("amp %v, channels last %v: %d bytes allocated after the model's release, %d before", amp, last, now, base)
			}
		}()
		r.SetChannelsLast(last)
		dev.WithScope(func() {
			x := tensor.Empty(dev, tensor.F32, 6, 3, 12, 10)
			dev.Backend().Normal(x.Buf(), 0, 1, tensor.NewGenerator(42).Next(x.Numel()))
			y := tensor.FromInt32(dev, []int32{3, 1, 4, 1, 5, 9}, 6)
			step := func() {
				logits := r.Forward(x)
				l := ag.CrossEntropy(logits, y)
				logits.Release()
				// Scaled, as a GradScaler would: no F16 gradient is flushed to zero.
				ag.Backward(l, ag.WithGrad(tensor.Full(dev, tensor.F32, 1024, 1)))
				loss = l.Item()
			}
			if amp {
				ag.Autocast(dev, tensor.F16, step)
			} else {
				step()
			}
		})
		// The step leaves the parameters, their gradients and the running
		// statistics, in either layout.
		now := a.Stats().Allocated[memory.All].Current
		if first, ok := held[amp]; !last {
			held[amp] = now
		} else if ok && now != first {
			t.Errorf("amp %v: a channels-last step leaves %d bytes allocated, a channels-first one %d", amp, now, first)
		}
		for _, n := range r.State("") {
			v := n.T
			if n.Param {
				v = v.Grad()
			}
			state, names = append(state, v.Float32s()), append(names, n.Name)
		}
		return loss, state, names
	}
	refLoss, ref, names := run(false, false)
	worst := func(amp, last bool) (lossErr, err float64, at string) {
		loss, state, _ := run(amp, last)
		lossErr = math.Abs(float64(loss-refLoss)) / math.Abs(float64(refLoss))
		for i := range ref {
			if e := relErr(state[i], ref[i]); e > err {
				err, at = e, names[i]
			}
		}
		return lossErr, err, at
	}
	if le, e, at := worst(false, true); le > tol || e > tol {
		t.Errorf("F32 channels last: loss off by %.3g, %s off by %.3g (relative), want at most %g", le, at, e, tol)
	}
	fle, fe, fat := worst(true, false)
	lle, le, lat := worst(true, true)
	t.Logf("autocast, from F32: channels first loss %.3g, %s %.3g; channels last loss %.3g, %s %.3g", fle, fat, fe, lle, lat, le)
	if lle > max(2*fle, tol) || le > max(2*fe, tol) {
		t.Errorf("autocast channels last is further from F32 (loss %.3g, %s %.3g) than channels first (loss %.3g, %s %.3g)", lle, lat, le, fle, fat, fe)
	}
}
