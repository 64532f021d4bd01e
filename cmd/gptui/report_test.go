package main

import (
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/sshexec"
)

// TestReportOfARestart: a local job of small as dp4 whose rank 3 is
// killed after step 12 and which its supervisor restarts from its newest
// checkpoint; its events are written to a log as they come. gptui report
// of its metrics and that log marks the failure (red) and the restart
// (green) across every panel of the picture: in each column of panels, a
// red and a green line crossing each of its three panels. (Where they
// are, to the step, the report package's tests check.)
func TestReportOfARestart(t *testing.T) {
	long(t)
	exe := builtGPTUI(t)
	t.Chdir(t.TempDir())
	args := restartArgs(t, "output")
	var over []string
	for i := 2; i+1 < len(args); i += 2 {
		over = append(over, args[i+1])
	}
	cfg, err := presets.Load(args[1], over)
	if err != nil {
		t.Fatal(err)
	}
	s := cluster.NewSupervisor(cluster.Options{Nodes: []sshexec.Node{sshexec.LocalNode(4)}, Hosts: sshexec.LocalHosts, Config: cfg, Exe: exe}, cluster.Restarts{Max: 1})
	ctx := t.Context()
	if _, err := s.Plan(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create("events.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	w := event.NewWriter(log)
	pids := map[int]int{}
	killed, restarted := false, false
	timeout := time.After(240 * time.Second)
	for done := false; !done; {
		select {
		case e, ok := <-s.Events():
			if !ok {
				done = true
				break
			}
			w.Write(e)
			switch {
			case e.Kind == event.KindWorker && e.State == event.WorkerRunning && e.Proc != nil:
				pids[e.Rank] = e.Proc.PID
			case e.Kind == event.KindMetrics && e.Rank == 0 && e.Metrics.Step >= 12 && !killed:
				killed = syscall.Kill(pids[3], syscall.SIGKILL) == nil
			case e.Kind == event.KindJob && e.State == event.JobRestarting:
				restarted = true
			}
		case <-timeout:
			s.Stop()
			t.Fatal("the job still runs 240 s after its start")
		}
	}
	log.Close()
	if err := s.Wait(); err != nil || !killed || !restarted {
		t.Fatalf("the job: %v; rank 3 killed %v, restarted %v", err, killed, restarted)
	}
	code, so, se := runCLI(t, "report", "--log-dir", "log", "--events", "events.jsonl", "-o", "report.png", "--title", "a kill and a restart")
	if code != 0 || !strings.Contains(so, "1200×900 pixels, 4 ranks, 2 marks") {
		t.Fatalf("report: exit %d, %q %q", code, so, se)
	}
	f, err := os.Open("report.png")
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if dir := os.Getenv("GPTUI_REPORT_PNG"); dir != "" { // to look at it
		b, _ := os.ReadFile("report.png")
		os.WriteFile(filepath.Join(dir, "report-of-a-restart.png"), b, 0o644)
	}
	red, green := color.RGBA{220, 0, 0, 255}, color.RGBA{0, 160, 0, 255}
	for _, half := range []image.Rectangle{
		image.Rect(0, 0, img.Bounds().Dx()/2, img.Bounds().Dy()),
		image.Rect(img.Bounds().Dx()/2, 0, img.Bounds().Dx(), img.Bounds().Dy()),
	} {
		rx, rRuns := markColumn(img, half, red)
		gx, gRuns := markColumn(img, half, green)
		t.Logf("panels %v: the failure at x=%d crosses %d panels, the restart at x=%d %d", half, rx, rRuns, gx, gRuns)
		if rRuns != 3 || gRuns != 3 {
			t.Errorf("panels %v: the failure crosses %d panels, the restart %d; want the three of the column each", half, rRuns, gRuns)
		}
	}
}

// markColumn returns the column of r whose pixels of colour c (within a
// small distance) are the most, and how many vertical runs of them, at
// least 60 pixels long (a panel's height crossed), it holds.
func markColumn(img image.Image, r image.Rectangle, c color.RGBA) (x, runs int) {
	near := func(p color.Color) bool {
		pr, pg, pb, _ := p.RGBA()
		d := func(a uint32, b uint8) int { return max(int(a>>8)-int(b), int(b)-int(a>>8)) }
		return d(pr, c.R)+d(pg, c.G)+d(pb, c.B) < 60
	}
	best := -1
	for cx := r.Min.X; cx < r.Max.X; cx++ {
		n := 0
		for y := r.Min.Y; y < r.Max.Y; y++ {
			if near(img.At(cx, y)) {
				n++
			}
		}
		if n > best {
			best, x = n, cx
		}
	}
	// Runs along the column, gaps of a dashed line (a few pixels) bridged.
	run, gap := 0, 0
	for y := r.Min.Y; y < r.Max.Y; y++ {
		if near(img.At(x, y)) {
			run += gap + 1
			gap = 0
			continue
		}
		if run > 0 && gap < 8 {
			gap++
			continue
		}
		if run >= 60 {
			runs++
		}
		run, gap = 0, 0
	}
	if run >= 60 {
		runs++
	}
	return x, runs
}
