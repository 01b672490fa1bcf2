package dist

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leangrad/leangrad/internal/testdev"
	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// TestCUDANCCL: on two GPUs the group is NCCL's, and its all-reduce (sum
// and mean), broadcast and timing work, with the ranks in one process.
func TestCUDANCCL(t *testing.T) {
	devs := testdev.CUDAs(t, 2)
	errs := onDevices(t, devs, time.Minute, func(g *Group) error {
		if !strings.HasPrefix(g.Backend(), "nccl") {
			return fmt.Errorf("collectives over %q, want nccl", g.Backend())
		}
		dev, r := g.Device(), float32(g.Rank())
		a := tensor.FromFloat32(dev, []float32{r, 10 * r, -r}, 3).Keep()
		i := tensor.FromInt32(dev, []int32{int32(g.Rank()) + 1}, 1).Keep()
		c := tensor.FromFloat32(dev, []float32{r, r}, 2).Keep()
		defer a.Release()
		defer i.Release()
		defer c.Release()
		if err := g.AllReduce([]*tensor.Tensor{a}, true); err != nil {
			return err
		}
		if err := g.AllReduce([]*tensor.Tensor{i}, false); err != nil {
			return err
		}
		if err := g.Broadcast([]*tensor.Tensor{c}, 1); err != nil {
			return err
		}
		if got := fmt.Sprint(a.Float32s(), i.Int32s(), c.Float32s()); got != "[0.5 5 -0.5] [3] [1 1]" {
			return fmt.Errorf("rank %d: %s", g.Rank(), got)
		}
		// The halves of an all-reduce, on a view inside a larger block: rank
		// r's half holds the mean, then every rank's half is everyone's.
		block := tensor.FromFloat32(dev, []float32{-1, r, 2 * r, 3 * r, 4 * r, -1}, 6).Keep()
		defer block.Release()
		mid := block.Rows(1, 5).Keep()
		defer mid.Release()
		if err := g.StartReduceScatter([]*tensor.Tensor{mid}, true); err != nil {
			return err
		}
		if err := g.Join(); err != nil {
			return err
		}
		if err := g.AllGather([]*tensor.Tensor{mid}); err != nil {
			return err
		}
		if got := fmt.Sprint(block.Float32s()); got != "[-1 0.5 1 1.5 2 -1]" {
			return fmt.Errorf("rank %d: a reduce-scatter and an all-gather give %s", g.Rank(), got)
		}
		d, err := g.TimeAllReduce(45<<20, 10)
		if err != nil {
			return err
		}
		t.Logf("rank %d: an all-reduce of 45 MiB (ResNet-18's gradients) takes %v over %s", g.Rank(), d, g.Backend())
		return g.Close()
	})
	checkRanks(t, errs)
}

// TestCUDANCCLOneRank: NCCL's reduce-scatter and all-gather, bound in
// place on a view inside a larger block, over a communicator of one rank:
// the view keeps its values (the mean over one rank) and its neighbours
// theirs.
func TestCUDANCCLOneRank(t *testing.T) {
	dev := testdev.CUDA(t)
	cb, ok := dev.Backend().(kernels.CollectiveBackend)
	if !ok {
		t.Fatal("the CUDA backend has no collectives")
	}
	id, err := cb.CollectiveID()
	if err != nil {
		t.Fatal(err)
	}
	c, err := cb.NewCollective(id, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	block := tensor.FromFloat32(dev, []float32{-1, 1, 2, 3, 4, -1}, 6).Keep()
	defer block.Release()
	mid := block.Rows(1, 5).Keep()
	defer mid.Release()
	if err := c.StartReduceScatter([]kernels.Buf{mid.Buf()}, true); err != nil {
		t.Fatal(err)
	}
	if err := c.Join(); err != nil {
		t.Fatal(err)
	}
	if err := c.AllGather([]kernels.Buf{mid.Buf()}); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(block.Float32s()); got != "[-1 1 2 3 4 -1]" {
		t.Errorf("a reduce-scatter and an all-gather over one rank give %s", got)
	}
}

// TestCUDANCCLDeadRank: rank 1 dies while rank 0 waits in an NCCL
// all-reduce on the device; the rendezvous sees it, aborts NCCL, and rank 0's
// wait ends with an error instead of hanging.
func TestCUDANCCLDeadRank(t *testing.T) {
	devs := testdev.CUDAs(t, 2)
	start := time.Now()
	errs := onDevices(t, devs, time.Minute, func(g *Group) error {
		if g.Rank() == 1 {
			time.Sleep(2 * time.Second)
			for _, p := range g.rv.peers {
				p.c.Close() // dies without a goodbye, and without joining the all-reduce
			}
			return nil
		}
		x := tensor.FromFloat32(g.Device(), []float32{1}, 1).Keep()
		defer x.Release()
		err := g.AllReduce([]*tensor.Tensor{x}, false)
		if err == nil {
			err = g.Device().Synchronize() // blocks until rank 1's part comes, or the abort
		}
		if f := g.Err(); f != nil {
			err = f // the reason, whatever the device said after the abort
		}
		return err
	})
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "rank 1") {
		t.Errorf("rank 0: %v, want an error naming rank 1", errs[0])
	}
	t.Logf("rank 0 returned %v after the start (rank 1 died at 2 s): %v", time.Since(start).Round(time.Millisecond), errs[0])
}
