package benchmarks

import (
	"fmt"
	"image/color"
	"io"
	"sort"
	"strings"

	"github.com/leangrad/leangrad/internal/atomicfile"
	"github.com/leangrad/leangrad/memory"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Report is everything one harness run produced.
type Report struct {
	Date    string   `json:"date"`
	Device  string   `json:"device"`
	PyTorch string   `json:"pytorch,omitempty"` // version, when it ran
	Results []Result `json:"results"`
	Claims  []Claim  `json:"claims,omitempty"`
	Notes   []string `json:"notes,omitempty"`
}

type rowKey struct {
	model  string
	batch  int
	config string
}

func configOrder(name string) int {
	for i, c := range Configs {
		if c.Name == name {
			return i
		}
	}
	return len(Configs)
}

// rows pairs each leangrad result with PyTorch's for the same spec, in
// model, batch, configuration order.
func (r *Report) rows() (keys []rowKey, lg, pt map[rowKey]Result) { return r.rowsOf("leangrad") }

// rowsOf is rows for one of leangrad's engines ("leangrad", "leangrad-lean").
func (r *Report) rowsOf(engine string) (keys []rowKey, lg, pt map[rowKey]Result) {
	lg, pt = map[rowKey]Result{}, map[rowKey]Result{}
	for _, x := range r.Results {
		k := rowKey{x.Model, x.Batch, x.Config}
		switch x.Engine {
		case "pytorch":
			pt[k] = x
		case engine:
			lg[k] = x
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
	return keys, lg, pt
}

func ratio(a, b float64) string {
	if a == 0 || b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", a/b)
}

// Markdown writes the side-by-side table, the claims and the notes.
func (r *Report) Markdown(w io.Writer) {
	fmt.Fprintf(w, "Benchmarks on %s, %s", r.Device, r.Date)
	if r.PyTorch != "" {
		fmt.Fprintf(w, ", beside PyTorch %s (eager, cudnn.benchmark, TF32 off) on the same GPU", r.PyTorch)
	}
	fmt.Fprintln(w, ". Median step time over the timed steps, each synchronised with the device; peaks from each engine's allocator over those steps.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| model | batch | config | leangrad ms | PyTorch ms | leangrad img/s | PyTorch img/s | img/s ratio | leangrad peak alloc | PyTorch peak alloc | alloc ratio | saving vs fp32 (lg / pt) | time vs fp32 (lg / pt) | launches/step | host ms/step |")
	fmt.Fprintln(w, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	keys, lg, pt := r.rows()
	for _, k := range keys {
		a, b := lg[k], pt[k]
		pms, pimg, palloc, psave, pover := "–", "–", "–", "–", "–"
		if b.MedianMS > 0 {
			pms, pimg, palloc = fmt.Sprintf("%.2f", b.MedianMS), fmt.Sprintf("%.0f", b.ImgPerSec), fmt.Sprintf("%.1f MiB", mib(b.PeakAllocated))
			psave, pover = fmt.Sprintf("%.0f%%", 100*b.SavingVsFP32), fmt.Sprintf("%+.0f%%", 100*b.OverheadFP32)
		}
		launches := "–"
		if a.LaunchesPerStep > 0 {
			launches = fmt.Sprintf("%.0f", a.LaunchesPerStep)
		}
		fmt.Fprintf(w, "| %s | %d | %s | %.2f | %s | %.0f | %s | %s | %.1f MiB | %s | %s | %.0f%% / %s | %+.0f%% / %s | %s | %.2f |\n",
			k.model, k.batch, k.config, a.MedianMS, pms, a.ImgPerSec, pimg, ratio(a.ImgPerSec, b.ImgPerSec),
			mib(a.PeakAllocated), palloc, ratio(float64(a.PeakAllocated), float64(b.PeakAllocated)),
			100*a.SavingVsFP32, psave, 100*a.OverheadFP32, pover, launches, a.HostMS)
	}
	if keys, lean, pt := r.rowsOf("leangrad-lean"); len(keys) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "The same with lean convolution workspaces (`cuda.Options{LeanConvWorkspace: true}`, `train -conv-workspace lean`): each cuDNN algorithm's workspace at most its larger tensor, instead of the fastest algorithm.")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| model | batch | config | lean ms | PyTorch ms | img/s ratio | lean peak alloc | PyTorch peak alloc | alloc ratio | saving vs fp32 |")
		fmt.Fprintln(w, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
		for _, k := range keys {
			a, b := lean[k], pt[k]
			pms, palloc := "–", "–"
			if b.MedianMS > 0 {
				pms, palloc = fmt.Sprintf("%.2f", b.MedianMS), fmt.Sprintf("%.1f MiB", mib(b.PeakAllocated))
			}
			fmt.Fprintf(w, "| %s | %d | %s | %.2f | %s | %s | %.1f MiB | %s | %s | %.0f%% |\n", k.model, k.batch, k.config,
				a.MedianMS, pms, ratio(a.ImgPerSec, b.ImgPerSec), mib(a.PeakAllocated), palloc,
				ratio(float64(a.PeakAllocated), float64(b.PeakAllocated)), 100*a.SavingVsFP32)
		}
	}
	if len(r.Claims) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Seed claims:")
		fmt.Fprintln(w)
		for _, c := range r.Claims {
			fmt.Fprintf(w, "- **%s** — *%s*: %s. %s\n", c.Verdict, c.Claim, c.Name, c.Summary)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "\n%s\n", n)
	}
}

var engineColors = map[string]color.Color{
	"leangrad": color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	"pytorch":  color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
}

// PlotBars draws one metric per spec, leangrad's and PyTorch's bars side by side.
func (r *Report) PlotBars(path, title, ylabel string, metric func(Result) float64) error {
	keys, lg, pt := r.rows()
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	var names []string
	for _, k := range keys {
		names = append(names, fmt.Sprintf("%s/%d\n%s", k.model, k.batch, k.config))
	}
	w := vg.Points(7)
	for i, engine := range []string{"leangrad", "pytorch"} {
		vals := make(plotter.Values, len(keys))
		any := false
		for j, k := range keys {
			src := lg
			if engine == "pytorch" {
				src = pt
			}
			if x, ok := src[k]; ok {
				vals[j] = metric(x)
				any = true
			}
		}
		if !any {
			continue
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Color = engineColors[engine]
		bars.LineStyle.Width = 0
		bars.Offset = w * vg.Length(2*i-1) / 2
		p.Add(bars)
		p.Legend.Add(engine, bars)
	}
	p.Legend.Top = true
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = 0.6
	p.X.Tick.Label.XAlign = -0.1
	return save(p, path, vg.Length(max(8, len(keys)))*vg.Inch*0.55, 5*vg.Inch)
}

// PlotTimelines draws, for each model and batch, allocated bytes over one
// training step of every configuration, from leangrad's recorder.
func (r *Report) PlotTimelines(dir string) ([]string, error) {
	groups := map[string][]Result{}
	var order []string
	for _, x := range r.Results {
		if x.Engine != "leangrad" || len(x.Timeline) == 0 {
			continue
		}
		k := fmt.Sprintf("%s_b%d", x.Model, x.Batch)
		if groups[k] == nil {
			order = append(order, k)
		}
		groups[k] = append(groups[k], x)
	}
	var paths []string
	colors := []color.Color{color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
		color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}}
	for _, k := range order {
		p := plot.New()
		p.Title.Text = "allocated bytes during one training step, " + strings.Replace(k, "_b", ", batch ", 1)
		p.X.Label.Text = "ms since the step started"
		p.Y.Label.Text = "MiB allocated"
		for _, x := range groups[k] {
			var xy plotter.XYs
			var t0 float64
			for j, e := range x.Timeline {
				if j == 0 {
					t0 = e.Time.Seconds()
				}
				if e.Kind == memory.EventAlloc || e.Kind == memory.EventFree || e.Kind == memory.EventMark {
					xy = append(xy, plotter.XY{X: (e.Time.Seconds() - t0) * 1e3, Y: mib(e.Allocated)})
				}
			}
			if len(xy) == 0 {
				continue
			}
			line, err := plotter.NewLine(xy)
			if err != nil {
				return nil, err
			}
			line.Color = colors[configOrder(x.Config)%len(colors)]
			p.Add(line)
			p.Legend.Add(x.Config, line)
		}
		p.Legend.Top = true
		p.Y.Min = 0
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
	return atomicfile.Write(path, func(out io.Writer) error {
		_, err := wt.WriteTo(out)
		return err
	})
}
