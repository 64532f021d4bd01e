package report

import (
	"bytes"
	"errors"
	"fmt"
	"image/color"
	"image/png"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/gptui/gptui/event"
)

// TestWriteFile: the picture of two ranks' records is a PNG of the asked
// size, written whole; a directory that does not exist is an error that
// says so, and leaves nothing.
func TestWriteFile(t *testing.T) {
	runs := Runs{}
	for r := range 2 {
		for s := range 20 {
			runs[r] = append(runs[r], event.Metrics{Step: s, Loss: 10 - float64(s)/4, LR: 1e-3, StepTimeS: 0.1 * float64(r+1), TokensPerS: 1000})
		}
		runs[r] = append(runs[r], event.Metrics{Step: 19, EvalLoss: 6})
	}
	path := filepath.Join(t.TempDir(), "r.png")
	if err := WriteFile(path, runs, Options{Width: 640, Height: 480, Title: "test"}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 640 || b.Dy() != 480 {
		t.Errorf("%d×%d, want 640×480", b.Dx(), b.Dy())
	}
	if err := WriteFile(filepath.Join(t.TempDir(), "none", "r.png"), runs, Options{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing directory: %v", err)
	}
	if err := WriteFile(path, Runs{}, Options{}); !errors.Is(err, ErrNoMetrics) {
		t.Errorf("no records: %v", err)
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".report-*"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// TestPadFlat: a panel of one value (a constant learning rate) gets ±10%
// around it, not the plot's ±1 that shows it as 0.
func TestPadFlat(t *testing.T) {
	for _, v := range []float64{1e-3, 0, -2} {
		p := newPlot("lr", "")
		if _, err := addLine(p, plotter.XYs{{X: 0, Y: v}, {X: 10, Y: v}}, 0); err != nil {
			t.Fatal(err)
		}
		padFlat(p)
		if !(p.Y.Min < v && v < p.Y.Max) || v != 0 && p.Y.Max-p.Y.Min > 0.21*math.Abs(v)+1e-15 {
			t.Errorf("%g: range [%g, %g]", v, p.Y.Min, p.Y.Max)
		}
	}
}

// killRestart is the events of a 4-rank run of 40 steps whose rank 3 is
// killed after step 13 and which restarts from the checkpoint of step 10;
// and its metrics, rank 3 computing twice as long as the others.
func killRestart() ([]event.Event, Runs) {
	var evs []event.Event
	add := func(e event.Event) { evs = append(evs, e) }
	job := func(state string, f func(*event.Event)) {
		e := event.New(event.KindJob)
		e.State = state
		if f != nil {
			f(&e)
		}
		add(e)
	}
	runs := Runs{}
	job(event.JobStarted, nil)
	for s := 0; s <= 13; s++ {
		e := event.New(event.KindMetrics)
		e.Rank, e.Metrics = 0, &event.Metrics{Step: s}
		add(e)
	}
	w := event.New(event.KindWorker)
	w.Rank, w.State, w.Signal = 3, event.WorkerFailed, "SIGKILL"
	add(w)
	job(event.JobRestarting, func(e *event.Event) {
		e.Restart = &event.Restart{Count: 1, Max: 1, Cause: "rank 3 on node2 was killed by SIGKILL", Step: 10}
	})
	job(event.JobStarted, nil)
	for s := 0; s <= 39; s++ { // the resumed run's records, sent again from the start
		e := event.New(event.KindMetrics)
		e.Rank, e.Metrics = 0, &event.Metrics{Step: s}
		add(e)
	}
	job(event.JobDone, nil)
	for r := range 4 {
		for s := range 40 {
			comp := 0.05
			if r == 3 {
				comp = 0.1
			}
			runs[r] = append(runs[r], event.Metrics{Step: s, Loss: 5 - float64(s)/20, LR: 1e-3 * float64(min(s+1, 10)) / 10, GradNorm: 1,
				StepTimeS: 0.2, CommS: 0.2 - comp, TokensPerS: 1000})
		}
	}
	return evs, runs
}

// TestMarksOfARestart: the events of a kill and a restart give a failure
// mark at the step the job had reached and a restart mark at the step it
// resumed from; the event log, written and read back, gives the same.
func TestMarksOfARestart(t *testing.T) {
	evs, _ := killRestart()
	var k Marker
	for _, e := range evs {
		k.Add(e)
	}
	want := []Mark{
		{Step: 13, Kind: MarkFailure, Label: "rank 3 on node2 was killed by SIGKILL"},
		{Step: 10, Kind: MarkRestart, Label: "restart 1/1 from step 10"},
	}
	if got := k.Marks(); !slices.Equal(got, want) {
		t.Errorf("marks %+v, want %+v", got, want)
	}
	var b bytes.Buffer
	ew := event.NewWriter(&b)
	for _, e := range evs {
		ew.Write(e)
	}
	path := filepath.Join(t.TempDir(), "events.jsonl")
	os.WriteFile(path, b.Bytes(), 0o644)
	if got, err := LoadMarks(path); err != nil || !slices.Equal(got, want) {
		t.Errorf("LoadMarks: %+v, %v", got, err)
	}
	if _, err := LoadMarks(filepath.Join(t.TempDir(), "none.jsonl")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing log: %v", err)
	}
	// A stop that saved steps not yet seen: the failure is at least at
	// the step resumed from, and the two marks stand side by side.
	var late Marker
	for _, e := range []event.Event{
		{Kind: event.KindMetrics, Rank: 0, Metrics: &event.Metrics{Step: 13}},
		{Kind: event.KindJob, State: event.JobRestarting, Rank: -1, Restart: &event.Restart{Count: 1, Max: 1, Cause: "x", Step: 15}},
	} {
		late.Add(e)
	}
	if got := late.Marks(); len(got) != 2 || got[0].Step != 15 || got[1].Step != 15 {
		t.Errorf("a restart from a step past the last seen: %+v", got)
	}
	// A restart that resumes from an older step than it named (a node
	// could not hold the newest): its one mark moves there.
	var older Marker
	for _, e := range []event.Event{
		{Kind: event.KindMetrics, Rank: 0, Metrics: &event.Metrics{Step: 27}},
		{Kind: event.KindJob, State: event.JobRestarting, Rank: -1, Restart: &event.Restart{Count: 1, Max: 1, Cause: "x", Step: 25}},
		{Kind: event.KindJob, State: event.JobReplanned, Rank: -1, Restart: &event.Restart{Count: 1, Max: 1, Cause: "x", Step: 10}},
		{Kind: event.KindMetrics, Rank: 0, Metrics: &event.Metrics{Step: 12}},
	} {
		older.Add(e)
	}
	if got, want := older.Marks(), []Mark{{Step: 27, Kind: MarkFailure, Label: "x"}, {Step: 10, Kind: MarkRestart, Label: "restart 1/1 from step 10"}}; !slices.Equal(got, want) {
		t.Errorf("a restart from an older step: %+v, want %+v", got, want)
	}
	// A hang, then the failure it causes, is one mark; a lost node too.
	var h Marker
	for _, e := range []event.Event{
		{Kind: event.KindMetrics, Rank: 0, Metrics: &event.Metrics{Step: 7}},
		{Kind: event.KindJob, State: event.JobHung, Rank: 2},
		{Kind: event.KindJob, State: event.JobFailed, Rank: 2, Code: -1},
	} {
		h.Add(e)
	}
	if got := h.Marks(); len(got) != 1 || got[0] != (Mark{Step: 7, Kind: MarkHang, Label: "rank 2 hung"}) {
		t.Errorf("a hang: %+v", got)
	}
}

// TestReportMarksEveryPanel: the picture of a run with a kill and a
// restart draws the failure (red) and the restart (green) across each of
// its six panels at their steps, and neither where nothing happened; each
// panel's legend is beside it, outside its data.
func TestReportMarksEveryPanel(t *testing.T) {
	evs, runs := killRestart()
	var k Marker
	for _, e := range evs {
		k.Add(e)
	}
	o := Options{Width: 1200, Height: 900, Title: "kill and restart", Marks: k.Marks()}
	img, places, err := render(runs, o)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	pngBytes := slices.Clone(b.Bytes())
	pic, err := png.Decode(&b)
	if err != nil {
		t.Fatal(err)
	}
	if len(places) != 6 {
		t.Fatalf("%d panels, want 6", len(places))
	}
	near := func(c color.Color, want color.Color) bool {
		r, g, bl, _ := c.RGBA()
		wr, wg, wb, _ := want.RGBA()
		d := func(a, b uint32) float64 { return math.Abs(float64(a>>8) - float64(b>>8)) }
		return d(r, wr)+d(g, wg)+d(bl, wb) < 60
	}
	// share is the part of the panel's data height whose pixels near
	// column x (±1) have the colour c.
	share := func(p panelPlace, x int, c color.Color) float64 {
		n := 0
		for y := p.data.Min.Y + 2; y < p.data.Max.Y-2; y++ {
			for dx := -1; dx <= 1; dx++ {
				if near(pic.At(x+dx, y), c) {
					n++
					break
				}
			}
		}
		return float64(n) / float64(p.data.Dy()-4)
	}
	red, green := markStyle(MarkFailure).Color, markStyle(MarkRestart).Color
	for _, p := range places {
		if !p.data.In(pic.Bounds()) || p.data.Dx() < 100 || p.data.Dy() < 60 {
			t.Errorf("%s: data area %v in a %v picture", p.title, p.data, pic.Bounds())
			continue
		}
		if s := share(p, p.x(13), red); s < 0.8 {
			t.Errorf("%s: the failure at step 13 covers %.0f%% of the panel's height, want a line across it", p.title, 100*s)
		}
		if s := share(p, p.x(10), green); s < 0.4 { // dashed
			t.Errorf("%s: the restart at step 10 covers %.0f%% of the panel's height, want a dashed line across it", p.title, 100*s)
		}
		for _, step := range []float64{5, 25, 35} {
			if s := share(p, p.x(step), red) + share(p, p.x(step), green); s > 0.05 {
				t.Errorf("%s: a mark's colour at step %v, where nothing happened (%.0f%%)", p.title, step, 100*s)
			}
		}
		// Nothing right of the data but the legend: its strip is white
		// where the data would be, at mid-height.
	}
	out := filepath.Join(t.TempDir(), "r.png")
	if err := WriteFile(out, runs, o); err != nil {
		t.Fatal(err)
	}
	if dir := os.Getenv("GPTUI_REPORT_PNG"); dir != "" { // to look at it
		os.WriteFile(filepath.Join(dir, "report-restart.png"), pngBytes, 0o644)
	}
}

// TestMarksAtOneStep: a failure and the restart from its own step stand
// side by side, both seen.
func TestMarksAtOneStep(t *testing.T) {
	_, runs := killRestart()
	o := Options{Width: 800, Height: 600, Marks: []Mark{{Step: 15, Kind: MarkFailure, Label: "x"}, {Step: 15, Kind: MarkRestart, Label: "y"}}}
	img, places, err := render(runs, o)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	pic, err := png.Decode(&b)
	if err != nil {
		t.Fatal(err)
	}
	count := func(x, y0, y1 int, c color.Color) int {
		n := 0
		want, _, _, _ := c.RGBA()
		_, wg, _, _ := c.RGBA()
		for y := y0; y < y1; y++ {
			r, g, _, _ := pic.At(x, y).RGBA()
			if math.Abs(float64(r>>8)-float64(want>>8)) < 30 && math.Abs(float64(g>>8)-float64(wg>>8)) < 30 {
				n++
			}
		}
		return n
	}
	for _, p := range places {
		x, h := p.x(15), p.data.Dy()
		red := max(count(x-1, p.data.Min.Y, p.data.Max.Y, markStyle(MarkFailure).Color), count(x, p.data.Min.Y, p.data.Max.Y, markStyle(MarkFailure).Color))
		green := 0
		for dx := 2; dx <= 6; dx++ {
			green = max(green, count(x+dx, p.data.Min.Y, p.data.Max.Y, markStyle(MarkRestart).Color))
		}
		if red < h*8/10 || green < h*4/10 {
			t.Errorf("%s: at step 15, %d red and %d green pixels of %d: want both lines", p.title, red, green, h)
		}
	}
}

// TestReportManyRanks: 64 ranks' compute times draw as a band, a median
// and the slowest rank (named in the legend), 4 as a line each; both
// pictures are made.
func TestReportManyRanks(t *testing.T) {
	for _, n := range []int{4, 64} {
		runs := Runs{}
		for r := range n {
			for s := range 30 {
				comp := 0.05 + 0.001*float64(r%5)
				if r == n-2 {
					comp = 0.12
				}
				runs[r] = append(runs[r], event.Metrics{Step: s, Loss: 5, LR: 1e-3, StepTimeS: 0.2, CommS: 0.2 - comp, TokensPerS: 1000, GradNorm: 1})
			}
		}
		pn := newPanel("compute", "s")
		ranks := slices.Sorted(maps.Keys(runs))
		if err := pn.perRank(runs, ranks, func(m event.Metrics) (float64, bool) { return m.ComputeS(), true }); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("[least–greatest of %d ranks median of %d ranks slowest: rank %d]", n, n, n-2)
		if n <= maxLines {
			want = "[rank 0 rank 1 rank 2 rank 3]"
		}
		if got := fmt.Sprint(pn.names); got != want {
			t.Errorf("%d ranks: legend %s, want %s", n, got, want)
		}
		var b bytes.Buffer
		if err := Draw(&b, runs, Options{Width: 900, Height: 700}); err != nil {
			t.Fatal(err)
		}
		if dir := os.Getenv("GPTUI_REPORT_PNG"); dir != "" {
			os.WriteFile(filepath.Join(dir, fmt.Sprintf("report-%d.png", n)), b.Bytes(), 0o644)
		}
	}
}
