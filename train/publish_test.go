package train

import (
	"crypto/sha256"
	"slices"
	"sync"
	"testing"
	"time"

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

// TestGeneratingWhileTraining: a GPT trains, publishing its weights every
// two steps, while two goroutines generate from the latest snapshot on
// their sessions: every generation is the snapshot's greedy continuation
// (the same tokens as generating again from that snapshot alone), and the
// pool holds no generation's cache afterwards. Run with -race (CI does).
func TestGeneratingWhileTraining(t *testing.T) {
	dev := tensor.NewDevice(cpu.New())
	build := func() nn.Model {
		m, err := BuildModel(dev, "gpt-mini", []int{32}, 64, 1)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := build()
	defer nn.Release(m)
	cfg := Config{Model: "gpt-mini", Epochs: 2, Batch: 4, LR: 3e-3, Optimizer: "adamw", Schedule: "constant", Seed: 1}
	tr, err := New(m, dev, cfg, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Release()
	pub := NewPublisher(build)
	defer pub.Close()
	tr.Publisher, tr.PublishEvery = pub, 2
	tokens := make([]int32, 4000)
	for i := range tokens {
		tokens[i] = int32((i*7 + i/13) % 64)
	}
	l := datasets.NewTextLoader(tokens, dev, datasets.TextConfig{Batch: 4, Context: 32, Steps: 10, Seed: 1})
	v := datasets.NewTextLoader(tokens[:400], dev, datasets.TextConfig{Batch: 4, Context: 32})
	prompt := []int32{1, 2, 3, 4}
	type gen struct {
		version int
		out     []int32
	}
	done := make(chan struct{})
	results := make(chan []gen, 2)
	for range 2 {
		go func() {
			s := dev.Session()
			var gens []gen
			for len(gens) < 6 {
				select {
				case <-done:
					results <- gens
					return
				default:
				}
				model, ver, release, ok := pub.Acquire()
				if !ok {
					time.Sleep(time.Millisecond) // nothing published yet
					continue
				}
				out, err := model.(*nn.GPT).Generate(s, prompt, 8, nn.Sampling{})
				release()
				if err != nil {
					t.Error(err)
				}
				gens = append(gens, gen{ver, out})
			}
			results <- gens
		}()
	}
	err = tr.Fit(l, v, nil, "")
	close(done) // a generator still waiting for its first snapshot stops
	all := append(<-results, <-results...)
	if err != nil {
		t.Fatal(err)
	}
	// Generations of one snapshot agree with each other.
	byVersion := map[int][]int32{}
	for _, g := range all {
		if want, ok := byVersion[g.version]; ok && !slices.Equal(want, g.out) {
			t.Errorf("two generations from snapshot %d differ: %v and %v", g.version, want, g.out)
		}
		byVersion[g.version] = g.out
	}
	// The latest snapshot's generation is the trained model's.
	last, ver, release, _ := pub.Acquire()
	got, _ := last.(*nn.GPT).Generate(dev.Session(), prompt, 8, nn.Sampling{})
	release()
	want, _ := m.(*nn.GPT).Generate(dev, prompt, 8, nn.Sampling{})
	if !slices.Equal(got, want) {
		t.Errorf("the last snapshot (%d) generates %v, the trained model %v", ver, got, want)
	}
	if len(all) == 0 {
		t.Error("no generation ran beside the training")
	}
	t.Logf("%d generations from %d snapshots beside %d steps", len(all), len(byVersion), tr.Steps)
}
