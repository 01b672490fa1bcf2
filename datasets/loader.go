package datasets

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"unsafe"

	"github.com/leangrad/leangrad/tensor"
)

// LoaderConfig configures a Loader.
type LoaderConfig struct {
	Batch    int
	Shuffle  bool   // a new seeded permutation every epoch
	Seed     uint64 // seeds shuffling and augmentation
	DropLast bool   // drop a last, smaller batch
	CropPad  int    // random crops of the image padded with this many zero pixels (0: none)
	Flip     bool   // random horizontal flips
	Mean     []float32
	Std      []float32 // per-channel normalisation; nil: the dataset's own statistics
	Prefetch int       // batches prepared ahead on a goroutine (default 2)
	// Rank and Ranks shard every epoch across a data-parallel job's
	// processes (Ranks 0 or 1: no sharding). Every rank draws the same
	// permutation (the same Seed) and takes examples Rank, Rank+Ranks, ...
	// of it, so the ranks' shares are disjoint, as with PyTorch's
	// DistributedSampler. With EvenShards (training) the last N mod Ranks
	// examples of the permutation are left out, so that every rank runs the
	// same number of steps (DistributedSampler's drop_last); without it
	// (evaluation) the shares differ by at most one and together cover all.
	Rank, Ranks int
	EvenShards  bool
}

// Loader turns a Dataset into batches of device tensors: images as F32
// N×C×H×W normalised per channel, labels as I32. Batches are prepared on a
// goroutine (shuffle, augment, normalise) and uploaded on the caller's
// goroutine when asked for (through the device's pinned staging buffers on a
// GPU), so the tensors belong to the caller's scope.
//
// Shuffling and augmentation are drawn from (Seed, rank, epoch, batch), so an
// epoch's batches are the same whatever the goroutines' timing and a resumed
// run sees the batches it would have seen.
type Loader struct {
	ds   *Dataset
	dev  *tensor.Device
	cfg  LoaderConfig
	mean []float32
	std  []float32
}

// NewLoader returns a loader of ds onto dev.
func NewLoader(ds *Dataset, dev *tensor.Device, cfg LoaderConfig) *Loader {
	if cfg.Batch <= 0 {
		panic(fmt.Sprintf("datasets: batch size %d", cfg.Batch))
	}
	if cfg.Prefetch <= 0 {
		cfg.Prefetch = 2
	}
	if cfg.Ranks < 0 || (cfg.Ranks > 0 && (cfg.Rank < 0 || cfg.Rank >= cfg.Ranks)) {
		panic(fmt.Sprintf("datasets: rank %d of %d", cfg.Rank, cfg.Ranks))
	}
	l := &Loader{ds: ds, dev: dev, cfg: cfg, mean: cfg.Mean, std: cfg.Std}
	if l.mean == nil || l.std == nil {
		l.mean, l.std = ds.MeanStd()
	}
	return l
}

// Batches is a source of batches, what training and evaluation read: a
// Loader of images, a TextLoader of token windows.
type Batches interface {
	// Len is the number of batches in an epoch (of this rank's share).
	Len() int
	// Inputs are a full batch's x dtype and shape (F32 Batch×C×H×W images,
	// I32 Batch×T tokens) and its I32 targets' shape.
	Inputs() (xdt tensor.DType, x, y []int)
	// Epoch starts pass number e over the data (e seeds its order).
	Epoch(e int) Iterator
	// EpochFrom is Epoch from its batch number from on: the batches are
	// those Epoch(e) gives from there, so that a run stopped inside an
	// epoch resumes as though it had not stopped.
	EpochFrom(e, from int) Iterator
}

// Iterator is one pass over a Batches.
type Iterator interface {
	// Next returns the next batch as device tensors in the current scope,
	// or ok = false at the end of the pass.
	Next() (x, y *tensor.Tensor, ok bool)
	// NextInto is Next writing a full batch into x and y (of Inputs'
	// dtypes and shapes) instead of into new tensors, and returning them:
	// how a captured training step's static inputs are filled. A smaller
	// last batch comes in new tensors in the current scope, as from Next.
	NextInto(x, y *tensor.Tensor) (bx, by *tensor.Tensor, ok bool)
	// Close stops the pass (needed only when it ends early).
	Close()
}

var _ Batches = (*Loader)(nil)

// BatchShape is the shape of a full batch of images: Batch×C×H×W.
func (l *Loader) BatchShape() []int { return []int{l.cfg.Batch, l.ds.C, l.ds.H, l.ds.W} }

// Inputs are F32 Batch×C×H×W images and I32 Batch labels.
func (l *Loader) Inputs() (tensor.DType, []int, []int) {
	return tensor.F32, l.BatchShape(), []int{l.cfg.Batch}
}

// Len is the number of batches in an epoch (of this rank's share).
func (l *Loader) Len() int {
	n := l.Examples()
	if l.cfg.DropLast {
		return n / l.cfg.Batch
	}
	return (n + l.cfg.Batch - 1) / l.cfg.Batch
}

// Examples is the number of examples in an epoch of this rank's share.
func (l *Loader) Examples() int {
	n, r := l.ds.N, max(l.cfg.Ranks, 1)
	if l.cfg.EvenShards {
		return n / r
	}
	return (n - l.cfg.Rank + r - 1) / r
}

// share is this rank's part of an epoch's order (see LoaderConfig.Rank).
func (l *Loader) share(order []int) []int {
	r := max(l.cfg.Ranks, 1)
	if r == 1 {
		return order
	}
	if l.cfg.EvenShards {
		order = order[:len(order)/r*r]
	}
	mine := make([]int, 0, len(order)/r+1)
	for i := l.cfg.Rank; i < len(order); i += r {
		mine = append(mine, order[i])
	}
	return mine
}

type hostBatch struct {
	x []float32
	y []int32
	n int
}

// Epoch is one pass over the data.
type Epoch struct {
	out  chan *hostBatch
	free chan *hostBatch
	stop chan struct{}
	wg   sync.WaitGroup
	l    *Loader
	once sync.Once
}

// Epoch starts pass number e (which seeds its shuffle) over the data.
func (l *Loader) Epoch(e int) Iterator { return l.epoch(e, 0) }

// EpochFrom is Epoch from batch from on.
func (l *Loader) EpochFrom(e, from int) Iterator { return l.epoch(e, from) }

func (l *Loader) epoch(e, from int) *Epoch {
	ep := &Epoch{out: make(chan *hostBatch, l.cfg.Prefetch), free: make(chan *hostBatch, l.cfg.Prefetch+2),
		stop: make(chan struct{}), l: l}
	per := l.ds.C * l.ds.H * l.ds.W
	for i := 0; i < l.cfg.Prefetch+2; i++ {
		ep.free <- &hostBatch{x: make([]float32, l.cfg.Batch*per), y: make([]int32, l.cfg.Batch)}
	}
	order := make([]int, l.ds.N)
	for i := range order {
		order[i] = i
	}
	if l.cfg.Shuffle {
		rand.New(rand.NewPCG(l.cfg.Seed, uint64(e))).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	}
	order = l.share(order)
	ep.wg.Add(1)
	go func() {
		defer ep.wg.Done()
		defer close(ep.out)
		for b := from; b < l.Len(); b++ {
			var hb *hostBatch
			select {
			case hb = <-ep.free:
			case <-ep.stop:
				return
			}
			lo := b * l.cfg.Batch
			hi := min(lo+l.cfg.Batch, len(order))
			rng := rand.New(rand.NewPCG(l.cfg.Seed^0xA55A^uint64(l.cfg.Rank)<<48, uint64(e)<<32|uint64(b)))
			for i, idx := range order[lo:hi] {
				l.fill(hb.x[i*per:(i+1)*per], idx, rng)
				hb.y[i] = l.ds.Labels[idx]
			}
			hb.n = hi - lo
			select {
			case ep.out <- hb:
			case <-ep.stop:
				return
			}
		}
	}()
	return ep
}

// fill writes example idx, augmented and normalised, into dst.
func (l *Loader) fill(dst []float32, idx int, rng *rand.Rand) {
	d := l.ds
	plane := d.H * d.W
	src := d.Images[idx*d.C*plane : (idx+1)*d.C*plane]
	dy, dx, flip := 0, 0, false
	if p := l.cfg.CropPad; p > 0 {
		dy, dx = rng.IntN(2*p+1)-p, rng.IntN(2*p+1)-p
	}
	if l.cfg.Flip {
		flip = rng.IntN(2) == 1
	}
	for c := 0; c < d.C; c++ {
		m, inv := l.mean[c], 1/l.std[c]
		zero := -m * inv // a padded pixel
		for y := 0; y < d.H; y++ {
			sy := y + dy
			row := dst[c*plane+y*d.W : c*plane+(y+1)*d.W]
			if sy < 0 || sy >= d.H {
				for x := range row {
					row[x] = zero
				}
				continue
			}
			srow := src[c*plane+sy*d.W : c*plane+(sy+1)*d.W]
			for x := range row {
				sx := x + dx
				if flip {
					sx = d.W - 1 - x + dx
				}
				if sx < 0 || sx >= d.W {
					row[x] = zero
				} else {
					row[x] = (float32(srow[sx])/255 - m) * inv
				}
			}
		}
	}
}

// Next returns the next batch as device tensors in the current scope, or
// ok = false at the end of the epoch.
func (e *Epoch) Next() (x, y *tensor.Tensor, ok bool) {
	hb, ok := <-e.out
	if !ok {
		return nil, nil, false
	}
	d := e.l.ds
	per := d.C * d.H * d.W
	x = tensor.FromFloat32(e.l.dev, hb.x[:hb.n*per], hb.n, d.C, d.H, d.W)
	y = tensor.FromInt32(e.l.dev, hb.y[:hb.n], hb.n)
	e.free <- hb
	return x, y, true
}

// NextInto is Next writing a full batch into x (F32 N×C×H×W) and y (I32 N)
// instead of into new tensors, and returning them: how a captured training
// step's static inputs are filled (the copies are queued through the
// device's pinned staging buffers, two of them in turn, so the host does not
// wait for the step that reads the previous batch). A smaller last batch
// comes in new tensors in the current scope, as from Next.
func (e *Epoch) NextInto(x, y *tensor.Tensor) (bx, by *tensor.Tensor, ok bool) {
	hb, ok := <-e.out
	if !ok {
		return nil, nil, false
	}
	defer func() { e.free <- hb }()
	d := e.l.ds
	per := d.C * d.H * d.W
	full := []int{e.l.cfg.Batch, d.C, d.H, d.W}
	if !slices.Equal(x.Shape(), full) || x.DType() != tensor.F32 || !slices.Equal(y.Shape(), full[:1]) || y.DType() != tensor.I32 {
		panic(fmt.Sprintf("datasets: NextInto f32 %v and i32 %v tensors; the loader's batches are f32 %v and i32 %v",
			x.Shape(), y.Shape(), full, full[:1]))
	}
	if hb.n == e.l.cfg.Batch {
		x.Backend().Write(x.Buf(), f32bytes(hb.x[:hb.n*per]))
		y.Backend().Write(y.Buf(), i32bytes(hb.y[:hb.n]))
		return x, y, true
	}
	return tensor.FromFloat32(e.l.dev, hb.x[:hb.n*per], hb.n, d.C, d.H, d.W), tensor.FromInt32(e.l.dev, hb.y[:hb.n], hb.n), true
}

func f32bytes(v []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
}
func i32bytes(v []int32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
}

// Close stops the epoch's goroutine (needed only when it ends early).
func (e *Epoch) Close() {
	e.once.Do(func() { close(e.stop) })
	for range e.out {
	}
	e.wg.Wait()
}
