package cuda

import (
	"fmt"
	"testing"

	"github.com/leangrad/leangrad/kernels"
)

// BenchmarkCUDAGemmShapes times the products of a GPT-2 small step (batch
// 16, context 1024) with BF16 operands, their output in F32 and in BF16:
// the classifier's chunk (832 rows over 50,257 tokens), a linear layer's,
// and attention's batched scores; b.ReportMetric gives TFLOP/s.
func BenchmarkCUDAGemmShapes(b *testing.B) {
	be := testBackend(b)
	for _, s := range []struct {
		name           string
		batch, m, n, k int
		transB         bool
	}{
		{"classifier-logits", 1, 832, 50257, 768, true},
		{"classifier-logits-ld50272", 1, 832, 50272, 768, true},
		{"linear-fc", 1, 16384, 3072, 768, true},
		{"attention-scores", 192, 192, 960, 64, true},
	} {
		for _, out := range []kernels.DType{kernels.F32, kernels.BF16} {
			b.Run(fmt.Sprintf("%s-%v", s.name, out), func(b *testing.B) {
				buf := func(dt kernels.DType, n int) kernels.Buf { return benchBuf(b, be, dt, n) }
				a, w, c := buf(kernels.BF16, s.batch*s.m*s.k), buf(kernels.BF16, s.batch*s.n*s.k), buf(out, s.batch*s.m*s.n)
				call := gemmCall{transB: s.transB, m: s.m, n: s.n, k: s.k, alpha: 1, a: ptrOf(a), b: ptrOf(w), c: ptrOf(c),
					strideA: int64(s.m * s.k), strideB: int64(s.n * s.k), strideC: int64(s.m * s.n), batch: s.batch, ab: kernels.BF16, cType: out}
				run := func() {
					be.enter()
					be.gemm(call)
					be.exit()
				}
				run()
				be.Synchronize()
				b.ResetTimer()
				for range b.N { // not b.Loop: its timer stops before the device is waited for
					run()
				}
				be.Synchronize()
				b.ReportMetric(2*float64(s.batch*s.m*s.n*s.k)*float64(b.N)/b.Elapsed().Seconds()/1e12, "TFLOP/s")
			})
		}
	}
}

// benchBuf is a buffer of n elements of dt from be's pool for the
// benchmark b, freed when it ends.
func benchBuf(b *testing.B, be *Backend, dt kernels.DType, n int) kernels.Buf {
	blk, err := be.Allocator().Alloc(int64(n*dt.Size()), be.Stream())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Allocator().Free(blk) })
	return kernels.Buf{Block: blk, N: n, DType: dt}
}

// gptProduct is one of GPT-2 small's products for the benchmarks: its
// parameters, C's dtype and its epilogue (nil: none), made with the
// benchmark's buffers.
type gptProduct struct {
	name string
	p    kernels.GemmParams
	c    kernels.DType
	e    func() kernels.Epilogue
}

// BenchmarkCUDAGemmEpilogues times GPT-2 small's products with epilogues
// (batch 16, context 1024), with BF16 operands (C in F32 where autocast's
// step has it so) and with F32 ones, three ways: unfused (cublasGemmEx,
// then gemm_epilogue and the column sums), with cuBLASLt's epilogues, and
// with its bias-gradient epilogues too (ltSums): the numbers Note [the
// fused epilogues] decides by. b.ReportMetric gives µs per product.
func BenchmarkCUDAGemmEpilogues(b *testing.B) {
	be := testBackend(b)
	buf := func(dt kernels.DType, n int) kernels.Buf { return benchBuf(b, be, dt, n) }
	const rows, width = 16384, 768
	ab := kernels.BF16 // the operands' dtype, GELU's auxiliary matrix's too
	products := []gptProduct{
		{"c_attn-bias", kernels.GemmParams{TransB: true, M: rows, N: 3 * width, K: width, Alpha: 1, Batch: 1}, kernels.BF16,
			func() kernels.Epilogue { return kernels.Epilogue{Bias: buf(kernels.F32, 3*width)} }},
		{"c_fc-bias+gelu", kernels.GemmParams{TransB: true, M: rows, N: 4 * width, K: width, Alpha: 1, Batch: 1}, kernels.BF16,
			func() kernels.Epilogue {
				return kernels.Epilogue{Bias: buf(kernels.F32, 4*width), Act: kernels.GELU, Aux: buf(ab, rows*4*width)}
			}},
		{"c_proj-dx-gelu′+bias-grad", kernels.GemmParams{M: rows, N: 4 * width, K: width, Alpha: 1, Batch: 1}, kernels.BF16,
			func() kernels.Epilogue {
				return kernels.Epilogue{Act: kernels.GELU, Grad: true, Aux: buf(ab, rows*4*width), BiasGrad: buf(kernels.F32, 4*width)}
			}},
		{"c_fc-dw+bias-grad", kernels.GemmParams{TransA: true, M: 4 * width, N: width, K: rows, Alpha: 1, Batch: 1}, kernels.F32,
			func() kernels.Epilogue { return kernels.Epilogue{BiasGradA: buf(kernels.F32, 4*width)} }},
		{"c_attn-dw+bias-grad", kernels.GemmParams{TransA: true, M: 3 * width, N: width, K: rows, Alpha: 1, Batch: 1}, kernels.F32,
			func() kernels.Epilogue { return kernels.Epilogue{BiasGradA: buf(kernels.F32, 3*width)} }},
		{"attn.c_proj-dw+bias-grad", kernels.GemmParams{TransA: true, M: width, N: width, K: rows, Alpha: 1, Batch: 1}, kernels.F32,
			func() kernels.Epilogue { return kernels.Epilogue{BiasGradA: buf(kernels.F32, width)} }},
		{"mlp.c_proj-dw+bias-grad", kernels.GemmParams{TransA: true, M: width, N: 4 * width, K: rows, Alpha: 1, Batch: 1}, kernels.F32,
			func() kernels.Epilogue { return kernels.Epilogue{BiasGradA: buf(kernels.F32, width)} }},
		{"attn.c_proj-residual", kernels.GemmParams{TransB: true, M: rows, N: width, K: width, Alpha: 1, Batch: 1}, kernels.F32,
			func() kernels.Epilogue {
				return kernels.Epilogue{Bias: buf(kernels.F32, width), Residual: buf(kernels.F32, rows*width)}
			}},
	}
	for _, ab = range []kernels.DType{kernels.BF16, kernels.F32} {
		for _, s := range products {
			p, ct := s.p, s.c
			if ab == kernels.F32 {
				ct = kernels.F32
			}
			a, w, c := buf(ab, p.M*p.K), buf(ab, p.K*p.N), buf(ct, p.M*p.N)
			for _, x := range []kernels.Buf{a, w} {
				be.Fill(x, 0.01)
			}
			e := s.e()
			for _, mode := range []struct {
				name       string
				noLt, sums bool
			}{{"unfused", true, false}, {"cublasLt", false, false}, {"cublasLt+sums", false, true}} {
				b.Run(fmt.Sprintf("%v/%s/%s", ab, s.name, mode.name), func(b *testing.B) {
					be.noLt, be.ltSums = mode.noLt, mode.sums
					defer func() { be.noLt, be.ltSums = false, false }()
					be.GemmEpilogue(p, e, a, w, c)
					be.Synchronize()
					b.ResetTimer()
					for range b.N { // not b.Loop: its timer stops before the device is waited for
						be.GemmEpilogue(p, e, a, w, c)
					}
					be.Synchronize()
					b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)*1e6, "µs/product")
				})
			}
		}
	}
}

// BenchmarkCUDAGemmCandidates times GPT-2 small's products (batch 16,
// context 1024, BF16) with cuBLASLt's algorithm chosen by timing, the
// plain ones beside cublasGemmEx, and logs each candidate's µs: the
// numbers behind Note [products' algorithms timed].
func BenchmarkCUDAGemmCandidates(b *testing.B) {
	be := testBackend(b)
	buf := func(dt kernels.DType, n int) kernels.Buf {
		x := benchBuf(b, be, dt, n)
		be.Fill(x, 0.01)
		return x
	}
	be.ltTimed = func(key ltKey, ms []float32, chosen int) {
		us := make([]string, len(ms))
		for i, t := range ms {
			us[i] = fmt.Sprintf("%.1f", t*1000)
		}
		b.Logf("%d×%d×%d transA %v transB %v %v→%v epilogue %d: candidates %v µs, chose %d", key.m, key.n, key.k,
			key.transA, key.transB, key.ab, key.c, key.epilogue, us, chosen)
	}
	defer func() { be.ltTimed = nil }()
	const rows, width = 16384, 768
	for _, s := range []gptProduct{
		{"c_attn", kernels.GemmParams{TransB: true, M: rows, N: 3 * width, K: width}, kernels.BF16,
			func() kernels.Epilogue { return kernels.Epilogue{Bias: buf(kernels.F32, 3*width)} }},
		{"c_fc", kernels.GemmParams{TransB: true, M: rows, N: 4 * width, K: width}, kernels.BF16,
			func() kernels.Epilogue {
				return kernels.Epilogue{Bias: buf(kernels.F32, 4*width), Act: kernels.GELU, Aux: buf(kernels.BF16, rows*4*width)}
			}},
		{"mlp.c_proj", kernels.GemmParams{TransB: true, M: rows, N: width, K: 4 * width}, kernels.F32,
			func() kernels.Epilogue {
				return kernels.Epilogue{Bias: buf(kernels.F32, width), Residual: buf(kernels.F32, rows*width)}
			}},
		{"attn.c_proj", kernels.GemmParams{TransB: true, M: rows, N: width, K: width}, kernels.F32,
			func() kernels.Epilogue {
				return kernels.Epilogue{Bias: buf(kernels.F32, width), Residual: buf(kernels.F32, rows*width)}
			}},
		{"mlp.c_proj-dx", kernels.GemmParams{M: rows, N: 4 * width, K: width}, kernels.BF16,
			func() kernels.Epilogue {
				return kernels.Epilogue{Act: kernels.GELU, Grad: true, Aux: buf(kernels.BF16, rows*4*width)}
			}},
		{"c_fc-dx", kernels.GemmParams{M: rows, N: width, K: 4 * width}, kernels.BF16, nil},
		{"c_attn-dx", kernels.GemmParams{M: rows, N: width, K: 3 * width}, kernels.BF16, nil},
		{"attn.c_proj-dx", kernels.GemmParams{M: rows, N: width, K: width}, kernels.BF16, nil},
		{"c_fc-dw", kernels.GemmParams{TransA: true, M: 4 * width, N: width, K: rows}, kernels.F32, nil},
		{"c_attn-dw", kernels.GemmParams{TransA: true, M: 3 * width, N: width, K: rows}, kernels.F32, nil},
		{"mlp.c_proj-dw", kernels.GemmParams{TransA: true, M: width, N: 4 * width, K: rows}, kernels.F32, nil},
		{"attn.c_proj-dw", kernels.GemmParams{TransA: true, M: width, N: width, K: rows}, kernels.F32, nil},
		{"classifier", kernels.GemmParams{TransB: true, M: 5312, N: 50304, K: width}, kernels.BF16, nil},
		{"classifier-dx", kernels.GemmParams{M: 5312, N: width, K: 50304}, kernels.F32, nil},
		{"classifier-dw", kernels.GemmParams{TransA: true, M: 50304, N: width, K: 5312}, kernels.F32, nil},
	} {
		p := s.p
		p.Alpha, p.Batch = 1, 1
		a, w, c := buf(kernels.BF16, p.M*p.K), buf(kernels.BF16, p.K*p.N), buf(s.c, p.M*p.N)
		var e kernels.Epilogue
		if s.e != nil {
			e = s.e()
		}
		run := func() {
			if s.e != nil {
				be.GemmEpilogue(p, e, a, w, c)
			} else {
				be.Gemm(p, a, w, c)
			}
		}
		for _, mode := range []string{"timed", "cublasGemmEx"} {
			if mode == "cublasGemmEx" && s.e != nil {
				continue
			}
			b.Run(s.name+"/"+mode, func(b *testing.B) {
				be.noLt = mode == "cublasGemmEx"
				defer func() { be.noLt = false }()
				run() // the first call times the candidates
				be.Synchronize()
				b.ResetTimer()
				for range b.N { // not b.Loop: its timer stops before the device is waited for
					run()
				}
				be.Synchronize()
				b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)*1e6, "µs/product")
			})
		}
	}
}

// BenchmarkCUDAGemmF32 times GPT-2 small's F32 products (batch 16,
// context 1024: the linear layers' forward, input and weight gradients,
// and a chunk of the classifier's logits) under each F32 mode:
// b.ReportMetric gives TFLOP/s, counting the F32 product's flops once.
func BenchmarkCUDAGemmF32(b *testing.B) {
	testBackend(b)
	const rows, width = 16384, 768
	products := []struct {
		name string
		p    kernels.GemmParams
	}{
		{"c_attn", kernels.GemmParams{TransB: true, M: rows, N: 3 * width, K: width}},
		{"c_fc", kernels.GemmParams{TransB: true, M: rows, N: 4 * width, K: width}},
		{"mlp.c_proj", kernels.GemmParams{TransB: true, M: rows, N: width, K: 4 * width}},
		{"c_fc-dx", kernels.GemmParams{M: rows, N: width, K: 4 * width}},
		{"c_fc-dw", kernels.GemmParams{TransA: true, M: 4 * width, N: width, K: rows}},
		{"c_attn-dw", kernels.GemmParams{TransA: true, M: 3 * width, N: width, K: rows}},
		{"attn.c_proj-dw", kernels.GemmParams{TransA: true, M: width, N: width, K: rows}},
		{"logits", kernels.GemmParams{TransB: true, M: 2048, N: 50304, K: width}},
	}
	for _, mode := range []kernels.F32Matmul{kernels.F32Strict, kernels.F32TF32x3} {
		be, err := open(0, Options{MatmulF32: mode})
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range products {
			p := s.p
			p.Alpha, p.Batch = 1, 1
			a, w, c := benchBuf(b, be, kernels.F32, p.M*p.K), benchBuf(b, be, kernels.F32, p.K*p.N), benchBuf(b, be, kernels.F32, p.M*p.N)
			be.Fill(a, 0.01)
			be.Fill(w, 0.02)
			b.Run(fmt.Sprintf("%v/%s", mode, s.name), func(b *testing.B) {
				be.Gemm(p, a, w, c)
				be.Synchronize()
				b.ResetTimer()
				for range b.N { // not b.Loop: its timer stops before the device is waited for
					be.Gemm(p, a, w, c)
				}
				be.Synchronize()
				b.ReportMetric(2*float64(p.M)*float64(p.N)*float64(p.K)*float64(b.N)/b.Elapsed().Seconds()/1e12, "TFLOP/s")
			})
		}
	}
}
