package sgemm

import "testing"

func BenchmarkKernelOnly(b *testing.B) {
	for _, k := range kernels {
		b.Run(k.name, func(b *testing.B) {
			const kc = 128
			a := make([]float32, kc*k.mr)
			bb := make([]float32, kc*k.nr)
			c := make([]float32, k.mr*k.nr)
			for b.Loop() {
				for i := 0; i < 1000; i++ {
					k.run(kc, &a[0], &bb[0], &c[0], k.nr, true)
				}
			}
			b.ReportMetric(2*float64(kc*k.mr*k.nr)*1000*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
