package serve

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// The OpenAI-compatible API: POST /v1/completions (streamed as server-sent
// events or not) and GET /v1/models, with errors in that API's shape, so
// that the clients people already use (the official ones among them)
// speak to the server unchanged.

// apiError is an error in OpenAI's shape, with its HTTP status.
type apiError struct {
	status  int
	kind    string // "invalid_request_error", "not_found_error", ...
	param   string
	code    string
	message string
}

func (e *apiError) Error() string { return e.message }

func invalid(param, format string, args ...any) *apiError {
	return &apiError{http.StatusBadRequest, "invalid_request_error", param, "", fmt.Sprintf(format, args...)}
}

// writeAPIError answers err in OpenAI's shape: {"error": {"message",
// "type", "param", "code"}}.
func writeAPIError(w http.ResponseWriter, err error) int {
	var ae *apiError
	var re *RequestError
	var he *httpError
	var mb *http.MaxBytesError
	switch {
	case errors.As(err, &ae):
	case errors.As(err, &he):
		ae = &apiError{he.code, "invalid_request_error", "", "", he.msg}
	case errors.As(err, &re):
		ae = &apiError{http.StatusBadRequest, "invalid_request_error", "", "", re.Msg}
	case errors.As(err, &mb):
		ae = &apiError{http.StatusRequestEntityTooLarge, "invalid_request_error", "", "", fmt.Sprintf("the body is over the %d bytes a request may have", mb.Limit)}
	case errors.Is(err, ErrOverloaded):
		ae = &apiError{http.StatusServiceUnavailable, "server_error", "", "overloaded", err.Error()}
	default:
		ae = &apiError{http.StatusInternalServerError, "server_error", "", "", "the model failed: " + err.Error()}
	}
	var param, code any
	if ae.param != "" {
		param = ae.param
	}
	if ae.code != "" {
		code = ae.code
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(ae.status)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": ae.message, "type": ae.kind, "param": param, "code": code}})
	return ae.status
}

// openAI wraps an API handler: not ready is 503, an error is answered in
// the API's shape; the request's status and latency are recorded.
func (s *Server) openAI(path string, h func(w http.ResponseWriter, r *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		code := http.StatusOK
		if !s.Ready() {
			code = writeAPIError(w, &apiError{http.StatusServiceUnavailable, "server_error", "", "warming_up", "the server is warming up: see /readyz"})
		} else if err := h(w, r); err != nil {
			code = writeAPIError(w, err)
		}
		s.m.request(path, code, time.Since(start))
	}
}

// models answers GET /v1/models: the one model served, with its context
// (max_model_len, as vLLM names it) and vocabulary (vocab_size).
func (s *Server) models(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": []any{s.modelCard()}})
}

// modelInfo answers GET /v1/models/{model}.
func (s *Server) modelInfo(w http.ResponseWriter, r *http.Request) error {
	if id := r.PathValue("model"); id != s.engine.Model() {
		return &apiError{http.StatusNotFound, "invalid_request_error", "model", "model_not_found", fmt.Sprintf("the model %q does not exist: this server serves %q", id, s.engine.Model())}
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(s.modelCard())
}

func (s *Server) modelCard() map[string]any {
	return map[string]any{"id": s.engine.Model(), "object": "model", "created": s.started.Unix(), "owned_by": "leangrad",
		"max_model_len": s.engine.g.Cfg.Context, "vocab_size": s.engine.g.Cfg.Vocab}
}

// completionRequest is a /v1/completions body: OpenAI's fields, and top_k
// and ignore_eos (vLLM's extensions). A field OpenAI has and the server
// does not is refused when set to what it cannot do.
type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	MaxTokens     *int            `json:"max_tokens"`
	Temperature   *float64        `json:"temperature"`
	TopP          *float64        `json:"top_p"`
	TopK          *int            `json:"top_k"`
	N             *int            `json:"n"`
	Stream        bool            `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Logprobs         *int            `json:"logprobs"`
	Echo             bool            `json:"echo"`
	Stop             json.RawMessage `json:"stop"`
	PresencePenalty  *float64        `json:"presence_penalty"`
	FrequencyPenalty *float64        `json:"frequency_penalty"`
	BestOf           *int            `json:"best_of"`
	LogitBias        map[string]any  `json:"logit_bias"`
	Seed             *int64          `json:"seed"`
	User             string          `json:"user"`
	Suffix           *string         `json:"suffix"`
	IgnoreEOS        bool            `json:"ignore_eos"`
}

// prompts reads the prompt field: a string, strings, tokens, or lists of
// tokens: one request a prompt.
func (c *completionRequest) prompts(s *Server) ([][]int32, error) {
	if len(bytes.TrimSpace(c.Prompt)) == 0 || string(bytes.TrimSpace(c.Prompt)) == "null" {
		return nil, invalid("prompt", "prompt: missing: give the text to continue")
	}
	var one string
	if json.Unmarshal(c.Prompt, &one) == nil {
		return [][]int32{s.tok.Encode(one)}, nil
	}
	var texts []string
	if json.Unmarshal(c.Prompt, &texts) == nil && len(texts) > 0 {
		var out [][]int32
		for _, t := range texts {
			out = append(out, s.tok.Encode(t))
		}
		return out, nil
	}
	var toks []int32
	if json.Unmarshal(c.Prompt, &toks) == nil && len(toks) > 0 {
		return [][]int32{toks}, nil
	}
	var lists [][]int32
	if json.Unmarshal(c.Prompt, &lists) == nil && len(lists) > 0 {
		return lists, nil
	}
	return nil, invalid("prompt", "prompt: want a string, a list of strings, a list of token ids or a list of such lists")
}

// stops reads the stop field: a string or up to four.
func (c *completionRequest) stops() ([]string, error) {
	if len(c.Stop) == 0 || string(c.Stop) == "null" {
		return nil, nil
	}
	var one string
	if json.Unmarshal(c.Stop, &one) == nil {
		return []string{one}, nil
	}
	var many []string
	if json.Unmarshal(c.Stop, &many) == nil {
		return many, nil
	}
	return nil, invalid("stop", "stop: want a string or a list of up to 4 strings")
}

// request is the engine's request for one prompt, OpenAI's defaults where
// a field is absent (max_tokens 16, temperature 1, top_p 1, n 1).
func (c *completionRequest) request(prompt []int32) (Request, error) {
	r := Request{Prompt: prompt, MaxTokens: 16, Temperature: 1, TopP: 1, N: 1, IgnoreEOS: c.IgnoreEOS}
	given(&r.MaxTokens, c.MaxTokens)
	given(&r.Temperature, c.Temperature)
	given(&r.TopP, c.TopP)
	given(&r.TopK, c.TopK)
	given(&r.N, c.N)
	given(&r.TopLogprobs, c.Logprobs)
	if c.Seed != nil {
		r.Seed = uint64(*c.Seed)
	} else {
		var b [8]byte
		rand.Read(b[:])
		for _, x := range b {
			r.Seed = r.Seed<<8 | uint64(x)
		}
	}
	switch {
	case r.N == 0:
		return r, invalid("n", "n: 0: want 1 to %d", MaxN)
	case c.Echo:
		return r, invalid("echo", "echo: not supported")
	case c.Suffix != nil && *c.Suffix != "":
		return r, invalid("suffix", "suffix: not supported")
	case c.PresencePenalty != nil && *c.PresencePenalty != 0, c.FrequencyPenalty != nil && *c.FrequencyPenalty != 0:
		return r, invalid("presence_penalty", "presence_penalty and frequency_penalty: only 0 is supported")
	case c.BestOf != nil && *c.BestOf != r.N:
		return r, invalid("best_of", "best_of: only n (%d) is supported", r.N)
	case len(c.LogitBias) > 0:
		return r, invalid("logit_bias", "logit_bias: not supported")
	case c.Logprobs != nil && *c.Logprobs < 0:
		return r, invalid("logprobs", "logprobs: %d: want 0 to 5", *c.Logprobs)
	}
	var err error
	r.Stop, err = c.stops()
	return r, err
}

// completion is one choice's result so far.
type completion struct {
	text    []byte
	tokens  []string
	lps     []float32
	tops    []map[string]float32
	offsets []int
	finish  string
	n       int
}

// completions answers POST /v1/completions.
func (s *Server) completions(w http.ResponseWriter, r *http.Request) error {
	arrived := time.Now()
	data, err := s.body(w, r)
	if err != nil {
		return err
	}
	var c completionRequest
	if err := decodeJSON(data, &c); err != nil {
		return err
	}
	if c.Model != s.engine.Model() {
		return &apiError{http.StatusNotFound, "invalid_request_error", "model", "model_not_found",
			fmt.Sprintf("the model %q does not exist: this server serves %q (GET /v1/models)", c.Model, s.engine.Model())}
	}
	prompts, err := c.prompts(s)
	if err != nil {
		return err
	}
	var reqs []Request
	promptTokens := 0
	for _, p := range prompts {
		q, err := c.request(p)
		if err != nil {
			return err
		}
		if err := s.engine.check(&q); err != nil {
			return err
		}
		reqs, promptTokens = append(reqs, q), promptTokens+len(p)
	}
	// Every prompt submitted before anything is answered: all run or none.
	chans := make([]<-chan Event, len(reqs))
	for i, q := range reqs {
		if chans[i], err = s.engine.Submit(r.Context(), q); err != nil {
			return err // what was submitted ends when the request's context does
		}
	}
	id, created := "cmpl-"+randomHex(12), time.Now().Unix()
	n := reqs[0].N
	choices := make([]completion, len(reqs)*n)
	logprobs := c.Logprobs != nil
	if !c.Stream {
		for i, ch := range chans {
			for ev := range events(ch, n) {
				if ev.Err != nil {
					return ev.Err
				}
				choices[i*n+ev.Index].add(ev, logprobs)
			}
		}
		out := make([]any, len(choices))
		completionTokens := 0
		for i, ch := range choices {
			out[i] = map[string]any{"index": i, "text": string(ch.text), "logprobs": ch.logprobs(logprobs), "finish_reason": ch.finish}
			completionTokens += ch.n
		}
		w.Header().Set("Content-Type", "application/json")
		return json.NewEncoder(w).Encode(map[string]any{"id": id, "object": "text_completion", "created": created, "model": s.engine.Model(),
			"choices": out, "system_fingerprint": nil,
			"usage": newUsage(promptTokens*n, completionTokens)})
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	flusher, _ := w.(http.Flusher)
	send := func(v any) bool {
		b, _ := json.Marshal(v)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	chunk := func(choices ...streamChoice) streamChunk {
		return streamChunk{ID: id, Object: "text_completion", Created: created, Model: s.engine.Model(), Choices: choices}
	}
	completionTokens := 0
	for ev := range merged(chans, n) {
		i := ev.prompt*n + ev.Index
		if ev.Err != nil {
			send(map[string]any{"error": map[string]any{"message": "the model failed: " + ev.Err.Error(), "type": "server_error"}})
			return nil
		}
		if ev.Token >= 0 {
			completionTokens++
			var lp any
			if logprobs {
				one := completion{}
				one.offsets = []int{len(choices[i].text)}
				one.add(ev.Event, true)
				lp = one.logprobs(true)
			}
			choices[i].add(ev.Event, false)
			if !send(chunk(streamChoice{Index: i, Text: ev.Text, Logprobs: lp})) {
				return nil
			}
			if completionTokens == 1 {
				s.m.firstFlushed("/v1/completions", time.Since(arrived))
			}
		}
		if ev.Finish != "" {
			if !send(chunk(streamChoice{Index: i, Text: ev.Text, FinishReason: &ev.Finish})) {
				return nil
			}
		}
	}
	if c.StreamOptions != nil && c.StreamOptions.IncludeUsage {
		u := chunk()
		u.Choices = []streamChoice{}
		used := newUsage(promptTokens*n, completionTokens)
		u.Usage = &used
		send(u)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	return nil
}

// streamChunk is a streamed completion's event (OpenAI's completion
// chunk): typed, where a map would make encoding/json reflect over and
// sort its keys at every token.
type streamChunk struct {
	ID                string         `json:"id"`
	Object            string         `json:"object"`
	Created           int64          `json:"created"`
	Model             string         `json:"model"`
	Choices           []streamChoice `json:"choices"`
	SystemFingerprint *string        `json:"system_fingerprint"` // always null
	Usage             *usage         `json:"usage,omitempty"`    // the last chunk's, with stream_options.include_usage
}

// streamChoice is a chunk's choice: a token's text, or the finish.
type streamChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

// usage is a completion's count of tokens.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// newUsage is the usage of prompt tokens read and completion tokens made.
func newUsage(prompt, completion int) usage { return usage{prompt, completion, prompt + completion} }

// add takes an event into the choice.
func (c *completion) add(ev Event, logprobs bool) {
	if ev.Token >= 0 {
		c.n++
		if logprobs {
			c.offsets = append(c.offsets, len(c.text))
			c.tokens = append(c.tokens, ev.Text)
			c.lps = append(c.lps, ev.Logprob)
			top := map[string]float32{}
			for _, t := range ev.Top {
				top[t.Text] = t.Logprob
			}
			c.tops = append(c.tops, top)
		}
	}
	c.text = append(c.text, ev.Text...)
	if ev.Finish != "" {
		c.finish = ev.Finish
	}
}

// logprobs is the choice's logprobs object, or nil without them.
func (c *completion) logprobs(on bool) any {
	if !on {
		return nil
	}
	return map[string]any{"tokens": c.tokens, "token_logprobs": c.lps, "top_logprobs": c.tops, "text_offset": c.offsets}
}

// events reads a request's events until all n samples ended.
func events(ch <-chan Event, n int) func(func(Event) bool) {
	return func(yield func(Event) bool) {
		for ended := 0; ended < n; {
			ev := <-ch
			if ev.Finish != "" || ev.Err != nil {
				ended++
			}
			if !yield(ev) {
				return
			}
		}
	}
}

// promptEvent is an event and the prompt it belongs to.
type promptEvent struct {
	Event
	prompt int
}

// merged reads several requests' events as they come, until every sample
// of each ended: one request's straight from its channel, several through
// a goroutine each.
func merged(chans []<-chan Event, n int) func(func(promptEvent) bool) {
	return func(yield func(promptEvent) bool) {
		if len(chans) == 1 {
			for ev := range events(chans[0], n) {
				if !yield(promptEvent{ev, 0}) {
					return
				}
			}
			return
		}
		all := make(chan promptEvent)
		stop := make(chan struct{})
		defer close(stop)
		for i, ch := range chans {
			go func() {
				for ev := range events(ch, n) {
					select {
					case all <- promptEvent{ev, i}:
					case <-stop:
						return
					}
				}
			}()
		}
		for ended := 0; ended < len(chans)*n; {
			ev := <-all
			if ev.Finish != "" || ev.Err != nil {
				ended++
			}
			if !yield(ev) {
				return
			}
		}
	}
}

// given sets *dst to a request field's value when the request gave one.
func given[T any](dst, v *T) {
	if v != nil {
		*dst = *v
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
