package cuda

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/kerneltest"
	"github.com/leangrad/leangrad/memory"
)

// testBackend opens cuda:0 or skips, naming the reason.
func testBackend(t testing.TB) *Backend {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	b, err := Open(0, Options{})
	if err != nil {
		t.Fatalf("cuda:0 is present but does not open: %v", err)
	}
	t.Logf("%s (%s): %s; convolutions by %s", b.Name(), b.DeviceName(), b.CompileLog, b.ConvEngine())
	return b
}

// TestCUDAConformance runs the suite on a backend whose F32 is strict
// (products by cuBLAS, convolutions without TF32), and again on the
// default one, whose F32 products are three TF32 ones and whose F32
// convolutions may use TF32 (as PyTorch's do by default), those at TF32's
// tolerance.
func TestCUDAConformance(t *testing.T) {
	def := testBackend(t)
	strict, err := OpenSeparate(0, Options{StrictConvF32: true, MatmulF32: kernels.F32Strict})
	if err != nil {
		t.Fatal(err)
	}
	kerneltest.Run(t, strict)
	kerneltest.RunWith(t, def, kerneltest.Options{ConvTol: kerneltest.TolTF32})
	for _, b := range []*Backend{strict, def} {
		if f := b.CuDNNFailures(); len(f) > 0 {
			t.Errorf("%d cuDNN calls failed (those shapes fell back to im2col + cuBLAS); the first: %s", len(f), f[0])
		}
	}
}

// TestCUDAOperationsOutOfMemory fails each allocation of each operation of
// the conformance suite in turn and checks that it gives back what it took
// (Note [operations out of memory]): on the default paths, and on the
// chunked attention (no flash kernels) and classifier with a 64 KiB chunk
// budget, whose chunks take several workspaces each.
func TestCUDAOperationsOutOfMemory(t *testing.T) {
	testBackend(t)
	for _, c := range []struct {
		name  string
		set   func(b *Backend)
		cases []string
	}{
		{"default", func(*Backend) {}, nil},
		{"chunked", func(b *Backend) { b.noFlash, b.chunkBudget = true, 64<<10 }, []string{"attention", "classifier"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := open(0, Options{})
			if err != nil {
				t.Fatal(err)
			}
			c.set(b)
			b.alloc.Free(b.blasWS) // the pool open made, emptied for one over src
			b.alloc.EmptyCache()
			src := memory.Inject(&deviceSource{b: b}, memory.Faults{})
			if err := b.usePool(src, memory.Config{Device: b.name, NoCaching: true}); err != nil {
				t.Fatal(err)
			}
			if n := kerneltest.RunOOM(t, b, src, kerneltest.Options{ConvTol: kerneltest.TolTF32}, c.cases...); n == 0 {
				t.Error("no operation failed: the sweep reached none of their allocations")
			}
			if err := b.Close(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestCUDAConvChunks runs the convolutions on the im2col + cuBLAS path (not
// cuDNN) with a 64 KiB workspace cap, so that every im2col convolution is
// done in several chunks of images (and the backward-filter product
// accumulates across them).
func TestCUDAConvChunks(t *testing.T) {
	testBackend(t)
	b, err := open(0, Options{ConvWorkspace: 64 << 10, NoCuDNN: true})
	if err != nil {
		t.Fatal(err)
	}
	kerneltest.Run(t, b, "conv")
}

// TestCUDAConvHalves runs the convolutions of even batches on each half of
// the batch in turn (Note [a convolution in two halves]), F32 strict, at
// the suite's tolerance, and checks that they did.
func TestCUDAConvHalves(t *testing.T) {
	testBackend(t)
	b, err := open(0, Options{StrictConvF32: true})
	if err != nil {
		t.Fatal(err)
	}
	b.halves = true
	kerneltest.Run(t, b, "conv")
	halved := 0
	for k, pl := range b.plans {
		for dir, cands := range pl.cands {
			if !k.half && pl.found[dir] && pl.eager[dir] >= 0 && cands[pl.eager[dir]].half != nil {
				halved++
			}
		}
	}
	if halved == 0 {
		t.Errorf("no convolution ran on halves of its batch")
	}
	t.Logf("%d shapes and directions ran on halves", halved)
	if f := b.CuDNNFailures(); len(f) > 0 {
		t.Errorf("%d cuDNN calls failed; the first: %s", len(f), f[0])
	}
}

// TestCUDATransformerChunks runs attention and the classifier with a 64 KiB
// chunk budget, so that their scores and logits come in many chunks of
// rows (and the classifier's weight gradient accumulates across them).
func TestCUDATransformerChunks(t *testing.T) {
	testBackend(t)
	b, err := open(0, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b.chunkBudget = 64 << 10
	kerneltest.Run(t, b, "attention", "classifier")
}

// TestCUDAFlashAttention: on tensor cores, F16 and BF16 attention of head
// width 64 runs the flash kernels where cuDNN's graphs do not (noDNNAttn;
// the conformance cases check their results), and F32 attention the F32
// flash kernels; the chunked path takes the rest, and all of it with
// noFlash. So too paged attention's prefills: F16 and BF16 of head width
// 64 on paged_flash, the rest on paged_tiles, all of them with noFlash.
func TestCUDAFlashAttention(t *testing.T) {
	b := testBackend(t)
	if !b.tensorCores {
		t.Skipf("%s has no mma.sync for F16 and BF16", b.arch)
	}
	b.noDNNAttn = true
	defer func() { b.noDNNAttn = false }()
	for _, noFlash := range []bool{false, true} {
		b.noFlash = noFlash
		ran := profiledOps(t, b, "attention")
		for _, k := range []string{"flash_fwd_f16", "flash_fwd_bf16", "flash_fwd_f32", "flash_bwd_kv_bf16", "flash_bwd_q_f16", "flash_bwd_q_f32", "flash_bwd_kv_f32"} {
			if (ran[k] > 0) == noFlash {
				t.Errorf("noFlash %v: %s ran %d times", noFlash, k, ran[k])
			}
		}
		ran = profiledOps(t, b, "paged attention")
		for _, k := range []string{"paged_flash_f16", "paged_flash_bf16"} {
			if (ran[k] > 0) == noFlash {
				t.Errorf("noFlash %v: %s ran %d times", noFlash, k, ran[k])
			}
		}
		if noFlash && ran["paged_tiles"] == 0 {
			t.Errorf("noFlash: paged_tiles never ran")
		}
	}
	b.noFlash = false
}

// TestCUDAFlashF32Accuracy: the F32 flash kernels' three TF32 products
// keep F32's accuracy. Against a float64 reference, on fresh random
// operands (c_attn's packed layout, a ragged last tile; and a few queries
// over more keys, forward only), the output and log-sum-exp, and dq, dk
// and dv from a random do, are within 1e-5, or a few times the strict F32
// chunked path's error (noFlash: cuBLAS's F32 products) if that is more:
// TF32 alone (11 bits) would miss by far more.
func TestCUDAFlashF32Accuracy(t *testing.T) {
	b := testBackend(t)
	if !b.tensorCores {
		t.Skipf("%s has no mma.sync for TF32", b.arch)
	}
	defer func() { b.noFlash = false }()
	for _, c := range []struct{ B, H, Tq, Tk int }{{2, 3, 300, 300}, {1, 2, 5, 200}} {
		const D = 64
		C := c.H * D
		rng := rand.New(rand.NewPCG(uint64(c.Tq), uint64(c.Tk)))
		// q, k and v side by side in a row of 3C when packed (their
		// gradients too), else each its own.
		packed := c.Tq == c.Tk
		p := kernels.AttentionParams{B: c.B, H: c.H, D: D, Tq: c.Tq, Tk: c.Tk, Scale: 1 / float32(math.Sqrt(D)),
			QRow: C, KRow: C, VRow: C, ORow: C, QBatch: c.Tq * C, KBatch: c.Tk * C, VBatch: c.Tk * C, OBatch: c.Tq * C}
		if packed {
			p.QRow, p.KRow, p.VRow, p.QBatch, p.KBatch, p.VBatch = 3*C, 3*C, 3*C, 3*c.Tq*C, 3*c.Tq*C, 3*c.Tq*C
		}
		// operands uploads q, k and v, packed or not, and returns their buffers.
		operands := func(q, k, v []float32) (qb, kb, vb kernels.Buf) {
			if !packed {
				return upload(t, b, q), upload(t, b, k), upload(t, b, v)
			}
			qkv := make([]float32, 0, 3*len(q))
			for r := 0; r < c.B*c.Tq; r++ {
				qkv = append(append(append(qkv, q[r*C:(r+1)*C]...), k[r*C:(r+1)*C]...), v[r*C:(r+1)*C]...)
			}
			all := upload(t, b, qkv)
			return all, all.Slice(C, len(qkv)-C), all.Slice(2*C, len(qkv)-2*C)
		}
		// unpack reads back one of q, k and v's places in a packed buffer.
		unpack := func(x kernels.Buf, i int) []float32 {
			all, out := read32(b, x), make([]float32, 0, c.B*c.Tq*C)
			for r := 0; r < c.B*c.Tq; r++ {
				out = append(out, all[r*3*C+i*C:r*3*C+(i+1)*C]...)
			}
			return out
		}
		q, k, v := randn(rng, c.B*c.Tq*C), randn(rng, c.B*c.Tk*C), randn(rng, c.B*c.Tk*C)
		qb, kb, vb := operands(q, k, v)
		wantO, wantL := attentionF64(c.B, c.H, D, c.Tq, c.Tk, q, k, v)
		var errs [2][5]float64 // [flash, chunked][o, lse, dq, dk, dv]
		var o, lse kernels.Buf
		for i, noFlash := range []bool{false, true} {
			b.noFlash = noFlash
			o, lse = upload(t, b, randn(rng, c.B*c.Tq*C)), upload(t, b, randn(rng, c.B*c.H*c.Tq)) // poisoned
			b.Attention(p, qb, kb, vb, o, lse)
			errs[i][0], errs[i][1] = relErr(read32(b, o), wantO), relErr(read32(b, lse), wantL)
		}
		names := []string{"o", "lse"}
		if packed {
			names = append(names, "dq", "dk", "dv")
			do := randn(rng, c.B*c.Tq*C)
			want := attentionBackwardF64(c.B, c.H, D, c.Tq, q, k, v, do)
			dob := upload(t, b, do)
			for i, noFlash := range []bool{false, true} { // o and lse the chunked forward's
				b.noFlash = noFlash
				dq, dk, dv := operands(randn(rng, len(q)), randn(rng, len(k)), randn(rng, len(v))) // poisoned
				b.AttentionBackward(p, qb, kb, vb, o, lse, dob, dq, dk, dv)
				for j := range want {
					errs[i][2+j] = relErr(unpack(dq, j), want[j])
				}
			}
		}
		t.Logf("%+v: relative error of %v: flash %.2g; chunked F32 %.2g", c, names, errs[0][:len(names)], errs[1][:len(names)])
		for j, what := range names {
			if errs[0][j] > max(4*errs[1][j], 1e-5) {
				t.Errorf("%+v: the F32 flash kernels' %s is %.3g from float64's, the strict F32 path's %.3g", c, what, errs[0][j], errs[1][j])
			}
		}
	}
}

// attentionF64 is causal attention in float64 of q [B, Tq, H·D] over k
// and v [B, Tk, H·D] (query i sees keys up to Tk−Tq+i): o and each row's
// log-sum-exp, [B·H, Tq].
func attentionF64(B, H, D, Tq, Tk int, q, k, v []float32) (o, lse []float64) {
	C := H * D
	o, lse = make([]float64, B*Tq*C), make([]float64, B*H*Tq)
	s := make([]float64, Tk)
	for b := range B {
		for h := range H {
			for i := range Tq {
				seen := Tk - Tq + i + 1
				mx := math.Inf(-1)
				for j := range seen {
					var d float64
					for e := range D {
						d += float64(q[(b*Tq+i)*C+h*D+e]) * float64(k[(b*Tk+j)*C+h*D+e])
					}
					s[j] = d / math.Sqrt(float64(D))
					mx = math.Max(mx, s[j])
				}
				var z float64
				for j := range seen {
					s[j] = math.Exp(s[j] - mx)
					z += s[j]
				}
				for e := range D {
					var acc float64
					for j := range seen {
						acc += s[j] * float64(v[(b*Tk+j)*C+h*D+e])
					}
					o[(b*Tq+i)*C+h*D+e] = acc / z
				}
				lse[(b*H+h)*Tq+i] = mx + math.Log(z)
			}
		}
	}
	return o, lse
}

// attentionBackwardF64 is attentionF64's gradients in float64 for T
// queries over as many keys, given do: dq, dk and dv, [B, T, H·D] each.
func attentionBackwardF64(B, H, D, T int, q, k, v, do []float32) [3][]float64 {
	C := H * D
	var g [3][]float64
	for i := range g {
		g[i] = make([]float64, B*T*C)
	}
	dq, dk, dv := g[0], g[1], g[2]
	scale := 1 / math.Sqrt(float64(D))
	at := func(x []float32, b, t, h, e int) float64 { return float64(x[(b*T+t)*C+h*D+e]) }
	p, dp := make([]float64, T), make([]float64, T)
	for b := range B {
		for h := range H {
			for i := range T {
				mx := math.Inf(-1)
				for j := 0; j <= i; j++ {
					var s float64
					for e := range D {
						s += at(q, b, i, h, e) * at(k, b, j, h, e)
					}
					p[j] = s * scale
					mx = math.Max(mx, p[j])
				}
				var z, rd float64
				for j := 0; j <= i; j++ {
					p[j] = math.Exp(p[j] - mx)
					z += p[j]
				}
				for j := 0; j <= i; j++ {
					p[j] /= z
					dp[j] = 0
					for e := range D {
						dp[j] += at(do, b, i, h, e) * at(v, b, j, h, e)
					}
					rd += p[j] * dp[j]
				}
				for j := 0; j <= i; j++ {
					ds := p[j] * (dp[j] - rd) * scale
					for e := range D {
						dq[(b*T+i)*C+h*D+e] += ds * at(k, b, j, h, e)
						dk[(b*T+j)*C+h*D+e] += ds * at(q, b, i, h, e)
						dv[(b*T+j)*C+h*D+e] += p[j] * at(do, b, i, h, e)
					}
				}
			}
		}
	}
	return g
}

// read32 copies an F32 buffer back.
func read32(b *Backend, x kernels.Buf) []float32 {
	out := make([]float32, x.N)
	b.Read(unsafe.Slice((*byte)(unsafe.Pointer(&out[0])), 4*x.N), x)
	return out
}

// randn returns n standard normal float32s from rng.
func randn(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

// upload copies x into a new F32 buffer on b, freed when t ends.
func upload(t *testing.T, b *Backend, x []float32) kernels.Buf {
	blk := alloc(t, b, int64(4*len(x)))
	t.Cleanup(func() { b.Allocator().Free(blk) })
	buf := kernels.Buf{Block: blk, N: len(x), DType: kernels.F32}
	b.Write(buf, unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x)))
	return buf
}

// relErr is the relative L2 distance of got from want.
func relErr(got []float32, want []float64) float64 {
	var num, den float64
	for i, w := range want {
		d := float64(got[i]) - w
		num, den = num+d*d, den+w*w
	}
	return math.Sqrt(num / den)
}

// profiledOps runs the conformance cases named on b and counts the
// operations they ran, by name.
func profiledOps(t *testing.T, b *Backend, names ...string) map[string]int {
	t.Helper()
	b.StartProfile()
	kerneltest.Run(t, b, names...)
	ops, err := b.StopProfile()
	if err != nil {
		t.Fatal(err)
	}
	ran := map[string]int{}
	for _, op := range ops {
		ran[op.Op]++
	}
	return ran
}

// TestCUDADNNAttention: with cuDNN loaded, attention with as many
// queries as keys runs as cuDNN's graphs, forward and backward (Note
// [cuDNN's attention]), checked by the conformance cases against the
// CPU's; with noDNNAttn the flash kernels take it.
func TestCUDADNNAttention(t *testing.T) {
	b := testBackend(t)
	if b.dnn == nil || !b.tensorCores {
		t.Skipf("no cuDNN (%s) or no tensor cores on %s", b.dnnReason, b.arch)
	}
	for _, off := range []bool{false, true} {
		b.noDNNAttn = off
		ran := map[string]int{}
		for op, n := range profiledOps(t, b, "attention") {
			for _, dir := range []string{"forward", "backward"} {
				if strings.HasPrefix(op, "cudnn attention "+dir) {
					ran[dir] += n
				}
			}
		}
		backward := !off && b.dnn.version >= 90600 // the backward graph needs cuDNN 9.6
		if (ran["forward"] > 0) == off || (ran["backward"] > 0) != backward {
			t.Errorf("noDNNAttn %v: cuDNN's attention ran %v; its refusals: %q", off, ran, b.DNNAttention())
		}
	}
	b.noDNNAttn = false
	if why := b.DNNAttention(); why != "" {
		t.Errorf("cuDNN %d refused attention: %s", b.dnn.version, why)
	}
}

// TestCUDAGemmEpilogues runs the epilogue cases fused by cuBLASLt (F32
// products strict, so that cuBLASLt runs those too), with and without the
// bias gradients (ltSums), and again with noLt, unfused (cublasGemmEx and
// gemm_epilogue); cuBLASLt must have an algorithm for every case it is
// asked with sizes in multiples of 8, as a transformer's are.
func TestCUDAGemmEpilogues(t *testing.T) {
	testBackend(t)
	b, err := open(0, Options{MatmulF32: kernels.F32Strict})
	if err != nil {
		t.Fatal(err)
	}
	if b.lt == nil {
		t.Fatalf("cuBLASLt did not load: %s", b.ltReason)
	}
	for _, mode := range []struct{ noLt, sums bool }{{false, false}, {false, true}, {true, false}} {
		noLt := mode.noLt
		b.noLt, b.ltSums = mode.noLt, mode.sums
		seen := map[string]bool{}
		for op := range profiledOps(t, b, "gemm-epilogue") {
			for _, name := range []string{"cublasLt", "gemm_epilogue"} {
				if strings.HasPrefix(op, name) {
					seen[name] = true
				}
			}
		}
		if seen["cublasLt"] == noLt || noLt && !seen["gemm_epilogue"] {
			t.Errorf("%+v: ran %v", mode, seen)
		}
	}
	b.noLt, b.ltSums = false, false
	for key, pl := range b.ltPlans {
		if pl.refused == "" {
			continue
		}
		if key.m%8 == 0 && key.n%8 == 0 && key.k%8 == 0 {
			t.Errorf("cuBLASLt refused %+v: %s", key, pl.refused)
		} else {
			t.Logf("cuBLASLt refused %+v (odd sizes, run unfused): %s", key, pl.refused)
		}
	}
}

// TestCUDAGemmAlgorithmsTimed: a 16-bit product's first call times
// cuBLASLt's candidates and settles on one, later calls time nothing; a
// product that adds into its own C (β = 1) is not repeated to be timed
// and keeps the heuristic's favourite (Note [products' algorithms timed]).
// The operands are small integers, so every product is exact.
func TestCUDAGemmAlgorithmsTimed(t *testing.T) {
	b := testBackend(t)
	if b.lt == nil {
		t.Fatalf("cuBLASLt did not load: %s", b.ltReason)
	}
	var timed []ltKey
	b.ltTimed = func(key ltKey, ms []float32, chosen int) { timed = append(timed, key) }
	defer func() { b.ltTimed = nil }()
	rng := rand.New(rand.NewPCG(7, 23))
	for _, c := range []struct {
		name    string
		m, n, k int
		beta    float32
		timed   bool // the first call times the candidates
	}{
		{"β=0", 128, 256, 64, 0, true},
		{"β=1 into C", 128, 192, 64, 1, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ints := func(n int) []float64 {
				v := make([]float64, n)
				for i := range v {
					v[i] = float64(rng.IntN(5) - 2)
				}
				return v
			}
			av, bv, cv := ints(c.m*c.k), ints(c.k*c.n), ints(c.m*c.n)
			uploadAs := func(v []float64, dt kernels.DType) kernels.Buf {
				blk := alloc(t, b, int64(len(v)*dt.Size()))
				t.Cleanup(func() { b.Allocator().Free(blk) })
				buf := kernels.Buf{Block: blk, N: len(v), DType: dt}
				raw := make([]byte, len(v)*dt.Size())
				for i, x := range v {
					if dt == kernels.BF16 {
						binary.LittleEndian.PutUint16(raw[2*i:], uint16(math.Float32bits(float32(x))>>16)) // exact: small integers
					} else {
						binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(float32(x)))
					}
				}
				b.Write(buf, raw)
				return buf
			}
			a, bb, cc := uploadAs(av, kernels.BF16), uploadAs(bv, kernels.BF16), uploadAs(cv, kernels.F32)
			p := kernels.GemmParams{M: c.m, N: c.n, K: c.k, Alpha: 1, Beta: c.beta, Batch: 1}
			for call := 1; call <= 2; call++ {
				timed = nil
				if call == 2 {
					b.Write(cc, make([]byte, len(cv)*4))
					cv = make([]float64, len(cv))
				}
				b.Gemm(p, a, bb, cc)
				raw := make([]byte, len(cv)*4)
				b.Read(raw, cc)
				for i := range c.m {
					for j := range c.n {
						want := float64(c.beta) * cv[i*c.n+j]
						for l := range c.k {
							want += av[i*c.k+l] * bv[l*c.n+j]
						}
						if got := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*(i*c.n+j):])); float64(got) != want {
							t.Fatalf("call %d: C[%d,%d] = %v, want %v", call, i, j, got, want)
						}
					}
				}
				if got := len(timed) == 1; got != (c.timed && call == 1) {
					t.Errorf("call %d timed the candidates of %v", call, timed)
				}
			}
			for key, pl := range b.ltPlans {
				if key.m == c.m && key.n == c.n && key.k == c.k {
					if !pl.settled || pl.refused != "" || (!c.timed && pl.algo != 0) {
						t.Errorf("plan %+v: settled %v, algorithm %d of %d, refused %q", key, pl.settled, pl.algo, len(pl.algos), pl.refused)
					}
				}
			}
		})
	}
}

func TestCUDAMissingDriverIsReported(t *testing.T) {
	err := Available()
	if err == nil {
		t.Skip("a CUDA driver is present")
	}
	if !strings.Contains(err.Error(), "libcuda.so.1") || !strings.Contains(err.Error(), "/usr/local/cuda/lib64") {
		t.Errorf("error does not say which library was missing and where it was looked for: %v", err)
	}
}

func alloc(t *testing.T, b *Backend, bytes int64) *memory.Block {
	t.Helper()
	blk, err := b.Allocator().Alloc(bytes, b.Stream())
	if err != nil {
		t.Fatal(err)
	}
	return blk
}

// TestCUDAEmptyCacheGivesMemoryBack: freed blocks stay cached (the driver's
// free memory does not move) until EmptyCache, after which cuMemGetInfo sees
// the memory again.
func TestCUDAEmptyCacheGivesMemoryBack(t *testing.T) {
	b := testBackend(t)
	a := b.Allocator()
	const size = 1 << 30
	free0, _ := b.MemInfo()
	blk := alloc(t, b, size)
	free1, _ := b.MemInfo()
	if free0-free1 < size {
		t.Fatalf("allocating 1 GiB moved the driver's free memory by %d bytes only", free0-free1)
	}
	a.Free(blk)
	if free2, _ := b.MemInfo(); free2 > free1+(64<<20) {
		t.Errorf("freeing a block returned memory to the driver (%d bytes) before EmptyCache", free2-free1)
	}
	reserved := a.Stats().Reserved[memory.All].Current
	a.EmptyCache()
	free3, _ := b.MemInfo()
	if free3-free1 < size {
		t.Errorf("EmptyCache raised the driver's free memory by %d bytes, want >= %d", free3-free1, size)
	}
	if r := a.Stats().Reserved[memory.All].Current; r > reserved-size {
		t.Errorf("reserved %d after EmptyCache, was %d", r, reserved)
	}
	t.Logf("free: %d -> %d (1 GiB allocated) -> %d (after EmptyCache)", free0, free1, free3)
}

// TestCUDAFractionCapAndRetry drives the OOM path on the GPU: a cap just
// above what is reserved now, cached segments that must be flushed for a
// request to fit (one retry), then a request that cannot fit (the error).
func TestCUDAFractionCapAndRetry(t *testing.T) {
	b := testBackend(t)
	a := b.Allocator()
	a.EmptyCache()
	_, total := b.MemInfo()
	before := a.Stats()
	reserved := before.Reserved[memory.All].Current
	capBytes := reserved + 200<<20
	if err := a.SetMemoryFraction(float64(capBytes) / float64(total)); err != nil {
		t.Fatal(err)
	}
	defer a.SetMemoryFraction(0)
	limit := int64(float64(capBytes) / float64(total) * float64(total))
	// Cache 120 MiB of free segments, then ask for 150 MiB: it fits only
	// once the cached segments are released.
	x, y := alloc(t, b, 60<<20), alloc(t, b, 60<<20)
	a.Free(x)
	a.Free(y)
	big := alloc(t, b, 150<<20)
	s := a.Stats()
	if s.NumAllocRetries != before.NumAllocRetries+1 {
		t.Errorf("retries %d -> %d, want one flush-and-retry", before.NumAllocRetries, s.NumAllocRetries)
	}
	_, err := a.Alloc(100<<20, b.Stream())
	var oom *memory.OOMError
	if !errors.As(err, &oom) {
		t.Fatalf("allocation over the cap: err = %v, want *memory.OOMError", err)
	}
	msg := err.Error()
	for _, want := range []string{"cuda:0 out of memory", "Tried to allocate 100.00 MiB", "total capacity of",
		"allocated by leangrad", fmt.Sprintf("at most %s (its memory cap)", memory.Bytes(limit))} {
		if !strings.Contains(msg, want) {
			t.Errorf("OOM message lacks %q:\n%s", want, msg)
		}
	}
	if got := a.Stats().NumOOMs; got != before.NumOOMs+1 {
		t.Errorf("OOM count %d, want %d", got, before.NumOOMs+1)
	}
	a.Free(big)
	t.Log(msg)
}

// TestCUDAConcurrentGoroutines calls the backend from many goroutines at once
// (they move between OS threads; each call must find the context current).
func TestCUDAConcurrentGoroutines(t *testing.T) {
	b := testBackend(t)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			const n = 10000
			blk, err := b.Allocator().Alloc(n*4, b.Stream())
			if err != nil {
				errs <- err
				return
			}
			defer b.Allocator().Free(blk)
			buf := kernels.Buf{Block: blk, N: n, DType: kernels.F32}
			for i := 0; i < 50; i++ {
				b.Fill(buf, float32(g))
				b.Affine(buf, buf, 2, 1)
				out := make([]byte, n*4)
				b.Read(out, buf)
				if v := *(*float32)(unsafe.Pointer(&out[4*(n-1)])); v != float32(2*g+1) {
					errs <- fmt.Errorf("goroutine %d iteration %d read %v, want %v", g, i, v, 2*g+1)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestCUDACompileCache(t *testing.T) {
	b := testBackend(t)
	_, target, cached, err := compileCached(b.Arch(), "")
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := loadNVRTC(); target != Target(b.Arch(), n.major) {
		t.Errorf("compiled for %s on %s with NVRTC %d", target, b.Arch(), n.major)
	}
	if !cached {
		t.Errorf("the module compiled when the backend opened was not found in %s", cacheDir(""))
	}
}

func TestCUDATimeline(t *testing.T) {
	b := testBackend(t)
	a := b.Allocator()
	a.RecordTimeline(true)
	defer a.RecordTimeline(false)
	blk := alloc(t, b, 3<<20)
	a.Free(blk)
	ev := a.Timeline()
	if len(ev) < 2 || ev[len(ev)-1].Kind != memory.EventFree {
		t.Errorf("timeline = %+v", ev)
	}
}

func TestCUDAWriteReadLarge(t *testing.T) {
	b := testBackend(t)
	const n = 5<<20 + 3 // several staging chunks
	blk := alloc(t, b, n*4)
	defer b.Allocator().Free(blk)
	buf := kernels.Buf{Block: blk, N: n, DType: kernels.F32}
	in := make([]byte, n*4)
	for i := 0; i < n; i++ {
		*(*float32)(unsafe.Pointer(&in[4*i])) = float32(math.Sin(float64(i)))
	}
	b.Write(buf, in)
	out := make([]byte, n*4)
	b.Read(out, buf)
	for i := range in {
		if in[i] != out[i] {
			t.Fatalf("byte %d differs after a round trip", i)
		}
	}
}

// TestCUDAPinned: page-locked host memory from PinnedSource goes to the
// device and back in direct copies on the copy streams (the bytes
// unchanged, at offsets inside a segment, across several staging chunks'
// worth), each after the kernels queued before it and each seen by the
// kernels queued after JoinWrites or after the reader's Wait; Write and
// Read still stage other memory; StartWrite and StartRead refuse memory
// that is not page-locked; and Close refuses while page-locked memory is
// allocated.
func TestCUDAPinned(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	b, err := OpenSeparate(0, Options{})
	if err != nil {
		t.Fatal(err)
	}
	src := b.PinnedSource()
	const n = 5<<20 + 3 // more than a staging chunk
	outside := memory.OutsideHeap()
	seg, err := src.Alloc(3*n*4 + 64)
	if err != nil {
		t.Fatal(err)
	}
	if free, total := src.MemInfo(); total-free != seg.Size {
		t.Errorf("MemInfo: %d of %d free after a %d-byte segment", free, total, seg.Size)
	}
	if got := memory.OutsideHeap() - outside; got != seg.Size {
		t.Errorf("a %d-byte page-locked segment counts %d bytes outside the Go heap", seg.Size, got)
	}
	in, out, early := seg.Host[16:16+n*4], seg.Host[32+n*4:32+2*n*4], seg.Host[48+2*n*4:48+3*n*4]
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint32(in[4*i:], math.Float32bits(float32(math.Sin(float64(i)))))
	}
	for _, m := range [][]byte{out, early} {
		for i := range m {
			m[i] = 0xff
		}
	}
	blk, other := alloc(t, b, n*4), alloc(t, b, n*4)
	buf := kernels.Buf{Block: blk, N: n, DType: kernels.F32}
	buf2 := kernels.Buf{Block: other, N: n, DType: kernels.F32}
	b.Fill(buf2, 3)
	r := b.StartRead(early, buf2) // after the fill
	b.StartWrite(buf, in)
	b.JoinWrites()
	r.Wait()
	r.Wait()          // again: at once
	b.Copy(buf2, buf) // after the write
	for i := 0; i < n; i++ {
		if v := math.Float32frombits(binary.LittleEndian.Uint32(early[4*i:])); v != 3 {
			t.Fatalf("StartRead after a fill: element %d is %v, want 3", i, v)
		}
	}
	b.StartRead(out, buf2).Wait() // direct: the destination is page-locked
	if !bytes.Equal(in, out) {
		t.Fatal("page-locked bytes differ after a direct round trip")
	}
	heap := make([]byte, n*4)
	b.Read(heap, buf) // staged
	if !bytes.Equal(in, heap) {
		t.Fatal("a staged read of what a direct write sent differs")
	}
	for name, f := range map[string]func(){
		"StartWrite": func() { b.StartWrite(buf, heap) },
		"StartRead":  func() { b.StartRead(heap, buf) },
	} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "page-locked") {
					t.Errorf("%s of Go heap memory: %v, want a panic naming page-locked memory", name, r)
				}
			}()
			f()
		}()
	}
	b.Allocator().Free(blk)
	b.Allocator().Free(other)
	if err := b.Close(); err == nil || !strings.Contains(err.Error(), "page-locked") {
		t.Fatalf("Close with page-locked memory allocated: %v", err)
	}
	if err := src.Free(seg); err != nil {
		t.Fatal(err)
	}
	if got := memory.OutsideHeap(); got != outside {
		t.Errorf("after the segment was freed, %d bytes outside the Go heap, want %d", got, outside)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCUDAPinnedCaptured: direct copies both ways, captured into a graph
// with the kernels around them, ordered with them by Join and JoinWrites:
// at each replay the graph reads into the same page-locked memory what the
// kernel before the read left (not what the kernel after it writes), and
// the kernel after JoinWrites sees what that memory held when the replay
// began; a read waited for on the host while capturing panics, naming
// Join.
func TestCUDAPinnedCaptured(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	b, err := OpenSeparate(0, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	}()
	const n = 3<<20 + 7
	seg, err := b.PinnedSource().Alloc(2*n*4 + 64)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := b.PinnedSource().Free(seg); err != nil {
			t.Error(err)
		}
	}()
	down, up := seg.Host[16:16+n*4], seg.Host[32+n*4:32+2*n*4]
	var bufs [4]kernels.Buf
	for i := range bufs {
		blk := alloc(t, b, n*4)
		defer b.Allocator().Free(blk)
		bufs[i] = kernels.Buf{Block: blk, N: n, DType: kernels.F32}
	}
	x, y, z, w := bufs[0], bufs[1], bufs[2], bufs[3]
	fill := func(m []byte, f func(i int) float32) {
		for i := 0; i < n; i++ {
			binary.LittleEndian.PutUint32(m[4*i:], math.Float32bits(f(i)))
		}
	}
	if err := b.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	b.Copy(y, x)
	r := b.StartRead(down, y)
	func() {
		defer func() {
			if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "Join") {
				t.Errorf("a read waited for on the host while capturing: %v, want a panic naming Join", p)
			}
		}()
		r.Wait()
	}()
	r = b.StartRead(down, y)
	r.Join()
	b.Fill(y, -1) // after the read
	b.StartWrite(z, up)
	b.JoinWrites()
	b.Copy(w, z) // after the write
	g, err := b.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Release()
	host := make([]byte, n*4)
	for replay := range 3 {
		fill(host, func(i int) float32 { return float32(math.Sin(float64(i + 7*replay))) })
		b.Write(x, host)
		fill(up, func(i int) float32 { return float32(i%1000 + replay) })
		for i := range down {
			down[i] = 0xff
		}
		if err := g.Launch(); err != nil {
			t.Fatal(err)
		}
		if err := b.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(down, host) {
			t.Fatalf("replay %d: the captured read holds other bytes than the kernel before it left", replay)
		}
		got := make([]byte, n*4)
		b.Read(got, w)
		if !bytes.Equal(got, up) {
			t.Fatalf("replay %d: the kernel after JoinWrites sees other bytes than the captured write's", replay)
		}
	}
}

// TestCUDAOpenClose100: opening a backend, using its kernels, cuBLAS, cuDNN
// and staging buffers, and closing it, 100 times, leaves the driver's free
// memory where the first cycle left it: Close gives everything back. A
// backend with live buffers refuses to close.
func TestCUDAOpenClose100(t *testing.T) {
	probe := testBackend(t)
	p := kernels.ConvParams{N: 2, C: 3, H: 8, W: 8, K: 4, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1}
	cycle := func() {
		b, err := OpenSeparate(0, Options{})
		if err != nil {
			t.Fatal(err)
		}
		a := b.Allocator()
		buf := func(n int) kernels.Buf {
			blk, err := a.Alloc(int64(4*n), b.Stream())
			if err != nil {
				t.Fatal(err)
			}
			return kernels.Buf{Block: blk, N: n, DType: kernels.F32}
		}
		x, w, y := buf(p.N*p.C*p.H*p.W), buf(p.K*p.C*p.R*p.S), buf(p.N*p.K*p.OutH()*p.OutW())
		b.Write(x, make([]byte, x.Bytes()))
		b.Fill(w, 0.5)
		b.Conv2d(p, x, w, y)
		b.Gemm(kernels.GemmParams{M: 4, N: 4, K: 4, Alpha: 1, Batch: 1, StrideA: 16, StrideB: 16, StrideC: 16}, w, w, y)
		out := make([]byte, y.Bytes())
		b.Read(out, y)
		if err := b.Close(); err == nil || !strings.Contains(err.Error(), "allocated") {
			t.Fatalf("Close with live buffers: %v", err)
		}
		for _, bf := range []kernels.Buf{x, w, y} {
			a.Free(bf.Block)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
	}
	cycle() // the first cycle's one-time costs (libraries' own caches) stay
	free0, _ := probe.MemInfo()
	for i := 0; i < 99; i++ {
		cycle()
	}
	free1, _ := probe.MemInfo()
	t.Logf("driver free memory after the first cycle %d MiB, after 100: %d MiB", free0>>20, free1>>20)
	if free0-free1 > 4<<20 {
		t.Errorf("100 open/close cycles lost %d MiB of device memory", (free0-free1)>>20)
	}
}

// TestCUDAProgrammaticLaunches runs chains of kernels each of which reads
// what the one before wrote and writes what it read (Note [programmatic
// dependent launch]), eagerly and from a captured graph: a kernel that
// touched memory before its wait would read a stale element or overwrite
// one still to be read, and the sums would come out wrong. On compute
// capability 9.0 the launches must be programmatic.
func TestCUDAProgrammaticLaunches(t *testing.T) {
	b := testBackend(t)
	var cc int
	fmt.Sscanf(b.Arch(), "sm_%d", &cc)
	if cc >= 90 && !b.programmatic {
		t.Errorf("%s launches kernels as ordinary ones: cuLaunchKernelEx bound: %v", b.Arch(), b.d.launchKernelEx != nil)
	}
	t.Logf("%s: programmatic launches %v", b.Arch(), b.programmatic)
	const n = 8 << 20 // grid-stride kernels of several waves
	x, y := alloc(t, b, 4*n), alloc(t, b, 4*n)
	defer b.Allocator().Free(x)
	defer b.Allocator().Free(y)
	bx, by := kernels.Buf{Block: x, N: n, DType: kernels.F32}, kernels.Buf{Block: y, N: n, DType: kernels.F32}
	chain := func(pairs int) {
		for range pairs {
			b.Affine(by, bx, 1, 1)
			b.Affine(bx, by, 2, -1) // 2(x+1) − 1 = 2x + 1
		}
	}
	check := func(what string, want float32) {
		t.Helper()
		out := make([]byte, 4*n)
		b.Read(out, bx)
		v := unsafe.Slice((*float32)(unsafe.Pointer(&out[0])), n)
		for i := 0; i < n; i += 4099 {
			if v[i] != want {
				t.Fatalf("%s: x[%d] = %v, want %v", what, i, v[i], want)
			}
		}
		if v[n-1] != want {
			t.Fatalf("%s: x[%d] = %v, want %v", what, n-1, v[n-1], want)
		}
	}
	b.Fill(bx, 0)
	chain(20) // x = 2^20 − 1, exact in F32
	check("eager", 1<<20-1)
	b.Fill(bx, 0)
	if err := b.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	chain(10)
	g, err := b.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Release()
	for range 2 {
		if err := g.Launch(); err != nil {
			t.Fatal(err)
		}
	}
	check("captured, twice", 1<<20-1)
}
