package serve

import (
	"errors"
	"slices"
	"time"
)

// batch is sequences that run in one forward: each with the rows of its
// new positions (none for a fork, which takes its parent's logits), and
// those that take a token at its end.
type batch struct {
	seqs    []*sequence
	rows    []int   // each sequence's rows this step
	last    []int32 // the row whose logits each sequence takes
	samples []bool  // whether each sequence takes a token at the end
	// The rows: token, position, slot, sequence (an index into seqs).
	tokens, positions, slots, rowSeq []int32
	maxLen                           int
}

// work is one step: the running sequences' next tokens (dec, a row each,
// replayed as a captured graph on a GPU) and the admitted prompts' chunks
// and forks (pre, run eagerly behind it), after the copies-on-write.
type work struct {
	dec, pre batch
	copies   []BlockCopy
}

// parts are the step's batches in the order of its outputs.
func (w *work) parts() []*batch { return []*batch{&w.dec, &w.pre} }

// seqs is the step's sequences.
func (w *work) seqs() int { return len(w.dec.seqs) + len(w.pre.seqs) }

// schedule makes the next step (Note [continuous batching], steps 2 and
// 3), or nil when nothing can run.
func (e *Engine) schedule() *work {
	w := &work{}
	e.blocks.NewStep()
	// The running sequences' next tokens, preempting the newest until
	// every one of them has its block.
	for len(e.running) > 0 {
		need := 0
		for _, s := range e.running {
			if e.blocks.NeedsBlock(s.table) {
				need++
			}
		}
		if need <= e.blocks.Available() {
			break
		}
		e.preempt()
	}
	for _, s := range e.running {
		slot, cp, err := e.blocks.Append(s.table)
		if err != nil { // counted above: cannot happen
			panic("serve: a running sequence's block: " + err.Error())
		}
		if cp != nil {
			w.copies = append(w.copies, *cp)
		}
		pos := len(s.tokens) - 1
		w.dec.add(s, []int32{s.tokens[pos]}, pos, []int32{slot}, true)
	}
	// The waiting sequences, oldest first, as far as the step's rows and
	// MaxSeqs allow; with StaticBatching, only the batch taken from the
	// queue when the last one ended (e.static of them still to admit).
	budget := e.opts.MaxBatchTokens - len(e.running)
	seqs := len(e.running)
	if e.opts.StaticBatching {
		if len(e.running) == 0 && e.static == 0 {
			for n := 0; e.static < len(e.waiting); e.static++ { // as many as MaxSeqs holds, their samples counted
				if n += 1 + len(e.waiting[e.static].forks); n > e.opts.MaxSeqs {
					break
				}
			}
		}
		e.static = min(e.static, len(e.waiting))
	}
	for len(e.waiting) > 0 && budget > 0 {
		s := e.waiting[0]
		if s.table == nil {
			if e.opts.StaticBatching && e.static == 0 || seqs+1+len(s.forks) > e.opts.MaxSeqs {
				break
			}
			t, cached, err := e.blocks.Prefill(s.tokens)
			if errors.Is(err, ErrNoBlocks) {
				break // the running sequences free blocks as they end
			}
			s.table, s.done = t, cached
			if e.opts.StaticBatching {
				e.static--
			}
		}
		n := min(len(s.tokens)-s.done, budget)
		slots := make([]int32, n)
		for i := range slots {
			slots[i] = s.table.Slot(s.done+i, e.opts.BlockSize)
		}
		finished := s.done+n == len(s.tokens)
		w.pre.add(s, s.tokens[s.done:s.done+n], s.done, slots, finished)
		e.blocks.Writing(s.table, s.tokens[:s.prompt], s.done+n) // the prompts after it in this step may share them
		budget -= n
		if !finished {
			break // the budget is spent: the rest of this prompt next step
		}
		e.waiting = e.waiting[1:]
		e.running = append(e.running, s)
		seqs++
		for _, f := range s.forks { // the other samples: the prompt's blocks shared, its logits drawn again
			f.table, f.done, f.order = e.blocks.Fork(s.table), s.done+n, s.order
			w.pre.fork(f, w.pre.last[len(w.pre.last)-1])
			e.running = append(e.running, f)
			seqs++
		}
		s.forks = nil
	}
	if w.seqs() == 0 {
		return nil
	}
	e.m.batch(w)
	return w
}

// add puts sequence s in the batch with rows for tokens at positions from
// on, at slots.
func (b *batch) add(s *sequence, tokens []int32, from int, slots []int32, samples bool) {
	i := int32(len(b.seqs))
	b.seqs, b.rows, b.samples = append(b.seqs, s), append(b.rows, len(tokens)), append(b.samples, samples)
	for j, t := range tokens {
		b.tokens, b.positions = append(b.tokens, t), append(b.positions, int32(from+j))
		b.slots, b.rowSeq = append(b.slots, slots[j]), append(b.rowSeq, i)
	}
	b.last = append(b.last, int32(len(b.tokens)-1))
	b.maxLen = max(b.maxLen, from+len(tokens))
}

// fork puts the fork f in the batch: no rows, its parent's last row's
// logits.
func (b *batch) fork(f *sequence, row int32) {
	b.seqs, b.rows, b.samples, b.last = append(b.seqs, f), append(b.rows, 0), append(b.samples, true), append(b.last, row)
}

// join is a and b as one batch: a's sequences, then b's.
func join(a, b *batch) *batch {
	j := &batch{maxLen: max(a.maxLen, b.maxLen)}
	for _, x := range []*batch{a, b} {
		seq, row := int32(len(j.seqs)), int32(len(j.tokens))
		j.seqs, j.rows, j.samples = append(j.seqs, x.seqs...), append(j.rows, x.rows...), append(j.samples, x.samples...)
		for _, l := range x.last {
			j.last = append(j.last, l+row)
		}
		for _, r := range x.rowSeq {
			j.rowSeq = append(j.rowSeq, r+seq)
		}
		j.tokens, j.positions, j.slots = append(j.tokens, x.tokens...), append(j.positions, x.positions...), append(j.slots, x.slots...)
	}
	return j
}

// deliver takes the step's tokens to their sequences (Note [continuous
// batching], step 5): each sampling sequence's token is sent, and the
// samples that are done end; the prefills' new blocks enter the prefix
// cache.
func (e *Engine) deliver(w *work) {
	now := time.Now()
	i := -1
	for _, b := range w.parts() {
		for k, s := range b.seqs {
			i++
			e.deliverOne(s, b.rows[k], b.samples[k], i, now)
		}
	}
	e.m.gauges()
}

// deliverOne takes sequence s's part of the step: rows new positions, and
// when it samples, the runner's token i.
func (e *Engine) deliverOne(s *sequence, rows int, samples bool, i int, now time.Time) {
	s.done += rows
	if s.done <= s.prompt {
		e.blocks.Computed(s.table, s.tokens[:s.prompt], s.done)
	}
	if !samples {
		return
	}
	tok := e.runner.tokens[i]
	s.tokens = append(s.tokens, tok)
	ev := Event{Index: s.index, Token: tok, Logprob: e.runner.logprobs[i]}
	if n := s.req.TopLogprobs; n > 0 {
		for j := range n {
			t := e.runner.topTokens[i*e.runner.topN+j]
			ev.Top = append(ev.Top, TopLogprob{Token: t, Text: e.tok.Decode([]int32{t}), Logprob: e.runner.topLogprobs[i*e.runner.topN+j]})
		}
	}
	e.m.token(s, now)
	finish := ""
	if tok == e.eot && !s.req.IgnoreEOS {
		s.tokens = s.tokens[:len(s.tokens)-1] // the end of the text is no text of its own
		finish = FinishStop
	} else {
		text, stopped := s.text.next(e.tok.Decode(s.tokens[len(s.tokens)-1:]), s.req.Stop)
		ev.Text = text
		e.emit(s, ev)
		switch {
		case stopped:
			finish = FinishStop
		case s.generated() >= s.req.MaxTokens:
			finish = FinishLength
		}
	}
	if finish != "" {
		e.running = slices.DeleteFunc(e.running, func(x *sequence) bool { return x == s })
		e.end(s, finish, nil)
	}
}
