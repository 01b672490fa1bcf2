package dist_test

import (
	"fmt"
	"net"
	"sync"

	"github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/dist"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/tensor"
)

// Two ranks, here goroutines with a CPU device each (in a job: processes,
// one per GPU, with dist.ConfigFromEnv(os.Getenv)), join at a rendezvous
// address and average a tensor. Every rank ends with the same mean.
func Example() {
	ln, _ := net.Listen("tcp", "127.0.0.1:0") // a free port for the rendezvous
	addr := ln.Addr().String()
	ln.Close()

	means := make([][]float32, 2)
	var wg sync.WaitGroup
	for rank := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dev := tensor.NewDevice(cpu.New())
			g, err := dist.Join(dev, dist.Config{Rank: rank, Size: 2, Addr: addr})
			if err != nil {
				fmt.Println(err)
				return
			}
			defer g.Close() // waits for every rank
			grad := tensor.FromFloat32(dev, []float32{float32(rank), 10}, 2).Keep()
			defer grad.Release()
			if err := g.AllReduce([]*tensor.Tensor{grad}, true); err != nil {
				fmt.Println(err)
				return
			}
			means[rank] = grad.Float32s()
		}()
	}
	wg.Wait()
	fmt.Println(means[0], means[1])
	// Output: [0.5 10] [0.5 10]
}

// A data-parallel step in a training loop of one's own: each rank runs the
// backward of its own loss with the reducer's hook, and Finish leaves every
// parameter's gradient the mean over the ranks (train.Step does this when
// given a group). From the second step on, each bucket's all-reduce starts
// as soon as the backward has finished its gradients.
func ExampleReducer() {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()

	grads := make([][]float32, 2)
	var wg sync.WaitGroup
	for rank := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dev := tensor.NewDevice(cpu.New())
			g, err := dist.Join(dev, dist.Config{Rank: rank, Size: 2, Addr: addr})
			if err != nil {
				fmt.Println(err)
				return
			}
			defer g.Close()
			w := tensor.FromFloat32(dev, []float32{1, 2}, 2).Keep().SetRequiresGrad(true)
			defer w.Release()
			r := dist.NewReducer(g, []*tensor.Tensor{w})
			defer r.Release()
			// This rank's data: x = (rank+1, 1); the loss Σ w·x has gradient x.
			x := tensor.FromFloat32(dev, []float32{float32(rank + 1), 1}, 2).Keep()
			defer x.Release()
			r.Prepare()
			dev.WithScope(func() {
				autograd.Backward(autograd.SumAll(autograd.Mul(w, x)), autograd.OnGradReady(r.Ready))
			})
			if err := r.Finish(); err != nil {
				fmt.Println(err)
				return
			}
			grads[rank] = w.Grad().Float32s() // what the optimiser would read
			w.ZeroGrad()
		}()
	}
	wg.Wait()
	fmt.Println(grads[0], grads[1])
	// Output: [1.5 1] [1.5 1]
}
