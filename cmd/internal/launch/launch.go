// Package launch is the commands' side of data-parallel jobs: the -nproc
// launcher, which starts N ranks of the running command on this machine,
// and what a rank does first (its device, joining the job).
package launch

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/leangrad/leangrad/dist"
	"github.com/leangrad/leangrad/tensor"
)

// A process is one rank of a job when WORLD_SIZE is set (torchrun,
// PyTorchJob, or Run below): it works on cuda:LOCAL_RANK (or the CPU) and
// meets the others at MASTER_ADDR:MASTER_PORT. Run is the one-command
// launcher on one machine: it starts N ranks of this program, forwards
// their output with a rank prefix, and stops the job when a rank fails.

// FailureGrace is how long a rank waits, after the job failed elsewhere,
// for its own work to return the error before it exits anyway (NCCL's
// abort normally ends a blocked collective at once).
const FailureGrace = 30 * time.Second

// Device is the device a rank trains on: with -device auto or cuda,
// cuda:LOCAL_RANK (the CPU when there is no GPU and -device is auto);
// otherwise what -device says.
func Device(device tensor.DeviceSpec, cfg *dist.Config) tensor.DeviceSpec {
	if cfg == nil || cfg.Size == 1 {
		return device
	}
	if gpu, index := device.CUDA(); gpu && index < 0 {
		return tensor.DeviceSpec(fmt.Sprintf("cuda:%d", cfg.LocalRank))
	}
	return device
}

// Join joins the job on dev. When another rank fails, the group aborts
// its collectives, the error comes back through the training loop, and
// after FailureGrace the process exits regardless.
func Join(dev *tensor.Device, cfg *dist.Config, stderr io.Writer) (*dist.Group, error) {
	g, err := dist.Join(dev, *cfg)
	if err != nil {
		return nil, fmt.Errorf("data-parallel job: %w", err)
	}
	g.OnFailure(func(err error) {
		fmt.Fprintf(stderr, "%s: rank %d: the job failed: %v\n", filepath.Base(os.Args[0]), cfg.Rank, err)
		go func() {
			time.Sleep(FailureGrace)
			fmt.Fprintf(stderr, "%s: rank %d: still running %v after the job failed; exiting\n", filepath.Base(os.Args[0]), cfg.Rank, FailureGrace)
			os.Exit(1)
		}()
	})
	return g, nil
}

// Run runs nproc ranks of this program on this machine with args (the
// command line less -nproc: see WithoutFlag), their output prefixed by
// "[rank R] ", and returns the job's exit status: 0 when every rank
// succeeded, else that of the first rank seen to fail (which, when a rank
// dies, may be one it took down: each failed rank's status is printed).
// When a rank fails, the others learn it through the rendezvous and stop;
// any still running FailureGrace later are killed. SIGINT and SIGTERM are
// passed on to every rank (which runs in its own process group, so that a
// terminal's Ctrl-C reaches it once, through the launcher): the ranks stop
// together at a step boundary, save and exit, and so does the job, with
// 128 + the signal's number; a second signal is passed on too, and ranks
// still running FailureGrace after it are killed.
func Run(nproc int, args []string, stdout, stderr io.Writer) int {
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "-nproc: cannot find this program to start it again: %v\n", err)
		return 1
	}
	port, err := freePort()
	if err != nil {
		fmt.Fprintf(stderr, "-nproc: no free port for the rendezvous: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "starting %d ranks (rendezvous on 127.0.0.1:%d)\n", nproc, port)
	var outMu sync.Mutex // the ranks' lines and the launcher's own share the writers
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(stderr, format, args...)
	}
	type exit struct {
		rank, code int
		how        string // "exited with status 2", "was killed (signal: killed)"
	}
	exits := make(chan exit, nproc)
	var cmds []*exec.Cmd
	for r := 0; r < nproc; r++ {
		cmd := exec.Command(exe, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Env = rankEnv(os.Environ(), r, nproc, port, runtime.NumCPU())
		prefix := fmt.Sprintf("[rank %d] ", r)
		cmd.Stdout = &prefixed{w: stdout, mu: &outMu, prefix: prefix}
		cmd.Stderr = &prefixed{w: stderr, mu: &outMu, prefix: prefix}
		if err := cmd.Start(); err != nil {
			say("-nproc: starting rank %d: %v\n", r, err)
			for _, c := range cmds {
				c.Process.Kill()
			}
			return 1
		}
		cmds = append(cmds, cmd)
		go func() {
			err := cmd.Wait()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				code = 1
			}
			how := fmt.Sprintf("exited with status %d", code)
			if code < 0 {
				code, how = 1, fmt.Sprintf("was killed (%v)", ee.ProcessState)
			}
			cmd.Stdout.(*prefixed).Flush()
			cmd.Stderr.(*prefixed).Flush()
			exits <- exit{r, code, how}
		}()
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	status, running, signalled := 0, nproc, 0
	var deadline <-chan time.Time
	for running > 0 {
		select {
		case e := <-exits:
			running--
			if e.code == 0 {
				continue
			}
			if signalled > 0 && e.code == signalled {
				if status == 0 {
					status = e.code // stopped as asked: saved and reported
				}
				continue
			}
			say("rank %d %s\n", e.rank, e.how)
			if status == 0 {
				status = e.code
				if running > 0 {
					say("the other ranks stop too (they are killed if still running in %v)\n", FailureGrace)
				}
				deadline = time.After(FailureGrace)
			}
		case s := <-sigs:
			for _, c := range cmds {
				c.Process.Signal(s)
			}
			if signalled > 0 { // the second: the ranks exit at once
				deadline = time.After(FailureGrace)
			}
			if sig, ok := s.(syscall.Signal); ok && signalled == 0 {
				signalled = 128 + int(sig)
			}
		case <-deadline:
			say("%d ranks still running %v after the job failed: killing them\n", running, FailureGrace)
			for _, c := range cmds {
				c.Process.Kill()
			}
			deadline = nil
		}
	}
	return status
}

// rankEnv is rank r's environment: env with the job's variables and, when
// env does not set it, GOMAXPROCS at the rank's share of the machine's
// cpus, so that the ranks' goroutines do not all contend for every core
// (torchrun sets OMP_NUM_THREADS=1 for the same reason).
func rankEnv(env []string, r, nproc, port, cpus int) []string {
	out := append(slices.Clone(env), "RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(nproc),
		"LOCAL_RANK="+strconv.Itoa(r), "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port))
	for _, kv := range env {
		if strings.HasPrefix(kv, "GOMAXPROCS=") {
			return out
		}
	}
	return append(out, "GOMAXPROCS="+strconv.Itoa(max(1, cpus/nproc)))
}

// WithoutFlag is args less the flag name and its value.
func WithoutFlag(args []string, name string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := strings.TrimLeft(args[i], "-")
		if a == args[i] { // not a flag
			out = append(out, args[i])
			continue
		}
		if a == name {
			i++ // its value is the next argument
			continue
		}
		if strings.HasPrefix(a, name+"=") {
			continue
		}
		out = append(out, args[i])
	}
	return out
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// prefixed writes whole lines to w, each after prefix, under mu (shared by
// every rank's streams so that lines do not interleave).
type prefixed struct {
	w      io.Writer
	mu     *sync.Mutex
	prefix string
	buf    []byte
}

func (p *prefixed) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		p.emit(p.buf[:i+1])
		p.buf = p.buf[i+1:]
	}
}

// Flush writes what is left of a last line without its newline.
func (p *prefixed) Flush() {
	if len(p.buf) > 0 {
		p.emit(append(p.buf, '\n'))
		p.buf = nil
	}
}

func (p *prefixed) emit(line []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	io.WriteString(p.w, p.prefix)
	p.w.Write(line)
}
