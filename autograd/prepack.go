package autograd

import (
	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// PackParameters packs the weights among params (2-D tensors that
// products read transposed, as Linear, MLP and a GPT's tied head read
// theirs: Out×In) ahead of their products, on a backend that can
// (kernels.Prepacker: the CPU's), and until release is called the
// unbatched products on dev that read one of them as B read its packing
// instead of packing it again. Under CastParameters it packs the copies
// the products read. Elsewhere it does nothing.
//
// The packings are copies in dev's pool (PrepackLen values each): the
// weights must not change until release, as a server's do not (its
// decoding steps, whose few rows make packing B cost about as much as
// the product, read every weight each step). A training step must not
// run inside.
func PackParameters(dev *tensor.Device, params []*T) (release func()) {
	pp, ok := dev.Backend().(kernels.Prepacker)
	if !ok {
		return func() {}
	}
	m := dev.Modes()
	if m.Packed != nil {
		panic("autograd: PackParameters inside another PackParameters' region on the same handle")
	}
	copies, _ := m.Copies.(map[*T]*T)
	packed := make(map[kernels.Buf]*T, len(params))
	release = func() {
		if m.Packed != nil {
			m.Packed = nil
			for _, y := range packed {
				y.Release()
			}
			packed = nil
		}
	}
	done := false
	defer func() {
		if !done {
			release()
		}
	}()
	m.Packed = packed
	for _, w := range params {
		if c := copies[w]; c != nil {
			w = c
		}
		if w.NDim() != 2 || !w.DType().Float() || packed[w.Buf()] != nil {
			continue
		}
		n, k := w.Dim(0), w.Dim(1)
		y := tensor.Empty(dev, tensor.F32, pp.PrepackLen(k, n))
		packed[w.Buf()] = y
		pp.Prepack(y.Buf(), w.Buf(), k, n, true)
	}
	done = true
	return release
}

// PackedBytes is the pool bytes PackParameters' packings hold on dev now
// (0 outside its region). Call it on the handle's goroutine.
func PackedBytes(dev *tensor.Device) int64 {
	packed, _ := dev.Modes().Packed.(map[kernels.Buf]*T)
	var n int64
	for _, y := range packed {
		n += y.Block().Size()
	}
	return n
}

// packedWeight is PackParameters' packing of b for a product that reads
// it as its B (transposed when transB), or nil.
func packedWeight(dev *tensor.Device, b *T, transB bool, batch int) *T {
	packed, _ := dev.Modes().Packed.(map[kernels.Buf]*T)
	if packed == nil || !transB || batch != 1 || b.NDim() != 2 {
		return nil
	}
	return packed[b.Buf()] // its shape is the product's: n×k
}
