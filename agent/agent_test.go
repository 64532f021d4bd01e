package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/launch"
)

// The test binary doubles as the worker: with AGENT_TEST_WORKER=1 it runs
// the script in its arguments.
func TestMain(m *testing.M) {
	if os.Getenv("AGENT_TEST_WORKER") == "1" {
		os.Exit(worker(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// worker runs a script: "print TEXT", "warn TEXT" (to stderr), "metrics DIR N" (N records in
// RANK's metrics file in DIR), "sleep D", "spin D" (busy for D), "report JSON" (an exit record,
// ReportExit), "checkpoint STATE:STEP:DIR" (a checkpoint record,
// ReportCheckpoint), "exit N".
func worker(args []string) int {
	rank, _ := strconv.Atoi(os.Getenv("RANK"))
	for len(args) >= 2 {
		cmd, arg := args[0], args[1]
		args = args[2:]
		switch cmd {
		case "print":
			fmt.Println(arg)
		case "warn":
			fmt.Fprintln(os.Stderr, arg)
		case "metrics":
			n, _ := strconv.Atoi(args[0])
			args = args[1:]
			var b []byte
			for i := range n {
				b, _ = event.Metrics{Step: i, Loss: 10 - float64(i), TokensPerS: 100, CommBytes: map[string]int64{"dp": 1}}.AppendLine(b)
			}
			if err := os.WriteFile(event.MetricsFile(arg, rank), b, 0o644); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 100
			}
		case "report":
			var x event.Exit
			if err := json.Unmarshal([]byte(arg), &x); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 100
			}
			ReportExit(os.Stderr, x)
		case "checkpoint":
			f := strings.SplitN(arg, ":", 3)
			step, _ := strconv.Atoi(f[1])
			ReportCheckpoint(os.Stderr, f[0], event.Checkpoint{Step: step, Dir: f[2]})
		case "sleep":
			d, _ := time.ParseDuration(arg)
			time.Sleep(d)
		case "spin":
			d, _ := time.ParseDuration(arg)
			for start := time.Now(); time.Since(start) < d; {
			}
		case "exit":
			n, _ := strconv.Atoi(arg)
			return n
		}
	}
	return 0
}

// recorder collects the events an agent writes.
type recorder struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.Write(p)
}

func (r *recorder) events(t *testing.T) []event.Event {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var es []event.Event
	rd := event.NewReader(bytes.NewReader(r.buf.Bytes()))
	for {
		e, err := rd.Next()
		if err == io.EOF {
			return es
		}
		if err != nil {
			t.Fatal(err)
		}
		if e.Node != "n1" {
			t.Errorf("event %+v lacks the node's name", e)
		}
		es = append(es, e)
	}
}

func spec(t *testing.T, scripts ...[]string) *Spec {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	s := &Spec{Job: "j1", Node: "n1", Exe: exe, LogDir: t.TempDir(), GraceS: 0.5}
	for r, sc := range scripts {
		s.Workers = append(s.Workers, WorkerSpec{Rank: r + 10, LocalRank: r, Device: -1, Args: sc,
			Env: append(launch.Env(r+10, r, len(scripts), "127.0.0.1", 1, "s"), "AGENT_TEST_WORKER=1")})
	}
	return s
}

func find(es []event.Event, kind, state string, rank int) *event.Event {
	for i, e := range es {
		if e.Kind == kind && (state == "" || e.State == state) && (rank == -2 || e.Rank == rank) {
			return &es[i]
		}
	}
	return nil
}

func TestRunReportsEvents(t *testing.T) {
	s := spec(t, []string{"print", "hello", "metrics", "", "3", "spin", "2500ms"},
		[]string{"print", "world", "warn", "careful", "checkpoint", "saving:10:", "checkpoint", "saved:10:output/step_00000010"})
	s.Workers[0].Args[3] = s.LogDir
	// A stale metrics file from an earlier run is not reported.
	os.WriteFile(event.MetricsFile(s.LogDir, 11), []byte(`{"step":99}`+"\n"), 0o644)
	var out recorder
	if err := Run(context.Background(), s, nil, event.NewWriter(&out)); err != nil {
		t.Fatal(err)
	}
	es := out.events(t)
	for _, r := range []int{10, 11} {
		for _, st := range []string{event.WorkerStarting, event.WorkerRunning, event.WorkerExited} {
			if find(es, event.KindWorker, st, r) == nil {
				t.Errorf("no worker %s event for rank %d", st, r)
			}
		}
		if e := find(es, event.KindWorker, event.WorkerRunning, r); e != nil && !strings.HasPrefix(e.Message, "pid ") {
			t.Errorf("running event %+v does not give the pid", e)
		}
	}
	if e := find(es, event.KindLog, "", 10); e == nil || e.Line != "hello" || e.Stderr {
		t.Errorf("rank 10's log line: %+v", e)
	}
	// A line of standard error is marked so; one of standard output not.
	var warned bool
	for _, e := range es {
		if e.Kind == event.KindLog && e.Rank == 11 {
			if e.Stderr != (e.Line == "careful") {
				t.Errorf("rank 11's log line %q: Stderr %v", e.Line, e.Stderr)
			}
			warned = warned || e.Line == "careful"
		}
	}
	if !warned {
		t.Errorf("no log event of rank 11's line on standard error")
	}
	// The checkpoint records are typed events, not log lines.
	for _, st := range []string{event.CheckpointSaving, event.CheckpointSaved} {
		e := find(es, event.KindCheckpoint, st, 11)
		want := event.Checkpoint{Step: 10}
		if st == event.CheckpointSaved {
			want.Dir = "output/step_00000010"
		}
		if e == nil || e.Checkpoint == nil || *e.Checkpoint != want {
			t.Errorf("rank 11's checkpoint %s event %+v, want %+v", st, e, want)
		}
	}
	for _, e := range es {
		if e.Kind == event.KindLog && strings.Contains(e.Line, "gptui-") {
			t.Errorf("a record came as a log line: %q", e.Line)
		}
	}
	var steps []int
	for _, e := range es {
		if e.Kind == event.KindMetrics {
			if e.Rank != 10 {
				t.Errorf("metrics of rank %d", e.Rank)
			}
			steps = append(steps, e.Metrics.Step)
		}
	}
	if fmt.Sprint(steps) != "[0 1 2]" {
		t.Errorf("metrics steps %v, want [0 1 2]", steps)
	}
	if e := find(es, event.KindMemory, "", 10); e == nil || e.Used <= 0 || e.Total < e.Used || e.Device != -1 {
		t.Errorf("memory event of rank 10: %+v", e)
	}
	// Each memory event names the worker's pid; the spinning worker's CPU
	// shows from the second report on.
	run := find(es, event.KindWorker, event.WorkerRunning, 10)
	var cpu []float64
	for _, e := range es {
		if e.Kind == event.KindMemory && e.Rank == 10 {
			if e.Proc == nil || run == nil || run.Proc == nil || e.Proc.PID != run.Proc.PID || run.Message != fmt.Sprintf("pid %d", run.Proc.PID) {
				t.Errorf("memory event %+v of rank 10 (running: %+v): want its pid", e.Proc, run)
				continue
			}
			cpu = append(cpu, e.Proc.CPUPercent)
		}
	}
	if len(cpu) < 2 || cpu[0] != 0 || slices.Max(cpu) < 5 {
		t.Errorf("rank 10's CPU while it spins: %v%%, want 0 at first (no earlier reading), then some", cpu)
	}
	if e := find(es, event.KindHealth, "", -1); e == nil || e.Health == nil || e.Health.MemTotal <= 0 || e.Health.MemUsed <= 0 ||
		e.Health.WorkersRSS <= 0 || e.Health.CPUPercent < 0 || e.Health.CPUPercent > 100 || e.Health.Cores < 1 {
		t.Errorf("the node's health event: %+v", e)
	}
	if last := es[len(es)-1]; last.Kind != event.KindJob || last.State != event.JobDone {
		t.Errorf("last event %+v, want job done", last)
	}
}

func TestWorkerFailureStopsTheNode(t *testing.T) {
	s := spec(t, []string{"sleep", "60s"}, []string{"print", "dying", "exit", "3"})
	var out recorder
	start := time.Now()
	err := Run(context.Background(), s, nil, event.NewWriter(&out))
	var je *launch.JobError
	if !errors.As(err, &je) || je.Rank != 11 || je.Code != 3 {
		t.Fatalf("err %v, want rank 11's exit 3", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
	es := out.events(t)
	if e := find(es, event.KindWorker, event.WorkerFailed, 11); e == nil || e.Code != 3 {
		t.Errorf("failed event of rank 11: %+v", e)
	}
	// The worker the failure's stop ended is stopped, not failed.
	if e := find(es, event.KindWorker, event.WorkerStopped, 10); e == nil || e.Signal != "SIGTERM" || find(es, event.KindWorker, event.WorkerFailed, 10) != nil {
		t.Errorf("stopped event of rank 10: %+v", e)
	}
	last := es[len(es)-1]
	if last.State != event.JobFailed || last.Rank != 11 || last.Code != 3 || len(last.Tail) != 1 || last.Tail[0] != "dying" {
		t.Errorf("last event %+v, want job failed naming rank 11 with its tail", last)
	}
}

// TestExitRecords: a worker's exit record reaches the launcher with its
// worker event when the worker then exits with the status it announced,
// and never as a log line; a worker that says it finished (its logs
// failed after its work) neither stops the others nor fails the job.
func TestExitRecords(t *testing.T) {
	for _, tt := range []struct {
		name   string
		script []string
		state  string      // rank 11's worker event
		code   int         // its code
		exit   *event.Exit // its record as passed on
		end    string      // the job's end
	}{
		{"bad input", []string{"report", `{"code":2,"bad_input":true,"error":"Model.x: bad"}`, "exit", "2"},
			event.WorkerFailed, 2, &event.Exit{Code: 2, BadInput: true, Error: "Model.x: bad"}, event.JobFailed},
		{"crash with status 2", []string{"warn", "fatal error: out of memory", "exit", "2"},
			event.WorkerFailed, 2, nil, event.JobFailed},
		{"another status than announced", []string{"report", `{"code":2,"bad_input":true}`, "exit", "3"},
			event.WorkerFailed, 3, nil, event.JobFailed},
		{"finished, logs failed", []string{"report", `{"code":1,"finished":true,"error":"log file x: no space left on device"}`, "exit", "1"},
			event.WorkerExited, 1, &event.Exit{Code: 1, Finished: true, Error: "log file x: no space left on device"}, event.JobDone},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := spec(t, []string{"sleep", "1s"}, tt.script)
			var out recorder
			err := Run(context.Background(), s, nil, event.NewWriter(&out))
			if (err == nil) != (tt.end == event.JobDone) {
				t.Errorf("Run: %v, want the job %s", err, tt.end)
			}
			es := out.events(t)
			e := find(es, event.KindWorker, tt.state, 11)
			if e == nil || e.Code != tt.code || fmt.Sprint(e.Exit) != fmt.Sprint(tt.exit) {
				t.Fatalf("rank 11's worker event %+v, want %s with code %d and exit record %+v", e, tt.state, tt.code, tt.exit)
			}
			if tt.exit != nil && *e.Exit != *tt.exit {
				t.Errorf("exit record %+v, want %+v", *e.Exit, *tt.exit)
			}
			for _, e := range es {
				if e.Kind == event.KindLog && strings.Contains(e.Line, "gptui-exit") {
					t.Errorf("the exit record came as a log line: %q", e.Line)
				}
			}
			// Rank 10 finishes its second of sleep unless rank 11's end
			// stopped it.
			stopped := find(es, event.KindWorker, event.WorkerStopped, 10) != nil
			if want := tt.end != event.JobDone; stopped != want {
				t.Errorf("rank 10 stopped: %v, want %v", stopped, want)
			}
			if last := es[len(es)-1]; last.Kind != event.KindJob || last.State != tt.end {
				t.Errorf("last event %+v, want job %s", last, tt.end)
			}
		})
	}
}

// TestStdinEOFStopsWorkers: the launcher's end of standard input going
// away (a dropped SSH connection) stops every worker.
func TestStdinEOFStopsWorkers(t *testing.T) {
	s := spec(t, []string{"sleep", "60s"}, []string{"sleep", "60s"})
	pr, pw := io.Pipe()
	var out recorder
	done := make(chan error, 1)
	go func() { done <- Run(context.Background(), s, pr, event.NewWriter(&out)) }()
	var pids []int
	for deadline := time.Now().Add(10 * time.Second); len(pids) < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("workers did not start")
		}
		pids = pids[:0]
		for _, e := range out.events(t) {
			if e.Kind == event.KindWorker && e.State == event.WorkerRunning {
				pid, _ := strconv.Atoi(strings.TrimPrefix(e.Message, "pid "))
				pids = append(pids, pid)
			}
		}
	}
	start := time.Now()
	pw.Close()
	select {
	case err := <-done:
		var je *launch.JobError
		if !errors.As(err, &je) || !je.Cancelled {
			t.Errorf("err %v, want a cancelled job", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5 s of EOF")
	}
	t.Logf("stopped in %v", time.Since(start))
	for _, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("worker %d still runs", pid)
		}
	}
	es := out.events(t)
	if last := es[len(es)-1]; last.State != event.JobStopped || !strings.Contains(last.Message, "launcher") {
		t.Errorf("last event %+v, want job stopped by the launcher", last)
	}
}

func TestReadSpec(t *testing.T) {
	for _, tc := range []struct {
		in, err string
	}{
		{`{"job":"j","workers":[{"rank":0,"device":-1,"args":["train"]}]}` + "\nrest", ""},
		{`{"job":"j","workers":[{"rank":0,"device":-1}]}`, ""},
		{"", "no job spec"},
		{"{not json\n", "job spec"},
		{`{"job":"j","workers":[]}` + "\n", "no workers"},
		{`{"workers":[{"rank":1},{"rank":1}]}` + "\n", "repeated"},
		{`{"workers":[{"rank":0,"device":-2}]}` + "\n", "device -2"},
	} {
		r := strings.NewReader(tc.in)
		s, err := ReadSpec(r)
		if tc.err == "" {
			if err != nil || s.Job != "j" {
				t.Errorf("ReadSpec(%q) = %+v, %v", tc.in, s, err)
			}
			if rest, _ := io.ReadAll(r); strings.Contains(tc.in, "\n") && string(rest) != "rest" {
				t.Errorf("ReadSpec(%q) read past the line: %q left", tc.in, rest)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("ReadSpec(%q): %v, want an error with %q", tc.in, err, tc.err)
		}
	}
}

func TestProcParsing(t *testing.T) {
	// pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
	if st, ok := parseStat("123 (a b) c) S 1 456 456 0 -1 4194304 10 0 0 0 250 70 0 0 20 0 1 0 98765 1 2"); !ok || st != (procStat{state: 'S', pgrp: 456, ticks: 320, start: 98765}) {
		t.Errorf("parseStat = %+v, %v; want state S, group 456, 320 ticks, start 98765", st, ok)
	}
	for _, bad := range []string{"garbage", "1 (x) S 1 2", "1 (x) S 1 x 2 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 5",
		"1 (x) S 1 2 2 0 -1 0 0 0 0 0 -1 2 0 0 20 0 1 0 5", "1 (x) SS 1 2 2 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 5"} {
		if _, ok := parseStat(bad); ok {
			t.Errorf("parseStat(%q) succeeded", bad)
		}
	}
	if p := cpuPercent(350, 200, 1); p != 150 {
		t.Errorf("150 ticks in 1 s: %v%%, want 150%% (a core and a half)", p)
	}
	if p := cpuPercent(100, 200, 1); p != 0 {
		t.Errorf("a reading that went back: %v%%", p)
	}
	status := []byte("Name:\tx\nVmRSS:\t   2048 kB\nVmSwap:\t0 kB\n")
	if n := meminfoField(status, "VmRSS:"); n != 2048*1024 {
		t.Errorf("VmRSS %d", n)
	}
	if n := meminfoField(status, "MemTotal:"); n != 0 {
		t.Errorf("missing field %d", n)
	}
	if p := Probe(); p.Cores < 1 || p.MemBytes <= 0 || p.Hostname == "" || (len(p.Devices) == 0 && p.NoGPU == "") {
		t.Errorf("Probe() = %+v", p)
	}
	// The test's own group: its memory, and CPU time once it has spun.
	g := syscall.Getpgrp()
	for start := time.Now(); time.Since(start) < 30*time.Millisecond; {
	}
	if u := groupUsage([]int{g}); u[g].rss <= 0 || u[g].ticks == 0 {
		t.Errorf("groupUsage of the test's own group: %+v", u)
	}
}
