// Package report draws a training run's metrics as one picture to share:
// four panels against the step — loss (with eval loss), learning rate,
// step time and tokens per second — with a line per rank where ranks
// differ (step time and throughput), from the metrics.<rank>.jsonl files
// the workers write (event.MetricsFile).
//
// It uses gonum.org/v1/plot, drawing into an image in memory; nothing is
// shown on screen, so it works on a cluster node without a display.
package report

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/gptui/gptui/event"
)

// dpi is the resolution of the picture: Options.Width and Height are in
// pixels at this resolution.
const dpi = 96

// Options says what picture Draw makes.
type Options struct {
	Width, Height int    // pixels; 0 means 1200 × 900
	Title         string // above the panels; "" for none
}

// Runs is the metrics of a run, by rank.
type Runs map[int][]event.Metrics

// ErrNoMetrics is the error of Load and Draw when there is nothing to draw.
var ErrNoMetrics = errors.New("report: no metrics records")

// Load reads the metrics files of every rank in the log directories dirs
// (a multi-node run has one per node). A rank found twice keeps the
// records of the directory listed first.
func Load(dirs ...string) (Runs, error) {
	runs := Runs{}
	for _, dir := range dirs {
		files, err := event.MetricsFiles(dir)
		if err != nil {
			return nil, fmt.Errorf("report: %w", err)
		}
		for r, path := range files {
			if _, ok := runs[r]; ok {
				continue
			}
			f, err := os.Open(path)
			if err != nil {
				return nil, fmt.Errorf("report: %w", err)
			}
			ms, err := event.ReadMetrics(path, f)
			f.Close()
			if err != nil {
				return nil, fmt.Errorf("report: %w", err)
			}
			if len(ms) > 0 {
				runs[r] = ms
			}
		}
	}
	if len(runs) == 0 {
		return nil, fmt.Errorf("%w in %v (metrics.<rank>.jsonl files: is it the log directory, Engine.log_dir?)", ErrNoMetrics, dirs)
	}
	return runs, nil
}

// Draw writes the PNG picture of runs to w.
func Draw(w io.Writer, runs Runs, o Options) error {
	if len(runs) == 0 {
		return ErrNoMetrics
	}
	if o.Width <= 0 || o.Height <= 0 {
		o.Width, o.Height = 1200, 900
	}
	ranks := slices.Sorted(func(yield func(int) bool) {
		for r := range runs {
			if !yield(r) {
				return
			}
		}
	})
	first := runs[ranks[0]] // the loss and the schedule are the same on every rank

	loss := newPlot("loss", "")
	if err := addLine(loss, "train", series(first, func(m event.Metrics) (float64, bool) { return m.Loss, m.EvalLoss == 0 }), 0); err != nil {
		return err
	}
	if ev := series(first, func(m event.Metrics) (float64, bool) { return m.EvalLoss, m.EvalLoss != 0 }); len(ev) > 0 {
		s, err := plotter.NewScatter(ev)
		if err != nil {
			return fmt.Errorf("report: %w", err)
		}
		s.GlyphStyle.Color = palette(1)
		s.GlyphStyle.Radius = vg.Points(3)
		loss.Add(s)
		loss.Legend.Add("eval", s)
	}
	lr := newPlot("learning rate", "")
	if err := addLine(lr, "", series(first, func(m event.Metrics) (float64, bool) { return m.LR, m.EvalLoss == 0 }), 0); err != nil {
		return err
	}
	stepTime := newPlot("step time", "s")
	tps := newPlot("throughput", "tokens/s")
	for i, r := range ranks {
		name := fmt.Sprintf("rank %d", r)
		if len(ranks) > 8 {
			name = "" // too many to name
		}
		ms := runs[r]
		if err := addLine(stepTime, name, series(ms, func(m event.Metrics) (float64, bool) { return m.StepTimeS, m.StepTimeS > 0 }), i); err != nil {
			return err
		}
		if err := addLine(tps, name, series(ms, func(m event.Metrics) (float64, bool) { return m.TokensPerS, m.TokensPerS > 0 }), i); err != nil {
			return err
		}
	}

	for _, p := range []*plot.Plot{loss, lr, stepTime, tps} {
		padFlat(p)
	}
	width := vg.Length(o.Width) * vg.Inch / dpi
	height := vg.Length(o.Height) * vg.Inch / dpi
	img := vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(dpi))
	dc := draw.New(img)
	if o.Title != "" {
		title := dc
		title.Min.Y = title.Max.Y - 0.6*vg.Centimeter
		f := plot.DefaultFont
		f.Size = vg.Points(14)
		title.FillText(draw.TextStyle{Color: color.Black, Font: f, XAlign: draw.XCenter, YAlign: draw.YTop, Handler: plot.DefaultTextHandler},
			vg.Point{X: (title.Min.X + title.Max.X) / 2, Y: title.Max.Y}, o.Title)
		dc.Max.Y -= 0.8 * vg.Centimeter
	}
	tiles := draw.Tiles{Rows: 2, Cols: 2, PadX: vg.Centimeter, PadY: vg.Centimeter,
		PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 3}
	plots := [][]*plot.Plot{{loss, lr}, {stepTime, tps}}
	canvases := plot.Align(plots, tiles, dc)
	for y := range plots {
		for x := range plots[y] {
			plots[y][x].Draw(canvases[y][x])
		}
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("report: writing the PNG: %w", err)
	}
	return nil
}

// WriteFile writes the PNG picture of runs to path: under a temporary name
// in its directory, renamed when complete, so that there is never half a
// picture at path.
func WriteFile(path string, runs Runs, o Options) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".report-*.png")
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	defer os.Remove(tmp.Name())
	err = Draw(tmp, runs, o)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("report: writing %s: %w", path, err)
	}
	return nil
}

// padFlat gives a panel whose values are all one (a constant learning
// rate) a range of ±10% around it, where the plot would centre it in
// ±1 and label its ticks as 0.
func padFlat(p *plot.Plot) {
	if p.Y.Max > p.Y.Min {
		return
	}
	v := p.Y.Min
	d := 0.1 * math.Abs(v)
	if d == 0 {
		d = 1
	}
	p.Y.Min, p.Y.Max = v-d, v+d
}

// newPlot returns a panel titled title with the step on X.
func newPlot(title, unit string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "step"
	p.Y.Label.Text = unit
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	return p
}

// series returns the points (step, f(record)) of the records f keeps.
func series(ms []event.Metrics, f func(event.Metrics) (float64, bool)) plotter.XYs {
	var pts plotter.XYs
	for _, m := range ms {
		if v, ok := f(m); ok {
			pts = append(pts, plotter.XY{X: float64(m.Step), Y: v})
		}
	}
	return pts
}

// addLine adds pts to p as a line in the i-th colour, named in the legend
// unless name is "".
func addLine(p *plot.Plot, name string, pts plotter.XYs, i int) error {
	if len(pts) == 0 {
		return nil
	}
	l, err := plotter.NewLine(pts)
	if err != nil {
		return fmt.Errorf("report: %s: %w", p.Title.Text, err)
	}
	l.Color = palette(i)
	l.Width = vg.Points(1.2)
	p.Add(l)
	if name != "" {
		p.Legend.Add(name, l)
	}
	return nil
}

// palette returns the i-th of a few distinct colours.
func palette(i int) color.Color {
	cs := []color.RGBA{
		{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255},
		{148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255},
	}
	return cs[i%len(cs)]
}
