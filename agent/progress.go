package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/gptui/gptui/event"
)

// ProgressEnv is set to "1" by the agent for each worker it starts: the
// worker then writes records for its agent on its standard error, in lines
// the agent takes out of the log and sends on as typed events: its
// progress every ProgressEvery (PublishProgress, KindProgress events),
// each checkpoint it saves (ReportCheckpoint, KindCheckpoint events) and
// its exit record before it exits (ReportExit, carried by its worker
// event). The worker sends them itself, so a stopped or frozen worker
// falls silent even while its agent is well, and a crashed one says
// nothing. Nothing reads the worker's log lines for these facts.
const ProgressEnv = "GPTUI_PROGRESS"

// ProgressEvery is how often a worker publishes its progress.
const ProgressEvery = time.Second

// The prefixes of the records' lines: the record separator keeps them
// apart from anything a worker logs. Each is followed by the record's
// JSON.
const (
	progressPrefix   = "\x1egptui-progress "
	exitPrefix       = "\x1egptui-exit "
	checkpointPrefix = "\x1egptui-checkpoint "
)

// underAgent reports whether this process is a worker started by an
// agent, which takes its records.
func underAgent() bool { return os.Getenv(ProgressEnv) == "1" }

// writeRecord writes v as a record line with prefix to w.
func writeRecord(w io.Writer, prefix string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s%s\n", prefix, b)
	return err
}

// cutRecord decodes into v the record of line if it is a record line with
// prefix; ok is false for any other line.
func cutRecord(line []byte, prefix string, v any) (ok bool) {
	rest, found := bytes.CutPrefix(line, []byte(prefix))
	return found && json.Unmarshal(rest, v) == nil
}

// PublishProgress writes a progress line with get's progress to w every
// ProgressEvery until done is closed, if the worker was started by an
// agent (ProgressEnv); otherwise it returns at once.
func PublishProgress(w io.Writer, done <-chan struct{}, get func() event.Progress) {
	if !underAgent() {
		return
	}
	t := time.NewTicker(ProgressEvery)
	defer t.Stop()
	for {
		if err := writeRecord(w, progressPrefix, get()); err != nil {
			return
		}
		select {
		case <-done:
			return
		case <-t.C:
		}
	}
}

// parseProgress returns the progress of a progress line; ok is false for
// any other line.
func parseProgress(line []byte) (p event.Progress, ok bool) {
	return p, cutRecord(line, progressPrefix, &p)
}

// ReportExit writes the worker's exit record x to w (its standard error),
// if the worker was started by an agent (ProgressEnv); the agent passes it
// on with the worker's end (event.Event.Exit) when the worker then exits
// with x.Code. Call it last, just before os.Exit.
func ReportExit(w io.Writer, x event.Exit) {
	if underAgent() {
		writeRecord(w, exitPrefix, x)
	}
}

// parseExit returns the exit record of an exit record's line; ok is false
// for any other line.
func parseExit(line []byte) (x event.Exit, ok bool) {
	return x, cutRecord(line, exitPrefix, &x)
}

// checkpointRecord is a checkpoint record: the state (event.CheckpointSaving
// or CheckpointSaved) and the checkpoint.
type checkpointRecord struct {
	State      string           `json:"state"`
	Checkpoint event.Checkpoint `json:"checkpoint"`
}

// ReportCheckpoint writes a record of a checkpoint the worker saved
// (state event.CheckpointSaved) or began saving in the background
// (event.CheckpointSaving) to w (its standard error), if the worker was
// started by an agent (ProgressEnv); the agent sends it on as a
// KindCheckpoint event. The engine calls it through
// engine.Options.OnCheckpoint.
func ReportCheckpoint(w io.Writer, state string, c event.Checkpoint) {
	if underAgent() {
		writeRecord(w, checkpointPrefix, checkpointRecord{state, c})
	}
}

// parseCheckpoint returns the record of a checkpoint record's line; ok is
// false for any other line.
func parseCheckpoint(line []byte) (r checkpointRecord, ok bool) {
	return r, cutRecord(line, checkpointPrefix, &r) && (r.State == event.CheckpointSaving || r.State == event.CheckpointSaved)
}
