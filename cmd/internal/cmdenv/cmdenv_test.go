package cmdenv

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// With CMDENV_TEST_BODY set, the test binary is a command whose body
// catches interrupts and then works forever, or panics.
func TestMain(m *testing.M) {
	switch os.Getenv("CMDENV_TEST_BODY") {
	case "":
		os.Exit(m.Run())
	case "panic":
		os.Exit(Main("cmd", func() int { panic(fmt.Sprintf("index %d out of range", 7)) }))
	case "work":
		os.Exit(Main("cmd", func() int {
			in := CatchInterrupts("cmd", "after the work under way", os.Stderr)
			defer in.Release()
			fmt.Println("ready")
			select {} // a run that never reaches a step boundary
		}))
	}
}

func helper(t *testing.T, body string) *exec.Cmd {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "CMDENV_TEST_BODY="+body)
	return cmd
}

// The first signal asks for a stop and says so; the second exits at once
// with 128 + its number.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		cmd := helper(t, "work")
		out, _ := cmd.StdoutPipe()
		errPipe, _ := cmd.StderrPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		bufio.NewScanner(out).Scan() // "ready": the signals are caught
		cmd.Process.Signal(sig)
		stderr := bufio.NewScanner(errPipe)
		stderr.Scan()
		first := stderr.Text()
		cmd.Process.Signal(sig)
		stderr.Scan()
		second := stderr.Text()
		err := cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 128+int(sig) {
			t.Errorf("%v twice: %v, want exit %d", sig, err, 128+int(sig))
		}
		if !strings.Contains(first, "cmd: "+SignalName(sig)+": stopping after the work under way (again to exit at once)") || !strings.Contains(second, "again: exiting at once") {
			t.Errorf("%v twice said %q then %q", sig, first, second)
		}
	}
}

// A panic on the command's goroutine is one line and ExitInternal, no stack.
func TestPanicIsOneLine(t *testing.T) {
	out, err := helper(t, "panic").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != ExitInternal {
		t.Errorf("a panic exits %v, want %d", err, ExitInternal)
	}
	if s := string(out); !strings.Contains(s, "cmd: internal error: index 7 out of range") || strings.Contains(s, "goroutine ") {
		t.Errorf("a panic printed %q", s)
	}
}

// TestExitStatuses: each command's -h lists the statuses it exits with, in
// its words where it has its own, and no other.
func TestExitStatuses(t *testing.T) {
	for _, c := range []struct {
		stopped string
		codes   map[int]string
		want    string
	}{
		{"after saving where it got to", map[int]string{ExitFailed: "", ExitDiverged: "", ExitNothingRan: ""},
			"Exit status: 0 done, 1 failed, 3 diverged, 4 nothing ran (the device, data or checkpoint could not be opened), 64 bad flags (nothing ran), 70 a bug in leangrad, 130 or 143 stopped by SIGINT or SIGTERM (after saving where it got to).\n"},
		{"", map[int]string{0: "stopped", ExitFailed: "a request failed"},
			"Exit status: 0 stopped, 1 a request failed, 64 bad flags (nothing ran), 70 a bug in leangrad.\n"},
	} {
		if got := ExitStatuses(c.stopped, c.codes); got != c.want {
			t.Errorf("ExitStatuses(%q, %v) =\n%q, want\n%q", c.stopped, c.codes, got, c.want)
		}
	}
}
