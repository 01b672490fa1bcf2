package nn

import (
	"fmt"
	"math"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// PagedKV is a GPT's key-value memory for serving many sequences at once:
// each layer's keys and values for Blocks blocks of BlockSize positions
// ([Blocks·BlockSize, Width] each), which sequences take block by block
// through their block tables (package serve's block manager decides which).
type PagedKV struct {
	K, V              []*T
	Blocks, BlockSize int
}

// KVBlockBytes is the bytes one block of blockSize positions takes in a
// PagedKV of g in dtype: every layer's keys and values.
func (g *GPT) KVBlockBytes(dtype tensor.DType, blockSize int) int64 {
	return int64(len(g.Blocks)) * 2 * int64(blockSize) * int64(g.Cfg.Width) * int64(dtype.Size())
}

// NewPagedKV allocates a PagedKV of blocks blocks of blockSize positions in
// dtype (the dtype the model's products run in: its keys and values are
// theirs) on dev, zeroed. Running out of memory is an error.
func (g *GPT) NewPagedKV(dev *tensor.Device, dtype tensor.DType, blocks, blockSize int) (kv *PagedKV, err error) {
	if blocks < 1 || blockSize < 1 || !dtype.Float() {
		panic(fmt.Sprintf("nn: a paged key-value memory of %d blocks of %d positions in %v", blocks, blockSize, dtype))
	}
	kv = &PagedKV{Blocks: blocks, BlockSize: blockSize}
	err = tensor.Catch(func() {
		for range g.Blocks {
			kv.K = append(kv.K, tensor.Zeros(dev, dtype, blocks*blockSize, g.Cfg.Width).Keep())
			kv.V = append(kv.V, tensor.Zeros(dev, dtype, blocks*blockSize, g.Cfg.Width).Keep())
		}
	})
	if err != nil {
		kv.Release()
		return nil, fmt.Errorf("the key-value memory of %d blocks: %w", blocks, err)
	}
	return kv, nil
}

// Release frees the memory.
func (kv *PagedKV) Release() {
	for _, t := range append(kv.K, kv.V...) {
		t.Release()
	}
	kv.K, kv.V = nil, nil
}

// DType is the keys' and values' dtype.
func (kv *PagedKV) DType() tensor.DType { return kv.K[0].DType() }

// PagedBatch is one step of a server's work over a PagedKV, as I32 device
// tensors a captured step can read anew at every replay: Rows new tokens
// (Tokens), each at its position (Positions) in its sequence (RowSeq, a
// row of Tables: Seqs block tables of MaxBlocks blocks each), its key and
// value written at its slot (Slots: block·BlockSize + offset, negative to
// write nothing: a padding row); Last names, for each sequence, the row
// whose logits it needs. MaxLen bounds every row's position + 1.
type PagedBatch struct {
	Tokens, Positions, Slots, RowSeq *T
	Tables, Last                     *T
	MaxLen                           int
}

// ForwardPaged runs the batch's tokens through g under no gradient: each
// layer writes their keys and values into kv at their slots and attends
// through the block tables, so a sequence's rows see its cached positions
// and one another causally; it returns the logits of each sequence's last
// row, Seqs×Vocab (kernels.TransformerOps.PagedAttention). A step of
// decoding has a row a sequence; a prefill, a sequence's prompt (or a
// chunk of it) after its cached prefix. Under autocast the products run in
// its dtype, which must be kv's.
func (g *GPT) ForwardPaged(kv *PagedKV, b PagedBatch) *T {
	dev := ag.ModeOf(b.Tokens)
	rows, seqs, C := b.Tokens.Dim(0), b.Tables.Dim(0), g.Cfg.Width
	if len(kv.K) != len(g.Blocks) || b.Positions.Dim(0) != rows || b.Slots.Dim(0) != rows || b.RowSeq.Dim(0) != rows ||
		b.Last.Dim(0) != seqs || b.MaxLen < 1 || b.MaxLen > g.Cfg.Context {
		panic(fmt.Sprintf("nn: a paged batch of %d rows, %v positions, %v slots, %v sequences, %v tables, %v last rows, MaxLen %d for a GPT of %d layers, context %d, over %d layers' memory",
			rows, b.Positions.Shape(), b.Slots.Shape(), b.RowSeq.Shape(), b.Tables.Shape(), b.Last.Shape(), b.MaxLen, len(g.Blocks), g.Cfg.Context, len(kv.K)))
	}
	H := g.Cfg.Heads
	p := kernels.PagedParams{Rows: rows, H: H, D: C / H, QRow: 3 * C, Blocks: kv.Blocks, BlockSize: kv.BlockSize,
		Seqs: seqs, MaxBlocks: b.Tables.Dim(1), MaxLen: b.MaxLen, Scale: float32(1 / math.Sqrt(float64(C/H)))}
	be := dev.Backend()
	var logits *T
	ag.NoGrad(dev, func() {
		tok := ag.Embedding(g.WTE.On(dev), b.Tokens)
		pe := ag.Embedding(g.WPE.On(dev), b.Positions)
		h := ag.Add(tok, pe)
		tok.Release()
		pe.Release()
		for i, blk := range g.Blocks {
			qkv := blk.Attn.Forward(then(h.Retain(), blk.LN1.ForProduct))
			if qkv.DType() != kv.DType() {
				panic(fmt.Sprintf("nn: paged keys and values of %v into a %v memory: run the model in its dtype", qkv.DType(), kv.DType()))
			}
			q := qkv.Buf()
			be.WritePaged(p, q.Slice(C, q.N-C), q.Slice(2*C, q.N-2*C), kv.K[i].Buf(), kv.V[i].Buf(), b.Slots.Buf())
			a := tensor.Empty(dev, qkv.DType(), rows, C)
			be.PagedAttention(p, q, kv.K[i].Buf(), kv.V[i].Buf(), b.Tables.Buf(), b.RowSeq.Buf(), b.Positions.Buf(), a.Buf())
			qkv.Release()
			h = then(h, func(h *T) *T { return blk.addProjected(h, a) })
			a.Release()
			h = then(h, func(h *T) *T {
				n := blk.LN2.ForProduct(h)
				defer n.Release()
				return blk.addFeedForward(h, n)
			})
		}
		last := ag.Embedding(h, b.Last) // each sequence's last row
		h.Release()
		last = then(last, g.LNF.ForProduct)
		logits = ag.Linear(last, g.WTE, nil) // WTE's own handle, which finds its copy cast once (or packed)
		last.Release()
	})
	return logits
}
