package cpu

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/leangrad/leangrad/kernels"
)

// BenchmarkAdamW: the host's AdamW update (what an offloaded optimizer
// runs) over 16M parameters, in ns a parameter across every core
// GOMAXPROCS allows, and the memory it streams (28 bytes a parameter).
func BenchmarkAdamW(b *testing.B) {
	const n = 1 << 24
	update := adamwOver(b, n)
	b.SetBytes(28 * n)
	b.ResetTimer()
	for range b.N {
		update()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/param")
}

// BenchmarkSumPart: a micro-batch's BF16 gradient widened into its F32
// sum (what an offloaded optimizer does for each micro-batch but the
// first) over 16M values, in ns a value across every core GOMAXPROCS
// allows, and the memory it streams (10 bytes a value).
func BenchmarkSumPart(b *testing.B) {
	const n = 1 << 24
	sum, part := buf(b, kernels.F32, n), buf(b, kernels.BF16, n)
	be.Fill(sum, 0.5)
	be.Fill(part, 0.25)
	b.SetBytes(10 * n)
	b.ResetTimer()
	for range b.N {
		be.SumPart(sum, sum, part)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/value")
}

// adamwOver returns one AdamW update of n random parameters on the host.
func adamwOver(b *testing.B, n int) func() {
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
	return func() { be.AdamW(hp, []kernels.Buf{p}, []kernels.Buf{g}, []kernels.Buf{m}, []kernels.Buf{v}) }
}

// BenchmarkWakeBesideAdamW: how late a goroutine that sleeps 100 µs at a
// time wakes while AdamW updates 16M parameters over and over beside it
// (as the goroutine queueing a GPU's kernels does while the host updates
// the parameters in the backward), on every core GOMAXPROCS allows, on
// all but one (LeaveCores), and beside nothing (threads=0: the timer's
// own lateness): the mean, median and 99th percentile of the lateness,
// which the update's yields (yielding) bound.
func BenchmarkWakeBesideAdamW(b *testing.B) {
	update := adamwOver(b, 1<<24)
	all := runtime.GOMAXPROCS(0)
	cases := []int{0, all}
	if all > 1 {
		cases = append(cases, all-1)
	}
	for _, threads := range cases {
		b.Run(fmt.Sprintf("threads=%d-of-%d", threads, all), func(b *testing.B) {
			defer LeaveCores(all - threads)()
			stop, done := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(done)
				for threads > 0 {
					select {
					case <-stop:
						return
					default:
						update()
					}
				}
			}()
			late := make([]time.Duration, 0, b.N)
			for range b.N {
				start := time.Now()
				time.Sleep(100 * time.Microsecond)
				late = append(late, time.Since(start)-100*time.Microsecond)
			}
			close(stop)
			<-done
			slices.Sort(late)
			var sum time.Duration
			for _, d := range late {
				sum += d
			}
			b.ReportMetric(float64(sum.Microseconds())/float64(len(late)), "µs-late/mean")
			b.ReportMetric(float64(late[len(late)/2].Microseconds()), "µs-late/p50")
			b.ReportMetric(float64(late[len(late)*99/100].Microseconds()), "µs-late/p99")
		})
	}
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
