// Package report draws a training run's metrics as one picture to share:
// six panels against the step — loss (with eval loss), learning rate,
// step time, tokens per second, every rank's compute time (the step less
// its collectives: the straggler's picture) and the gradient norm — from
// the metrics.<rank>.jsonl files the workers write (event.MetricsFile),
// with the run's restarts, failures, hangs and lost nodes (Mark, found in
// its events by Marker) drawn across every panel. Each axis is labelled
// and each legend stands beside its panel, outside the data. Up to
// maxLines ranks get a line each, in a colour and dash of their own;
// more are drawn as their median, the band from the least to the
// greatest, and the slowest rank's line.
//
// It uses gonum.org/v1/plot, drawing into an image in memory; nothing is
// shown on screen, so it works on a cluster node without a display.
package report

import (
	"errors"
	"fmt"
	"image"
	"image/color"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"

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
	// Marks are the run's restarts, failures, hangs and lost nodes
	// (Marker, ReadMarks), drawn across every panel at their steps.
	Marks []Mark
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
	img, _, err := render(runs, o)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("report: writing the PNG: %w", err)
	}
	return nil
}

// maxLines is the most ranks drawn a line each; beyond, a panel of every
// rank's figure shows the median, the band from the least to the greatest
// and the slowest rank's line.
const maxLines = 8

// legendW is the width of the strip right of each panel that holds its
// legend, outside the data.
const legendW = 118 * vg.Length(1)

// panelPlace is where render put a panel: its title, the rectangle of its
// data in pixels (y down) and the pixel column of a step.
type panelPlace struct {
	title string
	data  image.Rectangle
	x     func(step float64) int
}

// panel is one plot of the picture and its legend, drawn beside it.
type panel struct {
	p      *plot.Plot
	legend plot.Legend
	names  []string // the legend's entries
}

// add adds an entry to the panel's legend.
func (pn *panel) add(name string, thumbs ...plot.Thumbnailer) {
	pn.legend.Add(name, thumbs...)
	pn.names = append(pn.names, name)
}

// render draws runs as the picture and says where its panels are.
func render(runs Runs, o Options) (*vgimg.Canvas, []panelPlace, error) {
	if len(runs) == 0 {
		return nil, nil, ErrNoMetrics
	}
	if o.Width <= 0 || o.Height <= 0 {
		o.Width, o.Height = 1200, 900
	}
	ranks := slices.Sorted(maps.Keys(runs))
	first := runs[ranks[0]] // the loss and the schedule are the same on every rank
	train := func(m event.Metrics) bool { return m.EvalLoss == 0 }

	loss := newPanel("loss", "loss (cross-entropy)")
	if err := loss.line("train", series(first, func(m event.Metrics) (float64, bool) { return m.Loss, train(m) }), 0); err != nil {
		return nil, nil, err
	}
	if ev := series(first, func(m event.Metrics) (float64, bool) { return m.EvalLoss, m.EvalLoss != 0 }); len(ev) > 0 {
		s, err := plotter.NewScatter(ev)
		if err != nil {
			return nil, nil, fmt.Errorf("report: %w", err)
		}
		s.GlyphStyle.Color = palette(1)
		s.GlyphStyle.Radius = vg.Points(3)
		loss.p.Add(s)
		loss.add("eval", s)
	}
	lr := newPanel("learning rate", "learning rate")
	if err := lr.line("", series(first, func(m event.Metrics) (float64, bool) { return m.LR, train(m) }), 0); err != nil {
		return nil, nil, err
	}
	// Every rank's step takes as long as the slowest's (the others wait
	// for it), so step time and throughput are one line, with the band of
	// the ranks' figures where they differ; a straggler shows in the
	// compute time, the step less the time in collectives.
	stepTime := newPanel("step time", "seconds per step")
	tps := newPanel("throughput", "tokens per second")
	compute := newPanel("compute time per rank", "seconds per step, less collectives")
	gnorm := newPanel("gradient norm", "gradient norm")
	for _, f := range []struct {
		pn  *panel
		get func(event.Metrics) (float64, bool)
	}{
		{stepTime, func(m event.Metrics) (float64, bool) { return m.StepTimeS, train(m) && m.StepTimeS > 0 }},
		{tps, func(m event.Metrics) (float64, bool) { return m.TokensPerS, train(m) && m.TokensPerS > 0 }},
	} {
		if err := f.pn.summary(runs, ranks, f.get, false); err != nil {
			return nil, nil, err
		}
	}
	if err := compute.perRank(runs, ranks, func(m event.Metrics) (float64, bool) { return m.ComputeS(), train(m) && m.StepTimeS > 0 }); err != nil {
		return nil, nil, err
	}
	if err := gnorm.line("", series(first, func(m event.Metrics) (float64, bool) { return m.GradNorm, train(m) && m.GradNorm > 0 }), 0); err != nil {
		return nil, nil, err
	}

	panels := [][]*panel{{loss, lr}, {stepTime, tps}, {compute, gnorm}}
	for _, row := range panels {
		for _, pn := range row {
			pn.p.Add(markLines{marks: o.Marks, labels: pn == loss})
			padFlat(pn.p)
		}
	}
	for _, kind := range []string{MarkFailure, MarkHang, MarkLost, MarkRestart} {
		if slices.ContainsFunc(o.Marks, func(m Mark) bool { return m.Kind == kind }) {
			loss.add(kind, markThumb(kind))
		}
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
	tiles := draw.Tiles{Rows: len(panels), Cols: 2, PadX: vg.Centimeter / 2, PadY: vg.Centimeter / 2,
		PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 3}
	plots := make([][]*plot.Plot, len(panels))
	for y, row := range panels {
		for _, pn := range row {
			plots[y] = append(plots[y], pn.p)
		}
	}
	// Each tile keeps a strip on its right for the legend; every tile of
	// a column loses the same, so their data areas stay aligned.
	narrow := dc
	narrow.Max.X -= legendW
	canvases := plot.Align(plots, draw.Tiles{Rows: tiles.Rows, Cols: tiles.Cols, PadX: tiles.PadX + legendW, PadY: tiles.PadY,
		PadTop: tiles.PadTop, PadBottom: tiles.PadBottom, PadLeft: tiles.PadLeft, PadRight: tiles.PadRight}, narrow)
	var places []panelPlace
	px := func(l vg.Length) int { return int(math.Round(float64(l) / float64(vg.Inch) * dpi)) }
	for y, row := range panels {
		for x, pn := range row {
			c := canvases[y][x]
			pn.p.Draw(c)
			strip := c
			strip.Min.X, strip.Max.X = c.Max.X+vg.Millimeter*2, c.Max.X+legendW
			strip.Max.Y -= pn.p.Title.TextStyle.Rectangle(pn.p.Title.Text).Size().Y + pn.p.Title.Padding
			pn.legend.Draw(strip)
			dca := pn.p.DataCanvas(c)
			trX, _ := pn.p.Transforms(&dca)
			places = append(places, panelPlace{
				title: pn.p.Title.Text,
				data:  image.Rect(px(dca.Min.X), px(height-dca.Max.Y), px(dca.Max.X), px(height-dca.Min.Y)),
				x:     func(step float64) int { return px(trX(step)) },
			})
		}
	}
	return img, places, nil
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
	if p.Y.Max > p.Y.Min || math.IsInf(p.Y.Min, 0) || math.IsInf(p.Y.Max, 0) {
		return // a range, or no data at all
	}
	v := p.Y.Min
	d := 0.1 * math.Abs(v)
	if d == 0 {
		d = 1
	}
	p.Y.Min, p.Y.Max = v-d, v+d
}

// newPanel returns a panel titled title with the step on X and ylabel on
// Y, its legend to be drawn beside it (left-aligned, from the top).
func newPanel(title, ylabel string) *panel {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.X.Label.Text = "step"
	p.X.Tick.Marker = stepTicks{}
	p.Y.Label.Text = ylabel
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font.Size = vg.Points(9)
		a.Tick.Label.Font.Size = vg.Points(8)
	}
	p.Add(plotter.NewGrid())
	l := plot.NewLegend()
	l.Top, l.Left = true, true
	l.TextStyle.Font.Size = vg.Points(8)
	l.ThumbnailWidth = vg.Points(16)
	return &panel{p: p, legend: l}
}

// newPlot returns a panel's plot titled title with the step on X and
// ylabel on Y.
func newPlot(title, ylabel string) *plot.Plot { return newPanel(title, ylabel).p }

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

// line adds pts to the panel as a line in the i-th style, named in the
// legend unless name is "".
func (pn *panel) line(name string, pts plotter.XYs, i int) error {
	l, err := addLine(pn.p, pts, i)
	if err != nil || l == nil {
		return err
	}
	if name != "" {
		pn.add(name, l)
	}
	return nil
}

// perRank draws a figure of every rank: a line each, named, up to
// maxLines ranks; beyond, their summary with the slowest rank's line.
func (pn *panel) perRank(runs Runs, ranks []int, f func(event.Metrics) (float64, bool)) error {
	if len(ranks) > maxLines {
		return pn.summary(runs, ranks, f, true)
	}
	for i, r := range ranks {
		if err := pn.line(fmt.Sprintf("rank %d", r), series(runs[r], f), i); err != nil {
			return err
		}
	}
	return nil
}

// summary draws a figure of every rank: one line where there is one
// rank; else the median over the ranks at each step with the band from
// the least to the greatest, and, with slowest, the line of the rank
// whose figure is greatest on average.
func (pn *panel) summary(runs Runs, ranks []int, f func(event.Metrics) (float64, bool), slowest bool) error {
	if len(ranks) == 1 {
		return pn.line("", series(runs[ranks[0]], f), 0)
	}
	byStep := map[float64][]float64{}
	worst, worstMean := -1, math.Inf(-1)
	for _, r := range ranks {
		pts := series(runs[r], f)
		sum := 0.0
		for _, p := range pts {
			byStep[p.X] = append(byStep[p.X], p.Y)
			sum += p.Y
		}
		if len(pts) > 0 && sum/float64(len(pts)) > worstMean {
			worst, worstMean = r, sum/float64(len(pts))
		}
	}
	steps := slices.Sorted(maps.Keys(byStep))
	var med, lo, hi plotter.XYs
	for _, s := range steps {
		vs := byStep[s]
		slices.Sort(vs)
		m := vs[len(vs)/2]
		if len(vs)%2 == 0 {
			m = (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
		}
		med = append(med, plotter.XY{X: s, Y: m})
		lo = append(lo, plotter.XY{X: s, Y: vs[0]})
		hi = append(hi, plotter.XY{X: s, Y: vs[len(vs)-1]})
	}
	if len(med) == 0 {
		return nil
	}
	b := band{lo: lo, hi: hi, color: color.NRGBA{31, 119, 180, 70}}
	pn.p.Add(b)
	pn.add(fmt.Sprintf("least–greatest of %d ranks", len(ranks)), b)
	if err := pn.line(fmt.Sprintf("median of %d ranks", len(ranks)), med, 0); err != nil {
		return err
	}
	if slowest && worst >= 0 {
		return pn.line(fmt.Sprintf("slowest: rank %d", worst), series(runs[worst], f), 3)
	}
	return nil
}

// addLine adds pts to p as a line in the i-th style (colour and dashes):
// nil for no points.
func addLine(p *plot.Plot, pts plotter.XYs, i int) (*plotter.Line, error) {
	if len(pts) == 0 {
		return nil, nil
	}
	l, err := plotter.NewLine(pts)
	if err != nil {
		return nil, fmt.Errorf("report: %s: %w", p.Title.Text, err)
	}
	l.Color = palette(i)
	l.Width = vg.Points(1.2)
	l.Dashes = dashes(i)
	p.Add(l)
	return l, nil
}

// palette returns the i-th of eight distinct colours, none of them the
// red, green, gold or black of the marks.
func palette(i int) color.Color {
	cs := []color.RGBA{
		{31, 119, 180, 255}, {255, 127, 14, 255}, {148, 103, 189, 255}, {140, 86, 75, 255},
		{227, 119, 194, 255}, {127, 127, 127, 255}, {23, 190, 207, 255}, {188, 189, 34, 255},
	}
	return cs[i%len(cs)]
}

// dashes returns the i-th line's dash pattern: lines of equal figures
// (every rank's, when no rank is slow) drawn over each other still show
// each colour.
func dashes(i int) []vg.Length {
	switch i % 4 {
	case 1:
		return []vg.Length{vg.Points(6), vg.Points(3)}
	case 2:
		return []vg.Length{vg.Points(2), vg.Points(2)}
	case 3:
		return []vg.Length{vg.Points(8), vg.Points(2), vg.Points(2), vg.Points(2)}
	}
	return nil
}

// stepTicks are the step axis's ticks: plot's, labelled as whole
// numbers.
type stepTicks struct{}

func (stepTicks) Ticks(min, max float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = strconv.FormatFloat(ts[i].Value, 'f', -1, 64)
		}
	}
	return ts
}

// markStyle is how a mark of kind is drawn.
func markStyle(kind string) draw.LineStyle {
	s := draw.LineStyle{Width: vg.Points(2)}
	switch kind {
	case MarkFailure:
		s.Color = color.RGBA{220, 0, 0, 255}
	case MarkHang:
		s.Color, s.Dashes = color.RGBA{230, 170, 0, 255}, []vg.Length{vg.Points(5), vg.Points(2)}
	case MarkLost:
		s.Color, s.Dashes = color.RGBA{0, 0, 0, 255}, []vg.Length{vg.Points(2), vg.Points(2)}
	default:
		s.Color, s.Dashes = color.RGBA{0, 160, 0, 255}, []vg.Length{vg.Points(6), vg.Points(3)}
	}
	return s
}

// markThumb is a mark's legend entry: a short vertical line.
type markThumb string

func (k markThumb) Thumbnail(c *draw.Canvas) {
	x := (c.Min.X + c.Max.X) / 2
	c.StrokeLine2(markStyle(string(k)), x, c.Min.Y, x, c.Max.Y)
}

// markLines draws the marks as vertical lines across a panel, with their
// labels when labels is set.
type markLines struct {
	marks  []Mark
	labels bool
}

func (ml markLines) Plot(c draw.Canvas, p *plot.Plot) {
	trX, _ := p.Transforms(&c)
	f := plot.DefaultFont
	f.Size = vg.Points(7)
	sty := draw.TextStyle{Color: color.Black, Font: f, XAlign: draw.XLeft, YAlign: draw.YTop, Handler: plot.DefaultTextHandler}
	for i, m := range ml.marks {
		x := trX(float64(m.Step))
		if x < c.Min.X-1 || x > c.Max.X+1 {
			continue
		}
		// Marks at one step (a failure and the restart from its step)
		// stand side by side, in the order they happened.
		for _, o := range ml.marks[:i] {
			if o.Step == m.Step {
				x += vg.Points(3)
			}
		}
		c.StrokeLine2(markStyle(m.Kind), x, c.Min.Y, x, c.Max.Y)
		if ml.labels {
			// Staggered, so that marks close together stay legible.
			y := c.Max.Y - vg.Length(i%4)*sty.Height("x")
			c.FillText(sty, vg.Point{X: x + vg.Points(2), Y: y}, m.Label)
		}
	}
}

// DataRange makes the step range hold every mark.
func (ml markLines) DataRange() (xmin, xmax, ymin, ymax float64) {
	xmin, xmax = math.Inf(1), math.Inf(-1)
	for _, m := range ml.marks {
		xmin, xmax = math.Min(xmin, float64(m.Step)), math.Max(xmax, float64(m.Step))
	}
	return xmin, xmax, math.Inf(1), math.Inf(-1)
}

// band fills the area between lo and hi, which share their steps.
type band struct {
	lo, hi plotter.XYs
	color  color.Color
}

func (b band) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	var pts []vg.Point
	for _, q := range b.hi {
		pts = append(pts, vg.Point{X: trX(q.X), Y: trY(q.Y)})
	}
	for i := len(b.lo) - 1; i >= 0; i-- {
		pts = append(pts, vg.Point{X: trX(b.lo[i].X), Y: trY(b.lo[i].Y)})
	}
	c.FillPolygon(b.color, c.ClipPolygonXY(pts))
}

func (b band) DataRange() (xmin, xmax, ymin, ymax float64) {
	xmin, xmax, ymin, ymax = plotter.XYRange(b.lo)
	_, _, _, ymax = plotter.XYRange(b.hi)
	return
}

func (b band) Thumbnail(c *draw.Canvas) {
	c.FillPolygon(b.color, []vg.Point{c.Min, {X: c.Max.X, Y: c.Min.Y}, c.Max, {X: c.Min.X, Y: c.Max.Y}})
}
