package serve

import (
	"context"
	"flag"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/internal/testdev"
	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// TestCUDAEngineGreedyMatchesGenerate: the engine in F32 on the GPU, its
// decoding steps replayed as CUDA graphs, generates what Generate does.
func TestCUDAEngineGreedyMatchesGenerate(t *testing.T) { testEngineGreedy(t, testdev.CUDA(t)) }

// TestCUDAEngineSamplesAreSeeded: the device's sampler draws each
// sample's tokens from its seed and index alone.
func TestCUDAEngineSamplesAreSeeded(t *testing.T) { testEngineSamplesAreSeeded(t, testdev.CUDA(t)) }

// TestCUDAEngineSharesAPrefix: TestEngineSharesAPrefixInItsFirstStep on the
// GPU, its decoding steps captured.
func TestCUDAEngineSharesAPrefix(t *testing.T) { testEngineSharesAPrefix(t, testdev.CUDA(t)) }

// TestCUDAEngineMemoryIsFlat: 20,000 requests leave the GPU's pool as the
// warm-up left it.
func TestCUDAEngineMemoryIsFlat(t *testing.T) { testEngineMemoryIsFlat(t, testdev.CUDA(t), 20000) }

var engineCheckpoint = flag.String("engine.checkpoint", "", "TestCUDAEngineMatchesForwardTrained: a trained GPT's checkpoint (gpu.sh gptserve trains one)")

// TestCUDAEngineMatchesForwardTrained: a trained GPT served in BF16, its
// decoding steps batched through paged memory and CUDA graphs, continues
// 16 prompts by 128 greedy tokens as the plain forward does in BF16 on the
// whole sequence alone, token for token. BF16's rounding differs between
// the two (other products' shapes, another attention kernel), so a
// near-tie of two tokens may go either way: at least 12 of the 16 must
// match in full, and the rest for their first 16 tokens.
func TestCUDAEngineMatchesForwardTrained(t *testing.T) {
	if *engineCheckpoint == "" {
		t.Skip("needs -engine.checkpoint: a trained GPT (scripts/gpu.sh gptserve trains one)")
	}
	dev := testdev.CUDA(t)
	s, err := Open(dev, *engineCheckpoint, Options{Engine: EngineOptions{MaxSeqs: 16, DType: tensor.BF16}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.WarmUp(); err != nil {
		t.Fatal(err)
	}
	prompts := []string{"The", "It was a dark and stormy night;", "In the beginning", "He said that the", "The committee voted to",
		"She looked at the", "Mr. and Mrs.", "The results of the study", "On the other hand,", "There is no", "When the war ended,",
		"The city of", "I don't know what", "According to the report,", "The first thing", "After dinner they"}
	const n = 128
	got := make([][]int32, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ch, err := s.Engine().Submit(context.Background(), Request{Prompt: s.tok.Encode(p), MaxTokens: n, IgnoreEOS: true})
			if err != nil {
				t.Error(err)
				return
			}
			got[i] = drain(ch, 1)[0].tokens
		}()
	}
	wg.Wait()
	g := s.Engine().g
	full, short := 0, 0
	for i, p := range prompts {
		seq := s.tok.Encode(p)
		first := -1
		if err := tensor.Catch(func() {
			ag.NoGrad(dev, func() {
				ag.Autocast(dev, tensor.BF16, func() {
					for k := 0; k < n && first < 0; k++ {
						dev.WithScope(func() {
							logits := g.Forward(tensor.FromInt32(dev, seq, 1, len(seq))).Float32s()
							last := logits[len(logits)-g.Cfg.Vocab:]
							best := int32(0)
							for j, v := range last {
								if v > last[best] {
									best = int32(j)
								}
							}
							if k >= len(got[i]) || got[i][k] != best {
								first = k
							}
							seq = append(seq, best)
						})
					}
				})
			})
		}); err != nil {
			t.Fatal(err)
		}
		switch {
		case first < 0:
			full++
		case first >= 16:
			short++
			t.Logf("prompt %d (%q): the same tokens to %d of %d", i, p, first, n)
		default:
			t.Errorf("prompt %d (%q): the engine's token %d differs from the forward's", i, p, first)
		}
	}
	t.Logf("%d of %d continuations of %d tokens identical to the forward's; %d identical for at least 16", full, len(prompts), n, short)
	if full < 12 {
		t.Errorf("%d of %d continuations identical: want at least 12", full, len(prompts))
	}
}

// BenchmarkCUDAEngineMixed serves gpu.sh gptserve's mixed load (512
// requests arriving at 400 a second, prompts of 8-512 random tokens, 16-512
// tokens generated each) from the GPT of -engine.checkpoint in BF16, its
// decoding steps captured and then eager, and logs where the device's time
// went, by operation: a captured decoding step's replay counts as one, the
// eager work as its kernels. An event is recorded before each operation,
// so the tokens a second it reports are a little below a server's.
func BenchmarkCUDAEngineMixed(b *testing.B) {
	if *engineCheckpoint == "" {
		b.Skip("needs -engine.checkpoint: a trained GPT (scripts/gpu.sh gptserve trains one)")
	}
	dev := testdev.CUDA(b)
	prof, ok := dev.Backend().(kernels.Profiler)
	if !ok {
		b.Skip("the backend attributes no device time")
	}
	for _, eager := range []bool{false, true} {
		b.Run(map[bool]string{false: "captured", true: "eager"}[eager], func(b *testing.B) {
			s, err := Open(dev, *engineCheckpoint, Options{Engine: EngineOptions{DType: tensor.BF16, NoCapture: eager}})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if err := s.WarmUp(); err != nil {
				b.Fatal(err)
			}
			for range b.N {
				mixedLoad(b, s, prof)
			}
		})
	}
}

// mixedLoad runs BenchmarkCUDAEngineMixed's load on s's engine once, with
// prof on, and logs its operations.
func mixedLoad(b *testing.B, s *Server, prof kernels.Profiler) {
	rng := rand.New(rand.NewPCG(1, 2))
	type job struct {
		prompt []int32
		max    int
	}
	jobs := make([]job, 512)
	for i := range jobs {
		p := make([]int32, 8+rng.IntN(505))
		for j := range p {
			p[j] = int32(rng.IntN(s.Engine().g.Cfg.Vocab - 1))
		}
		jobs[i] = job{p, 16 + rng.IntN(497)}
	}
	var wg sync.WaitGroup
	var generated atomic.Int64
	phases := stepPhases(s.Engine())
	prof.StartProfile()
	start := time.Now()
	for i, j := range jobs {
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / 400)))
		ch, err := s.Engine().Submit(context.Background(), Request{Prompt: j.prompt, MaxTokens: j.max, IgnoreEOS: true})
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := drain(ch, 1)[0]
			if r.err != nil {
				b.Error(r.err)
			}
			generated.Add(int64(len(r.tokens)))
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	b.ReportMetric(float64(generated.Load())/wall.Seconds(), "tokens/s")
	b.Logf("%d tokens generated in %v", generated.Load(), wall.Round(time.Millisecond))
	after := stepPhases(s.Engine())
	b.Logf("the engine's loop over %.0f steps: schedule %.1f ms, pack and launch %.1f, wait for the outputs %.1f, deliver %.1f",
		after[0]-phases[0], 1e3*(after[1]-phases[1]), 1e3*(after[2]-phases[2]), 1e3*(after[3]-phases[3]), 1e3*(after[4]-phases[4]))
	logOps(b, prof, wall, 24)
}

// stepPhases is e's steps and the seconds its loop spent in each phase of
// them (engineMetrics.step) so far.
func stepPhases(e *Engine) [5]float64 {
	p := [5]float64{testutil.ToFloat64(e.m.steps)}
	for i, name := range []string{"schedule", "launch", "wait", "deliver"} {
		p[1+i] = testutil.ToFloat64(e.m.stepSeconds.WithLabelValues(name))
	}
	return p
}

// logOps stops prof and logs the device's busy time and its first n
// operations, the most time first, over wall.
func logOps(b *testing.B, prof kernels.Profiler, wall time.Duration, n int) {
	ops, err := prof.StopProfile()
	if err != nil {
		b.Fatal(err)
	}
	var busy float64
	for _, o := range ops {
		if o.Op != kernels.IdleOp {
			busy += o.MS
		}
	}
	b.Logf("the device busy %.1f ms of %v", busy, wall.Round(time.Microsecond))
	for i, o := range ops {
		if i == n {
			break
		}
		b.Logf("%8.1f ms %5.1f%% %7d× %8.1f µs  %s", o.MS, 100*o.MS/(1000*wall.Seconds()), o.Count, 1000*o.MS/float64(o.Count), o.Op)
	}
}

// BenchmarkCUDAEnginePrefix: gpu.sh gptserve's shared-prefix load inside
// the engine, without HTTP: 64 prompts of a shared 512 tokens and 16 of
// their own, submitted at once, 32 tokens each, with and without the
// prefix cache, on GPT-2 small's shape in bf16 (random weights: the time
// does not depend on them). Each load's prefix is new to the engine, as
// the HTTP load's is. It reports the time to first token and logs the
// steps' rows and each operation's device time.
func BenchmarkCUDAEnginePrefix(b *testing.B) {
	dev := testdev.CUDA(b)
	prof, ok := dev.Backend().(kernels.Profiler)
	if !ok {
		b.Skip("the backend attributes no device time")
	}
	g, err := nn.NewGPT(dev, nn.GPTConfig{Layers: 12, Heads: 12, Width: 768, Vocab: 50257, Context: 1024})
	if err != nil {
		b.Fatal(err)
	}
	g.SetTraining(false)
	defer nn.Release(g)
	tok, err := datasets.NewTokenizer(datasets.GPT2Tokens)
	if err != nil {
		b.Fatal(err)
	}
	loads := uint64(0) // every load's prefix its own
	for _, cache := range []bool{true, false} {
		b.Run(map[bool]string{true: "cache", false: "nocache"}[cache], func(b *testing.B) {
			e := NewEngine(dev, g, tok, "gpt2", EngineOptions{DType: tensor.BF16, NoPrefixCache: !cache})
			defer e.Close()
			if err := <-e.Ready(); err != nil {
				b.Fatal(err)
			}
			for range b.N {
				loads++
				prefixLoad(b, e, prof, loads)
			}
		})
	}
}

// prefixLoad runs BenchmarkCUDAEnginePrefix's load on e once, with prof
// on, its prompts drawn from seed.
func prefixLoad(b *testing.B, e *Engine, prof kernels.Profiler, seed uint64) {
	const clients, shared, own, tokens = 64, 512, 16, 32
	rng := rand.New(rand.NewPCG(3, seed))
	prefix := make([]int32, shared)
	for i := range prefix {
		prefix[i] = int32(rng.IntN(50256))
	}
	var rows0 dto.Metric
	if err := e.m.batchRows.Write(&rows0); err != nil {
		b.Fatal(err)
	}
	firsts := make([]time.Duration, clients)
	var wg sync.WaitGroup
	prof.StartProfile()
	start := time.Now()
	for i := range clients {
		p := slices.Clone(prefix)
		for range own {
			p = append(p, int32(rng.IntN(50256)))
		}
		ch, err := e.Submit(context.Background(), Request{Prompt: p, MaxTokens: tokens, IgnoreEOS: true})
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range events(ch, 1) {
				if firsts[i] == 0 && ev.Token >= 0 {
					firsts[i] = time.Since(start)
				}
				if ev.Err != nil {
					b.Error(ev.Err)
				}
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	var rows dto.Metric
	if err := e.m.batchRows.Write(&rows); err != nil {
		b.Fatal(err)
	}
	steps := rows.GetHistogram().GetSampleCount() - rows0.GetHistogram().GetSampleCount()
	slices.Sort(firsts)
	b.ReportMetric(float64(firsts[clients/2].Microseconds())/1000, "ms-TTFT-p50")
	b.Logf("%d requests in %v, %d steps (%d when every prompt joins the first) of %.0f rows in all: time to first token min %v, p50 %v, p90 %v, max %v",
		clients, wall.Round(time.Microsecond), steps, tokens, rows.GetHistogram().GetSampleSum()-rows0.GetHistogram().GetSampleSum(),
		firsts[0].Round(time.Microsecond), firsts[clients/2].Round(time.Microsecond), firsts[clients*9/10].Round(time.Microsecond), firsts[clients-1].Round(time.Microsecond))
	logOps(b, prof, wall, 16)
}
