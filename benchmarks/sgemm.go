package benchmarks

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/leangrad/leangrad/kernels/cpu/sgemm"
)

// SGEMM times the CPU backend's square matrix products (n×n by n×n, row
// major, C overwritten) on one goroutine and on GOMAXPROCS, with the
// microkernel the backend uses. The one-goroutine products run on each of
// the first four CPUs the process may use, pinned there (on Linux), beside
// that CPU's FMA peak measured there with the same instructions, so that
// each percentage of the peak compares one core with itself: on a shared
// machine two cores can run at different speeds. Each size reports the best
// of steps products after a warm-up one: a throughput ceiling, unlike the
// training steps' medians.
func SGEMM(sizes []int, steps int) []string {
	best := sgemm.Default()
	lines := []string{fmt.Sprintf("SGEMM kernel %s (of %v)", best.Kernel(), sgemm.Kernels())}
	rng := rand.New(rand.NewPCG(1, 2))
	operands := make(map[int][3][]float32)
	for _, n := range sizes {
		a, b := make([]float32, n*n), make([]float32, n*n)
		for i := range a {
			a[i], b[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
		}
		operands[n] = [3][]float32{a, b, make([]float32, n*n)}
	}
	gflops := func(mu *sgemm.Multiplier, n int) float64 {
		x := operands[n]
		fastest := time.Duration(1 << 62)
		for i := 0; i <= steps; i++ {
			t0 := time.Now()
			mu.Gemm(false, false, n, n, n, 1, x[0], n, x[1], n, 0, x[2], n)
			if d := time.Since(t0); i > 0 && d < fastest {
				fastest = d
			}
		}
		return 2 * float64(n) * float64(n) * float64(n) / fastest.Seconds() / 1e9
	}
	oneCore := func(where string) {
		peak := best.PeakGFLOPS(300 * time.Millisecond)
		lines = append(lines, fmt.Sprintf("one core's FMA peak%s, measured by a loop of independent FMAs: %.1f GFLOP/s", where, peak))
		for _, n := range sizes {
			g := gflops(best.WithThreads(1), n)
			lines = append(lines, fmt.Sprintf("SGEMM %d×%d×%d on 1 thread(s)%s: %.1f GFLOP/s, %.0f%% of that peak", n, n, n, where, g, 100*g/peak))
		}
	}
	if !onCPUs(4, func(cpu int) { oneCore(fmt.Sprintf(" on CPU %d", cpu)) }) {
		oneCore("")
	}
	threads := runtime.GOMAXPROCS(0)
	for _, n := range sizes {
		lines = append(lines, fmt.Sprintf("SGEMM %d×%d×%d on %d thread(s): %.1f GFLOP/s", n, n, n, threads, gflops(best.WithThreads(threads), n)))
	}
	return lines
}
