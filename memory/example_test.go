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
