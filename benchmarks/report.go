package benchmarks

import (
	"fmt"
	"image/color"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/leangrad/leangrad/fileio"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/train"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Report is everything one harness run produced.
type Report struct {
	Date    string   `json:"date"`
	Commit  string   `json:"commit,omitempty"` // leangrad's git commit the run was built from
	Device  string   `json:"device"`
	PyTorch string   `json:"pytorch,omitempty"` // version, when it ran
	Results []Result `json:"results"`
	Claims  []Claim  `json:"claims,omitempty"`
	// LargestModel is how each model fared in LargestModel's search.
	LargestModel []ModelFit `json:"largest_model,omitempty"`
	Notes        []string   `json:"notes,omitempty"`
}

type rowKey struct {
	model  string
	batch  int
	config string
}

// configOrder is where reports list the configuration named name.
func configOrder(name string) int {
	names := ConfigNames()
	if i := slices.Index(names, name); i >= 0 {
		return i
	}
	return len(names)
}

// The engines a report holds: leangrad's step as the trainer runs it
// (captured on a GPU), leangrad's eager step, PyTorch eager, and PyTorch
// under torch.compile (mode "reduce-overhead", for language models its
// default; benchmarks/pytorch/ref.py).
const (
	engineLeangrad = "leangrad"
	engineEager    = "leangrad-eager"
	enginePyTorch  = "pytorch"
	engineCompile  = "pytorch-compile"
)

// table indexes the results by engine and spec, and lists leangrad's specs
// in model, batch, configuration order.
func (r *Report) table() (keys []rowKey, by map[string]map[rowKey]Result) {
	by = map[string]map[rowKey]Result{}
	for _, x := range r.Results {
		k := rowKey{x.Model, x.Batch, x.Config}
		if by[x.Engine] == nil {
			by[x.Engine] = map[rowKey]Result{}
		}
		by[x.Engine][k] = x
		if x.Engine == engineLeangrad {
			keys = append(keys, k)
		}
	}
	sort.SliceStable(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.model != b.model {
			return a.model > b.model // resnet20, resnet18, mlp
		}
		if a.batch != b.batch {
			return a.batch < b.batch
		}
		return configOrder(a.config) < configOrder(b.config)
	})
	return keys, by
}

func ratio(a, b float64) string {
	if a == 0 || b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", a/b)
}

func ms(r Result, ok bool) string {
	if !ok || r.MedianMS == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", r.MedianMS)
}

// hasLanguageModel says whether a language model is among the results.
func (r *Report) hasLanguageModel() bool {
	for _, x := range r.Results {
		if m, err := train.LookupArch(x.Model); err == nil && m.Text {
			return true
		}
	}
	return false
}

// Markdown writes the side-by-side table, the claims and the notes.
func (r *Report) Markdown(w io.Writer) {
	fmt.Fprintf(w, "Benchmarks on %s, %s", r.Device, r.Date)
	if r.Commit != "" {
		fmt.Fprintf(w, ", leangrad at %s", r.Commit)
	}
	switch {
	case r.PyTorch == "":
	case strings.HasPrefix(r.Device, "cpu"):
		fmt.Fprintf(w, ", beside PyTorch %s eager on the same CPU cores (its CPU allocator reports no peaks)", r.PyTorch)
	default:
		compiled := `torch.compile(mode="reduce-overhead") (Inductor with CUDA graphs)`
		if r.hasLanguageModel() {
			compiled += ", for language models torch.compile in its default mode"
		}
		fmt.Fprintf(w, ", beside PyTorch %s on the same GPU: eager, and %s; "+
			"both with cudnn.benchmark and PyTorch's default TF32 policy (convolutions may use TF32, matmuls do not); leangrad's convolutions alike, its F32 matmuls as below",
			r.PyTorch, compiled)
	}
	if len(r.Results) == 0 {
		fmt.Fprintln(w, ".")
	} else {
		r.resultsTable(w)
	}
	r.claimsMarkdown(w)
}

// resultsTable writes the timed results, and what the planned steps hold
// at their peaks.
func (r *Report) resultsTable(w io.Writer) {
	fmt.Fprintln(w, ". Median step time over the timed steps, each synchronised with the device; "+
		"speed ratios are leangrad's img/s over the other's; peaks from each engine's allocator over the timed steps.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| model | batch | config | leangrad ms | leangrad eager ms | PyTorch eager ms | torch.compile ms | vs eager | vs compile | leangrad peak alloc | PyTorch eager peak alloc | alloc ratio | leangrad reserved / peak | launches/step | host ms/step |")
	fmt.Fprintln(w, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	keys, by := r.table()
	for _, k := range keys {
		a := by[engineLeangrad][k]
		e, eok := by[engineEager][k]
		p, pok := by[enginePyTorch][k]
		c, cok := by[engineCompile][k]
		palloc := "–"
		if pok && p.PeakAllocated > 0 {
			palloc = fmt.Sprintf("%.1f MiB", memory.Bytes(p.PeakAllocated).MiB())
		}
		launches := "–"
		if a.LaunchesPerStep > 0 {
			launches = fmt.Sprintf("%.0f", a.LaunchesPerStep)
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %.1f MiB | %s | %s | %s | %s | %.2f |\n",
			k.model, k.batch, k.config, ms(a, true), ms(e, eok), ms(p, pok), ms(c, cok),
			ratio(p.MedianMS, a.MedianMS), ratio(c.MedianMS, a.MedianMS),
			memory.Bytes(a.PeakAllocated).MiB(), palloc, ratio(float64(a.PeakAllocated), float64(p.PeakAllocated)),
			ratio(float64(a.PeakReserved), float64(a.PeakAllocated)), launches, a.HostMS)
	}
	var compiles []string
	for _, k := range keys {
		if c, ok := by[engineCompile][k]; ok && c.CompileSeconds > 0 {
			compiles = append(compiles, fmt.Sprintf("%s/%d/%s %.0f s", k.model, k.batch, k.config, c.CompileSeconds))
		}
	}
	if len(compiles) > 0 {
		fmt.Fprintf(w, "\ntorch.compile's compilation (the first steps, not in the step times): %s.\n", strings.Join(compiles, ", "))
	}
	first := true
	for _, k := range keys {
		p := by[engineLeangrad][k].Peak
		if p == nil {
			continue
		}
		if first {
			fmt.Fprintln(w, "\nWhat leangrad's planned steps hold at their arenas' peaks (the traced step's roles, memory.Role):")
			fmt.Fprintln(w)
			first = false
		}
		fmt.Fprintf(w, "- %s %d %s: %.1f MiB during %s: %s", k.model, k.batch, k.config, memory.Bytes(p.Allocated).MiB(), p.Phase, p.Kinds())
		if by := p.SavedBy(5); by != "" {
			fmt.Fprintf(w, "; saved by %s", by)
		}
		fmt.Fprintln(w)
	}
}

// claimsMarkdown writes the seed claims, the largest model's search and
// the notes.
func (r *Report) claimsMarkdown(w io.Writer) {
	if len(r.Claims) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Seed claims:")
		fmt.Fprintln(w)
		for _, c := range r.Claims {
			fmt.Fprintf(w, "- **%s** — *%s*: %s. %s\n", c.Verdict, c.Claim, c.Name, c.Summary)
		}
	}
	if len(r.LargestModel) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| model | parameters | trains in | tokens/s | peak allocated | before it |")
		fmt.Fprintln(w, "|---|---:|---|---:|---:|---|")
		for _, f := range r.LargestModel {
			tried := strings.Join(f.Tried, "; ")
			if f.Config == "" {
				fmt.Fprintf(w, "| %s | %s | nothing | | | %s |\n", f.Model, countParams(f.Params), tried)
				continue
			}
			fmt.Fprintf(w, "| %s | %s | %s | %.0f | %s | %s |\n", f.Model, countParams(f.Params), f.Config, f.TokensPerS, memory.Bytes(f.PeakAllocated), tried)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "\n%s\n", n)
	}
}

var engineColors = map[string]color.Color{
	engineLeangrad: color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	engineEager:    color.RGBA{R: 0x9e, G: 0xc9, B: 0xe2, A: 0xff},
	enginePyTorch:  color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	engineCompile:  color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
}

// ConfigColor is configuration name's colour in every plot: fp32 blue,
// AMP orange (in any dtype: amp, f16, bf16), checkpoint green, AMP with
// checkpointing purple, anything else grey.
func ConfigColor(name string) color.Color {
	amp, ckpt := false, false
	for _, part := range strings.Split(name, "+") {
		switch part {
		case "amp", "f16", "bf16":
			amp = true
		case "checkpoint":
			ckpt = true
		case "fp32":
		default:
			return color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}
		}
	}
	switch {
	case amp && ckpt:
		return color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}
	case ckpt:
		return color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
	case amp:
		return color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	}
	return color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
}

// LegendRoom raises p's Y axis above the data's top, max, so that a
// legend at the top sits over empty space, not over the lines: n entries.
func LegendRoom(p *plot.Plot, max float64, n int) {
	p.Y.Max = max * (1 + 0.09*float64(n) + 0.05)
}

// PlotBars draws one metric per spec: a panel per model and batch, each
// with its own axis (a small model's bars do not vanish beside a large
// one's), its configurations along it and each engine's bar side by side
// above its label.
func (r *Report) PlotBars(path, title, ylabel string, metric func(Result) float64) error {
	keys, by := r.table()
	var engines []string
	for _, e := range []string{engineLeangrad, engineEager, enginePyTorch, engineCompile} {
		if len(by[e]) > 0 {
			engines = append(engines, e)
		}
	}
	type panel struct {
		model string
		batch int
		keys  []rowKey
	}
	var panels []*panel
	for _, k := range keys {
		if n := len(panels); n == 0 || panels[n-1].model != k.model || panels[n-1].batch != k.batch {
			panels = append(panels, &panel{model: k.model, batch: k.batch})
		}
		panels[len(panels)-1].keys = append(panels[len(panels)-1].keys, k)
	}
	if len(panels) == 0 {
		return fmt.Errorf("%s: no results to plot", path)
	}
	w := vg.Points(min(14, 60/float64(len(engines))))
	plots := make([][]*plot.Plot, 1)
	most := 0 // configurations in the widest panel: the tiles are equal
	for i, pn := range panels {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s, batch %d", pn.model, pn.batch)
		if i == 0 {
			p.Y.Label.Text = ylabel
		}
		var names []string
		top := 0.0
		for _, k := range pn.keys {
			names = append(names, k.config)
		}
		for e, engine := range engines {
			vals := make(plotter.Values, len(pn.keys))
			for j, k := range pn.keys {
				if x, ok := by[engine][k]; ok {
					vals[j] = metric(x)
					top = max(top, vals[j])
				}
			}
			bars, err := plotter.NewBarChart(vals, w)
			if err != nil {
				return err
			}
			bars.Color = engineColors[engine]
			bars.LineStyle.Width = 0
			bars.Offset = w * vg.Length(2*e-len(engines)+1) / 2
			p.Add(bars)
			if i == len(panels)-1 {
				p.Legend.Add(engine, bars)
			}
		}
		p.Y.Min = 0
		LegendRoom(p, top, len(engines))
		p.Legend.Top = true
		p.Legend.XOffs = -vg.Points(6)
		p.NominalX(names...)
		p.X.Min, p.X.Max = -0.7, float64(len(names))-0.3 // room beside the outer bars
		p.X.Tick.Label.Rotation = 0.5
		p.X.Tick.Label.XAlign = draw.XRight // the label ends under its bars
		p.X.Tick.Label.YAlign = draw.YTop
		plots[0] = append(plots[0], p)
		most = max(most, len(pn.keys))
	}
	width := vg.Length(len(panels)) * (vg.Length(most)*(w*vg.Length(len(engines))+vg.Points(22)) + vg.Inch*0.9)
	img := vgimg.New(max(width, 5*vg.Inch), 5*vg.Inch)
	dc := draw.New(img)
	t := plot.New()
	t.Title.Text = title
	t.HideAxes()
	t.Draw(dc)
	body := draw.Crop(dc, 0, 0, 0, -0.35*vg.Inch)
	canvases := plot.Align(plots, draw.Tiles{Rows: 1, Cols: len(plots[0]), PadX: vg.Points(12), PadY: vg.Points(6)}, body)
	for j, p := range plots[0] {
		p.Draw(canvases[0][j])
	}
	return fileio.Write(path, func(out io.Writer) error {
		_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(out)
		return err
	})
}

// PlotTimelines draws, for each model and batch, allocated bytes over one
// training step of every configuration, from leangrad's recorder.
func (r *Report) PlotTimelines(dir string) ([]string, error) {
	groups := map[string][]Result{}
	var order []string
	for _, x := range r.Results {
		if x.Engine != engineLeangrad || len(x.Timeline) == 0 {
			continue
		}
		k := fmt.Sprintf("%s_b%d", x.Model, x.Batch)
		if groups[k] == nil {
			order = append(order, k)
		}
		groups[k] = append(groups[k], x)
	}
	var paths []string
	for _, k := range order {
		p := plot.New()
		p.Title.Text = "allocated bytes during one training step, " + strings.Replace(k, "_b", ", batch ", 1)
		p.X.Label.Text = "ms since the step started"
		p.Y.Label.Text = "MiB allocated"
		top := 0.0
		for _, x := range groups[k] {
			var xy plotter.XYs
			var t0 float64
			for j, e := range x.Timeline {
				if j == 0 {
					t0 = e.Time.Seconds()
				}
				if e.Kind == memory.EventAlloc || e.Kind == memory.EventFree || e.Kind == memory.EventMark {
					xy = append(xy, plotter.XY{X: (e.Time.Seconds() - t0) * 1e3, Y: memory.Bytes(e.Allocated).MiB()})
				}
			}
			if len(xy) == 0 {
				continue
			}
			line, err := plotter.NewLine(xy)
			if err != nil {
				return nil, err
			}
			line.Color = ConfigColor(x.Config)
			line.Width = vg.Points(1.2)
			p.Add(line)
			p.Legend.Add(x.Config, line)
			for _, v := range xy {
				top = max(top, v.Y)
			}
		}
		p.Legend.Top = true
		p.Y.Min = 0
		LegendRoom(p, top, len(groups[k]))
		path := fmt.Sprintf("%s/timeline_%s.png", dir, k)
		if err := save(p, path, 8*vg.Inch, 4*vg.Inch); err != nil {
			return nil, err
		}
		paths = append(paths, path)
	}
	return paths, nil
}

func save(p *plot.Plot, path string, w, h vg.Length) error {
	wt, err := p.WriterTo(w, h, "png")
	if err != nil {
		return err
	}
	return fileio.Write(path, func(out io.Writer) error {
		_, err := wt.WriteTo(out)
		return err
	})
}
