package serve

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
	"github.com/leangrad/leangrad/train"
	"github.com/prometheus/client_golang/prometheus"
)

// EngineOptions configure an Engine; the zero value of each field is its
// default.
type EngineOptions struct {
	// BlockSize is the positions a key-value block holds (default 16,
	// vLLM's): a sequence wastes at most BlockSize − 1 slots.
	BlockSize int
	// KVMemory sizes the key-value memory once, at start: bytes, or a
	// fraction of what is free after the model and the step's workspace
	// (default: room for MaxSeqs sequences of the whole context, at most
	// nine tenths of what is free).
	KVMemory memory.Budget
	// MaxSeqs bounds the sequences a step decodes (default 256 on a GPU,
	// 16 on the CPU), and with it the captured steps' batch sizes.
	MaxSeqs int
	// MaxBatchTokens bounds the tokens one step runs, prompts' included
	// (default 2048 and at least MaxSeqs): a long prompt is prefilled in
	// chunks beside the others' decoding, never stalling them for its
	// whole length.
	MaxBatchTokens int
	// MaxQueue bounds the requests waiting and running (default 1024);
	// beyond it Submit returns ErrOverloaded.
	MaxQueue int
	// NoPrefixCache turns the prefix cache off (Note [paged key-value
	// memory]).
	NoPrefixCache bool
	// StaticBatching admits new requests only when every running one has
	// ended, as a server of static batches does: for comparison.
	StaticBatching bool
	// DType is what the model computes in (default BF16 on a GPU, F32 on
	// the CPU); the keys and values are stored in it.
	DType tensor.DType
	// NoCapture runs every step eagerly, also on a GPU.
	NoCapture bool
}

// Engine serves a GPT to many requests at once (Note [continuous
// batching]): each step runs the next token of every running sequence in
// one batched forward through paged key-value memory, beside chunks of the
// prompts waiting, and samples on the device.
type Engine struct {
	dev    *tensor.Device // the engine's own session of the model's device
	g      *nn.GPT
	tok    datasets.Tokenizer
	eot    int32 // the end-of-text token, -1 for none
	name   string
	opts   EngineOptions
	kv     *nn.PagedKV
	blocks *BlockManager
	width  int          // a block table's blocks: the context's
	nblock atomic.Int64 // the key-value memory's blocks, once warmed up
	packed atomic.Int64 // the pool bytes of the weights packed for the products (autograd.PackParameters)
	pad    bool         // eager steps run at bucketed sizes (Note [continuous batching], step 4)

	submit  chan *sequence
	queued  atomic.Int64 // samples submitted and not ended
	waiting []*sequence
	running []*sequence
	order   uint64
	static  int // with StaticBatching: the waiting sequences of the batch still to admit
	runner  *runner
	m       *engineMetrics
	outbox  []letter      // events for the samples' channels, posted to the courier each iteration
	mail    chan []letter // the courier's (Note [events by courier])

	ready   chan error
	stop    chan struct{}
	done    chan struct{}
	closing sync.RWMutex // Submit sends under its read lock, Close sets closed under its write lock
	closed  bool
	started bool // the loop was started
}

// Note [continuous batching]: the engine's loop owns the key-value
// memory and the batch. Each iteration:
//
//  1. takes the requests submitted since the last one into the waiting
//     queue (a request is refused with ErrOverloaded past MaxQueue), and
//     drops the sequences whose context was cancelled;
//  2. gives each running sequence the slot of its next token; when the
//     memory has no block left it preempts the newest sequence (its blocks
//     freed, its tokens put back at the head of the queue to be prefilled
//     again: recompute, not swap), so running out of memory never fails a
//     request;
//  3. admits waiting sequences, oldest first, while MaxSeqs and the step's
//     token budget (MaxBatchTokens) allow: each takes its prompt's blocks,
//     its first full blocks from the prefix cache where they match, and
//     runs as much of the rest of its prompt as the budget leaves (chunked
//     prefill); a prompt's last chunk yields its first token;
//  4. runs the step: on a GPU the decoding rows (a row a running sequence)
//     replay the CUDA graph captured for their count rounded up to a power
//     of two (padding rows write nowhere and read block 0), and the
//     prompts' chunks run eagerly behind them, their kernels launched while
//     the graph runs; on the CPU both run as one eager forward. On a GPU
//     an eager step's rows are padded to one of a few sizes (rowBucket)
//     and its sequences to a power of two, and the warm-up runs each size
//     once: a matrix product's algorithm is chosen by timing its
//     candidates the first time its shape is seen, a wait for the device
//     that ragged sizes would pay on almost every step. The sampler runs
//     on the device and only the tokens and their log-probabilities come
//     back;
//  5. sends each token to its request's channel (by courier: Note
//     [events by courier]), and ends the samples that reached MaxTokens, a
//     stop string, the end-of-text token or the context, freeing their
//     blocks at once.
//
// With StaticBatching, step 3 takes a batch of the waiting sequences (up
// to MaxSeqs) only when nothing runs, and admits no other until all of it
// ended, as a server of static batches would: the same engine, for
// comparison.

// NewEngine starts an engine of the GPT g (in evaluation mode) on dev; its
// loop warms up (sizes and allocates the key-value memory, captures the
// decoding steps) before it serves: Ready says when. name is what the API
// calls the model.
func NewEngine(dev *tensor.Device, g *nn.GPT, tok datasets.Tokenizer, name string, o EngineOptions) *Engine {
	e := newEngine(dev, g, tok, name, o)
	e.start()
	return e
}

// newEngine is NewEngine without its loop: start begins the warm-up.
func newEngine(dev *tensor.Device, g *nn.GPT, tok datasets.Tokenizer, name string, o EngineOptions) *Engine {
	gpu := train.ModeFor(dev, true) == train.Captured
	if o.BlockSize <= 0 {
		o.BlockSize = 16
	}
	if o.MaxSeqs <= 0 {
		o.MaxSeqs = 16
		if gpu {
			o.MaxSeqs = 256
		}
	}
	if o.MaxBatchTokens <= 0 {
		o.MaxBatchTokens = 2048
	}
	o.MaxBatchTokens = max(o.MaxBatchTokens, o.MaxSeqs)
	if o.MaxQueue <= 0 {
		o.MaxQueue = 1024
	}
	if o.DType == 0 {
		o.DType = tensor.F32
		if gpu {
			o.DType = tensor.BF16
		}
	}
	if !gpu {
		o.NoCapture = true
	}
	e := &Engine{dev: dev.Session(), g: g, tok: tok, eot: -1, name: name, opts: o, pad: gpu,
		width:  (g.Cfg.Context + o.BlockSize - 1) / o.BlockSize,
		submit: make(chan *sequence, o.MaxQueue), ready: make(chan error, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
	if tok.Name() == datasets.GPT2Tokens {
		e.eot = 50256 // <|endoftext|>
	}
	e.m = newEngineMetrics(e)
	return e
}

// Ready is closed, or receives an error, when the warm-up ends.
func (e *Engine) Ready() <-chan error { return e.ready }

// Prepared says what the warm-up made: the key-value memory and the
// decoding steps.
func (e *Engine) Prepared() string {
	if e.kv == nil {
		return "not warmed up"
	}
	per := e.g.KVBlockBytes(e.opts.DType, e.opts.BlockSize)
	steps := fmt.Sprintf("decoding steps of up to %d sequences run eagerly", e.opts.MaxSeqs)
	if len(e.runner.graphs) > 0 {
		steps = fmt.Sprintf("decoding steps of %v sequences (with and without log-probabilities) captured as CUDA graphs over one arena of %s",
			buckets(e.opts.MaxSeqs), memory.Bytes(e.runner.arena.Size()))
	}
	if n := e.packed.Load(); n > 0 {
		steps += fmt.Sprintf(", their products reading the weights packed once (%s)", memory.Bytes(n))
	}
	return fmt.Sprintf("a key-value memory of %d blocks of %d positions in %v (%s: the whole context of %.1f sequences); %s",
		e.kv.Blocks, e.opts.BlockSize, e.opts.DType, memory.Bytes(int64(e.kv.Blocks)*per), float64(e.kv.Blocks-1)/float64(e.width), steps)
}

// Model is the name the API serves the model as.
func (e *Engine) Model() string { return e.name }

// Close stops the loop (the requests still running end with an error)
// and frees the key-value memory.
func (e *Engine) Close() {
	e.closing.Lock()
	if !e.closed {
		e.closed = true
		close(e.stop)
		if !e.started { // no loop to stop
			e.started = true
			e.ready <- errors.New("the engine was closed before its warm-up")
			close(e.done)
		}
	}
	e.closing.Unlock()
	<-e.done
}

// Submit queues a request and returns the channel its events come on, one
// a token and a last one a sample (with its Finish, or Err): the channel
// holds them all, so the engine never waits for a slow reader. Cancelling
// ctx ends the request's samples at the next step. A request that cannot
// run is a *RequestError; a full queue, ErrOverloaded.
func (e *Engine) Submit(ctx context.Context, r Request) (<-chan Event, error) {
	if err := e.check(&r); err != nil {
		return nil, err
	}
	if e.queued.Add(int64(r.N)) > int64(e.opts.MaxQueue) {
		e.queued.Add(-int64(r.N))
		e.m.refused()
		return nil, ErrOverloaded
	}
	out := make(chan Event, r.N*(r.MaxTokens+1))
	now := time.Now()
	first := &sequence{ctx: ctx, req: &r, out: out, tokens: slices.Clone(r.Prompt), prompt: len(r.Prompt), arrived: now}
	seqs := []*sequence{first}
	for i := 1; i < r.N; i++ {
		seqs = append(seqs, &sequence{ctx: ctx, req: &r, index: i, out: out, tokens: slices.Clone(r.Prompt), prompt: len(r.Prompt),
			arrived: now})
	}
	first.forks = seqs[1:]
	e.closing.RLock()
	defer e.closing.RUnlock()
	if e.closed {
		e.queued.Add(-int64(r.N))
		return nil, errors.New("the engine is closed")
	}
	e.submit <- first // never blocks: it holds MaxQueue, and each request counts at least one sample there
	return out, nil
}

// check validates r for this engine and fills its defaults.
func (e *Engine) check(r *Request) error {
	return r.check(e.g.Cfg.Context, e.g.Cfg.Vocab, e.kvBlocks(), e.opts.BlockSize, e.opts.MaxSeqs)
}

// KVStats is the key-value memory's state at the last step, and the most
// waste (KVStats.Waste, KVStats.ArenaWaste) seen at any step since the
// engine started.
func (e *Engine) KVStats() (now KVStats, maxWaste, maxArenaWaste float64) {
	e.m.mu.Lock()
	defer e.m.mu.Unlock()
	return e.m.kv, e.m.maxWaste, e.m.maxArena
}

// Collectors are the engine's Prometheus collectors, for a service's own
// registry.
func (e *Engine) Collectors() []prometheus.Collector { return e.m.collectors() }

// kvBlocks is the key-value memory's blocks, once it exists (before, as
// many as a request could ever need).
func (e *Engine) kvBlocks() int {
	if n := e.nblock.Load(); n > 0 {
		return int(n)
	}
	return 1 << 30
}

// start starts the loop (once, and not after Close).
func (e *Engine) start() {
	e.closing.Lock()
	defer e.closing.Unlock()
	if !e.started && !e.closed {
		e.started = true
		go e.loop()
	}
}

// loop is the engine: its goroutine does all of the engine's device work,
// under no gradient and, with a 16-bit DType, autocast, the model's
// weights cast once for its whole life and, on the CPU, packed for its
// products once (autograd.PackParameters).
func (e *Engine) loop() {
	defer close(e.done)
	defer e.startCourier()()
	var err error
	ag.NoGrad(e.dev, func() {
		run := func() {
			release := ag.CastParameters(e.dev, e.g.ProductParameters())
			defer release()
			defer ag.PackParameters(e.dev, e.g.ProductParameters())()
			e.packed.Store(ag.PackedBytes(e.dev))
			if err = e.warmUp(); err != nil {
				e.ready <- err
				return
			}
			close(e.ready)
			e.serve()
		}
		if e.opts.DType.Half() {
			ag.Autocast(e.dev, e.opts.DType, run)
		} else {
			run()
		}
	})
	e.shutdown(err)
}

// serve runs steps until Close.
func (e *Engine) serve() {
	for {
		e.post()
		idle := len(e.waiting) == 0 && len(e.running) == 0
		if idle {
			select {
			case s := <-e.submit:
				e.enqueue(s)
			case <-e.stop:
				return
			}
		}
		for drained := false; !drained; {
			select {
			case s := <-e.submit:
				e.enqueue(s)
			case <-e.stop:
				return
			default:
				drained = true
			}
		}
		start := time.Now()
		e.cancelled()
		b := e.schedule()
		if b == nil {
			continue
		}
		scheduled := time.Now()
		if err := e.runner.run(b); err != nil {
			e.failAll(fmt.Errorf("the model failed: %w", err))
			continue
		}
		ran := time.Now()
		e.deliver(b)
		e.m.sampleKV()
		e.m.step(scheduled.Sub(start), e.runner.launched.Sub(scheduled), ran.Sub(e.runner.launched), time.Since(ran))
	}
}

// enqueue takes a submitted request into the waiting queue.
func (e *Engine) enqueue(s *sequence) {
	e.order++
	s.order = e.order
	e.waiting = append(e.waiting, s)
	e.m.gauges()
}

// cancelled ends the samples whose requests went away.
func (e *Engine) cancelled() {
	keep := func(list []*sequence) []*sequence {
		return slices.DeleteFunc(list, func(s *sequence) bool {
			if err := s.ctx.Err(); err != nil {
				e.end(s, "", err)
				for _, f := range s.forks { // forks not yet made end with their parent
					e.end(f, "", err)
				}
				s.forks = nil
				return true
			}
			return false
		})
	}
	e.waiting, e.running = keep(e.waiting), keep(e.running)
}

// end ends a sample: its blocks go back, its last event goes out.
func (e *Engine) end(s *sequence, finish string, err error) {
	if s.table != nil {
		e.blocks.Release(s.table)
		s.table = nil
	}
	ev := Event{Index: s.index, Token: -1, Finish: finish, Err: err}
	if err == nil {
		ev.Text = s.text.rest()
	}
	e.emit(s, ev)
	e.queued.Add(-1)
	e.m.ended(s, finish, err)
}

// failAll ends every sample with err: a step that failed (the device).
func (e *Engine) failAll(err error) {
	for _, s := range append(e.running, e.waiting...) {
		e.end(s, "", err)
		for _, f := range s.forks {
			e.end(f, "", err)
		}
	}
	e.running, e.waiting = nil, nil
}

// shutdown ends what remains, after the loop stopped, and frees the memory.
func (e *Engine) shutdown(err error) {
	if err == nil {
		err = errors.New("the engine is closed")
	}
	e.closing.Lock() // no Submit after this: a loop that failed its warm-up takes no more
	if !e.closed {
		e.closed = true
		close(e.stop)
	}
	e.closing.Unlock()
	for {
		select {
		case s := <-e.submit:
			e.waiting = append(e.waiting, s)
			continue
		default:
		}
		break
	}
	if e.blocks != nil {
		e.failAll(err)
	} else {
		for _, s := range e.waiting {
			for _, x := range append([]*sequence{s}, s.forks...) {
				e.emit(x, Event{Index: x.index, Token: -1, Err: err})
			}
		}
	}
	if e.runner != nil {
		e.runner.release()
	}
	if e.kv != nil {
		e.kv.Release()
	}
}

// preempt frees the newest running sequence's blocks and puts it back at
// the head of the queue, to be prefilled again when it resumes.
func (e *Engine) preempt() *sequence {
	i := 0
	for j, s := range e.running {
		if s.order > e.running[i].order {
			i = j
		}
	}
	s := e.running[i]
	e.running = slices.Delete(e.running, i, i+1)
	e.blocks.Release(s.table)
	s.table, s.done = nil, 0
	e.waiting = slices.Insert(e.waiting, 0, s)
	if e.opts.StaticBatching {
		e.static++ // still of the batch
	}
	e.m.preempted()
	return s
}

// letter is an event on its way to a sample's channel.
type letter struct {
	out chan<- Event
	ev  Event
}

// emit queues ev for s's channel; the loop posts the queue at the top of
// each iteration.
func (e *Engine) emit(s *sequence, ev Event) { e.outbox = append(e.outbox, letter{s.out, ev}) }

// post hands the queued events to the courier; the next step's queue
// starts with room for as many.
func (e *Engine) post() {
	if n := len(e.outbox); n > 0 {
		e.mail <- e.outbox
		e.outbox = make([]letter, 0, n)
	}
}

// startCourier starts the goroutine that sends the posted events, in the
// order posted, and returns what ends it: the events still queued are
// posted and all sent before it returns.
func (e *Engine) startCourier() (end func()) {
	e.mail = make(chan []letter, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for batch := range e.mail {
			for _, l := range batch {
				l.out <- l.ev // never blocks: a request's channel holds all of its events
			}
		}
	}()
	return func() {
		e.post()
		close(e.mail)
		<-done
	}
}

// Note [events by courier]: a step's events go to their requests'
// channels from a goroutine of their own, while the loop schedules and
// launches the next step. A send to a channel whose reader is parked
// readies that goroutine and may wake an idle processor for it; over a
// step's hundreds of samples that is host time between steps, when the
// device waits. The loop queues the events (emit) and hands each
// iteration's to the courier in one send (post), before it takes the
// submitted requests; one courier keeps every sample's events in order,
// its ending event last. The loop updates its counters and gives back a
// sample's blocks before it posts the sample's ending event, so a reader
// that sees a sample's end sees them too.
