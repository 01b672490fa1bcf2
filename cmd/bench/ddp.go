package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/leangrad/leangrad/benchmarks"
	"github.com/leangrad/leangrad/cmd/internal/cmdenv"
	"github.com/leangrad/leangrad/cmd/internal/launch"
	"github.com/leangrad/leangrad/dist"
	"github.com/leangrad/leangrad/fileio"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
)

// DDPReport is what a data-parallel benchmark writes (ddp.json): every
// spec and configuration timed as one data-parallel step over the ranks,
// with each rank's peak.
type DDPReport struct {
	Date        string              `json:"date"`
	Commit      string              `json:"commit"`
	Ranks       int                 `json:"ranks"`
	Collectives string              `json:"collectives"`
	Device      string              `json:"device"` // rank 0's
	Results     []benchmarks.Result `json:"results"`
	PerRankPeak [][]int64           `json:"per_rank_peak_allocated"` // results × ranks
	// PerRankOptimizerState is each rank's optimiser state on its device
	// (results × ranks): its shard, with -shard-optimizer.
	PerRankOptimizerState [][]int64 `json:"per_rank_optimizer_state_bytes"`
}

// dataParallel is one rank of bench -nproc: it times the data-parallel step
// of every spec and configuration (captured on a GPU), and rank 0 prints
// the results and writes them to -out/ddp.json.
func dataParallel(o options, specs []spec, place *dist.Config, stdout, stderr io.Writer) error {
	dev, err := cmdenv.OpenDevice(launch.Device(o.device, place), o.deviceOptions(tensor.Options{}), io.Discard)
	if err != nil {
		return err
	}
	g, err := launch.Join(dev, place, stderr)
	if err != nil {
		return err
	}
	rep := DDPReport{Date: o.date, Commit: o.commit, Ranks: g.Size(), Collectives: g.Backend(), Device: dev.Name()}
	if in := dev.Info(); in.Model != "" {
		rep.Device += " (" + in.Model + ")"
	}
	bo := o.harness()
	bo.Group, bo.NoOverlap, bo.ShardOptimizer = g, !o.overlap, o.shardOptimizer
	for _, sp := range specs {
		for _, b := range sp.batches {
			for _, c := range strings.Split(o.configs, ",") {
				r, err := benchmarks.Run(dev, benchmarks.Spec{Model: sp.model, Batch: b, Config: c}, bo)
				if err != nil {
					g.Abort(fmt.Errorf("rank %d: %s batch %d %s: %v", place.Rank, sp.model, b, c, err))
					g.Close()
					return fmt.Errorf("%s batch %d %s: %w", sp.model, b, c, err)
				}
				peaks, err := g.Gather([]float64{float64(r.PeakAllocated), float64(r.OptimizerStateBytes)})
				if err != nil {
					return err
				}
				var per, state []int64
				for _, p := range peaks {
					per, state = append(per, int64(p[0])), append(state, int64(p[1]))
				}
				rep.Results = append(rep.Results, r)
				rep.PerRankPeak = append(rep.PerRankPeak, per)
				rep.PerRankOptimizerState = append(rep.PerRankOptimizerState, state)
				if place.Rank == 0 {
					how := "overlapping the backward"
					if !r.Overlapped {
						how = "after the backward"
					}
					shard := ""
					if r.Sharded {
						shard = ", optimizer state sharded"
					}
					unit := "img/s"
					if r.FLOPsPerStep > 0 { // a language model: its examples are windows of tokens
						unit = "windows/s"
					}
					fmt.Fprintf(stdout, "%s %s batch %d per rank × %d ranks %s: %.2f ms, %.0f %s, peak %s on rank 0, optimizer state %s (%s mode, all-reduce %s%s)\n",
						r.Engine, r.Model, r.Batch, r.Ranks, r.Config, r.MedianMS, r.ImgPerSec, unit, memory.Bytes(r.PeakAllocated), memory.Bytes(r.OptimizerStateBytes), r.Mode, how, shard)
				}
			}
		}
	}
	if err := g.Close(); err != nil {
		return err
	}
	if place.Rank != 0 {
		return nil
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	p := filepath.Join(o.out, "ddp.json")
	if err := fileio.WriteFile(p, append(data, '\n')); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %s\n", p)
	return nil
}
