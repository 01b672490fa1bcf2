package serve

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/internal/testmodel"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
	"github.com/leangrad/leangrad/train"
)

// checkpoint writes a checkpoint of an untrained model, as train -save
// writes one, and returns its path.
func checkpoint(t testing.TB, dev *tensor.Device, model string, in train.Inputs) string {
	return testmodel.Checkpoint(t, dev, model, in, nil)
}

var mnistInputs = train.Inputs{Shape: []int{1, 28, 28}, Classes: 10, Mean: []float32{0.29}, Std: []float32{0.35}}

// open serves a checkpoint of model on a fresh CPU device, warmed up.
func open(t testing.TB, model string, in train.Inputs, o Options) (*Server, *httptest.Server) {
	dev := tensor.NewDevice(cpu.New())
	s, err := Open(dev, checkpoint(t, dev, model, in), o)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WarmUp(); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() { hs.Close(); s.Close() })
	return s, hs
}

func images(n int, rng *rand.Rand) [][]float64 {
	out := make([][]float64, n)
	for i := range out {
		out[i] = make([]float64, 784)
		for j := range out[i] {
			out[i][j] = rng.Float64()
		}
	}
	return out
}

func post(t testing.TB, url, ctype string, body []byte) (int, string) {
	resp, err := http.Post(url, ctype, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A prediction is the model's forward pass of the normalised image, batched
// or alone: the probabilities a batch of requests gets equal those of each
// request alone, and those of JSON equal those of the same pixels as IDX;
// each names its class as the checkpoint's dataset does.
func TestPredict(t *testing.T) {
	in := mnistInputs
	in.Labels = datasets.FashionMNISTClasses
	s, hs := open(t, "resnet8", in, Options{Window: 20 * time.Millisecond})
	rng := rand.New(rand.NewPCG(1, 2))
	ims := images(3, rng)
	for i := range ims[2] { // exact in bytes, for the IDX request
		ims[2][i] = float64(int(ims[2][i]*255)) / 255
	}
	ask := func(ims [][]float64) []Prediction {
		body, _ := json.Marshal(map[string]any{"images": ims})
		code, out := post(t, hs.URL+"/v1/predict", "application/json", body)
		var r struct{ Predictions []Prediction }
		if code != 200 || json.Unmarshal([]byte(out), &r) != nil || len(r.Predictions) != len(ims) {
			t.Fatalf("predict: %d %s", code, out)
		}
		return r.Predictions
	}
	alone := [][]Prediction{ask(ims[:1]), ask(ims[1:2]), ask(ims[2:])}
	together := ask(ims)
	var idx bytes.Buffer
	idx.Write([]byte{0, 0, 8, 3})
	for _, d := range []int32{1, 28, 28} {
		binary.Write(&idx, binary.BigEndian, d)
	}
	for _, v := range ims[2] {
		idx.WriteByte(byte(v*255 + 0.5))
	}
	code, out := post(t, hs.URL+"/v1/predict", "application/octet-stream", idx.Bytes())
	var fromIDX struct{ Predictions []Prediction }
	json.Unmarshal([]byte(out), &fromIDX)
	for i := range ims {
		a, b := alone[i][0], together[i]
		for k := range a.Probabilities {
			if d := a.Probabilities[k] - b.Probabilities[k]; d > 1e-5 || d < -1e-5 {
				t.Errorf("image %d class %d: %v alone, %v in a batch", i, k, a.Probabilities[k], b.Probabilities[k])
			}
		}
		var sum float32
		for _, p := range b.Probabilities {
			sum += p
		}
		if sum < 0.9999 || sum > 1.0001 || a.Class != slices.Index(a.Probabilities, slices.Max(a.Probabilities)) {
			t.Errorf("image %d: probabilities sum to %v, class %d", i, sum, a.Class)
		}
		if a.Label != datasets.FashionMNISTClasses[a.Class] {
			t.Errorf("image %d: class %d labelled %q", i, a.Class, a.Label)
		}
	}
	if code != 200 || len(fromIDX.Predictions) != 1 || fromIDX.Predictions[0].Class != alone[2][0].Class {
		t.Errorf("IDX: %d %s", code, out)
	}
	_ = s
}

// unreadable is a body that fails the test if it is read: a request whose
// Content-Length is over the limit is refused without reading it.
type unreadable struct{ t *testing.T }

func (u unreadable) Read([]byte) (int, error) {
	u.t.Error("the oversize body was read")
	return 0, io.EOF
}

// Every bad request gets its status and a message saying what is wrong.
func TestBadRequests(t *testing.T) {
	s, hs := open(t, "resnet8", mnistInputs, Options{MaxBatch: 4, MaxBody: 1 << 20})
	ok, _ := json.Marshal(map[string]any{"images": images(1, rand.New(rand.NewPCG(1, 1)))})
	five, _ := json.Marshal(map[string]any{"images": images(5, rand.New(rand.NewPCG(1, 1)))})
	for _, tc := range []struct {
		name, ctype, body string
		code              int
		want              string
	}{
		{"the right request", "application/json", string(ok), 200, `"predictions"`},
		{"a wrong shape", "application/json", `{"images": [[0.5, 0.5]]}`, 400, "image 0 has 2 values: the model takes 1×28×28 = 784"},
		{"not a number", "application/json", `{"images": [["a"]]}`, 400, "images: string where a number is wanted"},
		{"an unknown field", "application/json", `{"images": [], "extra": 1}`, 400, `the body has a field \"extra\" that this endpoint does not take`},
		{"not JSON", "application/json", `{"images": [[0.5,]]}`, 400, "the body is not JSON: invalid character ']' looking for beginning of value (at byte 18)"},
		{"no images", "application/json", `{"images": []}`, 400, "0 images: a request has 1 to 4"},
		{"more than a batch", "application/json", string(five), 400, "5 images: a request has 1 to 4"},
		{"trailing data", "application/json", string(ok) + "{}", 400, "more after its JSON object"},
		{"a bad IDX file", "application/octet-stream", "\x00\x00\x08\x01\x00\x00\x00\x02ab", 400, "IDX images of shape [2]"},
		{"a chunked body over the limit", "application/json", `{"images": [[` + strings.Repeat("0.5,", 300000) + `0]]}`, 413, "over the 1048576 bytes"},
	} {
		code, out := post(t, hs.URL+"/v1/predict", tc.ctype, []byte(tc.body))
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("%s: %d %.200s; want %d and %q", tc.name, code, out, tc.code, tc.want)
		}
	}
	body := fmt.Sprintf(`{"images": [[%s0.5]]}`, strings.Repeat("0.5,", 783))
	body = strings.Replace(body, "0.5,", "1.5,", 1)
	if code, out := post(t, hs.URL+"/v1/predict", "application/json", []byte(body)); code != 400 || !strings.Contains(out, "image 0, value 0 is 1.5: pixels are in [0, 1]") {
		t.Errorf("a pixel of 1.5: %d %s", code, out)
	}
	req := httptest.NewRequest("POST", "/v1/predict", unreadable{t})
	req.ContentLength = 2 << 20
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	if rec.Code != 413 {
		t.Errorf("a Content-Length over the limit: %d %s", rec.Code, rec.Body.String())
	}
	if resp, err := http.Get(hs.URL + "/v1/predict"); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/predict: %v %v", err, resp.Status)
	}
	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ready", "/metrics": `leangrad_requests_total{code="413",path="/v1/predict"} 2`} {
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
			t.Errorf("GET %s: %d, lacks %q:\n%s", path, resp.StatusCode, want, b)
		}
	}
}

// Before WarmUp the server is alive, not ready, and refuses predictions.
func TestNotReadyUntilWarm(t *testing.T) {
	dev := tensor.NewDevice(cpu.New())
	s, err := Open(dev, checkpoint(t, dev, "resnet8", mnistInputs), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 503} {
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != want {
			t.Errorf("%s: %d before the warm-up, want %d", path, rec.Code, want)
		}
	}
}

// A full queue answers 503 at once.
func TestOverloadIs503(t *testing.T) {
	s, hs := open(t, "resnet8", mnistInputs, Options{Queue: 1, MaxBatch: 1, Window: time.Millisecond})
	body, _ := json.Marshal(map[string]any{"images": images(1, rand.New(rand.NewPCG(1, 1)))})
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _ := post(t, hs.URL+"/v1/predict", "application/json", body)
			mu.Lock()
			codes[code]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if codes[503] == 0 || codes[200] == 0 || codes[200]+codes[503] != 64 {
		t.Errorf("64 requests at once with a queue of 1: %v; want some 200 and some 503, nothing else", codes)
	}
	_ = s
}

// A GPT's generation streams a line per token, then the whole text; bad
// prompts and lengths are 400.
func TestGenerate(t *testing.T) {
	_, hs := open(t, "gpt-mini", train.Inputs{Shape: []int{64}, Classes: 256, Tokenizer: "bytes"}, Options{})
	code, out := post(t, hs.URL+"/v1/generate", "application/json", []byte(`{"prompt": "The quick", "max_tokens": 12, "temperature": 0}`))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var last struct {
		Done   bool
		Text   string
		Tokens int
	}
	if code != 200 || len(lines) < 2 || json.Unmarshal([]byte(lines[len(lines)-1]), &last) != nil || !last.Done || last.Tokens != 12 {
		t.Fatalf("generate: %d %s", code, out)
	}
	var streamed strings.Builder
	for _, l := range lines[:len(lines)-1] {
		var tok struct{ Text string }
		json.Unmarshal([]byte(l), &tok)
		streamed.WriteString(tok.Text)
	}
	if streamed.String() != last.Text {
		t.Errorf("the streamed text %q is not the whole %q", streamed.String(), last.Text)
	}
	_, again := post(t, hs.URL+"/v1/generate", "application/json", []byte(`{"prompt": "The quick", "max_tokens": 12, "temperature": 0}`))
	if again != out {
		t.Errorf("greedy generation differs between two requests:\n%s\n%s", out, again)
	}
	for body, want := range map[string]string{
		`{"prompt": "", "max_tokens": 5}`:                       "prompt: empty",
		`{"prompt": "abc", "max_tokens": 62}`:                   "max_tokens: 62 after a prompt of 3 tokens: want 1 to 61",
		`{"prompt": "abc", "max_tokens": 0}`:                    "max_tokens: 0",
		`{"prompt": "abc", "max_tokens": 5, "temperature": -1}`: "temperature: -1",
		`{"prompt": "abc", "max_tokens": 5, "top_k": -1}`:       "top_k: -1",
		`{"prompt": "abc", "max_tokens": 5, "topk": 3}`:         `the body has a field \"topk\" that this endpoint does not take`,
	} {
		if code, out := post(t, hs.URL+"/v1/generate", "application/json", []byte(body)); code != 400 || !strings.Contains(out, want) {
			t.Errorf("%s: %d %s; want 400 and %q", body, code, out, want)
		}
	}
}

var (
	loadRequests   = flag.Int("load.requests", 300, "TestLoad: requests of the batched run")
	loadSingle     = flag.Int("load.single", 0, "TestLoad: requests of the one-client run (0: -load.requests)")
	loadClients    = flag.Int("load.clients", 16, "TestLoad: concurrent clients of the batched run")
	loadCheckpoint = flag.String("load.checkpoint", "", "TestLoad: the checkpoint to serve (default: an untrained ResNet-8) on -load.device")
	loadDevice     = flag.String("load.device", "cpu", "TestLoad: the device")
)

// TestLoad is the load test: requests of one image each from one client
// (-load.single), then -load.requests from -load.clients, on the loopback
// address, with
// and without EmptyCache every 1000 requests. No request may fail, and the
// pool must hold, to the byte, what it held after the warm-up, with the
// reserved bytes flat. It reports each run's throughput and latencies and
// the first request's latency against the median: the figures of the
// batching gain, measured (not asserted: timings are for benchmarks).
func TestLoad(t *testing.T) {
	dev := tensor.NewDevice(cpu.New())
	if *loadDevice != "cpu" {
		var err error
		if dev, err = tensor.Open(*loadDevice); err != nil {
			t.Fatal(err)
		}
	}
	path := *loadCheckpoint
	if path == "" {
		path = checkpoint(t, dev, "resnet8", mnistInputs)
	}
	for _, every := range []int{0, 1000} {
		s, err := Open(dev, path, Options{EmptyCacheEvery: every})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.WarmUp(); err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(s.Handler())
		a := dev.Allocator()
		before := a.Stats()
		per := s.in.Shape[0] * s.in.Shape[1] * s.in.Shape[2]
		for _, clients := range []int{1, *loadClients} {
			images0, batches0 := s.m.batchTotals()
			n := *loadRequests
			if clients == 1 && *loadSingle > 0 {
				n = *loadSingle
			}
			r := load(t, hs.URL+"/v1/predict", n, clients, per)
			images1, batches1 := s.m.batchTotals()
			after := a.Stats()
			t.Logf("empty-cache-every %d, %2d clients: %d requests in %.2f s: %.0f requests/s, latency p50 %.2f ms, p99 %.2f ms, first %.2f ms (%.2fx the median); %.1f images a forward pass",
				every, clients, r.n, r.secs, float64(r.n)/r.secs, r.p50*1e3, r.p99*1e3, r.first*1e3, r.first/r.p50, float64(images1-images0)/float64(batches1-batches0))
			if r.failed > 0 {
				t.Errorf("%d requests failed: %s", r.failed, r.why)
			}
			if got, want := after.Allocated[memory.All].Current, before.Allocated[memory.All].Current; got != want {
				t.Errorf("allocated %d bytes after the run, %d before it", got, want)
			}
			if got, want := after.Reserved[memory.All].Current, before.Reserved[memory.All].Current; every == 0 && got != want {
				t.Errorf("reserved %d bytes after the run, %d after the warm-up: it grew", got, want)
			}
		}
		hs.Close()
		s.Close()
	}
}

type loadResult struct {
	n, failed       int
	secs            float64
	p50, p99, first float64
	why             string
}

// load sends n requests of one random image from clients goroutines.
func load(t *testing.T, url string, n, clients, per int) loadResult {
	bodies := make([][]byte, 16)
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range bodies {
		im := make([]float64, per)
		for j := range im {
			im[j] = float64(rng.IntN(256)) / 255
		}
		bodies[i], _ = json.Marshal(map[string]any{"images": [][]float64{im}})
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	lat := make([]float64, n)
	var mu sync.Mutex
	var res loadResult
	var next sync.Mutex
	i := 0
	start := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				next.Lock()
				k := i
				i++
				next.Unlock()
				if k >= n {
					return
				}
				t0 := time.Now()
				resp, err := client.Post(url, "application/json", bytes.NewReader(bodies[k%len(bodies)]))
				ok := err == nil && resp.StatusCode == 200
				if err == nil {
					sc := bufio.NewScanner(resp.Body)
					for sc.Scan() {
					}
					resp.Body.Close()
				}
				lat[k] = time.Since(t0).Seconds()
				if !ok {
					mu.Lock()
					res.failed++
					res.why = fmt.Sprint(errors.Join(err), statusOf(resp))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	res.n, res.secs, res.first = n, time.Since(start).Seconds(), lat[0]
	sorted := slices.Clone(lat)
	sort.Float64s(sorted)
	res.p50, res.p99 = sorted[n/2], sorted[n*99/100]
	return res
}

func statusOf(r *http.Response) string {
	if r == nil {
		return ""
	}
	return r.Status
}

// Open copies the weights from the mapped file a tensor at a time: the Go
// heap grows by the model (the CPU pool's memory) and not by the file,
// whose optimiser state (two more copies of every weight, for AdamW) is
// never read into memory.
func TestOpenMapsTheCheckpoint(t *testing.T) {
	dev := tensor.NewDevice(cpu.New())
	in := train.Inputs{Shape: []int{64}, Classes: 50257, Tokenizer: "gpt2"}
	m, err := train.BuildModel(dev, "gpt-mini", in.Shape, in.Classes, 1)
	if err != nil {
		t.Fatal(err)
	}
	cfg := train.Config{Model: "gpt-mini", Epochs: 1, Batch: 2, LR: 1e-3, Optimizer: "adamw", Schedule: "constant", Seed: 1, Tokenizer: "gpt2"}
	tr, err := train.New(m, dev, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	x := tensor.FromInt32(dev, make([]int32, 2*64), 2, 64)
	if err := tr.RunStep(x, x); err != nil { // AdamW's moments exist, and are saved
		t.Fatal(err)
	}
	x.Release()
	tr.Inputs = &in
	path := filepath.Join(t.TempDir(), "gpt.st")
	if err := tr.Save(path); err != nil {
		t.Fatal(err)
	}
	var modelBytes int64
	for _, n := range m.State("") {
		modelBytes += n.T.Bytes()
	}
	tr.Release()
	nn.Release(m)
	st, _ := os.Stat(path)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s, err := Open(tensor.NewDevice(cpu.New()), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	runtime.ReadMemStats(&after)
	grew := int64(after.TotalAlloc - before.TotalAlloc)
	t.Logf("file %d bytes, model %d bytes: the heap took %d bytes while opening", st.Size(), modelBytes, grew)
	if st.Size() < 2*modelBytes || grew > modelBytes+st.Size()/4 {
		t.Errorf("opening a %d-byte checkpoint of a %d-byte model allocated %d bytes", st.Size(), modelBytes, grew)
	}
}

// A checkpoint whose weights are not finite, or whose normalisation
// divides by zero, is refused at Open with one line naming what is wrong,
// not served as garbage.
func TestOpenRefusesWhatCannotAnswer(t *testing.T) {
	dev := tensor.NewDevice(cpu.New())
	in := mnistInputs
	in.Std = []float32{0}
	if _, err := Open(dev, checkpoint(t, dev, "resnet8", in), Options{}); err == nil || !strings.Contains(err.Error(), "channel 0's normalisation has mean 0.29 and deviation 0") {
		t.Errorf("a deviation of 0: %v", err)
	}
	var w nn.Named
	path := testmodel.Checkpoint(t, dev, "gpt-mini", gptInputs, func(m nn.Model) {
		w = m.State("")[3]
		v := w.T.Float32s()
		v[len(v)/2] = float32(math.NaN())
		dev.Backend().Write(w.T.Buf(), float32Bytes(v))
	})
	if _, err := Open(dev, path, Options{}); err == nil || !strings.Contains(err.Error(), "the weight "+w.Name+" is not finite") {
		t.Errorf("a NaN weight: %v", err)
	}
	if got := dev.Allocator().Stats().Allocated[memory.All].Current; got != 0 {
		t.Errorf("the refused checkpoints left %d bytes in the pool", got)
	}
}

// float32Bytes is v's memory as bytes.
func float32Bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}
