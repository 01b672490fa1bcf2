package train

import (
	"fmt"
	"slices"
	"sync"

	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
)

// Publisher hands the weights of a model in training to readers on other
// goroutines: a service answering requests while the model trains. Serving
// the trained model itself would read weights while the optimiser writes
// them (a data race, and answers from half-updated weights); instead the
// trainer publishes snapshots between steps (Publish, or Trainer.Publisher),
// each a copy of the model's whole state (weights and buffers, such as
// batch norm's running statistics) into a replica no reader holds, and a
// reader takes the latest with Acquire and gives it back with its release
// function. A reader never sees a half-written snapshot, the trainer never
// waits for a reader, and there are never more replicas than the snapshots
// readers hold plus two.
//
// On a GPU the copies are queued on the device's stream like the reader's
// operations, which come from sessions of the same device, so a replica is
// written only after the work of its last reader.
type Publisher struct {
	build func() nn.Model
	mu    sync.Mutex
	cur   *replica   // the latest snapshot (nil before the first)
	spare []*replica // replicas no reader holds, to write the next into
	all   []*replica
	n     int // snapshots published
}

type replica struct {
	m       nn.Model
	state   []nn.Named
	readers int
	version int
}

// NewPublisher returns a publisher whose replicas build makes: the same
// architecture as the trained model, on the same device, in evaluation
// mode (the publisher sets it).
func NewPublisher(build func() nn.Model) *Publisher { return &Publisher{build: build} }

// Publish copies m's state into a replica and makes it the latest
// snapshot. Call it between steps, from the training goroutine. It returns
// the snapshot's version (1 for the first).
func (p *Publisher) Publish(m nn.Module) (version int, err error) {
	p.mu.Lock()
	var r *replica
	if n := len(p.spare); n > 0 {
		r, p.spare = p.spare[n-1], p.spare[:n-1]
	}
	p.mu.Unlock()
	if r == nil {
		err := tensor.Catch(func() { r = p.newReplica() })
		if err != nil {
			return 0, fmt.Errorf("publishing the weights: a replica: %w", err)
		}
	}
	src := m.State("")
	if len(src) != len(r.state) {
		panic(fmt.Sprintf("train: publishing a model of %d state tensors into replicas of %d", len(src), len(r.state)))
	}
	for i, s := range src {
		d := r.state[i]
		if s.Name != d.Name || s.T.DType() != d.T.DType() || !slices.Equal(s.T.Shape(), d.T.Shape()) {
			panic(fmt.Sprintf("train: publishing %s %v %v into the replica's %s %v %v", s.Name, s.T.DType(), s.T.Shape(), d.Name, d.T.DType(), d.T.Shape()))
		}
		d.T.Backend().Copy(d.T.Buf(), s.T.Buf())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	r.version = p.n
	if old := p.cur; old != nil && old.readers == 0 {
		p.spare = append(p.spare, old)
	}
	p.cur = r
	return r.version, nil
}

func (p *Publisher) newReplica() *replica {
	m := p.build()
	m.SetTraining(false)
	r := &replica{m: m, state: m.State("")}
	p.mu.Lock()
	p.all = append(p.all, r)
	p.mu.Unlock()
	return r
}

// Acquire returns the latest snapshot's model and version, and the
// function that gives it back; the model stays as it is until then. Run it
// under ag.NoGrad on a session of the device (Device.Session). ok is false
// before the first Publish.
func (p *Publisher) Acquire() (m nn.Model, version int, release func(), ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.cur
	if r == nil {
		return nil, 0, nil, false
	}
	r.readers++
	var once sync.Once
	return r.m, r.version, func() { once.Do(func() { p.giveBack(r) }) }, true
}

func (p *Publisher) giveBack(r *replica) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r.readers--
	if r.readers == 0 && r != p.cur {
		p.spare = append(p.spare, r)
	}
}

// Replicas is how many replicas the publisher has made.
func (p *Publisher) Replicas() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.all)
}

// Close frees the replicas. Every snapshot acquired must have been given
// back.
func (p *Publisher) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.all {
		if r.readers > 0 {
			panic(fmt.Sprintf("train: Publisher.Close with %d readers of snapshot %d", r.readers, r.version))
		}
		nn.Release(r.m)
	}
	p.all, p.spare, p.cur = nil, nil, nil
}
