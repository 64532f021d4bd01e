package jobdir

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gptui/gptui/event"
)

const testID = "20261121-201141-455c59"

// newJob makes a job folder under a temporary directory with this
// process as its supervisor.
func newJob(t *testing.T) (base, dir string) {
	t.Helper()
	base = t.TempDir()
	dir, err := Create(base, Spec{ID: testID, Dir: base, Nproc: 2, Config: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	return base, dir
}

// gone is the record of a supervisor of this machine that is gone: no
// process has its pid.
func gone() Supervisor {
	s := Self("")
	s.PID = 1 << 30
	return s
}

func TestCreateAndRead(t *testing.T) {
	base, dir := newJob(t)
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the job's folder: %v, %v; want mode 0700", fi.Mode(), err)
	}
	if _, err := Create(base, Spec{ID: "../x"}); err == nil {
		t.Error("Create took a path for an id")
	}
	// A node's job folder (no job.json) and other names are not jobs.
	os.MkdirAll(Path(base, "20261121-201141-aaaaaa"), 0o755)
	os.MkdirAll(filepath.Join(base, Root, "plan-link-x"), 0o755)
	jobs, err := List(base)
	if err != nil || len(jobs) != 1 || jobs[0].ID != testID || jobs[0].Spec.Nproc != 2 {
		t.Fatalf("List: %v, %+v", err, jobs)
	}
	// No supervisor yet: not started, and not running.
	if j := jobs[0]; j.Alive || j.State() != StateDead {
		t.Errorf("a job without a supervisor: alive %v, state %s", j.Alive, j.State())
	}
	if err := WriteSupervisor(dir, Self("sock")); err != nil {
		t.Fatal(err)
	}
	j, err := Find(base, "")
	if err != nil || !j.Alive || j.State() != StateStarting {
		t.Fatalf("Find newest: %v, %+v", err, j)
	}
	for _, id := range []string{"nope", "20261121-201141-000000"} {
		if _, err := Find(base, id); err == nil || !strings.Contains(err.Error(), "gptui jobs") {
			t.Errorf("Find(%q): %v", id, err)
		}
	}
	if _, err := Find(t.TempDir(), ""); err == nil {
		t.Error("Find in a directory without jobs")
	}
}

// TestAlive: a supervisor is alive while its process runs, and not when
// its pid is another process's (another start time) or of another boot.
func TestAlive(t *testing.T) {
	self := Self("")
	if !self.Alive() {
		t.Fatalf("this process, %+v, is not alive", self)
	}
	for _, s := range []Supervisor{
		{PID: self.PID, Host: self.Host, Boot: self.Boot, Start: self.Start + 1},
		{PID: self.PID, Host: self.Host, Boot: "another boot", Start: self.Start},
		{PID: 1 << 30, Host: self.Host},
		{},
	} {
		if s.Alive() {
			t.Errorf("%+v is alive", s)
		}
	}
}

// TestControl: the socket is mode 0600, answers ping, passes stop and
// restart to the handler and brings its errors back; a socket path too
// long for a Unix socket goes to a folder of its own.
func TestControl(t *testing.T) {
	for _, long := range []bool{false, true} {
		_, dir := newJob(t)
		if long {
			dir = filepath.Join(dir, strings.Repeat("d", 120))
			os.MkdirAll(dir, 0o700)
		}
		c, err := Listen(dir)
		if err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(c.Path()); err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
			t.Errorf("the socket %s: %v, %v", c.Path(), fi.Mode(), err)
		}
		if long == (filepath.Dir(c.Path()) == dir) || len(c.Path()) > maxSocketPath {
			t.Errorf("long path %v: the socket is %s", long, c.Path())
		}
		var got []string
		go c.Serve(func(op string) error {
			got = append(got, op)
			if op == OpRestart {
				return errors.New("not now")
			}
			return nil
		})
		if err := Call(c.Path(), OpStop); err != nil {
			t.Errorf("stop: %v", err)
		}
		if err := Call(c.Path(), OpRestart); err == nil || err.Error() != "not now" {
			t.Errorf("restart: %v, want the handler's error", err)
		}
		path := c.Path()
		c.Close()
		if fmt.Sprint(got) != "[stop restart]" {
			t.Errorf("the handler got %v", got)
		}
		if _, err := os.Stat(path); err == nil {
			t.Errorf("Close left the socket %s", path)
		}
		if err := Call(path, OpPing); err == nil {
			t.Error("a call to a closed socket succeeded")
		}
	}
}

// TestLogAndFollow: events go to the log, samples to theirs; a follower
// replays the log from its start, gets the samples written after it
// began, and ends after the job's end once the supervisor is gone; the
// summary follows the events.
func TestLogAndFollow(t *testing.T) {
	_, dir := newJob(t)
	l, err := OpenLog(dir, NewSummary(100, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteSupervisor(dir, Self("")); err != nil {
		t.Fatal(err)
	}
	mk := func(kind, state string, rank int) event.Event {
		e := event.New(kind)
		e.State, e.Rank, e.Node = state, rank, "n1"
		return e
	}
	started := mk(event.KindJob, event.JobStarted, -1)
	ready := mk(event.KindNode, event.NodeReady, -1)
	metrics := mk(event.KindMetrics, "", 0)
	metrics.Metrics = &event.Metrics{Step: 7, Loss: 3.5}
	saved := mk(event.KindCheckpoint, event.CheckpointSaved, 0)
	saved.Checkpoint = &event.Checkpoint{Step: 8, Dir: "output/step_00000008"}
	for _, e := range []event.Event{ready, started, metrics, saved} {
		if err := l.Write(e); err != nil {
			t.Fatal(err)
		}
	}
	early := mk(event.KindMemory, "", 0) // before the follower: not sent
	l.Write(early)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch := Follow(ctx, dir, 0)
	next := func() event.Event {
		t.Helper()
		select {
		case e, ok := <-ch:
			if !ok {
				t.Fatal("the stream ended early")
			}
			return e
		case <-ctx.Done():
			t.Fatal("no event")
		}
		return event.Event{}
	}
	for _, want := range []string{event.KindNode, event.KindJob, event.KindMetrics, event.KindCheckpoint} {
		if e := next(); e.Kind != want {
			t.Fatalf("replayed %s, want %s", e.Kind, want)
		}
	}
	// Live: a sample and an event.
	time.Sleep(3 * followEvery)
	prog := mk(event.KindProgress, "", 1)
	prog.Progress = &event.Progress{Step: 9}
	l.Write(prog)
	if e := next(); e.Kind != event.KindProgress || e.Progress.Step != 9 {
		t.Fatalf("the live sample: %+v", e)
	}
	end := mk(event.KindJob, event.JobStopped, -1)
	end.Message = "stopped on request"
	l.Write(end)
	if e := next(); !e.Ends() {
		t.Fatalf("want the end, got %+v", e)
	}
	// The supervisor (this process) is alive: the stream goes on until it
	// is gone.
	select {
	case e, ok := <-ch:
		t.Fatalf("after the end, with the supervisor alive: %+v, %v", e, ok)
	case <-time.After(2 * livenessEvery):
	}
	l.Close()
	WriteSupervisor(dir, gone())
	if _, ok := <-ch; ok {
		t.Fatal("an event after the end")
	}

	j, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := j.Summary
	if j.State() != StateStopped || s.Done != 8 || s.Loss != 3.5 || s.MaxSteps != 100 || fmt.Sprint(s.Nodes) != "[n1]" ||
		s.Checkpoint == nil || s.Checkpoint.Step != 8 || s.CheckpointNode != "n1" || s.Message != "stopped on request" {
		t.Errorf("the summary: state %s, %+v", j.State(), s)
	}
	// Samples are not in the event log.
	b, _ := os.ReadFile(filepath.Join(dir, EventsFile))
	if strings.Contains(string(b), `"kind":"memory"`) || strings.Contains(string(b), `"kind":"progress"`) {
		t.Errorf("samples in the event log:\n%s", b)
	}
}

// TestFollowDeadSupervisor: a supervisor gone without the job's end ends
// the stream with a failure that says so; a line of another version ends
// it naming the versions.
func TestFollowDeadSupervisor(t *testing.T) {
	_, dir := newJob(t)
	l, err := OpenLog(dir, NewSummary(10, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	e := event.New(event.KindJob)
	e.State = event.JobStarted
	e.Time = time.Now().Add(-time.Hour).Round(time.Millisecond) // an hour before the view looks
	l.Write(e)
	WriteSupervisor(dir, gone())
	var last event.Event
	for e := range Follow(context.Background(), dir, 0) {
		last = e
	}
	if last.State != event.JobFailed || !strings.Contains(last.Message, "is gone without saying how the job ended") {
		t.Errorf("the last event: %+v", last)
	}
	if !last.Time.Equal(e.Time) {
		t.Errorf("the failure is stamped %v, not at the job's last event, %v", last.Time, e.Time)
	}
	j, _ := Read(dir)
	if j.State() != StateDead {
		t.Errorf("state %s, want dead", j.State())
	}

	f, _ := os.OpenFile(filepath.Join(dir, EventsFile), os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"v":99,"kind":"job"}` + "\n")
	f.Close()
	for e := range Follow(context.Background(), dir, 0) {
		last = e
	}
	if last.State != event.JobFailed || !strings.Contains(last.Message, "v99") {
		t.Errorf("after a line of another version: %+v", last)
	}
}

// TestSamplesCutBack: samples.jsonl is emptied when full, and a follower
// reads on from its start.
func TestSamplesCutBack(t *testing.T) {
	_, dir := newJob(t)
	l, err := OpenLog(dir, NewSummary(10, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	WriteSupervisor(dir, Self(""))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := Follow(ctx, dir, 0)
	e := event.New(event.KindHealth)
	e.Node, e.Message = "n1", strings.Repeat("x", 64<<10)
	n := SamplesCap/(64<<10) + 8
	for i := range n {
		e.Rank = i
		if err := l.Write(e); err != nil {
			t.Fatal(err)
		}
		if i%16 == 15 {
			time.Sleep(2 * followEvery) // let the follower keep up
		}
	}
	if fi, _ := os.Stat(filepath.Join(dir, SamplesFile)); fi.Size() > SamplesCap {
		t.Errorf("samples.jsonl is %d bytes, over %d", fi.Size(), SamplesCap)
	}
	seen := 0
	for seen < n {
		select {
		case got := <-ch:
			if got.Kind == event.KindHealth && got.Rank == n-1 {
				return
			}
			seen++
		case <-time.After(10 * time.Second):
			t.Fatalf("the follower stopped after %d of %d samples", seen, n)
		}
	}
}

// TestSummaryDone: the steps done, in the units of max_steps and of a
// checkpoint's step, through an attempt, a restart (the step resumed
// from, until the new attempt logs) and a re-plan to an older
// checkpoint; the loss is kept across the restart.
func TestSummaryDone(t *testing.T) {
	s := NewSummary(10, time.Now())
	ev := func(kind, state string, f func(*event.Event)) {
		e := event.New(kind)
		e.State, e.Rank = state, -1
		if f != nil {
			f(&e)
		}
		s.Add(e)
	}
	metrics := func(step int, loss float64) {
		ev(event.KindMetrics, "", func(e *event.Event) { e.Rank, e.Metrics = 0, &event.Metrics{Step: step, Loss: loss} })
	}
	restart := func(state string, step int) {
		ev(event.KindJob, state, func(e *event.Event) { e.Restart = &event.Restart{Count: 1, Max: 2, Cause: "killed", Step: step} })
	}
	for _, tc := range []struct {
		what   string
		do     func()
		done   int
		loss   float64
		logged bool
	}{
		{"new", func() {}, 0, 0, false},
		{"started", func() { ev(event.KindJob, event.JobStarted, nil) }, 0, 0, false},
		{"step 0 logged", func() { metrics(0, 9) }, 1, 9, true},
		{"step 5 logged", func() { metrics(5, 7) }, 6, 7, true},
		{"restart from the checkpoint of step 4", func() { restart(event.JobRestarting, 4) }, 4, 7, false},
		{"re-planned to step 2", func() { restart(event.JobReplanned, 2) }, 2, 7, false},
		{"the attempt logs step 2", func() { metrics(2, 8) }, 3, 8, true},
		{"done", func() { metrics(9, 6); ev(event.KindJob, event.JobDone, nil) }, 10, 6, true},
		{"restarted after its end, nothing to do", func() { restart(event.JobRestarting, 10) }, 10, 6, false},
	} {
		tc.do()
		if s.Done != tc.done || s.Loss != tc.loss || s.Logged() != tc.logged {
			t.Errorf("%s: done %d, loss %v, logged %v; want %d, %v, %v", tc.what, s.Done, s.Loss, s.Logged(), tc.done, tc.loss, tc.logged)
		}
	}
	if s.Restarts != 2 {
		t.Errorf("%d restarts counted, want 2 (a re-plan is part of its restart)", s.Restarts)
	}
}

// TestAttachNext: a view attached to a job follows it through its end and
// a restart by a new supervisor ('gptui restart'): the first stream ends
// with the stop; Next waits while the job lies stopped, then returns a
// stream of exactly the new attempt's events, from its restart on, none
// sent twice; it gives up when its context ends.
func TestAttachNext(t *testing.T) {
	_, dir := newJob(t)
	l, err := OpenLog(dir, NewSummary(100, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	job := func(state string, step int) event.Event {
		e := event.New(event.KindJob)
		e.State = state
		if step > 0 {
			e.Restart = &event.Restart{Count: 1, Requested: true, Cause: "restarted after its end (gptui restart)", Step: step}
		}
		return e
	}
	steps := func(l *Log, from, to int) {
		for s := from; s <= to; s++ {
			e := event.New(event.KindMetrics)
			e.Rank, e.Node, e.Metrics = 0, "n1", &event.Metrics{Step: s, Loss: 3}
			l.Write(e)
		}
	}
	l.Write(job(event.JobStarted, 0))
	steps(l, 1, 5)
	l.Write(job(event.JobStopped, 0))
	l.Close()
	WriteSupervisor(dir, gone())

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a := Attach(ctx, dir, 0)
	var first []event.Event
	for e := range a.Events() {
		first = append(first, e)
	}
	if n := len(first); n != 7 || !first[n-1].Ends() {
		t.Fatalf("the first attempt: %d events, the last %+v", n, first[n-1])
	}

	// While the job lies stopped, Next waits.
	short, stop := context.WithTimeout(ctx, 3*livenessEvery)
	if n, err := a.Next(short); n != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Next of a job that lies stopped: %v, %v", n, err)
	}
	stop()

	got := make(chan *Attached, 1)
	go func() {
		n, err := a.Next(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- n
	}()
	time.Sleep(3 * followEvery)
	// gptui restart: a new supervisor writes on in the same log.
	WriteSupervisor(dir, Self(""))
	l, err = OpenLog(dir, NewSummary(100, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	l.Write(job(event.JobRestarting, 5))
	l.Write(job(event.JobStarted, 0))
	steps(l, 6, 8)
	var n *Attached
	select {
	case n = <-got:
	case <-ctx.Done():
		t.Fatal("Next did not return after the restart")
	}
	if n == nil {
		t.Fatal("no runner")
	}
	l.Write(job(event.JobStopped, 0))
	l.Close()
	WriteSupervisor(dir, gone())
	var second []string
	for e := range n.Events() {
		s := e.Kind + ":" + e.State
		if e.Metrics != nil {
			s = fmt.Sprintf("step %d", e.Metrics.Step)
		}
		second = append(second, s)
	}
	if want := "[job:restarting job:started step 6 step 7 step 8 job:stopped]"; fmt.Sprint(second) != want {
		t.Errorf("the attempt after the restart: %v, want %s", second, want)
	}
}

// TestSummaryKeepsLostNodes: a node lost during the job stays one of its
// nodes, with why, through the job's failure and a restart without it;
// one that comes back is no longer lost.
func TestSummaryKeepsLostNodes(t *testing.T) {
	s := NewSummary(10, time.Now())
	node := func(name, state, msg string) {
		e := event.New(event.KindNode)
		e.Node, e.State, e.Message = name, state, msg
		s.Add(e)
	}
	job := func(state string) {
		e := event.New(event.KindJob)
		e.State = state
		if state == event.JobRestarting {
			e.Restart = &event.Restart{Count: 1, Max: 1, Cause: "node n2 lost"}
		}
		s.Add(e)
	}
	node("n1", event.NodeReady, "")
	node("n2", event.NodeReady, "")
	job(event.JobStarted)
	node("n2", event.NodeLost, "its agent has been silent for 10 s")
	job(event.JobRestarting)
	node("n1", event.NodeReady, "")
	job(event.JobStarted)
	job(event.JobFailed)
	if fmt.Sprint(slices.Sorted(slices.Values(s.Nodes))) != "[n1 n2]" || s.Lost["n2"] != "its agent has been silent for 10 s" || len(s.Lost) != 1 {
		t.Errorf("after the loss: nodes %v, lost %v", s.Nodes, s.Lost)
	}
	node("n2", event.NodeReady, "")
	if fmt.Sprint(slices.Sorted(slices.Values(s.Nodes))) != "[n1 n2]" || len(s.Lost) != 0 {
		t.Errorf("once it is back: nodes %v, lost %v", s.Nodes, s.Lost)
	}
}
