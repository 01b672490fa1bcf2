// Package par runs the parts of one CPU operation on several cores at once,
// with workers that stay awake between operations.
//
// A goroutine started per operation (or a worker woken from sleep) waits
// for the runtime to wake a sleeping thread, and a thread for the OS (on a
// virtual machine, for the hypervisor to run a halted virtual CPU): tens of
// microseconds, as long as the product of a 128×784 by a 784×256 matrix on
// one core. Measured on a 2-core VM, such a product ran slower on two
// goroutines than on one. So Do hands the parts to workers that, once they
// have run one, spin for a while (yielding to the scheduler) before they
// sleep: during a training step, where operations follow each other
// microseconds apart, they are awake when the next one starts. Between
// steps, or in a service that calls rarely, they sleep and cost nothing.
// While spinning, a worker lets other goroutines run every thousand
// rounds (a few microseconds): yielding every round contended for the
// scheduler's lock with the goroutine doing the work.
package par

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Spin is how long an idle worker keeps looking for work before it sleeps.
const Spin = 200 * time.Microsecond

type job struct {
	f    func(i int)
	i    int
	left *atomic.Int32
}

type worker struct {
	busy   atomic.Bool // taken by a Do (CAS from false)
	task   atomic.Pointer[job]
	asleep atomic.Bool
	wake   chan struct{}
}

var (
	once    sync.Once
	workers []*worker
)

func start() {
	n := max(0, runtime.GOMAXPROCS(0)-1)
	workers = make([]*worker, n)
	for i := range workers {
		w := &worker{wake: make(chan struct{}, 1)}
		workers[i] = w
		go w.loop()
	}
}

// loop runs the worker's tasks, spinning for Spin after each before it
// sleeps.
func (w *worker) loop() {
	for {
		deadline := time.Now().Add(Spin)
		var j *job
		for spins := 0; ; spins++ {
			if j = w.task.Load(); j != nil {
				break
			}
			if spins&1023 != 1023 {
				continue // a load a round; the scheduler every thousand (its run queue is locked)
			}
			if time.Now().After(deadline) {
				w.asleep.Store(true)
				if j = w.task.Load(); j == nil { // a Do that saw asleep false has stored its task by now
					<-w.wake
				}
				w.asleep.Store(false)
				deadline = time.Now().Add(Spin)
				spins = 0
				continue
			}
			runtime.Gosched()
		}
		w.task.Store(nil)
		j.f(j.i)
		w.busy.Store(false)
		j.left.Add(-1)
	}
}

// left is how many cores the holders of Leave keep free of the parts.
var left atomic.Int32

// Leave keeps n more cores free of the parts of operations (Threads)
// until release is called, once; holders add up.
func Leave(n int) (release func()) {
	if n < 0 {
		panic("par: leaving a negative number of cores")
	}
	left.Add(int32(n))
	var once sync.Once
	return func() { once.Do(func() { left.Add(-int32(n)) }) }
}

// Threads is how many goroutines an operation spreads its parts over at
// most: GOMAXPROCS less the cores Leave keeps free, at least one.
func Threads() int {
	return max(1, runtime.GOMAXPROCS(0)-int(left.Load()))
}

// Do runs f(0), …, f(n−1) and returns when all have returned: f(0) on the
// caller, the others on workers that are free, or on the caller when none
// is (Do is safe to call from many goroutines, and from inside f). The
// parts must not depend on each other's progress. The workers are
// GOMAXPROCS−1 goroutines started by the first call; a later change of
// GOMAXPROCS does not change how many there are.
func Do(n int, f func(i int)) {
	if n <= 1 {
		if n == 1 {
			f(0)
		}
		return
	}
	once.Do(start)
	var left atomic.Int32
	var inline []int
	next := 0
	for i := 1; i < n; i++ {
		for next < len(workers) && !workers[next].busy.CompareAndSwap(false, true) {
			next++
		}
		if next == len(workers) {
			inline = append(inline, i)
			continue
		}
		w := workers[next]
		next++
		left.Add(1)
		w.task.Store(&job{f: f, i: i, left: &left})
		if w.asleep.Load() {
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
	}
	f(0)
	for _, i := range inline {
		f(i)
	}
	for left.Load() != 0 {
		runtime.Gosched()
	}
}
