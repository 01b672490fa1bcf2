package dist

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// Group is this process's membership of a job: its rank, the collectives
// over the job's devices and the rendezvous that watches the other ranks.
// Its methods are called by one goroutine (the training loop's), except
// Abort and Err.
type Group struct {
	cfg  Config
	dev  *tensor.Device
	rv   *rendezvous
	coll kernels.Collective
	name string // "nccl 2.28.3" or "tcp"

	mu        sync.Mutex // guards coll's assignment, failure and onFailure
	failure   error
	onFailure []func(error)
}

// Join meets the job's other processes at cfg.Addr and makes the group's
// collectives on dev: NCCL when dev's backend has it (kernels.CollectiveBackend),
// the rendezvous's own TCP connections otherwise (the CPU). It returns when
// every rank has joined, or an error naming who did not within cfg.Timeout.
func Join(dev *tensor.Device, cfg Config) (*Group, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	g := &Group{cfg: cfg, dev: dev}
	rv, err := join(cfg, g.failed)
	if err != nil {
		return nil, err
	}
	g.rv = rv
	var coll kernels.Collective = &tcpCollective{g: g}
	name := "tcp"
	if cb, ok := dev.Backend().(kernels.CollectiveBackend); ok && cfg.Size > 1 {
		if coll, name, err = g.joinNCCL(cb); err != nil {
			rv.failed(fmt.Errorf("rank %d: %v", cfg.Rank, err))
			rv.close()
			return nil, err
		}
	}
	g.mu.Lock()
	g.coll, g.name = coll, name
	failed := g.failure != nil
	g.mu.Unlock()
	if failed { // a rank died while this one joined NCCL
		coll.Abort()
	}
	return g, nil
}

// joinNCCL has rank 0 make the NCCL id and send it over the rendezvous;
// every rank then joins the NCCL group with it.
func (g *Group) joinNCCL(cb kernels.CollectiveBackend) (kernels.Collective, string, error) {
	var id []byte
	if g.cfg.Rank == 0 {
		var err error
		if id, err = cb.CollectiveID(); err != nil {
			g.rv.bcast("NCCL id", nil) // the others hear that there is none
			return nil, "", err
		}
	}
	id, err := g.rv.bcast("NCCL id", id)
	if err != nil {
		return nil, "", err
	}
	if len(id) == 0 {
		return nil, "", errors.New("rank 0 could not make an NCCL group (see its error)")
	}
	coll, err := cb.NewCollective(id, g.cfg.Rank, g.cfg.Size)
	if err != nil {
		return nil, "", err
	}
	name := "nccl"
	if v, ok := g.dev.Backend().(interface{ Info() kernels.Info }); ok {
		if nv := v.Info().Libraries["nccl"]; nv != "" {
			name += " " + nv
		}
	}
	return coll, name, nil
}

// Rank is this process's rank.
func (g *Group) Rank() int { return g.cfg.Rank }

// Size is the number of processes in the job.
func (g *Group) Size() int { return g.cfg.Size }

// Config is the configuration the group was joined with.
func (g *Group) Config() Config { return g.cfg }

// Backend names what carries the collectives: "nccl" (with its version) or "tcp".
func (g *Group) Backend() string { return g.name }

// Device is the device the group's collectives run on.
func (g *Group) Device() *tensor.Device { return g.dev }

// OnFailure adds f to what runs when another rank dies or the group fails
// otherwise, once, on the rendezvous's goroutine; the group has already
// aborted its collectives then. When the group has failed already, f runs
// at once.
func (g *Group) OnFailure(f func(error)) {
	g.mu.Lock()
	err := g.failure
	if err == nil {
		g.onFailure = append(g.onFailure, f)
	}
	g.mu.Unlock()
	if err != nil {
		f(err)
	}
}

func (g *Group) failed(err error) {
	g.mu.Lock()
	g.failure = err
	coll, fs := g.coll, slices.Clone(g.onFailure)
	g.mu.Unlock()
	if coll != nil {
		coll.Abort()
	}
	for _, f := range fs {
		f(err)
	}
}

// Err is the group's failure (a rank died, a collective timed out), or nil.
func (g *Group) Err() error { return g.rv.Err() }

// Abort fails the group with err on every rank.
func (g *Group) Abort(err error) { g.rv.failed(err) }

// AllReduce replaces each tensor by its sum over the ranks, or by the
// mean with mean set, queued on the device (see kernels.Collective).
func (g *Group) AllReduce(ts []*tensor.Tensor, mean bool) error {
	return g.collective(ts, func(b []kernels.Buf) error { return g.coll.AllReduce(b, mean) })
}

// StartAllReduce is AllReduce overlapped with the device work queued after
// it, until Join (kernels.Collective.StartAllReduce): the tensors must not
// be used in between.
func (g *Group) StartAllReduce(ts []*tensor.Tensor, mean bool) error {
	return g.collective(ts, func(b []kernels.Buf) error { return g.coll.StartAllReduce(b, mean) })
}

// StartReduceScatter replaces the rank-th of the size equal parts of each
// tensor by that part's sum (or mean) over the ranks, overlapped as
// StartAllReduce until Join; the other parts are left unspecified
// (kernels.Collective.StartReduceScatter). Each tensor's length must be a
// multiple of the group's size.
func (g *Group) StartReduceScatter(ts []*tensor.Tensor, mean bool) error {
	return g.collective(ts, func(b []kernels.Buf) error { return g.coll.StartReduceScatter(b, mean) })
}

// AllGather copies each rank's part of each tensor (the rank-th of its
// size equal parts) into every other rank's, queued on the device.
func (g *Group) AllGather(ts []*tensor.Tensor) error {
	return g.collective(ts, func(b []kernels.Buf) error { return g.coll.AllGather(b) })
}

// Join makes the device work queued from now on wait for the all-reduces
// started so far. It is safe to call with nothing started, and after a
// failure (it then only returns the failure).
func (g *Group) Join() error {
	if g.cfg.Size == 1 {
		return nil
	}
	if err := g.coll.Join(); err != nil {
		return g.cause(err)
	}
	return g.Err()
}

// cause is err, or, when the group failed meanwhile (an abort makes NCCL
// return an internal error), the failure that explains it.
func (g *Group) cause(err error) error {
	if err == nil {
		return nil
	}
	if f := g.Err(); f != nil && !errors.Is(err, f) {
		return fmt.Errorf("%w (and so: %v)", f, err)
	}
	return err
}

// Broadcast copies root's tensors into every rank's.
func (g *Group) Broadcast(ts []*tensor.Tensor, root int) error {
	return g.collective(ts, func(b []kernels.Buf) error { return g.coll.Broadcast(b, root) })
}

// collective runs op on ts's buffers, unless the group has failed (its
// failure is the error) or there is nothing to do (one rank, no tensors).
func (g *Group) collective(ts []*tensor.Tensor, op func([]kernels.Buf) error) error {
	return g.collectiveOn(bufs(ts), op)
}

func (g *Group) collectiveOn(bs []kernels.Buf, op func([]kernels.Buf) error) error {
	if err := g.Err(); err != nil {
		return err
	}
	if g.cfg.Size == 1 || len(bs) == 0 {
		return nil
	}
	return g.cause(op(bs))
}

// allReduce is AllReduce of buffers.
func (g *Group) allReduce(bs []kernels.Buf, mean bool) error {
	return g.collectiveOn(bs, func(b []kernels.Buf) error { return g.coll.AllReduce(b, mean) })
}

func bufs(ts []*tensor.Tensor) []kernels.Buf {
	b := make([]kernels.Buf, len(ts))
	for i, t := range ts {
		b[i] = t.Buf()
	}
	return b
}

// Barrier returns when every rank has called it, after this rank's queued
// device work is done.
func (g *Group) Barrier() error {
	if err := g.dev.Synchronize(); err != nil {
		return err
	}
	if g.cfg.Size == 1 {
		return nil
	}
	if _, err := g.rv.gather("barrier", nil); err != nil {
		return err
	}
	_, err := g.rv.bcast("barrier", nil)
	return err
}

// Gather returns every rank's values, in rank order, on every rank (host
// figures for reports: memory peaks, times).
func (g *Group) Gather(values []float64) ([][]float64, error) {
	data := make([]byte, 8*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint64(data[8*i:], math.Float64bits(v))
	}
	if g.cfg.Size == 1 {
		return [][]float64{values}, nil
	}
	all, err := g.rv.gather("gather", data)
	if err != nil {
		return nil, err
	}
	var joined []byte
	for _, d := range all {
		if len(d) != len(data) && g.cfg.Rank == 0 {
			return nil, fmt.Errorf("gather: ranks sent %d and %d values", len(data)/8, len(d)/8)
		}
		joined = append(joined, d...)
	}
	joined, err = g.rv.bcast("gather", joined)
	if err != nil {
		return nil, err
	}
	out := make([][]float64, g.cfg.Size)
	for r := range out {
		out[r] = make([]float64, len(values))
		for i := range values {
			out[r][i] = math.Float64frombits(binary.LittleEndian.Uint64(joined[8*(r*len(values)+i):]))
		}
	}
	return out, nil
}

// Close waits for every rank (a barrier), then frees the collectives and
// closes the rendezvous. After a failure it only frees and closes.
func (g *Group) Close() error {
	var err error
	if g.Err() == nil {
		err = g.Barrier()
	}
	if g.coll != nil {
		if cerr := g.coll.Close(); err == nil && g.Err() == nil {
			err = cerr
		}
	}
	g.rv.close()
	return err
}

// TimeAllReduce measures the mean time of an all-reduce (mean) of bytes of
// F32 over the group, after a warm-up, with the device synchronised around
// each: what a step's gradient reduction costs when nothing overlaps it.
func (g *Group) TimeAllReduce(bytes int64, reps int) (time.Duration, error) {
	if g.cfg.Size == 1 {
		return 0, nil
	}
	t := tensor.Zeros(g.dev, tensor.F32, int(max(1, bytes/4))).Keep()
	defer t.Release()
	ts := []*tensor.Tensor{t}
	if err := g.AllReduce(ts, true); err != nil {
		return 0, err
	}
	if err := g.Barrier(); err != nil {
		return 0, err
	}
	start := time.Now()
	for i := 0; i < reps; i++ {
		if err := g.AllReduce(ts, true); err != nil {
			return 0, err
		}
	}
	if err := g.dev.Synchronize(); err != nil {
		return 0, err
	}
	return time.Since(start) / time.Duration(max(1, reps)), nil
}

// tcpCollective runs the collectives over the rendezvous: each rank's
// buffers go to rank 0, which reduces them in rank order (in float64, so
// the result does not depend on the order the ranks arrive in) and sends
// the result back. It serves the CPU, where it is the only choice, and
// tests; it reads the buffers from the device, so it cannot be captured.
type tcpCollective struct{ g *Group }

func (c *tcpCollective) AllReduce(bs []kernels.Buf, mean bool) error {
	for _, b := range bs {
		if b.DType != kernels.F32 && b.DType != kernels.I32 {
			return fmt.Errorf("dist: all-reduce of %v over tcp (F32 and I32 only)", b.DType)
		}
	}
	return c.exchange("all-reduce", bs, c.read(bs), func(all [][]byte) []byte { return reduce(bs, all, mean) })
}

// StartReduceScatter is an all-reduce of which each rank writes only its
// part: the others keep what they held, as NCCL's in-place reduce-scatter
// leaves them, so that a caller reading them is caught by tests.
func (c *tcpCollective) StartReduceScatter(bs []kernels.Buf, mean bool) error {
	if err := c.splits(bs); err != nil {
		return err
	}
	for _, b := range bs {
		if b.DType != kernels.F32 {
			return fmt.Errorf("dist: reduce-scatter of %v over tcp (F32 only)", b.DType)
		}
	}
	raw, err := c.combine("reduce-scatter", c.read(bs), func(all [][]byte) []byte { return reduce(bs, all, mean) })
	if err != nil {
		return err
	}
	var off int64
	for _, b := range bs {
		mine := c.part(b)
		skip := int64(c.g.cfg.Rank) * mine.Bytes()
		c.g.dev.Backend().Write(mine, raw[off+skip:off+skip+mine.Bytes()])
		off += b.Bytes()
	}
	return nil
}

// AllGather sends each buffer's part to rank 0, which lays the ranks'
// parts side by side.
func (c *tcpCollective) AllGather(bs []kernels.Buf) error {
	if err := c.splits(bs); err != nil {
		return err
	}
	parts := make([]kernels.Buf, len(bs))
	for i, b := range bs {
		parts[i] = c.part(b)
	}
	return c.exchange("all-gather", bs, c.read(parts), func(all [][]byte) []byte {
		var out []byte
		var off int64
		for _, p := range parts {
			for _, d := range all {
				out = append(out, d[off:off+p.Bytes()]...)
			}
			off += p.Bytes()
		}
		return out
	})
}

// splits checks that each buffer splits in as many equal parts as ranks.
func (c *tcpCollective) splits(bs []kernels.Buf) error {
	for _, b := range bs {
		if b.N%c.g.cfg.Size != 0 {
			return fmt.Errorf("dist: a buffer of %d elements does not split in %d equal parts", b.N, c.g.cfg.Size)
		}
	}
	return nil
}

// part is this rank's part of b.
func (c *tcpCollective) part(b kernels.Buf) kernels.Buf {
	n := b.N / c.g.cfg.Size
	b.Off += int64(c.g.cfg.Rank*n) * int64(b.DType.Size())
	b.N = n
	return b
}

// read is bs's bytes, one after the other.
func (c *tcpCollective) read(bs []kernels.Buf) []byte {
	var raw []byte
	for _, b := range bs {
		part := make([]byte, b.Bytes())
		c.g.dev.Backend().Read(part, b)
		raw = append(raw, part...)
	}
	return raw
}

// exchange sends this rank's payload to rank 0, which combines every
// rank's into the result, and writes the result into bs on every rank.
func (c *tcpCollective) exchange(what string, bs []kernels.Buf, mine []byte, combine func(all [][]byte) []byte) error {
	raw, err := c.combine(what, mine, combine)
	if err != nil {
		return err
	}
	var off int64
	for _, b := range bs {
		if int64(len(raw)) < off+b.Bytes() {
			return fmt.Errorf("dist: %s: %d bytes for buffers of more", what, len(raw))
		}
		c.g.dev.Backend().Write(b, raw[off:off+b.Bytes()])
		off += b.Bytes()
	}
	return nil
}

// combine sends this rank's payload to rank 0, which combines every rank's
// into the result every rank receives.
func (c *tcpCollective) combine(what string, mine []byte, combine func(all [][]byte) []byte) ([]byte, error) {
	all, err := c.g.rv.gather(what, mine)
	if err != nil {
		return nil, err
	}
	var raw []byte
	if c.g.cfg.Rank == 0 {
		raw = combine(all)
	}
	return c.g.rv.bcast(what, raw)
}

// reduce sums the ranks' payloads element by element (F32 in float64, I32
// exactly), dividing by the number of ranks with mean.
func reduce(bs []kernels.Buf, all [][]byte, mean bool) []byte {
	out := make([]byte, len(all[0]))
	n := float64(len(all))
	var off int
	for _, b := range bs {
		for i := 0; i < b.N; i++ {
			at := off + 4*i
			if b.DType == kernels.I32 {
				var s int64
				for _, d := range all {
					s += int64(int32(binary.LittleEndian.Uint32(d[at:])))
				}
				if mean {
					s /= int64(n)
				}
				binary.LittleEndian.PutUint32(out[at:], uint32(int32(s)))
				continue
			}
			var s float64
			for _, d := range all {
				s += float64(math.Float32frombits(binary.LittleEndian.Uint32(d[at:])))
			}
			if mean {
				s /= n
			}
			binary.LittleEndian.PutUint32(out[at:], math.Float32bits(float32(s)))
		}
		off += 4 * b.N
	}
	return out
}

func (c *tcpCollective) Broadcast(bs []kernels.Buf, root int) error {
	var mine []byte
	if c.g.cfg.Rank == root {
		mine = c.read(bs)
	}
	return c.exchange("broadcast", bs, mine, func(all [][]byte) []byte { return all[root] })
}

// StartAllReduce is AllReduce: the CPU backend runs one operation at a
// time, so there is nothing to overlap it with.
func (c *tcpCollective) StartAllReduce(bs []kernels.Buf, mean bool) error {
	return c.AllReduce(bs, mean)
}

func (c *tcpCollective) Join() error  { return nil }
func (c *tcpCollective) Abort()       {}
func (c *tcpCollective) Close() error { return nil }
