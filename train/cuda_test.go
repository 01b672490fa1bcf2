package train

import (
	"fmt"
	"math"
	"testing"

	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/internal/testdev"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/optim"
	"github.com/leangrad/leangrad/tensor"
)

// The CPU tests' bodies, on the GPU; the step's tests run captured.

func TestCUDANoGrowthOverManySteps(t *testing.T) { testNoGrowthOverManySteps(t, testdev.CUDA(t)) }
func TestCUDASaveResumeContinuesExactly(t *testing.T) {
	testSaveResumeContinuesExactly(t, testdev.CUDA(t))
}
func TestCUDAMLPFashionMNIST(t *testing.T) { testMLPFashionMNIST(t, testdev.CUDA(t)) }

// On lean convolution workspaces: the fastest algorithms' workspaces vary
// from run to run by more than checkpointing saves at batch 128 (amp 106 and
// 147 MB, checkpoint 127 and 98 MB in two runs on the H200, 2026-11-30).
func TestCUDAMeasuredSavings(t *testing.T) {
	testMeasuredSavings(t, testdev.CUDAWith(t, tensor.Options{LeanConvWorkspace: true}), 128)
}

// Each run on a device of its own, its pool empty at the start, as the
// books' is.
func TestCUDABooksForeseeTheRun(t *testing.T) {
	testBooksForeseeTheRun(t, func(t testing.TB) *tensor.Device { return testdev.CUDAWith(t, tensor.Options{LeanConvWorkspace: true}) },
		Captured, []float64{1.1, 1.25, 1.4}, map[bool]int{})
}
func TestCUDAPlannedStepsMatchEager(t *testing.T) {
	testPlannedStepsMatchEager(t, testdev.CUDA(t), Captured)
}
func TestCUDAGPTPlannedStepsMatchEager(t *testing.T) {
	testGPTPlannedStepsMatchEager(t, testdev.CUDA(t), Captured)
}
func TestCUDAPlannedStepMemory(t *testing.T) {
	testPlannedStepMemory(t, testdev.CUDA(t), Captured, nil)
}
func TestCUDAInfSkipsStepAsEagerDoes(t *testing.T) {
	testInfSkipsStepAsEagerDoes(t, testdev.CUDA(t), Captured)
}
func TestCUDADropoutMasksDifferBetweenSteps(t *testing.T) {
	testDropoutMasksDifferBetweenSteps(t, testdev.CUDA(t), Captured)
}
func TestCUDAStepReadsNothing(t *testing.T)     { testStepReadsNothing(t, testdev.CUDA(t), Captured) }
func TestCUDAStepChoosesTheLayout(t *testing.T) { testStepChoosesTheLayout(t, testdev.CUDA(t)) }

// On two GPUs (nvidia-h200-x2): NCCL reduces the gradients inside the
// captured step.
func TestCUDADataParallelStep(t *testing.T) {
	testDataParallelStep(t, testdev.CUDAs(t, 2), Captured)
}

// The ResNet on two GPUs, captured (four steps: eager, traced, captured,
// replayed), F32 convolutions without TF32 so that the bound with batch
// norm in evaluation mode is about summation order (cuDNN's algorithms
// for a batch of 16 and of 32 differ).
func TestCUDADataParallelResNetStep(t *testing.T) {
	devs := testdev.CUDAsWith(t, 2, tensor.Options{StrictConvF32: true})
	testDataParallelResNetStep(t, devs[0], devs, Captured, 4, 1e-4)
}

// A goroutine trains with captured steps while two serve on sessions of the
// same GPU.
func TestCUDATrainingBesideInference(t *testing.T) {
	testTrainingBesideInference(t, testdev.CUDA(t), 1e-4)
}

// TestCUDAShardedOptimizer: the sharded step on one GPU (a group of one
// rank: the buckets, the pieces' update and the gathers, without
// collectives) takes the unsharded step's bit for bit, eager and captured.
func TestCUDAShardedOptimizer(t *testing.T) {
	dev := testdev.CUDA(t)
	one := func(int) []*tensor.Device { return []*tensor.Device{dev} }
	cases := []shardCase{{ranks: 1, opt: "adamw", amp: true}, {ranks: 1, opt: "sgd", clip: 0.05}}
	t.Run("eager", func(t *testing.T) { testShardedOptimizer(t, shardJobs{one, Eager, 3, 0}, cases, 0) })
	t.Run("captured", func(t *testing.T) { testShardedOptimizer(t, shardJobs{one, Captured, 5, 0}, cases, 0) })
}

// TestCUDAShardedOptimizerNCCL is TestShardedOptimizerMatchesUnsharded on
// two GPUs, over NCCL, captured, within 1e-6 (NCCL's reductions are not
// the CPU's rank order).
func TestCUDAShardedOptimizerNCCL(t *testing.T) {
	devs := testdev.CUDAs(t, 2)
	two := func(n int) []*tensor.Device { return devs[:n] }
	testShardedOptimizer(t, shardJobs{two, Captured, 5, 1e-6}, []shardCase{{ranks: 2, opt: "adamw", amp: true}, {ranks: 2, opt: "sgd", clip: 0.05}}, 2)
}

// TestCUDABF16Weights: TestOffloadedBF16WeightsFollowF32 on the GPU, the
// masters in its page-locked memory.
func TestCUDABF16Weights(t *testing.T) {
	dev := testdev.CUDA(t)
	testBF16Weights(t, dev, dev.Pinned())
}

// TestCUDAOffloadedOptimizer: a run with its optimizer's state in host
// memory (AdamW under F16 and BF16 AMP, with and without clipping, the
// update in the backward or after it, in whole batches and in micro-batches
// summed on the host) follows the on-device run within rounding, its steps eager, and the GPU
// holds none of the state. The on-device run is eager too, so that both
// run the same convolution algorithms: a captured step's plan may choose
// others, whose rounding differences AdamW turns into a fraction of a step
// for elements of near-zero gradient (the test failed so, at times, when
// its reference was captured).
func TestCUDAOffloadedOptimizer(t *testing.T) {
	dev := testdev.CUDA(t)
	ds := datasets.SyntheticSize(192, 5, 12)
	const lr = 1e-3
	for _, c := range []struct {
		amp   AMP
		clip  float64
		fuse  bool // the update in the backward: on the host offloaded, on the device not
		micro int  // micro-batches of this many (0: none), offloaded summed on the host
	}{{AMPF16, 0.5, false, 0}, {AMPF16, 0, false, 0}, {AMPBF16, 0.5, false, 0}, {AMPBF16, 0, false, 0}, {AMPBF16, 0, true, 0},
		{AMPBF16, 0.5, false, 4}, {AMPBF16, 0, true, 4}} {
		t.Run(fmt.Sprintf("%v,clip=%v,fused=%v,micro=%d", c.amp, c.clip, c.fuse, c.micro), func(t *testing.T) {
			run := func(offload bool) (*Trainer, []float32) {
				cfg := baseConfig("tiny")
				cfg.Batch, cfg.AMP, cfg.Optimizer, cfg.LR, cfg.ClipNorm, cfg.Capture, cfg.OffloadOptimizer = 16, c.amp, "adamw", lr, c.clip, false, offload
				cfg.FuseOptimizer, cfg.MicroBatch = c.fuse, c.micro
				dev.Generator().Seed(1)
				m := nn.NewResNet(dev, "tiny", 1, 10, []int{8, 16}, []int{1, 1})
				t.Cleanup(func() { nn.Release(m) })
				tr, err := New(m, dev, cfg, 12)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(tr.Release)
				l := datasets.NewLoader(ds, dev, datasets.LoaderConfig{Batch: cfg.Batch, Shuffle: true, Seed: 2})
				if err := tr.Fit(l, datasets.NewLoader(ds.Subset(32), dev, datasets.LoaderConfig{Batch: 32}), nil, ""); err != nil {
					t.Fatal(err)
				}
				var ps []float32
				for _, p := range nn.Parameters(m) {
					ps = append(ps, p.Float32s()...)
				}
				return tr, ps
			}
			on, want := run(false)
			off, got := run(true)
			if _, ok := off.Opt.(*optim.Offloaded); !ok || off.Step.Mode != Eager || on.Step.Mode != Eager || off.Step.OptimizerStateBytes() != 0 {
				t.Fatalf("offloaded: optimizer %T, mode %v (on the device %v), %d bytes of its state on the GPU", off.Opt, off.Step.Mode, on.Step.Mode, off.Step.OptimizerStateBytes())
			}
			if on.Step.OptimizerStateBytes() == 0 {
				t.Fatal("the on-device run holds no optimizer state")
			}
			if off.Step.HostUpdateInBackward != c.fuse || off.Step.FuseOptimizer || on.Step.FuseOptimizer != c.fuse {
				t.Fatalf("fused %v: offloaded updates in the backward on the host %v, on the device %v; not offloaded on the device %v",
					c.fuse, off.Step.HostUpdateInBackward, off.Step.FuseOptimizer, on.Step.FuseOptimizer)
			}
			if u := off.Opt.(*optim.Offloaded).UpdatedInBackward(); c.fuse != (u > 0.9) {
				t.Errorf("fused %v: %.0f%% of the parameters' bytes updated in the backward", c.fuse, 100*u)
			}
			// AdamW moves each element by about the learning rate a step whatever its
			// gradient's size, so an element whose gradient is near zero turns
			// rounding-level differences (16-bit gradients, the captured step's kernels
			// against the eager ones, the host's arithmetic against the device's) into
			// a fraction of one step (up to a third of one for an element, on H100s
			// and the H200): bound each element by one step, at most one in 500
			// by more than a quarter of one, and the mean by a
			// hundredth of one. A lost or doubled update moves whole steps.
			var sum float64
			far, quarter := 0, 0
			for i := range want {
				d := math.Abs(float64(got[i] - want[i]))
				sum += d
				rel := 1e-3 * math.Abs(float64(want[i]))
				if d > 0.25*lr+rel {
					quarter++
				}
				if d > lr+rel {
					if far++; far <= 3 {
						t.Errorf("parameter element %d of %d: %v offloaded, %v on the device (learning rate %g)", i, len(want), got[i], want[i], lr)
					}
				}
			}
			if mean := sum / float64(len(want)); mean > 0.01*lr || far > 0 || quarter > len(want)/500 {
				t.Errorf("parameters differ by %.3g on average (want at most %.3g, a hundredth of a step); %d of %d elements by more than a quarter of a step (want at most %d), %d by more than a step",
					mean, 0.01*lr, quarter, len(want), len(want)/500, far)
			}
		})
	}
}

// TestCUDAFusedOptimizer: TestFusedOptimizerMatchesAndSaves on the GPU.
func TestCUDAFusedOptimizer(t *testing.T) { testFusedOptimizer(t, testdev.CUDA(t)) }

// TestCUDAFusedCapturedSteps: TestFusedPlannedStepsMatchEager with the
// steps captured as CUDA graphs.
func TestCUDAFusedCapturedSteps(t *testing.T) { testFusedPlannedSteps(t, testdev.CUDA(t), Captured) }

// TestCUDAOffloadedCapturedSteps: TestOffloadedPlannedStepsMatchEager with
// the steps captured as CUDA graphs, their checkpoints copied to and from
// the device's page-locked memory on the copy streams.
func TestCUDAOffloadedCapturedSteps(t *testing.T) {
	dev := testdev.CUDA(t)
	testOffloadedPlannedSteps(t, dev, dev.Pinned, Captured)
}
