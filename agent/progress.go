package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/event"
)

// ProgressEnv is set to "1" by the agent for each worker it starts: the
// worker then publishes its progress (PublishProgress) every ProgressEvery
// on its standard error, in lines the agent takes out of the log and sends
// on as KindProgress events, and its exit record (ReportExit) before it
// exits. The worker sends them itself, so a stopped or frozen worker falls
// silent even while its agent is well, and a crashed one says nothing.
const ProgressEnv = "GPTUI_PROGRESS"

// ProgressEvery is how often a worker publishes its progress.
const ProgressEvery = time.Second

// progressPrefix starts a progress line; the record separator keeps it
// apart from anything a worker logs.
const progressPrefix = "\x1egptui-progress "

// exitPrefix starts an exit record's line.
const exitPrefix = "\x1egptui-exit "

// PublishProgress writes a progress line with get's progress to w every
// ProgressEvery until done is closed, if the worker was started by an
// agent (ProgressEnv); otherwise it returns at once.
func PublishProgress(w io.Writer, done <-chan struct{}, get func() event.Progress) {
	if os.Getenv(ProgressEnv) != "1" {
		return
	}
	t := time.NewTicker(ProgressEvery)
	defer t.Stop()
	for {
		b, err := json.Marshal(get())
		if err != nil {
			return
		}
		if _, err := fmt.Fprintf(w, "%s%s\n", progressPrefix, b); err != nil {
			return
		}
		select {
		case <-done:
			return
		case <-t.C:
		}
	}
}

// Progresser reports a communicator's operations: *comm.World (its TCP
// groups) and *nccl.Fabric (its NCCL communicators).
type Progresser interface {
	Progress() comm.Progress
}

// ProgressOf is a worker's progress: its step and its communicators'
// operations, all of them together (none without communicators): the
// operations in flight, the longest-running first, the number done, and
// the one that started last of those done last.
func ProgressOf(step int, comms ...Progresser) event.Progress {
	p := event.Progress{Step: step}
	var inFlight []comm.OpStatus
	var last comm.OpStatus
	for _, c := range comms {
		cp := c.Progress()
		p.Ops += cp.Done
		inFlight = append(inFlight, cp.InFlight...)
		if cp.Last.Seq > 0 && (last.Seq == 0 || cp.Last.Since.After(last.Since)) {
			last = cp.Last
		}
	}
	slices.SortStableFunc(inFlight, func(a, b comm.OpStatus) int { return a.Since.Compare(b.Since) })
	for _, s := range inFlight {
		p.InFlight = append(p.InFlight, event.Op{Group: s.Group, Op: s.Op, Seq: s.Seq, WaitS: time.Since(s.Since).Seconds()})
	}
	if last.Seq > 0 {
		p.Last = &event.Op{Group: last.Group, Op: last.Op, Seq: last.Seq}
	}
	return p
}

// parseProgress returns the progress of a progress line; ok is false for
// any other line.
func parseProgress(line []byte) (p event.Progress, ok bool) {
	rest, found := strings.CutPrefix(string(line), progressPrefix)
	if !found {
		return p, false
	}
	return p, json.Unmarshal([]byte(rest), &p) == nil
}

// ReportExit writes the worker's exit record x to w (its standard error),
// if the worker was started by an agent (ProgressEnv); the agent passes it
// on with the worker's end (event.Event.Exit) when the worker then exits
// with x.Code. Call it last, just before os.Exit.
func ReportExit(w io.Writer, x event.Exit) {
	if os.Getenv(ProgressEnv) != "1" {
		return
	}
	b, err := json.Marshal(x)
	if err != nil {
		return
	}
	fmt.Fprintf(w, "%s%s\n", exitPrefix, b)
}

// parseExit returns the exit record of an exit record's line; ok is false
// for any other line.
func parseExit(line []byte) (x event.Exit, ok bool) {
	rest, found := strings.CutPrefix(string(line), exitPrefix)
	if !found {
		return x, false
	}
	return x, json.Unmarshal([]byte(rest), &x) == nil
}
