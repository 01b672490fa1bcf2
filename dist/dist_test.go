package dist

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/internal/testdev"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
)

func TestConfigFromEnv(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		ok   bool
		want Config
		err  string
	}{
		{env: map[string]string{}, ok: false},
		{env: map[string]string{"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"},
			ok: true, want: Config{Rank: 1, Size: 2, LocalRank: 1, Addr: "10.0.0.1:29500"}},
		{env: map[string]string{"WORLD_SIZE": "4", "RANK": "3", "MASTER_PORT": "1234"}, ok: true,
			want: Config{Rank: 3, Size: 4, LocalRank: 3, Addr: "127.0.0.1:1234"}},
		{env: map[string]string{"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "node0", "MASTER_PORT": "29500",
			"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "2"}, ok: true,
			want: Config{Rank: 0, Size: 2, Addr: "node0:0", Store: "node0:29500", StoreKey: "leangrad/abc/2/rendezvous"}},
		{env: map[string]string{"WORLD_SIZE": "2", "RANK": "2", "MASTER_PORT": "1"}, ok: true, err: "rank 2 (RANK) outside a job of 2"},
		{env: map[string]string{"WORLD_SIZE": "2", "RANK": "x", "MASTER_PORT": "1"}, ok: true, err: `RANK="x" is not a number`},
		{env: map[string]string{"WORLD_SIZE": "2", "RANK": "0"}, ok: true, err: "MASTER_PORT is not set"},
	} {
		cfg, ok, err := ConfigFromEnv(func(k string) string { return tc.env[k] })
		if ok != tc.ok || (tc.err == "" && (err != nil || cfg != tc.want)) || (tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err))) {
			t.Errorf("%v: %+v, %v, %v; want %+v, %v, %q", tc.env, cfg, ok, err, tc.want, tc.ok, tc.err)
		}
	}
}

// ranks runs f on size ranks, each a goroutine with a CPU device of its own,
// joined as one group; it returns each rank's error.
func ranks(t *testing.T, size int, timeout time.Duration, f func(g *Group) error) []error {
	devs := make([]*tensor.Device, size)
	for r := range devs {
		devs[r] = tensor.NewDevice(cpu.New())
	}
	return onDevices(t, devs, timeout, f)
}

// onDevices runs f as rank r of a group over devs, one goroutine each.
func onDevices(t *testing.T, devs []*tensor.Device, timeout time.Duration, f func(g *Group) error) []error {
	addr := testdev.FreeAddr(t)
	size := len(devs)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r, dev := range devs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := Join(dev, Config{Rank: r, Size: size, Addr: addr, Timeout: timeout})
			if err != nil {
				errs[r] = err
				return
			}
			errs[r] = f(g)
		}()
	}
	wg.Wait()
	return errs
}

// checkRanks fails t for every rank that returned an error.
func checkRanks(t *testing.T, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

func TestCollectivesOverTCP(t *testing.T) {
	const size = 3
	errs := ranks(t, size, 10*time.Second, func(g *Group) error {
		dev, r := g.Device(), float32(g.Rank())
		a := tensor.FromFloat32(dev, []float32{r, 10 * r, -r}, 3).Keep()
		b := tensor.FromFloat32(dev, []float32{1 + r}, 1).Keep()
		i := tensor.FromInt32(dev, []int32{int32(g.Rank()) + 1}, 1).Keep()
		defer a.Release()
		defer b.Release()
		defer i.Release()
		if err := g.AllReduce([]*tensor.Tensor{a, b}, true); err != nil {
			return err
		}
		if err := g.AllReduce([]*tensor.Tensor{i}, false); err != nil {
			return err
		}
		// ranks 0, 1, 2: means 1, 10, -1 and 2; the sum of 1, 2, 3 is 6.
		if got := fmt.Sprint(a.Float32s(), b.Float32s(), i.Int32s()); got != "[1 10 -1] [2] [6]" {
			return fmt.Errorf("rank %d: all-reduce gave %s", g.Rank(), got)
		}
		c := tensor.FromFloat32(dev, []float32{r, r}, 2).Keep()
		defer c.Release()
		if err := g.Broadcast([]*tensor.Tensor{c}, 2); err != nil {
			return err
		}
		if got := fmt.Sprint(c.Float32s()); got != "[2 2]" {
			return fmt.Errorf("rank %d: broadcast from rank 2 gave %s", g.Rank(), got)
		}
		all, err := g.Gather([]float64{float64(g.Rank()), 0.5})
		if err != nil {
			return err
		}
		if got := fmt.Sprint(all); got != "[[0 0.5] [1 0.5] [2 0.5]]" {
			return fmt.Errorf("rank %d: gather gave %s", g.Rank(), got)
		}
		return g.Close()
	})
	checkRanks(t, errs)
}

// The reducer averages gradients across ranks, in buckets laid out in
// reverse parameter order. The first step learns that each gradient is
// finished once and reduces in Finish; the next starts every bucket from
// the backward's hook. A parameter left out of the loss is refused.
func TestReducerAveragesGradients(t *testing.T) {
	errs := ranks(t, 2, 10*time.Second, func(g *Group) error {
		dev := g.Device()
		// A 2 MiB parameter fills the 1 MiB first bucket on its own, so the
		// three parameters take two buckets: [p2, p1] is too big, [p2] | [p1, p0].
		sizes := []int{3, 512 << 10, 300 << 10}
		var params, coefs []*tensor.Tensor
		for i, n := range sizes {
			params = append(params, tensor.Zeros(dev, tensor.F32, n).Keep().SetRequiresGrad(true))
			c := make([]float32, n)
			for j := range c {
				c[j] = float32(g.Rank()*100 + i + j%7)
			}
			coefs = append(coefs, tensor.FromFloat32(dev, c, n).Keep())
		}
		defer func() {
			for i := range params {
				params[i].Release()
				coefs[i].Release()
			}
		}()
		allocated := func() int64 { return dev.Allocator().Stats().Allocated[memory.All].Current }
		before := allocated()
		red := NewReducer(g, params)
		defer red.Release()
		// Bytes is what the pool took for the buckets: their size, rounded.
		exact := 4 * int64(3+512<<10+300<<10)
		if took := allocated() - before; red.Buckets() != 2 || red.Bytes() != took || took < exact || took > exact+1<<20 {
			return fmt.Errorf("%d buckets of %d bytes (the pool took %d for %d)", red.Buckets(), red.Bytes(), took, exact)
		}
		// step runs a backward of Σ_i scale·Σ(p_i·c_i) over the parameters in
		// use and returns how many buckets had started when it ended.
		step := func(use []int, scale float32) (started int, err error) {
			red.Prepare()
			dev.WithScope(func() {
				var loss *tensor.Tensor
				for _, i := range use {
					term := ag.SumAll(ag.Mul(params[i], coefs[i]))
					if loss == nil {
						loss = term
					} else {
						loss = ag.Add(loss, term)
					}
				}
				ag.Backward(ag.Scale(loss, scale), ag.OnGradReady(red.Ready))
			})
			for _, s := range red.started {
				if s {
					started++
				}
			}
			return started, red.Finish()
		}
		for n, scale := range []float32{1, 2} {
			started, err := step([]int{0, 1, 2}, scale)
			if err != nil {
				return err
			}
			if want := n * red.Buckets(); started != want { // none on the first step, all on the second
				return fmt.Errorf("step %d: %d buckets started during the backward, want %d", n, started, want)
			}
			for i, p := range params {
				for j, v := range p.Grad().Float32s() {
					if want := scale * float32(50+i+j%7); v != want { // the mean of rank*100 over ranks 0 and 1 is 50
						return fmt.Errorf("rank %d step %d: gradient %d[%d] = %v, want %v", g.Rank(), n, i, j, v, want)
					}
				}
				p.ZeroGrad()
			}
		}
		if ok, why := red.Overlap(); !ok {
			return fmt.Errorf("no overlap after a step that finished each gradient once: %s", why)
		}
		if _, err := step([]int{1, 2}, 1); err == nil || !strings.Contains(err.Error(), "has no gradient") {
			return fmt.Errorf("a parameter without a gradient: %v", err)
		}
		// Both ranks refused before reducing the bucket holding p0: the
		// group is still whole.
		return g.Close()
	})
	checkRanks(t, errs)
}

// A parameter used by two checkpointed blocks has its gradient finished by
// each block's pass: the reducer then does not overlap, and still averages.
func TestReducerSharedParameterDoesNotOverlap(t *testing.T) {
	errs := ranks(t, 2, 10*time.Second, func(g *Group) error {
		dev := g.Device()
		w := tensor.FromFloat32(dev, []float32{1, 2, 3}, 3).Keep().SetRequiresGrad(true)
		defer w.Release()
		red := NewReducer(g, []*tensor.Tensor{w})
		defer red.Release()
		x := tensor.FromFloat32(dev, []float32{float32(g.Rank() + 1), 1, 1}, 3).Keep()
		defer x.Release()
		block := func(in []*tensor.Tensor) *tensor.Tensor { return ag.Mul(in[0], w) }
		for n := range 2 {
			red.Prepare()
			dev.WithScope(func() {
				// y = x·w·w, so dy/dw = 2·x·w; averaged over x0 = 1, 2: 2·(1.5, 1, 1)·(1, 2, 3).
				y := ag.Checkpoint(block, ag.Checkpoint(block, x))
				ag.Backward(ag.SumAll(y), ag.OnGradReady(red.Ready))
			})
			if err := red.Finish(); err != nil {
				return err
			}
			if got := fmt.Sprint(w.Grad().Float32s()); got != "[3 4 6]" {
				return fmt.Errorf("step %d: gradient %s, want [3 4 6]", n, got)
			}
			w.ZeroGrad()
		}
		if ok, why := red.Overlap(); ok || !strings.Contains(why, "finished 2 times") {
			return fmt.Errorf("overlap %v (%s) with a parameter finished twice a backward", ok, why)
		}
		return g.Close()
	})
	checkRanks(t, errs)
}

// A step whose backward finishes a parameter's gradient twice, after the
// first step finished it once (the graph changed), fails with an error
// naming the parameter instead of reducing a stale bucket.
func TestReducerRefusesAGraphThatChanged(t *testing.T) {
	errs := ranks(t, 2, 10*time.Second, func(g *Group) error {
		dev := g.Device()
		w := tensor.FromFloat32(dev, []float32{1, 2, 3}, 3).Keep().SetRequiresGrad(true)
		defer w.Release()
		x := tensor.FromFloat32(dev, []float32{1, 1, 1}, 3).Keep()
		defer x.Release()
		red := NewReducer(g, []*tensor.Tensor{w})
		defer red.Release()
		block := func(in []*tensor.Tensor) *tensor.Tensor { return ag.Mul(in[0], w) }
		step := func(twice bool) error {
			red.Prepare()
			dev.WithScope(func() {
				y := ag.Checkpoint(block, x)
				if twice {
					y = ag.Checkpoint(block, y)
				}
				ag.Backward(ag.SumAll(y), ag.OnGradReady(red.Ready))
			})
			defer w.ZeroGrad()
			return red.Finish()
		}
		if err := step(false); err != nil {
			return err
		}
		if ok, why := red.Overlap(); !ok {
			return fmt.Errorf("no overlap after a step that finished the gradient once: %s", why)
		}
		if err := step(true); err == nil || !strings.Contains(err.Error(), "parameter 0 (shape [3]) was finished twice") {
			return fmt.Errorf("a gradient finished twice after its bucket started: %v", err)
		}
		return g.Close()
	})
	checkRanks(t, errs)
}

// A rank that dies (its connection closes without a goodbye) fails every
// other rank's next collective, with an error naming it, well within the
// timeout, and runs the failure hooks.
func TestDeadRankFailsTheOthers(t *testing.T) {
	const size = 3
	var hooks sync.WaitGroup
	hooks.Add(size - 1)
	start := time.Now()
	errs := ranks(t, size, time.Minute, func(g *Group) error {
		if g.Rank() == 1 {
			for _, p := range g.rv.peers {
				p.c.Close() // dies: no goodbye
			}
			return nil
		}
		g.OnFailure(func(error) { hooks.Done() })
		x := tensor.FromFloat32(g.Device(), []float32{1}, 1).Keep()
		defer x.Release()
		var err error
		for i := 0; i < 1000 && err == nil; i++ {
			err = g.AllReduce([]*tensor.Tensor{x}, false)
		}
		g.Close()
		return err
	})
	hooks.Wait()
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("the ranks took %v to notice", d)
	}
	for r, err := range errs {
		if r == 1 {
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "rank 1") {
			t.Errorf("rank %d: %v, want an error naming rank 1", r, err)
		}
	}
}

func TestRendezvousErrors(t *testing.T) {
	t.Run("missing rank", func(t *testing.T) {
		dev := tensor.NewDevice(cpu.New())
		_, err := Join(dev, Config{Rank: 0, Size: 2, Addr: testdev.FreeAddr(t), Timeout: 300 * time.Millisecond})
		if err == nil || !strings.Contains(err.Error(), "ranks [1] did not join") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("no rank 0", func(t *testing.T) {
		dev := tensor.NewDevice(cpu.New())
		_, err := Join(dev, Config{Rank: 1, Size: 2, Addr: testdev.FreeAddr(t), Timeout: 300 * time.Millisecond})
		if err == nil || !strings.Contains(err.Error(), "no rendezvous at") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("two rank 1s", func(t *testing.T) {
		addr := testdev.FreeAddr(t)
		errs := make([]error, 3)
		var wg sync.WaitGroup
		for i, r := range []int{0, 1, 1} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				g, err := Join(tensor.NewDevice(cpu.New()), Config{Rank: r, Size: 3, Addr: addr, Timeout: 2 * time.Second})
				if err == nil {
					g.Abort(fmt.Errorf("joined"))
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		if errs[0] == nil || !strings.Contains(errs[0].Error(), "two processes say they are rank 1") {
			t.Errorf("rank 0: %v", errs[0])
		}
	})
}

func TestTimeAllReduce(t *testing.T) {
	errs := ranks(t, 2, 20*time.Second, func(g *Group) error {
		small, err := g.TimeAllReduce(4, 5)
		if err != nil {
			return err
		}
		big, err := g.TimeAllReduce(8<<20, 5)
		if err != nil {
			return err
		}
		// 8 MiB go to rank 0 and back over TCP each time, four bytes in a
		// message of their own: an all-reduce not done, or not waited
		// for, would time the two alike.
		if !(small > 0) || !(big > 4*small) {
			return fmt.Errorf("all-reduce of 4 B %v, of 8 MiB %v: want the second several times the first", small, big)
		}
		return g.Close()
	})
	checkRanks(t, errs)
}
