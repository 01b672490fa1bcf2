package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/train"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progress draws one progress bar per epoch with the running loss,
// accuracy, throughput and the pool's allocated and peak memory. When its
// writer is not a terminal (a log file, CI), it prints a plain line every
// tenth of an epoch instead. A language model's "epochs" are the steps
// between validations: its lines count steps and tokens.
type progress struct {
	w      io.Writer
	epochs int
	text   bool
	tty    bool
	bar    *progressbar.ProgressBar
	last   int // the step of the previous update in this epoch
	// lastSteps is the steps of the epoch under way.
	lastSteps int
}

func newProgress(w io.Writer, epochs int, text bool) *progress {
	f, ok := w.(*os.File)
	return &progress{w: w, epochs: epochs, text: text, tty: ok && term.IsTerminal(int(f.Fd()))}
}

// where is the epoch, or for a language model the step of the run.
func (p *progress) where(epoch, step, steps int) string {
	if p.text {
		return fmt.Sprintf("step %d/%d", epoch*steps+step, p.epochs*steps)
	}
	return fmt.Sprintf("epoch %d/%d", epoch+1, p.epochs)
}

func (p *progress) EpochStart(epoch, steps int) {
	p.last, p.lastSteps = 0, steps
	if !p.tty {
		return
	}
	p.bar = progressbar.NewOptions(steps,
		progressbar.OptionSetWriter(p.w),
		progressbar.OptionSetDescription(p.where(epoch, 0, steps)),
		progressbar.OptionSetWidth(20),
		progressbar.OptionShowCount(),
		progressbar.OptionThrottle(200*time.Millisecond),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(p.w) }),
	)
}

func (p *progress) Step(s train.StepStats) {
	desc := fmt.Sprintf("%s loss %.4f acc %5.1f%% %6.0f img/s mem %s (peak %s)",
		p.where(s.Epoch, s.Step, s.Steps), s.Loss, 100*s.Acc, s.ImgPerSec, memory.Bytes(s.Allocated), memory.Bytes(s.PeakAllocated))
	if p.text {
		desc = fmt.Sprintf("%s loss %.4f %7.0f tokens/s mem %s (peak %s)",
			p.where(s.Epoch, s.Step, s.Steps), s.Loss, s.PredictionsPerSec, memory.Bytes(s.Allocated), memory.Bytes(s.PeakAllocated))
	}
	last := p.last
	p.last = s.Step
	if !p.tty {
		// Updates come every few steps (each is a device read): print the
		// first one past each tenth of the epoch.
		if tenth := max(1, s.Steps/10); s.Step/tenth != last/tenth || s.Step == s.Steps {
			if p.text {
				fmt.Fprintln(p.w, desc)
			} else {
				fmt.Fprintf(p.w, "%s step %d/%d\n", desc, s.Step, s.Steps)
			}
		}
		return
	}
	p.bar.Describe(desc)
	p.bar.Add(s.Step - last)
}

func (p *progress) EpochEnd(m train.EpochMetrics) {
	if p.tty {
		p.bar.Finish()
	}
	if p.text {
		fmt.Fprintf(p.w, "validation at %s: train loss %.4f | val loss %.4f (perplexity %.1f) | %.0f tokens/s | peak %s",
			p.where(m.Epoch+1, 0, p.lastSteps), m.TrainLoss, m.TestLoss, math.Exp(float64(m.TestLoss)), m.PredictionsPerSec, memory.Bytes(m.PeakAllocated))
	} else {
		fmt.Fprintf(p.w, "epoch %d: train loss %.4f acc %.2f%% | test loss %.4f acc %.2f%% | %.0f img/s | peak %s",
			m.Epoch+1, m.TrainLoss, 100*m.TrainAcc, m.TestLoss, 100*m.TestAcc, m.ImgPerSec, memory.Bytes(m.PeakAllocated))
	}
	if m.LossScale > 0 {
		fmt.Fprintf(p.w, " | loss scale %.4g, %d steps skipped", m.LossScale, m.SkippedSteps)
	}
	fmt.Fprintln(p.w)
}
