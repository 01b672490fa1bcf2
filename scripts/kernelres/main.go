// Command kernelres compiles the CUDA backend's kernels with NVRTC (no GPU
// needed) and prints what ptxas gave each: registers a thread, spill
// stores and loads, stack frame and static shared memory, those that spill
// first. A kernel change that makes a hot kernel spill shows here before
// any device time is spent on it. The figures are this machine's NVRTC's
// (its ptxas may allocate otherwise than the GPU machine's, and NVRTC 11
// compiles sm_90 without the flash kernels' sm_90a path). A kernel's
// figures cover every variant it holds: spills in one template instance (a
// row length GPT-2 never has) show on the whole kernel.
//
//	go run ./scripts/kernelres                      # every kernel, for sm_90
//	go run ./scripts/kernelres -match layernorm_bwd -arch sm_80
package main

import (
	"cmp"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/leangrad/leangrad/kernels/cuda"
)

func main() {
	arch := flag.String("arch", "sm_90", "the architecture to compile for")
	match := flag.String("match", "", "only kernels whose name contains this")
	flag.Parse()
	uses, err := cuda.KernelResources(cuda.Source(), *arch)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kernelres: %v\n", err)
		os.Exit(1)
	}
	uses = slices.DeleteFunc(uses, func(k cuda.KernelUse) bool { return !strings.Contains(k.Name, *match) })
	slices.SortStableFunc(uses, func(a, b cuda.KernelUse) int {
		return cmp.Or(cmp.Compare(b.SpillStores+b.SpillLoads, a.SpillStores+a.SpillLoads), cmp.Compare(b.Registers, a.Registers))
	})
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "registers\tspill stores\tspill loads\tstack\tshared\tkernel\t")
	for _, k := range uses {
		fmt.Fprintf(w, "%d\t%d\t%d\t%d\t%d\t%s\t\n", k.Registers, k.SpillStores, k.SpillLoads, k.Stack, k.Shared, k.Name)
	}
	w.Flush()
}
