package cpu

import (
	"math/rand/v2"
	"testing"

	"github.com/leangrad/leangrad/kernels"
)

// BenchmarkAdamW: the host's AdamW update (what an offloaded optimizer
// runs) over 16M parameters, in ns a parameter across every core
// GOMAXPROCS allows, and the memory it streams (28 bytes a parameter).
func BenchmarkAdamW(b *testing.B) {
	const n = 1 << 24
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(scale float64) kernels.Buf {
		t := buf(b, kernels.F32, n)
		f := f32s(t)
		for i := range f {
			f[i] = float32(rng.NormFloat64() * scale)
		}
		return t
	}
	p, g, m, v := random(1), random(0.01), random(0.001), random(0)
	for i, x := range f32s(v) {
		f32s(v)[i] = x * x
	}
	lr, step := buf(b, kernels.F32, 1), buf(b, kernels.I32, kernels.CounterLen)
	f32s(lr)[0] = 1e-4
	*counter(step) = 10
	hp := kernels.AdamWParams{LR: lr, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: step}
	b.SetBytes(28 * n)
	b.ResetTimer()
	for range b.N {
		be.AdamW(hp, []kernels.Buf{p}, []kernels.Buf{g}, []kernels.Buf{m}, []kernels.Buf{v})
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/param")
}

// BenchmarkAdamW8: AdamW over 8-bit moments (AdamW8) on the host, over 16M
// parameters, in ns a parameter across every core GOMAXPROCS allows.
func BenchmarkAdamW8(b *testing.B) {
	const n = 1 << 24
	rng := rand.New(rand.NewPCG(1, 2))
	p, g := buf(b, kernels.F32, n), buf(b, kernels.F32, n)
	for i := range n {
		f32s(p)[i], f32s(g)[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64()*0.01)
	}
	codes, absmax := buf(b, kernels.U8, 2*n), buf(b, kernels.F32, 2*kernels.Quant8Blocks(n))
	for i := range raw(codes) {
		raw(codes)[i] = uint8(rng.IntN(256))
	}
	for i := range f32s(absmax) {
		f32s(absmax)[i] = 1e-3
	}
	qmap := buf(b, kernels.F32, len(kernels.Quant8Maps))
	copy(f32s(qmap), kernels.Quant8Maps)
	lr, step := buf(b, kernels.F32, 1), buf(b, kernels.I32, kernels.CounterLen)
	f32s(lr)[0] = 1e-4
	*counter(step) = 10
	hp := kernels.AdamWParams{LR: lr, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: step}
	b.SetBytes(14 * n)
	b.ResetTimer()
	for range b.N {
		be.AdamW8(hp, qmap, []kernels.Buf{p}, []kernels.Buf{g}, []kernels.Buf{codes}, []kernels.Buf{absmax})
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/param")
}
