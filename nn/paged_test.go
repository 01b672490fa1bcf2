package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	ag "github.com/leangrad/leangrad/autograd"
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
