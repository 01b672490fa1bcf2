package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	for _, f := range []string{"bench.md", "step_time.png", "peak_memory.png", "timeline_mlp_b4.png"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	if !strings.Contains(out.String(), "| mlp | 4 | fp32 |") {
		t.Errorf("stdout:\n%s", out.String())
	}
	for _, bad := range [][]string{{"-specs", "vgg:1"}, {"-specs", "mlp:x"}, {"-steps", "0"}} {
		if code := run(bad, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d", bad, code)
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
