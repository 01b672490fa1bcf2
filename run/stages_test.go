package run

import (
	"errors"
	"testing"

	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
	"github.com/leangrad/leangrad/train"
)

// TestSampleStops: a closed Job.Stop ends the sample after the training
// within one token's work, saying so (train.ErrInterrupted); without it
// the sample is written to the report.
func TestSampleStops(t *testing.T) {
	dev := tensor.CPU()
	tok, err := datasets.NewTokenizer(datasets.ByteTokens)
	if err != nil {
		t.Fatal(err)
	}
	g, err := nn.NewGPT(dev, nn.GPTConfig{Layers: 1, Heads: 2, Width: 32, Vocab: tok.Vocab(), Context: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer nn.Release(g)
	g.SetTraining(false)
	closed := make(chan struct{})
	close(closed)
	for _, stop := range []chan struct{}{closed, nil} {
		r := &runner{dev: dev, arch: train.Arch{Text: true}, model: g, cfg: train.Config{Model: "gpt", Context: 64}, report: &Report{},
			job: Job{Text: &datasets.Corpus{Tokenizer: tok, Val: tok.Encode("the quick brown fox")}, Sample: 40, Stop: stop}}
		err := r.sample()
		if stop != nil {
			if !errors.Is(err, train.ErrInterrupted) || r.report.Sample != nil {
				t.Errorf("stopped: %v, sample %+v; want an interruption and no sample", err, r.report.Sample)
			}
			continue
		}
		if err != nil || r.report.Sample == nil || r.report.Sample.Tokens != 40 {
			t.Errorf("not stopped: %v, sample %+v", err, r.report.Sample)
		}
	}
}
