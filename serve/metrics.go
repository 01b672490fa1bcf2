package serve

import (
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
)

// metrics are what /metrics reports, in Prometheus' text exposition format
// (version 0.0.4): counters, gauges and histograms, leangrad_-prefixed.
type metrics struct {
	s         *Server
	mu        sync.Mutex
	requests  map[[2]string]int64 // path, status -> count
	latency   map[string]*histogram
	batches   *histogram
	empties   int64
	emptySecs float64
}

// latencyBuckets are the request-latency histogram's bounds, in seconds.
var latencyBuckets = []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5}

type histogram struct {
	bounds []float64
	counts []int64 // per bound, not cumulative; one more for +Inf
	sum    float64
	n      int64
}

func newHistogram(bounds []float64) *histogram {
	return &histogram{bounds: bounds, counts: make([]int64, len(bounds)+1)}
}

func (h *histogram) observe(v float64) {
	i := sort.SearchFloat64s(h.bounds, v) // the first bound >= v
	h.counts[i]++
	h.sum += v
	h.n++
}

func (h *histogram) write(b *strings.Builder, name, labels string) {
	var cum int64
	sep := ""
	if labels != "" {
		sep = ","
	}
	for i, bound := range h.bounds {
		cum += h.counts[i]
		fmt.Fprintf(b, "%s_bucket{%s%sle=\"%g\"} %d\n", name, labels, sep, bound, cum)
	}
	fmt.Fprintf(b, "%s_bucket{%s%sle=\"+Inf\"} %d\n", name, labels, sep, h.n)
	if labels != "" {
		labels = "{" + labels + "}"
	}
	fmt.Fprintf(b, "%s_sum%s %g\n%s_count%s %d\n", name, labels, h.sum, name, labels, h.n)
}

func newMetrics(s *Server) *metrics {
	var bounds []float64
	for _, b := range s.buckets {
		bounds = append(bounds, float64(b))
	}
	return &metrics{s: s, requests: map[[2]string]int64{}, latency: map[string]*histogram{}, batches: newHistogram(bounds)}
}

func (m *metrics) request(path string, code int, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.requests[[2]string{path, fmt.Sprint(code)}]++
	h := m.latency[path]
	if h == nil {
		h = newHistogram(latencyBuckets)
		m.latency[path] = h
	}
	h.observe(d.Seconds())
}

func (m *metrics) batch(images int) {
	m.mu.Lock()
	m.batches.observe(float64(images))
	m.mu.Unlock()
}

// batchTotals are the images and forward passes the batcher ran so far.
func (m *metrics) batchTotals() (images, batches int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int64(m.batches.sum), m.batches.n
}

func (m *metrics) emptied(d time.Duration) {
	m.mu.Lock()
	m.empties++
	m.emptySecs += d.Seconds()
	m.mu.Unlock()
}

func (m *metrics) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	fmt.Fprint(w, m.text())
}

// text is the exposition of every metric.
func (m *metrics) text() string {
	var b strings.Builder
	metric := func(name, kind, help string) { fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, kind) }
	st := m.s.dev.Allocator().Stats()
	m.mu.Lock()
	defer m.mu.Unlock()
	metric("leangrad_requests_total", "counter", "Requests answered, by path and HTTP status.")
	keys := make([][2]string, 0, len(m.requests))
	for k := range m.requests {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b [2]string) int { return strings.Compare(a[0]+a[1], b[0]+b[1]) })
	for _, k := range keys {
		fmt.Fprintf(&b, "leangrad_requests_total{path=%q,code=%q} %d\n", k[0], k[1], m.requests[k])
	}
	metric("leangrad_request_duration_seconds", "histogram", "Time from a request's arrival to its answer.")
	paths := make([]string, 0, len(m.latency))
	for p := range m.latency {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		m.latency[p].write(&b, "leangrad_request_duration_seconds", fmt.Sprintf("path=%q", p))
	}
	metric("leangrad_batch_images", "histogram", "Images in each forward pass the batcher ran.")
	m.batches.write(&b, "leangrad_batch_images", "")
	metric("leangrad_queue_requests", "gauge", "Requests waiting for the device.")
	fmt.Fprintf(&b, "leangrad_queue_requests %d\n", len(m.s.queue))
	for _, g := range []struct {
		name, help string
		v          int64
	}{
		{"leangrad_pool_allocated_bytes", "Bytes of the device's pool held by tensors.", st.Allocated[memory.All].Current},
		{"leangrad_pool_reserved_bytes", "Bytes the pool holds from the device, cached blocks included.", st.Reserved[memory.All].Current},
		{"leangrad_pool_peak_allocated_bytes", "The most bytes tensors held at once since the process started.", st.Allocated[memory.All].Peak},
		{"leangrad_pool_peak_reserved_bytes", "The most bytes the pool held at once.", st.Reserved[memory.All].Peak},
	} {
		metric(g.name, "gauge", g.help)
		fmt.Fprintf(&b, "%s %d\n", g.name, g.v)
	}
	metric("leangrad_tensor_leaks_total", "counter", "Tensors the garbage collector found unreleased (their memory went back).")
	fmt.Fprintf(&b, "leangrad_tensor_leaks_total %d\n", tensor.Leaks())
	metric("leangrad_empty_cache_calls_total", "counter", "EmptyCache calls made by -empty-cache-every.")
	fmt.Fprintf(&b, "leangrad_empty_cache_calls_total %d\n", m.empties)
	metric("leangrad_empty_cache_seconds_total", "counter", "Time spent inside those calls.")
	fmt.Fprintf(&b, "leangrad_empty_cache_seconds_total %g\n", m.emptySecs)
	return b.String()
}
