package benchmarks

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"time"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu/sgemm"
	"github.com/leangrad/leangrad/tensor"
	"github.com/leangrad/leangrad/train"
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
			line := fmt.Sprintf("SGEMM %d×%d×%d on 1 thread(s)%s: %.1f GFLOP/s, %.0f%% of that peak", n, n, n, where, g, 100*g/peak)
			if g > 1.05*peak { // one thread cannot pass its core's peak: the peak was measured under load
				line += " (impossible: the peak's measurement was slowed by other work on the machine; neither number is reliable)"
			}
			lines = append(lines, line)
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

// GemmPeak is the device's measured matrix-product rate in TFLOP/s for dt
// operands (for F32, the backend's F32 product: three TF32 products by
// default, strict or one TF32 product as its options say), sustained as
// a training step sustains it: after a quarter of a second of products,
// the median of steps bursts of back-to-back n×n×n products, each burst
// about 30 ms (at least one product) timed to the device's completion;
// single products would catch the clocks before the power limit lowers
// them. The MFU the harness reports is a step's model FLOPs per second
// over this, the rate this backend's products reach, not the datasheet's.
func GemmPeak(dev *tensor.Device, dt tensor.DType, n, steps int) (float64, error) {
	var rate float64
	err := tensor.Catch(func() {
		dev.WithScope(func() {
			a := tensor.Randn(dev, dt, 0, 1, n, n)
			b := tensor.Randn(dev, dt, 0, 1, n, n)
			c := tensor.Empty(dev, dt, n, n)
			p := kernels.GemmParams{M: n, N: n, K: n, Alpha: 1, Batch: 1}
			be := dev.Backend()
			burst := func(k int) float64 {
				t0 := time.Now()
				for range k {
					be.Gemm(p, a.Buf(), b.Buf(), c.Buf())
				}
				dev.Synchronize()
				return time.Since(t0).Seconds()
			}
			one := burst(1)
			per := max(1, int(30e-3/one))
			for warm := 0.0; warm < 0.25; {
				warm += burst(per)
			}
			rates := make([]float64, steps)
			for i := range rates {
				rates[i] = float64(per) * 2 * float64(n) * float64(n) * float64(n) / burst(per) / 1e12
			}
			rate = median(rates)
		})
	})
	return rate, err
}

// MFU notes each language-model result's model FLOPs rate and its share of
// peak, the measured rate of its products' dtype (peaks by ConfigDType;
// amp is the amp configurations').
func MFU(results []Result, amp train.AMP, peaks map[tensor.DType]float64, peakName map[tensor.DType]string) []string {
	var notes []string
	for _, r := range results {
		if r.FLOPsPerStep == 0 || r.MedianMS == 0 || !strings.HasPrefix(r.Engine, "leangrad") {
			continue
		}
		cfg := ConfigDType(r.Config, amp)
		rate := r.FLOPsPerStep / (r.MedianMS / 1e3) / 1e12
		note := fmt.Sprintf("%s %s batch %d %s: %.2f TFLOP a step (6N + 12·L·C·T a token), %.1f TFLOP/s", r.Engine, r.Model, r.Batch, r.Config, r.FLOPsPerStep/1e12, rate)
		if p := peaks[cfg]; p > 0 {
			note += fmt.Sprintf(", MFU %.1f%% of the measured %s peak (%.0f TFLOP/s)", 100*rate/p, peakName[cfg], p)
		}
		notes = append(notes, note+".")
	}
	return notes
}
