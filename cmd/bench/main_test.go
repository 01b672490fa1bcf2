package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leangrad/leangrad/cmd/internal/cmdenv"
)

func TestBenchCommandOnCPU(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	code := run([]string{"-device", "cpu", "-specs", "mlp:4", "-steps", "2", "-warmup", "0", "-pytorch", "", "-claims=false", "-out", dir}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	data, err := os.ReadFile(filepath.Join(dir, "bench.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Results []struct {
			Model    string  `json:"model"`
			Config   string  `json:"config"`
			MedianMS float64 `json:"median_ms"`
		} `json:"results"`
	}
	if err := json.Unmarshal(data, &rep); err != nil || len(rep.Results) != 2 || rep.Results[1].Config != "amp" || rep.Results[0].MedianMS <= 0 {
		t.Errorf("bench.json: %v %+v", err, rep)
	}
	for _, f := range []string{"bench.json", "bench.md", "step_time.png", "peak_memory.png", "timeline_mlp_b4.png"} {
		p := filepath.Join(dir, f)
		if st, err := os.Stat(p); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
		if !strings.Contains(errb.String(), "wrote "+p+"\n") {
			t.Errorf("no line says it wrote %s:\n%s", p, errb.String())
		}
	}
	if !strings.Contains(out.String(), "| mlp | 4 | fp32 |") {
		t.Errorf("stdout:\n%s", out.String())
	}
	for _, bad := range [][]string{{"-specs", "vgg:1"}, {"-specs", "mlp:x"}, {"-steps", "0"}} {
		if code := run(bad, &out, &errb); code != cmdenv.ExitUsage {
			t.Errorf("%v: exit %d", bad, code)
		}
	}
}

// Every flag is checked before any work: a bad -out, -configs, -cpuprofile,
// -largest-batch or -largest-model is reported at once, all of them together,
// a line each, with nothing measured (no SGEMM probe, no report).
func TestBenchChecksBeforeWork(t *testing.T) {
	merged := filepath.Join(t.TempDir(), "bench.json")
	os.WriteFile(merged, []byte("{}"), 0o644)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-device", "cpu", "-out", "/proc/leangrad-x", "-configs", "fp32,fp64", "-cpuprofile", "/proc/leangrad-x/p.out",
			"-largest-batch", "resnet20:512:24", "-compile-configs", "amp,int8"},
			[]string{"-out /proc/leangrad-x: cannot write in /proc", `-configs fp32,fp64: unknown configuration "fp64"`,
				"-cpuprofile /proc/leangrad-x/p.out: cannot write in /proc", "-largest-batch resnet20:512:24: resnet20 is not a language model",
				`-compile-configs amp,int8: unknown configuration "int8"`}},
		{[]string{"-merge", merged, "-out", filepath.Dir(merged)}, []string{"-out " + merged + ": it would replace -merge " + merged}},
		{[]string{"-device", "cpu", "-plan-room", "-0.5"}, []string{"-plan-room -0.5: want a fraction of 0 or more, or -1 for the default"}},
		{[]string{"-device", "cpu", "-plan-tolerance", "-0.2"}, []string{"-plan-tolerance -0.2: want a fraction of 0 or more, or -1 for the default"}},
		{[]string{"-device", "cpu", "-profile-share", "101"}, []string{"-profile-share 101: want a percent from 0 to 100"}},
		{[]string{"-device", "cpu", "-largest-model", "0"}, []string{"-largest-model 0: \"0\": want a cap in GiB above 0"}},
		{[]string{"-device", "cpu", "-largest-model", "24:1024:8"}, []string{"-largest-model 24:1024:8: want GIB or GIB:CONTEXT:BATCH:MODEL,..."}},
		{[]string{"-device", "cpu", "-largest-model", "24:1024:0:gpt2"}, []string{`-largest-model 24:1024:0:gpt2: batch "0": want a number of windows`}},
		{[]string{"-device", "cpu", "-specs", "", "-largest-model", "1:64:2:gpt2,resnet20"}, []string{"-largest-model 1:64:2:gpt2,resnet20: resnet20 is not a language model"}},
		{[]string{"-device", "cpu", "-specs", ""}, []string{"-specs is empty"}},
		{[]string{"-device", "cpu", "-specs", "gpt2:99999999999"}, []string{`-specs "gpt2:99999999999": batch "99999999999": want a number of examples from 1 to 1048576`}},
		{[]string{"-device", "cpu", "-specs", "resnet20:0"}, []string{`-specs "resnet20:0": batch "0": want a number of examples from 1 to 1048576`}},
		{[]string{"-device", "cpu", "-plan-tolerance", "NaN", "-plan-room", "+Inf"}, []string{"-plan-tolerance NaN: want a fraction", "-plan-room +Inf: want a fraction"}},
		{[]string{"-device", "cpu", "-warmup", "-1", "-steps", "0", "-rounds", "0"}, []string{"-warmup -1: want 0 or more steps", "-steps 0: want 1 or more", "-rounds 0: want 1 or more"}},
	} {
		var out, errb bytes.Buffer
		code := run(tc.args, &out, &errb)
		if code != cmdenv.ExitUsage || out.Len() != 0 || strings.Contains(errb.String(), "SGEMM") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", tc.args, code, out.String(), errb.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(errb.String(), w) {
				t.Errorf("%v: stderr lacks %q:\n%s", tc.args, w, errb.String())
			}
		}
		if lines := strings.Count(strings.TrimSpace(errb.String()), "\n") + 1; lines != len(tc.want) { // a line a mistake
			t.Errorf("%v: %d lines for %d mistakes:\n%s", tc.args, lines, len(tc.want), errb.String())
		}
	}
}

// TestBenchWithoutPyTorch: an interpreter without torch is a note in the
// report, not a failed run; on the CPU the report carries the SGEMM figures.
func TestBenchWithoutPyTorch(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "ref.py")
	if err := os.WriteFile(script, []byte("raise SystemExit('must not run')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := run([]string{"-device", "cpu", "-specs", "mlp:4", "-configs", "fp32", "-steps", "1", "-warmup", "0",
		"-pytorch", script, "-python", "false", "-claims=false", "-out", dir}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	data, err := os.ReadFile(filepath.Join(dir, "bench.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"No PyTorch reference: false -c 'import torch' failed", "SGEMM 1024×1024×1024 on 1 thread(s)", "FMA peak"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("bench.json lacks %q", want)
		}
	}
}

// TestBenchRounds: with -rounds, the engines alternate which runs first and
// leangrad's configurations their order, each result is its median round,
// and notes give the ratios to PyTorch and to fp32 round by round. A stand-in interpreter plays PyTorch, its step taking
// 10, 20 and 30 ms in its three rounds.
func TestBenchRounds(t *testing.T) {
	dir := t.TempDir()
	python := filepath.Join(dir, "python")
	stub := `#!/bin/sh
[ "$1" = -c ] && exit 0
n=$(( $(cat "$0.count" 2>/dev/null || echo 0) + 1 )); echo $n > "$0.count"
echo "pytorch round $n" >&2
printf '{"pytorch":"stub","results":[{"engine":"pytorch","model":"mlp","batch":4,"config":"fp32","device":"cpu","steps":1,"median_ms":%d,"img_per_s":1}]}\n' $((n * 10))
`
	if err := os.WriteFile(python, []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := run([]string{"-device", "cpu", "-specs", "mlp:4", "-configs", "fp32,amp", "-steps", "1", "-warmup", "0", "-rounds", "3",
		"-pytorch", python, "-python", python, "-claims=false", "-out", dir}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var order []string
	for _, line := range strings.Split(errb.String(), "\n") {
		switch {
		case strings.HasPrefix(line, "leangrad ") && strings.HasSuffix(strings.Fields(line)[5], ":"):
			order = append(order, "L"+strings.TrimSuffix(strings.Fields(line)[5], ":"))
		case strings.HasPrefix(line, "pytorch round "):
			order = append(order, "P")
		}
	}
	if got, want := strings.Join(order, " "), "Lfp32 Lamp P P Lamp Lfp32 Lfp32 Lamp P"; got != want {
		t.Errorf("ran in the order %s, want %s (leangrad first, then PyTorch first, then leangrad; the configurations alternating)", got, want)
	}
	data, err := os.ReadFile(filepath.Join(dir, "bench.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Results []struct {
			Engine   string  `json:"engine"`
			MedianMS float64 `json:"median_ms"`
		} `json:"results"`
		Notes []string `json:"notes"`
	}
	if err := json.Unmarshal(data, &rep); err != nil || len(rep.Results) != 3 {
		t.Fatalf("bench.json: %v %+v", err, rep)
	}
	if r := rep.Results[2]; r.Engine != "pytorch" || r.MedianMS != 20 {
		t.Errorf("PyTorch's result %+v, want its median round (20 ms)", r)
	}
	var torchNote, ampNote bool
	for _, n := range rep.Notes {
		torchNote = torchNote || strings.HasPrefix(n, "mlp batch 4 fp32 over 3 rounds, leangrad's speed over PyTorch's round by round: ") &&
			strings.Contains(n, "(PyTorch first)")
		ampNote = ampNote || strings.HasPrefix(n, "mlp batch 4 amp over 3 rounds, its step time over fp32's round by round: ")
	}
	if !torchNote || !ampNote {
		t.Errorf("no round-by-round notes against PyTorch and fp32: %q", rep.Notes)
	}
}

// TestBenchGivesPyTorchTheLanguageModel: the reference script hears the
// AMP dtype and each language model's shape and recipe as the harness
// trains them (the vocabulary -vocab sets), and its GPT's results stand
// beside leangrad's. A stand-in interpreter records its arguments.
func TestBenchGivesPyTorchTheLanguageModel(t *testing.T) {
	dir := t.TempDir()
	python := filepath.Join(dir, "python")
	stub := `#!/bin/sh
[ "$1" = -c ] && exit 0
printf '%s\n' "$@" > "$0.args"
printf '{"pytorch":"stub","results":[{"engine":"pytorch","model":"gpt-mini","batch":2,"config":"amp","device":"cpu","steps":1,"median_ms":5,"img_per_s":400}]}\n'
`
	if err := os.WriteFile(python, []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := run([]string{"-device", "cpu", "-specs", "gpt-mini:2", "-configs", "amp", "-amp-dtype", "bf16", "-vocab", "96",
		"-steps", "1", "-warmup", "0", "-pytorch", python, "-python", python, "-claims=false", "-out", dir}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	data, err := os.ReadFile(python + ".args")
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(strings.TrimSpace(string(data)), "\n")
	flag := func(name string) string {
		if i := slices.Index(args, name); i >= 0 && i+1 < len(args) {
			return args[i+1]
		}
		return ""
	}
	if got := flag("--amp-dtype"); got != "bf16" {
		t.Errorf("--amp-dtype %q, want bf16 (args %q)", got, args)
	}
	want := `{"gpt-mini":{"layers":2,"heads":2,"width":128,"vocab":96,"context":64,"dropout":0,"lr":0.002,"beta2":0.99,"wd":0.1,"clip":1}}`
	if got := flag("--lm"); got != want {
		t.Errorf("--lm %s, want %s", got, want)
	}
	row := ""
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, "| gpt-mini | 2 | amp |") {
			row = line
		}
	}
	if cells := strings.Split(row, "|"); len(cells) < 7 || strings.TrimSpace(cells[6]) != "5.00" {
		t.Errorf("the gpt-mini row %q lacks PyTorch's 5.00 ms:\n%s", row, out.String())
	}
}

func TestHasText(t *testing.T) {
	for _, c := range []struct {
		specs string
		want  bool
	}{
		{"resnet20:256 mlp:32", false},
		{"gpt2:16", true},
		{"mlp:32 gpt-small:8", true},
	} {
		specs, err := parseSpecs(c.specs)
		if err != nil {
			t.Fatal(err)
		}
		if got := hasText(specs); got != c.want {
			t.Errorf("hasText(%q) = %v, want %v", c.specs, got, c.want)
		}
	}
}

// signalOnResult sends this process SIGINT once the first result is said;
// the command and its signal handler write to it from two goroutines.
type signalOnResult struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	sent bool
}

func (w *signalOnResult) Write(p []byte) (int, error) {
	w.mu.Lock()
	send := !w.sent && bytes.Contains(p, []byte(" batch 4 fp32: "))
	w.sent = w.sent || send
	n, err := w.buf.Write(p)
	w.mu.Unlock()
	if send {
		syscall.Kill(os.Getpid(), syscall.SIGINT)
		time.Sleep(100 * time.Millisecond) // the signal arrives before the next configuration starts
	}
	return n, err
}

func (w *signalOnResult) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// SIGINT after the first result stops bench before the next one and keeps
// what was measured: the report is written, saying where it stopped, and
// the exit status is SIGINT's.
func TestBenchSIGINTKeepsResults(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	var errb signalOnResult
	code := run([]string{"-device", "cpu", "-specs", "mlp:4", "-configs", "fp32,amp", "-steps", "2", "-warmup", "0", "-pytorch", "", "-claims=false", "-out", dir}, &out, &errb)
	if code != 130 || !strings.Contains(errb.String(), "Interrupted (SIGINT or SIGTERM) in round 1 of 1") {
		t.Fatalf("exit %d\n%s", code, errb.String())
	}
	data, err := os.ReadFile(filepath.Join(dir, "bench.json"))
	var rep struct {
		Results []struct{ Config string }
	}
	if err != nil || json.Unmarshal(data, &rep) != nil || len(rep.Results) != 1 || rep.Results[0].Config != "fp32" {
		t.Errorf("bench.json after SIGINT: %v %s", err, data)
	}
}

// On a CPU the specs and steps not given are CPU-sized, and bench says so.
func TestBenchCPUDefaults(t *testing.T) {
	o := options{set: map[string]bool{"steps": true}, steps: 3, warmup: 5}
	specs, said := o.cpuDefaults(nil)
	if len(specs) != 2 || specs[0].model != "resnet20" || o.steps != 3 || o.warmup != cpuWarmup ||
		said != `CPU run: -specs "resnet20:32 mlp:64" -warmup 2 (the defaults suit a GPU; give these flags to choose)` {
		t.Errorf("specs %+v, steps %d, warmup %d, said %q", specs, o.steps, o.warmup, said)
	}
}
