// Package report draws a training run's metrics as one picture to share:
// six panels against the step — loss (with eval loss), learning rate,
// step time, tokens per second, every rank's compute time (the step less
// its collectives: the straggler's picture) and the gradient norm — from
// the metrics.<rank>.jsonl files the workers write (event.MetricsFile).
// Each axis is labelled, the step axis with several ticks, and each
// legend stands beside its panel, outside the data. Up to maxLines ranks
// get a line each, in a colour and dash of their own; more are drawn as
// their median, the band from the least to the greatest, and the slowest
// rank's line. Several runs (LoadRuns, DrawRuns) are drawn side by side
// on each panel, a colour and dash each, named in the legends: each run's
// line, or the median of its ranks with their band.
//
// The run's stops, failures, hangs, lost nodes, restarts, drops and
// re-plans (Mark, found in its events by Marker) are drawn across every
// panel at their steps, each kind in a colour and dash of its own. Above
// the top panels each mark has a numbered tag, at its line or moved aside
// so that no two tags overlap; below the panels the marks' legend gives,
// for each number, the kind's line, its colour, its step and what
// happened. Every text of the picture is at least 12 pixels high, and none
// is cut at its edges.
//
// It uses gonum.org/v1/plot, drawing into an image in memory; nothing is
// shown on screen, so it works on a cluster node without a display.
package report

import (
	"cmp"
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
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/gptui/gptui/event"
)

// dpi is the resolution of the picture: Options.Width and Height are in
// pixels at this resolution, where a point is 4/3 of a pixel.
const dpi = 96

// Sizes of the picture's texts, in points: 9 points are 12 pixels.
const (
	titleSize      = 14 // the picture's title
	panelTitleSize = 11 // a panel's title
	axisSize       = 10 // an axis's label
	tickSize       = 9  // a tick's label
	legendSize     = 9  // a legend's entry
	labelSize      = 11 // a mark's tag and its entry in the marks' legend
)

// Options says what picture Draw makes.
type Options struct {
	Width, Height int    // pixels; 0 means 1200 × 900
	Title         string // above the panels; "" for none
	// Marks are the run's stops, failures, hangs, lost nodes, restarts,
	// drops and re-plans (Marker, ReadMarks), drawn across every panel
	// at their steps, numbered in the order given.
	Marks []Mark
}

// Runs is the metrics of a run, by rank.
type Runs map[int][]event.Metrics

// ErrNoMetrics is the error of Load and Draw when there is nothing to draw.
var ErrNoMetrics = errors.New("report: no metrics records")

// Load reads the metrics files of every rank in the log directories dirs
// as one run (a multi-node run has one per node). A rank found twice keeps
// the records of the directory listed first. LoadRuns tells several runs
// apart.
func Load(dirs ...string) (Runs, error) {
	runs := Runs{}
	for _, dir := range dirs {
		rs, err := loadDir(dir)
		if err != nil {
			return nil, err
		}
		for r, ms := range rs {
			if _, ok := runs[r]; !ok {
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
	return DrawRuns(w, []Run{{Ranks: runs}}, o)
}

// DrawRuns writes the PNG picture of several runs to w, each named in the
// legends where there are several.
func DrawRuns(w io.Writer, runs []Run, o Options) error {
	img, _, err := render(runs, o, true)
	if err != nil {
		return err
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
	return WriteRunsFile(path, []Run{{Ranks: runs}}, o)
}

// WriteRunsFile writes the PNG picture of several runs to path, as
// WriteFile does.
func WriteRunsFile(path string, runs []Run, o Options) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".report-*.png")
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	defer os.Remove(tmp.Name())
	err = DrawRuns(tmp, runs, o)
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

// maxLines is the most ranks drawn a line each; beyond, a panel of every
// rank's figure shows the median, the band from the least to the greatest
// and the slowest rank's line.
const maxLines = 8

// legendW is the width of the strip right of each panel that holds its
// legend, outside the data.
const legendW = 118 * vg.Length(1)

// layout is where render put the parts of the picture, in pixels (y
// down): what the tests check.
type layout struct {
	panels []panelPlace
	// labels are the marks' tags and the entries of their legend.
	labels []labelPlace
}

// panelPlace is where render put a panel: its title, the rectangle of its
// data, the pixel column of a step and of each mark, and its legend.
type panelPlace struct {
	title  string
	data   image.Rectangle
	x      func(step float64) int
	marks  []int           // the column of each mark's line
	ticks  []string        // the step axis's tick labels
	legend []string        // the legend's entries, as drawn
	key    image.Rectangle // the legend's rectangle
}

// labelPlace is a label of a mark: its text and the rectangle that holds
// it (its frame, or its legend entry's line, text and frame).
type labelPlace struct {
	mark int // its index in Options.Marks
	text string
	box  image.Rectangle
	size vg.Length // the font's size
}

// panel is one plot of the picture and its legend, drawn beside it.
type panel struct {
	p      *plot.Plot
	legend plot.Legend
	names  []string // the legend's entries
}

// add adds an entry to the panel's legend, shortened to fit its strip.
func (pn *panel) add(name string, thumbs ...plot.Thumbnailer) {
	room := legendW - vg.Millimeter*2 - pn.legend.ThumbnailWidth - pn.legend.TextStyle.Width(" ")
	name = fit(pn.legend.TextStyle, name, room)
	pn.legend.Add(name, thumbs...)
	pn.names = append(pn.names, name)
}

// render draws runs as the picture and says where its parts are; text
// false leaves the marks' labels without their text (the tests find the
// text's pixels by the difference).
func render(runs []Run, o Options, text bool) (*vgimg.Canvas, layout, error) {
	if len(runs) == 0 || slices.ContainsFunc(runs, func(r Run) bool { return len(r.Ranks) == 0 }) {
		return nil, layout{}, ErrNoMetrics
	}
	if o.Width <= 0 || o.Height <= 0 {
		o.Width, o.Height = 1200, 900
	}
	panels, err := newPanels(runs)
	if err != nil {
		return nil, layout{}, err
	}
	width := vg.Length(o.Width) * vg.Inch / dpi
	height := vg.Length(o.Height) * vg.Inch / dpi
	img := vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(dpi))
	dc := draw.New(img)
	if o.Title != "" {
		sty := textStyle(titleSize)
		sty.XAlign, sty.YAlign = draw.XCenter, draw.YTop
		title := fit(sty, o.Title, dc.Max.X-dc.Min.X-vg.Centimeter)
		dc.FillText(sty, vg.Point{X: (dc.Min.X + dc.Max.X) / 2, Y: dc.Max.Y - vg.Millimeter}, title)
		dc.Max.Y -= sty.Height(title) + vg.Millimeter*3
	}
	// The marks' legend, under the panels.
	var table *markTable
	if len(o.Marks) > 0 {
		table = newMarkTable(o.Marks, dc.Max.X-dc.Min.X-vg.Millimeter*6, height)
		table.origin = vg.Point{X: dc.Min.X + vg.Millimeter*3, Y: dc.Min.Y + vg.Millimeter*2 + table.height}
		dc.Min.Y += table.height + vg.Millimeter*3
	}

	tiles := draw.Tiles{Rows: len(panels), Cols: 2, PadX: vg.Centimeter/2 + legendW, PadY: vg.Millimeter * 3,
		PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 3}
	// Each tile keeps a strip on its right for the legend; every tile of
	// a column loses the same, so their data areas stay aligned.
	narrow := dc
	narrow.Max.X -= legendW
	room := (narrow.Max.X-narrow.Min.X-tiles.PadX-tiles.PadLeft-tiles.PadRight)/2 - vg.Points(60)
	plots := make([][]*plot.Plot, len(panels))
	for y, row := range panels {
		for _, pn := range row {
			pn.p.Add(markLines{marks: o.Marks})
			padFlat(pn.p)
			pn.p.X.Tick.Marker = stepTicks{style: pn.p.X.Tick.Label, room: room}
			plots[y] = append(plots[y], pn.p)
		}
	}
	canvases := plot.Align(plots, tiles, narrow)
	labels := textStyle(labelSize)
	// The tags' lane above the top panels, as high as their rows need
	// (the step's pixels do not depend on it), and no more than a third
	// of a panel's height. A picture too small for it has none: the
	// marks' legend still tells the kinds apart by their lines.
	_, tagH := tagSize(labels, "0")
	laneRows := max(1, min(maxLaneRows, int(((narrow.Max.Y-narrow.Min.Y)/vg.Length(len(panels))/3-leaderGap)/(tagH+rowGap))))
	lane := len(o.Marks) > 0
	if lane {
		rows := 1
		for x, pn := range panels[0] {
			c := canvases[0][x]
			dca := pn.p.DataCanvas(c)
			trX, _ := pn.p.Transforms(&dca)
			_, n := layoutTags(labels, o.Marks, markXs(o.Marks, trX), c.Min.X, c.Max.X, 0, laneRows)
			rows = max(rows, n)
		}
		for _, pn := range panels[0] {
			pn.p.Title.Padding += laneHeight(labels, rows)
		}
		if lanes := plot.Align(plots, tiles, narrow); fits(panels, lanes, dc) {
			canvases = lanes
		} else {
			lane = false
			for _, pn := range panels[0] {
				pn.p.Title.Padding -= laneHeight(labels, rows)
			}
		}
	}
	if !fits(panels, canvases, dc) {
		return nil, layout{}, fmt.Errorf("report: %d×%d pixels are too few for the picture's six panels and their legends: make it larger", o.Width, o.Height)
	}

	var lay layout
	px := func(l vg.Length) int { return int(math.Round(float64(l) / float64(vg.Inch) * dpi)) }
	box := func(r vg.Rectangle) image.Rectangle {
		f := func(l vg.Length) float64 { return float64(l) / float64(vg.Inch) * dpi }
		return image.Rect(int(math.Floor(f(r.Min.X))), int(math.Floor(f(height-r.Max.Y))), int(math.Ceil(f(r.Max.X))), int(math.Ceil(f(height-r.Min.Y))))
	}
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
			xs := markXs(o.Marks, trX)
			place := panelPlace{
				title:  pn.p.Title.Text,
				data:   image.Rect(px(dca.Min.X), px(height-dca.Max.Y), px(dca.Max.X), px(height-dca.Min.Y)),
				x:      func(step float64) int { return px(trX(step)) },
				legend: pn.names,
				key:    box(pn.legend.Rectangle(strip)),
			}
			for _, mx := range xs {
				place.marks = append(place.marks, px(mx))
			}
			for _, t := range pn.p.X.Tick.Marker.Ticks(pn.p.X.Min, pn.p.X.Max) {
				if t.Label != "" {
					place.ticks = append(place.ticks, t.Label)
				}
			}
			lay.panels = append(lay.panels, place)
			if y == 0 && lane {
				tags, _ := layoutTags(labels, o.Marks, xs, c.Min.X, c.Max.X, dca.Max.Y, laneRows)
				drawTags(dc, labels, o.Marks, xs, dca.Max.Y, tags, text)
				for _, t := range tags {
					lay.labels = append(lay.labels, labelPlace{mark: t.mark, text: t.text, box: box(t.rect), size: labels.Font.Size})
				}
			}
		}
	}
	if table != nil {
		for _, e := range table.draw(dc, labels, o.Marks, text) {
			lay.labels = append(lay.labels, labelPlace{mark: e.mark, text: e.text, box: box(e.rect), size: labels.Font.Size})
		}
	}
	return img, lay, nil
}

// fits reports whether the data area of each panel, drawn in its canvas
// of canvases, lies in the picture's area pic and is large enough to draw
// in: 20 points each way at least.
func fits(panels [][]*panel, canvases [][]draw.Canvas, pic draw.Canvas) bool {
	for y, row := range panels {
		for x, pn := range row {
			c := pn.p.DataCanvas(canvases[y][x])
			w, h := float64(c.Max.X-c.Min.X), float64(c.Max.Y-c.Min.Y)
			if !(w >= 20 && h >= 20 && c.Min.X >= pic.Min.X && c.Max.X <= pic.Max.X && c.Min.Y >= pic.Min.Y && c.Max.Y <= pic.Max.Y) {
				return false
			}
		}
	}
	return true
}

// newPanels returns the six panels of runs, by rows of two.
func newPanels(runs []Run) ([][]*panel, error) {
	several := len(runs) > 1
	train := func(m event.Metrics) bool { return m.EvalLoss == 0 }
	loss := newPanel("loss", "cross-entropy")
	lr := newPanel("learning rate", "learning rate")
	// Every rank's step takes as long as the slowest's (the others wait
	// for it), so step time and throughput are one line, with the band of
	// the ranks' figures where they differ; a straggler shows in the
	// compute time, the step less the time in collectives.
	stepTime := newPanel("step time", "seconds")
	tps := newPanel("throughput", "tokens/s")
	compute := newPanel("compute time per rank", "s, less collectives")
	gnorm := newPanel("gradient norm", "norm")
	for i, r := range runs {
		ranks := slices.Sorted(maps.Keys(r.Ranks))
		first := r.Ranks[ranks[0]] // the loss and the schedule are the same on every rank
		name, evalName := "", "eval"
		if several {
			name, evalName = r.Name, r.Name+" eval"
		}
		if err := loss.line(cmp.Or(name, "train"), series(first, func(m event.Metrics) (float64, bool) { return m.Loss, train(m) }), i); err != nil {
			return nil, err
		}
		if ev := series(first, func(m event.Metrics) (float64, bool) { return m.EvalLoss, m.EvalLoss != 0 }); len(ev) > 0 {
			s, err := plotter.NewScatter(ev)
			if err != nil {
				return nil, fmt.Errorf("report: %w", err)
			}
			s.GlyphStyle.Color = palette(1)
			s.GlyphStyle.Radius = vg.Points(3)
			if several {
				s.GlyphStyle.Color, s.GlyphStyle.Shape = palette(i), draw.RingGlyph{}
			}
			loss.p.Add(s)
			loss.add(evalName, s)
		}
		if err := lr.line(name, series(first, func(m event.Metrics) (float64, bool) { return m.LR, train(m) }), i); err != nil {
			return nil, err
		}
		for _, f := range []struct {
			pn  *panel
			get func(event.Metrics) (float64, bool)
		}{
			{stepTime, func(m event.Metrics) (float64, bool) { return m.StepTimeS, train(m) && m.StepTimeS > 0 }},
			{tps, func(m event.Metrics) (float64, bool) { return m.TokensPerS, train(m) && m.TokensPerS > 0 }},
		} {
			if err := f.pn.summary(r.Ranks, ranks, f.get, i, name, false); err != nil {
				return nil, err
			}
		}
		comp := func(m event.Metrics) (float64, bool) { return m.ComputeS(), train(m) && m.StepTimeS > 0 }
		if several {
			if err := compute.summary(r.Ranks, ranks, comp, i, name, false); err != nil {
				return nil, err
			}
		} else if err := compute.perRank(r.Ranks, ranks, comp); err != nil {
			return nil, err
		}
		if err := gnorm.line(name, series(first, func(m event.Metrics) (float64, bool) { return m.GradNorm, train(m) && m.GradNorm > 0 }), i); err != nil {
			return nil, err
		}
	}
	return [][]*panel{{loss, lr}, {stepTime, tps}, {compute, gnorm}}, nil
}

// textStyle returns the picture's text style of size points: black, left
// and bottom aligned.
func textStyle(size float64) draw.TextStyle {
	f := plot.DefaultFont
	f.Size = vg.Points(size)
	return draw.TextStyle{Color: color.Black, Font: f, Handler: plot.DefaultTextHandler}
}

// fit returns s, shortened with an ellipsis to be at most w wide in sty.
func fit(sty text.Style, s string, w vg.Length) string {
	if sty.Width(s) <= w {
		return s
	}
	r := []rune(s)
	for len(r) > 0 && sty.Width(string(r)+"…") > w {
		r = r[:len(r)-1]
	}
	return string(r) + "…"
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
	p.Title.TextStyle.Font.Size = vg.Points(panelTitleSize)
	p.X.Label.Text = "step"
	p.Y.Label.Text = ylabel
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font.Size = vg.Points(axisSize)
		a.Tick.Label.Font.Size = vg.Points(tickSize)
	}
	p.X.Tick.Marker = stepTicks{style: p.X.Tick.Label}
	p.Add(plotter.NewGrid())
	l := plot.NewLegend()
	l.Top, l.Left = true, true
	l.TextStyle.Font.Size = vg.Points(legendSize)
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
		return pn.summary(runs, ranks, f, 0, "", true)
	}
	for i, r := range ranks {
		if err := pn.line(fmt.Sprintf("rank %d", r), series(runs[r], f), i); err != nil {
			return err
		}
	}
	return nil
}

// summary draws a figure of every rank of a run in the i-th style: one
// line where there is one rank; else the median over the ranks at each
// step with the band from the least to the greatest, and, with slowest,
// the line of the rank whose figure is greatest on average. With a name
// (one run of several), the legend has one entry for the run, so named;
// else one for each part.
func (pn *panel) summary(runs Runs, ranks []int, f func(event.Metrics) (float64, bool), i int, name string, slowest bool) error {
	if len(ranks) == 1 {
		return pn.line(name, series(runs[ranks[0]], f), i)
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
	r, g, b, _ := palette(i).RGBA()
	bd := band{lo: lo, hi: hi, color: color.NRGBA{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8), 70}}
	pn.p.Add(bd)
	if name != "" {
		l, err := addLine(pn.p, med, i)
		if err != nil {
			return err
		}
		pn.add(name, bd, l)
		return nil
	}
	pn.add(fmt.Sprintf("least–greatest of %d ranks", len(ranks)), bd)
	if err := pn.line(fmt.Sprintf("median of %d ranks", len(ranks)), med, i); err != nil {
		return err
	}
	if slowest && worst >= 0 {
		return pn.line(fmt.Sprintf("slowest: rank %d", worst), series(runs[worst], f), i+3)
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

// palette returns the i-th of eight distinct colours, none of them a
// colour of the marks (markStyle).
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

// stepTicks are the step axis's ticks: whole numbers, a multiple of 1, 2
// or 5 times a power of ten apart, as many labels as fit in room (the
// axis's length, about) with a gap of an em each, and not more than ten;
// minor ticks between them.
type stepTicks struct {
	style text.Style // the labels'
	room  vg.Length  // 0: 400 points
}

func (t stepTicks) Ticks(lo, hi float64) []plot.Tick {
	label := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	if !(hi > lo) || math.IsInf(hi-lo, 0) {
		return []plot.Tick{{Value: lo, Label: label(lo)}}
	}
	room := t.room
	if room <= 0 {
		room = vg.Points(400)
	}
	each := max(t.style.Width(label(math.Floor(lo))), t.style.Width(label(math.Ceil(hi)))) + t.style.Width("m")
	most := max(min(10, int(room/each)), 2)
	count := func(step float64) int { return int(math.Floor(hi/step) - math.Ceil(lo/step) + 1) }
	step := 1.0
	for p := 1.0; ; p *= 10 {
		if step = p; count(step) <= most {
			break
		}
		if step = 2 * p; count(step) <= most {
			break
		}
		if step = 5 * p; count(step) <= most {
			break
		}
	}
	minor := 0.0
	switch {
	case math.Mod(step, 5) == 0:
		minor = step / 5
	case math.Mod(step, 2) == 0:
		minor = step / 2
	}
	var ts []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi; v += step {
		ts = append(ts, plot.Tick{Value: v, Label: label(v)})
	}
	if minor > 0 {
		for v := math.Ceil(lo/minor) * minor; v <= hi; v += minor {
			if math.Mod(v, step) != 0 {
				ts = append(ts, plot.Tick{Value: v})
			}
		}
	}
	return ts
}

// markXs returns the column of each mark's line on a panel whose step
// maps to trX: marks at one step (a failure and the restart from its
// step) stand side by side, in the order they happened.
func markXs(marks []Mark, trX func(float64) vg.Length) []vg.Length {
	xs := make([]vg.Length, len(marks))
	for i, m := range marks {
		xs[i] = trX(float64(m.Step))
		for _, o := range marks[:i] {
			if o.Step == m.Step {
				xs[i] += vg.Points(3)
			}
		}
	}
	return xs
}

// markLines draws the marks as vertical lines across a panel.
type markLines struct {
	marks []Mark
}

func (ml markLines) Plot(c draw.Canvas, p *plot.Plot) {
	trX, _ := p.Transforms(&c)
	for i, x := range markXs(ml.marks, trX) {
		if x < c.Min.X-1 || x > c.Max.X+vg.Points(10) {
			continue
		}
		c.StrokeLine2(markStyle(ml.marks[i].Kind), x, c.Min.Y, x, c.Max.Y)
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
