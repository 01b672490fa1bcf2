package serve

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the server's Prometheus collectors, leangrad_-prefixed: its
// requests, the image batcher's batches, the pool and, for a GPT, its
// engine's (engineMetrics). Server.Collectors hands them to a service's
// own registry; /metrics serves the server's.
type metrics struct {
	registry *prometheus.Registry
	all      []prometheus.Collector // what the registry holds
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	first    *prometheus.HistogramVec // a streamed request's first token flushed
	images   prometheus.Histogram
	empties  prometheus.Counter
	emptySec prometheus.Counter

	mu                       sync.Mutex
	imageTotal, batchesTotal int64
}

// latencyBuckets are the request-latency histogram's bounds, in seconds.
var latencyBuckets = []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30}

func newMetrics(s *Server) *metrics {
	var bounds []float64
	for _, b := range s.buckets {
		bounds = append(bounds, float64(b))
	}
	m := &metrics{registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "leangrad_requests_total",
			Help: "Requests answered, by path (\"other\": a path no endpoint serves) and HTTP status."}, []string{"path", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "leangrad_request_duration_seconds",
			Help: "Time from a request's arrival to its answer (its last byte, streamed).", Buckets: latencyBuckets}, []string{"path"}),
		first: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "leangrad_request_first_token_seconds",
			Help:    "Time from a streamed request's arrival to its first token written and flushed, by path: beside the engine's leangrad_time_to_first_token_seconds, what the HTTP server adds.",
			Buckets: latencyBuckets}, []string{"path"}),
		images: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "leangrad_batch_images",
			Help: "Images in each forward pass the batcher ran.", Buckets: bounds}),
		empties: prometheus.NewCounter(prometheus.CounterOpts{Name: "leangrad_empty_cache_calls_total",
			Help: "EmptyCache calls made by -empty-cache-every."}),
		emptySec: prometheus.NewCounter(prometheus.CounterOpts{Name: "leangrad_empty_cache_seconds_total",
			Help: "Time spent inside those calls."}),
	}
	pool := func(name, help string, v func(memory.Stats) int64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help},
			func() float64 { return float64(v(s.dev.Allocator().Stats())) })
	}
	m.register(m.requests, m.latency, m.empties, m.emptySec,
		pool("leangrad_pool_allocated_bytes", "Bytes of the device's pool held by tensors.", func(st memory.Stats) int64 { return st.Allocated[memory.All].Current }),
		pool("leangrad_pool_reserved_bytes", "Bytes the pool holds from the device, cached blocks included.", func(st memory.Stats) int64 { return st.Reserved[memory.All].Current }),
		pool("leangrad_pool_peak_allocated_bytes", "The most bytes tensors held at once since the process started.", func(st memory.Stats) int64 { return st.Allocated[memory.All].Peak }),
		pool("leangrad_pool_peak_reserved_bytes", "The most bytes the pool held at once.", func(st memory.Stats) int64 { return st.Reserved[memory.All].Peak }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "leangrad_tensor_leaks_total",
			Help: "Tensors the garbage collector found unreleased (their memory went back)."}, func() float64 { return float64(tensor.Leaks()) }))
	if s.arch.Text {
		m.register(m.first)
	} else {
		m.register(m.images, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "leangrad_queue_requests",
			Help: "Requests waiting for the device."}, func() float64 { return float64(len(s.queue)) }))
	}
	return m
}

// register adds collectors to the registry.
func (m *metrics) register(cs ...prometheus.Collector) {
	m.registry.MustRegister(cs...)
	m.all = append(m.all, cs...)
}

func (m *metrics) request(path string, code int, d time.Duration) {
	m.requests.WithLabelValues(path, fmt.Sprint(code)).Inc()
	m.latency.WithLabelValues(path).Observe(d.Seconds())
}

// firstFlushed notes a streamed request to path whose first token was
// flushed d after its arrival.
func (m *metrics) firstFlushed(path string, d time.Duration) {
	m.first.WithLabelValues(path).Observe(d.Seconds())
}

func (m *metrics) batch(images int) {
	m.images.Observe(float64(images))
	m.mu.Lock()
	m.imageTotal += int64(images)
	m.batchesTotal++
	m.mu.Unlock()
}

// batchTotals are the images and forward passes the batcher ran so far.
func (m *metrics) batchTotals() (images, batches int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.imageTotal, m.batchesTotal
}

func (m *metrics) emptied(d time.Duration) {
	m.empties.Inc()
	m.emptySec.Add(d.Seconds())
}

// handler serves the registry in Prometheus' text format.
func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}

// engineMetrics are a GPT engine's collectors.
type engineMetrics struct {
	e            *Engine
	ttft, itl    prometheus.Histogram
	batchSeqs    prometheus.Histogram
	batchRows    prometheus.Histogram
	running      prometheus.Gauge
	waiting      prometheus.Gauge
	blocks       prometheus.GaugeFunc
	blockSize    prometheus.GaugeFunc
	blocksUsed   prometheus.Gauge
	blocksFree   prometheus.Gauge
	waste        prometheus.Gauge
	arenaWaste   prometheus.Gauge
	preemptions  prometheus.Counter
	hits, misses prometheus.CounterFunc
	tokens       prometheus.Counter
	finished     *prometheus.CounterVec
	overloaded   prometheus.Counter
	steps        prometheus.Counter
	stepSeconds  *prometheus.CounterVec
	mu           sync.Mutex
	kv           KVStats // the memory's state at the last step
	maxWaste     float64 // the most waste seen at any step
	maxArena     float64 // the most arena waste seen at any step
}

// tokenBuckets are the inter-token latency histogram's bounds, in seconds.
var tokenBuckets = []float64{0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.2, 0.5, 1}

func newEngineMetrics(e *Engine) *engineMetrics {
	var bounds []float64
	for _, b := range buckets(e.opts.MaxSeqs) {
		bounds = append(bounds, float64(b))
	}
	return &engineMetrics{e: e,
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "leangrad_time_to_first_token_seconds",
			Help: "Time from a sample's submission to its first token.", Buckets: latencyBuckets}),
		itl: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "leangrad_inter_token_latency_seconds",
			Help: "Time between a sample's consecutive tokens.", Buckets: tokenBuckets}),
		batchSeqs: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "leangrad_batch_sequences",
			Help: "Sequences each step ran.", Buckets: bounds}),
		batchRows: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "leangrad_batch_tokens",
			Help: "Tokens each step ran, prefills' included.", Buckets: prometheus.ExponentialBuckets(1, 2, 14)}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{Name: "leangrad_running_sequences", Help: "Sequences decoding."}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{Name: "leangrad_waiting_sequences",
			Help: "Sequences waiting to run, or part way through their prefill."}),
		blocks: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "leangrad_kv_blocks",
			Help: "Key-value blocks in the memory (0 before the warm-up sized it)."}, func() float64 { return float64(e.nblock.Load()) }),
		blockSize: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "leangrad_kv_block_size",
			Help: "Positions a key-value block holds."}, func() float64 { return float64(e.opts.BlockSize) }),
		blocksUsed: prometheus.NewGauge(prometheus.GaugeOpts{Name: "leangrad_kv_blocks_used", Help: "Key-value blocks some sequence holds."}),
		blocksFree: prometheus.NewGauge(prometheus.GaugeOpts{Name: "leangrad_kv_blocks_free",
			Help: "Key-value blocks no sequence holds (cached prefix blocks among them)."}),
		waste: prometheus.NewGauge(prometheus.GaugeOpts{Name: "leangrad_kv_waste_ratio",
			Help: "Slots of the held key-value blocks that hold no token, over the slots held."}),
		arenaWaste: prometheus.NewGauge(prometheus.GaugeOpts{Name: "leangrad_kv_arena_waste_ratio",
			Help: "Slots of the held key-value blocks that hold no token, over all the memory's slots."}),
		preemptions: prometheus.NewCounter(prometheus.CounterOpts{Name: "leangrad_preemptions_total",
			Help: "Sequences preempted for want of key-value blocks (to be prefilled again)."}),
		hits: prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "leangrad_prefix_cache_hits_total",
			Help: "Prompt blocks found in the prefix cache."}, func() float64 { kv, _, _ := e.KVStats(); return float64(kv.Hits) }),
		misses: prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "leangrad_prefix_cache_misses_total",
			Help: "Full prompt blocks not in the prefix cache."}, func() float64 { kv, _, _ := e.KVStats(); return float64(kv.Misses) }),
		tokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "leangrad_generated_tokens_total", Help: "Tokens generated."}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "leangrad_samples_total",
			Help: "Samples ended, by finish reason (length, stop, error)."}, []string{"finish"}),
		overloaded: prometheus.NewCounter(prometheus.CounterOpts{Name: "leangrad_overloaded_total",
			Help: "Requests refused because the queue was full."}),
		steps: prometheus.NewCounter(prometheus.CounterOpts{Name: "leangrad_steps_total", Help: "Steps the engine ran."}),
		stepSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "leangrad_step_seconds_total",
			Help: "Time in the engine's steps, by phase: schedule (the batch made), launch (its inputs written, its work queued), " +
				"wait (for the device, its outputs read) and deliver (the tokens taken by their sequences, their events queued for the courier)."}, []string{"phase"}),
	}
}

// collectors are the engine's collectors.
func (m *engineMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.ttft, m.itl, m.batchSeqs, m.batchRows, m.running, m.waiting, m.blocks, m.blockSize, m.blocksUsed, m.blocksFree,
		m.waste, m.arenaWaste, m.preemptions, m.hits, m.misses, m.tokens, m.finished, m.overloaded, m.steps, m.stepSeconds}
}

func (m *engineMetrics) batch(w *work) {
	m.batchSeqs.Observe(float64(w.seqs()))
	m.batchRows.Observe(float64(len(w.dec.tokens) + len(w.pre.tokens)))
}

func (m *engineMetrics) token(s *sequence, now time.Time) {
	if s.last.IsZero() {
		m.ttft.Observe(now.Sub(s.arrived).Seconds())
	} else {
		m.itl.Observe(now.Sub(s.last).Seconds())
	}
	s.last = now
	m.tokens.Inc()
}

func (m *engineMetrics) ended(s *sequence, finish string, err error) {
	if err != nil {
		finish = "error"
	}
	m.finished.WithLabelValues(finish).Inc()
}

// step records a step's phases.
func (m *engineMetrics) step(schedule, launch, wait, deliver time.Duration) {
	m.steps.Inc()
	for _, p := range []struct {
		name string
		d    time.Duration
	}{{"schedule", schedule}, {"launch", launch}, {"wait", wait}, {"deliver", deliver}} {
		m.stepSeconds.WithLabelValues(p.name).Add(p.d.Seconds())
	}
}

func (m *engineMetrics) preempted() { m.preemptions.Inc() }
func (m *engineMetrics) refused()   { m.overloaded.Inc() }

// gauges updates the engine's gauges from its loop.
func (m *engineMetrics) gauges() {
	m.running.Set(float64(len(m.e.running)))
	m.waiting.Set(float64(len(m.e.waiting)))
	m.sampleKV()
}

// sampleKV takes the memory's state for the gauges and for
// Engine.KVStats (the engine's loop calls it), and the most waste seen.
func (m *engineMetrics) sampleKV() {
	if m.e.blocks == nil {
		return
	}
	st := m.e.blocks.Stats()
	w, aw := st.Waste(), st.ArenaWaste()
	m.mu.Lock()
	m.kv, m.maxWaste, m.maxArena = st, max(m.maxWaste, w), max(m.maxArena, aw)
	m.mu.Unlock()
	m.blocksUsed.Set(float64(st.Used))
	m.blocksFree.Set(float64(st.Free))
	m.waste.Set(w)
	m.arenaWaste.Set(aw)
}
