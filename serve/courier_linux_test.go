package serve

import (
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// BenchmarkCourierDelivery: the engine loop's hand-off of a step's events
// to the courier (Note [events by courier]), as a GPU step has it: 64
// samples' events posted, then 50 µs of the next step's host work, then
// the loop blocked 2 ms in a system call, as it is while it waits for the
// device. It reports how long each event took from its post to its reader
// (the median and the 90th percentile) and the loop's time to post a
// step. A courier the blocked loop kept from running would show the 2 ms.
func BenchmarkCourierDelivery(b *testing.B) {
	const samples, work, wait = 64, 50 * time.Microsecond, 2 * time.Millisecond
	e := &Engine{}
	end := e.startCourier()
	posted := make([]time.Time, b.N)
	var mu sync.Mutex
	var took []time.Duration
	var readers sync.WaitGroup
	seqs := make([]*sequence, samples)
	for i := range seqs {
		ch := make(chan Event, b.N)
		seqs[i] = &sequence{out: ch}
		readers.Add(1)
		go func() {
			defer readers.Done()
			mine := make([]time.Duration, 0, b.N)
			for ev := range ch {
				mine = append(mine, time.Since(posted[ev.Token]))
			}
			mu.Lock()
			took = append(took, mine...)
			mu.Unlock()
		}()
	}
	var posting time.Duration
	b.ResetTimer()
	for step := range b.N {
		posted[step] = time.Now()
		for _, s := range seqs {
			e.emit(s, Event{Token: int32(step)})
		}
		e.post()
		posting += time.Since(posted[step])
		for t := time.Now(); time.Since(t) < work; {
		}
		ts := syscall.NsecToTimespec(int64(wait))
		syscall.Syscall(syscall.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
	}
	b.StopTimer()
	end()
	for _, s := range seqs {
		close(s.out)
	}
	readers.Wait()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds()), "µs-to-deliver-p50")
	b.ReportMetric(float64(took[len(took)*9/10].Microseconds()), "µs-to-deliver-p90")
	b.ReportMetric(float64(posting.Microseconds())/float64(b.N), "µs-to-post")
}
