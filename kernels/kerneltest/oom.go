package kerneltest

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/memory"
)

// RunOOM runs the suite's cases (or the named groups) on be with the
// allocations its operations make failing, to check what a failure leaves
// (Note [operations out of memory]). be's pool must take every block from
// src, with memory.Config.NoCaching, so that each allocation reaches it.
// The cases' own buffers never fail; opt's tolerances hold the first run,
// whose allocations do not fail either. It returns the number of
// operations that failed in all.
func RunOOM(t *testing.T, be kernels.Backend, src *memory.FaultySource, opt Options, names ...string) (failed int) {
	for _, c := range cases {
		if len(names) > 0 && !slices.Contains(names, c.name) {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			src.Set(memory.Faults{})
			sw := &sweep{t: t, be: be, src: src, opt: opt.withDefaults()}
			sw.run(c, 0) // what runs once per process (compiled kernels, chosen algorithms) out of the way
			n := 0
			for k := 1; ; k++ {
				f := sw.run(c, k)
				if f == 0 {
					break
				}
				n += f
			}
			t.Logf("%d operations failed, at up to %d allocations each", n, sw.most)
			failed += n
		})
	}
	return failed
}

// Note [operations out of memory]: an operation that runs out of memory
// for its workspace panics with the pool's error (wrapping
// memory.ErrOutOfMemory), which the tensor layer turns into the error its
// caller gets, or completes by a path that needs less; either way it gives
// back everything it took, so that the step that called it (or
// -max-memory's search, which runs steps until one fails) can go on with
// the pool as it was. RunOOM checks this of every operation at every
// allocation: run k of a case fails the k-th allocation of each of its
// operations that makes k or more, until a run fails none. An operation
// that failed leaves its outputs unwritten, so the operations after it run
// on them with the checks of the results quiet. After each failure the pool must hold the
// bytes it held when the operation began, and the case's later operations
// must run.

// sweep is RunOOM's state over one case's runs.
type sweep struct {
	t    *testing.T
	be   kernels.Backend
	src  *memory.FaultySource
	opt  Options
	most int // the most allocations that any operation made
}

// run runs case c with each operation's k-th allocation failing (none when
// k is 0), and returns the number of operations that failed.
func (sw *sweep) run(c testCase, k int) (failed int) {
	allocated := func() int64 { return sw.be.Allocator().Stats().Allocated[memory.All].Current }
	calls := 0
	hook := func(method, op string, _ kernels.DType) func() {
		if k == 0 {
			return nil
		}
		calls++
		call, before := calls, allocated()
		sw.src.Set(memory.Faults{Every: k, Max: 1, Burst: 3}) // the pool retries a failed segment once or twice
		return func() {
			faults, _ := sw.src.Injected()
			sw.src.Set(memory.Faults{}) // the case's own buffers never fail
			if faults == 0 {
				return
			}
			failed++
			sw.most = max(sw.most, k)
			p := recover()
			if err, _ := p.(error); p != nil && !errors.Is(err, memory.ErrOutOfMemory) {
				panic(fmt.Sprintf("%s (operation %d of the case), its allocation %d failing: %v", op, call, k, p))
			}
			if left := allocated() - before; left != 0 {
				sw.t.Errorf("%s (operation %d of the case), its allocation %d failing (%s): %d bytes more allocated than before it",
					op, call, k, map[bool]string{true: "it panicked", false: "it completed"}[p != nil], left)
			}
		}
	}
	var r reporter = sw.t
	if k > 0 {
		r = quiet{sw.t}
	}
	s := newSuite(r, &kernels.Observed{B: sw.be, Hook: hook}, c, sw.opt)
	func() {
		defer func() {
			if p := recover(); p != nil {
				sw.t.Errorf("%s, run %d: %v", sw.be.Name(), k, p)
			}
		}()
		c.run(s)
	}()
	if err := sw.be.Synchronize(); err != nil {
		sw.t.Fatalf("%s: queued work failed after run %d: %v", sw.be.Name(), k, err)
	}
	return failed
}

// quiet is a reporter that drops the results' checks: a run whose
// operations failed on purpose compares outputs they never wrote.
type quiet struct{ *testing.T }

func (quiet) Errorf(string, ...any) {}
