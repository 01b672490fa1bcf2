package cuda

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels"
)

// tensorList is the kernels' struct TensorList: up to mtMax tensors of up
// to four lists (parameters, gradients, moments), their lengths, and how
// many there are.
type tensorList struct {
	n     [mtMax]int64
	p     [4][mtMax]uintptr `c:"float*"`
	count int32
}

const mtMax = 32

// The multi-tensor kernels' argument (copy.cu, optim.cu).
type listArgs struct{ L tensorList } // copy_multi, cast_multi_*, accumulate_multi_*

// multiTensor launches the lists, pairwise of the same lengths (their
// dtypes checked by the caller), in groups of mtMax tensors: launch is
// called with each group's list and dims.
func (b *Backend) multiTensor(name string, lists [][]kernels.Buf, launch func(l tensorList, d dims)) {
	for i := range lists[0] {
		for _, l := range lists {
			if l[i].N != lists[0][i].N {
				panic(fmt.Sprintf("cuda: %s: tensor %d: %d elements, want %d", name, i, l[i].N, lists[0][i].N))
			}
		}
	}
	b.multiGroups(lists, func(l tensorList, most int64) { launch(l, b.multiDims(most, int(l.count))) })
}

// multiGroups calls launch with the lists (checked by the caller) in
// groups of mtMax tensors: each group's list, whose lengths are the first
// list's, and its longest length.
func (b *Backend) multiGroups(lists [][]kernels.Buf, launch func(l tensorList, most int64)) {
	b.enter()
	defer b.exit()
	for lo := 0; lo < len(lists[0]); lo += mtMax {
		hi := min(lo+mtMax, len(lists[0]))
		var tl tensorList
		var most int64
		for i := lo; i < hi; i++ {
			tl.n[i-lo] = int64(lists[0][i].N)
			most = max(most, tl.n[i-lo])
			for j, l := range lists {
				tl.p[j][i-lo] = ptrOf(l[i])
			}
		}
		tl.count = int32(hi - lo)
		launch(tl, most)
	}
}

// multiDims is a multi-tensor launch's grid for tensors of up to most
// elements: a row of blocks per tensor, as many as fill the device for
// the largest (a token embedding holds a third of GPT-2's parameters);
// the blocks past a smaller tensor's end return at once.
func (b *Backend) multiDims(most int64, tensors int) dims {
	return dims{min(b.blocks(most, blockSize), uint32(4*b.sms)), uint32(tensors), blockSize}
}
