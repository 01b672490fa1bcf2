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
// microkernel the backend uses, beside the FMA peak of one core measured
// with the same instructions. Each size reports the best of steps products
// after a warm-up one: a throughput ceiling, unlike the training steps'
// medians.
func SGEMM(sizes []int, steps int) []string {
	best := sgemm.Default()
	lines := []string{fmt.Sprintf("SGEMM kernel %s (of %v); one core's FMA peak, measured by a loop of independent FMAs: %.1f GFLOP/s",
		best.Kernel(), sgemm.Kernels(), best.PeakGFLOPS(300*time.Millisecond))}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, threads := range []int{1, runtime.GOMAXPROCS(0)} {
		mu := best.WithThreads(threads)
		for _, n := range sizes {
			a, b, c := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
			for i := range a {
				a[i], b[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
			}
			fastest := time.Duration(1 << 62)
			for i := 0; i <= steps; i++ {
				t0 := time.Now()
				mu.Gemm(false, false, n, n, n, 1, a, n, b, n, 0, c, n)
				if d := time.Since(t0); i > 0 && d < fastest {
					fastest = d
				}
			}
			lines = append(lines, fmt.Sprintf("SGEMM %d×%d×%d on %d thread(s): %.1f GFLOP/s",
				n, n, n, threads, 2*float64(n)*float64(n)*float64(n)/fastest.Seconds()/1e9))
		}
	}
	return lines
}
