// Command serve answers HTTP requests with a model that train -save wrote:
// an image classifier's predictions, batched on the device from concurrent
// requests, or a GPT's generated text through OpenAI's API, from an engine
// that batches every running sequence (see package serve for the
// endpoints, docs/serving.md for the engine).
//
//	serve -addr 127.0.0.1:8080 -device auto model.st
//	curl -s localhost:8080/v1/completions -H 'Content-Type: application/json' -d '{"model": "gpt2", "prompt": "Hello", "max_tokens": 16}'
//	curl -s localhost:8080/metrics
//
// It warms up before /readyz says ready (an image classifier's batch
// shapes; a GPT's key-value memory and captured decoding steps), and on
// SIGINT or SIGTERM stops taking requests, answers those in flight and
// exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/leangrad/leangrad/cmd/internal/cmdenv"
	"github.com/leangrad/leangrad/fileio"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/serve"
	"github.com/leangrad/leangrad/tensor"
)

func main() {
	cmdenv.Setup()
	os.Exit(cmdenv.Main("serve", func() int { return command(os.Args[1:], os.Stdout, os.Stderr, nil) }))
}

type options struct {
	addr, model string
	device      tensor.DeviceSpec
	opts        serve.Options
	drain       time.Duration
	readTimeout time.Duration
	maxMemory   memory.Budget
	limit       int64 // maxMemory's bytes on the device
}

func parse(args []string, stderr io.Writer) (*options, error) {
	o := &options{device: "auto"}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: serve [flags] model.st\n\nServes a checkpoint that train -save wrote over HTTP: POST /v1/predict (an image classifier) or\nPOST /v1/completions, GET /v1/models and POST /v1/generate (a GPT); GET /healthz, /readyz and /metrics.\n%s\nFlags:\n", cmdenv.ExitStatuses("", map[int]string{0: "stopped by SIGINT or SIGTERM after answering the requests in flight", cmdenv.ExitFailed: "failed (or the requests in flight outlasted -drain)", cmdenv.ExitNothingRan: "nothing ran (the device or the checkpoint could not be opened)"}))
		fs.PrintDefaults()
	}
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "address to listen on")
	fs.Var(&o.device, "device", "device: "+tensor.DeviceSpecs)
	fs.IntVar(&o.opts.MaxBatch, "max-batch", 64, "the most images one forward pass takes (requests are batched up to it)")
	fs.DurationVar(&o.opts.Window, "window", 2*time.Millisecond, "how long the batcher waits after a request for others to join its batch")
	fs.IntVar(&o.opts.Queue, "queue", 1024, "requests that may wait for the device; beyond it they get 503 (a GPT: generations at once)")
	var maxBody int64
	fs.Int64Var(&maxBody, "max-body", 16<<20, "the most bytes a request body may have (413 beyond)")
	fs.IntVar(&o.opts.EmptyCacheEvery, "empty-cache-every", 0, "call EmptyCache after every N requests (0: never; the pool does not need it: this measures the advice)")
	fs.DurationVar(&o.drain, "drain", 30*time.Second, "on SIGINT or SIGTERM, how long requests in flight may take to finish")
	fs.DurationVar(&o.readTimeout, "read-timeout", 30*time.Second, "how long a client may take to send a request, its body included")
	fs.Var(&o.maxMemory, "max-memory", "cap the pool at SIZE (2GiB) or a fraction of the device (0.5) for the server's life: the model, a GPT's key-value memory and the steps beside it (default: no cap)")
	e := &o.opts.Engine
	fs.Var(&e.KVMemory, "kv-memory", "a GPT's key-value memory, allocated once: a size (2GiB) or a fraction of what is free beside the model and a step, within -max-memory (0.9); default: room for -max-seqs sequences of the whole context")
	fs.IntVar(&e.BlockSize, "block-size", 16, "a GPT's key-value block: the positions it holds")
	fs.IntVar(&e.MaxSeqs, "max-seqs", 0, "the most sequences a GPT's step decodes at once (default 256 on a GPU, 16 on the CPU)")
	fs.IntVar(&e.MaxBatchTokens, "max-batch-tokens", 2048, "the most tokens a GPT's step runs, prompts' chunks included")
	fs.BoolVar(&e.NoPrefixCache, "no-prefix-cache", false, "do not reuse the key-value blocks of prompts' shared beginnings")
	fs.BoolVar(&e.StaticBatching, "static-batching", false, "admit new generations only when every running one ended (for comparison)")
	fs.BoolVar(&e.NoCapture, "eager", false, "run a GPT's decoding steps eagerly, not as captured CUDA graphs")
	fs.Func("dtype", "what a GPT computes in and stores its keys and values in: f32, f16 or bf16 (default bf16 on a GPU, f32 on the CPU)", // no default of its own to print
		func(s string) error {
			if err := e.DType.UnmarshalText([]byte(s)); err != nil || !e.DType.Float() {
				return errors.New("want f32, f16 or bf16")
			}
			return nil
		})
	bad, _, err := cmdenv.ParseFlags(fs, args)
	if err != nil {
		return nil, err
	}
	o.opts.MaxBody = maxBody
	say := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	switch fs.NArg() {
	case 0:
		say("no model: give the checkpoint train -save wrote (serve [flags] model.st)")
	case 1:
		o.model = fs.Arg(0)
		if st, err := os.Stat(o.model); err != nil {
			say("%s: %v", o.model, fileio.Cause(err))
		} else if !st.Mode().IsRegular() {
			say("%s: not a checkpoint file", o.model)
		}
	default:
		say("one model only, not %d (flags go before it)", fs.NArg())
	}
	for _, v := range []struct {
		name string
		v    int64
		min  int64
	}{{"max-batch", int64(o.opts.MaxBatch), 1}, {"queue", int64(o.opts.Queue), 1}, {"max-body", maxBody, 1}, {"empty-cache-every", int64(o.opts.EmptyCacheEvery), 0},
		{"block-size", int64(e.BlockSize), 1}, {"max-seqs", int64(e.MaxSeqs), 0}, {"max-batch-tokens", int64(e.MaxBatchTokens), 1}} {
		if v.v < v.min {
			say("-%s %d: want %d or more", v.name, v.v, v.min)
		}
	}
	if e.BlockSize > 1024 {
		say("-block-size %d: want at most 1024", e.BlockSize)
	}
	if o.opts.Window < 0 {
		say("-window %v: want 0 (no wait) or more", o.opts.Window)
	}
	if o.drain <= 0 {
		say("-drain %v: want a positive time", o.drain)
	}
	if o.readTimeout <= 0 {
		say("-read-timeout %v: want a positive time", o.readTimeout)
	}
	if _, _, err := net.SplitHostPort(o.addr); err != nil {
		say("-addr %s: %v", o.addr, err)
	}
	if len(bad) > 0 {
		return nil, errors.New(strings.Join(bad, "\n"))
	}
	return o, nil
}

// capHint is what to say after err where the pool ran out of memory under
// -max-memory: what else takes less.
func (o *options) capHint(err error) string {
	if o.limit == 0 || !errors.Is(err, memory.ErrOutOfMemory) {
		return ""
	}
	return fmt.Sprintf(" (under -max-memory %s: a GPT's steps take less with a lower -max-seqs or -max-batch-tokens, its key-value memory with -kv-memory)", memory.Bytes(o.limit))
}

// command runs the service until a signal (or, in tests, stop) ends it.
// ready, if set, hears the address once the server answers.
func command(args []string, stdout, stderr io.Writer, ready func(addr string)) int {
	o, err := parse(args, stderr)
	if err != nil {
		return cmdenv.Refused("serve", stderr, err)
	}
	dev, err := cmdenv.OpenDevice(o.device, tensor.Options{}, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "serve: %v\n", err)
		return cmdenv.ExitNothingRan
	}
	if o.maxMemory.IsSet() {
		o.limit = cmdenv.MemoryBudget(dev, o.maxMemory)
		if err := dev.Allocator().SetLimit(o.limit); err != nil {
			fmt.Fprintf(stderr, "serve: -max-memory %v: %v\n", o.maxMemory, err)
			return cmdenv.ExitUsage
		}
		defer dev.Allocator().SetLimit(0)
	}
	srv, err := serve.Open(dev, o.model, o.opts)
	if err != nil {
		fmt.Fprintf(stderr, "serve: %v%s\n", err, o.capHint(err))
		return cmdenv.ExitNothingRan
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		fmt.Fprintf(stderr, "serve: -addr %s: %v\n", o.addr, err)
		return cmdenv.ExitNothingRan
	}
	// Slow clients are bounded: a request's headers and body must arrive
	// within their timeouts, an idle connection closes; a streamed answer
	// has no write limit.
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: o.readTimeout, IdleTimeout: 2 * time.Minute}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }() // /healthz answers while it warms up
	start := time.Now()
	if err := srv.WarmUp(); err != nil {
		fmt.Fprintf(stderr, "serve: %v%s\n", err, o.capHint(err))
		return cmdenv.ExitFailed
	}
	a := dev.Allocator().Stats()
	capped := ""
	if limit := dev.Allocator().Limit(); limit > 0 {
		capped = fmt.Sprintf(", capped at %s", memory.Bytes(limit))
	}
	fmt.Fprintf(stdout, "serving %s on %s from %s: %s, in %v; the pool holds %s (%s reserved%s)\n",
		srv.Model(), dev.Name(), o.model, srv.Prepared(), time.Since(start).Round(time.Millisecond), memory.Bytes(a.Allocated[memory.All].Current), memory.Bytes(a.Reserved[memory.All].Current), capped)
	// The signals are ours before the ready line: a client that reads it
	// may signal at once, and must find the drain, not the default exit.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	fmt.Fprintf(stdout, "ready on http://%s\n", ln.Addr())
	if ready != nil {
		ready(ln.Addr().String())
	}
	select {
	case err := <-served:
		fmt.Fprintf(stderr, "serve: %v\n", err)
		return cmdenv.ExitFailed
	case s := <-sigs:
		fmt.Fprintf(stdout, "%s: answering the requests in flight (for at most %v), then exiting\n", cmdenv.SignalName(s), o.drain)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.drain)
	defer cancel()
	if err := hs.Shutdown(ctx); err != nil {
		fmt.Fprintf(stderr, "serve: draining: %v\n", err)
		return cmdenv.ExitFailed
	}
	return 0
}
