package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leangrad/leangrad/kernels/cuda"
)

func runCLI(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return code, o.String(), e.String()
}

func TestUserMistakesGetOneClearLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-model", "vgg"}, 2, `-model "vgg": want resnet, resnet18 or mlp`},
		{[]string{"-depth", "21"}, 2, "-depth 21: want 6n+2"},
		{[]string{"-epochs", "0"}, 2, "-epochs 0: want at least 1"},
		{[]string{"-batch", "x"}, 2, `invalid value "x" for flag -batch`},
		{[]string{"extra"}, 2, `unexpected argument "extra"`},
		{[]string{"-model", "mlp", "-checkpoint"}, 2, "-checkpoint needs a ResNet"},
		{[]string{"-checkpoint-mode", "half"}, 2, `checkpoint mode "half"`},
		{[]string{"-dataset", "imagenet"}, 1, `unknown dataset "imagenet"`},
		{[]string{"-dataset", "cifar10", "-data", "/nonexistent"}, 1, "cifar10: dataset not found in /nonexistent"},
		{[]string{"-device", "tpu"}, 1, `unknown device "tpu"`},
		{[]string{"-model", "mlp", "-dataset", "synthetic", "-resume", "/nonexistent/run.ckpt", "-measure=false"}, 1, "/nonexistent/run.ckpt"},
	} {
		code, _, stderr := runCLI(tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("train %v: exit %d, stderr %q; want exit %d and %q", tc.args, code, stderr, tc.code, tc.want)
		}
		if strings.Contains(stderr, "goroutine ") || strings.Contains(stderr, "panic") {
			t.Errorf("train %v printed a stack trace:\n%s", tc.args, stderr)
		}
	}
	if cuda.Available() != nil {
		code, _, stderr := runCLI("-device", "cuda")
		if code != 1 || !strings.Contains(stderr, "libcuda.so.1") || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("-device cuda without a GPU: exit %d, %q; want one line naming libcuda.so.1", code, stderr)
		}
	}
	if code, _, _ := runCLI("-h"); code != 0 {
		t.Errorf("-h exits %d", code)
	}
}

func TestRunWritesReports(t *testing.T) {
	dir := t.TempDir()
	js, csv, png, ck := filepath.Join(dir, "r.json"), filepath.Join(dir, "m.csv"), filepath.Join(dir, "m.png"), filepath.Join(dir, "c.st")
	code, stdout, stderr := runCLI("-model", "resnet", "-depth", "8", "-dataset", "synthetic", "-device", "cpu", "-limit", "96",
		"-test-limit", "64", "-batch", "16", "-epochs", "2", "-amp", "-checkpoint", "-empty-cache", "3",
		"-json", js, "-memlog", csv, "-memplot", png, "-save", ck)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	for _, want := range []string{"measured by the pool", "amp+checkpoint", "<- this run", "test accuracy",
		"img/s", "peak allocated", "(fp32: ", "EmptyCache every 3 steps: 4 calls", "leangrad memory summary, device cpu"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
	var r jsonReport
	data, err := os.ReadFile(js)
	if err != nil || json.Unmarshal(data, &r) != nil || len(r.Epochs) != 2 || len(r.Measured) != 4 || r.Final.PeakAllocated <= 0 {
		t.Errorf("-json: %v %+v", err, r.Final)
	}
	for _, f := range []string{csv, png, ck} {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	// Resuming the finished run with one more epoch continues from epoch 3.
	code, stdout, stderr = runCLI("-model", "resnet", "-depth", "8", "-dataset", "synthetic", "-device", "cpu", "-limit", "96",
		"-test-limit", "64", "-batch", "16", "-epochs", "3", "-amp", "-checkpoint", "-resume", ck, "-measure=false")
	if code != 0 || !strings.Contains(stdout, "resumed from") || !strings.Contains(stderr, "epoch 3:") {
		t.Errorf("resume: exit %d\n%s\n%s", code, stdout, stderr)
	}
}
