package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leangrad/leangrad/cmd/internal/cmdenv"
	"github.com/leangrad/leangrad/cmd/internal/launch"
	"github.com/leangrad/leangrad/internal/race"
	"github.com/leangrad/leangrad/run"
)

// The -nproc launcher starts this test binary again as its ranks: with
// LEANGRAD_TEST_TRAIN set, the binary is the train command.
// LEANGRAD_TEST_DIE_RANK makes that rank exit abruptly, as a rank that
// crashes would, once the file LEANGRAD_TEST_DIE_WHEN exists (rank 0's
// first checkpoint: every rank has joined and trained an epoch by then).
func TestMain(m *testing.M) {
	if os.Getenv("LEANGRAD_TEST_TRAIN") == "" {
		os.Exit(m.Run())
	}
	if die := os.Getenv("LEANGRAD_TEST_DIE_RANK"); die != "" && die == os.Getenv("RANK") {
		go func() {
			for {
				if _, err := os.Stat(os.Getenv("LEANGRAD_TEST_DIE_WHEN")); err == nil {
					os.Exit(7)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	cmdenv.Setup()
	os.Exit(cmdenv.Main("train", func() int { return command(os.Args[1:], os.Stdout, os.Stderr) }))
}

// TestNproc: train -nproc 2 runs a two-rank job on the CPU: rank 0 prints
// (with its prefix) and writes the report, which has the job's figures and
// both ranks' memory.
func TestNproc(t *testing.T) {
	t.Setenv("LEANGRAD_TEST_TRAIN", "1")
	js := filepath.Join(t.TempDir(), "run.json")
	code, stdout, stderr := runCLI("-nproc", "2", "-device", "cpu", "-model", "mlp", "-dataset", "synthetic",
		"-limit", "512", "-test-limit", "101", "-epochs", "2", "-batch", "32", "-json", js, "-measure=false")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	for _, want := range []string{"starting 2 ranks", "[rank 0] data parallel: 2 ranks over tcp, batch 32 per rank (64 in all)",
		"[rank 0] test accuracy", "[rank 0]   rank 1       peak allocated"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, "[rank 1] test accuracy") {
		t.Error("rank 1 printed its report too")
	}
	var r run.Report
	data, err := os.ReadFile(js)
	if err == nil {
		err = json.Unmarshal(data, &r)
	}
	if err != nil || r.DataParallel == nil || r.DataParallel.Ranks != 2 || len(r.DataParallel.PerRank) != 2 || r.Final == nil {
		t.Fatalf("report: %v %+v", err, r.DataParallel)
	}
	if n := float64(r.Final.TestAcc) * 101; n-float64(int(n+0.5)) > 1e-3 || r.TestImages != 101 {
		t.Errorf("test accuracy %v over %d images is not the whole test set's", r.Final.TestAcc, r.TestImages)
	}
}

// TestNprocShardOptimizer: train -nproc 2 -shard-optimizer keeps half of
// AdamW's state on each rank (the report says so), for an image
// classifier and a GPT, and its checkpoint, which holds the whole state,
// resumes in one process.
func TestNprocShardOptimizer(t *testing.T) {
	race.Skip(t, "go test ./cmd/train -run TestNprocShardOptimizer") // the launcher's goroutines: TestNproc; the collectives: package dist
	t.Setenv("LEANGRAD_TEST_TRAIN", "1")
	dir := t.TempDir()
	text := filepath.Join(dir, "story.txt")
	os.WriteFile(text, []byte(strings.Repeat("The quick brown foxes jumped over the lazy dog, and the dog slept on. ", 200)), 0o644)
	for _, c := range []struct {
		name       string
		args, more []string // the run's flags, and how the resumed run goes further
	}{
		{"mlp", []string{"-model", "mlp", "-dataset", "synthetic", "-optimizer", "adamw", "-lr", "1e-3", "-limit", "256", "-test-limit", "50",
			"-batch", "32", "-epochs", "1"}, []string{"-epochs", "2"}},
		{"gpt-mini", []string{"-model", "gpt-mini", "-data", text, "-tokenizer", "bytes", "-context", "32", "-batch", "4", "-eval-batches", "1",
			"-warmup-steps", "1", "-steps", "4", "-eval-every", "4"}, []string{"-steps", "8", "-eval-every", "4"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			js, ckpt := filepath.Join(dir, c.name+".json"), filepath.Join(dir, c.name+".ckpt")
			common := append([]string{"-device", "cpu", "-measure=false"}, c.args...)
			code, stdout, stderr := runCLI(append([]string{"-nproc", "2", "-shard-optimizer", "-json", js, "-save", ckpt}, common...)...)
			if code != 0 {
				t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
			}
			if want := "(sharded over the 2 ranks)"; !strings.Contains(stdout, want) {
				t.Errorf("output lacks %q:\n%s", want, stdout)
			}
			m := regexp.MustCompile(`\(([0-9,]+) parameters\)`).FindStringSubmatch(stdout)
			if m == nil {
				t.Fatalf("output names no parameter count:\n%s", stdout)
			}
			params, _ := strconv.Atoi(strings.ReplaceAll(m[1], ",", ""))
			whole := 2 * 4 * int64(params) // AdamW's two F32 moments of every parameter
			var r run.Report
			data, err := os.ReadFile(js)
			if err == nil {
				err = json.Unmarshal(data, &r)
			}
			if err != nil || r.DataParallel == nil || !r.DataParallel.Sharded || len(r.DataParallel.PerRank) != 2 {
				t.Fatalf("report: %v %+v", err, r.DataParallel)
			}
			for _, p := range r.DataParallel.PerRank {
				// Half, and the pool's rounding of each piece of a parameter.
				if s := p.OptimizerStateBytes; s < whole/2 || s > whole/2+whole/20 {
					t.Errorf("rank %d holds %d bytes of optimizer state, want about half of %d", p.Rank, s, whole)
				}
			}
			code, stdout, stderr = runCLI(append(append(common, "-resume", ckpt), c.more...)...)
			if code != 0 || !strings.Contains(stdout, "resumed") {
				t.Fatalf("resuming in one process: exit %d\n%s\n%s", code, stdout, stderr)
			}
		})
	}
}

// A rank that dies ends the job: the others fail with an error naming it
// (not a hang), and the launcher exits with the dead rank's status.
func TestNprocRankDies(t *testing.T) {
	race.Skip(t, "go test ./cmd/train -run TestNprocRankDies") // the launcher's goroutines: TestNproc; the collectives: package dist
	ckpt := filepath.Join(t.TempDir(), "run.ckpt")
	t.Setenv("LEANGRAD_TEST_TRAIN", "1")
	t.Setenv("LEANGRAD_TEST_DIE_RANK", "1")
	t.Setenv("LEANGRAD_TEST_DIE_WHEN", ckpt)
	start := time.Now()
	code, stdout, stderr := runCLI("-nproc", "3", "-device", "cpu", "-model", "mlp", "-dataset", "synthetic",
		"-limit", "384", "-test-limit", "64", "-epochs", "1000", "-batch", "32", "-measure=false", "-dist-timeout", "1m", "-save", ckpt)
	took := time.Since(start)
	if code == 0 {
		t.Errorf("exit 0 after a rank died\n%s\n%s", stdout, stderr)
	}
	for _, want := range []string{`rank 1 exited with status 7`, `\[rank 0\] train: .*rank 1 closed its connection`,
		`\[rank 2\] train: .*rank 1 closed its connection`} {
		if !regexp.MustCompile(want).MatchString(stderr) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if took > launch.FailureGrace || strings.Contains(stderr, "killing them") {
		t.Errorf("the job took %v to end after a rank died; the launcher had to kill ranks", took)
	}
	t.Logf("ended %v after the start (rank 1 died after the first epoch)", took.Round(time.Millisecond))
}

// SIGTERM to the -nproc launcher reaches every rank once: they agree on a
// step, rank 0 saves the job there and writes the report, and the job exits
// 143; the checkpoint resumes the job there.
func TestNprocSIGTERM(t *testing.T) {
	race.Skip(t, "go test ./cmd/train -run TestNprocSIGTERM") // the launcher's goroutines: TestNproc; the collectives: package dist
	dir := t.TempDir()
	ck, js := filepath.Join(dir, "run.ckpt"), filepath.Join(dir, "r.json")
	args := []string{"-nproc", "2", "-device", "cpu", "-model", "mlp", "-dataset", "synthetic", "-limit", "256", "-test-limit", "64",
		"-epochs", "3", "-batch", "8", "-measure=false", "-save", ck}
	cmd := trainCmd(append(args, "-json", js)...)
	pipe, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var e strings.Builder
	sc := bufio.NewScanner(pipe)
	for sc.Scan() {
		e.WriteString(sc.Text() + "\n")
		if strings.HasPrefix(sc.Text(), "[rank 0] epoch 2/3") {
			cmd.Process.Signal(syscall.SIGTERM)
			break
		}
	}
	for sc.Scan() {
		e.WriteString(sc.Text() + "\n")
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 143 || strings.Contains(e.String(), "exited with status") {
		t.Fatalf("SIGTERM to the launcher: %v\n%s", err, e.String())
	}
	for _, want := range []string{"[rank 0] train: SIGTERM: stopping", "[rank 1] train: SIGTERM: stopping", "[rank 0] train: training interrupted after step"} {
		if !strings.Contains(e.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, e.String())
		}
	}
	var r run.Report
	data, err := os.ReadFile(js)
	if err != nil || json.Unmarshal(data, &r) != nil || r.Interrupted == nil || r.Interrupted.Epoch != 2 || r.Interrupted.Saved != ck {
		t.Fatalf("-json: %v %s", err, data)
	}
	code, stdout, stderr := runBinary(t, append(args, "-resume", ck)...)
	if code != 0 || !strings.Contains(stdout, "[rank 0] resumed from "+ck+" at epoch 2, batch ") {
		t.Errorf("resume: exit %d\n%s%s", code, stdout, stderr)
	}
}
