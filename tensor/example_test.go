package tensor_test

import (
	"fmt"

	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
)

// Tensors draw their memory from the device's caching allocator and give it
// back at their last Release.
func Example() {
	dev := tensor.CPU()
	stats := func() int64 { return dev.Allocator().Stats().Allocated[memory.All].Current }
	before := stats()

	x := tensor.Zeros(dev, tensor.F32, 256, 256) // 256 KiB from the small pool
	v := x.View(-1)                              // a view shares the storage
	fmt.Println(x, v.Shape(), stats()-before)
	x.Release()
	fmt.Println(stats() - before) // still held by the view
	v.Release()
	fmt.Println(stats() - before)
	// Output:
	// Tensor(f32 [256 256] cpu) [65536] 262144
	// 262144
	// 0
}
