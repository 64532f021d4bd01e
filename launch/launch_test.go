package launch

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/iotest"
	"time"
)

// The test binary doubles as the worker: with LAUNCH_TEST_WORKER=1 in its
// environment it runs the script in its arguments instead of the tests.
const workerEnv = "LAUNCH_TEST_WORKER=1"

func TestMain(m *testing.M) {
	if os.Getenv("LAUNCH_TEST_WORKER") == "1" {
		os.Exit(worker(os.Args[1:]))
	}
	if dir := os.Getenv("LAUNCH_TEST_LAUNCHER"); dir != "" {
		os.Exit(launcher(dir))
	}
	// The parallel tests wait on timers and child processes, using little
	// CPU: run up to 8 at once rather than GOMAXPROCS (-parallel on the
	// command line still decides).
	flag.Set("test.parallel", "8")
	os.Exit(m.Run())
}

// worker runs a script of commands and returns the exit status:
//
//	lines N       print lineOf(RANK, i) for i in [0, N), each line in several writes
//	stderr TEXT   print TEXT on stderr
//	partial TEXT  print TEXT on stdout without a newline
//	ignoreterm    ignore SIGTERM from now on
//	ready DIR     create DIR/<pid>
//	await DIR N   wait until DIR holds N files
//	spawn DIR     start a grandchild that ignores SIGTERM, shares stdout and runs "ready DIR"
//	stamp FILE    write the time in Unix nanoseconds to FILE
//	sleep D       sleep for the duration D
//	kill N        send signal N to itself
//	exit N        exit with status N
func worker(args []string) int {
	rank, _ := strconv.Atoi(os.Getenv("RANK"))
	for len(args) > 0 {
		cmd, arg := args[0], ""
		args = args[1:]
		if cmd != "ignoreterm" {
			arg, args = args[0], args[1:]
		}
		n, _ := strconv.Atoi(arg)
		switch cmd {
		case "lines":
			for i := range n {
				line := lineOf(rank, i) + "\n"
				for len(line) > 0 {
					k := min(len(line), 97)
					os.Stdout.WriteString(line[:k])
					line = line[k:]
				}
			}
		case "stderr":
			fmt.Fprintln(os.Stderr, arg)
		case "partial":
			os.Stdout.WriteString(arg)
		case "ignoreterm":
			signal.Ignore(syscall.SIGTERM)
		case "ready":
			if err := os.WriteFile(filepath.Join(arg, strconv.Itoa(os.Getpid())), nil, 0o644); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 100
			}
		case "await":
			dir, want := arg, 0
			want, _ = strconv.Atoi(args[0])
			args = args[1:]
			for {
				if e, _ := os.ReadDir(dir); len(e) >= want {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
		case "spawn":
			exe, _ := os.Executable()
			c := exec.Command(exe, "ignoreterm", "ready", arg, "sleep", "60s")
			c.Stdout, c.Stderr = os.Stdout, os.Stderr
			if err := c.Start(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 100
			}
		case "stamp":
			os.WriteFile(arg, []byte(strconv.FormatInt(time.Now().UnixNano(), 10)), 0o644)
		case "sleep":
			d, _ := time.ParseDuration(arg)
			time.Sleep(d)
		case "kill":
			syscall.Kill(os.Getpid(), syscall.Signal(n))
			time.Sleep(time.Minute)
		case "exit":
			return n
		default:
			fmt.Fprintf(os.Stderr, "worker: unknown command %q\n", cmd)
			return 100
		}
	}
	return 0
}

// lineOf is the line i that the worker of rank prints for "lines".
func lineOf(rank, i int) string {
	return fmt.Sprintf("r%d %04d %s", rank, i, strings.Repeat(string(rune('a'+rank%26)), 300))
}

// launcher runs one worker that signals readiness in dir and sleeps, and
// blocks until it is killed.
func launcher(dir string) int {
	_, err := Run(context.Background(), Options{Workers: []Worker{
		{Args: []string{"ready", dir, "sleep", "60s"}, Env: []string{workerEnv}},
	}})
	fmt.Fprintln(os.Stderr, err)
	return 1
}

// job builds the workers for scripts, one per rank.
func job(scripts ...[]string) []Worker {
	ws := make([]Worker, len(scripts))
	for r, s := range scripts {
		ws[r] = Worker{Rank: r, LocalRank: r, Args: s, Env: append(Env(r, r, len(scripts), "127.0.0.1", 1, "s"), workerEnv)}
	}
	return ws
}

// awaitReady waits until dir holds n files, written by the worker command
// "ready", and returns their names as pids.
func awaitReady(dir string, n int) ([]int, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		es, _ := os.ReadDir(dir)
		if len(es) >= n {
			var pids []int
			for _, e := range es {
				pid, err := strconv.Atoi(e.Name())
				if err != nil {
					return nil, err
				}
				pids = append(pids, pid)
			}
			return pids, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d processes ready after 10 s", len(es), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// await is awaitReady for the test goroutine.
func await(t *testing.T, dir string, n int) []int {
	t.Helper()
	pids, err := awaitReady(dir, n)
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

// alive reports whether pid names a process that has not exited; zombies,
// which init may be slow to reap in a container, count as exited.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	if err != nil {
		return syscall.Kill(pid, 0) == nil
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || (b[i+2] != 'Z' && b[i+2] != 'X')
}

// checkGone fails unless every pid exits within a second.
func checkGone(t *testing.T, pids []int) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Errorf("process %d is still running", pid)
				syscall.Kill(pid, syscall.SIGKILL)
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// stamp reads a time written by the worker command "stamp".
func stamp(t *testing.T, file string) time.Time {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return time.Unix(0, ns)
}

func TestEnv(t *testing.T) {
	got := Env(3, 1, 8, "10.0.0.1", 29500, "k3y")
	want := []string{"RANK=3", "WORLD_SIZE=8", "LOCAL_RANK=1", "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29500", "GPTUI_JOB_SECRET=k3y"}
	if !slices.Equal(got, want) {
		t.Errorf("Env = %q, want %q", got, want)
	}
	if r := strings.Join(Redact(got), " "); strings.Contains(r, "k3y") || !strings.Contains(r, "RANK=3") {
		t.Errorf("Redact = %q: the secret is shown or the rest is not", r)
	}
	if !slices.Equal(got, want) {
		t.Errorf("Redact changed its argument: %q", got)
	}
}

func TestFreePort(t *testing.T) {
	port, err := FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if port <= 0 || port > 65535 {
		t.Fatalf("port %d", port)
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("port %d is not free: %v", port, err)
	}
	l.Close()
}

func TestScanLines(t *testing.T) {
	long := strings.Repeat("x", maxLine+10)
	tests := []struct {
		name, in string
		want     []string
	}{
		{"empty", "", nil},
		{"lines", "a\nbc\n", []string{"a", "bc"}},
		{"no final newline", "a\nb", []string{"a", "b"}},
		{"crlf", "a\r\nb\r\n", []string{"a", "b"}},
		{"blank lines", "\n\na\n", []string{"", "", "a"}},
		{"bare cr kept", "a\rb\n", []string{"a\rb"}},
		{"long line split", long + "\nz\n", []string{long[:maxLine], long[maxLine:], "z"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			scanLines(iotest.HalfReader(strings.NewReader(tc.in)), func(b []byte) { got = append(got, string(b)) })
			if !slices.Equal(got, tc.want) {
				t.Errorf("lines %q, want %q", got, tc.want)
			}
		})
	}
}

// TestOutput checks the prefixes, that lines of different workers never mix,
// that stderr goes to Stderr, the log file and the tail.
func TestOutput(t *testing.T) {
	const n = 400
	script := []string{"lines", strconv.Itoa(n), "stderr", "oops", "partial", "no newline"}
	log := filepath.Join(t.TempDir(), "sub", "rank1.log")
	ws := job(script, script, script)
	ws[1].LogPath = log
	var stdout, stderr bytes.Buffer
	res, err := Run(context.Background(), Options{Workers: ws, Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}

	re := regexp.MustCompile(`^\[(\d)\] (?:(r\d \d{4} [a-z]{300})|(no newline))$`)
	count := map[string]int{}
	for _, line := range strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("mangled line %.80q", line)
		}
		if r, _ := strconv.Atoi(m[1]); m[2] != "" && m[2] != lineOf(r, count[m[1]]) {
			t.Fatalf("rank %d: got %.20q, want line %d: %.20q", r, m[2], count[m[1]], lineOf(r, count[m[1]]))
		}
		count[m[1]]++
	}
	for r := range 3 {
		if c := count[strconv.Itoa(r)]; c != n+1 {
			t.Errorf("rank %d: %d stdout lines, want %d", r, c, n+1)
		}
		if want := fmt.Sprintf("[%d] oops\n", r); !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr %q lacks %q", stderr.String(), want)
		}
	}
	if got := strings.Count(stderr.String(), "\n"); got != 3 {
		t.Errorf("stderr has %d lines, want 3: %q", got, stderr.String())
	}

	for r, res := range res {
		if res.Rank != r || res.ExitCode != 0 || res.Signal != "" || res.Err != nil {
			t.Errorf("result %d = %+v", r, res)
		}
		// stdout and stderr are separate pipes: where "oops" falls among
		// the stdout lines is up to the scheduler.
		stdoutTail := slices.DeleteFunc(slices.Clone(res.Tail), func(l string) bool { return l == "oops" })
		want := []string{"no newline"}
		for i := n - 1; len(want) < len(stdoutTail); i-- {
			want = slices.Insert(want, 0, lineOf(r, i))
		}
		if len(res.Tail) != TailLines || !slices.Equal(stdoutTail, want) {
			t.Errorf("rank %d: tail %.300q", r, res.Tail)
		}
	}

	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != n+2 || !slices.Contains(lines, "oops") || !slices.Contains(lines, "no newline") || lines[0] != lineOf(1, 0) {
		t.Errorf("log file: %d lines, first %.20q", len(lines), lines[0])
	}
}

func TestShow(t *testing.T) {
	script := []string{"lines", "3", "stderr", "err"}
	tests := []struct {
		name string
		show func(int) bool
		want []string
	}{
		{"all", nil, []string{"[0] ", "[1] ", "[2] "}},
		{"rank 1", func(r int) bool { return r == 1 }, []string{"[1] "}},
		{"none", func(int) bool { return false }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			res, err := Run(context.Background(), Options{Workers: job(script, script, script), Stdout: &out, Stderr: &out, Show: tc.show})
			if err != nil {
				t.Fatal(err)
			}
			var prefixes []string
			for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
				if p := line[:min(len(line), 4)]; p != "" && !slices.Contains(prefixes, p) {
					prefixes = append(prefixes, p)
				}
			}
			slices.Sort(prefixes)
			if !slices.Equal(prefixes, tc.want) {
				t.Errorf("ranks shown %q, want %q", prefixes, tc.want)
			}
			if n := strings.Count(out.String(), "\n"); n != 4*len(tc.want) {
				t.Errorf("%d lines shown, want %d", n, 4*len(tc.want))
			}
			for _, r := range res {
				if len(r.Tail) != 4 {
					t.Errorf("rank %d: tail %q, want 4 lines whether shown or not", r.Rank, r.Tail)
				}
			}
		})
	}
}

// TestFailure: one worker fails, the others are stopped within Grace (plus
// a second), and the error names the first failure.
func TestFailure(t *testing.T) {
	t.Parallel() // the tests that wait on timers run side by side
	const grace = 500 * time.Millisecond
	var last20 []string
	for i := 10; i < 30; i++ {
		last20 = append(last20, lineOf(1, i))
	}
	tests := []struct {
		name       string
		fail       []string // the failing rank's script, after the workers are ready
		wantCode   int
		wantSignal string
		wantTail   []string
	}{
		{"exit code", []string{"lines", "30", "exit", "3"}, 3, "", last20},
		{"signal", []string{"stderr", "dying", "kill", strconv.Itoa(int(syscall.SIGKILL))}, -1, "SIGKILL", []string{"dying"}},
		{"no output", []string{"exit", "1"}, 1, "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir, tmp := t.TempDir(), t.TempDir()
			stampFile := filepath.Join(tmp, "stamp")
			ws := job(
				[]string{"ready", dir, "sleep", "60s"},
				append([]string{"await", dir, "4", "stamp", stampFile}, tc.fail...),
				[]string{"ignoreterm", "ready", dir, "sleep", "60s"},
				[]string{"spawn", dir, "ready", dir, "sleep", "60s"},
			)
			res, err := Run(context.Background(), Options{Workers: ws, Grace: grace})
			took := time.Since(stamp(t, stampFile))
			var je *JobError
			if !errors.As(err, &je) {
				t.Fatalf("error %v, want a *JobError", err)
			}
			if je.Rank != 1 || je.Code != tc.wantCode || je.Signal != tc.wantSignal || je.Cancelled {
				t.Errorf("JobError %+v, want rank 1 code %d signal %q", je, tc.wantCode, tc.wantSignal)
			}
			if !slices.Equal(je.Tail, tc.wantTail) || !slices.Equal(res[1].Tail, tc.wantTail) {
				t.Errorf("tail %.200q, want %.200q", je.Tail, tc.wantTail)
			}
			for _, s := range []string{"rank 1", tc.wantSignal} {
				if !strings.Contains(je.Error(), s) {
					t.Errorf("error %q does not mention %q", je.Error(), s)
				}
			}
			if took > grace+time.Second {
				t.Errorf("the job ended %v after the failure, want under %v", took, grace+time.Second)
			}
			if took < grace {
				t.Errorf("the job ended %v after the failure: rank 2 ignores SIGTERM and should have had %v", took, grace)
			}
			wantSig := []string{"SIGTERM", tc.wantSignal, "SIGKILL", "SIGTERM"}
			for r, res := range res {
				if r != 1 && (res.Signal != wantSig[r] || res.ExitCode != -1) {
					t.Errorf("rank %d ended %+v, want killed by %s", r, res, wantSig[r])
				}
				// The failed rank ended on its own; the stop ended the others.
				if res.Stopped != (r != 1) {
					t.Errorf("rank %d: Stopped %v", r, res.Stopped)
				}
			}
			checkGone(t, await(t, dir, 4))
		})
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	const grace = 300 * time.Millisecond
	dir := t.TempDir()
	ws := job(
		[]string{"ready", dir, "sleep", "60s"},
		[]string{"ignoreterm", "ready", dir, "sleep", "60s"},
		[]string{"spawn", dir, "ready", dir, "sleep", "60s"},
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cancelled time.Time
	go func() {
		if _, err := awaitReady(dir, 4); err != nil {
			t.Error(err)
		}
		cancelled = time.Now()
		cancel()
	}()
	res, err := Run(ctx, Options{Workers: ws, Grace: grace})
	took := time.Since(cancelled)
	var je *JobError
	if !errors.As(err, &je) || !je.Cancelled || je.Rank != -1 || !errors.Is(err, context.Canceled) {
		t.Fatalf("error %#v, want a cancelled *JobError", err)
	}
	if took > grace+time.Second {
		t.Errorf("the job ended %v after cancellation, want under %v", took, grace+time.Second)
	}
	for r, res := range res {
		if want := []string{"SIGTERM", "SIGKILL", "SIGTERM"}[r]; res.Signal != want || !res.Stopped {
			t.Errorf("rank %d ended %+v, want stopped, killed by %s", r, res, want)
		}
	}
	checkGone(t, await(t, dir, 4))
}

// TestInterrupt: an interrupt gives the workers InterruptGrace (not Grace)
// between SIGTERM and SIGKILL, and the end of ctx during it kills them at
// once.
func TestInterrupt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		interruptGrace time.Duration
		cancelAfter    time.Duration // 0: never
		min, max       time.Duration // bounds on the job's end after the interrupt
	}{
		{"grace", 1500 * time.Millisecond, 0, 1500 * time.Millisecond, 10 * time.Second},
		{"second signal", time.Minute, 300 * time.Millisecond, 300 * time.Millisecond, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			ws := job(
				[]string{"ready", dir, "sleep", "60s"},
				[]string{"ignoreterm", "ready", dir, "sleep", "60s"},
			)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			interrupt := make(chan struct{})
			var sent time.Time
			go func() {
				if _, err := awaitReady(dir, 2); err != nil {
					t.Error(err)
				}
				sent = time.Now()
				close(interrupt)
				if tc.cancelAfter > 0 {
					time.Sleep(tc.cancelAfter)
					cancel()
				}
			}()
			res, err := Run(ctx, Options{Workers: ws, Grace: 100 * time.Millisecond, Interrupt: interrupt, InterruptGrace: tc.interruptGrace})
			took := time.Since(sent)
			var je *JobError
			if !errors.As(err, &je) || !je.Cancelled || !errors.Is(err, context.Canceled) {
				t.Fatalf("error %#v, want a cancelled *JobError", err)
			}
			if took < tc.min || took > tc.max {
				t.Errorf("the job ended %v after the interrupt, want between %v and %v", took, tc.min, tc.max)
			}
			for r, res := range res {
				if want := []string{"SIGTERM", "SIGKILL"}[r]; res.Signal != want {
					t.Errorf("rank %d ended %+v, want killed by %s", r, res, want)
				}
			}
			t.Logf("ended %v after the interrupt", took)
		})
	}
}

func TestCancelledBeforeStart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := Run(ctx, Options{Workers: job([]string{"exit", "0"}, []string{"exit", "0"})})
	var je *JobError
	if !errors.As(err, &je) || !je.Cancelled || !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want a cancelled *JobError", err)
	}
	for _, r := range res {
		if !errors.Is(r.Err, errNotStarted) {
			t.Errorf("rank %d: %+v, want not started", r.Rank, r)
		}
	}
}

// TestOrphanedGrandchild: a worker that succeeds but leaves a process behind
// holding its stdout does not hang the job, and the process is killed.
func TestOrphanedGrandchild(t *testing.T) {
	dir := t.TempDir()
	start := time.Now()
	res, err := Run(context.Background(), Options{Workers: job([]string{"spawn", dir, "await", dir, "1", "exit", "0"})})
	if err != nil || res[0].ExitCode != 0 {
		t.Fatalf("Run: %v, %+v", err, res)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Run took %v", d)
	}
	checkGone(t, await(t, dir, 1))
}

func TestStartError(t *testing.T) {
	dir := t.TempDir()
	ws := job([]string{"ready", dir, "sleep", "60s"}, nil, []string{"exit", "0"})
	ws[1].LogPath = filepath.Join(dir, "no", "such") // file in place of a directory below
	if err := os.WriteFile(filepath.Join(dir, "no"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), Options{Workers: ws, Grace: 100 * time.Millisecond})
	var je *JobError
	if err == nil || errors.As(err, &je) || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("error %v, want a start error naming rank 1", err)
	}
	if res[0].Signal != "SIGTERM" {
		t.Errorf("rank 0 not stopped: %+v", res[0])
	}
	if res[1].Err == nil || !errors.Is(res[2].Err, errNotStarted) {
		t.Errorf("results %+v", res)
	}

	_, err = Run(context.Background(), Options{Exe: filepath.Join(dir, "missing"), Workers: job(nil)})
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing executable: %v, want ErrNotExist", err)
	}
	if _, err := Run(context.Background(), Options{}); err == nil {
		t.Error("no workers: nil error")
	}
}

func TestJobErrorMessage(t *testing.T) {
	tests := []struct {
		err  *JobError
		want string
	}{
		{&JobError{Rank: 2, Code: 7}, "launch: rank 2 exited with code 7"},
		{&JobError{Rank: 0, Code: -1, Signal: "SIGSEGV"}, "launch: rank 0 was killed by SIGSEGV"},
		{&JobError{Rank: -1, Code: -1, Cancelled: true, cause: context.Canceled}, "launch: job stopped: context canceled"},
	}
	for _, tc := range tests {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("Error() = %q, want %q", got, tc.want)
		}
	}
	if got := signalName(syscall.Signal(63)); got != "signal 63" {
		t.Errorf("signalName(63) = %q", got)
	}
}

// TestCallbacks: OnStart, OnLine and OnExit see every worker's pid, lines
// (stdout and stderr told apart, hidden ranks included) and Result.
func TestCallbacks(t *testing.T) {
	var mu sync.Mutex
	pids := map[int]int{}
	lines := map[int][]string{}
	exits := map[int]Result{}
	// Rank 1 fails only after rank 0 has written everything, so the stop it
	// causes cannot cut rank 0's lines short.
	dir := t.TempDir()
	_, err := Run(context.Background(), Options{
		Workers: job([]string{"lines", "2", "stderr", "oops", "ready", dir}, []string{"await", dir, "1", "lines", "1", "exit", "3"}),
		Show:    func(int) bool { return false },
		OnStart: func(w Worker, pid int) {
			mu.Lock()
			defer mu.Unlock()
			pids[w.Rank] = pid
		},
		OnLine: func(rank int, stderr bool, line []byte) {
			mu.Lock()
			defer mu.Unlock()
			l := string(line)
			if stderr {
				l = "E:" + l
			}
			lines[rank] = append(lines[rank], l)
		},
		OnExit: func(r Result) {
			mu.Lock()
			defer mu.Unlock()
			exits[r.Rank] = r
		},
	})
	var je *JobError
	if !errors.As(err, &je) || je.Rank != 1 {
		t.Fatalf("err %v, want rank 1's failure", err)
	}
	for r := range 2 {
		if pids[r] <= 0 {
			t.Errorf("rank %d: no pid from OnStart", r)
		}
	}
	// The two streams are read apart: only the order within one counts.
	out0 := slices.DeleteFunc(slices.Clone(lines[0]), func(l string) bool { return strings.HasPrefix(l, "E:") })
	err0 := slices.DeleteFunc(slices.Clone(lines[0]), func(l string) bool { return !strings.HasPrefix(l, "E:") })
	if !slices.Equal(out0, []string{lineOf(0, 0), lineOf(0, 1)}) || !slices.Equal(err0, []string{"E:oops"}) {
		t.Errorf("rank 0 lines %q", lines[0])
	}
	if !slices.Equal(lines[1], []string{lineOf(1, 0)}) {
		t.Errorf("rank 1 lines %q", lines[1])
	}
	if exits[1].ExitCode != 3 || len(exits[1].Tail) != 1 {
		t.Errorf("rank 1 exit %+v, want code 3 and a tail of 1 line", exits[1])
	}
	if _, ok := exits[0]; !ok {
		t.Error("no OnExit for rank 0")
	}
}
