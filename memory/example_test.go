package memory_test

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/leangrad/leangrad/memory"
)

// Read the allocator's report: Stats for numbers, Summary for the table
// PyTorch's torch.cuda.memory_summary() prints.
func ExampleAllocator_Summary() {
	a := memory.New(memory.NewHeapSource(), memory.Config{Device: "cpu"})
	small, _ := a.Alloc(1000, 0)  // rounded to 1024 B, in a 2 MiB small-pool segment
	large, _ := a.Alloc(3<<20, 0) // in a 20 MiB large-pool segment
	a.Free(small)
	st := a.Stats()
	fmt.Println("allocated:", st.Allocated[memory.All].Current, "peak:", st.Allocated[memory.All].Peak)
	fmt.Println("reserved:", st.Reserved[memory.All].Current>>20, "MiB in", st.Segments[memory.All].Current, "segments")
	fmt.Println(strings.Split(a.Summary(), "\n")[1])
	a.Free(large)
	a.EmptyCache()
	fmt.Println("reserved after EmptyCache:", a.Stats().Reserved[memory.All].Current)
	// Output:
	// allocated: 3145728 peak: 3146752
	// reserved: 22 MiB in 2 segments
	// |                    leangrad memory summary, device cpu                    |
	// reserved after EmptyCache: 0
}

// Record the allocator's history and write a snapshot that
// pytorch.org/memory_viz opens.
func ExampleWriteSnapshot() {
	a := memory.New(memory.NewHeapSource(), memory.Config{Device: "cpu"})
	a.RecordHistory(true)
	b, _ := a.Alloc(4096, 0)
	a.Free(b)
	a.RecordHistory(false)
	s := a.Snapshot()
	var buf bytes.Buffer // a file: memory_viz reads it
	if err := memory.WriteSnapshot(&buf, s); err != nil {
		panic(err)
	}
	for _, e := range s.Trace {
		fmt.Println(e.Action, e.Size, e.Frames()[0].Function)
	}
	// Output:
	// segment_alloc 2097152 github.com/leangrad/leangrad/memory_test.ExampleWriteSnapshot
	// alloc 4096 github.com/leangrad/leangrad/memory_test.ExampleWriteSnapshot
	// free_completed 4096 github.com/leangrad/leangrad/memory_test.ExampleWriteSnapshot
}

// The pool's books: a step traced once is replayed under caps, over no
// memory, to see whether the pool would hold it (train's -max-memory asks
// them before it runs a whole batch).
func ExampleAllocator_Replay() {
	pool := memory.New(memory.NewHeapSource(), memory.Config{Device: "cpu"})
	pool.StartTrace()
	a, _ := pool.Alloc(6<<20, 0) // an activation
	b, _ := pool.Alloc(3<<20, 0) // another
	pool.Free(a)
	c, _ := pool.Alloc(5<<20, 0) // a gradient, in the first one's place
	pool.Free(b)
	pool.Free(c)
	step, _ := pool.StopTrace()
	for _, limit := range []int64{0, 12 << 20, 8 << 20} {
		allocated, reserved, err := pool.Replay(limit, memory.Work{Traces: []*memory.Trace{step}})
		capped := "uncapped"
		if limit > 0 {
			capped = "capped at " + memory.Bytes(limit).String()
		}
		if err != nil {
			fmt.Printf("%s: out of memory\n", capped)
			continue
		}
		fmt.Printf("%s: %s allocated, %s reserved\n", capped, memory.Bytes(allocated), memory.Bytes(reserved))
	}
	// Output:
	// uncapped: 9.00 MiB allocated, 20.00 MiB reserved
	// capped at 12.00 MiB: 9.00 MiB allocated, 9.00 MiB reserved
	// capped at 8.00 MiB: out of memory
}
