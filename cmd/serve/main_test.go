package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leangrad/leangrad/cmd/internal/cmdenv"
	"github.com/leangrad/leangrad/internal/testmodel"
	"github.com/leangrad/leangrad/tensor"
	"github.com/leangrad/leangrad/train"
)

// With LEANGRAD_TEST_SERVE set, the test binary is the serve command.
func TestMain(m *testing.M) {
	if os.Getenv("LEANGRAD_TEST_SERVE") == "" {
		os.Exit(m.Run())
	}
	cmdenv.Setup()
	os.Exit(cmdenv.Main("serve", func() int { return command(os.Args[1:], os.Stdout, os.Stderr, nil) }))
}

func serveCmd(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "LEANGRAD_TEST_SERVE=1")
	return cmd
}

// checkpoint is an untrained model's checkpoint as train -save writes it:
// a ResNet-8 of 28×28 images, or a GPT of bytes.
func checkpoint(t *testing.T, model string) string {
	in := train.Inputs{Shape: []int{1, 28, 28}, Classes: 10, Mean: []float32{0.3}, Std: []float32{0.3}}
	if model == "gpt-mini" {
		in = train.Inputs{Shape: []int{64}, Classes: 256, Tokenizer: "bytes"}
	}
	return testmodel.Checkpoint(t, tensor.CPU(), model, in, nil)
}

// start starts the command and reads its output to the line that says
// where it listens: it returns the command (killed when the test ends),
// the rest of its output, the address, what it said and its stderr.
func start(t *testing.T, args ...string) (*exec.Cmd, *bufio.Scanner, string, *strings.Builder, *bytes.Buffer) {
	cmd := serveCmd(args...)
	out, _ := cmd.StdoutPipe()
	stderr := &bytes.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	sc := bufio.NewScanner(out)
	var addr string
	said := &strings.Builder{}
	for sc.Scan() {
		said.WriteString(sc.Text() + "\n")
		if a, ok := strings.CutPrefix(sc.Text(), "ready on http://"); ok {
			addr = a
			break
		}
	}
	return cmd, sc, addr, said, stderr
}

// The command end to end: it warms up, says where it listens, answers, and
// on SIGTERM answers the request in flight before it exits 0.
func TestServeDrainsOnSIGTERM(t *testing.T) {
	ck := checkpoint(t, "resnet8")
	cmd, sc, addr, said, stderr := start(t, "-addr", "127.0.0.1:0", "-device", "cpu", "-window", "400ms", ck)
	if addr == "" || !strings.Contains(said.String(), "warmed up batches of [1 2 4 8 16 32 64]") {
		t.Fatalf("no ready line:\n%s%s", said.String(), stderr.String())
	}
	img := make([]float64, 784)
	body, _ := json.Marshal(map[string]any{"images": [][]float64{img}})
	type answer struct {
		code int
		body string
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		resp, err := http.Post("http://"+addr+"/v1/predict", "application/json", bytes.NewReader(body))
		if err != nil {
			got <- answer{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- answer{code: resp.StatusCode, body: string(b)}
	}()
	time.Sleep(100 * time.Millisecond) // the request waits in the batcher's 400 ms window
	cmd.Process.Signal(syscall.SIGTERM)
	a := <-got
	for sc.Scan() { // to the end of its output, before Wait closes the pipe
		said.WriteString(sc.Text() + "\n")
	}
	err := cmd.Wait()
	if a.err != nil || a.code != 200 || !strings.Contains(a.body, `"predictions"`) {
		t.Errorf("the request in flight at SIGTERM: %v %d %s", a.err, a.code, a.body)
	}
	if err != nil || !strings.Contains(said.String(), "SIGTERM: answering the requests in flight") {
		t.Errorf("exit: %v\n%s%s", err, said.String(), stderr.String())
	}
}

// Bad flags and models are one line each, before anything is loaded.
func TestServeMistakes(t *testing.T) {
	junk := filepath.Join(t.TempDir(), "junk.st")
	os.WriteFile(junk, []byte("not a checkpoint"), 0o644)
	gpt := checkpoint(t, "gpt-mini")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, cmdenv.ExitUsage, "no model: give the checkpoint train -save wrote"},
		{[]string{"/nonexistent.st"}, cmdenv.ExitUsage, "/nonexistent.st: no such file or directory"},
		{[]string{"-max-batch", "0", "-addr", "nohost", junk}, cmdenv.ExitUsage, "-max-batch 0: want 1 or more"},
		{[]string{"-device", "cpu", junk}, cmdenv.ExitNothingRan, junk + ":"},
		{[]string{"-dtype", "i32", "-block-size", "0", junk}, cmdenv.ExitUsage, `-dtype "i32": want f32, f16 or bf16`},
		{[]string{"-dtype", "u8", gpt}, cmdenv.ExitUsage, `-dtype "u8": want f32, f16 or bf16`},
		{[]string{"-drain", "-1s", junk}, cmdenv.ExitUsage, "-drain -1s: want a positive time"},
		{[]string{"-read-timeout", "0s", junk}, cmdenv.ExitUsage, "-read-timeout 0s: want a positive time"},
		{[]string{"-window", "-1ms", junk}, cmdenv.ExitUsage, "-window -1ms: want 0 (no wait) or more"},
		{[]string{"-dtype", "f64", junk}, cmdenv.ExitUsage, `-dtype "f64": want f32, f16 or bf16`},
		{[]string{"-block-size", "0", junk}, cmdenv.ExitUsage, "-block-size 0: want 1 or more"},
		{[]string{"-kv-memory", "lots", junk}, cmdenv.ExitUsage, "-kv-memory"},
		{[]string{"-kv-memory", "1KiB", gpt}, cmdenv.ExitUsage, "-kv-memory \"1KiB\": less than 1 MiB"},
		{[]string{"-device", "cpu", "-block-size", "1024", "-kv-memory", "1MiB", gpt}, cmdenv.ExitFailed, "holds 0 blocks of 1024 positions"},
		{[]string{"-max-memory", "lots", gpt}, cmdenv.ExitUsage, "-max-memory"},
		{[]string{"-device", "cpu", "-max-memory", "1MiB", gpt}, cmdenv.ExitNothingRan, "building gpt-mini: cpu out of memory"},
		{[]string{"-device", "cpu", "-max-memory", "6MiB", "-kv-memory", "4MiB", "-max-seqs", "4", gpt}, cmdenv.ExitFailed, "under -max-memory 6.00 MiB: a GPT's steps take less with a lower -max-seqs or -max-batch-tokens"},
		{[]string{"-device", "cpu", "-max-seqs", "100000000000", gpt}, cmdenv.ExitFailed, "a decoding step of 100000000000 sequences (MaxSeqs, serve's -max-seqs): their logits and inputs alone take"},
		{[]string{"-device", "cpu", "-max-batch-tokens", "100000000000", gpt}, cmdenv.ExitFailed, "a step of 100000000000 prompt rows (MaxBatchTokens, serve's -max-batch-tokens): their MLP's activations alone take"},
	} {
		var o, e bytes.Buffer
		cmd := serveCmd(tc.args...)
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != tc.code || !strings.Contains(e.String(), tc.want) || strings.Contains(e.String(), "goroutine ") {
			t.Errorf("serve %v: %v\n%s%s; want exit %d and %q", tc.args, err, o.String(), e.String(), tc.code, tc.want)
		}
	}
	var help bytes.Buffer
	cmd := serveCmd("-h")
	cmd.Stdout, cmd.Stderr = &help, &help
	if err := cmd.Run(); err != nil || !strings.Contains(help.String(), "-dtype") || strings.Contains(help.String(), "(default dtype(") {
		t.Errorf("serve -h: %v\n%s", err, help.String())
	}
}

// A GPT is served through the OpenAI-compatible API, its pool capped: the
// ready line says what its key-value memory holds and the cap, and a
// completion comes back.
func TestServeGPT(t *testing.T) {
	ck := checkpoint(t, "gpt-mini")
	cmd, sc, addr, said, stderr := start(t, "-addr", "127.0.0.1:0", "-device", "cpu", "-kv-memory", "4MiB", "-max-seqs", "4", "-max-memory", "64MiB", ck)
	if addr == "" || !strings.Contains(said.String(), "a key-value memory of ") || !strings.Contains(said.String(), "run eagerly") ||
		!strings.Contains(said.String(), "capped at 64.00 MiB") {
		t.Fatalf("no ready line:\n%s%s", said.String(), stderr.String())
	}
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(`{"model": "gpt-mini", "prompt": "Hi", "max_tokens": 5}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"completion_tokens":5`) {
		t.Errorf("a completion: %d %s", resp.StatusCode, b)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	for sc.Scan() {
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("exit: %v\n%s", err, stderr.String())
	}
}
