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
				buf := func(dt kernels.DType, n int) kernels.Buf {
					blk, err := be.Allocator().Alloc(int64(n*dt.Size()), be.Stream())
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { be.Allocator().Free(blk) })
					return kernels.Buf{Block: blk, N: n, DType: dt}
				}
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
