// Command loadgen loads a leangrad GPT server (cmd/serve) on this machine
// through its OpenAI-compatible API and reports what its users would see:
// tokens per second in all, time to first token and inter-token latency
// percentiles, requests that failed, when each request was written (the
// client's and the connection's part of its time to first token), and
// from the server's /metrics its own mean time to first token, the
// key-value memory's waste, blocks, preemptions and prefix-cache hits.
//
//	serve -device cuda gpt2.st &
//	loadgen -clients 64 -requests 256 -max-tokens 128
//	loadgen -clients 64 -requests 512 -prompt 8-512 -max-tokens 16-512 -rate 200
//	loadgen -clients 64 -requests 64 -shared-prefix 512 -prompt 16 -max-tokens 32
//
// Each request is a prompt of random token ids (after a prefix that every
// prompt shares, with -shared-prefix) and generates exactly its max tokens
// (ignore_eos), streamed unless -stream=false. Clients send their next
// request when the last is answered, or, with -rate, requests arrive at
// that mean rate (Poisson) whatever the answers. The load is bounded by
// -requests and by -duration; it speaks only to loopback addresses.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leangrad/leangrad/cmd/internal/cmdenv"
	"github.com/leangrad/leangrad/cmd/internal/iopaths"
	"github.com/leangrad/leangrad/fileio"
)

func main() {
	cmdenv.Setup()
	os.Exit(cmdenv.Main("loadgen", func() int { return command(os.Args[1:], os.Stdout, os.Stderr) }))
}

// span is a range of lengths, drawn uniformly.
type span struct{ lo, hi int }

func (s *span) String() string {
	if s.lo == s.hi {
		return strconv.Itoa(s.lo)
	}
	return fmt.Sprintf("%d-%d", s.lo, s.hi)
}

// Set reads "N" or "LO-HI".
func (s *span) Set(v string) error {
	lo, hi, ok := strings.Cut(v, "-")
	if !ok {
		hi = lo
	}
	a, err1 := strconv.Atoi(strings.TrimSpace(lo))
	b, err2 := strconv.Atoi(strings.TrimSpace(hi))
	if err1 != nil || err2 != nil || a < 1 || b < a {
		return errors.New("want a count of tokens (128) or a range (16-512), each at least 1")
	}
	s.lo, s.hi = a, b
	return nil
}

func (s span) draw(rng *rand.Rand) int { return s.lo + rng.IntN(s.hi-s.lo+1) }

type options struct {
	url          string
	api          string
	model        string
	clients      int
	requests     int
	duration     time.Duration
	prompt       span
	maxTokens    span
	sharedPrefix int
	rate         float64
	temperature  float64
	stream       bool
	warm         bool
	seed         uint64
	jsonOut      string
}

func parse(args []string, stderr io.Writer) (*options, error) {
	o := &options{prompt: span{8, 8}, maxTokens: span{128, 128}}
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: loadgen [flags]\n\nLoads a leangrad GPT server on this machine through /v1/completions and reports its throughput,\nlatencies and key-value memory.\n%s\nFlags:\n", cmdenv.ExitStatuses("", map[int]string{cmdenv.ExitFailed: "failed (a request failed, or the server could not be read)"}))
		fs.PrintDefaults()
	}
	fs.StringVar(&o.url, "url", "http://127.0.0.1:8080", "the server (a loopback address)")
	fs.StringVar(&o.api, "api", "completions", "completions (OpenAI's /v1/completions) or generate (/v1/generate, which older servers have: prompts of random lowercase letters, a token each with the bytes tokenizer)")
	fs.StringVar(&o.model, "model", "", "the model to ask for (default: the one GET /v1/models lists)")
	fs.IntVar(&o.clients, "clients", 16, "clients sending at once (with -rate: the most requests in flight)")
	fs.IntVar(&o.requests, "requests", 0, "requests in all (default: 4 a client)")
	fs.DurationVar(&o.duration, "duration", 5*time.Minute, "send no request after this long; the run ends when those sent are answered")
	fs.Var(&o.prompt, "prompt", "each prompt's own tokens: a count or a range LO-HI")
	fs.Var(&o.maxTokens, "max-tokens", "the tokens each request generates: a count or a range LO-HI")
	fs.IntVar(&o.sharedPrefix, "shared-prefix", 0, "tokens every prompt begins with, the same for all")
	fs.Float64Var(&o.rate, "rate", 0, "requests per second arriving at random (Poisson); 0: each client sends its next when its last is answered")
	fs.Float64Var(&o.temperature, "temperature", 0, "sampling temperature (0: greedy)")
	fs.BoolVar(&o.stream, "stream", true, "stream the tokens as server-sent events (false: one answer a request)")
	fs.BoolVar(&o.warm, "warm", false, "open each client's connection before the load (GET /v1/models), as clients that keep theirs alive have, so that no request's time includes opening one")
	fs.Uint64Var(&o.seed, "seed", 1, "the prompts' and the arrivals' random seed")
	fs.StringVar(&o.jsonOut, "json", "", "also write the results as JSON to this file (atomically)")
	bad, _, err := cmdenv.ParseFlags(fs, args)
	if err != nil {
		return nil, err
	}
	say := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	if fs.NArg() > 0 {
		say("unexpected arguments %q: loadgen takes flags only", fs.Args())
	}
	if o.requests == 0 {
		o.requests = 4 * o.clients
	}
	switch {
	case o.clients < 1 || o.clients > 4096:
		say("-clients %d: want 1 to 4096", o.clients)
	case o.requests < 1 || o.requests > 10_000_000:
		say("-requests %d: want 1 to 10000000", o.requests)
	}
	if o.duration <= 0 {
		say("-duration %v: want a positive time", o.duration)
	}
	if o.sharedPrefix < 0 {
		say("-shared-prefix %d: want 0 or more tokens", o.sharedPrefix)
	}
	if !(o.rate >= 0) || math.IsInf(o.rate, 0) {
		say("-rate %v: want 0 (each client sends its next when its last is answered) or a finite rate a second", o.rate)
	}
	if !(o.temperature >= 0) || math.IsInf(o.temperature, 0) {
		say("-temperature %v: want 0 (greedy) or more", o.temperature)
	}
	if o.api != "completions" && o.api != "generate" {
		say("-api %s: want completions or generate", o.api)
	}
	if err := loopback(o.url); err != nil {
		say("-url %s: %v", o.url, err)
	}
	var paths iopaths.Set
	paths.Output("-json", o.jsonOut, false)
	bad = append(bad, paths.Problems()...)
	if len(bad) > 0 {
		return nil, errors.New(strings.Join(bad, "\n"))
	}
	o.url = strings.TrimSuffix(o.url, "/")
	return o, nil
}

// loopback refuses a URL whose host is not this machine's loopback.
func loopback(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if u.Scheme != "http" || u.Hostname() == "" {
		return errors.New("want http://HOST:PORT")
	}
	ips, err := net.LookupIP(u.Hostname())
	if err != nil {
		return err
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return fmt.Errorf("%s is not a loopback address: loadgen loads servers on this machine only", ip)
		}
	}
	return nil
}

// modelCard is what GET /v1/models says of the model.
type modelCard struct {
	ID      string `json:"id"`
	Context int    `json:"max_model_len"`
	Vocab   int    `json:"vocab_size"`
}

func command(args []string, stdout, stderr io.Writer) int {
	o, err := parse(args, stderr)
	if err != nil {
		return cmdenv.Refused("loadgen", stderr, err)
	}
	card := modelCard{ID: "the model", Context: math.MaxInt32, Vocab: 26} // /v1/generate: letters
	if o.api == "completions" {
		if card, err = model(o); err != nil {
			fmt.Fprintf(stderr, "loadgen: %s: %v\n", o.url, err)
			return cmdenv.ExitNothingRan
		}
	}
	if need := o.sharedPrefix + o.prompt.hi + o.maxTokens.hi; need > card.Context {
		fmt.Fprintf(stderr, "loadgen: -shared-prefix %d, -prompt %v and -max-tokens %v reach %d positions; %s's context is %d\n",
			o.sharedPrefix, &o.prompt, &o.maxTokens, need, card.ID, card.Context)
		return cmdenv.ExitUsage
	}
	before, err := scrape(o.url)
	if err != nil {
		fmt.Fprintf(stderr, "loadgen: %s/metrics: %v\n", o.url, err)
		return cmdenv.ExitNothingRan
	}
	r := run(o, card)
	after, err := scrape(o.url)
	if err != nil {
		fmt.Fprintf(stderr, "loadgen: %s/metrics after the run: %v\n", o.url, err)
		return cmdenv.ExitFailed
	}
	r.server(before, after, "/v1/"+map[bool]string{true: "generate", false: "completions"}[o.api == "generate"])
	r.print(stdout, o, card)
	if o.jsonOut != "" {
		b, _ := json.MarshalIndent(r, "", "  ")
		if err := fileio.WriteFile(o.jsonOut, append(b, '\n')); err != nil {
			fmt.Fprintf(stderr, "loadgen: -json %s: %v\n", o.jsonOut, err)
			return cmdenv.ExitFailed
		}
		fmt.Fprintf(stdout, "wrote %s (the run's report)\n", o.jsonOut)
	}
	if r.Failed > 0 {
		return cmdenv.ExitFailed
	}
	return 0
}

// model asks the server what it serves.
func model(o *options) (modelCard, error) {
	resp, err := http.Get(o.url + "/v1/models")
	if err != nil {
		return modelCard{}, err
	}
	defer resp.Body.Close()
	var list struct{ Data []modelCard }
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || resp.StatusCode != 200 || len(list.Data) == 0 {
		return modelCard{}, fmt.Errorf("GET /v1/models: %s, %v: is it a GPT server, warmed up?", resp.Status, err)
	}
	c := list.Data[0]
	if o.model != "" {
		c.ID = o.model
	}
	if c.Vocab <= 0 || c.Context <= 0 {
		return modelCard{}, fmt.Errorf("GET /v1/models says nothing of the model's vocabulary and context: not a leangrad server")
	}
	return c, nil
}

// results are a run's figures.
type results struct {
	Requests, Failed   int
	FirstError         string  `json:",omitempty"`
	Seconds            float64 // from the first request sent to the last answered
	PromptTokens       int
	GeneratedTokens    int
	TokensPerSecond    float64 // generated, in all
	TTFT, ITL, Latency percentiles
	// Sent is when each request was written, from its start (its part of
	// the time to first token that is the client's and the connection's),
	// and NewConnections how many requests opened one.
	Sent           percentiles
	NewConnections int
	// From /metrics: the waste sampled every 20 ms during the run, the
	// most blocks in use, and what the counters rose by.
	WasteMax, WasteMean float64
	ArenaWasteMax       float64
	BlocksUsedMax       int
	BlockSize           int `json:",omitempty"`
	Preemptions         int
	PrefixHits          int
	PrefixMisses        int
	// The mean time to first token the server measured, from each
	// request's arrival in its engine to its first token: what the
	// client's adds to it is HTTP's and the client's own.
	ServerTTFTMean float64 `json:",omitempty"`
	// The server's mean time from a streamed request's arrival over HTTP
	// to its first token flushed (leangrad_request_first_token_seconds):
	// what it adds to the engine's is its HTTP handler's share, what the
	// client's adds to it the connection's and the client's own.
	ServerFlushedMean float64 `json:",omitempty"`
	// The engine's steps during the run and their mean time in each
	// phase, in seconds (leangrad_step_seconds_total).
	Steps               int
	StepPhases          map[string]float64
	PoolAllocatedBefore int64
	PoolAllocatedAfter  int64

	ttft, itl, latency []float64
	sent               []float64
	samples            []metricsSnapshot
}

// percentiles are seconds.
type percentiles struct{ P50, P90, P99, Max float64 }

func percentilesOf(v []float64) percentiles {
	if len(v) == 0 {
		return percentiles{}
	}
	slices.Sort(v)
	at := func(q float64) float64 { return v[min(len(v)-1, int(math.Ceil(q*float64(len(v))))-1)] }
	return percentiles{at(0.5), at(0.9), at(0.99), v[len(v)-1]}
}

// run sends the requests and gathers what came back.
func run(o *options, card modelCard) *results {
	rng := rand.New(rand.NewPCG(o.seed, 0x10ad))
	prefix := make([]int32, o.sharedPrefix)
	for i := range prefix {
		prefix[i] = int32(rng.IntN(card.Vocab))
	}
	type job struct {
		prompt []int32
		max    int
		at     time.Duration // its arrival, with -rate
	}
	jobs := make([]job, o.requests)
	var at time.Duration
	for i := range jobs {
		p := slices.Clone(prefix)
		for range o.prompt.draw(rng) {
			p = append(p, int32(rng.IntN(card.Vocab)))
		}
		jobs[i] = job{prompt: p, max: o.maxTokens.draw(rng), at: at}
		if o.rate > 0 {
			at += time.Duration(rng.ExpFloat64() / o.rate * float64(time.Second))
		}
	}
	r := &results{}
	var mu sync.Mutex
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.clients, MaxConnsPerHost: o.clients}}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	sampled := make(chan []metricsSnapshot)
	go func() { sampled <- sample(ctx, o.url) }()
	if o.warm {
		warm(client, o)
	}
	start := time.Now()
	deadline := start.Add(o.duration)
	next := make(chan job)
	go func() {
		defer close(next)
		for _, j := range jobs {
			if o.rate > 0 {
				time.Sleep(time.Until(start.Add(j.at)))
			}
			if time.Now().After(deadline) {
				return
			}
			next <- j
		}
	}()
	var wg sync.WaitGroup
	for range o.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range next {
				var a answer
				if o.api == "generate" {
					a = generate(client, o, j.prompt, j.max)
				} else {
					a = complete(client, o, card.ID, j.prompt, j.max)
				}
				mu.Lock()
				r.Requests++
				if a.err != nil {
					r.Failed++
					if r.FirstError == "" {
						r.FirstError = a.err.Error()
					}
				} else {
					r.PromptTokens += len(j.prompt)
					r.GeneratedTokens += a.tokens
					r.ttft, r.sent = append(r.ttft, a.ttft), append(r.sent, a.sent)
					if a.fresh {
						r.NewConnections++
					}
					r.itl = append(r.itl, a.itl...)
					r.latency = append(r.latency, a.latency)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	r.Seconds = time.Since(start).Seconds()
	stop()
	r.samples = <-sampled
	r.TokensPerSecond = float64(r.GeneratedTokens) / r.Seconds
	r.TTFT, r.ITL, r.Latency, r.Sent = percentilesOf(r.ttft), percentilesOf(r.itl), percentilesOf(r.latency), percentilesOf(r.sent)
	return r
}

// sending is what the client's trace saw of a request: when it was
// written, from its start, and whether on a new connection (set from the
// transport's goroutines).
type sending struct {
	sent  atomic.Int64 // nanoseconds
	fresh atomic.Bool
}

// note copies what s saw into a.
func (s *sending) note(a *answer) {
	a.sent, a.fresh = time.Duration(s.sent.Load()).Seconds(), s.fresh.Load()
}

// warm opens a connection for each client: as many requests at once, each
// left idle in client's pool for the load to take. No answer is read until
// every request has one, so that none gives its connection back for
// another to reuse.
func warm(client *http.Client, o *options) {
	var answered, wg sync.WaitGroup
	answered.Add(o.clients)
	for range o.clients {
		wg.Go(func() {
			resp, err := client.Get(o.url + "/v1/models")
			answered.Done()
			answered.Wait()
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
}

// answer is one request's outcome.
type answer struct {
	tokens  int
	ttft    float64   // seconds to the first token (the whole answer, unstreamed)
	itl     []float64 // seconds between tokens, streamed
	latency float64
	err     error
	sent    float64 // seconds from its start to its request written
	fresh   bool    // on a new connection
}

// token times a token that came at now, the request sent at start and the
// last token at last, and returns now.
func (a *answer) token(start, last, now time.Time) time.Time {
	if a.ttft == 0 {
		a.ttft = now.Sub(start).Seconds()
	} else {
		a.itl = append(a.itl, now.Sub(last).Seconds())
	}
	return now
}

// postJSON posts v as JSON, begun at start, noting in s when the request
// was written and whether its connection was a new one; an answer other
// than 200 is an error with its status and the beginning of its body.
func postJSON(client *http.Client, url string, v any, start time.Time, s *sending) (*http.Response, error) {
	body, _ := json.Marshal(v)
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn:      func(c httptrace.GotConnInfo) { s.fresh.Store(!c.Reused) },
		WroteRequest: func(httptrace.WroteRequestInfo) { s.sent.Store(int64(time.Since(start))) },
	}))
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != 200 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		return nil, fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return resp, nil
}

// usage is a completion's count of tokens (OpenAI's usage object).
type usage struct {
	CompletionTokens int `json:"completion_tokens"`
}

// complete sends one completion and times it.
func complete(client *http.Client, o *options, model string, prompt []int32, maxTokens int) (a answer) {
	req := map[string]any{"model": model, "prompt": prompt, "max_tokens": maxTokens, "temperature": o.temperature, "ignore_eos": true}
	if o.stream {
		req["stream"], req["stream_options"] = true, map[string]bool{"include_usage": true}
	}
	var s sending
	defer s.note(&a)
	start := time.Now()
	resp, err := postJSON(client, o.url+"/v1/completions", req, start, &s)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	if !o.stream {
		var out struct{ Usage *usage }
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Usage == nil {
			return answer{err: fmt.Errorf("the answer: %v", err)}
		}
		a.latency = time.Since(start).Seconds()
		a.ttft, a.tokens = a.latency, out.Usage.CompletionTokens
		return a
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	last := start
	done := false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			break
		}
		var chunk struct {
			Choices []struct {
				FinishReason *string `json:"finish_reason"`
			}
			Usage *usage
			Error *struct{ Message string }
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			return answer{err: fmt.Errorf("an event %q: %v", data, err)}
		}
		if chunk.Error != nil {
			return answer{err: errors.New(chunk.Error.Message)}
		}
		if chunk.Usage != nil {
			a.tokens = chunk.Usage.CompletionTokens
		}
		if len(chunk.Choices) == 0 || chunk.Choices[0].FinishReason != nil {
			continue // the usage chunk, or the finish
		}
		last = a.token(start, last, time.Now())
	}
	if err := sc.Err(); err != nil || !done {
		return answer{err: fmt.Errorf("the stream ended before [DONE]: %v", err)}
	}
	a.latency = time.Since(start).Seconds()
	if a.tokens != maxTokens {
		return answer{err: fmt.Errorf("%d tokens of the %d asked (ignore_eos)", a.tokens, maxTokens)}
	}
	return a
}

// generate sends one /v1/generate request (streamed NDJSON, a line a
// token and a last one) and times it; its prompt is letters, a-z for 0-25.
func generate(client *http.Client, o *options, prompt []int32, maxTokens int) (a answer) {
	text := make([]byte, len(prompt))
	for i, t := range prompt {
		text[i] = byte('a' + t)
	}
	var s sending
	defer s.note(&a)
	start := time.Now()
	resp, err := postJSON(client, o.url+"/v1/generate", map[string]any{"prompt": string(text), "max_tokens": maxTokens, "temperature": o.temperature},
		start, &s)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	last := start
	for {
		var line struct {
			Token  *int32
			Done   bool
			Tokens int
			Error  string
		}
		if err := dec.Decode(&line); err != nil {
			return answer{err: fmt.Errorf("the stream ended before its last line: %v", err)}
		}
		now := time.Now()
		switch {
		case line.Error != "":
			return answer{err: errors.New(line.Error)}
		case line.Done:
			a.latency, a.tokens = now.Sub(start).Seconds(), line.Tokens
			return a
		case line.Token != nil:
			last = a.token(start, last, now)
		}
	}
}

// metricsSnapshot is what the run reads from /metrics.
type metricsSnapshot map[string]float64

// scrape reads the server's samples from /metrics (Prometheus' text
// format), each by its name and labels as written there.
func scrape(base string) (metricsSnapshot, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, errors.New(resp.Status)
	}
	m := metricsSnapshot{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		name, v, ok := l[:max(i, 0)], l[i+1:], i > 0
		if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); ok && err == nil {
			m[name] = f
		}
	}
	return m, sc.Err()
}

// sample scrapes /metrics every 20 ms until ctx ends.
func sample(ctx context.Context, base string) []metricsSnapshot {
	var out []metricsSnapshot
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return out
		case <-t.C:
			if m, err := scrape(base); err == nil {
				out = append(out, m)
			}
		}
	}
}

// server fills the figures that come from /metrics, the load's requests
// having gone to path.
func (r *results) server(before, after metricsSnapshot, path string) {
	var sum float64
	n := 0
	for _, m := range r.samples {
		if m["leangrad_kv_blocks_used"] == 0 {
			continue // idle: no block, no waste to speak of
		}
		w := m["leangrad_kv_waste_ratio"]
		r.WasteMax, sum, n = max(r.WasteMax, w), sum+w, n+1
		r.ArenaWasteMax = max(r.ArenaWasteMax, m["leangrad_kv_arena_waste_ratio"])
		r.BlocksUsedMax = max(r.BlocksUsedMax, int(m["leangrad_kv_blocks_used"]))
	}
	if n > 0 {
		r.WasteMean = sum / float64(n)
	}
	rose := func(name string) int { return int(after[name] - before[name]) }
	r.Preemptions = rose("leangrad_preemptions_total")
	r.PrefixHits, r.PrefixMisses = rose("leangrad_prefix_cache_hits_total"), rose("leangrad_prefix_cache_misses_total")
	r.BlockSize = int(after["leangrad_kv_block_size"])
	r.Steps = rose("leangrad_steps_total")
	mean := func(histogram, labels string) float64 {
		if n := after[histogram+"_count"+labels] - before[histogram+"_count"+labels]; n > 0 {
			return (after[histogram+"_sum"+labels] - before[histogram+"_sum"+labels]) / n
		}
		return 0
	}
	r.ServerTTFTMean = mean("leangrad_time_to_first_token_seconds", "")
	r.ServerFlushedMean = mean("leangrad_request_first_token_seconds", `{path="`+path+`"}`)
	r.StepPhases = map[string]float64{}
	for _, p := range phases {
		k := `leangrad_step_seconds_total{phase="` + p + `"}`
		if r.Steps > 0 {
			r.StepPhases[p] = (after[k] - before[k]) / float64(r.Steps)
		}
	}
	r.PoolAllocatedBefore, r.PoolAllocatedAfter = int64(before["leangrad_pool_allocated_bytes"]), int64(after["leangrad_pool_allocated_bytes"])
}

// phases are the engine's step phases, in order.
var phases = []string{"schedule", "launch", "wait", "deliver"}

func (r *results) print(w io.Writer, o *options, card modelCard) {
	ms := func(p percentiles) string {
		return fmt.Sprintf("p50 %.2f, p90 %.2f, p99 %.2f, max %.2f ms", p.P50*1e3, p.P90*1e3, p.P99*1e3, p.Max*1e3)
	}
	arrivals := fmt.Sprintf("%d clients", o.clients)
	if o.rate > 0 {
		arrivals = fmt.Sprintf("%.0f requests/s arriving (at most %d in flight)", o.rate, o.clients)
	}
	if o.warm {
		arrivals += ", their connections opened first"
	}
	prompt := fmt.Sprintf("prompts of %v tokens", &o.prompt)
	if o.sharedPrefix > 0 {
		prompt = fmt.Sprintf("prompts of a shared %d tokens and %v of their own", o.sharedPrefix, &o.prompt)
	}
	how := "streamed"
	if !o.stream {
		how = "not streamed"
	}
	fmt.Fprintf(w, "%s, %s: %d requests (%s, %v tokens each, temperature %v, %s)\n", card.ID, arrivals, r.Requests, prompt, &o.maxTokens, o.temperature, how)
	fmt.Fprintf(w, "  %d answered, %d failed in %.2f s: %.0f tokens/s generated in all (%d tokens)\n", r.Requests-r.Failed, r.Failed, r.Seconds, r.TokensPerSecond, r.GeneratedTokens)
	if r.FirstError != "" {
		fmt.Fprintf(w, "  the first failure: %s\n", r.FirstError)
	}
	fmt.Fprintf(w, "  time to first token %s", ms(r.TTFT))
	if r.ServerTTFTMean > 0 {
		fmt.Fprintf(w, " (the server's own, from arrival in its engine: mean %.2f ms", r.ServerTTFTMean*1e3)
		if r.ServerFlushedMean > 0 {
			fmt.Fprintf(w, "; from arrival over HTTP to the first token flushed: mean %.2f ms", r.ServerFlushedMean*1e3)
		}
		fmt.Fprint(w, ")")
	}
	fmt.Fprintf(w, "\n  requests written %s after they began, %d on new connections\n", ms(r.Sent), r.NewConnections)
	if o.stream {
		fmt.Fprintf(w, "  inter-token latency %s\n", ms(r.ITL))
	}
	fmt.Fprintf(w, "  request latency %s\n", ms(r.Latency))
	fmt.Fprintf(w, "  key-value memory (%d samples): empty slots at most %.2f%% of those allocated (mean %.2f%%), at most %.2f%% of the memory; at most %d blocks of %d in use; %d preemptions; prefix cache %d hits, %d misses\n",
		len(r.samples), 100*r.WasteMax, 100*r.WasteMean, 100*r.ArenaWasteMax, r.BlocksUsedMax, r.BlockSize, r.Preemptions, r.PrefixHits, r.PrefixMisses)
	if r.Steps > 0 {
		fmt.Fprintf(w, "  %d steps (%.1f tokens generated a step): ", r.Steps, float64(r.GeneratedTokens)/float64(r.Steps))
		for i, p := range phases {
			fmt.Fprintf(w, "%s%s %.0f µs", map[bool]string{true: "", false: ", "}[i == 0], p, r.StepPhases[p]*1e6)
		}
		fmt.Fprintln(w, " a step on average")
	}
	fmt.Fprintf(w, "  the server's pool: %d bytes allocated before, %d after\n", r.PoolAllocatedBefore, r.PoolAllocatedAfter)
}
