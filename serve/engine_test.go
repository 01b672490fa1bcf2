package serve

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// engineGPT is a small untrained GPT of the byte tokenizer on dev (nil:
// a fresh CPU device), in evaluation mode.
func engineGPT(t testing.TB, dev *tensor.Device) (*tensor.Device, *nn.GPT, datasets.Tokenizer) {
	t.Helper()
	if dev == nil {
		dev = tensor.NewDevice(cpu.New())
	}
	g, err := nn.NewGPT(dev, nn.GPTConfig{Layers: 2, Heads: 2, Width: 32, Vocab: 256, Context: 64})
	if err != nil {
		t.Fatal(err)
	}
	g.SetTraining(false)
	t.Cleanup(func() { nn.Release(g) })
	tok, err := datasets.NewTokenizer(datasets.ByteTokens)
	if err != nil {
		t.Fatal(err)
	}
	return dev, g, tok
}

// startEngine starts an engine and waits for its warm-up.
func startEngine(t testing.TB, dev *tensor.Device, g *nn.GPT, tok datasets.Tokenizer, o EngineOptions, pad ...bool) *Engine {
	t.Helper()
	e := newEngine(dev, g, tok, "gpt-test", o)
	if len(pad) > 0 {
		e.pad = pad[0]
	}
	e.start()
	if err := <-e.Ready(); err != nil {
		e.Close()
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// sampleResult is what a request's events made of one sample.
type sampleResult struct {
	tokens []int32
	lps    []float32      // each token's log-probability
	tops   [][]TopLogprob // each token's most likely alternatives
	text   string
	finish string
	err    error
}

// drain reads a request's events until its n samples ended.
func drain(ch <-chan Event, n int) []sampleResult {
	out := make([]sampleResult, n)
	for ev := range events(ch, n) {
		r := &out[ev.Index]
		if ev.Token >= 0 {
			r.tokens, r.lps, r.tops = append(r.tokens, ev.Token), append(r.lps, ev.Logprob), append(r.tops, ev.Top)
		}
		r.text += ev.Text
		r.finish, r.err = ev.Finish, ev.Err
	}
	return out
}

// randomPrompt is n random tokens, after a shared prefix when one is given.
func randomPrompt(rng *rand.Rand, prefix []int32, n int) []int32 {
	p := slices.Clone(prefix)
	for len(p) < len(prefix)+n {
		p = append(p, int32(rng.IntN(256)))
	}
	return p
}

// TestEngineGreedyMatchesGenerate: requests of many lengths submitted
// while others run (some sharing a prefix, some twice) generate greedily
// exactly what GPT.Generate generates for each alone, under every way the
// engine can schedule them: chunked prefills, blocks of 4, a memory so
// small that sequences are preempted and recomputed, without the prefix
// cache, static batches. After, every block is back and the pool holds
// what it held after the warm-up, to the byte.
func TestEngineGreedyMatchesGenerate(t *testing.T) { testEngineGreedy(t, nil) }

// testEngineGreedy is TestEngineGreedyMatchesGenerate on dev, in F32 (on
// a GPU, its decoding steps replayed as CUDA graphs).
func testEngineGreedy(t *testing.T, dev *tensor.Device) {
	dev, g, tok := engineGPT(t, dev)
	rng := rand.New(rand.NewPCG(1, 2))
	shared := randomPrompt(rng, nil, 20)
	type job struct {
		prompt []int32
		max    int
		want   []int32
	}
	var jobs []job
	for i := range 14 {
		var prefix []int32
		if i%3 == 0 {
			prefix = shared
		}
		j := job{prompt: randomPrompt(rng, prefix, 1+rng.IntN(20)), max: 1 + rng.IntN(24)}
		if i == 13 {
			j.prompt = slices.Clone(jobs[3].prompt) // the very same prompt: its blocks all cached but the last
		}
		want, err := g.Generate(dev, j.prompt, j.max, nn.Sampling{})
		if err != nil {
			t.Fatal(err)
		}
		j.want = want
		jobs = append(jobs, j)
	}
	per := g.KVBlockBytes(tensor.F32, 4)
	for _, c := range []struct {
		name        string
		o           EngineOptions
		preemptions bool
		pad         bool // eager steps padded, as on a GPU
	}{
		{"default", EngineOptions{}, false, false},
		{"chunked prefill", EngineOptions{MaxBatchTokens: 16, MaxSeqs: 4}, false, false},
		{"blocks of 4", EngineOptions{BlockSize: 4}, false, false},
		{"preempted", EngineOptions{BlockSize: 4, KVMemory: memory.Budget{Bytes: 24 * per}}, true, false},
		{"no prefix cache", EngineOptions{NoPrefixCache: true, BlockSize: 8}, false, false},
		{"static batches", EngineOptions{StaticBatching: true, MaxSeqs: 5}, false, false},
		{"padded steps", EngineOptions{MaxBatchTokens: 40, MaxSeqs: 6}, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.o.DType = tensor.F32
			e := startEngine(t, dev, g, tok, c.o, c.pad)
			warm := dev.Allocator().Stats().Allocated[memory.All].Current
			for round := range 2 {
				var wg sync.WaitGroup
				for i, j := range jobs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						time.Sleep(time.Duration(i%5) * time.Millisecond) // arrivals while others run
						ch, err := e.Submit(context.Background(), Request{Prompt: j.prompt, MaxTokens: j.max})
						if err != nil {
							t.Error(err)
							return
						}
						got := drain(ch, 1)[0]
						if got.err != nil || !slices.Equal(got.tokens, j.want) || got.finish != FinishLength {
							t.Errorf("round %d, request %d (prompt of %d, %d tokens): %v %q %v; Generate made %v", round, i, len(j.prompt), j.max,
								got.tokens, got.finish, got.err, j.want)
						}
					}()
				}
				wg.Wait()
				waitIdle(t, e)
				if now := dev.Allocator().Stats().Allocated[memory.All].Current; now != warm {
					t.Errorf("round %d: the pool holds %d bytes, %d after the warm-up", round, now, warm)
				}
			}
			pre := testutil.ToFloat64(e.m.preemptions)
			if c.preemptions && pre == 0 {
				t.Errorf("no preemption in a memory of 24 blocks")
			}
			if !c.preemptions && pre != 0 {
				t.Errorf("%v preemptions with memory to spare", pre)
			}
			if kv, _, _ := e.KVStats(); !c.o.NoPrefixCache && kv.Hits == 0 {
				t.Errorf("no prefix-cache hit for prompts that share 20 tokens: %+v", kv)
			}
		})
	}
}

// TestEngineSharesAPrefixInItsFirstStep: prompts that arrive together
// with a common prefix compute it once, in the first step, where the
// later ones read the blocks the first writes (Note [paged key-value
// memory]); each generates greedily what GPT.Generate does alone.
func TestEngineSharesAPrefixInItsFirstStep(t *testing.T) { testEngineSharesAPrefix(t, nil) }

// testEngineSharesAPrefix is TestEngineSharesAPrefixInItsFirstStep on dev
// (nil: the CPU), in F32.
func testEngineSharesAPrefix(t *testing.T, dev *tensor.Device) {
	dev, g, tok := engineGPT(t, dev)
	rng := rand.New(rand.NewPCG(5, 6))
	shared := randomPrompt(rng, nil, 16) // four blocks of 4
	const requests, own, max = 6, 3, 4
	for _, cache := range []bool{true, false} {
		e := newEngine(dev, g, tok, "gpt-test", EngineOptions{DType: tensor.F32, BlockSize: 4, NoPrefixCache: !cache})
		var prompts [][]int32
		var chans []<-chan Event
		for range requests { // queued before the loop starts: its first step takes them all
			p := randomPrompt(rng, shared, own)
			ch, err := e.Submit(context.Background(), Request{Prompt: p, MaxTokens: max})
			if err != nil {
				t.Fatal(err)
			}
			prompts, chans = append(prompts, p), append(chans, ch)
		}
		e.start()
		if err := <-e.Ready(); err != nil {
			t.Fatal(err)
		}
		for i, ch := range chans {
			want, err := g.Generate(dev, prompts[i], max, nn.Sampling{})
			if err != nil {
				t.Fatal(err)
			}
			if got := drain(ch, 1)[0]; got.err != nil || !slices.Equal(got.tokens, want) {
				t.Errorf("cache %v, request %d: %v %v; Generate made %v", cache, i, got.tokens, got.err, want)
			}
		}
		waitIdle(t, e)
		var h dto.Metric
		if err := e.m.batchRows.Write(&h); err != nil {
			t.Fatal(err)
		}
		prefill := requests * (len(shared) + own) // each prompt whole, without the cache
		if cache {
			prefill = len(shared) + requests*own
		}
		decode := requests * (max - 1) // the first token comes with the prefill
		if rows := h.GetHistogram().GetSampleSum(); rows != float64(prefill+decode) {
			t.Errorf("cache %v: the steps ran %v rows, want %d prefilled and %d decoded", cache, rows, prefill, decode)
		}
		if kv, _, _ := e.KVStats(); cache && kv.Hits != int64((requests-1)*len(shared)/4) {
			t.Errorf("%d prefix-cache hits, want %d", kv.Hits, (requests-1)*len(shared)/4)
		}
		e.Close()
	}
}

// waitIdle waits until the engine has nothing waiting or running and its
// last step's memory state, published after the step's samples ended,
// holds no block; it fails the test with what is still held after 10 s
// (a leak of blocks fails here).
func waitIdle(t testing.TB, e *Engine) {
	t.Helper()
	var kv KVStats
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		kv, _, _ = e.KVStats()
		if e.queued.Load() == 0 && testutil.ToFloat64(e.m.running) == 0 && testutil.ToFloat64(e.m.waiting) == 0 && kv.Used == 0 {
			return
		}
	}
	t.Fatalf("the engine is still busy after 10 s: %d samples queued, %v running, %v waiting, %d blocks held",
		e.queued.Load(), testutil.ToFloat64(e.m.running), testutil.ToFloat64(e.m.waiting), kv.Used)
}

// TestEngineSamplesAreSeeded: a request's samples are drawn from its
// seed and each sample's index alone: the same with another request
// beside them or alone, different between samples and between seeds, and
// within top_k.
func TestEngineSamplesAreSeeded(t *testing.T) { testEngineSamplesAreSeeded(t, nil) }

func testEngineSamplesAreSeeded(t *testing.T, dev *tensor.Device) {
	dev, g, tok := engineGPT(t, dev)
	e := startEngine(t, dev, g, tok, EngineOptions{DType: tensor.F32})
	prompt := tok.Encode("Once upon a time")
	req := Request{Prompt: prompt, MaxTokens: 20, Temperature: 1, TopK: 50, Seed: 7, N: 3, TopLogprobs: 2}
	run := func(r Request) []sampleResult {
		ch, err := e.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		out := drain(ch, r.N)
		for i, s := range out {
			if s.err != nil || len(s.tokens) != r.MaxTokens {
				t.Fatalf("sample %d: %d tokens, %v", i, len(s.tokens), s.err)
			}
			for j, top := range s.tops { // the most likely first, the drawn one no likelier
				if len(top) != r.TopLogprobs || r.TopLogprobs == 2 && (top[0].Logprob < top[1].Logprob || s.lps[j] > top[0].Logprob+1e-4 || s.lps[j] > 0) {
					t.Fatalf("sample %d token %d: log-probability %v, top %+v", i, j, s.lps[j], top)
				}
			}
		}
		return out
	}
	alone := run(req)
	if slices.Equal(alone[0].tokens, alone[1].tokens) || slices.Equal(alone[1].tokens, alone[2].tokens) {
		t.Errorf("the samples of one request are the same: %v", alone)
	}
	var beside []sampleResult
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		run(Request{Prompt: tok.Encode("Something else entirely, and longer"), MaxTokens: 20, Temperature: 0.7, Seed: 1})
	}()
	beside = run(req)
	wg.Wait()
	for i := range alone {
		if !slices.Equal(alone[i].tokens, beside[i].tokens) || alone[i].text != beside[i].text {
			t.Errorf("sample %d: %v alone, %v beside another request", i, alone[i].tokens, beside[i].tokens)
		}
	}
	other := req
	other.Seed = 8
	if o := run(other); slices.Equal(o[0].tokens, alone[0].tokens) {
		t.Errorf("seeds 7 and 8 drew the same tokens %v", o[0].tokens)
	}
	// Every token is among the 50 most likely after its prefix.
	for _, s := range alone {
		seq := slices.Clone(prompt)
		for _, tk := range s.tokens {
			logits := lastLogits(t, dev, g, seq)
			above := 0
			for _, v := range logits {
				if v > logits[tk] {
					above++
				}
			}
			if above >= 50 {
				t.Fatalf("token %d after %v has %d more likely: outside top_k 50", tk, seq, above)
			}
			seq = append(seq, tk)
		}
	}
}

// lastLogits is the model's logits after tokens.
func lastLogits(t testing.TB, dev *tensor.Device, g *nn.GPT, tokens []int32) []float32 {
	var out []float32
	if err := tensor.Catch(func() {
		dev.WithScope(func() {
			all := g.Forward(tensor.FromInt32(dev, tokens, 1, len(tokens))).Float32s()
			out = all[len(all)-g.Cfg.Vocab:]
		})
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestEngineCancelFreesBlocks: a request whose context is cancelled ends
// with the context's error at the next step and gives its blocks back;
// the others run on.
func TestEngineCancelFreesBlocks(t *testing.T) {
	dev, g, tok := engineGPT(t, nil)
	e := startEngine(t, dev, g, tok, EngineOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := e.Submit(ctx, Request{Prompt: tok.Encode("cancel me"), MaxTokens: 50, N: 2, Temperature: 1, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	keep, err := e.Submit(context.Background(), Request{Prompt: tok.Encode("keep me"), MaxTokens: 40})
	if err != nil {
		t.Fatal(err)
	}
	ended := 0
	for ev := range events(ch, 2) {
		if ev.Token >= 0 && ended == 0 {
			cancel()
		}
		if ev.Err != nil {
			if !errors.Is(ev.Err, context.Canceled) {
				t.Errorf("sample %d ended with %v, want the context's cancellation", ev.Index, ev.Err)
			}
			ended++
		} else if ev.Finish != "" {
			t.Errorf("sample %d finished (%s) though cancelled", ev.Index, ev.Finish)
		}
	}
	if r := drain(keep, 1)[0]; r.err != nil || len(r.tokens) != 40 {
		t.Errorf("the other request: %d tokens, %v", len(r.tokens), r.err)
	}
	waitIdle(t, e)
}

// TestEngineRefuses: requests that cannot run are refused naming the
// field, before they run; a full queue is ErrOverloaded; a closed engine
// ends what it runs with an error.
func TestEngineRefuses(t *testing.T) {
	dev, g, tok := engineGPT(t, nil)
	per := g.KVBlockBytes(tensor.F32, 16)
	model := dev.Allocator().Stats().Allocated[memory.All].Current
	e := startEngine(t, dev, g, tok, EngineOptions{MaxQueue: 4, MaxSeqs: 8, KVMemory: memory.Budget{Bytes: 6 * per}})
	p := tok.Encode("abc")
	for _, c := range []struct {
		r    Request
		want string
	}{
		{Request{MaxTokens: 4}, "prompt: empty"},
		{Request{Prompt: make([]int32, 64), MaxTokens: 1}, "prompt: 64 tokens, and the model's context is 64"},
		{Request{Prompt: []int32{1, 300}, MaxTokens: 1}, "prompt: token 300 at position 1 is outside the vocabulary of 256"},
		{Request{Prompt: p, MaxTokens: 62}, "max_tokens: 62 after a prompt of 3 tokens: want 1 to 61"},
		{Request{Prompt: p, MaxTokens: 4, Temperature: -1}, "temperature: -1"},
		{Request{Prompt: p, MaxTokens: 4, TopP: 1.5}, "top_p: 1.5"},
		{Request{Prompt: p, MaxTokens: 4, N: 9}, "n: 9: want 1 to 8"},
		{Request{Prompt: p, MaxTokens: 4, TopLogprobs: 6}, "logprobs: 6: want 0 to 5"},
		{Request{Prompt: p, MaxTokens: 4, Stop: []string{""}}, "stop: string 0 is empty"},
		{Request{Prompt: p, MaxTokens: 40, N: 3}, "need 9 key-value blocks, and the server's memory has 5"},
	} {
		_, err := e.Submit(context.Background(), c.r)
		var re *RequestError
		if !errors.As(err, &re) || !strings.Contains(fmt.Sprint(err), c.want) {
			t.Errorf("%+v: %v; want a RequestError with %q", c.r, err, c.want)
		}
	}
	if _, err := e.Submit(context.Background(), Request{Prompt: p, MaxTokens: 4, N: 5}); !errors.Is(err, ErrOverloaded) {
		t.Errorf("5 samples with a queue of 4: %v, want ErrOverloaded", err)
	}
	if got := testutil.ToFloat64(e.m.overloaded); got != 1 {
		t.Errorf("leangrad_overloaded_total %v, want 1", got)
	}
	ch, err := e.Submit(context.Background(), Request{Prompt: p, MaxTokens: 60, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	<-ch // running
	e.Close()
	var last Event
	for ev := range events(ch, 1) {
		last = ev
	}
	if last.Err == nil && last.Finish == "" {
		t.Errorf("a request running at Close ended with %+v", last)
	}
	if _, err := e.Submit(context.Background(), Request{Prompt: p, MaxTokens: 4}); err == nil {
		t.Errorf("Submit on a closed engine succeeded")
	}
	if got := dev.Allocator().Stats().Allocated[memory.All].Current; got != model {
		t.Errorf("the closed engine left %d bytes in the pool beside the model's %d", got-model, model)
	}
}

// TestEngineMemoryIsFlat is the long-run memory test, shortened for CI
// (-engine.requests sets its length): thousands of short requests from
// many goroutines into a memory too small for them all, with
// cancellations, are preempted and never fail, and leave the pool's
// allocated and reserved bytes where the warm-up left them and every
// block back.
func TestEngineMemoryIsFlat(t *testing.T) { testEngineMemoryIsFlat(t, nil, 2000) }

var flatRequests = flag.Int("engine.requests", 0, "TestEngineMemoryIsFlat, TestCUDAEngineMemoryIsFlat: the requests (0: 2,000 on the CPU, 20,000 on a GPU)")

func testEngineMemoryIsFlat(t *testing.T, dev *tensor.Device, n int) {
	if *flatRequests > 0 {
		n = *flatRequests
	}
	if testing.Short() {
		n = min(n, 300)
	}
	dev, g, tok := engineGPT(t, dev)
	// A memory of 24 blocks of 8 for 32 clients of up to 46 positions:
	// sequences are preempted, and no request may fail for it.
	e := startEngine(t, dev, g, tok, EngineOptions{BlockSize: 8, DType: tensor.F32, KVMemory: memory.Budget{Bytes: 24 * g.KVBlockBytes(tensor.F32, 8)}})
	a := dev.Allocator()
	before := a.Stats()
	start := time.Now()
	var wg sync.WaitGroup
	work := make(chan int)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				rng := rand.New(rand.NewPCG(uint64(i), 9))
				ctx, cancel := context.WithCancel(context.Background())
				ch, err := e.Submit(ctx, Request{Prompt: randomPrompt(rng, nil, 1+rng.IntN(30)), MaxTokens: 1 + rng.IntN(16),
					Temperature: 1, Seed: uint64(i)})
				if err != nil {
					t.Error(err)
					cancel()
					return
				}
				if i%7 == 0 {
					cancel()
				}
				for ev := range events(ch, 1) {
					if ev.Err != nil && !(i%7 == 0 && errors.Is(ev.Err, context.Canceled)) {
						t.Errorf("request %d failed: %v", i, ev.Err)
					}
				}
				cancel()
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	waitIdle(t, e)
	after := a.Stats()
	_, most, mostArena := e.KVStats()
	t.Logf("%d requests in %.1f s: the pool holds %d bytes (%d before), reserves %d (%d before); waste at most %.1f%% of the blocks held, %.2f%% of the memory; %v preemptions",
		n, time.Since(start).Seconds(), after.Allocated[memory.All].Current, before.Allocated[memory.All].Current,
		after.Reserved[memory.All].Current, before.Reserved[memory.All].Current, 100*most, 100*mostArena, testutil.ToFloat64(e.m.preemptions))
	if b, a := before.Allocated[memory.All].Current, after.Allocated[memory.All].Current; a != b {
		t.Errorf("the pool holds %d bytes after %d requests, %d before", a, n, b)
	}
	if b, a := before.Reserved[memory.All].Current, after.Reserved[memory.All].Current; a > b {
		t.Errorf("the pool reserves %d bytes after %d requests, %d before", a, n, b)
	}
	if kv, _, _ := e.KVStats(); kv.Used != 0 {
		t.Errorf("%d blocks held after every request ended", kv.Used)
	}
	if testutil.ToFloat64(e.m.preemptions) == 0 {
		t.Errorf("no preemption: the memory was not the limit this test means it to be")
	}
}

// TestRowBucket: an eager step's rows are padded by at most a quarter, to
// few sizes, never past the most unless the rows themselves are more.
func TestRowBucket(t *testing.T) {
	for _, c := range []struct{ n, most, want int }{
		{1, 2048, 16}, {16, 2048, 16}, {17, 2048, 20}, {33, 2048, 40}, {100, 2048, 112},
		{1025, 2048, 1280}, {2047, 2048, 2048}, {10, 8, 10}, {17, 18, 18}, {3000, 2048, 3000},
	} {
		if got := rowBucket(c.n, c.most); got != c.want {
			t.Errorf("rowBucket(%d, %d) = %d, want %d", c.n, c.most, got, c.want)
		}
	}
	b := rowBuckets(2048)
	if len(b) > 60 || b[0] != 16 || b[len(b)-1] != 2048 {
		t.Errorf("rowBuckets(2048) = %v: want 16 to 2048 in at most 60 sizes", b)
	}
	for n := 1; n <= 2048; n++ {
		if r := rowBucket(n, 2048); r < n || (n > 16 && 4*r > 5*n) || !slices.Contains(b, r) {
			t.Fatalf("rowBucket(%d, 2048) = %d: not among %v or more than a quarter over", n, r, b)
		}
	}
}

// TestEnginePacksWeightsOnCPU: on the CPU the engine packs its model's
// product weights once, says so with their bytes (each weight's
// PrepackLen, as the pool rounds it), and gives them back at Close with
// everything else it held.
func TestEnginePacksWeightsOnCPU(t *testing.T) {
	dev, g, tok := engineGPT(t, nil)
	be := dev.Backend().(*cpu.Backend)
	var want int64
	for _, p := range g.ProductParameters() {
		if p.NDim() == 2 {
			want += memory.RoundSize(int64(4 * be.PrepackLen(p.Dim(1), p.Dim(0))))
		}
	}
	before := dev.Allocator().Stats().Allocated[memory.All].Current
	e := startEngine(t, dev, g, tok, EngineOptions{DType: tensor.F32})
	if said := fmt.Sprintf("weights packed once (%s)", memory.Bytes(want)); !strings.Contains(e.Prepared(), said) {
		t.Errorf("the engine says %q, want it to say %q", e.Prepared(), said)
	}
	e.Close()
	if after := dev.Allocator().Stats().Allocated[memory.All].Current; after != before {
		t.Errorf("the pool holds %d bytes after Close, %d before the engine started", after, before)
	}
}
