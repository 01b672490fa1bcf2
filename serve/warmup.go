package serve

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
)

// warmUp readies the engine on its loop's goroutine: it measures the
// workspace of the largest decoding step and of the largest prefill (over
// a memory of one block), sizes and allocates the key-value memory from
// what is left (EngineOptions.KVMemory), runs the eager steps' padded
// sizes once where they are padded, and captures the decoding steps.
func (e *Engine) warmUp() error {
	e.runner = &runner{e: e, dev: e.dev, graphs: map[graphKey]*graph{}}
	if err := e.stepsFit(); err != nil {
		return err
	}
	work, err := e.workspace()
	if err != nil {
		return err
	}
	blocks, err := e.kvSize(work)
	if err != nil {
		return err
	}
	if e.kv, err = e.g.NewPagedKV(e.dev, e.opts.DType, blocks, e.opts.BlockSize); err != nil {
		return err
	}
	e.blocks = NewBlockManager(blocks, e.opts.BlockSize, !e.opts.NoPrefixCache)
	e.nblock.Store(int64(blocks))
	if e.pad {
		if err := e.runner.settle(); err != nil {
			return err
		}
	}
	if !e.opts.NoCapture {
		if err := e.runner.capture(); err != nil {
			return err
		}
	}
	e.m.gauges()
	return nil
}

// stepsFit refuses, before anything is allocated for them, steps that
// cannot fit in what is free: a decoding step of MaxSeqs sequences holds
// at least their logits (MaxSeqs × Vocab values of the engine's DType)
// and its inputs (4-byte words), and a prefill step of MaxBatchTokens rows
// at least their MLP's activations (rows × 4·Width values).
func (e *Engine) stepsFit() error {
	free := e.free()
	cfg := e.g.Cfg
	l := layout{S: 1, R: 1, W: e.width, TopN: kernels.MaxTopN} // a sequence's words, times MaxSeqs in float64
	words := float64(l.ints() + l.floats() + l.outInts() + l.outFloats())
	size := float64(e.opts.DType.Size())
	for _, c := range []struct {
		what string
		need float64 // bytes: float64, as a size past the int64s says too
	}{
		{fmt.Sprintf("a decoding step of %d sequences (MaxSeqs, serve's -max-seqs): their logits and inputs", e.opts.MaxSeqs),
			float64(e.opts.MaxSeqs) * (size*float64(cfg.Vocab) + 4*words)},
		{fmt.Sprintf("a step of %d prompt rows (MaxBatchTokens, serve's -max-batch-tokens): their MLP's activations", e.opts.MaxBatchTokens),
			size * float64(e.opts.MaxBatchTokens) * 4 * float64(cfg.Width)},
	} {
		if c.need > float64(free) {
			return fmt.Errorf("%s alone take %s, and %s is free: %w", c.what, memory.Bytes(int64(min(c.need, 1<<62))), memory.Bytes(free), memory.ErrOutOfMemory)
		}
	}
	return nil
}

// free is the memory free for the engine's device: the device's, within
// the pool's limit.
func (e *Engine) free() int64 {
	free, _ := e.dev.MemInfo()
	a := e.dev.Allocator()
	if lim := a.Limit(); lim > 0 {
		free = min(free, lim-a.Stats().Reserved[memory.All].Current)
	}
	return free
}

// workspace is the most the pool's allocated bytes rise in an eager step
// of MaxSeqs decoding rows or of MaxBatchTokens prefill rows: what must
// stay free beside the key-value memory.
func (e *Engine) workspace() (int64, error) {
	kv, err := e.g.NewPagedKV(e.dev, e.opts.DType, 1, e.opts.BlockSize)
	if err != nil {
		return 0, err
	}
	e.kv = kv
	defer func() { kv.Release(); e.kv = nil }()
	a := e.dev.Allocator()
	var most int64
	for _, l := range []layout{
		{S: e.opts.MaxSeqs, R: e.opts.MaxSeqs, W: e.width, TopN: kernels.MaxTopN, MaxLen: e.g.Cfg.Context},
		{S: 1, R: e.opts.MaxBatchTokens, W: e.width, TopN: kernels.MaxTopN, MaxLen: e.g.Cfg.Context},
	} {
		base := a.Stats().Allocated[memory.All].Current
		a.WindowPeak()
		err := tensor.Catch(func() {
			e.runner.idle(l, nil)
			if err := e.dev.Synchronize(); err != nil {
				panic(err)
			}
		})
		if err != nil {
			return 0, fmt.Errorf("warming up a step of %d rows: %w", l.R, err)
		}
		peak, _ := a.WindowPeak()
		most = max(most, peak-base)
	}
	a.EmptyCache()
	return most, nil
}

// kvSize is the blocks of the key-value memory: EngineOptions.KVMemory of
// what is free beside work bytes of a step's workspace (twice over: a
// captured step's arena and an eager step beside it), or by default room
// for MaxSeqs sequences of the whole context, at most nine tenths of that.
// Fewer blocks than one sequence of the whole context needs is an error.
func (e *Engine) kvSize(work int64) (int, error) {
	per := e.g.KVBlockBytes(e.opts.DType, e.opts.BlockSize)
	avail := max(0, e.free()-2*work)
	var want int64
	switch b := e.opts.KVMemory; {
	case b.Bytes > 0:
		want = b.Bytes
	case b.Fraction > 0:
		want = int64(b.Fraction * float64(avail))
	default:
		want = min(int64(e.opts.MaxSeqs*e.width+1)*per, avail/10*9)
	}
	if want > avail {
		return 0, fmt.Errorf("the key-value memory of %s: %s is free beside the model and a step's workspace of %s", memory.Bytes(want),
			memory.Bytes(avail), memory.Bytes(work))
	}
	blocks := int(want / per)
	if blocks < e.width+1 {
		return 0, fmt.Errorf("the key-value memory of %s holds %d blocks of %d positions (%s each), and one sequence of the whole context (%d) needs %d: give it more",
			memory.Bytes(want), blocks, e.opts.BlockSize, memory.Bytes(per), e.g.Cfg.Context, e.width+1)
	}
	return blocks, nil
}
