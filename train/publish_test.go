package train

import (
	"crypto/sha256"
	"sync"
	"testing"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
)

// stateSum is a hash of a model's whole state, read on the handle d.
func stateSum(m nn.Module, d *tensor.Device) [32]byte {
	h := sha256.New()
	for _, n := range m.State("") {
		d.WithScope(func() { h.Write(n.T.On(d).Raw()) })
	}
	var s [32]byte
	h.Sum(s[:0])
	return s
}

// TestServingSnapshotsWhileTraining: a ResNet with batch norm trains,
// publishing its weights after every step, while three goroutines serve
// the latest snapshot on their sessions. Every snapshot a reader used is
// one the trainer published, whole (its state hashes to what the trainer's
// model held when it was published); the replicas stay few; and once the
// publisher is closed the pool holds what it held before. Run with -race
// (CI does): serving the trained model itself races with the optimiser.
func TestServingSnapshotsWhileTraining(t *testing.T) {
	dev := tensor.NewDevice(cpu.New())
	ds := datasets.SyntheticSize(256, 5, 12)
	build := func() nn.Model { return nn.NewResNet(dev, "tiny", 1, 10, []int{8, 16}, []int{1, 1}) }
	m := build()
	defer nn.Release(m)
	cfg := baseConfig("tiny")
	cfg.Epochs, cfg.Batch = 2, 16
	tr, err := New(m, dev, cfg, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Release()
	pub := NewPublisher(build)
	tr.Publisher, tr.PublishEvery = pub, 1
	published := map[int][32]byte{} // what the trainer's model held when each version was the latest
	var mu sync.Mutex
	type use struct {
		version int
		sum     [32]byte
	}
	var uses []use
	done := make(chan struct{})
	var wg sync.WaitGroup
	x := make([]float32, 4*144)
	for i := range x {
		x[i] = float32(i%13) / 13
	}
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := dev.Session()
			for {
				select {
				case <-done:
					return
				default:
				}
				model, v, release, ok := pub.Acquire()
				if !ok {
					continue
				}
				sum := stateSum(model, s)
				ag.NoGrad(s, func() {
					s.WithScope(func() { model.Forward(tensor.FromFloat32(s, x, 4, 1, 12, 12)).Float32s() })
				})
				if stateSum(model, s) != sum {
					t.Errorf("snapshot %d changed while a reader held it", v)
				}
				release()
				mu.Lock()
				uses = append(uses, use{v, sum})
				mu.Unlock()
			}
		}()
	}
	obs := &publishRecorder{tr: tr, pub: pub, sums: published}
	l := datasets.NewLoader(ds, dev, datasets.LoaderConfig{Batch: cfg.Batch, Shuffle: true, Seed: 2})
	err = tr.Fit(l, datasets.NewLoader(ds.Subset(32), dev, datasets.LoaderConfig{Batch: 32}), obs, "")
	close(done)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if len(uses) == 0 {
		t.Fatal("no reader got a snapshot")
	}
	checked := 0
	for _, u := range uses {
		if want, ok := published[u.version]; ok {
			checked++
			if want != u.sum {
				t.Errorf("a reader of snapshot %d saw other weights than were published", u.version)
			}
		}
	}
	if checked == 0 {
		t.Error("no read was of a snapshot whose weights were recorded")
	}
	if n := pub.Replicas(); n > 3+2 {
		t.Errorf("%d replicas for 3 readers", n)
	}
	t.Logf("%d snapshots published, %d reads (%d of recorded ones), %d replicas", tr.Steps+cfg.Epochs, len(uses), checked, pub.Replicas())
	allocated := func() int64 { return dev.Allocator().Stats().Allocated[memory.All].Current }
	a0 := allocated()
	probe := build() // what one replica takes from the pool
	replicaBytes := allocated() - a0
	nn.Release(probe)
	before, made := allocated(), pub.Replicas()
	pub.Close()
	if after := allocated(); after != before-int64(made)*replicaBytes {
		t.Errorf("allocated %d bytes after the publisher closed, %d before: want its %d replicas of %d bytes given back", after, before, made, replicaBytes)
	}
}

// publishRecorder records, at every progress update, the state the latest
// snapshot must hold.
type publishRecorder struct {
	tr   *Trainer
	pub  *Publisher
	sums map[int][32]byte
}

func (r *publishRecorder) EpochStart(epoch, steps int) {}
func (r *publishRecorder) EpochEnd(m EpochMetrics)     {}
func (r *publishRecorder) Step(s StepStats) {
	// Between steps (the observer runs on the training goroutine) the
	// latest snapshot is the model as it is now.
	_, v, release, ok := r.pub.Acquire()
	if ok {
		r.sums[v] = stateSum(r.tr.Model, r.tr.Dev)
		release()
	}
}
