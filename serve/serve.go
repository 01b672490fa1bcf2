// Package serve answers HTTP requests with a model trained by leangrad:
// an image classifier's predictions, batched on the device from many
// concurrent requests, or a GPT's generated text from an Engine that
// batches every running sequence's next token in one step over paged
// key-value memory (see docs/serving.md). cmd/serve is its command; a Go
// service mounts Server.Handler on its own mux, or submits to the Engine.
//
// The endpoints:
//
//	POST /v1/predict      {"images": [[...], ...]} (each image flattened in C×H×W
//	                      order, pixels in [0, 1]), or an IDX file of unsigned
//	                      bytes (Content-Type application/octet-stream) →
//	                      {"predictions": [{"class": 3, "label": "Dress", "probabilities": [...]}, ...]}
//	                      (label: the class's name, where the checkpoint has the dataset's)
//	POST /v1/completions  OpenAI's completions, streamed as server-sent events
//	                      or not (a GPT)
//	GET  /v1/models       OpenAI's list of the one model served (a GPT)
//	POST /v1/generate     {"prompt": "...", "max_tokens": 50, "temperature": 0.8,
//	                      "top_k": 40, "seed": 1} → NDJSON, a line per token
//	                      ({"token": 262, "text": " the"}) and a last one
//	                      ({"done": true, "text": "..."}) (a GPT)
//	GET  /healthz         200 while the process runs
//	GET  /readyz          200 once warmed up, else 503
//	GET  /metrics         Prometheus' text format, leangrad_-prefixed
//
// Bad requests get 400 (413 for a body over Options.MaxBody, refused
// before it is read whole) and a JSON error (OpenAI's shape on its
// endpoints); the model's failures 500; a full queue 503.
package serve

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
	"github.com/leangrad/leangrad/train"
	"github.com/prometheus/client_golang/prometheus"
)

// Options configure a Server; the zero value of each field is its default.
type Options struct {
	// MaxBatch is the most images one forward pass takes (default 64).
	// Requests are batched up to it; a request of more is refused.
	MaxBatch int
	// Window is how long the batcher waits, after a request arrives, for
	// others to join its batch (default 2 ms). It waits only while other
	// requests are arriving (read and parsed, not yet queued): a lone
	// client's request runs at once, and a full batch goes at once.
	Window time.Duration
	// Queue bounds the requests waiting for the device (default 1024);
	// beyond it requests get 503. For a GPT it is the engine's MaxQueue:
	// the samples waiting and running.
	Queue int
	// MaxBody is the most bytes a request body may have (default 16 MiB).
	MaxBody int64
	// EmptyCacheEvery calls the pool's EmptyCache after every N requests
	// answered (0: never): the long-running-service advice, there to be
	// measured (the pool does not need it: what a request allocates goes
	// back when it is answered).
	EmptyCacheEvery int
	// Engine configures a GPT's engine (its MaxQueue is Queue).
	Engine EngineOptions
}

func (o Options) withDefaults() Options {
	if o.MaxBatch <= 0 {
		o.MaxBatch = 64
	}
	if o.Window <= 0 {
		o.Window = 2 * time.Millisecond
	}
	if o.Queue <= 0 {
		o.Queue = 1024
	}
	if o.MaxBody <= 0 {
		o.MaxBody = 16 << 20
	}
	return o
}

// Server serves one model on one device.
type Server struct {
	dev      *tensor.Device
	model    nn.Model
	arch     train.Arch
	cfg      train.Config
	in       train.Inputs
	tok      datasets.Tokenizer // a GPT's
	engine   *Engine            // a GPT's
	opts     Options
	started  time.Time // when Open returned: the model card's created
	buckets  []int     // the batch sizes forward passes run at
	queue    chan *request
	ready    atomic.Bool
	answers  atomic.Int64 // requests answered, for EmptyCacheEvery
	arriving atomic.Int64 // predict requests being read and parsed, not yet queued
	m        *metrics
	stop     chan struct{}
	wg       sync.WaitGroup
	closed   sync.Once
}

// Open loads a checkpoint written by train -save (Trainer.Save): the model
// and the inputs it was trained on come from it, and its weights are
// memory-mapped and copied to dev one tensor at a time, so the program's
// memory stays near one tensor, not the file. The server is not ready
// until WarmUp.
func Open(dev *tensor.Device, path string, o Options) (*Server, error) {
	st, unmap, err := nn.MapSafetensors(path)
	if err != nil {
		return nil, err
	}
	defer unmap()
	info, err := train.InfoOf(st, path)
	if err != nil {
		return nil, err
	}
	if info.Inputs == nil {
		return nil, fmt.Errorf("%s: the checkpoint does not record the inputs its model was trained on (shape, classes, normalisation): it was written by an older leangrad; train it again with -save", path)
	}
	arch, err := train.LookupArch(info.Config.Model)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	s := &Server{dev: dev, arch: arch, cfg: info.Config, in: *info.Inputs, opts: o.withDefaults(), stop: make(chan struct{}), started: time.Now()}
	if arch.Text {
		if s.tok, err = datasets.NewTokenizer(s.in.Tokenizer); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	} else if c := s.in.Shape[0]; len(s.in.Shape) != 3 || len(s.in.Mean) != c || len(s.in.Std) != c {
		return nil, fmt.Errorf("%s: inputs of shape %v with %d means and %d deviations: want C×H×W and one of each a channel", path, s.in.Shape, len(s.in.Mean), len(s.in.Std))
	} else {
		for i := range c {
			if m, d := float64(s.in.Mean[i]), float64(s.in.Std[i]); math.IsNaN(m) || math.IsInf(m, 0) || !(d > 0) || math.IsInf(d, 0) {
				return nil, fmt.Errorf("%s: channel %d's normalisation has mean %v and deviation %v: want finite, the deviation above 0", path, i, s.in.Mean[i], s.in.Std[i])
			}
		}
	}
	var buildErr error
	if err := tensor.Catch(func() { s.model, buildErr = arch.Build(dev, s.in.Shape, s.in.Classes, info.Config.Seed) }); err != nil {
		return nil, fmt.Errorf("%s: building %s: %w", path, info.Config.Model, err)
	} else if buildErr != nil {
		return nil, fmt.Errorf("%s: building %s: %w", path, info.Config.Model, buildErr)
	}
	weights := &nn.Safetensors{Tensors: map[string]nn.Stored{}}
	for name, t := range st.Tensors {
		if rest, ok := strings.CutPrefix(name, "model."); ok {
			weights.Tensors[rest] = t
		}
	}
	if err := nn.LoadStateDict(s.model, weights, path); err != nil {
		nn.Release(s.model)
		return nil, err
	}
	if name, err := nonFinite(s.model); err != nil || name != "" {
		nn.Release(s.model)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return nil, fmt.Errorf("%s: the weight %s is not finite (NaN or infinite): the run that wrote it diverged", path, name)
	}
	s.model.SetTraining(false)
	s.buckets = buckets(s.opts.MaxBatch)
	s.queue = make(chan *request, s.opts.Queue)
	s.m = newMetrics(s)
	if arch.Text {
		eo := s.opts.Engine
		eo.MaxQueue = s.opts.Queue
		s.engine = newEngine(dev, s.model.(*nn.GPT), s.tok, info.Config.Model, eo) // its loop starts in WarmUp
		s.m.register(s.engine.Collectors()...)
	} else {
		s.wg.Add(1)
		go s.batcher()
	}
	return s, nil
}

// nonFinite is the first of m's weights holding a NaN or an infinity ("":
// none), checked on the device (an exact division by 1 that raises a flag)
// so that no weight is copied to the host.
func nonFinite(m nn.Model) (name string, err error) {
	err = tensor.Catch(func() {
		for _, n := range m.State("") {
			t := n.T
			dev := t.Device()
			if t.DType() != tensor.F32 {
				for _, v := range t.Float32s() {
					if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
						name = n.Name
						return
					}
				}
				continue
			}
			one, found := tensor.FromFloat32(dev, []float32{1}, 1), tensor.FromFloat32(dev, []float32{0}, 1)
			dev.Backend().UnscaleCheck([]kernels.Buf{t.Buf()}, one.Buf(), found.Buf())
			bad := found.Float32s()[0] != 0
			one.Release()
			found.Release()
			if bad {
				name = n.Name
				return
			}
		}
	})
	return name, err
}

// Model names what the server serves: "resnet20 (1×28×28 images, 10
// classes)".
func (s *Server) Model() string {
	if s.arch.Text {
		return fmt.Sprintf("%s (context %d, %s tokenizer)", s.cfg.Model, s.in.Shape[0], s.tok.Name())
	}
	return fmt.Sprintf("%s (%d×%d×%d images, %d classes)", s.cfg.Model, s.in.Shape[0], s.in.Shape[1], s.in.Shape[2], s.in.Classes)
}

// Buckets are the batch sizes a forward pass runs at (a batch is padded
// to the next): every one is warmed up, so the pool holds blocks of each
// shape before the first request.
func (s *Server) Buckets() []int { return s.buckets }

// Prepared says what the warm-up made ready: the image batches, or a GPT's
// key-value memory and decoding steps.
func (s *Server) Prepared() string {
	if s.engine != nil {
		return s.engine.Prepared()
	}
	return fmt.Sprintf("warmed up batches of %v", s.buckets)
}

// WarmUp runs every shape the server will run once (each bucket's forward
// pass; a GPT's engine sizes its key-value memory and captures its steps),
// then makes the server ready.
func (s *Server) WarmUp() error {
	if s.arch.Text {
		s.engine.start()
		if err := <-s.engine.Ready(); err != nil {
			return fmt.Errorf("warming up: %w", err)
		}
	} else {
		per := s.in.Shape[0] * s.in.Shape[1] * s.in.Shape[2]
		for _, b := range s.buckets {
			if _, err := s.forward(s.dev.Session(), make([]float32, b*per), b); err != nil {
				return fmt.Errorf("warming up a batch of %d: %w", b, err)
			}
		}
	}
	s.ready.Store(true)
	return nil
}

// Ready says whether WarmUp finished.
func (s *Server) Ready() bool { return s.ready.Load() }

// Close stops the batcher, once the requests queued are answered, and
// frees the model. Stop the HTTP server first (http.Server.Shutdown).
func (s *Server) Close() {
	s.closed.Do(func() {
		close(s.stop)
		s.wg.Wait()
		if s.engine != nil {
			s.engine.Close()
		}
		nn.Release(s.model)
	})
}

// Engine is a GPT's engine (nil for an image classifier): its Submit is
// the Go API for services that embed the server.
func (s *Server) Engine() *Engine { return s.engine }

// Collectors are the server's Prometheus collectors (its requests, the
// pool, a GPT's engine), for a service's own registry.
func (s *Server) Collectors() []prometheus.Collector { return slices.Clone(s.m.all) }

// request is one predict request waiting for the batcher.
type request struct {
	x     []float32 // n normalised images
	n     int
	reply chan result
}

type result struct {
	probs [][]float32
	err   error
}

// predict queues n normalised images and waits for their probabilities;
// queued is called once the request is in the queue (or refused).
func (s *Server) predict(x []float32, n int, queued func()) ([][]float32, error) {
	r := &request{x: x, n: n, reply: make(chan result, 1)}
	select {
	case s.queue <- r:
		queued()
	default:
		queued()
		return nil, ErrOverloaded
	}
	res := <-r.reply
	return res.probs, res.err
}

// batcher takes the queued requests into batches of at most MaxBatch
// images, waiting Window after the first for others, and runs each batch
// in one forward pass on its own session.
func (s *Server) batcher() {
	defer s.wg.Done()
	sess := s.dev.Session()
	per := s.in.Shape[0] * s.in.Shape[1] * s.in.Shape[2]
	buf := make([]float32, s.opts.MaxBatch*per)
	var held *request // a request that did not fit the last batch
	for {
		first := held
		held = nil
		if first == nil {
			select {
			case first = <-s.queue:
			case <-s.stop:
				if len(s.queue) == 0 {
					return
				}
				continue
			}
		}
		batch, n := []*request{first}, first.n
		deadline := time.NewTimer(s.opts.Window)
	gather:
		for n < s.opts.MaxBatch {
			select {
			case r := <-s.queue:
				if n+r.n > s.opts.MaxBatch {
					held = r
					break gather
				}
				batch, n = append(batch, r), n+r.n
				continue
			default:
			}
			if s.arriving.Load() == 0 {
				break // no one else is coming: do not wait for nothing
			}
			select {
			case r := <-s.queue:
				if n+r.n > s.opts.MaxBatch {
					held = r
					break gather
				}
				batch, n = append(batch, r), n+r.n
			case <-deadline.C:
				break gather
			case <-time.After(50 * time.Microsecond): // look at the arrivals again
			}
		}
		deadline.Stop()
		off := 0
		for _, r := range batch {
			copy(buf[off*per:], r.x)
			off += r.n
		}
		b := bucket(n, s.opts.MaxBatch)
		clear(buf[n*per : b*per])
		probs, err := s.forward(sess, buf[:b*per], b)
		s.m.batch(n)
		off = 0
		for _, r := range batch {
			if err != nil {
				r.reply <- result{err: err}
				continue
			}
			r.reply <- result{probs: probs[off : off+r.n]}
			off += r.n
		}
		s.answered(len(batch))
	}
}

// answered counts requests answered and empties the pool's cache when
// EmptyCacheEvery says so.
func (s *Server) answered(n int) {
	every := int64(s.opts.EmptyCacheEvery)
	after := s.answers.Add(int64(n))
	if every > 0 && after/every != (after-int64(n))/every {
		start := time.Now()
		s.dev.Allocator().EmptyCache()
		s.m.emptied(time.Since(start))
	}
}

// forward runs b images (x, normalised) through the model under NoGrad on
// sess and returns each one's class probabilities. Everything it makes is
// released before it returns; running out of memory is an error.
func (s *Server) forward(sess *tensor.Device, x []float32, b int) (probs [][]float32, err error) {
	shape := append([]int{b}, s.in.Shape...)
	err = tensor.Catch(func() {
		ag.NoGrad(sess, func() {
			sess.WithScope(func() {
				logits := s.model.Forward(tensor.FromFloat32(sess, x, shape...)).Float32s()
				probs = softmaxRows(logits, s.in.Classes)
			})
		})
	})
	return probs, err
}
