package nn_test

import (
	"fmt"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/optim"
	"github.com/leangrad/leangrad/tensor"
)

// Train an MLP in a page of Go: a model, an optimiser, and a loop whose
// every step runs in a scope, so that nothing but the parameters, their
// momentum and what the loop keeps outlives it.
func Example_trainMLP() {
	dev := tensor.CPU() // or tensor.Open("cuda")
	dev.Generator().Seed(1)
	trainSet, testSet := datasets.Synthetic(2000, 1), datasets.Synthetic(500, 2)
	mean, std := trainSet.MeanStd()
	loader := datasets.NewLoader(trainSet, dev, datasets.LoaderConfig{Batch: 50, Shuffle: true, Mean: mean, Std: std})

	model := nn.NewMLP(dev, []int{784, 128, 10}, 0)
	defer nn.Release(model)
	opt := optim.NewSGD(nn.Parameters(model), 0.05, 0.9, 1e-4, true)
	defer opt.Release()

	for epoch := 0; epoch < 2; epoch++ {
		batches := loader.Epoch(epoch)
		for {
			done := false
			dev.WithScope(func() {
				x, y, ok := batches.Next()
				if !ok {
					done = true
					return
				}
				loss := ag.CrossEntropy(model.Forward(x), y)
				ag.Backward(loss) // frees each node's saved tensors as it goes
				opt.Step()
			})
			opt.ZeroGrad() // releases the gradients
			if done {
				break
			}
		}
	}

	// Evaluate with recording off.
	correct := 0
	ag.NoGrad(dev, func() {
		dev.WithScope(func() {
			test := datasets.NewLoader(testSet, dev, datasets.LoaderConfig{Batch: 500, Mean: mean, Std: std}).Epoch(0)
			x, y, _ := test.Next()
			pred, labels := ag.ArgMax(model.Forward(x), 1).Int32s(), y.Int32s()
			for i := range pred {
				if pred[i] == labels[i] {
					correct++
				}
			}
			test.Close()
		})
	})
	fmt.Println("test accuracy above 95%:", correct > 475)
	// Output:
	// test accuracy above 95%: true
}
