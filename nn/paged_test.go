package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
)

// TestGPTForwardPagedMatchesForward runs sequences through a paged memory
// as a server does: prefills of several prompts in one batch, a prompt in
// two chunks, decoding steps of many sequences at once, a sequence that
// joins mid-way, one that reuses another's first block (a shared prefix),
// padding rows; each sequence's logits must equal the full forward's of
// its tokens so far, within 1e-5 in F32.
func TestGPTForwardPagedMatchesForward(t *testing.T) { testGPTForwardPaged(t, tensor.CPU(), 0, 1e-5) }

func testGPTForwardPaged(t *testing.T, dev *tensor.Device, amp tensor.DType, tol float64) {
	g, err := NewGPT(dev, GPTConfig{Layers: 2, Heads: 2, Width: 16, Vocab: 23, Context: 24})
	if err != nil {
		t.Fatal(err)
	}
	defer Release(g)
	g.SetTraining(false)
	const bs = 4
	dt := tensor.F32
	if amp != 0 {
		dt = amp
	}
	kv, err := g.NewPagedKV(dev, dt, 32, bs)
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Release()
	rng := rand.New(rand.NewPCG(5, 6))
	type seq struct {
		tokens []int32
		table  []int32
		done   int // positions in the memory
	}
	next := int32(1) // block 0 stays spare
	newSeq := func(n int, shareFrom *seq) *seq {
		s := &seq{}
		for range n {
			s.tokens = append(s.tokens, int32(rng.IntN(23)))
		}
		if shareFrom != nil { // the same first block of tokens, its keys and values already there
			copy(s.tokens, shareFrom.tokens[:bs])
			s.table, s.done = []int32{shareFrom.table[0]}, bs
		}
		for len(s.table) < 6 {
			s.table, next = append(s.table, next), next+1
		}
		return s
	}
	// step runs rows new positions of each sequence (0: none) and checks
	// the logits of those that ran.
	step := func(seqs []*seq, rows []int, pad int) {
		var tok, pos, slot, rowSeq, tables, last []int32
		maxLen := 1
		var ran []int
		for i, s := range seqs {
			tables = append(tables, s.table...)
			for range rows[i] {
				j := s.done
				tok, pos, rowSeq = append(tok, s.tokens[j]), append(pos, int32(j)), append(rowSeq, int32(i))
				slot = append(slot, s.table[j/bs]*bs+int32(j%bs))
				s.done++
				maxLen = max(maxLen, s.done)
			}
			last = append(last, int32(max(len(tok)-1, 0)))
			if rows[i] > 0 {
				ran = append(ran, i)
			}
		}
		for range pad {
			tok, pos, rowSeq, slot = append(tok, 0), append(pos, 0), append(rowSeq, 0), append(slot, -1)
		}
		dev.WithScope(func() {
			run := func() *tensor.Tensor {
				return g.ForwardPaged(kv, PagedBatch{Tokens: tensor.FromInt32(dev, tok, len(tok)), Positions: tensor.FromInt32(dev, pos, len(pos)),
					Slots: tensor.FromInt32(dev, slot, len(slot)), RowSeq: tensor.FromInt32(dev, rowSeq, len(rowSeq)),
					Tables: tensor.FromInt32(dev, tables, len(seqs), 6), Last: tensor.FromInt32(dev, last, len(last)), MaxLen: maxLen})
			}
			var logits []float32
			if amp != 0 {
				ag.Autocast(dev, amp, func() { logits = run().Float32s() })
			} else {
				logits = run().Float32s()
			}
			for _, i := range ran {
				s := seqs[i]
				var want []float32
				ag.NoGrad(dev, func() {
					full := func() *tensor.Tensor { return g.Forward(tensor.FromInt32(dev, s.tokens[:s.done], 1, s.done)) }
					var all []float32
					if amp != 0 {
						ag.Autocast(dev, amp, func() { all = full().Float32s() })
					} else {
						all = full().Float32s()
					}
					want = all[(s.done-1)*23:]
				})
				got := logits[i*23 : (i+1)*23]
				var worst float64
				for j := range want {
					worst = max(worst, math.Abs(float64(got[j]-want[j])))
				}
				if worst > tol {
					t.Errorf("sequence %d at %d positions: logits %v off the full forward's by %g", i, s.done, fmt.Sprint(got[:4]), worst)
				}
			}
		})
	}
	a, b := newSeq(10, nil), newSeq(7, nil)
	step([]*seq{a, b}, []int{6, 7}, 0) // two prefills, a's first chunk
	b.tokens = append(b.tokens, 5)
	step([]*seq{a, b}, []int{4, 1}, 1) // a's second chunk beside b's first decode, a padding row
	c := newSeq(9, a)                  // shares a's first block
	step([]*seq{a, b, c}, []int{0, 0, 5}, 0)
	for range 3 { // decoding all three, c joined
		for _, s := range []*seq{a, b, c} {
			s.tokens = append(s.tokens, int32(rng.IntN(23)))
		}
		step([]*seq{a, b, c}, []int{1, 1, 1}, 2)
	}
}

// decodeStep is a decoding step of seqs sequences of cached positions
// each (their next token: random), over blocks of bs positions, a table
// of width blocks a sequence, sequence i's in blocks [i·width, i·width+width).
func decodeStep(dev *tensor.Device, rng *rand.Rand, vocab, seqs, cached, bs, width int) func() PagedBatch {
	var tok, pos, slot, rowSeq, tables, last []int32
	for i := range seqs {
		for j := range width {
			tables = append(tables, int32(i*width+j))
		}
		tok, pos, rowSeq = append(tok, int32(rng.IntN(vocab))), append(pos, int32(cached)), append(rowSeq, int32(i))
		slot, last = append(slot, int32(i*width*bs+cached)), append(last, int32(i))
	}
	return func() PagedBatch {
		return PagedBatch{Tokens: tensor.FromInt32(dev, tok, seqs), Positions: tensor.FromInt32(dev, pos, seqs),
			Slots: tensor.FromInt32(dev, slot, seqs), RowSeq: tensor.FromInt32(dev, rowSeq, seqs),
			Tables: tensor.FromInt32(dev, tables, seqs, width), Last: tensor.FromInt32(dev, last, seqs), MaxLen: cached + 1}
	}
}

// TestForwardPagedPackedWeights: a decoding step under PackParameters
// gives the logits of the one without to the bit, in F32 and under BF16
// autocast with the weights cast once; the packings take exactly the
// pool bytes their sizes say and give them back at release; and the
// products read them (a weight changed inside the region is not seen,
// and is after).
func TestForwardPagedPackedWeights(t *testing.T) {
	dev := tensor.CPU()
	pp, ok := dev.Backend().(kernels.Prepacker)
	if !ok {
		t.Fatal("the CPU backend does not pack weights ahead")
	}
	g, err := NewGPT(dev, GPTConfig{Layers: 2, Heads: 2, Width: 64, Vocab: 97, Context: 40})
	if err != nil {
		t.Fatal(err)
	}
	defer Release(g)
	g.SetTraining(false)
	for _, amp := range []tensor.DType{0, tensor.BF16} {
		dt := tensor.F32
		if amp != 0 {
			dt = amp
		}
		kv, err := g.NewPagedKV(dev, dt, 24, 8)
		if err != nil {
			t.Fatal(err)
		}
		batch := decodeStep(dev, rand.New(rand.NewPCG(3, 3)), 97, 6, 11, 8, 4)
		logits := func() (out []float32) {
			dev.WithScope(func() { out = g.ForwardPaged(kv, batch()).Float32s() })
			return out
		}
		region := func(f func()) {
			if amp == 0 {
				f()
				return
			}
			ag.Autocast(dev, amp, func() {
				defer ag.CastParameters(dev, g.ProductParameters())()
				f()
			})
		}
		var plain, packed, stale, after []float32
		var held, want int64
		w := g.Blocks[1].FC.Weight
		saved := w.Float32s()
		region(func() { plain = logits() })
		region(func() {
			before := dev.Allocator().Stats().Allocated[0].Current
			release := ag.PackParameters(dev, g.ProductParameters())
			held = dev.Allocator().Stats().Allocated[0].Current - before
			for _, p := range g.ProductParameters() {
				if p.NDim() == 2 {
					want += memory.RoundSize(int64(4 * pp.PrepackLen(p.Dim(1), p.Dim(0))))
				}
			}
			packed = logits()
			w.Backend().Fill(w.Buf(), 0)
			stale = logits()
			release()
			if left := dev.Allocator().Stats().Allocated[0].Current - before; left != 0 {
				t.Errorf("autocast %v: %d bytes left after the packings' release", amp, left)
			}
		})
		region(func() { after = logits() }) // the weights cast again
		keep := tensor.FromFloat32(dev, saved, w.Shape()...)
		w.Backend().Copy(w.Buf(), keep.Buf())
		keep.Release()
		kv.Release()
		if held != want {
			t.Errorf("autocast %v: the packings hold %d bytes, their sizes say %d", amp, held, want)
		}
		for i := range plain {
			if math.Float32bits(packed[i]) != math.Float32bits(plain[i]) || math.Float32bits(stale[i]) != math.Float32bits(plain[i]) {
				t.Fatalf("autocast %v: logit %d is %v packed and %v after the weight changed, %v unpacked", amp, i, packed[i], stale[i], plain[i])
			}
		}
		if slices.Equal(after, plain) {
			t.Errorf("autocast %v: after release the changed weight is not seen", amp)
		}
	}
}

// BenchmarkForwardPagedDecode is one decoding step of a server on the CPU:
// gpt-mini's shape (2 layers of 128, context 64) over a vocabulary of 256
// (the bytes tokenizer), 16 sequences of 32 cached positions each running
// their next token through paged memory of 16-position blocks, with the
// weights packed ahead as the engine packs them.
func BenchmarkForwardPagedDecode(b *testing.B) {
	dev := tensor.CPU()
	g, err := NewGPT(dev, GPTConfig{Layers: 2, Heads: 2, Width: 128, Vocab: 256, Context: 64})
	if err != nil {
		b.Fatal(err)
	}
	defer Release(g)
	g.SetTraining(false)
	const seqs, width = 16, 4 // a table's blocks: the context's
	kv, err := g.NewPagedKV(dev, tensor.F32, seqs*width, 16)
	if err != nil {
		b.Fatal(err)
	}
	defer kv.Release()
	defer ag.PackParameters(dev, g.ProductParameters())()
	batch := decodeStep(dev, rand.New(rand.NewPCG(1, 2)), 256, seqs, 32, 16, width)
	run := func() { dev.WithScope(func() { g.ForwardPaged(kv, batch()).Release() }) }
	run()
	b.ResetTimer()
	for range b.N {
		run()
	}
	b.ReportMetric(float64(seqs*b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// TestForwardPagedReadsTheOutputCastOnce: under autocast with the weights
// cast once, a paged step's output projection reads WTE's copy: the step's
// peak stays below one more copy of it (the copies are keyed by the
// parameters' handles: a handle of WTE's own would miss its copy).
func TestForwardPagedReadsTheOutputCastOnce(t *testing.T) {
	dev := tensor.CPU()
	const vocab, width = 4000, 64
	g, err := NewGPT(dev, GPTConfig{Layers: 1, Heads: 2, Width: width, Vocab: vocab, Context: 32})
	if err != nil {
		t.Fatal(err)
	}
	defer Release(g)
	g.SetTraining(false)
	kv, err := g.NewPagedKV(dev, tensor.BF16, 8, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Release()
	batch := decodeStep(dev, rand.New(rand.NewPCG(5, 5)), vocab, 2, 3, 8, 4)
	copyBytes := int64(vocab * width * tensor.BF16.Size())
	ag.Autocast(dev, tensor.BF16, func() {
		defer ag.CastParameters(dev, g.ProductParameters())()
		dev.WithScope(func() { g.ForwardPaged(kv, batch()) }) // the first step's workspaces
		a := dev.Allocator()
		before := a.Stats().Allocated[0].Current
		a.WindowPeak()
		dev.WithScope(func() { g.ForwardPaged(kv, batch()) })
		if peak, _ := a.WindowPeak(); peak-before >= copyBytes {
			t.Errorf("a paged step's peak rose %d bytes over %d: WTE's %d-byte BF16 copy made again", peak-before, before, copyBytes)
		}
	})
}
