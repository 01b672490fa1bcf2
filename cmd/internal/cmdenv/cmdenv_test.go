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
			in := CatchInterrupts("cmd", os.Stderr)
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
		if !strings.Contains(first, "stopping at the next step") || !strings.Contains(second, "again: exiting at once") {
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
