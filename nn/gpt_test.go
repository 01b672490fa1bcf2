package nn

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/kernels/kerneltest"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
)

// refGPT is a GPT written from the definition in float64 (plain loops, the
// whole T×T attention, the full logits), over its parameters by name.
type refGPT struct {
	cfg GPTConfig
	p   map[string][]float64
}

func newRefGPT(g *GPT) *refGPT {
	r := &refGPT{cfg: g.Cfg, p: map[string][]float64{}}
	for _, n := range g.State("") {
		v := n.T.Float32s()
		f := make([]float64, len(v))
		for i, x := range v {
			f[i] = float64(x)
		}
		r.p[n.Name] = f
	}
	return r
}

func refLayerNorm(x []float64, rows, cols int, g, b []float64) []float64 {
	y := make([]float64, len(x))
	for r := 0; r < rows; r++ {
		row := x[r*cols : (r+1)*cols]
		var m, v float64
		for _, e := range row {
			m += e
		}
		m /= float64(cols)
		for _, e := range row {
			v += (e - m) * (e - m)
		}
		v /= float64(cols)
		for j, e := range row {
			y[r*cols+j] = (e-m)/math.Sqrt(v+1e-5)*g[j] + b[j]
		}
	}
	return y
}

// refLinear is x (rows×in) times wᵀ (w: out×in) plus b.
func refLinear(x []float64, rows, in int, w, b []float64, out int) []float64 {
	y := make([]float64, rows*out)
	for r := 0; r < rows; r++ {
		for o := 0; o < out; o++ {
			s := b[o]
			for i := 0; i < in; i++ {
				s += x[r*in+i] * w[o*in+i]
			}
			y[r*out+o] = s
		}
	}
	return y
}

func refGELU(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

// loss is the mean next-token cross-entropy of tokens x against targets y (B×T).
func (r *refGPT) loss(x, y []int32, B, Tn int) float64 {
	C, V, H := r.cfg.Width, r.cfg.Vocab, r.cfg.Heads
	D := C / H
	p := r.p
	h := make([]float64, B*Tn*C)
	for b := 0; b < B; b++ {
		for t := 0; t < Tn; t++ {
			for c := 0; c < C; c++ {
				h[(b*Tn+t)*C+c] = p["transformer.wte.weight"][int(x[b*Tn+t])*C+c] + p["transformer.wpe.weight"][t*C+c]
			}
		}
	}
	rows := B * Tn
	for l := 0; l < r.cfg.Layers; l++ {
		pre := "transformer.h." + string(rune('0'+l)) + "."
		a := refLayerNorm(h, rows, C, p[pre+"ln_1.weight"], p[pre+"ln_1.bias"])
		qkv := refLinear(a, rows, C, p[pre+"attn.c_attn.weight"], p[pre+"attn.c_attn.bias"], 3*C)
		att := make([]float64, rows*C)
		for b := 0; b < B; b++ {
			for hd := 0; hd < H; hd++ {
				for i := 0; i < Tn; i++ {
					s := make([]float64, i+1)
					m := math.Inf(-1)
					for j := 0; j <= i; j++ {
						for d := 0; d < D; d++ {
							s[j] += qkv[(b*Tn+i)*3*C+hd*D+d] * qkv[(b*Tn+j)*3*C+C+hd*D+d]
						}
						s[j] /= math.Sqrt(float64(D))
						m = math.Max(m, s[j])
					}
					var z float64
					for j := range s {
						s[j] = math.Exp(s[j] - m)
						z += s[j]
					}
					for j := range s {
						for d := 0; d < D; d++ {
							att[(b*Tn+i)*C+hd*D+d] += s[j] / z * qkv[(b*Tn+j)*3*C+2*C+hd*D+d]
						}
					}
				}
			}
		}
		proj := refLinear(att, rows, C, p[pre+"attn.c_proj.weight"], p[pre+"attn.c_proj.bias"], C)
		for i := range h {
			h[i] += proj[i]
		}
		a = refLayerNorm(h, rows, C, p[pre+"ln_2.weight"], p[pre+"ln_2.bias"])
		f := refLinear(a, rows, C, p[pre+"mlp.c_fc.weight"], p[pre+"mlp.c_fc.bias"], 4*C)
		for i := range f {
			f[i] = refGELU(f[i])
		}
		m := refLinear(f, rows, 4*C, p[pre+"mlp.c_proj.weight"], p[pre+"mlp.c_proj.bias"], C)
		for i := range h {
			h[i] += m[i]
		}
	}
	h = refLayerNorm(h, rows, C, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"])
	var total float64
	for r := 0; r < rows; r++ {
		z := make([]float64, V)
		mx := math.Inf(-1)
		for v := 0; v < V; v++ {
			for c := 0; c < C; c++ {
				z[v] += h[r*C+c] * p["transformer.wte.weight"][v*C+c]
			}
			mx = math.Max(mx, z[v])
		}
		var s float64
		for _, e := range z {
			s += math.Exp(e - mx)
		}
		total += mx + math.Log(s) - z[y[r]]
	}
	return total / float64(rows)
}

func tinyGPT(t *testing.T, dev *tensor.Device, seed uint64) *GPT {
	return tinyGPTDropping(t, dev, seed, 0)
}

// tinyGPTDropping is tinyGPT with residual and embedding dropout p.
func tinyGPTDropping(t *testing.T, dev *tensor.Device, seed uint64, p float32) *GPT {
	dev.Generator().Seed(seed)
	g, err := NewGPT(dev, GPTConfig{Layers: 2, Heads: 2, Width: 8, Vocab: 11, Context: 6, Dropout: p})
	if err != nil {
		t.Fatal(err)
	}
	// Larger weights than GPT-2's initialisation, so that every part of the
	// model moves the loss.
	for _, n := range g.State("") {
		dev.Backend().Normal(n.T.Buf(), 0, 0.3, dev.Generator().Next(n.T.Numel()))
	}
	return g
}

func randTokens(rng *rand.Rand, n, vocab int) []int32 {
	v := make([]int32, n)
	for i := range v {
		v[i] = int32(rng.IntN(vocab))
	}
	return v
}

// TestGPTMatchesFloat64Reference: the loss, and every parameter's gradient
// against central differences of the float64 reference.
func TestGPTMatchesFloat64Reference(t *testing.T) { testGPTMatchesReference(t, tensor.CPU()) }

func testGPTMatchesReference(t *testing.T, dev *tensor.Device) {
	g := tinyGPT(t, dev, 3)
	defer Release(g)
	rng := rand.New(rand.NewPCG(4, 5))
	const B, Tn = 2, 5
	xs, ys := randTokens(rng, B*Tn, 11), randTokens(rng, B*Tn, 11)
	x, y := tensor.FromInt32(dev, xs, B, Tn).Keep(), tensor.FromInt32(dev, ys, B, Tn).Keep()
	defer x.Release()
	defer y.Release()
	var got float64
	dev.WithScope(func() {
		loss, right, n := g.Loss(x, y)
		if n != B*Tn || right.Item() < 0 {
			t.Errorf("Loss counts %d predictions, %v right", n, right.Item())
		}
		got = float64(loss.Item())
		ag.Backward(loss)
	})
	ref := newRefGPT(g)
	want := ref.loss(xs, ys, B, Tn)
	if math.Abs(got-want) > 1e-5*math.Abs(want) {
		t.Errorf("loss %v, float64 reference %v", got, want)
	}
	for _, n := range g.State("") {
		grad := n.T.Grad()
		if grad == nil {
			t.Errorf("%s has no gradient", n.Name)
			continue
		}
		gv := grad.Float32s()
		w := ref.p[n.Name]
		var num, den float64
		for i := range w {
			v := w[i]
			w[i] = v + 1e-6
			lp := ref.loss(xs, ys, B, Tn)
			w[i] = v - 1e-6
			lm := ref.loss(xs, ys, B, Tn)
			w[i] = v
			d := (lp - lm) / 2e-6
			num += (float64(gv[i]) - d) * (float64(gv[i]) - d)
			den += d * d
		}
		if den > 0 && math.Sqrt(num/den) > 2e-3 {
			t.Errorf("%s: gradient off the float64 reference's by %.2g (relative)", n.Name, math.Sqrt(num/den))
		}
	}
	ZeroGrad(g)
}

// TestGPTCheckpointedMatchesPlain: checkpointed blocks (all, or the first
// of them; lightly or not) and √n segments give the same loss and gradients as keeping
// every activation, with dropout (its masks drawn again in the
// recomputation) and without.
func TestGPTCheckpointedMatchesPlain(t *testing.T) {
	for _, p := range []float32{0, 0.2} {
		testGPTCheckpointedMatchesPlain(t, p)
	}
}

func testGPTCheckpointedMatchesPlain(t *testing.T, p float32) {
	dev := tensor.CPU()
	rng := rand.New(rand.NewPCG(6, 7))
	xs, ys := randTokens(rng, 12, 11), randTokens(rng, 12, 11)
	run := func(mode CheckpointMode, first int) (float32, [][]float32) {
		g := tinyGPTDropping(t, dev, 9, p)
		defer Release(g)
		g.SetCheckpoint(mode)
		g.SetCheckpointed(first)
		var l float32
		dev.WithScope(func() {
			loss, _, _ := g.Loss(tensor.FromInt32(dev, xs, 2, 6), tensor.FromInt32(dev, ys, 2, 6))
			l = loss.Item()
			ag.Backward(loss)
		})
		var grads [][]float32
		for _, p := range Parameters(g) {
			grads = append(grads, p.Grad().Float32s())
		}
		ZeroGrad(g)
		return l, grads
	}
	l0, g0 := run(NoCheckpoint, 0)
	for _, tc := range []struct {
		mode  CheckpointMode
		first int
	}{{CheckpointBlocks, 0}, {CheckpointBlocks, 1}, {CheckpointSqrt, 0}, {CheckpointLight, 0}, {CheckpointLight, 1}} {
		l, gs := run(tc.mode, tc.first)
		if l != l0 {
			t.Errorf("dropout %v, %v (first %d): loss %v, plain %v", p, tc.mode, tc.first, l, l0)
		}
		for i := range gs {
			for j := range gs[i] {
				if gs[i][j] != g0[i][j] {
					t.Fatalf("dropout %v, %v (first %d): gradient %d differs at %d: %v vs %v", p, tc.mode, tc.first, i, j, gs[i][j], g0[i][j])
				}
			}
		}
	}
}

// greedyNext is the most likely token after seq by g's full forward,
// without a cache.
func greedyNext(g *GPT, dev *tensor.Device, seq []int32) (next int32) {
	ag.NoGrad(dev, func() {
		dev.WithScope(func() {
			logits := g.Forward(tensor.FromInt32(dev, seq, 1, len(seq))).Float32s()
			last := logits[(len(seq)-1)*g.Cfg.Vocab:]
			for j, v := range last {
				if v > last[next] {
					next = int32(j)
				}
			}
		})
	})
	return next
}

// TestGPTGenerateMatchesFullForward: greedy decoding with the key-value
// cache picks, at every step, the argmax of the full forward over the
// sequence so far, recomputed without a cache; and it leaves nothing
// allocated.
func TestGPTGenerateMatchesFullForward(t *testing.T) { testGPTGenerate(t, tensor.CPU()) }

func testGPTGenerate(t *testing.T, dev *tensor.Device) {
	g := tinyGPT(t, dev, 11)
	defer Release(g)
	before := dev.Allocator().Stats().Allocated[0].Current
	s := dev.Session()
	prompt := []int32{3, 1, 4}
	out, err := g.Generate(s, prompt, 3, Sampling{})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 3 {
		t.Fatalf("generated %v: want 3 tokens", out)
	}
	seq := append([]int32(nil), prompt...)
	for i, tok := range out {
		if want := greedyNext(g, dev, seq); tok != want {
			t.Errorf("token %d: %d with the cache, %d from the full forward", i, tok, want)
		}
		seq = append(seq, tok)
	}
	if after := dev.Allocator().Stats().Allocated[0].Current; after != before {
		t.Errorf("allocated %d bytes after Generate, %d before: the cache was not released", after, before)
	}
	// Past the context (6), the window slides: when it is full its last
	// half begins the next, and each token is the full forward's argmax
	// over the window; a prompt longer than the context is cut to its end.
	// Larger weights make the argmax depend on the window's tokens.
	for _, n := range g.State("") {
		dev.Backend().Normal(n.T.Buf(), 0, 1.5, dev.Generator().Next(n.T.Numel()))
	}
	for _, prompt := range [][]int32{{1}, {5, 2, 7, 1, 8, 2, 8, 1, 8}} {
		out, err := g.Generate(s, prompt, 14, Sampling{})
		if err != nil || len(out) != 14 {
			t.Fatalf("generating 14 tokens past a context of 6 after %v: %v, %v", prompt, out, err)
		}
		seq := slices.Clone(prompt[max(0, len(prompt)-6):])
		start := 0
		for i, tok := range out {
			if len(seq)-start > 6 {
				start = len(seq) - 3
			}
			if want := greedyNext(g, dev, seq[start:]); tok != want {
				t.Errorf("after %v, token %d: %d generated, %d from the window %v", prompt, i, tok, want, seq[start:])
			}
			seq = append(seq, tok)
		}
	}
	if _, err := g.Generate(s, []int32{1}, math.MaxInt, Sampling{}); err == nil || !strings.Contains(err.Error(), "at most 16777216") { // not wrapped past the check
		t.Errorf("a generation of MaxInt tokens: %v", err)
	}
	if _, err := g.Generate(s, []int32{11}, 1, Sampling{}); err == nil || !strings.Contains(err.Error(), "outside the vocabulary") {
		t.Errorf("a prompt token outside the vocabulary: %v", err)
	}
}

// TestGPT2FileLayout: a file written in Hugging Face GPT-2's layout by the
// test itself (names without "transformer.", Conv1D weights in×out, the
// attention masks and a tied lm_head beside them, F16 values) loads into
// the model those values describe; SaveGPT2 and LoadGPT2 round-trip.
func TestGPT2FileLayout(t *testing.T) {
	dev := tensor.CPU()
	g := tinyGPT(t, dev, 21)
	defer Release(g)
	g.Cfg.Heads = 2
	st := &Safetensors{Tensors: map[string]Stored{}, Metadata: map[string]string{}}
	for _, n := range g.State("") {
		shape, v := n.T.Shape(), n.T.Float32s()
		name := strings.TrimPrefix(n.Name, "transformer.")
		if strings.Contains(name, "c_attn.weight") || strings.Contains(name, "c_proj.weight") || strings.Contains(name, "c_fc.weight") {
			tv := make([]float32, len(v)) // Conv1D: in×out
			for i := 0; i < shape[0]; i++ {
				for j := 0; j < shape[1]; j++ {
					tv[j*shape[0]+i] = v[i*shape[1]+j]
				}
			}
			v, shape = tv, []int{shape[1], shape[0]}
		}
		h := tensor.FromFloat32(dev, v, len(v))
		c := ag.Cast(h, tensor.F16)
		st.Tensors[name] = Stored{DType: tensor.F16, Shape: shape, Data: c.Raw()}
		h.Release()
		c.Release()
	}
	st.Tensors["h.0.attn.bias"] = Stored{DType: tensor.F32, Shape: []int{1}, Data: make([]byte, 4)}
	st.Tensors["lm_head.weight"] = st.Tensors["wte.weight"]
	dir := t.TempDir()
	// Width 8 is not GPT-2's 64 a head: the heads come from the metadata
	// SaveGPT2 writes, or here, where it is missing, an error says so.
	if err := WriteSafetensors(dir+"/hf.safetensors", st); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadGPT2(dir+"/hf.safetensors", dev); err == nil || !strings.Contains(err.Error(), "heads") {
		t.Errorf("a file of width 8 without metadata: %v", err)
	}
	st.Metadata[gptMetaKey] = `{"Layers":2,"Heads":2,"Width":8,"Vocab":11,"Context":6}`
	if err := WriteSafetensors(dir+"/hf.safetensors", st); err != nil {
		t.Fatal(err)
	}
	l, err := LoadGPT2(dir+"/hf.safetensors", dev)
	if err != nil {
		t.Fatal(err)
	}
	defer Release(l)
	want, got := g.State(""), l.State("")
	for i := range want {
		wv, gv := want[i].T.Float32s(), got[i].T.Float32s()
		for j := range wv {
			if d := math.Abs(float64(wv[j] - gv[j])); d > 2e-3*(1+math.Abs(float64(wv[j]))) {
				t.Fatalf("%s[%d]: %v loaded, %v written (f16)", want[i].Name, j, gv[j], wv[j])
			}
		}
	}
	// A round trip through SaveGPT2 is exact (F32).
	if err := SaveGPT2(dir+"/ours.safetensors", g); err != nil {
		t.Fatal(err)
	}
	r, err := LoadGPT2(dir+"/ours.safetensors", dev)
	if err != nil {
		t.Fatal(err)
	}
	defer Release(r)
	for i, n := range r.State("") {
		if !slices.Equal(n.T.Float32s(), want[i].T.Float32s()) {
			t.Errorf("%s differs after SaveGPT2 and LoadGPT2", n.Name)
		}
	}
	delete(st.Tensors, "h.1.mlp.c_fc.bias")
	WriteSafetensors(dir+"/short.safetensors", st)
	if _, err := LoadGPT2(dir+"/short.safetensors", dev); err == nil || !strings.Contains(err.Error(), "h.1.mlp.c_fc.bias") {
		t.Errorf("a file without a tensor: %v", err)
	}
}

// countingBackend counts the attention kernels and the matrix products
// (kerneltest.Products) a backend runs.
type countingBackend struct {
	kerneltest.Products
	forward, backward int // attention kernels
}

func (c *countingBackend) Attention(p kernels.AttentionParams, q, k, v, o, lse kernels.Buf) {
	c.forward++
	c.Backend.Attention(p, q, k, v, o, lse)
}

func (c *countingBackend) AttentionBackward(p kernels.AttentionParams, q, k, v, o, lse, do, dq, dk, dv kernels.Buf) {
	c.backward++
	c.Backend.AttentionBackward(p, q, k, v, o, lse, do, dq, dk, dv)
}

// TestCheckpointRecomputesWhatTheBackwardReads: a checkpointed step runs
// each block's attention forward once, not again in the recomputation
// (Note [what a checkpoint keeps]), and recomputes every forward product
// but the MLP output product of each checkpoint's last block (Note [what a
// recomputation skips]), and a light checkpoint c_proj's and c_fc's (Note
// [light checkpoints] in package autograd). It leaves what the plain step leaves
// allocated (the parameters and their gradients), the same after a second
// step; the peaks are in the order of what each keeps.
func TestCheckpointRecomputesWhatTheBackwardReads(t *testing.T) {
	cb := &countingBackend{Products: kerneltest.Products{Backend: cpu.New()}}
	dev := tensor.NewDevice(cb)
	rng := rand.New(rand.NewPCG(8, 9))
	xs, ys := randTokens(rng, 12, 11), randTokens(rng, 12, 11)
	var plain int64
	var plainProducts int
	peaks := map[CheckpointMode]int64{}
	for _, tc := range []struct {
		mode       CheckpointMode
		recomputed int // products of the 2 blocks' 8
	}{{NoCheckpoint, 0}, {CheckpointBlocks, 8 - 2}, {CheckpointSqrt, 8 - 1}, {CheckpointLight, 4}} {
		g := tinyGPT(t, dev, 9)
		g.SetCheckpoint(tc.mode)
		if layers := len(g.Blocks); layers != 2 {
			t.Fatalf("tinyGPT has %d blocks; the segment counts are for 2", layers)
		}
		for step := range 2 {
			cb.forward, cb.backward, cb.N = 0, 0, 0
			dev.Allocator().WindowPeak()
			dev.WithScope(func() {
				loss, _, _ := g.Loss(tensor.FromInt32(dev, xs, 2, 6), tensor.FromInt32(dev, ys, 2, 6))
				ag.Backward(loss)
			})
			if layers := len(g.Blocks); cb.forward != layers || cb.backward != layers {
				t.Errorf("%v: %d attention forwards and %d backwards for %d blocks, want one each", tc.mode, cb.forward, cb.backward, layers)
			}
			peaks[tc.mode], _ = dev.Allocator().WindowPeak()
			got := dev.Allocator().Stats().Allocated[0].Current
			if tc.mode == NoCheckpoint && step == 0 {
				plain, plainProducts = got, cb.N
			}
			if got != plain {
				t.Errorf("%v, step %d: %d bytes allocated after the step, the plain step %d", tc.mode, step, got, plain)
			}
			if want := plainProducts + tc.recomputed; tc.mode != NoCheckpoint && cb.N != want {
				t.Errorf("%v, step %d: %d products, want %d (the plain step's %d and the recomputed ones)", tc.mode, step, cb.N, want, plainProducts)
			}
		}
		Release(g)
	}
	if b, l, n := peaks[CheckpointBlocks], peaks[CheckpointLight], peaks[NoCheckpoint]; !(b < l && l < n) {
		t.Errorf("peaks: %d bytes checkpointing blocks, %d lightly, %d with none: want them rising", b, l, n)
	}
}

// TestGPTCastsItsWeightsAtOnce: an AMP step of a GPT without
// checkpointing casts no product's weight or bias on its own (they are
// cast at once, autograd.CastParameters); with checkpointed blocks each
// linear layer casts its own, in the forward and again in the
// recomputation, and nothing is cast at once.
func TestGPTCastsItsWeightsAtOnce(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 9))
	xs, ys := randTokens(rng, 12, 11), randTokens(rng, 12, 11)
	for _, tc := range []struct {
		mode   CheckpointMode
		cAttn  int // single casts of a block's 24×8 c_attn weight
		biases int // F32 biases given to bf16 products (c_attn's and c_fc's)
		atOnce bool
	}{
		{NoCheckpoint, 0, 0, true},
		{CheckpointBlocks, 2 * 2, 2 * 2 * 2, false}, // two blocks, forward and recomputation
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			cc := &castCounter{Backend: cpu.New(), single: map[int]int{}}
			dev := tensor.NewDevice(cc)
			g := tinyGPT(t, dev, 9)
			defer Release(g)
			g.SetCheckpoint(tc.mode)
			dev.WithScope(func() {
				var loss *tensor.Tensor
				ag.Autocast(dev, tensor.BF16, func() {
					loss, _, _ = g.Loss(tensor.FromInt32(dev, xs, 2, 6), tensor.FromInt32(dev, ys, 2, 6))
				})
				ag.Backward(loss)
			})
			if got := cc.single[24*8]; got != tc.cAttn {
				t.Errorf("%d single casts of a 24×8 weight, want %d", got, tc.cAttn)
			}
			if cc.biases != tc.biases {
				t.Errorf("%d f32 biases given to bf16 products, want %d", cc.biases, tc.biases)
			}
			if got := cc.single[11*8]; got != 0 && tc.atOnce {
				t.Errorf("%d single casts of the token embedding, want none", got)
			}
			if (cc.many > 0) != tc.atOnce {
				t.Errorf("%d multi-tensor casts, want some: %v", cc.many, tc.atOnce)
			}
		})
	}
}

// TestGPTBackwardCastsOneStreamGradient: under autocast the residual
// stream's F32 gradient reaches every block's residual products already
// rounded to bf16, and their biases' gradients summed, by the layer norm
// whose backward finished it, through the blocks' reshapes (Note [a
// gradient rounded where it is finished]): the backward casts one
// gradient of the stream's size, the classifier's F32 gradient for the
// final layer norm, and the products sum two biases' gradients a block
// (c_attn's, c_fc's). A checkpointed block's output gradient enters its
// recomputation's pass unrounded, and is cast and summed once more a
// block.
func TestGPTBackwardCastsOneStreamGradient(t *testing.T) {
	cb := &castCounter{Backend: cpu.New(), single: map[int]int{}}
	dev := tensor.NewDevice(cb)
	rng := rand.New(rand.NewPCG(8, 9))
	xs, ys := randTokens(rng, 12, 11), randTokens(rng, 12, 11)
	const stream = 2 * 6 * 8 // batch × context × width
	for _, tc := range []struct {
		mode        CheckpointMode
		casts, sums int
	}{{NoCheckpoint, 1, 2 * 2}, {CheckpointBlocks, 3, 2 * 3}} {
		g := tinyGPT(t, dev, 9)
		g.SetCheckpoint(tc.mode)
		dev.WithScope(func() {
			var loss *tensor.Tensor
			ag.Autocast(dev, tensor.BF16, func() {
				loss, _, _ = g.Loss(tensor.FromInt32(dev, xs, 2, 6), tensor.FromInt32(dev, ys, 2, 6))
			})
			clear(cb.single)
			cb.sums = 0
			ag.Backward(loss)
			if n := cb.single[stream]; n != tc.casts {
				t.Errorf("%v: the backward cast %d f32 tensors of the stream's %d elements, want %d", tc.mode, n, stream, tc.casts)
			}
			if cb.sums != tc.sums {
				t.Errorf("%v: %d products summed their bias's gradient, want %d", tc.mode, cb.sums, tc.sums)
			}
		})
		Release(g)
	}
}

// TestGPTBlockHoldsOnlyWhatItSaves: after a block's forward, with dropout
// and without, in float32 and under autocast, the memory it added is its
// output and what its graph saved for the backward, nothing left over.
func TestGPTBlockHoldsOnlyWhatItSaves(t *testing.T) {
	dev := tensor.CPU()
	for _, drop := range []float32{0, 0.1} {
		for _, amp := range []tensor.DType{0, tensor.BF16} {
			dev.Generator().Seed(3)
			g, err := NewGPT(dev, GPTConfig{Layers: 1, Heads: 2, Width: 16, Vocab: 11, Context: 8, Dropout: drop})
			if err != nil {
				t.Fatal(err)
			}
			b := g.Blocks[0]
			params := map[*memory.Block]bool{}
			for _, p := range Parameters(g) {
				params[p.Block()] = true
			}
			dev.WithScope(func() {
				x := tensor.Randn(dev, tensor.F32, 0, 1, 2, 8, 16).SetRequiresGrad(true)
				params[x.Block()] = true
				before := dev.Allocator().Stats().Allocated[memory.All].Current
				var out *tensor.Tensor
				if amp != 0 {
					ag.Autocast(dev, amp, func() { out = b.Forward(x) })
				} else {
					out = b.Forward(x)
				}
				held := dev.Allocator().Stats().Allocated[memory.All].Current - before
				var saved int64
				counted := false
				for _, s := range ag.Saved(out, func(blk *memory.Block) bool {
					counted = counted || blk == out.Block()
					return params[blk]
				}) {
					saved += s.Bytes
				}
				if !counted {
					saved += out.Block().Size()
				}
				if held != saved {
					t.Errorf("dropout %v, autocast %v: the forward holds %d bytes, its output and saved tensors %d", drop, amp, held, saved)
				}
			})
			Release(g)
		}
	}
}

// TestGPTProductWeights: a GPT with 16-bit product weights draws the F32
// model's numbers and holds them rounded, the rest of its parameters F32
// and equal, in the bytes ParamBytes counts; other dtypes are refused.
func TestGPTProductWeights(t *testing.T) {
	dev := tensor.CPU()
	base := GPTConfig{Layers: 2, Heads: 2, Width: 16, Vocab: 50, Context: 8}
	build := func(dt tensor.DType) *GPT {
		c := base
		c.ProductWeights = dt
		dev.Generator().Seed(9)
		g, err := NewGPT(dev, c)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	f32 := build(0)
	defer Release(f32)
	want := Parameters(f32)
	for _, dt := range []tensor.DType{tensor.BF16, tensor.F16} {
		g := build(dt)
		var bytes int64
		for i, p := range Parameters(g) {
			bytes += p.Bytes()
			w := want[i].Float32s()
			if p.DType() != tensor.F32 {
				r := tensor.Empty(dev, p.DType(), want[i].Shape()...)
				dev.Backend().Cast(r.Buf(), want[i].Buf())
				w = r.Float32s()
				r.Release()
			}
			if got := p.Float32s(); !slices.Equal(got, w) {
				t.Errorf("%v: parameter %d (%v %v) differs from the F32 model's, rounded", dt, i, p.DType(), p.Shape())
			}
		}
		if c := g.Cfg; bytes != c.ParamBytes() || c.ParamBytes() >= base.ParamBytes() {
			t.Errorf("%v: the parameters take %d bytes, ParamBytes says %d (F32: %d)", dt, bytes, c.ParamBytes(), base.ParamBytes())
		}
		Release(g)
	}
	bad := base
	bad.ProductWeights = tensor.I32
	if err := bad.Check(); err == nil {
		t.Error("a GPT with i32 product weights passed Check")
	}
}
