package main

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leangrad/leangrad/cmd/internal/cmdenv"
	"github.com/leangrad/leangrad/internal/testmodel"
	"github.com/leangrad/leangrad/serve"
	"github.com/leangrad/leangrad/tensor"
	"github.com/leangrad/leangrad/train"
)

// gptServer serves an untrained gpt-mini of bytes on the CPU, warmed up.
func gptServer(t *testing.T) *httptest.Server {
	dev := tensor.CPU()
	path := testmodel.Checkpoint(t, dev, "gpt-mini", train.Inputs{Shape: []int{64}, Classes: 256, Tokenizer: "bytes"}, nil)
	s, err := serve.Open(tensor.NewDevice(dev.Backend()), path, serve.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WarmUp(); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() { hs.Close(); s.Close() })
	return hs
}

// The load generator against a server: every request answered with the
// tokens it asked for, the figures reported and written as JSON; a
// load that cannot fit the context is refused before it starts.
func TestLoad(t *testing.T) {
	hs := gptServer(t)
	out := filepath.Join(t.TempDir(), "load.json")
	var o, e bytes.Buffer
	code := command([]string{"-url", hs.URL, "-clients", "4", "-requests", "12", "-prompt", "2-10", "-max-tokens", "4-12",
		"-shared-prefix", "8", "-json", out}, &o, &e)
	if code != 0 || !strings.Contains(o.String(), "12 answered, 0 failed") || !strings.Contains(o.String(), "inter-token latency") {
		t.Fatalf("exit %d:\n%s%s", code, o.String(), e.String())
	}
	var r results
	b, err := os.ReadFile(out)
	if err != nil || json.Unmarshal(b, &r) != nil || r.Requests != 12 || r.Failed != 0 || r.GeneratedTokens < 12*4 || r.Steps == 0 {
		t.Errorf("%v %+v", err, r)
	}
	if !(r.ServerTTFTMean > 0 && r.ServerTTFTMean <= r.ServerFlushedMean && r.ServerFlushedMean <= r.TTFT.Max) ||
		!strings.Contains(o.String(), "the server's own, from arrival in its engine: mean") || !strings.Contains(o.String(), "to the first token flushed: mean") {
		t.Errorf("the server's mean time to first token %v s in its engine, %v s to the first flushed; the client's at most %v s:\n%s",
			r.ServerTTFTMean, r.ServerFlushedMean, r.TTFT.Max, o.String())
	}
	if r.NewConnections < 1 || r.NewConnections > 4 || !(r.Sent.P50 > 0 && r.Sent.Max <= r.Latency.Max) || !strings.Contains(o.String(), "on new connections") {
		t.Errorf("4 clients' requests: %d on new connections, written %+v s after they began (latest answer %v s)", r.NewConnections, r.Sent, r.Latency.Max)
	}
	if r.PoolAllocatedAfter != r.PoolAllocatedBefore {
		t.Errorf("the server's pool: %d bytes before the load, %d after", r.PoolAllocatedBefore, r.PoolAllocatedAfter)
	}
	o.Reset()
	if code := command([]string{"-url", hs.URL, "-warm", "-clients", "8", "-requests", "16", "-max-tokens", "2", "-json", out}, &o, &e); code != 0 ||
		!strings.Contains(o.String(), "8 clients, their connections opened first") || !strings.Contains(o.String(), ", 0 on new connections") {
		t.Errorf("-warm: exit %d:\n%s%s", code, o.String(), e.String())
	}
	o.Reset()
	e.Reset()
	if code := command([]string{"-url", hs.URL, "-api", "generate", "-clients", "2", "-requests", "4", "-max-tokens", "5"}, &o, &e); code != 0 ||
		!strings.Contains(o.String(), "4 answered, 0 failed") {
		t.Errorf("-api generate: exit %d:\n%s%s", code, o.String(), e.String())
	}
	e.Reset()
	if code := command([]string{"-url", hs.URL, "-prompt", "60", "-max-tokens", "10"}, &o, &e); code != cmdenv.ExitUsage ||
		!strings.Contains(e.String(), "reach 70 positions; gpt-mini's context is 64") {
		t.Errorf("a load past the context: exit %d: %s", code, e.String())
	}
}

// Bad flags are one line each, before any request.
func TestMistakes(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-url", "http://10.1.2.3:8080"}, "10.1.2.3 is not a loopback address"},
		{[]string{"-url", "ftp://127.0.0.1"}, "want http://HOST:PORT"},
		{[]string{"-clients", "0"}, "-clients 0: want 1 to 4096"},
		{[]string{"-prompt", "9-3"}, `-prompt "9-3": want a count of tokens`},
		{[]string{"-max-tokens", "x"}, "want a count of tokens"},
		{[]string{"-api", "chat"}, "-api chat: want completions or generate"},
		{[]string{"-duration", "0s"}, "-duration 0s: want a positive time"},
		{[]string{"extra"}, "loadgen takes flags only"},
		{[]string{"-rate", "-1"}, "-rate -1: want 0 (each client sends its next when its last is answered) or a finite rate a second"},
		{[]string{"-rate", "NaN"}, "-rate NaN: want 0"},
		{[]string{"-temperature", "-0.5"}, "-temperature -0.5: want 0 (greedy) or more"},
		{[]string{"-shared-prefix", "-3"}, "-shared-prefix -3: want 0 or more tokens"},
	} {
		var o, e bytes.Buffer
		if code := command(c.args, &o, &e); code != cmdenv.ExitUsage || !strings.Contains(e.String(), c.want) || strings.Count(strings.TrimSpace(e.String()), "\n") != 0 {
			t.Errorf("%v: exit %d: %s; want %q, one line", c.args, code, e.String(), c.want)
		}
	}
}
