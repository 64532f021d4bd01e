package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/event"
)

// TestPrinterLocal: a local job prints its shown ranks' lines as "[rank]
// line", standard error's on stderr, and of the launcher's events only a
// hang; a job on nodes prints every event with the node's name.
func TestPrinterLocal(t *testing.T) {
	ev := func(kind string, rank int, f func(*event.Event)) event.Event {
		e := event.New(kind)
		e.Node, e.Rank = "localhost", rank
		f(&e)
		return e
	}
	events := []event.Event{
		ev(event.KindNode, -1, func(e *event.Event) { e.State = event.NodeReady }),
		ev(event.KindJob, -1, func(e *event.Event) { e.State = event.JobStarted }),
		ev(event.KindLog, 0, func(e *event.Event) { e.Line = "[train] step 0" }),
		ev(event.KindLog, 1, func(e *event.Event) { e.Line = "[train] step 0 of rank 1" }),
		ev(event.KindLog, 0, func(e *event.Event) { e.Line, e.Stderr = "a warning", true }),
		ev(event.KindWorker, 1, func(e *event.Event) { e.State, e.Code = event.WorkerFailed, 1 }),
		ev(event.KindJob, 1, func(e *event.Event) { e.State, e.Message = event.JobHung, "rank 1 on localhost stuck" }),
		ev(event.KindJob, -1, func(e *event.Event) { e.State = event.JobFailed }),
	}
	for _, tt := range []struct {
		local          bool
		stdout, stderr string
	}{
		{true, "[0] [train] step 0\n[hang] rank 1 on localhost stuck\n", "[0] a warning\n"},
		{false, "[localhost] ready\n[job] started\n[localhost/0] [train] step 0\n[localhost/0] a warning\n[localhost/1] exited with code 1\n[hang] rank 1 on localhost stuck\n[job] failed\n", ""},
	} {
		var out, errb bytes.Buffer
		p := &printer{out: &out, err: &errb, local: tt.local, show: func(r int) bool { return r == 0 }, every: time.Hour, start: time.Now()}
		ch := make(chan event.Event, len(events))
		for _, e := range events {
			ch <- e
		}
		close(ch)
		p.consume(ch)
		if out.String() != tt.stdout || errb.String() != tt.stderr {
			t.Errorf("local %v: stdout %q, stderr %q; want %q, %q", tt.local, out.String(), errb.String(), tt.stdout, tt.stderr)
		}
	}
}

// TestPrintFailure: the failure's lines name the rank alone for a local
// job, the node and rank otherwise.
func TestPrintFailure(t *testing.T) {
	for _, tt := range []struct {
		f     cluster.Failure
		local bool
		want  string
	}{
		{cluster.Failure{Rank: 1, Node: "localhost", Code: 2, Tail: []string{"no data"}}, true,
			"gptui run: rank 1 exited with code 2; its last lines:\n[1] no data\n"},
		{cluster.Failure{Rank: 0, Node: "localhost", Code: -1, Signal: "SIGKILL"}, true,
			"gptui run: rank 0 was killed by SIGKILL without printing anything\n"},
		{cluster.Failure{Rank: 3, Node: "n2", Code: 1, Tail: []string{"boom"}}, false,
			"gptui run: rank 3 on n2 exited with code 1; its last lines:\n[n2/3] boom\n"},
		{cluster.Failure{Rank: -1, Node: "n2", Lost: true, Msg: "its agent has been silent for 10 s", Tail: []string{"bye"}}, false,
			"gptui run: node n2 was lost: its agent has been silent for 10 s\n[n2] bye\n"},
		{cluster.Failure{Rank: -1, Node: "localhost", Lost: true, Msg: "the agent's connection closed"}, true,
			"gptui run: node localhost was lost: the agent's connection closed\n"},
	} {
		var b bytes.Buffer
		printFailure(&b, &tt.f, tt.local)
		if b.String() != tt.want {
			t.Errorf("%+v (local %v):\n%q\nwant\n%q", tt.f, tt.local, b.String(), tt.want)
		}
	}
}
