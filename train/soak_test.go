package train

import (
	"github.com/leangrad/leangrad/tensor"
	"testing"

	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
)

// BenchmarkSoak10k trains the main configuration (AMP and checkpointed
// blocks) of a small ResNet for 10,000 steps on the CPU and fails unless
// the allocated bytes after every step from the second on are the same, to
// the byte; the pool's peaks must not move either. It is a benchmark, not a
// test, so that CI's go test does not run it (about 30 s on two cores):
//
//	go test -run XXX -bench Soak10k -benchtime 1x ./train
func BenchmarkSoak10k(b *testing.B) {
	const steps = 10_000
	dev := tensor.CPU()
	ds := datasets.SyntheticSize(4000, 1, 12)
	test := datasets.SyntheticSize(64, 9, 12)
	for i := 0; i < b.N; i++ {
		dev.Generator().Seed(1)
		model := nn.NewResNet(dev, "tiny", 1, 10, []int{8, 16}, []int{1, 1})
		cfg := baseConfig("tiny")
		cfg.Batch, cfg.AMP, cfg.Checkpoint = 16, AMPF16, nn.CheckpointBlocks
		l := datasets.NewLoader(ds, dev, datasets.LoaderConfig{Batch: cfg.Batch, Shuffle: true, Seed: 2, CropPad: 2, Flip: true})
		cfg.Epochs = steps / l.Len()
		tr, err := New(model, dev, cfg, l.Len())
		if err != nil {
			b.Fatal(err)
		}
		tr.ProgressEvery = 1000
		if err := tr.Fit(l, datasets.NewLoader(test, dev, datasets.LoaderConfig{Batch: 64}), nil, ""); err != nil {
			b.Fatal(err)
		}
		if len(tr.Memory) != steps {
			b.Fatalf("%d steps, want %d", len(tr.Memory), steps)
		}
		flat, peak := tr.Memory[1].Allocated, tr.Memory[1].PeakAllocated
		for _, m := range tr.Memory[1:] {
			if m.Allocated != flat {
				b.Fatalf("after step %d: %d bytes allocated, %d after step 2", m.Step, m.Allocated, flat)
			}
			if m.PeakAllocated > peak {
				b.Fatalf("step %d peaked at %d bytes, step 2 at %d", m.Step, m.PeakAllocated, peak)
			}
		}
		st := dev.Allocator().Stats()
		b.ReportMetric(float64(flat), "allocated-bytes-after-each-step")
		b.ReportMetric(float64(peak), "step-peak-bytes")
		b.ReportMetric(float64(st.Reserved[memory.All].Current), "reserved-bytes-at-end")
		b.ReportMetric(float64(steps), "steps")
		tr.Release()
		nn.Release(model)
	}
}
