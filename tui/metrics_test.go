package tui

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/gptui/gptui"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/engine/data"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/presets"
)

// TestEngineMetricsOnTheDashboard ties the metrics record the engine
// writes to what the dashboard shows. The tiny preset trains 3 steps and
// writes metrics.0.jsonl; its lines are decoded as the agent's tail
// decodes them (event.DecodeMetrics), sent as metrics events through the
// event stream the UI reads (event.Writer, then event.Reader), and fed to
// the dashboard: its lead rank holds the last step, the loss the run
// returned, its learning rate and throughput; its loss curve has every
// step and its evaluation the eval loss.
func TestEngineMetricsOnTheDashboard(t *testing.T) {
	t.Chdir(t.TempDir()) // what the run writes to relative paths stays here
	dir := t.TempDir()
	cfg, err := presets.Load("tiny", []string{"Engine.max_steps=3", "Engine.logging_freq=1", "Engine.eval_freq=3", "Engine.eval_iters=1",
		"Engine.save_load.save_steps=0", "Engine.log_dir=" + dir})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := engine.NewTrainer(cfg, cpu.New(), engine.Options{Stdout: io.Discard,
		Builtin: func() ([]uint16, error) { return data.BuiltinCorpus(gptui.Docs) }})
	if err != nil {
		t.Fatal(err)
	}
	res, err := tr.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Losses) != 3 || len(res.EvalLosses) != 1 {
		t.Fatalf("the run returned %d losses and %d eval losses, want 3 and 1", len(res.Losses), len(res.EvalLosses))
	}

	// The engine's file, read line by line as the agent reads it, onto the
	// stream the agent writes and the UI reads.
	b, err := os.ReadFile(event.MetricsFile(dir, 0))
	if err != nil {
		t.Fatal(err)
	}
	var wire bytes.Buffer
	w := event.NewWriter(&wire)
	var sent []event.Metrics
	for line := range bytes.Lines(b) {
		m, ok := event.DecodeMetrics(line)
		if !ok {
			t.Fatalf("the engine wrote a line that is not a record: %q", line)
		}
		sent = append(sent, m)
		e := event.New(event.KindMetrics)
		e.Time = t0.Add(time.Duration(m.Step+1) * time.Second)
		e.Node, e.Rank, e.Metrics = "localhost", 0, &m
		if err := w.Write(e); err != nil {
			t.Fatal(err)
		}
	}
	var evs []event.Event
	evs = append(evs, ev(event.KindJob, 0, func(e *event.Event) { e.State = event.JobStarted }),
		ev(event.KindWorker, 0.5, func(e *event.Event) { e.Node, e.Rank, e.State = "localhost", 0, event.WorkerRunning }))
	rd := event.NewReader(&wire)
	for {
		e, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, e)
	}

	m := launchedJob(t, 1, []string{"Engine.max_steps=3"}, 10*time.Second, 140, 40)
	feed(m, evs...)
	d := &m.dash
	last := d.lead().last
	want := sent[len(sent)-2] // the last training record; the evaluation follows it
	if last.Step != 2 || float32(last.Loss) != res.Losses[2] || last.LR != want.LR || last.LR <= 0 ||
		last.TokensPerS != want.TokensPerS || last.TokensPerS <= 0 || last.MFU != want.MFU {
		t.Errorf("the dashboard's last record %+v; the engine wrote %+v and returned loss %v", last, want, res.Losses[2])
	}
	if len(d.train.pts) != 3 {
		t.Fatalf("loss curve of %d points, want 3", len(d.train.pts))
	}
	for i, p := range d.train.pts {
		if p.step != i || float32(p.v) != res.Losses[i] {
			t.Errorf("loss curve point %d: %+v, the run's loss %v", i, p, res.Losses[i])
		}
	}
	if len(d.eval.pts) != 1 || d.eval.pts[0].step != 2 || d.eval.pts[0].v != res.EvalLosses[0] {
		t.Errorf("eval points %+v, the run's eval loss %v", d.eval.pts, res.EvalLosses[0])
	}
	if out := m.Render(); !bytes.Contains([]byte(out), []byte(fmt.Sprintf("loss %.4f", res.Losses[2]))) {
		t.Errorf("the dashboard does not show the last loss %.4f:\n%s", res.Losses[2], out)
	}
}
