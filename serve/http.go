package serve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/leangrad/leangrad/datasets"
)

// Handler is the server's HTTP interface (see the package doc).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !s.Ready() {
			http.Error(w, "warming up", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.Handle("GET /metrics", s.m.handler())
	endpoints := s.endpoints()
	for _, e := range endpoints {
		mux.HandleFunc(e.pattern, e.handler)
	}
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) { s.elsewhere(w, r, endpoints) }) // what no pattern above serves
	return mux
}

// An endpoint is a pattern of the API ("POST /v1/completions") and what
// answers it.
type endpoint struct {
	pattern string
	handler http.HandlerFunc
}

// endpoints are the API's: a GPT's or an image classifier's.
func (s *Server) endpoints() []endpoint {
	if !s.arch.Text {
		return []endpoint{{"POST /v1/predict", s.measured("/v1/predict", s.predictHTTP)}}
	}
	return []endpoint{
		{"POST /v1/completions", s.openAI("/v1/completions", s.completions)},
		{"GET /v1/models", s.openAI("/v1/models", s.models)},
		{"GET /v1/models/{model}", s.openAI("/v1/models", s.modelInfo)},
		{"POST /v1/generate", s.measured("/v1/generate", s.generate)},
	}
}

// elsewhere answers a request under /v1/ that none of the endpoints
// serves: 405, naming the method allowed, on an endpoint's path; 404,
// naming the endpoints, elsewhere; in the API's shape (OpenAI's for a GPT).
func (s *Server) elsewhere(w http.ResponseWriter, r *http.Request, endpoints []endpoint) {
	patterns := make([]string, len(endpoints))
	for i, e := range endpoints {
		patterns[i] = e.pattern
	}
	err := &apiError{http.StatusNotFound, "invalid_request_error", "", "unknown_url",
		fmt.Sprintf("%s %s: no such endpoint; this server answers %s", r.Method, r.URL.Path, strings.Join(patterns, ", "))}
	for _, p := range patterns {
		method, pattern, _ := strings.Cut(p, " ")
		if matches(pattern, r.URL.Path) {
			w.Header().Set("Allow", method)
			err.status, err.code, err.message = http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("%s %s: this endpoint answers %s only", r.Method, r.URL.Path, method)
		}
	}
	if s.arch.Text && strings.HasPrefix(r.URL.Path, "/v1/chat/") {
		err.message += " (a GPT served here is a model of text without a chat template: send the conversation as the prompt of POST /v1/completions)"
	}
	code := err.status
	if s.arch.Text {
		writeAPIError(w, err)
	} else {
		writeError(w, code, err.message)
	}
	s.m.requests.WithLabelValues("other", fmt.Sprint(code)).Inc()
}

// matches says whether path is pattern's, each {name} in it standing for
// one segment.
func matches(pattern, path string) bool {
	p, q := strings.Split(pattern, "/"), strings.Split(path, "/")
	if len(p) != len(q) {
		return false
	}
	for i := range p {
		if p[i] != q[i] && !(strings.HasPrefix(p[i], "{") && q[i] != "") {
			return false
		}
	}
	return true
}

// httpError is an error with the status it answers.
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &httpError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

// measured wraps a handler that returns an error: it answers the error as
// JSON with its status, and records the request's status and latency.
func (s *Server) measured(path string, h func(w http.ResponseWriter, r *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		code := http.StatusOK
		if !s.Ready() {
			code = http.StatusServiceUnavailable
			writeError(w, code, "warming up: see /readyz")
		} else if err := h(w, r); err != nil {
			var he *httpError
			var ae *apiError
			var mb *http.MaxBytesError
			switch {
			case errors.As(err, &he):
				code = he.code
			case errors.As(err, &ae):
				code = ae.status
			case errors.As(err, &mb):
				code = http.StatusRequestEntityTooLarge
				err = fmt.Errorf("the body is over the %d bytes a request may have", mb.Limit)
			case errors.Is(err, ErrOverloaded):
				code = http.StatusServiceUnavailable
			default:
				code = http.StatusInternalServerError
				err = fmt.Errorf("the model failed: %w", err)
			}
			writeError(w, code, err.Error())
		}
		s.m.request(path, code, time.Since(start))
	}
}

func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// body reads a request's body, refusing one over MaxBody before reading it
// (by its Content-Length) or as soon as it passes the limit.
func (s *Server) body(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.ContentLength > s.opts.MaxBody {
		return nil, &http.MaxBytesError{Limit: s.opts.MaxBody}
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBody))
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, badRequest("the body ended after %d of the %d bytes its Content-Length says", len(data), r.ContentLength)
	}
	return data, err
}

// decodeJSON decodes a JSON body into v, refusing unknown fields and
// anything after the object; its errors name the field at fault (the
// API's param) and what it wants there, in the request's words rather
// than Go's.
func decodeJSON(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch field, unknown := strings.CutPrefix(err.Error(), "json: unknown field "); {
		case errors.As(err, &te) && te.Field != "":
			return invalid(te.Field, "%s: %s where %s is wanted", te.Field, te.Value, jsonKind(te.Type))
		case errors.As(err, &te):
			return invalid("", "the body is a JSON %s where an object is wanted", te.Value)
		case errors.As(err, &se):
			return invalid("", "the body is not JSON: %v (at byte %d)", se, se.Offset)
		case unknown:
			field, _ = strconv.Unquote(field)
			return invalid(field, "the body has a field %q that this endpoint does not take", field)
		}
		return invalid("", "the body is not the JSON object expected: %v", err)
	}
	if d.More() {
		return badRequest("the body has more after its JSON object")
	}
	return nil
}

// jsonKind names what JSON value decodes into a Go value of type t.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return fmt.Sprintf("an integer of %d bits", t.Bits())
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return "an object"
}

// Prediction is one image's answer.
type Prediction struct {
	Class int    `json:"class"`
	Label string `json:"label,omitempty"` // the class's name, where the checkpoint has the dataset's

	Probabilities []float32 `json:"probabilities"`
}

func (s *Server) predictHTTP(w http.ResponseWriter, r *http.Request) error {
	s.arriving.Add(1)
	arriving := true
	defer func() {
		if arriving {
			s.arriving.Add(-1)
		}
	}()
	data, err := s.body(w, r)
	if err != nil {
		return err
	}
	C, H, W := s.in.Shape[0], s.in.Shape[1], s.in.Shape[2]
	per := C * H * W
	var pixels []float32 // in [0, 1]
	n := 0
	if ct := r.Header.Get("Content-Type"); strings.HasPrefix(ct, "application/octet-stream") {
		dims, body, err := datasets.ParseIDX(data)
		if err != nil {
			return badRequest("the IDX body: %v", err)
		}
		if len(dims) < 2 || len(dims) > 4 || product(dims[1:]) != per {
			return badRequest("IDX images of shape %v: the model takes N×%d×%d×%d (or N×%d×%d for one channel)", dims, C, H, W, H, W)
		}
		n = dims[0]
		pixels = make([]float32, len(body))
		for i, b := range body {
			pixels[i] = float32(b) / 255
		}
	} else {
		var req struct {
			Images [][]float64 `json:"images"`
		}
		if err := decodeJSON(data, &req); err != nil {
			return err
		}
		n = len(req.Images)
		pixels = make([]float32, 0, n*per)
		for i, im := range req.Images {
			if len(im) != per {
				return badRequest("image %d has %d values: the model takes %d×%d×%d = %d, flattened in C×H×W order", i, len(im), C, H, W, per)
			}
			for j, v := range im {
				if !(v >= 0 && v <= 1) {
					return badRequest("image %d, value %d is %v: pixels are in [0, 1]", i, j, v)
				}
				pixels = append(pixels, float32(v))
			}
		}
	}
	if n < 1 || n > s.opts.MaxBatch {
		return badRequest("%d images: a request has 1 to %d", n, s.opts.MaxBatch)
	}
	plane := H * W
	for i := range n {
		for c := range C {
			m, inv := s.in.Mean[c], 1/s.in.Std[c]
			row := pixels[i*per+c*plane : i*per+(c+1)*plane]
			for k, v := range row {
				row[k] = (v - m) * inv
			}
		}
	}
	probs, err := s.predict(pixels, n, func() { s.arriving.Add(-1); arriving = false })
	if err != nil {
		return err
	}
	out := struct {
		Predictions []Prediction `json:"predictions"`
	}{make([]Prediction, n)}
	for i, p := range probs {
		c := argmax(p)
		out.Predictions[i] = Prediction{Class: c, Probabilities: p}
		if len(s.in.Labels) == len(p) {
			out.Predictions[i].Label = s.in.Labels[c]
		}
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(out)
}

// GenerateRequest is a /v1/generate body: every field but the prompt has
// a default.
type GenerateRequest struct {
	Prompt      string   `json:"prompt"`
	MaxTokens   *int     `json:"max_tokens"`  // default 16
	Temperature *float64 `json:"temperature"` // default 0.8; 0: greedy
	TopK        *int     `json:"top_k"`       // default 40; 0: all
	TopP        *float64 `json:"top_p"`       // default 1: all
	Stop        []string `json:"stop"`
	Seed        uint64   `json:"seed"`
}

// generate answers /v1/generate: NDJSON, a line per token ({"token": 262,
// "text": " the"}) and a last one ({"done": true, "text": "...",
// "tokens": n, "finish_reason": "length"}), or {"error": "..."} after the
// first token when the model fails.
func (s *Server) generate(w http.ResponseWriter, r *http.Request) error {
	arrived := time.Now()
	data, err := s.body(w, r)
	if err != nil {
		return err
	}
	var req GenerateRequest
	if err := decodeJSON(data, &req); err != nil {
		return err
	}
	q := Request{Prompt: s.tok.Encode(req.Prompt), MaxTokens: 16, Temperature: 0.8, TopK: 40, TopP: 1, Stop: req.Stop, Seed: req.Seed}
	given(&q.MaxTokens, req.MaxTokens)
	given(&q.Temperature, req.Temperature)
	given(&q.TopK, req.TopK)
	given(&q.TopP, req.TopP)
	ch, err := s.engine.Submit(r.Context(), q)
	var re *RequestError
	switch {
	case errors.As(err, &re):
		return badRequest("%s", re.Msg)
	case errors.Is(err, ErrOverloaded):
		return ErrOverloaded
	case err != nil:
		return err
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	flusher, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	var text strings.Builder
	n := 0
	for ev := range events(ch, 1) {
		switch {
		case ev.Err != nil && n == 0:
			return ev.Err
		case ev.Err != nil:
			enc.Encode(map[string]any{"error": ev.Err.Error()})
			return nil
		case ev.Token >= 0:
			n++
			if err := enc.Encode(map[string]any{"token": ev.Token, "text": ev.Text}); err != nil {
				return nil // the client went away: its context ends the generation
			}
			if n == 1 && flusher != nil {
				flusher.Flush()
				s.m.firstFlushed("/v1/generate", time.Since(arrived))
			}
		}
		text.WriteString(ev.Text)
		if ev.Finish != "" {
			s.answered(1)
			return enc.Encode(map[string]any{"done": true, "text": text.String(), "tokens": n, "finish_reason": ev.Finish})
		}
		if flusher != nil {
			flusher.Flush()
		}
	}
	return nil
}

func product(d []int) int {
	p := 1
	for _, v := range d {
		p *= v
	}
	return p
}

func argmax(p []float32) int {
	best := 0
	for i, v := range p {
		if v > p[best] {
			best = i
		}
	}
	return best
}

// softmaxRows is the softmax of each row of k logits, in float64.
func softmaxRows(logits []float32, k int) [][]float32 {
	rows := make([][]float32, len(logits)/k)
	for i := range rows {
		row := logits[i*k : (i+1)*k]
		m := math.Inf(-1)
		for _, v := range row {
			m = max(m, float64(v))
		}
		var sum float64
		e := make([]float64, k)
		for j, v := range row {
			e[j] = math.Exp(float64(v) - m)
			sum += e[j]
		}
		p := make([]float32, k)
		for j := range p {
			p[j] = float32(e[j] / sum)
		}
		rows[i] = p
	}
	return rows
}
