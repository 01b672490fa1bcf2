package run

import (
	"bytes"
	"strings"
	"testing"

	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
	"github.com/leangrad/leangrad/train"
)

// Train is the whole run cmd/train does, for a Go program: the report says
// what was measured and trained, and its summary is the end of train's output.
func TestTrain(t *testing.T) {
	dev := tensor.NewDevice(cpu.New())
	var log bytes.Buffer
	job := Job{Config: train.Config{Model: "resnet8", Dataset: "synthetic", Epochs: 1, Batch: 16, LR: 0.05, Momentum: 0.9,
		Optimizer: "sgd", Schedule: "cosine", AMP: true, Checkpoint: "blocks", Seed: 1},
		Train: datasets.SyntheticSize(64, 1, 12), Test: datasets.SyntheticSize(32, 2, 12), Measure: true, Log: &log}
	r, err := Train(dev, job)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Measured) != 4 || len(r.Epochs) != 1 || r.Final == nil || r.Final.PeakAllocated <= 0 || len(r.Memory) != 4 || r.Error != "" {
		t.Errorf("report %+v", r)
	}
	var sum bytes.Buffer
	r.WriteSummary(&sum)
	for _, want := range []string{"measured by the pool", "training resnet8"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, log.String())
		}
	}
	if !strings.Contains(sum.String(), "test accuracy") || !strings.Contains(sum.String(), "leangrad memory summary") {
		t.Errorf("summary:\n%s", sum.String())
	}
	job.Model = "resnet9"
	if r, err := Train(dev, job); err == nil || r.Error == "" {
		t.Errorf("a bad model name: %v, report error %q", err, r.Error)
	}
	if got := dev.Allocator().Stats().Allocated[memory.All].Current; got != 0 {
		t.Errorf("%d bytes left allocated after the runs", got)
	}
}

func TestCPUDefaults(t *testing.T) {
	job := Job{Config: train.Config{Epochs: 15, Batch: 128, LR: 0.1}, Train: datasets.SyntheticSize(3000, 1, 8), Test: datasets.SyntheticSize(1500, 2, 8)}
	notes := job.CPUDefaults(func(name string) bool { return name == "epochs" })
	if job.Train.N != 2000 || job.Test.N != 1000 || job.Epochs != 15 || job.Batch != 32 || job.LR != 0.025 || len(notes) != 4 {
		t.Errorf("after CPUDefaults: %d/%d images, %d epochs, batch %d, lr %v; notes %q", job.Train.N, job.Test.N, job.Epochs, job.Batch, job.LR, notes)
	}
}
