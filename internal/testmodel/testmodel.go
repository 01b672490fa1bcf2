// Package testmodel writes the checkpoints that tests serve: an untrained
// model saved as train -save saves one.
package testmodel

import (
	"path/filepath"
	"testing"

	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
	"github.com/leangrad/leangrad/train"
)

// Checkpoint builds the named model for inputs in on dev (seed 1), lets
// edit change it when edit is not nil, saves it with its inputs in a
// temporary folder of t's, frees it, and returns the file's path.
func Checkpoint(t testing.TB, dev *tensor.Device, model string, in train.Inputs, edit func(nn.Model)) string {
	t.Helper()
	m, err := train.BuildModel(dev, model, in.Shape, in.Classes, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer nn.Release(m)
	if edit != nil {
		edit(m)
	}
	cfg := train.Config{Model: model, Epochs: 1, Batch: 8, LR: 0.1, Optimizer: "sgd", Schedule: "constant", Seed: 1, Tokenizer: in.Tokenizer}
	tr, err := train.New(m, dev, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Release()
	tr.Inputs = &in
	path := filepath.Join(t.TempDir(), model+".st")
	if err := tr.Save(path); err != nil {
		t.Fatal(err)
	}
	return path
}
