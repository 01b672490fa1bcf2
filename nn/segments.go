package nn

import (
	"fmt"
	"math"
)

// keepPerBlock is about how many tensors of its output's size a residual
// block keeps when a checkpoint recomputes it: its two convolutions'
// outputs and, every other block, its output (Note [a batch norm's output
// written again] in package autograd). Measured: ResNet-1202's segments of
// 25 blocks held 187 MiB of recomputed activations at the peak of its AMP
// step at batch 128 on the H200, 2.4 of a first-stage block's 3.06 MiB
// output a block.
const keepPerBlock = 2.5

// segmentSpans is the segments [lo, hi) of n modules that mode checkpoints:
// one of all (NoCheckpoint), one a module (CheckpointBlocks and
// CheckpointLight), or for
// CheckpointSqrt consecutive runs: ⌈√n⌉ modules each when out is nil, or
// else balanced by size (Note [checkpoint segments by size]), out[i] being
// module i's output size and in the first one's input size, in any one
// unit.
func segmentSpans(mode CheckpointMode, n int, in int64, out []int64) [][2]int {
	var starts []int
	switch {
	case n == 0:
		return nil
	case mode == CheckpointBlocks || mode == CheckpointLight:
		for i := range n {
			starts = append(starts, i)
		}
	case mode != CheckpointSqrt:
		starts = []int{0}
	case out == nil:
		size := int(math.Ceil(math.Sqrt(float64(n))))
		for i := 0; i < n; i += size {
			starts = append(starts, i)
		}
	default:
		starts = balancedStarts(in, out, keepPerBlock)
	}
	spans := make([][2]int, len(starts))
	for k, lo := range starts {
		spans[k] = [2]int{lo, n}
		if k > 0 {
			spans[k-1][1] = lo
		}
	}
	return spans
}

// checkpointSpans is segmentSpans with, under CheckpointBlocks (or
// CheckpointLight, whose spans are the same), only the
// first `first` of the n modules checkpointed (0, or n and more: all of
// them): it returns the spans and how many of them, from the first, are
// checkpointed; the modules after those run as one span that keeps its
// activations (Note [checkpointing some blocks]).
func checkpointSpans(mode CheckpointMode, first, n int, in int64, out []int64) (spans [][2]int, checkpointed int) {
	spans = segmentSpans(mode, n, in, out)
	switch {
	case mode == NoCheckpoint:
		return spans, 0
	case (mode == CheckpointBlocks || mode == CheckpointLight) && first > 0 && first < n:
		return append(spans[:first:first], [2]int{first, n}), first
	}
	return spans, len(spans)
}

// checkedFirst is k, the number of a model's n blocks to checkpoint
// (Checkpointer.SetCheckpointed), or a panic naming both.
func checkedFirst(k, n int) int {
	if k < 0 || k > n {
		panic(fmt.Sprintf("nn: checkpointing the first %d of %d blocks: want 0 (all) to %d", k, n, n))
	}
	return k
}

// shares is each of sizes as a share of their sum.
func shares(sizes []int64) []float64 {
	var sum int64
	for _, s := range sizes {
		sum += s
	}
	out := make([]float64, len(sizes))
	for i, s := range sizes {
		out[i] = float64(s) / float64(max(sum, 1))
	}
	return out
}

// Note [checkpointing some blocks]: checkpointing every block trades a
// block's activations for its recomputation, about a third of its work;
// when the memory allows some blocks' activations, checkpointing only the
// others costs less. It is the first blocks that are checkpointed: the
// backward reaches them last, when the kept blocks' activations are gone,
// so their recomputation adds nothing to the step's peak, which is where
// the backward begins: the kept blocks' activations, the checkpointed
// blocks' inputs. A ResNet's first blocks are also its largest (its first
// stage's activations are four times its last's, for the same work). With
// the first k blocks checkpointed the peak is about none − w·(none − all),
// a little less, none and all being the peaks of none and of all the
// blocks checkpointed and w the first k blocks' share of what
// checkpointing saves (Checkpointer.CheckpointShares: k/n for a GPT's
// equal blocks, by their outputs' sizes for a ResNet's): checkpointing
// every block saves the sum of what each keeps beyond its input, less the
// recomputation of one block at the end of the backward, which
// checkpointing some leaves out. This is the budget's prediction
// (train.FitBudget).

// Note [checkpoint segments by size]: a model checkpointed in segments
// keeps every segment's input until that segment's backward, and during a
// segment's backward what its modules keep when recomputed. The backward
// runs the segments last to first, so segment k's peak is its own share
// plus the inputs of segments 1 to k: the step's is about the largest of
// those. For n modules of one size that keep one tensor each, ⌈√n⌉
// segments of ⌈√n⌉ modules about balance the two. A residual block keeps
// about keepPerBlock tensors of its size, and a CIFAR ResNet's first
// stage's tensors are four times its last's, while the early segments,
// whose backward comes last, have few inputs alive beside them: so the
// segments are cut to minimise max over k of keep·(segment k's Σ out) +
// (the inputs of segments 1 to k). For a bound P on that, the cut that
// makes each segment as long as P allows is found greedily; the least P
// with a cut is found by bisection. For ResNet-1202 on 28×28 images that
// is 61 segments of 14 blocks in the first stage to about 10 in the last,
// against 24 of 25: 115 against 216 MiB by this count at batch 128 in F16
// (the H200's measured 187 + 21 MiB for the latter). Each module is
// recomputed once either way, so the step's work does not change.

// balancedStarts is where segmentSpans' balanced segments start (Note
// [checkpoint segments by size]).
func balancedStarts(in int64, out []int64, keep float64) []int {
	// cut makes each segment as long as the bound p allows, and reports
	// false when a module alone passes it.
	cut := func(p float64) ([]int, bool) {
		starts := []int{0}
		inputs, sum := float64(in), 0.0
		for i, o := range out {
			if i > 0 && keep*(sum+float64(o))+inputs > p {
				starts = append(starts, i)
				inputs += float64(out[i-1])
				sum = 0
			}
			sum += float64(o)
			if keep*sum+inputs > p {
				return nil, false
			}
		}
		return starts, true
	}
	total := float64(in)
	for _, o := range out {
		total += (keep + 1) * float64(o)
	}
	lo, hi := 0.0, total // one segment of everything fits under total
	for range 64 {
		mid := (lo + hi) / 2
		if _, ok := cut(mid); ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	starts, _ := cut(hi)
	return starts
}

// LightCheckpoints reports whether m's blocks mark products a light
// checkpoint keeps (a GPT's): CheckpointLight is for such models only.
func LightCheckpoints(m Model) bool {
	_, ok := m.(*GPT)
	return ok
}
