package train_test

import (
	"fmt"
	"slices"
	"strings"
	"time"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/optim"
	"github.com/leangrad/leangrad/tensor"
	"github.com/leangrad/leangrad/train"
)

// Train a ResNet with mixed precision and checkpointed blocks: the Trainer
// runs train.Step (captured as a CUDA graph on a GPU), evaluates after each
// epoch and samples the pool after every step.
func ExampleTrainer() {
	dev := tensor.CPU()
	trainSet, testSet := datasets.SyntheticSize(512, 1, 12), datasets.SyntheticSize(128, 2, 12)
	model, err := train.BuildModel(dev, "resnet8", []int{1, 12, 12}, 10, 1)
	if err != nil {
		panic(err)
	}
	defer nn.Release(model) // the model is the caller's, not the trainer's
	cfg := train.Config{Model: "resnet8", Epochs: 3, Batch: 32, LR: 0.05, Momentum: 0.9, WeightDecay: 5e-4,
		Optimizer: "sgd", Schedule: "cosine", AMP: train.AMPF16, Checkpoint: nn.CheckpointBlocks, Seed: 1}
	loader := datasets.NewLoader(trainSet, dev, datasets.LoaderConfig{Batch: cfg.Batch, Shuffle: true, Seed: 1})
	tr, err := train.New(model, dev, cfg, loader.Len())
	if err != nil {
		panic(err)
	}
	defer tr.Release()
	if err := tr.Fit(loader, datasets.NewLoader(testSet, dev, datasets.LoaderConfig{Batch: 128}), nil, ""); err != nil {
		panic(err) // an *OOMError the trainer could not recover from, or a *DivergedError
	}
	last := tr.History[len(tr.History)-1]
	flat := true
	for _, m := range tr.Memory[1:] {
		flat = flat && m.Allocated == tr.Memory[1].Allocated
	}
	fmt.Println("epochs:", len(tr.History), "learned:", last.TestAcc > 0.5, "allocated after every step the same:", flat)
	// Output:
	// epochs: 3 learned: true allocated after every step the same: true
}

// Measure what each memory configuration's training step peaks at, from the
// pool: the numbers train -model resnet prints before training.
func ExampleMeasureStep() {
	dev := tensor.CPU()
	build := func() nn.Model {
		m, _ := train.BuildModel(dev, "resnet20", []int{1, 28, 28}, 10, 1)
		return m
	}
	x := tensor.Randn(dev, tensor.F32, 0, 1, 16, 1, 28, 28)
	y := tensor.FromInt32(dev, make([]int32, 16), 16)
	defer x.Release()
	defer y.Release()
	cfg := train.Config{Model: "resnet20", Batch: 16, LR: 0.1, Momentum: 0.9, Optimizer: "sgd", Schedule: "constant"}
	var fp32 int64
	for _, v := range train.Variants(nn.CheckpointBlocks, train.AMPF16) {
		m, err := train.MeasureStep(dev, build, cfg, v, x, y, false)
		if err != nil {
			panic(err)
		}
		if v.Name == "fp32" {
			fp32 = m.PeakAllocated
		}
		fmt.Printf("%-15s below fp32: %v\n", v.Name, m.PeakAllocated < fp32)
	}
	// Output:
	// fp32            below fp32: false
	// amp             below fp32: true
	// checkpoint      below fp32: true
	// amp+checkpoint  below fp32: true
}

// Train a small GPT on text with train.Step, then continue a prompt with
// Generate from a session of the same device: its key-value cache comes
// from the pool and goes back when the call returns, and a service would
// call it from many goroutines, each on its own session, while another
// trains (give the servers their own copy of the weights).
func Example_gpt() {
	dev := tensor.CPU() // or tensor.Open("auto")
	tok, _ := datasets.NewTokenizer(datasets.ByteTokens)
	text := tok.Encode(strings.Repeat("the quick brown fox jumps over the lazy dog. ", 100))
	dev.Generator().Seed(1)
	gpt, err := nn.NewGPT(dev, nn.GPTConfig{Layers: 2, Heads: 2, Width: 64, Vocab: tok.Vocab(), Context: 32})
	if err != nil {
		panic(err)
	}
	defer nn.Release(gpt)
	opt := optim.NewAdamW(nn.Parameters(gpt), 3e-3, 0.1)
	opt.NoDecay = nn.NoDecay(gpt) // no decay on biases and layer norms
	defer opt.Release()
	step := train.NewStep(dev, gpt, opt, 0, train.ModeFor(dev, true)) // captured on a GPU
	step.ClipNorm = 1
	defer step.Release()
	loader := datasets.NewTextLoader(text, dev, datasets.TextConfig{Batch: 8, Context: 32, Steps: 60, Seed: 1})
	it := loader.Epoch(0)
	for ok := true; ok; {
		dev.WithScope(func() {
			var x, y *tensor.Tensor
			if x, y, ok = it.Next(); ok {
				if err := step.Run(x, y); err != nil {
					panic(err)
				}
			}
		})
	}
	tally, _ := step.Metrics()
	gpt.SetTraining(false)
	out, err := gpt.Generate(dev.Session(), tok.Encode("the quick"), 14, nn.Sampling{}) // greedy
	if err != nil {
		panic(err)
	}
	fmt.Printf("mean loss under 2 nats (5.5 at the start): %v\n", tally.Loss() < 2)
	fmt.Printf("%q\n", tok.Decode(out))
	// Output:
	// mean loss under 2 nats (5.5 at the start): true
	// " brown fox jum"
}

// Serve a model while it trains: the trainer publishes a snapshot of its
// weights after every step, and a serving goroutine answers each request
// with the latest snapshot, on its own session, never reading the weights
// the optimiser is writing.
func Example_servingWhileTraining() {
	dev := tensor.CPU()
	build := func() nn.Model {
		m, err := train.BuildModel(dev, "resnet8", []int{1, 12, 12}, 10, 1)
		if err != nil {
			panic(err)
		}
		return m
	}
	model := build()
	defer nn.Release(model)
	tr, err := train.New(model, dev, train.Config{Model: "resnet8", Epochs: 1, Batch: 32, LR: 0.05, Momentum: 0.9}, 8)
	if err != nil {
		panic(err)
	}
	defer tr.Release()
	pub := train.NewPublisher(build)
	defer pub.Close()
	tr.Publisher, tr.PublishEvery = pub, 1

	served := make(chan []int)
	go func() { // the service
		s := dev.Session()
		var classes []int
		for len(classes) < 5 {
			m, _, release, ok := pub.Acquire()
			if !ok {
				time.Sleep(time.Millisecond) // nothing published yet
				continue
			}
			ag.NoGrad(s, func() {
				s.WithScope(func() {
					logits := m.Forward(tensor.Zeros(s, tensor.F32, 1, 1, 12, 12)).Float32s()
					classes = append(classes, slices.Index(logits, slices.Max(logits)))
				})
			})
			release()
		}
		served <- classes
	}()
	data := datasets.SyntheticSize(256, 1, 12)
	l := datasets.NewLoader(data, dev, datasets.LoaderConfig{Batch: 32, Shuffle: true, Seed: 1})
	if err := tr.Fit(l, l, nil, ""); err != nil {
		panic(err)
	}
	fmt.Printf("trained %d steps; served %d requests from snapshots\n", tr.Steps, len(<-served))
	// Output: trained 8 steps; served 5 requests from snapshots
}
