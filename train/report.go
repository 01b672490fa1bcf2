package train

import (
	"fmt"
	"image/color"
	"io"
	"strings"

	"github.com/leangrad/leangrad/internal/atomicfile"
	"github.com/leangrad/leangrad/memory"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Percent formats the change from base to v: "-63%".
func Percent(v, base int64) string {
	if base == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%+.0f%%", 100*(float64(v)/float64(base)-1))
}

// WriteSavings prints the measured one-step peaks of the variants, marking
// the one chosen: an eager step's, and a planned step's where it was planned.
func WriteSavings(w io.Writer, ms []Measurement, chosen string) {
	var fp32, fp32Planned int64
	for _, m := range ms {
		if m.Name == "fp32" {
			fp32, fp32Planned = m.PeakAllocated, m.Planned
		}
	}
	for _, m := range ms {
		mark := ""
		if m.Name == chosen {
			mark = "  <- this run"
		}
		vs := ""
		if m.Name != "fp32" {
			vs = fmt.Sprintf("  (%s vs fp32)", Percent(m.PeakAllocated, fp32))
		}
		line := fmt.Sprintf("  %-15s %10s%-17s", m.Name, memory.Bytes(m.PeakAllocated), vs)
		if m.Planned > 0 {
			pvs := ""
			if m.Name != "fp32" {
				pvs = fmt.Sprintf(" (%s)", Percent(m.Planned, fp32Planned))
			}
			line += fmt.Sprintf("  planned %10s%s", memory.Bytes(m.Planned), pvs)
		}
		fmt.Fprintf(w, "%s%s\n", strings.TrimRight(line, " "), mark)
	}
}

// VariantName names a configuration as Variants does.
func VariantName(amp bool, checkpoint string) string {
	ck := checkpoint != "" && checkpoint != "none"
	switch {
	case amp && ck:
		return "amp+checkpoint"
	case amp:
		return "amp"
	case ck:
		return "checkpoint"
	}
	return "fp32"
}

// PlotMemory draws allocated, reserved and each step's peak allocated bytes
// over the run's steps, as a PNG (or SVG, PDF by path's extension), written
// atomically.
func PlotMemory(samples []MemSample, title, path string) error {
	if len(samples) == 0 {
		return fmt.Errorf("no memory samples to plot")
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "step"
	p.Y.Label.Text = "MiB"
	series := func(f func(MemSample) int64) plotter.XYs {
		xy := make(plotter.XYs, len(samples))
		for i, s := range samples {
			xy[i].X, xy[i].Y = float64(s.Step), memory.Bytes(f(s)).MiB()
		}
		return xy
	}
	lines := []struct {
		name string
		f    func(MemSample) int64
	}{
		{"peak allocated within the step", func(s MemSample) int64 { return s.PeakAllocated }},
		{"reserved (segments held)", func(s MemSample) int64 { return s.Reserved }},
		{"allocated after the step", func(s MemSample) int64 { return s.Allocated }},
	}
	for i, l := range lines {
		line, err := plotter.NewLine(series(l.f))
		if err != nil {
			return err
		}
		line.Color = plotColors[i]
		line.Width = vg.Points(1.2)
		p.Add(line)
		p.Legend.Add(l.name, line)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Y.Min = 0
	format := "png"
	if i := strings.LastIndexByte(path, '.'); i >= 0 {
		format = strings.ToLower(path[i+1:])
	}
	wt, err := p.WriterTo(8*vg.Inch, 4*vg.Inch, format)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, func(w io.Writer) error {
		_, err := wt.WriteTo(w)
		return err
	})
}

var plotColors = []color.Color{
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
}
