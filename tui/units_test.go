package tui

import (
	"regexp"
	"strings"
	"testing"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/planner"
	"github.com/gptui/gptui/units"
)

// decimalSize is a memory size written in decimal units or with a bare
// suffix, as screens once wrote them: "25.3 GB", "23.5G", "312M".
var decimalSize = regexp.MustCompile(`[0-9](\.[0-9]+)? ?([KMGT]B|[KMGT])\b`)

// TestMemoryUnitsAgree: one memory size reads the same wherever it is
// shown — the Nodes screen (a node's RAM, in its row and its details),
// the dashboard (the node's health, a worker's bar and its row in the
// ranks pane) and 'gptui plan' (planner.Summary, the chosen plan's line,
// and the table's GiB column) — in binary units, labelled (units.Bytes).
// The issue found one machine's RAM shown as "25.3 GB", "23.5G" and
// "25.77 GB" on three screens.
func TestMemoryUnitsAgree(t *testing.T) {
	const n = 25_300_000_000 // the RAM of the machine
	want := units.Bytes(n)
	if want != "23.6 GiB" {
		t.Fatalf("units.Bytes(%d) = %q, want 23.6 GiB", n, want)
	}
	check := func(where, text, want string) {
		t.Helper()
		if !strings.Contains(text, want) {
			t.Errorf("%s lacks %q:\n%s", where, want, text)
		}
		if s := decimalSize.FindString(text); s != "" {
			t.Errorf("%s shows a size in decimal units or without its unit, %q:\n%s", where, s, text)
		}
	}

	// The Nodes screen: a node without GPUs, in its row and its details.
	m := probedNodes(t, 140, 40)
	m.Update(eventsMsg{stream: probeStream, events: []event.Event{
		ev(event.KindProbe, 2, func(e *event.Event) {
			e.Node, e.Probe = "gpu1", &event.Probe{Hostname: "gpu1", OS: "linux/amd64", Cores: 16, MemBytes: n}
		}),
	}})
	out := m.Render()
	row := regexp.MustCompile(`(?m)^. gpu1 .*$`).FindString(out)
	check("the Nodes screen's row", row, "16 cores, "+want+" RAM")
	press(m, "down", "enter")
	out = m.Render()
	check("the node's details", regexp.MustCompile(`(?m)^.*gpu1 \(linux/amd64\).*$`).FindString(out), "16 cores, "+want+" RAM")

	// The dashboard: the node's health (used of n), a worker of n bytes:
	// its bar (n of the node's n) and its row in the ranks pane.
	m = trainingJob(t, 2, 10, 140, 40)
	feed(m,
		ev(event.KindHealth, 12, func(e *event.Event) {
			e.Node, e.Health = "localhost", &event.Health{CPUPercent: 50, Cores: 16, MemUsed: 12 << 30, MemTotal: n, WorkersRSS: 3 << 29}
		}),
		ev(event.KindMemory, 12, func(e *event.Event) {
			e.Node, e.Rank, e.Device, e.Used, e.Total = "localhost", 1, -1, n, n
		}))
	out = m.Render()
	check("the dashboard's health", regexp.MustCompile(`localhost  cpu 50% of 16  mem .*`).FindString(out), "mem 12.0/"+want)
	check("the dashboard's health", regexp.MustCompile(`workers .*`).FindString(out), "workers 1.5 GiB")
	check("the dashboard's memory bar", regexp.MustCompile(`r1 +[^ ]+ .*`).FindString(out), " 23.6/"+want)
	check("the dashboard's rank row", rankRowOf(out, 1), " "+want+" ")

	// 'gptui plan': the chosen plan's line and the table.
	p := planner.Plan{Strategy: planner.Strategy{DP: 1, ShardingDegree: 1, ShardingStage: 1, MP: 1, PP: 1, VPP: 1, MicroBatch: 1},
		Feasible: true, StepTime: 1, Capacity: 32 << 30, Mem: planner.Memory{Total: n, Params: n / 4, Grads: n / 4, Optimizer: n / 2}}
	check("gptui plan's chosen line", planner.Summary(p), "memory "+want+" per device")
	var table strings.Builder
	if err := planner.WriteTable(&table, []planner.Plan{p}, 0); err != nil {
		t.Fatal(err)
	}
	head, body, _ := strings.Cut(table.String(), "\n")
	if !strings.Contains(head, "total GiB") || !strings.Contains(body, " 23.56 ") {
		t.Errorf("gptui plan's table does not give %s as 23.56 under total GiB:\n%s", want, table.String())
	}
}
