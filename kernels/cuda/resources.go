package cuda

import (
	"regexp"
	"strconv"
	"strings"
)

// KernelUse is what ptxas gave one kernel of a compilation: its registers
// a thread, the bytes a thread spilled to local memory and read back, its
// stack frame and its static shared memory. A kernel that spills pays
// local-memory traffic where it was meant to keep values in registers
// (layer norm's backward, holding one set of column sums too many, spilled
// 676 bytes and ran 20% slower).
type KernelUse struct {
	Name                    string
	Registers               int
	SpillStores, SpillLoads int // bytes
	Stack                   int // bytes
	Shared                  int // bytes of static shared memory
}

var (
	ptxasEntry = regexp.MustCompile(`Compiling entry function '([^']+)'`)
	ptxasSpill = regexp.MustCompile(`(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads`)
	ptxasUsed  = regexp.MustCompile(`Used (\d+) registers`)
	ptxasSmem  = regexp.MustCompile(`(\d+) bytes smem`)
)

// ParsePtxasLog reads ptxas's verbose log (--ptxas-options=-v, as
// KernelResources compiles with) into each kernel's use, in the log's
// order; lines it does not know are skipped.
func ParsePtxasLog(log string) []KernelUse {
	var out []KernelUse
	for _, line := range strings.Split(log, "\n") {
		if m := ptxasEntry.FindStringSubmatch(line); m != nil {
			out = append(out, KernelUse{Name: m[1]})
			continue
		}
		if len(out) == 0 {
			continue
		}
		k := &out[len(out)-1]
		if m := ptxasSpill.FindStringSubmatch(line); m != nil {
			k.Stack, k.SpillStores, k.SpillLoads = atoi(m[1]), atoi(m[2]), atoi(m[3])
		} else if m := ptxasUsed.FindStringSubmatch(line); m != nil {
			k.Registers = atoi(m[1])
			if m := ptxasSmem.FindStringSubmatch(line); m != nil {
				k.Shared = atoi(m[1])
			}
		}
	}
	return out
}

// atoi is strconv.Atoi for the log's digits ("" is 0).
func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
