package serve

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/train"
)

var gptInputs = train.Inputs{Shape: []int{64}, Classes: 256, Tokenizer: "bytes"}

// apiErrorBody is an error answer in OpenAI's shape.
type apiErrorBody struct {
	Error struct {
		Message string
		Type    string
		Param   *string
		Code    *string
	}
}

// TestCompletions: /v1/completions answers as OpenAI's API does: the
// text, finish reasons, usage and log-probabilities of each choice; the
// stream's chunks make the same text and end with [DONE]; several prompts
// are several choices; errors come in the API's shape with its statuses.
func TestCompletions(t *testing.T) {
	s, hs := open(t, "gpt-mini", gptInputs, Options{})
	url := hs.URL + "/v1/completions"
	code, out := post(t, url, "application/json", []byte(`{"model": "gpt-mini", "prompt": "The quick", "max_tokens": 10, "temperature": 0, "n": 2, "logprobs": 3}`))
	var got struct {
		Object  string
		Model   string
		Choices []struct {
			Index        int
			Text         string
			FinishReason string `json:"finish_reason"`
			Logprobs     struct {
				Tokens        []string
				TokenLogprobs []float64            `json:"token_logprobs"`
				TopLogprobs   []map[string]float64 `json:"top_logprobs"`
				TextOffset    []int                `json:"text_offset"`
			}
		}
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
			TotalTokens      int `json:"total_tokens"`
		}
	}
	if code != 200 || json.Unmarshal([]byte(out), &got) != nil {
		t.Fatalf("%d %s", code, out)
	}
	want, err := s.Engine().g.Generate(s.dev, s.tok.Encode("The quick"), 10, nnGreedy)
	if err != nil {
		t.Fatal(err)
	}
	wantText := s.tok.Decode(want)
	if got.Object != "text_completion" || got.Model != "gpt-mini" || len(got.Choices) != 2 {
		t.Fatalf("%s", out)
	}
	for i, c := range got.Choices {
		lp := c.Logprobs
		if c.Index != i || strings.ToValidUTF8(wantText, "\uFFFD") != c.Text || c.FinishReason != "length" || len(lp.Tokens) != 10 ||
			len(lp.TokenLogprobs) != 10 || len(lp.TopLogprobs) != 10 || lp.TextOffset[0] != 0 {
			t.Errorf("choice %d: %+v; want %q", i, c, wantText)
		}
		for j, top := range lp.TopLogprobs {
			best := -1e9
			for _, v := range top {
				best = max(best, v)
			}
			if len(top) == 0 || lp.TokenLogprobs[j] > 0 || best > lp.TokenLogprobs[j]+1e-4 { // greedy: the chosen is the most likely
				t.Errorf("choice %d token %d: logprob %v, top %v", i, j, lp.TokenLogprobs[j], top)
			}
		}
	}
	if u := got.Usage; u.PromptTokens != 2*9 || u.CompletionTokens != 20 || u.TotalTokens != 38 {
		t.Errorf("usage %+v, want 18 prompt tokens (9 a choice), 20 completion", u)
	}

	// The stream.
	resp, err := hsClient(hs).Post(url, "application/json", strings.NewReader(
		`{"model": "gpt-mini", "prompt": ["The quick", "A"], "max_tokens": 10, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("stream: %d %s", resp.StatusCode, ct)
	}
	texts, finishes := map[int]string{}, map[int]string{}
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	var usage *completionUsage
	for sc.Scan() {
		l := sc.Text()
		if l == "" {
			continue
		}
		lines = append(lines, l)
		data, ok := strings.CutPrefix(l, "data: ")
		if !ok {
			t.Fatalf("a line that is not an event: %q", l)
		}
		if data == "[DONE]" {
			break
		}
		var chunk struct {
			Choices []struct {
				Index        int
				Text         string
				FinishReason *string `json:"finish_reason"`
			}
			Usage *completionUsage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			t.Fatalf("%q: %v", data, err)
		}
		for _, c := range chunk.Choices {
			texts[c.Index] += c.Text
			if c.FinishReason != nil {
				finishes[c.Index] = *c.FinishReason
			}
		}
		if chunk.Usage != nil {
			usage = chunk.Usage
		}
	}
	if lines[len(lines)-1] != "data: [DONE]" {
		t.Errorf("the stream ends with %q", lines[len(lines)-1])
	}
	if texts[0] != got.Choices[0].Text || finishes[0] != "length" || finishes[1] != "length" || len(texts) != 2 {
		t.Errorf("streamed %v (%v), want choice 0 %q", texts, finishes, got.Choices[0].Text)
	}
	if usage == nil || usage.CompletionTokens != 20 {
		t.Errorf("the usage chunk: %+v", usage)
	}

	// Errors.
	for _, c := range []struct {
		body       string
		code       int
		kind, text string
	}{
		{`{"model": "gpt-2", "prompt": "a"}`, 404, "invalid_request_error", `the model "gpt-2" does not exist`},
		{`{"model": "gpt-mini"}`, 400, "invalid_request_error", "prompt: missing"},
		{`{"model": "gpt-mini", "prompt": "a", "temperature": -1}`, 400, "invalid_request_error", "temperature: -1"},
		{`{"model": "gpt-mini", "prompt": "a", "max_tokens": 100}`, 400, "invalid_request_error", "max_tokens: 100 after a prompt of 1 tokens"},
		{`{"model": "gpt-mini", "prompt": "a", "echo": true}`, 400, "invalid_request_error", "echo: not supported"},
		{`{"model": "gpt-mini", "prompt": "a", "n": 0}`, 400, "invalid_request_error", "n: 0"},
		{`{"model": "gpt-mini", "prompt": {"a": 1}}`, 400, "invalid_request_error", "prompt: want a string"},
		{`{"model": "gpt-mini", "prompt": "a"`, 400, "invalid_request_error", "JSON"},
	} {
		code, out := post(t, url, "application/json", []byte(c.body))
		var e apiErrorBody
		if json.Unmarshal([]byte(out), &e) != nil || code != c.code || e.Error.Type != c.kind || !strings.Contains(e.Error.Message, c.text) {
			t.Errorf("%s: %d %s; want %d, %s and %q", c.body, code, out, c.code, c.kind, c.text)
		}
	}
}

// TestModels: /v1/models lists the one model; /v1/models/{id} is it or 404.
func TestModels(t *testing.T) {
	_, hs := open(t, "gpt-mini", gptInputs, Options{})
	for path, want := range map[string]string{
		"/v1/models":          `{"data":[{"created":`,
		"/v1/models/gpt-mini": `"id":"gpt-mini","max_model_len":64,"object":"model"`,
		"/v1/models/other":    `"code":"model_not_found"`,
	} {
		resp, err := hsClient(hs).Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		bufio.NewReader(resp.Body).WriteTo(&b)
		resp.Body.Close()
		if !strings.Contains(b.String(), want) {
			t.Errorf("GET %s: %d %s; want %s", path, resp.StatusCode, b.String(), want)
		}
	}
}

// TestOpenAIClient runs the official OpenAI client for Node
// (testdata/openai_client.cjs) against the server: the API as its users'
// clients speak it. It needs node and the openai package where node finds
// it (NODE_PATH): .ci/run installs them and sets
// LEANGRAD_REQUIRE_OPENAI_CLIENT=1, under which their absence fails.
func TestOpenAIClient(t *testing.T) {
	node, err := exec.LookPath("node")
	if err == nil {
		err = exec.Command(node, "-e", "require.resolve('openai')").Run()
	}
	if err != nil {
		if os.Getenv("LEANGRAD_REQUIRE_OPENAI_CLIENT") == "1" {
			t.Fatalf("node and its openai package (NODE_PATH=%q): %v", os.Getenv("NODE_PATH"), err)
		}
		t.Skipf("no node with the openai package (NODE_PATH=%q): %v", os.Getenv("NODE_PATH"), err)
	}
	_, hs := open(t, "gpt-mini", gptInputs, Options{})
	script, _ := filepath.Abs("testdata/openai_client.cjs")
	out, err := exec.Command(node, script, hs.URL+"/v1", "gpt-mini").CombinedOutput()
	if err != nil {
		t.Fatalf("the OpenAI client: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

var nnGreedy = nn.Sampling{}

func hsClient(hs *httptest.Server) *http.Client { return hs.Client() }

type completionUsage struct {
	CompletionTokens int `json:"completion_tokens"`
}

// Every request gets a status and a message, never an empty reply: sizes
// that overflow, values of the wrong kind (naming the field, OpenAI's
// param), and a body shorter than its Content-Length, are 400s.
func TestAnswersEveryRequest(t *testing.T) {
	_, hs := open(t, "gpt-mini", gptInputs, Options{})
	for _, c := range []struct{ path, body, want string }{
		{"/v1/completions", `{"model": "gpt-mini", "prompt": "a", "max_tokens": 9223372036854775807}`, "max_tokens: 9223372036854775807 after a prompt of 1 tokens"},
		{"/v1/completions", `{"model": "gpt-mini", "prompt": "a", "max_tokens": 99999999999999999999}`, `"message":"max_tokens: number 99999999999999999999 where an integer of 64 bits is wanted","param":"max_tokens"`},
		{"/v1/completions", `{"model": "gpt-mini", "prompt": "a", "top_p": "high"}`, `"message":"top_p: string where a number is wanted","param":"top_p"`},
		{"/v1/completions", `{"model": "gpt-mini", "prompt": "a", "best_of_all": 2}`, `"message":"the body has a field \"best_of_all\" that this endpoint does not take","param":"best_of_all"`},
		{"/v1/completions", `[{"model": "gpt-mini"}]`, "the body is a JSON array where an object is wanted"},
		{"/v1/generate", `{"prompt": "a", "max_tokens": 1e30}`, `{"error":"max_tokens: number 1e30 where an integer of 64 bits is wanted"}`},
		{"/v1/completions", `{"model": "gpt-mini", "prompt": "a", "n": 9223372036854775807}`, "n: 9223372036854775807"},
		{"/v1/completions", `{"model": "gpt-mini", "prompt": [1, 4294967297]}`, "prompt"},
		{"/v1/generate", `{"prompt": "a", "max_tokens": 9223372036854775807}`, "max_tokens: 9223372036854775807 after a prompt of 1 tokens"},
	} {
		code, out := post(t, hs.URL+c.path, "application/json", []byte(c.body))
		if code != 400 || !strings.Contains(out, c.want) {
			t.Errorf("%s %s: %d %q; want 400 and %q", c.path, c.body, code, out, c.want)
		}
	}
	for _, path := range []string{"/v1/completions", "/v1/generate"} {
		conn, err := net.Dial("tcp", hs.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":", path)
		conn.(*net.TCPConn).CloseWrite()
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s, a short body: no answer: %v", path, err)
		}
		var b strings.Builder
		bufio.NewReader(resp.Body).WriteTo(&b)
		conn.Close()
		if resp.StatusCode != 400 || !strings.Contains(b.String(), "the body ended after 10 of the 100 bytes its Content-Length says") {
			t.Errorf("%s, a short body: %d %s", path, resp.StatusCode, b.String())
		}
	}
}

// FuzzRequests: whatever body a client posts to the GPT server's
// endpoints, the answer has a status and a message: a 200 with its
// answer, or a 4xx or 503 whose body says why; never a 500, an empty
// reply or a panic.
func FuzzRequests(f *testing.F) {
	for _, seed := range []struct {
		path uint8
		body string
	}{
		{0, `{"model": "gpt-mini", "prompt": "Once", "max_tokens": 4}`},
		{0, `{"model": "gpt-mini", "prompt": ["a", "b"], "max_tokens": 2, "n": 2, "logprobs": 2, "stream": true}`},
		{0, `{"model": "gpt-mini", "prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0.5, "top_p": 0.9, "stop": ["x"], "seed": 3}`},
		{0, `{"model": "gpt-mini", "prompt": "a", "max_tokens": 9223372036854775807}`},
		{1, `{"prompt": "Once", "max_tokens": 4, "top_k": 3}`},
		{1, `{"prompt": "a", "max_tokens": -1}`},
		{1, `{"prompt": "\xff\xfe", "stop": [""]}`},
		{0, `[]`},
		{1, `{"prompt": null}`},
	} {
		f.Add(seed.path, []byte(seed.body))
	}
	_, hs := open(f, "gpt-mini", gptInputs, Options{})
	client := hsClient(hs)
	client.Timeout = 20 * time.Second // far more than any request here takes: a request that hangs fails
	f.Fuzz(func(t *testing.T, path uint8, body []byte) {
		url := hs.URL + []string{"/v1/completions", "/v1/generate"}[path%2]
		resp, err := client.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("%s %q: no answer: %v", url, body, err)
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("%s %q: %d, the answer broke off: %v", url, body, resp.StatusCode, err)
		}
		ok := resp.StatusCode == http.StatusOK || resp.StatusCode/100 == 4 || resp.StatusCode == http.StatusServiceUnavailable
		if !ok || len(out) == 0 {
			t.Fatalf("%s %q: %d %q", url, body, resp.StatusCode, out)
		}
		if resp.StatusCode != http.StatusOK && !json.Valid(out) {
			t.Fatalf("%s %q: %d, not a JSON error: %q", url, body, resp.StatusCode, out)
		}
	})
}

// TestUnknownEndpoints: a request under /v1/ that no endpoint serves gets
// one clear error in the server's API shape (OpenAI's for a GPT, with
// param and code): 405 naming the method allowed, with its Allow header,
// on an endpoint's path; 404 naming the endpoints elsewhere (a chat
// request told to send its conversation as a completion's prompt); and
// counted in the requests metric under "other".
func TestUnknownEndpoints(t *testing.T) {
	_, gpt := open(t, "gpt-mini", gptInputs, Options{})
	_, classifier := open(t, "resnet8", mnistInputs, Options{})
	for _, c := range []struct {
		hs           *httptest.Server
		method, path string
		code         int
		allow        string
		want         []string
	}{
		{gpt, "POST", "/v1/chat/completions", 404, "", []string{`"code":"unknown_url"`, `"type":"invalid_request_error"`, "POST /v1/chat/completions: no such endpoint", "POST /v1/completions, GET /v1/models", "prompt of POST /v1/completions"}},
		{gpt, "GET", "/v1/completions", 405, "POST", []string{`"code":"method_not_allowed"`, "GET /v1/completions: this endpoint answers POST only"}},
		{gpt, "DELETE", "/v1/models/gpt-mini", 405, "GET", []string{"answers GET only"}},
		{gpt, "GET", "/v1/models/a/b", 404, "", []string{"GET /v1/models/a/b: no such endpoint"}},
		{gpt, "POST", "/v1/predict", 404, "", []string{"no such endpoint"}},
		{classifier, "POST", "/v1/completions", 404, "", []string{`{"error":"POST /v1/completions: no such endpoint; this server answers POST /v1/predict"}`}},
		{classifier, "GET", "/v1/predict", 405, "POST", []string{`{"error":"GET /v1/predict: this endpoint answers POST only"}`}},
	} {
		req, err := http.NewRequest(c.method, c.hs.URL+c.path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.code || resp.Header.Get("Allow") != c.allow || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %d, Allow %q, %s; want %d, Allow %q, JSON", c.method, c.path, resp.StatusCode, resp.Header.Get("Allow"), resp.Header.Get("Content-Type"), c.code, c.allow)
		}
		for _, w := range c.want {
			if !strings.Contains(string(b), w) {
				t.Errorf("%s %s: %s; want %s in it", c.method, c.path, b, w)
			}
		}
	}
	resp, err := gpt.Client().Get(gpt.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `leangrad_requests_total{code="404",path="other"} 3`; !strings.Contains(string(b), want) {
		t.Errorf("the metrics lack %s", want)
	}
}
