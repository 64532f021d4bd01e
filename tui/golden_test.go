package tui

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/charmbracelet/x/ansi"

	"github.com/gptui/gptui/event"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// testdata is the golden files' directory, found before any test changes
// the working directory.
var testdata, _ = filepath.Abs("testdata")

// golden compares m's rendering with testdata/name.golden, or rewrites the
// file with -update. The rendering must be plain text (no colour: the
// models are made without Options.Colour, as under NO_COLOR) of exactly the
// window's size.
func golden(t *testing.T, name string, m *Model) {
	t.Helper()
	got := m.Render()
	if strings.Contains(got, "\x1b") {
		t.Fatalf("%s: the colourless rendering holds an escape sequence", name)
	}
	lines := strings.Split(got, "\n")
	if len(lines) != m.h {
		t.Fatalf("%s: %d lines, want %d", name, len(lines), m.h)
	}
	for i, l := range lines {
		if n := ansi.StringWidth(l); n != m.w {
			t.Fatalf("%s: line %d is %d cells wide, want %d: %q", name, i, n, m.w, l)
		}
	}
	// Trailing spaces are kept: the file shows the exact screen.
	path := filepath.Join(testdata, name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./tui -run Golden -update to write it)", err)
	}
	if got+"\n" != string(want) {
		t.Errorf("%s differs from %s (go test ./tui -run Golden -update rewrites it):\n--- got\n%s\n--- want\n%s", name, path, got, want)
	}
}

func TestGolden(t *testing.T) {
	sizes := [][2]int{{80, 24}, {140, 40}}
	scenes := []struct {
		name string
		make func(t *testing.T, w, h int) *Model
	}{
		{"nodes", func(t *testing.T, w, h int) *Model { return probedNodes(t, w, h) }},
		{"nodes-hostkey", func(t *testing.T, w, h int) *Model {
			m := probedNodes(t, w, h)
			press(m, "j", "j", "enter")
			return m
		}},
		{"ranktable", func(t *testing.T, w, h int) *Model {
			m := probedNodes(t, w, h)
			press(m, "2", "j", "enter", "backspace", "backspace", "backspace", "'0-3", "enter")
			return m
		}},
		{"job", func(t *testing.T, w, h int) *Model {
			m := probedNodes(t, w, h)
			press(m, "3")
			return m
		}},
		{"job-plans-scrolled", func(t *testing.T, w, h int) *Model {
			m := probedNodes(t, w, h)
			press(m, "3", "down", "down", "down", "down", "down", "down", "down", "down")
			return m
		}},
		{"job-plan-applied", func(t *testing.T, w, h int) *Model {
			m := probedNodes(t, w, h)
			press(m, "3", "down", "down", "p")
			return m
		}},
		{"dashboard", func(t *testing.T, w, h int) *Model { return trainingJob(t, 2, 120, w, h) }},
		{"dashboard-search", func(t *testing.T, w, h int) *Model {
			m := trainingJob(t, 2, 120, w, h)
			press(m, "/", "'step 100", "enter")
			return m
		}},
		{"dashboard-failed", func(t *testing.T, w, h int) *Model {
			m := trainingJob(t, 4, 80, w, h)
			feed(m,
				ev(event.KindWorker, 90, func(e *event.Event) {
					e.Node, e.Rank, e.State, e.Code = "localhost", 3, event.WorkerFailed, 1
				}),
				ev(event.KindJob, 91, func(e *event.Event) {
					e.State, e.Rank, e.Node = event.JobFailed, 3, "localhost"
					e.Message = "rank 3 exited with code 1"
					e.Tail = []string{"[train] step 80 loss 4.1", "panic: runtime error: index out of range [8] with length 8", "goroutine 1 [running]:", "main.main()"}
				}))
			return m
		}},
		{"dashboard-64", func(t *testing.T, w, h int) *Model { return trainingJob(t, 64, 1000, w, h) }},
		{"dashboard-hung", func(t *testing.T, w, h int) *Model {
			m := trainingJob(t, 4, 60, w, h)
			diag := "rank 2 on localhost stuck: no progress report for 4 s (the process is stopped or frozen); ranks 0–1, 3 waiting in AllReduce #121 (dp) for 4 s"
			feed(m,
				ev(event.KindJob, 70, func(e *event.Event) { e.State, e.Rank, e.Node, e.Message = event.JobHung, 2, "localhost", diag }),
				worker(71, "localhost", 2, event.WorkerStopped, -1, "SIGKILL"),
				worker(71, "localhost", 0, event.WorkerStopped, -1, "SIGTERM"),
				worker(71, "localhost", 1, event.WorkerStopped, -1, "SIGTERM"),
				worker(71, "localhost", 3, event.WorkerStopped, -1, "SIGTERM"),
				ev(event.KindJob, 72, func(e *event.Event) {
					e.State, e.Rank, e.Node, e.Code, e.Message = event.JobFailed, 2, "localhost", -1, "job hung: "+diag
				}))
			return m
		}},
		{"dashboard-lost", func(t *testing.T, w, h int) *Model {
			m := trainingJob(t, 2, 60, w, h)
			feed(m,
				ev(event.KindNode, 70, func(e *event.Event) {
					e.Node, e.State, e.Message = "localhost", event.NodeLost, "its agent has been silent for 3 s (no heartbeat; the agent is stopped, frozen or cut off)"
				}),
				ev(event.KindJob, 71, func(e *event.Event) {
					e.State, e.Rank, e.Node, e.Code = event.JobFailed, -1, "localhost", -1
					e.Message = "node localhost lost: its agent has been silent for 3 s (no heartbeat; the agent is stopped, frozen or cut off)"
				}))
			return m
		}},
		{"dashboard-log-wrapped", func(t *testing.T, w, h int) *Model {
			m := trainingJob(t, 2, 60, w, h)
			feed(m, ev(event.KindLog, 70, func(e *event.Event) {
				e.Rank, e.Line = 0, "gptui: data parallel: gradient all-reduce: comm: rank 1 (127.0.0.1:37433): read: read tcp 127.0.0.1:35065->127.0.0.1:37433: read: connection reset by peer"
			}))
			press(m, "W", "z")
			return m
		}},
		{"nodes-accept", func(t *testing.T, w, h int) *Model {
			m := probedNodes(t, w, h)
			press(m, "j", "j", "a")
			return m
		}},
		{"help", func(t *testing.T, w, h int) *Model {
			m := probedNodes(t, w, h)
			press(m, "?")
			return m
		}},
		{"quit-confirm", func(t *testing.T, w, h int) *Model {
			m := trainingJob(t, 2, 40, w, h)
			press(m, "q")
			return m
		}},
	}
	for _, sc := range scenes {
		for _, sz := range sizes {
			name := fmt.Sprintf("%s-%dx%d", sc.name, sz[0], sz[1])
			t.Run(name, func(t *testing.T) { golden(t, name, sc.make(t, sz[0], sz[1])) })
		}
	}
	// The live truth of issue 23, at the smallest and a large terminal.
	for _, sc := range []struct {
		name string
		make func(t *testing.T, w, h int) *Model
	}{
		{"dashboard-events", func(t *testing.T, w, h int) *Model {
			m := restartedJob(t, w, h)
			press(m, "tab", "tab", "tab", "tab") // log → chart → nodes → ranks → events
			return m
		}},
		{"dashboard-silent", func(t *testing.T, w, h int) *Model { return silentRank(t, w, h) }},
		{"dashboard-node-lost", func(t *testing.T, w, h int) *Model { return lostNode(t, w, h) }},
	} {
		for _, sz := range [][2]int{{80, 24}, {200, 60}} {
			name := fmt.Sprintf("%s-%dx%d", sc.name, sz[0], sz[1])
			t.Run(name, func(t *testing.T) { golden(t, name, sc.make(t, sz[0], sz[1])) })
		}
	}
}
