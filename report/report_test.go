package report

import (
	"bytes"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
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
		{Step: 10, Kind: MarkRestart, Label: "automatic, 1 of 1"},
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
	// could not hold the newest): its one mark moves there, beside the
	// re-plan's.
	var older Marker
	for _, e := range []event.Event{
		{Kind: event.KindMetrics, Rank: 0, Metrics: &event.Metrics{Step: 27}},
		{Kind: event.KindJob, State: event.JobRestarting, Rank: -1, Restart: &event.Restart{Count: 1, Max: 1, Cause: "x", Step: 25}},
		{Kind: event.KindJob, State: event.JobReplanned, Rank: -1, Restart: &event.Restart{Count: 1, Max: 1, Cause: "x", Step: 10}},
		{Kind: event.KindMetrics, Rank: 0, Metrics: &event.Metrics{Step: 12}},
	} {
		older.Add(e)
	}
	if got, want := older.Marks(), []Mark{{Step: 27, Kind: MarkFailure, Label: "x"}, {Step: 10, Kind: MarkRestart, Label: "automatic, 1 of 1"},
		{Step: 10, Kind: MarkReplan, Label: "resumes from step 10, not 25"}}; !slices.Equal(got, want) {
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
	img, lay, err := render([]Run{{Ranks: runs}}, o, true)
	places := lay.panels
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
	img, lay, err := render([]Run{{Ranks: runs}}, o, true)
	places := lay.panels
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

// markKinds are the kinds of Mark.
var markKinds = [...]string{MarkStop, MarkFailure, MarkHang, MarkLost, MarkRestart, MarkDrop, MarkReplan}

// job is a run's events as a job's supervisor logs them, built up step by
// step (the events of package event, stamped in order).
type job struct {
	evs  []event.Event
	ms   map[int][]event.Metrics // each rank's records, as its metrics file has them
	t0   time.Time
	step int
}

func (j *job) add(e event.Event) {
	e.Time = j.t0.Add(time.Duration(len(j.evs)) * time.Second)
	j.evs = append(j.evs, e)
}

// state adds a job event of state; f sets its other fields.
func (j *job) state(state string, f func(*event.Event)) {
	e := event.New(event.KindJob)
	e.State = state
	if f != nil {
		f(&e)
	}
	j.add(e)
}

// node adds a node event of state.
func (j *job) node(name, state, msg string) {
	e := event.New(event.KindNode)
	e.Node, e.State, e.Message = name, state, msg
	j.add(e)
}

// train runs ranks from step from to step to (both done): each rank's
// record of each step, rank 0's also as an event, and a checkpoint saved
// every 5 steps.
func (j *job) train(ranks []int, from, to int) {
	j.state(event.JobStarted, func(e *event.Event) { e.Job = "j-test" })
	for s := from; s <= to; s++ {
		for _, r := range ranks {
			m := event.Metrics{Step: s, Loss: 6 - float64(s)/15 + 0.01*float64(r), LR: 1e-3, GradNorm: 1 + 0.1*float64(s%3),
				StepTimeS: 0.2, CommS: 0.15 - 0.01*float64(r), TokensPerS: 8000 + 10*float64(r)}
			j.ms[r] = append(j.ms[r], m)
			if r == 0 {
				e := event.New(event.KindMetrics)
				e.Rank, e.Metrics = 0, &m
				j.add(e)
			}
		}
		if s > 0 && s%5 == 0 {
			e := event.New(event.KindCheckpoint)
			e.Rank, e.State, e.Checkpoint = 0, event.CheckpointSaved, &event.Checkpoint{Step: s, Dir: fmt.Sprintf("output/step_%08d", s)}
			j.add(e)
		}
	}
	j.step = to
}

// stopKillRestartDrop is a two-node job of 60 steps (ranks 0 and 1 on
// node1, 2 and 3 on node2): rank 3 is killed by SIGKILL after step 14 and
// the job restarts from step 10; node2 is lost after step 27, the job
// restarts from step 25 and, node2 unreachable, is re-planned without it
// (a drop); the user stops it after step 38 and restarts it with gptui
// restart, which resumes from step 30 as not every node holds step 35's
// checkpoint (a re-plan); it then runs to its end.
func stopKillRestartDrop() *job {
	j := &job{ms: map[int][]event.Metrics{}, t0: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
	all := []int{0, 1, 2, 3}
	j.train(all, 0, 14)
	w := event.New(event.KindWorker)
	w.Node, w.Rank, w.State, w.Signal, w.Code = "node2", 3, event.WorkerFailed, "SIGKILL", -1
	j.add(w)
	j.state(event.JobRestarting, func(e *event.Event) {
		e.Restart = &event.Restart{Count: 1, Max: 2, Cause: "rank 3 on node2 was killed by SIGKILL", Step: 10}
		e.Message = e.Restart.String()
	})
	j.train(all, 10, 27)
	j.node("node2", event.NodeLost, "no events for 5 s")
	j.state(event.JobRestarting, func(e *event.Event) {
		e.Restart = &event.Restart{Count: 2, Max: 2, Cause: "node node2 lost", Step: 25}
		e.Message = e.Restart.String()
	})
	for range 3 {
		j.node("node1", event.NodeConnecting, "")
		j.node("node2", event.NodeConnecting, "")
		j.node("node1", event.NodeReady, "")
		j.node("node2", event.NodeFailed, "dial tcp: connection refused")
	}
	j.state(event.JobReplanned, func(e *event.Event) {
		e.Message = "node2 unreachable (dial tcp: connection refused): 1 node left, re-planned dp4 → dp2, accumulate 2 (global batch 8 kept)"
	})
	j.train([]int{0, 1}, 25, 38)
	j.state(event.JobStopped, func(e *event.Event) { e.Message = "stopped on request (gptui stop, or the UI's s)" })
	j.state(event.JobRestarting, func(e *event.Event) {
		e.Restart = &event.Restart{Count: 1, Requested: true, Cause: "restarted after its end (gptui restart)", Step: 35}
		e.Message = e.Restart.String()
	})
	j.state(event.JobReplanned, func(e *event.Event) {
		e.Restart = &event.Restart{Count: 1, Requested: true, Cause: "restarted after its end (gptui restart)", Step: 30}
		e.Message = "resuming from step 30, not 35: no newer checkpoint can be held by every node"
	})
	j.train([]int{0, 1}, 30, 59)
	j.state(event.JobDone, nil)
	return j
}

// write writes the job's metrics files into the log directory of each
// node (node names the node of a rank) under dir, and its event log at
// events, with package event's writers.
func (j *job) write(t *testing.T, dir string, node func(rank int) string, events string) {
	t.Helper()
	files := map[string][]byte{}
	for r, ms := range j.ms {
		path := event.MetricsFile(filepath.Join(dir, node(r)), r)
		for _, m := range ms {
			b, err := m.AppendLine(files[path])
			if err != nil {
				t.Fatal(err)
			}
			files[path] = b
		}
	}
	for path, b := range files {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if events == "" {
		return
	}
	f, err := os.Create(events)
	if err != nil {
		t.Fatal(err)
	}
	w := event.NewWriter(f)
	for _, e := range j.evs {
		if err := w.Write(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestMarker: the marks of event sequences, each kind told from the
// others by the events' typed fields: a user's stop is no failure, nor
// is the end of an attempt someone restarted; a re-plan after a node
// was lost or failed is a drop of it.
func TestMarker(t *testing.T) {
	metrics := func(step int) event.Event {
		return event.Event{Kind: event.KindMetrics, Rank: 0, Metrics: &event.Metrics{Step: step}}
	}
	jobEv := func(state, msg string, r *event.Restart) event.Event {
		return event.Event{Kind: event.KindJob, State: state, Rank: -1, Message: msg, Restart: r}
	}
	node := func(name, state string) event.Event {
		return event.Event{Kind: event.KindNode, Node: name, State: state, Rank: -1}
	}
	for _, c := range []struct {
		name string
		evs  []event.Event
		want []Mark
	}{
		{"a user's stop", []event.Event{metrics(7), jobEv(event.JobStopped, "stopped on request (gptui stop, or the UI's s)", nil)},
			[]Mark{{7, MarkStop, "stopped on request (gptui stop, or the UI's s)"}}},
		{"a stop without a word", []event.Event{metrics(7), jobEv(event.JobStopped, "", nil)},
			[]Mark{{7, MarkStop, "the job was stopped"}}},
		{"a kill", []event.Event{metrics(9), {Kind: event.KindJob, State: event.JobFailed, Rank: 2, Signal: "SIGKILL", Code: -1}},
			[]Mark{{9, MarkFailure, "rank 2 killed by SIGKILL"}}},
		{"a restart someone asked for, while it ran", []event.Event{metrics(12),
			jobEv(event.JobRestarting, "", &event.Restart{Count: 1, Requested: true, Cause: "restart requested", Step: 10}), metrics(11)},
			[]Mark{{12, MarkStop, "stopped for a restart on request"}, {10, MarkRestart, "on request (gptui restart, the UI's r)"}}},
		{"a stop, then gptui restart", []event.Event{metrics(40), jobEv(event.JobStopped, "interrupted", nil),
			jobEv(event.JobRestarting, "", &event.Restart{Count: 1, Requested: true, Cause: "restarted after its end (gptui restart)", Step: 40})},
			[]Mark{{40, MarkStop, "interrupted"}, {40, MarkRestart, "on request (gptui restart, the UI's r)"}}},
		{"a lost node dropped", []event.Event{metrics(27), node("node2", event.NodeLost),
			jobEv(event.JobRestarting, "", &event.Restart{Count: 1, Max: 1, Cause: "node node2 lost", Step: 25}),
			node("node2", event.NodeFailed), node("node1", event.NodeReady), node("node2", event.NodeFailed),
			jobEv(event.JobReplanned, "node2 unreachable: 1 node left, re-planned dp4 → dp2", nil)},
			[]Mark{{27, MarkLost, "node2"}, {25, MarkRestart, "automatic, 1 of 1"}, {25, MarkDrop, "node2 left out, re-planned"}}},
		{"a lost node back at the restart", []event.Event{metrics(27), node("node2", event.NodeLost),
			jobEv(event.JobRestarting, "", &event.Restart{Count: 1, Max: 1, Cause: "node node2 lost", Step: 25}),
			node("node2", event.NodeReady), node("node2", event.NodeBack), jobEv(event.JobReplanned, "re-planned dp2 → dp4", nil)},
			[]Mark{{27, MarkLost, "node2"}, {25, MarkRestart, "automatic, 1 of 1"}, {25, MarkReplan, "re-planned dp2 → dp4"}}},
		{"a restart from an older checkpoint", []event.Event{metrics(27),
			jobEv(event.JobRestarting, "", &event.Restart{Count: 1, Max: 3, Cause: "x", Step: 25}),
			jobEv(event.JobReplanned, "", &event.Restart{Count: 1, Max: 3, Cause: "x", Step: 20})},
			[]Mark{{27, MarkFailure, "x"}, {20, MarkRestart, "automatic, 1 of 3"}, {20, MarkReplan, "resumes from step 20, not 25"}}},
		{"a failure's label cut", []event.Event{metrics(3), jobEv(event.JobFailed, strings.Repeat("x", 60), nil)},
			[]Mark{{3, MarkFailure, strings.Repeat("x", maxLabel-1) + "…"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var k Marker
			for _, e := range c.evs {
				k.Add(e)
			}
			if got := k.Marks(); !slices.Equal(got, c.want) {
				t.Errorf("marks\n%+v, want\n%+v", got, c.want)
			}
		})
	}
}

// TestMarkStyles: each kind of mark has a colour of its own, far from
// every other kind's and from the colours of the runs' and ranks' lines.
func TestMarkStyles(t *testing.T) {
	dist := func(a, b color.Color) int {
		ar, ag, ab, _ := a.RGBA()
		br, bg, bb, _ := b.RGBA()
		d := func(x, y uint32) int { return max(int(x>>8)-int(y>>8), int(y>>8)-int(x>>8)) }
		return d(ar, br) + d(ag, bg) + d(ab, bb)
	}
	for i, k := range markKinds {
		c := markStyle(k).Color
		for _, o := range markKinds[i+1:] {
			if d := dist(c, markStyle(o).Color); d < 150 {
				t.Errorf("%s and %s: colours %d apart", k, o, d)
			}
		}
		for p := range 8 {
			if d := dist(c, palette(p)); d < 80 {
				t.Errorf("%s and line colour %d: %d apart", k, p, d)
			}
		}
	}
}

// TestStepTicks: the step axis has several labelled ticks, whole numbers
// at even distances of 1, 2 or 5 times a power of ten, within the range,
// and no more than fit.
func TestStepTicks(t *testing.T) {
	st := textStyle(tickSize)
	for _, c := range []struct {
		lo, hi   float64
		min, max int
	}{
		{0, 39, 4, 10}, {0, 299, 4, 10}, {10, 13, 4, 4}, {0, 5, 4, 6}, {0, 1e5, 4, 10}, {0, 1, 2, 2}, {250, 320, 4, 10},
	} {
		var labels []float64
		for _, tk := range (stepTicks{style: st, room: vg.Points(270)}).Ticks(c.lo, c.hi) {
			if tk.Label == "" {
				continue
			}
			v, err := strconv.ParseFloat(tk.Label, 64)
			if err != nil || v != tk.Value || v != math.Trunc(v) || v < c.lo || v > c.hi {
				t.Errorf("[%g, %g]: tick %+v", c.lo, c.hi, tk)
			}
			labels = append(labels, v)
		}
		if len(labels) < c.min || len(labels) > c.max {
			t.Errorf("[%g, %g]: labels %v, want %d to %d", c.lo, c.hi, labels, c.min, c.max)
			continue
		}
		step := labels[1] - labels[0]
		for p := 1.0; p < 1e9; p *= 10 {
			if step == p || step == 2*p || step == 5*p {
				step = 0
				break
			}
		}
		if step != 0 {
			t.Errorf("[%g, %g]: labels %v, %g apart", c.lo, c.hi, labels, labels[1]-labels[0])
		}
	}
}

// decoded returns the PNG of the canvas, decoded.
func decoded(t *testing.T, img *vgimg.Canvas) image.Image {
	t.Helper()
	var b bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	pic, err := png.Decode(&b)
	if err != nil {
		t.Fatal(err)
	}
	return pic
}

// near reports whether c is within a small distance of want.
func near(c, want color.Color) bool {
	r, g, b, _ := c.RGBA()
	wr, wg, wb, _ := want.RGBA()
	d := func(a, b uint32) float64 { return math.Abs(float64(a>>8) - float64(b>>8)) }
	return d(r, wr)+d(g, wg)+d(b, wb) < 60
}

// coverage is the part of the data height of panel p whose pixels in
// column x (or a neighbour) have colour c.
func coverage(pic image.Image, p panelPlace, x int, c color.Color) float64 {
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

// TestReportStopKillRestartDrop: gptui report's picture of a two-node
// run with a kill, restarts, a lost node dropped, a user's stop and a
// re-plan, from metrics files and an event log written by package event:
// each mark is drawn in its kind's colour at its step on every panel;
// the labels, at least 12 pixels high, overlap neither each other nor
// the data, lie inside the picture, and their text lies inside their
// boxes; the step axes have several ticks.
func TestReportStopKillRestartDrop(t *testing.T) {
	j := stopKillRestartDrop()
	dir := t.TempDir()
	events := filepath.Join(dir, "events.jsonl")
	j.write(t, dir, func(r int) string { return filepath.Join(fmt.Sprintf("node%d", r/2+1), "log") }, events)
	runs, err := LoadRuns(filepath.Join(dir, "node1", "log"), filepath.Join(dir, "node2", "log"))
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || len(runs[0].Ranks) != 4 {
		t.Fatalf("the two nodes' log directories: %d runs, want one of 4 ranks: %+v", len(runs), runs)
	}
	marks, err := LoadMarks(events)
	if err != nil {
		t.Fatal(err)
	}
	want := []Mark{
		{14, MarkFailure, "rank 3 on node2 was killed by SIGKILL"},
		{10, MarkRestart, "automatic, 1 of 2"},
		{27, MarkLost, "node2"},
		{25, MarkRestart, "automatic, 2 of 2"},
		{25, MarkDrop, "node2 left out, re-planned"},
		{38, MarkStop, "stopped on request (gptui stop, or the UI's s)"},
		{30, MarkRestart, "on request (gptui restart, the UI's r)"},
		{30, MarkReplan, "resumes from step 30, not 35"},
	}
	if !slices.Equal(marks, want) {
		t.Fatalf("marks\n%+v, want\n%+v", marks, want)
	}
	o := Options{Width: 1200, Height: 900, Title: "gptui report " + dir, Marks: marks}
	img, lay, err := render(runs, o, true)
	if err != nil {
		t.Fatal(err)
	}
	pic := decoded(t, img)
	if b := pic.Bounds(); b.Dx() != 1200 || b.Dy() != 900 {
		t.Fatalf("%v, want 1200×900", b)
	}
	if dir := os.Getenv("GPTUI_REPORT_PNG"); dir != "" { // to look at it
		f, _ := os.Create(filepath.Join(dir, "report-stop-kill-restart-drop.png"))
		png.Encode(f, pic)
		f.Close()
	}
	if len(lay.panels) != 6 {
		t.Fatalf("%d panels, want 6", len(lay.panels))
	}

	// Each mark's colour at its column, on every panel (the stop's navy,
	// not the failure's red); none where nothing happened.
	colour := map[string]color.RGBA{
		MarkStop: {0, 0, 170, 255}, MarkFailure: {220, 0, 0, 255}, MarkHang: {230, 170, 0, 255}, MarkLost: {0, 0, 0, 255},
		MarkRestart: {0, 160, 0, 255}, MarkDrop: {0, 120, 120, 255}, MarkReplan: {190, 0, 190, 255},
	}
	for _, k := range markKinds {
		if markStyle(k).Color != colour[k] {
			t.Errorf("%s drawn in %v, want %v", k, markStyle(k).Color, colour[k])
		}
	}
	for _, p := range lay.panels {
		if len(p.ticks) < 4 {
			t.Errorf("%s: step ticks %q, want at least 4", p.title, p.ticks)
		}
		for i, m := range marks {
			x := p.marks[i]
			if d := x - p.x(float64(m.Step)); d < 0 || d > 9 {
				t.Errorf("%s: mark %d (%s at step %d) at x=%d, the step at x=%d", p.title, i+1, m.Kind, m.Step, x, p.x(float64(m.Step)))
			}
			min := 0.3 // dashed
			if markStyle(m.Kind).Dashes == nil {
				min = 0.75
			}
			if s := coverage(pic, p, x, colour[m.Kind]); s < min {
				t.Errorf("%s: mark %d (%s at step %d): its colour covers %.0f%% of column %d, want %.0f%%", p.title, i+1, m.Kind, m.Step, 100*s, x, 100*min)
			}
			if m.Kind == MarkStop {
				if s := coverage(pic, p, x, colour[MarkFailure]); s > 0.05 {
					t.Errorf("%s: the user's stop at step %d is %.0f%% red", p.title, m.Step, 100*s)
				}
			}
		}
		for _, step := range []float64{4, 20, 50} {
			for _, k := range markKinds {
				if s := coverage(pic, p, p.x(step), colour[k]); s > 0.05 {
					t.Errorf("%s: the colour of %s at step %v, where nothing happened (%.0f%%)", p.title, k, step, 100*s)
				}
			}
		}
	}

	// The labels: a tag per mark on each top panel and a legend entry per
	// mark, each at least 12 pixels high, none overlapping another, the
	// data or a panel's legend, all inside the picture.
	tags, entries := map[int]int{}, map[int]int{}
	for _, l := range lay.labels {
		if l.text == strconv.Itoa(l.mark+1) {
			tags[l.mark]++
		} else {
			entries[l.mark]++
			if kind := kindName(marks[l.mark].Kind); !strings.HasPrefix(l.text, kind+" ") || !strings.Contains(l.text, fmt.Sprintf("step %d: ", marks[l.mark].Step)) {
				t.Errorf("legend entry %q of mark %d (%s at step %d)", l.text, l.mark+1, kind, marks[l.mark].Step)
			}
		}
		if px := float64(l.size) / 72 * dpi; px < 12 {
			t.Errorf("label %q: %.1f pixels high, want 12", l.text, px)
		}
	}
	for i := range marks {
		if tags[i] != 2 || entries[i] != 1 {
			t.Errorf("mark %d: %d tags and %d legend entries, want 2 and 1", i+1, tags[i], entries[i])
		}
	}
	checkLabels(t, pic, lay)

	// The text's pixels: the picture less the labels' texts differs only
	// inside their boxes, and in each of them, over at least 9 pixels of
	// height (a digit of 14.7 pixels' type), 12 for an entry.
	bare, _, err := render(runs, o, false)
	if err != nil {
		t.Fatal(err)
	}
	checkText(t, pic, decoded(t, bare), lay)
}

// checkLabels checks that the labels of lay lie inside pic, overlap no
// other label, no panel's data and no panel's legend, and that the
// legends lie inside pic.
func checkLabels(t *testing.T, pic image.Image, lay layout) {
	t.Helper()
	for i, l := range lay.labels {
		if !l.box.In(pic.Bounds()) {
			t.Errorf("label %q at %v: outside the %v picture", l.text, l.box, pic.Bounds())
		}
		for _, o := range lay.labels[i+1:] {
			if l.box.Overlaps(o.box) {
				t.Errorf("labels %q at %v and %q at %v overlap", l.text, l.box, o.text, o.box)
			}
		}
		for _, p := range lay.panels {
			if l.box.Overlaps(p.data) {
				t.Errorf("label %q at %v overlaps the data of %s at %v", l.text, l.box, p.title, p.data)
			}
			if l.box.Overlaps(p.key) {
				t.Errorf("label %q at %v overlaps the legend of %s at %v", l.text, l.box, p.title, p.key)
			}
		}
	}
	for _, p := range lay.panels {
		if !p.key.In(pic.Bounds()) {
			t.Errorf("%s: legend %v outside the %v picture", p.title, p.key, pic.Bounds())
		}
	}
}

// checkText checks that pic and bare, pic without the labels' texts,
// differ only inside the labels' boxes, and in each box over the height
// of its text.
func checkText(t *testing.T, pic, bare image.Image, lay layout) {
	t.Helper()
	top := make([]int, len(lay.labels))
	bottom := make([]int, len(lay.labels))
	for i := range top {
		top[i], bottom[i] = math.MaxInt, -1
	}
	outside := 0
	b := pic.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if pic.At(x, y) == bare.At(x, y) {
				continue
			}
			i := slices.IndexFunc(lay.labels, func(l labelPlace) bool { return image.Pt(x, y).In(l.box) })
			if i < 0 {
				if outside++; outside <= 5 {
					t.Errorf("a text pixel at (%d, %d) outside every label's box", x, y)
				}
				continue
			}
			top[i], bottom[i] = min(top[i], y), max(bottom[i], y)
		}
	}
	for i, l := range lay.labels {
		want := 12
		if l.text == strconv.Itoa(l.mark+1) {
			want = 9 // digits alone: the height of a capital
		}
		if h := bottom[i] - top[i] + 1; bottom[i] < 0 || h < want {
			t.Errorf("label %q in %v: text %d pixels high, want %d", l.text, l.box, max(h, 0), want)
		}
	}
}

// TestReportTwoRuns: two log directories of runs of the same ranks are
// two runs, named by their folders, each a line of its own colour in the
// loss panel and named in every panel's legend; the directories of a
// run's two nodes are one run; a directory given twice is read once; one
// without metrics is an error that names it.
func TestReportTwoRuns(t *testing.T) {
	dir := t.TempDir()
	j := stopKillRestartDrop()
	j.write(t, filepath.Join(dir, "base"), func(r int) string { return "log" }, "")
	k := &job{ms: map[int][]event.Metrics{}}
	k.train([]int{0, 1, 2, 3}, 0, 45)
	for r := range k.ms {
		for i := range k.ms[r] {
			k.ms[r][i].Loss -= 0.5
		}
		k.ms[r] = append(k.ms[r], event.Metrics{Step: 20, Loss: 4, LR: 1e-3, EvalLoss: 4.2}, event.Metrics{Step: 40, Loss: 3, LR: 1e-3, EvalLoss: 3.3})
	}
	k.write(t, filepath.Join(dir, "tuned"), func(r int) string { return "log" }, "")
	k.write(t, filepath.Join(dir, "two"), func(r int) string { return fmt.Sprintf("node%d", r/2+1) }, "")
	if err := os.MkdirAll(filepath.Join(dir, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	in := func(p ...string) string { return filepath.Join(append([]string{dir}, p...)...) }
	for _, c := range []struct {
		name  string
		dirs  []string
		want  []string // the runs' names
		ranks []int    // their ranks
	}{
		{"two runs", []string{in("base", "log"), in("tuned", "log")}, []string{"base/log", "tuned/log"}, []int{4, 4}},
		{"two nodes of a run", []string{in("two", "node1"), in("two", "node2")}, []string{"two"}, []int{4}},
		{"a run and two nodes of another", []string{in("base", "log"), in("two", "node1"), in("two", "node2")}, []string{"log", "two"}, []int{4, 4}},
		{"one directory twice", []string{in("base", "log"), in("base", "log", ".")}, []string{"log"}, []int{4}},
		{"runs alike but their number", []string{in("two", "node1"), in("base", "..", "two", "node1", "..", "node1")}, []string{"node1"}, []int{2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			runs, err := LoadRuns(c.dirs...)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			var ranks []int
			for _, r := range runs {
				names, ranks = append(names, r.Name), append(ranks, len(r.Ranks))
			}
			if !slices.Equal(names, c.want) || !slices.Equal(ranks, c.ranks) {
				t.Errorf("runs %q of %v ranks, want %q of %v", names, ranks, c.want, c.ranks)
			}
		})
	}
	if _, err := LoadRuns(in("base", "log"), in("empty")); !errors.Is(err, ErrNoMetrics) || !strings.Contains(err.Error(), in("empty")) {
		t.Errorf("a directory without metrics: %v", err)
	}
	if _, err := LoadRuns(in("none")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing directory: %v", err)
	}

	runs, err := LoadRuns(in("base", "log"), in("tuned", "log"))
	if err != nil {
		t.Fatal(err)
	}
	img, lay, err := render(runs, Options{Width: 1200, Height: 900, Title: "two runs"}, true)
	if err != nil {
		t.Fatal(err)
	}
	pic := decoded(t, img)
	if dir := os.Getenv("GPTUI_REPORT_PNG"); dir != "" {
		f, _ := os.Create(filepath.Join(dir, "report-two-runs.png"))
		png.Encode(f, pic)
		f.Close()
	}
	for _, p := range lay.panels {
		for _, r := range runs {
			if !slices.Contains(p.legend, r.Name) {
				t.Errorf("%s: legend %q lacks %q", p.title, p.legend, r.Name)
			}
		}
		if p.title == "loss" && !slices.Contains(p.legend, "tuned/log eval") {
			t.Errorf("%s: legend %q lacks the evaluations of tuned/log", p.title, p.legend)
		}
		if slices.ContainsFunc(p.legend, func(s string) bool { return strings.Contains(s, "1 ranks") }) {
			t.Errorf("%s: legend %q", p.title, p.legend)
		}
	}
	// Each run's loss line, in its colour, in the loss panel.
	loss := lay.panels[0]
	for i := range runs {
		n := 0
		for y := loss.data.Min.Y; y < loss.data.Max.Y; y++ {
			for x := loss.data.Min.X; x < loss.data.Max.X; x++ {
				if near(pic.At(x, y), palette(i)) {
					n++
				}
			}
		}
		if n < loss.data.Dx()/2 {
			t.Errorf("run %s: %d pixels of its colour in the loss panel, want a line across it", runs[i].Name, n)
		}
	}
	checkLabels(t, pic, lay)
}

// TestReportManyMarks: 30 marks a step apart get tags in rows that do
// not overlap, and a legend that lists as many as fit and counts the
// others; nothing overlaps or leaves the picture, at 800×600 too.
func TestReportManyMarks(t *testing.T) {
	_, runs := killRestart()
	var marks []Mark
	for i := range 30 {
		marks = append(marks, Mark{Step: 5 + i, Kind: markKinds[i%len(markKinds)], Label: strings.Repeat("what happened ", 1+i%4)})
	}
	for _, size := range []image.Point{{1200, 900}, {800, 600}} {
		o := Options{Width: size.X, Height: size.Y, Title: strings.Repeat("a long title ", 20), Marks: marks}
		img, lay, err := render([]Run{{Ranks: runs}}, o, true)
		if err != nil {
			t.Fatal(err)
		}
		pic := decoded(t, img)
		if dir := os.Getenv("GPTUI_REPORT_PNG"); dir != "" {
			f, _ := os.Create(filepath.Join(dir, fmt.Sprintf("report-many-marks-%d.png", size.X)))
			png.Encode(f, pic)
			f.Close()
		}
		checkLabels(t, pic, lay)
		bare, _, err := render([]Run{{Ranks: runs}}, o, false)
		if err != nil {
			t.Fatal(err)
		}
		checkText(t, pic, decoded(t, bare), lay)
		if l := lay.labels[len(lay.labels)-1]; l.mark != -1 || !strings.HasPrefix(l.text, "and ") {
			t.Errorf("%v: the legend's last entry %q, want the count of the marks left out", size, l.text)
		}
	}
}

// TestReportSizes: the picture of the run with every kind of mark but a
// hang, at sizes from 640×480 up, keeps its labels apart and inside it
// (a 640×480 one has no room for the tags, and its marks' legend lists
// some of the marks and counts the others), and
// from 1000 pixels wide has at least 4 ticks on each step axis; one too
// small for its panels is an error, at once.
func TestReportSizes(t *testing.T) {
	j := stopKillRestartDrop()
	dir := t.TempDir()
	events := filepath.Join(dir, "events.jsonl")
	j.write(t, dir, func(int) string { return "log" }, events)
	runs, err := LoadRuns(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	marks, err := LoadMarks(events)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		w, h int
		tags bool
	}{
		{1200, 900, true}, {1000, 700, true}, {800, 600, true}, {640, 480, false}, {1600, 1000, true}, {2400, 1800, true},
	} {
		t.Run(fmt.Sprintf("%dx%d", c.w, c.h), func(t *testing.T) {
			img, lay, err := render(runs, Options{Width: c.w, Height: c.h, Title: "sizes", Marks: marks}, true)
			if err != nil {
				t.Fatal(err)
			}
			pic := decoded(t, img)
			if dir := os.Getenv("GPTUI_REPORT_PNG"); dir != "" {
				f, _ := os.Create(filepath.Join(dir, fmt.Sprintf("report-%dx%d.png", c.w, c.h)))
				png.Encode(f, pic)
				f.Close()
			}
			checkLabels(t, pic, lay)
			tags := slices.ContainsFunc(lay.labels, func(l labelPlace) bool { return l.text == strconv.Itoa(l.mark+1) })
			entries := slices.DeleteFunc(slices.Clone(lay.labels), func(l labelPlace) bool { return l.text == strconv.Itoa(l.mark+1) })
			all := len(entries) == len(marks) && entries[len(entries)-1].mark == len(marks)-1
			more := len(entries) >= 2 && entries[len(entries)-1].mark == -1 &&
				strings.HasPrefix(entries[len(entries)-1].text, fmt.Sprintf("and %d more marks", len(marks)-len(entries)+1))
			if tags != c.tags || !all && !more {
				t.Errorf("tags %v, want %v; legend entries %d, want one for each of the %d marks, or for some and a count of the others", tags, c.tags, len(entries), len(marks))
			}
			for _, p := range lay.panels {
				if c.w >= 1000 && len(p.ticks) < 4 {
					t.Errorf("%s: step ticks %q, want at least 4", p.title, p.ticks)
				}
			}
		})
	}
	for _, size := range []image.Point{{200, 150}, {400, 300}, {10000, 150}, {200, 10000}} {
		start := time.Now()
		if _, _, err := render(runs, Options{Width: size.X, Height: size.Y, Marks: marks}, true); err == nil || !strings.Contains(err.Error(), "too few") {
			t.Errorf("%v: %v, want an error saying it is too small", size, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%v: refused after %v", size, d)
		}
	}
}
