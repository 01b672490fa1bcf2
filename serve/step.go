package serve

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"time"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
)

// layout is how a step's inputs and outputs are packed, for S sequences
// of R rows in all, tables W blocks wide and TopN top tokens a sequence:
// the inputs in one buffer of 4-byte words (the I32 ones: tokens,
// positions, slots and sequences of the rows; the last rows, top-k
// settings, seed pairs, draw steps and block tables of the sequences; then
// the F32 ones: temperatures, top-p settings), and the outputs in another
// (tokens and top tokens, then log-probabilities and theirs), so that a
// step writes once and reads once.
type layout struct{ S, R, W, TopN, MaxLen int }

func (l layout) ints() int      { return 4*l.R + 5*l.S + l.S*l.W }
func (l layout) floats() int    { return 2 * l.S }
func (l layout) outInts() int   { return l.S * (1 + l.TopN) }
func (l layout) outFloats() int { return l.S * (1 + l.TopN) }

// buffers are a layout's device buffers: its inputs and its outputs,
// each I32 with its F32 words last.
type buffers struct{ in, out *tensor.Tensor }

func newBuffers(dev *tensor.Device, l layout) buffers {
	return buffers{tensor.Empty(dev, tensor.I32, l.ints()+l.floats()).Keep(), tensor.Empty(dev, tensor.I32, l.outInts()+l.outFloats()).Keep()}
}

func (b buffers) release() {
	b.in.Release()
	b.out.Release()
}

// words is v's first n int32s and the float32s after them, one array.
func words(v []int32, n int) ([]int32, []float32) {
	if len(v) == n {
		return v, nil
	}
	return v[:n], unsafe.Slice((*float32)(unsafe.Pointer(&v[n])), len(v)-n)
}

// graphKey names a captured decoding step: its bucket, and whether it
// finds each row's most likely tokens (kernels.MaxTopN) for log-probabilities.
type graphKey struct {
	n   int
	top bool
}

// graph is a decoding step of a bucket's size captured over the arena.
type graph struct {
	l    layout
	bufs buffers
	plan *memory.Plan
	g    kernels.Graph
}

// runner runs the engine's steps on the device (Note [continuous
// batching], step 4) and holds the last step's outputs, by sequence.
type runner struct {
	e      *Engine
	dev    *tensor.Device
	graphs map[graphKey]*graph // batches of decoding rows, padded to a power of two
	arena  *memory.Arena

	in, out []int32 // a step's inputs and outputs on the host, as their buffers hold them
	// The last step's outputs.
	tokens, topTokens     []int32
	logprobs, topLogprobs []float32
	topN                  int
	launched              time.Time // when the last step's work was queued on the device
}

// buckets are the batch sizes a server warms up (an image classifier's
// forward passes, a GPT's captured decoding steps): powers of two below
// most, and most.
func buckets(most int) []int {
	var b []int
	for n := 1; n < most; n *= 2 {
		b = append(b, n)
	}
	return append(b, most)
}

// bucket is the bucket a batch of n runs at: the next power of two, at
// most most.
func bucket(n, most int) int {
	return min(1<<bits.Len(uint(max(n, 1)-1)), most)
}

// rowBucket is the rows an eager step of n rows runs at on a GPU (Note
// [continuous batching], step 4): 16 at least, then the next multiple of
// an eighth of n's power of two (at most a quarter more rows, 8 sizes an
// octave), at most most unless n is more.
func rowBucket(n, most int) int {
	r := 16
	if n > 16 {
		step := 1 << (bits.Len(uint(n-1)) - 3)
		r = (n + step - 1) / step * step
	}
	return max(n, min(r, most))
}

// rowBuckets are every rowBucket of 1 to most rows.
func rowBuckets(most int) []int {
	var b []int
	for n := 1; n <= most; n++ {
		if r := rowBucket(n, most); len(b) == 0 || b[len(b)-1] != r {
			b = append(b, r)
		}
	}
	return b
}

// pack fills r.in with b's inputs in layout l (l.S and l.R at least b's;
// the rest padding: a row writing nowhere, reading block 0, drawn
// greedily).
func (r *runner) pack(b *batch, l layout) {
	r.in = zeroed(r.in, l.ints()+l.floats())
	in, floats := words(r.in, l.ints())
	tokens, in := in[:l.R], in[l.R:]
	positions, in := in[:l.R], in[l.R:]
	slots, in := in[:l.R], in[l.R:]
	rowSeq, in := in[:l.R], in[l.R:]
	last, in := in[:l.S], in[l.S:]
	topK, in := in[:l.S], in[l.S:]
	seeds, in := in[:2*l.S], in[2*l.S:]
	steps, tables := in[:l.S], in[l.S:]
	temp, topP := floats[:l.S], floats[l.S:]
	copy(tokens, b.tokens)
	copy(positions, b.positions)
	copy(slots, b.slots)
	copy(rowSeq, b.rowSeq)
	for i := len(b.tokens); i < l.R; i++ {
		slots[i], rowSeq[i] = -1, int32(min(i, l.S-1))
	}
	copy(last, b.last)
	for i := len(b.seqs); i < l.S; i++ {
		last[i] = int32(min(i, l.R-1))
	}
	for i := range topP {
		topP[i] = 1
	}
	for i, s := range b.seqs {
		q := s.req
		temp[i], topK[i], topP[i] = float32(q.Temperature), int32(q.TopK), float32(q.TopP)
		seed := q.Seed + uint64(s.index)*0x9E3779B97F4A7C15 // each sample its own stream
		seeds[2*i], seeds[2*i+1], steps[i] = int32(uint32(seed)), int32(uint32(seed>>32)), int32(s.generated())
		for j, blk := range s.table.Blocks {
			tables[i*l.W+j] = blk
		}
	}
}

// zeroed is s resized to n and cleared, its array reused when it is large
// enough.
func zeroed[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// body is the step itself, the same eager and captured: the forward
// through the paged memory and the sampler, from bufs' inputs into bufs'
// outputs. It allocates nothing that outlives it.
func (r *runner) body(l layout, bufs buffers) {
	e := r.e
	r.dev.WithScope(func() {
		off := 0
		view := func(t *tensor.Tensor, n int) *tensor.Tensor {
			v := t.Rows(off, off+n)
			off += n
			return v
		}
		b := nn.PagedBatch{Tokens: view(bufs.in, l.R), Positions: view(bufs.in, l.R), Slots: view(bufs.in, l.R), RowSeq: view(bufs.in, l.R),
			Last: view(bufs.in, l.S), MaxLen: l.MaxLen}
		topK, seeds, steps := view(bufs.in, l.S), view(bufs.in, 2*l.S), view(bufs.in, l.S)
		b.Tables = view(bufs.in, l.S*l.W).View(l.S, l.W)
		fin := bufs.in.Buf().Slice(l.ints(), l.floats()).As(kernels.F32)
		logits := e.g.ForwardPaged(e.kv, b)
		p := kernels.SampleParams{Rows: l.S, V: e.g.Cfg.Vocab, TopN: l.TopN}
		ob := bufs.out.Buf()
		of := ob.Slice(l.outInts(), l.outFloats()).As(kernels.F32)
		var tt, tl kernels.Buf
		if l.TopN > 0 {
			tt, tl = ob.Slice(l.S, l.S*l.TopN), of.Slice(l.S, l.S*l.TopN)
		}
		r.dev.Backend().Sample(p, logits.Buf(), fin.Slice(0, l.S), topK.Buf(), fin.Slice(l.S, l.S), seeds.Buf(), steps.Buf(),
			ob.Slice(0, l.S), of.Slice(0, l.S), tt, tl)
	})
}

// run runs the step w and leaves its outputs in r, by sequence in the
// order of w.parts (a sequence's top tokens kernels.MaxTopN apart). On a
// GPU the decoding rows replay the graph captured for their bucket, and
// the prompts' chunks run eagerly behind it, their kernels launched while
// the graph runs; elsewhere both run as one eager forward.
func (r *runner) run(w *work) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = tensor.AsError(p)
		}
	}()
	r.copyBlocks(w.copies)
	be := r.dev.Backend()
	type part struct {
		l    layout
		bufs buffers
		n    int
	}
	var parts []part
	eager := join(&w.dec, &w.pre)
	if n := len(w.dec.seqs); n > 0 {
		topN := 0
		for _, s := range w.dec.seqs {
			topN = max(topN, s.req.TopLogprobs)
		}
		if g := r.graphs[graphKey{bucket(n, r.e.opts.MaxSeqs), topN > 0}]; g != nil && n <= g.l.S {
			r.pack(&w.dec, g.l)
			be.Write(g.bufs.in.Buf(), int32Bytes(r.in))
			if err := g.g.Launch(); err != nil {
				return err
			}
			r.dev.Allocator().Replayed(r.arena)
			parts = append(parts, part{g.l, g.bufs, n})
			eager = &w.pre
		}
	}
	if len(eager.seqs) > 0 {
		topN := 0
		for _, s := range eager.seqs {
			topN = max(topN, s.req.TopLogprobs)
		}
		l := layout{S: len(eager.seqs), R: len(eager.tokens), W: r.e.width, TopN: topN, MaxLen: eager.maxLen}
		if r.e.pad {
			l.S, l.R = max(l.S, bucket(l.S, r.e.opts.MaxSeqs)), rowBucket(l.R, r.e.opts.MaxBatchTokens)
		}
		r.pack(eager, l)
		bufs := buffers{tensor.FromInt32(r.dev, r.in, len(r.in)), tensor.Empty(r.dev, tensor.I32, l.outInts()+l.outFloats())}
		defer bufs.release()
		r.body(l, bufs)
		parts = append(parts, part{l, bufs, len(eager.seqs)})
	}
	r.launched = time.Now()
	r.tokens, r.logprobs = r.tokens[:0], r.logprobs[:0]
	r.topN = kernels.MaxTopN
	r.topTokens, r.topLogprobs = zeroed(r.topTokens, w.seqs()*r.topN), zeroed(r.topLogprobs, w.seqs()*r.topN)
	at := 0 // the part's first sequence
	for _, p := range parts {
		size := p.l.outInts() + p.l.outFloats()
		r.out = slices.Grow(r.out[:0], size)[:size] // the read writes all of it
		be.Read(int32Bytes(r.out), p.bufs.out.Buf())
		outI, outF := words(r.out, p.l.outInts())
		r.tokens, r.logprobs = append(r.tokens, outI[:p.n]...), append(r.logprobs, outF[:p.n]...)
		for i := range p.n * min(p.l.TopN, 1) {
			copy(r.topTokens[(at+i)*r.topN:], outI[p.l.S+i*p.l.TopN:p.l.S+(i+1)*p.l.TopN])
			copy(r.topLogprobs[(at+i)*r.topN:], outF[p.l.S+i*p.l.TopN:p.l.S+(i+1)*p.l.TopN])
		}
		at += p.n
	}
	return nil
}

// copyBlocks makes the step's copies-on-write, every layer's keys and
// values.
func (r *runner) copyBlocks(cps []BlockCopy) {
	kv, be, C, bs := r.e.kv, r.dev.Backend(), r.e.g.Cfg.Width, r.e.opts.BlockSize
	for _, cp := range cps {
		for i := range kv.K {
			for _, t := range []*tensor.Tensor{kv.K[i], kv.V[i]} {
				buf := t.Buf()
				be.Copy(buf.Slice(int(cp.To)*bs*C, cp.N*C), buf.Slice(int(cp.From)*bs*C, cp.N*C))
			}
		}
	}
}

// idle runs the step of layout l on a batch of padding alone (a step's
// work without a sequence), in bufs, or in buffers of its own when bufs
// is nil.
func (r *runner) idle(l layout, bufs *buffers) {
	if bufs == nil {
		b := newBuffers(r.dev, l)
		defer b.release()
		bufs = &b
	}
	r.pack(&batch{}, l)
	r.dev.Backend().Write(bufs.in.Buf(), int32Bytes(r.in))
	r.body(l, *bufs)
}

// settle runs an eager step of each size a padded eager step can have
// (Note [continuous batching], step 4), so that their products'
// algorithms are chosen before the engine serves.
func (r *runner) settle() error {
	e := r.e
	var ls []layout
	for _, n := range rowBuckets(e.opts.MaxBatchTokens) {
		ls = append(ls, layout{S: 1, R: n})
	}
	for _, n := range buckets(e.opts.MaxSeqs) {
		ls = append(ls, layout{S: n, R: rowBucket(n, e.opts.MaxBatchTokens)})
	}
	for _, l := range ls {
		l.W, l.MaxLen = e.width, e.g.Cfg.Context
		if err := tensor.Catch(func() { r.idle(l, nil) }); err != nil {
			return fmt.Errorf("warming up an eager step of %d rows of %d sequences: %w", l.R, l.S, err)
		}
	}
	return r.dev.Synchronize()
}

// capture records each bucket's decoding step as a graph over one arena:
// each runs once eagerly (its kernels, its products' algorithms), once
// traced and planned, then all are captured over an arena of the largest
// plan.
func (r *runner) capture() error {
	c, ok := r.dev.Backend().(kernels.Capturer)
	if !ok {
		return nil
	}
	a := r.dev.Allocator()
	var size int64
	for _, n := range buckets(r.e.opts.MaxSeqs) {
		for _, top := range []bool{false, true} {
			l := layout{S: n, R: n, W: r.e.width, MaxLen: r.e.g.Cfg.Context}
			if top {
				l.TopN = kernels.MaxTopN
			}
			g := &graph{l: l, bufs: newBuffers(r.dev, l)}
			r.graphs[graphKey{n, top}] = g
			r.idle(l, &g.bufs)
			a.StartTrace()
			r.body(l, g.bufs)
			trace, err := a.StopTrace()
			if err != nil {
				return fmt.Errorf("tracing the decoding step of %d: %w", n, err)
			}
			g.plan = memory.PlanTrace(trace, memory.DefaultPlanOptions)
			size = max(size, g.plan.Size)
		}
	}
	a.EmptyCache() // the eager steps' temporaries: planned steps never use them again
	var err error
	if r.arena, err = a.NewArena(size); err != nil {
		return fmt.Errorf("the decoding steps' arena of %s: %w", memory.Bytes(size), err)
	}
	for key, g := range r.graphs {
		if err := a.BeginPlanned(g.plan, r.arena); err != nil {
			return err
		}
		if err := c.BeginCapture(); err != nil {
			a.EndPlanned()
			return err
		}
		r.body(g.l, g.bufs)
		gr, cerr := c.EndCapture()
		if err := errors.Join(cerr, a.EndPlanned()); err != nil {
			if gr != nil {
				gr.Release()
			}
			return fmt.Errorf("capturing the decoding step of %d: %w", key.n, err)
		}
		g.g = gr
	}
	return nil
}

// release frees the graphs, their buffers and the arena.
func (r *runner) release() {
	for _, g := range r.graphs {
		if g.g != nil {
			g.g.Release()
		}
		g.bufs.release()
	}
	r.graphs = nil
	if r.arena != nil {
		r.arena.Release()
		r.arena = nil
	}
}

func int32Bytes(v []int32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}
