package main

import (
	"bytes"
	"context"
	"errors"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/launch"
)

// runHelper runs 'gptui run ARGS...' (the built binary, which starts
// itself as the agent and the workers) and returns the exit code, stdout
// and stderr. The end of ctx is an interrupt: SIGINT to gptui run.
func runHelper(t *testing.T, ctx context.Context, stdout *syncBuffer, args ...string) (int, string) {
	t.Helper()
	var stderr syncBuffer
	cmd := exec.CommandContext(ctx, builtGPTUI(t), append([]string{"run"}, args...)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.Stdout, cmd.Stderr = stdout, &stderr
	err := cmd.Run()
	if err != nil && exitStatus(err) < 0 {
		t.Fatalf("gptui run: %v", err)
	}
	return exitStatus(err), stderr.String()
}

// syncBuffer is a bytes.Buffer safe for concurrent use that can report when
// its contents first hold a string.
type syncBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	watch string
	seen  chan struct{} // closed once buf holds watch
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	if b.seen != nil && strings.Contains(b.buf.String(), b.watch) {
		close(b.seen)
		b.seen = nil
	}
	return n, err
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// await returns a channel closed once the buffer holds s (at once if it
// does already).
func (b *syncBuffer) await(s string) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.watch, b.seen = s, make(chan struct{})
	seen := b.seen
	if strings.Contains(b.buf.String(), s) {
		close(b.seen)
		b.seen = nil
	}
	return seen
}

func TestRunArgs(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string // substrings of the error line
	}{
		{"no --no-tui", []string{"--nproc", "2", "-c", "tiny"}, []string{"interactive UI", "--no-tui"}},
		{"nproc 0", []string{"--no-tui", "--nproc", "0", "-c", "tiny"}, []string{"--nproc 0"}},
		{"nproc negative", []string{"--no-tui", "--nproc", "-3", "-c", "tiny"}, []string{"--nproc -3"}},
		{"nproc not a number", []string{"--no-tui", "--nproc", "two", "-c", "tiny"}, []string{"nproc"}},
		{"rank out of range", []string{"--no-tui", "--nproc", "2", "--show-ranks", "0,2", "-c", "tiny"}, []string{"--show-ranks", "0,2"}},
		{"rank not a number", []string{"--no-tui", "--show-ranks", "first", "-c", "tiny"}, []string{"--show-ranks", "first"}},
		{"empty ranks", []string{"--no-tui", "--show-ranks", "", "-c", "tiny"}, []string{"--show-ranks"}},
		{"port too large", []string{"--no-tui", "--master-port", "70000", "-c", "tiny"}, []string{"--master-port 70000"}},
		{"no config", []string{"--no-tui", "--nproc", "2"}, []string{"-c CONFIG"}},
		{"bad override", []string{"--no-tui", "-c", "tiny", "-o", "Model.hiden_size=3"}, []string{"Model.hiden_size"}},
		{"stray argument", []string{"--no-tui", "-c", "tiny", "extra"}, []string{"extra"}},
		{"unknown flag", []string{"--no-tui", "--nprocs", "2", "-c", "tiny"}, []string{"nprocs"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := exitCode(cmdRun(context.Background(), tc.args, &out, &errb), &errb)
			if code != 2 {
				t.Errorf("exit code %d, want 2 (stderr %q)", code, errb.String())
			}
			lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
			last := lines[len(lines)-1]
			for _, w := range tc.want {
				if !strings.Contains(last, w) {
					t.Errorf("error line %q does not mention %q", last, w)
				}
			}
			if out.Len() != 0 {
				t.Errorf("stdout %q: no worker should have started", out.String())
			}
		})
	}
}

func TestParseRanks(t *testing.T) {
	tests := []struct {
		in    string
		nproc int
		shown []int // nil with all: every rank
		all   bool
		bad   bool
	}{
		{in: "all", nproc: 4, all: true},
		{in: "0", nproc: 1, shown: []int{0}},
		{in: "0,3", nproc: 4, shown: []int{0, 3}},
		{in: " 2 , 1", nproc: 4, shown: []int{1, 2}},
		{in: "3,3", nproc: 4, shown: []int{3}},
		{in: "4", nproc: 4, bad: true},
		{in: "-1", nproc: 4, bad: true},
		{in: "0,,1", nproc: 4, bad: true},
		{in: "ALL", nproc: 4, bad: true},
		{in: "", nproc: 4, bad: true},
	}
	for _, tc := range tests {
		show, err := parseRanks(tc.in, tc.nproc)
		if (err != nil) != tc.bad {
			t.Errorf("parseRanks(%q, %d): error %v, want error %v", tc.in, tc.nproc, err, tc.bad)
			continue
		}
		if tc.bad {
			continue
		}
		if tc.all != (show == nil) {
			t.Errorf("parseRanks(%q): nil filter is %v, want %v", tc.in, show == nil, tc.all)
			continue
		}
		if show == nil {
			continue
		}
		var shown []int
		for r := -1; r <= tc.nproc; r++ {
			if show(r) {
				shown = append(shown, r)
			}
		}
		if !slices.Equal(shown, tc.shown) {
			t.Errorf("parseRanks(%q, %d) shows %v, want %v", tc.in, tc.nproc, shown, tc.shown)
		}
	}
}

// TestRunTrains starts one real 'gptui train' worker.
func TestRunTrains(t *testing.T) {
	dir := t.TempDir()
	var stdout syncBuffer
	code, stderr := runHelper(t, context.Background(), &stdout, append(append(append([]string{"--no-tui", "--nproc", "1"}, small(t)...),
		"-o", "Engine.max_steps=2", "-o", "Engine.eval_freq=0", "-o", "Engine.log_dir="+filepath.Join(dir, "log")), ownOutput(t)...)...)
	if code != 0 || !strings.Contains(stdout.String(), "[0] [done] steps: 2") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout.String(), stderr)
	}
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		if !strings.HasPrefix(line, "[0] ") {
			t.Errorf("line %q lacks the rank prefix", line)
		}
	}
}

// TestRunWorkerFails: a worker that exits 2 for bad input makes the job exit
// 2, with a summary and the worker's last lines. (One worker: how several
// split the work is up to 'gptui train'; the launch package's tests cover
// stopping the others.)
func TestRunWorkerFails(t *testing.T) {
	dir := t.TempDir()
	var stdout syncBuffer
	code, stderr := runHelper(t, context.Background(), &stdout, "--no-tui", "--nproc", "1", "-c", "tiny",
		"-o", "Engine.log_dir="+filepath.Join(dir, "log"), "-o", "Data.Train.dataset.input_dir="+filepath.Join(dir, "nodata"))
	if code != 2 {
		t.Errorf("exit code %d, want 2", code)
	}
	i := strings.Index(stderr, "gptui run: rank 0 exited with code 2; its last lines:\n[0] ")
	if i < 0 || !strings.Contains(stderr[i:], "nodata") {
		t.Errorf("stderr %q lacks the summary and the failing rank's lines", stderr)
	}
}

// TestRunCancel: cancelling gptui run stops its workers, and it exits 130.
func TestRunCancel(t *testing.T) {
	long(t)
	dir := t.TempDir()
	var stdout syncBuffer
	training := stdout.await("[train]")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-training
		cancel()
	}()
	start := time.Now()
	code, stderr := runHelper(t, ctx, &stdout, append(append(append([]string{"--no-tui", "--nproc", "1"}, small(t)...),
		"-o", "Engine.max_steps=100000", "-o", "Engine.eval_freq=0", "-o", "Engine.log_dir="+filepath.Join(dir, "log")), ownOutput(t)...)...)
	if code != 130 || !strings.Contains(stderr, "interrupted") {
		t.Errorf("exit code %d, stderr %q; want 130 and 'interrupted'", code, stderr)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("took %v", d)
	}
}

// finalLoss extracts the final loss from a [done] line.
func finalLoss(t *testing.T, out string) string {
	t.Helper()
	i := strings.Index(out, "final loss: ")
	if i < 0 {
		t.Fatalf("no [done] line in %q", out)
	}
	return strings.Fields(out[i+len("final loss: "):])[0]
}

// sameLoss reports whether the final losses got and want, as printed,
// agree within 1e-5 relative: the parity matrix's bound for a layout
// against one process (dp2 sums each replica's gradient and then the two,
// one process accumulates the micro-batches into one sum, so the printed
// sixth decimal may differ with the corpus).
func sameLoss(t *testing.T, got, want string) bool {
	t.Helper()
	g, err1 := strconv.ParseFloat(got, 64)
	w, err2 := strconv.ParseFloat(want, 64)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatalf("final losses %q and %q: %v", got, want, err)
	}
	return math.Abs(g-w) <= 1e-5*math.Abs(w)
}

// TestRunDataParallelMatchesOneProcess: two worker processes under dp2 end
// with the loss of one process training on the same global batches.
func TestRunDataParallelMatchesOneProcess(t *testing.T) {
	dir := t.TempDir()
	common := append(small(t), "-o", "Engine.max_steps=4", "-o", "Engine.eval_freq=0", "-o", "Global.micro_batch_size=4",
		"-o", "Model.hidden_dropout_prob=0.1", "-o", "Model.attention_probs_dropout_prob=0.1")
	code, out, e := runCLI(t, append(append([]string{"train", "-o", "Engine.log_dir=" + filepath.Join(dir, "single")}, ownOutput(t)...), common...)...)
	if code != 0 {
		t.Fatalf("single process: %s", e)
	}
	want := finalLoss(t, out)
	var stdout syncBuffer
	code, stderr := runHelper(t, context.Background(), &stdout, append(append([]string{"--no-tui", "--nproc", "2",
		"-o", "Distributed.dp_degree=2", "-o", "Global.local_batch_size=4", "-o", "Engine.log_dir=" + filepath.Join(dir, "dp2")}, ownOutput(t)...), common...)...)
	if code != 0 {
		t.Fatalf("dp2: exit %d, stderr %q", code, stderr)
	}
	if got := finalLoss(t, stdout.String()); !sameLoss(t, got, want) {
		t.Errorf("dp2 final loss %s, one process %s", got, want)
	}
	for _, f := range []string{"workerlog.0", "workerlog.1", "metrics.0.jsonl", "metrics.1.jsonl"} {
		if _, err := os.Stat(filepath.Join(dir, "dp2", f)); err != nil {
			t.Errorf("missing %s: %v", f, err)
		}
	}
}

// TestRunRefusesForgedJoin races a forger against the workers of a local
// data-parallel job: it claims rank 1 at the master's port without the
// job's secret. The master refuses it and says so, and the job trains as
// one process would (the forger's place in the job would change the loss).
func TestRunRefusesForgedJoin(t *testing.T) {
	dir := t.TempDir()
	common := append(small(t), "-o", "Engine.max_steps=3", "-o", "Engine.eval_freq=0", "-o", "Global.micro_batch_size=4")
	code, out, e := runCLI(t, append(append([]string{"train", "-o", "Engine.log_dir=" + filepath.Join(dir, "single")}, ownOutput(t)...), common...)...)
	if code != 0 {
		t.Fatalf("single process: %s", e)
	}
	want := finalLoss(t, out)
	port, err := launch.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	// The forger watches the port closely and joins the moment the master
	// listens, ahead of the real rank 1 (whose retries are 10 ms apart or
	// more).
	forged := make(chan error, 1)
	go func() {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if c, err := net.Dial("tcp", addr); err == nil {
				c.Close()
				break
			}
		}
		_, err := comm.Connect(context.Background(), comm.Config{Rank: 1, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: port,
			Timeout: 10 * time.Second, Secret: []byte("a guess")})
		forged <- err
	}()
	var stdout syncBuffer
	code, stderr := runHelper(t, context.Background(), &stdout, append(append([]string{"--no-tui", "--nproc", "2", "--show-ranks", "all",
		"--master-port", strconv.Itoa(port), "-o", "Distributed.dp_degree=2", "-o", "Global.local_batch_size=4",
		"-o", "Engine.log_dir=" + filepath.Join(dir, "dp2")}, ownOutput(t)...), common...)...)
	if code != 0 {
		t.Fatalf("dp2: exit %d, stderr %q", code, stderr)
	}
	if err := <-forged; err == nil || !strings.Contains(err.Error(), "failed authentication") {
		t.Errorf("the forger: %v, want it refused", err)
	}
	if got := finalLoss(t, stdout.String()); !sameLoss(t, got, want) {
		t.Errorf("dp2 final loss %s, one process %s", got, want)
	}
	if all := stdout.String() + stderr; !strings.Contains(all, "[comm] comm: master: refused a connection from 127.0.0.1") {
		t.Errorf("the master did not report the forger:\n%s", all)
	}
}
