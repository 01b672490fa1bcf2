package serve_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/serve"
	"github.com/leangrad/leangrad/tensor"
)

// An Engine embedded in a Go service: goroutines submit requests at once,
// each reads its tokens from its own channel as the engine's steps decode
// them together, and a cancelled context ends its request at the next
// step; a request that cannot run is refused at once, naming the field.
// (An untrained GPT, so the tokens are noise; a trained one comes
// from train -save and nn.LoadGPT.)
func ExampleEngine() {
	dev := tensor.NewDevice(cpu.New())
	g, err := nn.NewGPT(dev, nn.GPTConfig{Layers: 2, Heads: 2, Width: 32, Vocab: 256, Context: 64})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nn.Release(g)
	g.SetTraining(false)
	tok, err := datasets.NewTokenizer(datasets.ByteTokens)
	if err != nil {
		fmt.Println(err)
		return
	}
	e := serve.NewEngine(dev, g, tok, "tiny", serve.EngineOptions{})
	defer e.Close()
	if err := <-e.Ready(); err != nil { // the key-value memory sized and allocated
		fmt.Println(err)
		return
	}

	said := make([]string, 3)
	var wg sync.WaitGroup
	for i := range said {
		wg.Add(1)
		go func() {
			defer wg.Done()
			events, err := e.Submit(context.Background(), serve.Request{Prompt: tok.Encode(fmt.Sprintf("client %d:", i)), MaxTokens: 8 + i, IgnoreEOS: true})
			if err != nil {
				said[i] = err.Error()
				return
			}
			tokens := 0
			for ev := range events {
				if ev.Token >= 0 {
					tokens++
				}
				if ev.Finish != "" || ev.Err != nil { // the sample's last event
					said[i] = fmt.Sprintf("client %d: %d tokens, finished by %s", i, tokens, ev.Finish)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, s := range said {
		fmt.Println(s)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := e.Submit(ctx, serve.Request{Prompt: tok.Encode("a long one"), MaxTokens: 54, IgnoreEOS: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	cancel() // the client went away
	for ev := range events {
		if ev.Finish != "" || ev.Err != nil {
			fmt.Println("cancelled:", errors.Is(ev.Err, context.Canceled))
			break
		}
	}

	_, err = e.Submit(context.Background(), serve.Request{Prompt: tok.Encode("too long"), MaxTokens: 100})
	fmt.Println(err)
	// Output:
	// client 0: 8 tokens, finished by length
	// client 1: 9 tokens, finished by length
	// client 2: 10 tokens, finished by length
	// cancelled: true
	// max_tokens: 100 after a prompt of 8 tokens: want 1 to 56 (the context is 64)
}
