package autograd

import (
	"sort"

	"github.com/leangrad/leangrad/memory"
)

// SavedBytes is what the operations of one name saved for the backward.
type SavedBytes struct {
	Op     string `json:"op"`     // the operation ("conv2d", "batch_norm", ...)
	Bytes  int64  `json:"bytes"`  // the pool blocks of what it saved
	Blocks int    `json:"blocks"` // how many blocks
}

// Saved lists what the graph behind root holds for its backward, by the
// name of the operation that saved it, most bytes first: each pool block
// counted once, for the first node (in the backward's order) that saved a
// view of it, and its whole size, as the pool sees it. Tensors that are
// also leaves (parameters) or alive outside the graph are counted all the
// same when a node saved them: exclude is called with each block, and
// those it reports (the caller's parameters, say) are left out. A graph
// already run backward holds nothing.
func Saved(root *T, exclude func(*memory.Block) bool) []SavedBytes {
	gn := root.GradNode()
	if gn == nil {
		return nil
	}
	seen := map[*memory.Block]bool{}
	by := map[string]*SavedBytes{}
	for _, n := range topoOrder(gn.(*node)) {
		for _, t := range n.saved {
			if t == nil || t.Released() {
				continue
			}
			blk := t.Block()
			if blk == nil || seen[blk] || (exclude != nil && exclude(blk)) {
				continue
			}
			seen[blk] = true
			s := by[n.name]
			if s == nil {
				s = &SavedBytes{Op: n.name}
				by[n.name] = s
			}
			s.Bytes += blk.Size()
			s.Blocks++
		}
	}
	out := make([]SavedBytes, 0, len(by))
	for _, s := range by {
		out = append(out, *s)
	}
	SortSaved(out)
	return out
}

// SortSaved orders s most bytes first, then by name.
func SortSaved(s []SavedBytes) {
	sort.Slice(s, func(i, j int) bool {
		if s[i].Bytes != s[j].Bytes {
			return s[i].Bytes > s[j].Bytes
		}
		return s[i].Op < s[j].Op
	})
}
