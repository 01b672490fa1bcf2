// Package cmdenv is what the commands share with their environment: the
// variables they read, their exit statuses, and how they catch panics and
// signals (Main, CatchInterrupts). The library reads no environment
// variable of its own: every setting below reaches it as an option or an
// argument, set here by cmd/train, cmd/bench and cmd/serve.
//
//	LEANGRAD_DATA   a folder holding one folder per dataset, searched
//	                before the system folders (datasets.Source.Roots)
//	LEANGRAD_CACHE  where NVRTC's compiled kernels are kept
//	                (kernels.Options.KernelCache)
//	LEANGRAD_DEBUG  1 records every tensor's creation site (tensor.SetDebug)
//	RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT,
//	TORCHELASTIC_USE_AGENT_STORE
//	                this process's place in a data-parallel job, as
//	                torchrun sets them (dist.ConfigFromEnv)
//
// The CUDA backend's library search still follows the loader's conventions
// (LD_LIBRARY_PATH through dlopen, then $CUDA_HOME, $CUDA_PATH and
// $VIRTUAL_ENV's wheels), as every CUDA program does: see Note [finding the
// CUDA libraries] in kernels/cuda.
package cmdenv

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/leangrad/leangrad/dist"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
)

// RuntimeRoom is what a CPU process may hold beyond -max-memory outside
// the pool: the dataset or the tokens, the program, the runtime's own.
const RuntimeRoom = 256 << 20

// MemoryBudget is a -max-memory budget's bytes on dev (a fraction of the
// device's memory where it is one). On the CPU it also brings the Go
// runtime's memory limit within it, unless GOMEMLIMIT says otherwise: the
// pool's segments are Go memory, and the runtime then collects the ones
// given back before the process grows much past the budget.
func MemoryBudget(dev *tensor.Device, b memory.Budget) int64 {
	_, total := dev.MemInfo()
	bytes := b.Of(total)
	if dev.OnHost() && os.Getenv("GOMEMLIMIT") == "" {
		memory.LimitGoHeap(min(debug.SetMemoryLimit(-1), bytes+RuntimeRoom))
	}
	return bytes
}

// Setup applies the process-wide settings: LEANGRAD_DEBUG.
func Setup() {
	if debugOn() {
		tensor.SetDebug(true)
	}
}

// DeviceOptions returns o with the kernel cache from LEANGRAD_CACHE.
func DeviceOptions(o tensor.Options) tensor.Options {
	if d := os.Getenv("LEANGRAD_CACHE"); d != "" {
		o.KernelCache = d
	}
	return o
}

// OpenDevice opens the device spec names, with opts and the kernel cache
// of LEANGRAD_CACHE, and says on w which device it is, in one line: the
// GPU's model and what runs its products and convolutions, or, when "auto"
// found no usable GPU, why in a few words (-device cuda gives the whole
// reason as an error). It is the one way the commands open their device.
func OpenDevice(spec tensor.DeviceSpec, opts tensor.Options, w io.Writer) (*tensor.Device, error) {
	opts = DeviceOptions(opts)
	if spec == "auto" || spec == "" {
		dev, why := tensor.OpenAutoWith(opts)
		if why != "" {
			fmt.Fprintf(w, "device: cpu (no usable GPU: %s; -device cuda says more)\n", shortReason(why))
			return dev, nil
		}
		fmt.Fprintf(w, "device: %s\n", Describe(dev))
		return dev, nil
	}
	dev, err := tensor.OpenWith(string(spec), opts)
	if err != nil {
		return nil, fmt.Errorf("-device %s: %w", spec, err)
	}
	fmt.Fprintf(w, "device: %s\n", Describe(dev))
	return dev, nil
}

// Describe is a device in a few words: its name, and for a GPU its model,
// capability and what runs its convolutions and products.
func Describe(dev *tensor.Device) string {
	if in := dev.Info(); !dev.OnHost() {
		return fmt.Sprintf("%s (%s, %s; convolutions by %s; products by %s)", in.Name, in.Model, in.Capability, in.Convolutions, in.Matmul)
	}
	return dev.Name()
}

// shortReason is the first clause of why: what failed, without where it
// was looked for.
func shortReason(why string) string {
	why, _, _ = strings.Cut(why, "\n")
	if head, _, ok := strings.Cut(why, ": tried"); ok {
		why = head
	}
	return why
}

// Job is this process's place in a data-parallel job; ok is false when
// WORLD_SIZE is unset.
func Job() (cfg dist.Config, ok bool, err error) { return dist.ConfigFromEnv(os.Getenv) }

// DataRoots lists the folders from LEANGRAD_DATA (none when it is unset).
func DataRoots() []string {
	if d := os.Getenv("LEANGRAD_DATA"); d != "" {
		return []string{d}
	}
	return nil
}

// The commands' exit statuses (their -h lists them). Go's runtime exits
// with 2 after a panic it could not hand to Main, so 2 is none of these.
const (
	ExitFailed     = 1  // the work started and failed
	ExitDiverged   = 3  // training diverged
	ExitNothingRan = 4  // the device, the data or the checkpoint could not be opened: nothing ran
	ExitUsage      = 64 // bad flags or arguments: nothing ran (sysexits.h's EX_USAGE)
	ExitInternal   = 70 // a bug in leangrad (sysexits.h's EX_SOFTWARE)
	// A run stopped by a signal exits with 128 + the signal's number:
	// 130 for SIGINT, 143 for SIGTERM (ExitSignal).
)

// ExitStatuses is the line a command's -h prints of the statuses it exits
// with: 0 and the codes given, in their usual words unless a command says
// them in its own (0: "done"; failed: "a request failed"), then 64 and 70,
// and, when stopped is not empty, 130 or 143 and what a stop does.
func ExitStatuses(stopped string, codes map[int]string) string {
	words := map[int]string{ExitFailed: "failed", ExitDiverged: "diverged", ExitNothingRan: "nothing ran (the device, data or checkpoint could not be opened)"}
	done := "done"
	if w := codes[0]; w != "" {
		done = w
	}
	parts := []string{"0 " + done}
	for _, c := range []int{ExitFailed, ExitDiverged, ExitNothingRan} {
		if w, ok := codes[c]; ok {
			if w == "" {
				w = words[c]
			}
			parts = append(parts, fmt.Sprintf("%d %s", c, w))
		}
	}
	parts = append(parts, "64 bad flags (nothing ran)", "70 a bug in leangrad")
	if stopped != "" {
		parts = append(parts, "130 or 143 stopped by SIGINT or SIGTERM ("+stopped+")")
	}
	return "Exit status: " + strings.Join(parts, ", ") + ".\n"
}

// ExitSignal is the exit status of a run a signal stopped: 128 + its number.
func ExitSignal(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return ExitFailed
}

// SignalName is "SIGINT", "SIGTERM" (or what the signal calls itself).
func SignalName(s os.Signal) string {
	switch s {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return s.String()
}

// Main runs a command's body and returns its exit status; a panic on the
// command's goroutine (a bug) becomes one line and ExitInternal instead of
// a stack trace, which LEANGRAD_DEBUG=1 prints as well. Unless GOMEMLIMIT
// says otherwise, the Go runtime's memory limit is 95% of the host's memory
// (memory.HostMemory, a container's limit where one is set) less what is
// page-locked (memory.LimitGoHeap): the CPU pool's segments that were
// given back are collected before the process grows past it.
func Main(name string, body func() int) (code int) {
	if os.Getenv("GOMEMLIMIT") == "" {
		memory.LimitGoHeap(memory.HostMemory() / 100 * 95)
	}
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(os.Stderr, "%s: internal error: %v\n(a bug in leangrad: please report it with the command line; LEANGRAD_DEBUG=1 prints where it happened)\n", name, r)
			if debugOn() {
				os.Stderr.Write(debug.Stack())
			}
			code = ExitInternal
		}
	}()
	return body()
}

func debugOn() bool { v := os.Getenv("LEANGRAD_DEBUG"); return v != "" && v != "0" }

// Interrupts turns SIGINT and SIGTERM into a request to stop: the first
// closes C (a run stops, saves and reports, as CatchInterrupts' how says)
// and says so; a second exits at once with ExitSignal. Release ends it.
type Interrupts struct {
	C      <-chan struct{}
	sig    atomic.Value // the first signal
	notify chan os.Signal
	done   chan struct{}
}

// CatchInterrupts starts catching SIGINT and SIGTERM for the command name,
// saying on w that it is stopping, and how.
func CatchInterrupts(name, how string, w io.Writer) *Interrupts {
	c := make(chan struct{})
	in := &Interrupts{C: c, notify: make(chan os.Signal, 2), done: make(chan struct{})}
	signal.Notify(in.notify, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case s := <-in.notify:
			in.sig.Store(s)
			fmt.Fprintf(w, "%s: %s: stopping %s (again to exit at once)\n", name, SignalName(s), how)
			close(c)
		case <-in.done:
			return
		}
		select {
		case s := <-in.notify:
			fmt.Fprintf(w, "%s: %s again: exiting at once\n", name, SignalName(s))
			os.Exit(ExitSignal(s))
		case <-in.done:
		}
	}()
	return in
}

// StopContext is a context that ends when stop is closed (a nil stop never
// closes), for work that takes a context; cancel releases it.
func StopContext(stop <-chan struct{}) (ctx context.Context, cancel context.CancelFunc) {
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// Stopped says whether a signal asked to stop (C is closed).
func (in *Interrupts) Stopped() bool { return in.Signal() != nil }

// Signal is the first signal caught, or nil.
func (in *Interrupts) Signal() os.Signal {
	s, _ := in.sig.Load().(os.Signal)
	return s
}

// Release stops catching the signals.
func (in *Interrupts) Release() {
	signal.Stop(in.notify)
	close(in.done)
}

// ParseFlags parses args into fs and returns every problem, one line each
// naming the flag: a value that its flag.Value refuses (the owner's
// message, with the value named once; the flag keeps its default), a
// malformed number, an unknown flag (arguments after the flags are the
// caller's to check); and refused, the
// flags whose values were refused, so that a check of the flags together
// can leave unsaid what follows from them. Go's flag package stops at the
// first problem and prints the whole usage; here nothing is printed, and
// -h prints fs.Usage and returns flag.ErrHelp. Every flag must be defined
// before the call.
func ParseFlags(fs *flag.FlagSet, args []string) (problems []string, refused map[string]bool, err error) {
	refused = map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		f.Value = &collected{Value: f.Value, name: f.Name, problems: &problems, refused: refused}
	})
	out, usage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {} // the flag package calls it on any error, before returning the error
	err = fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.VisitAll(func(f *flag.Flag) { f.Value = f.Value.(*collected).Value }) // the usage names each flag's type and default
		fs.Usage()
		return nil, nil, err
	case err != nil:
		problems = append(problems, err.Error())
	}
	return problems, refused, nil
}

// Given is the set of fs's flags given on the command line (after
// ParseFlags): what a command's defaults may change.
func Given(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// Refused answers a command's parse error (its flags' problems joined by
// newlines, or flag.ErrHelp after -h): each problem on its own line as
// "name: problem" on stderr, and the exit status, ExitUsage (0 after -h).
func Refused(name string, stderr io.Writer, err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	for _, line := range strings.Split(err.Error(), "\n") {
		fmt.Fprintf(stderr, "%s: %s\n", name, line)
	}
	return ExitUsage
}

// Unsaid drops the problems that name a refused flag (ParseFlags): they
// follow from its default standing in for the value given.
func Unsaid(problems []string, refused map[string]bool) []string {
	var out []string
	for _, p := range problems {
		mentions := false
		for name := range refused {
			if strings.Contains(p, "-"+name+" ") || strings.Contains(p, "-"+name+":") {
				mentions = true
			}
		}
		if !mentions {
			out = append(out, p)
		}
	}
	return out
}

// collected is a flag's Value whose refusals are collected, not returned.
type collected struct {
	flag.Value
	name     string
	problems *[]string
	refused  map[string]bool
}

func (c *collected) Set(s string) error {
	delete(c.refused, c.name) // the last value given is the one that counts
	before := c.Value.String()
	if err := c.Value.Set(s); err != nil {
		c.Value.Set(before) // the flag package's numbers keep what failed to parse
		msg := err.Error()
		if _, rest, ok := strings.Cut(msg, strconv.Quote(s)+": "); ok {
			msg = rest // the owner named the value already: name it once
		}
		if msg == "parse error" { // the flag package's numbers say only that
			msg = "not a number"
		}
		*c.problems = append(*c.problems, fmt.Sprintf("-%s %q: %s", c.name, s, msg))
		c.refused[c.name] = true
	}
	return nil
}

// IsBoolFlag passes a bool flag's nature through, so that -flag alone
// still sets it.
func (c *collected) IsBoolFlag() bool {
	b, ok := c.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}
