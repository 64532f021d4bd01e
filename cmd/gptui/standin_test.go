package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gptui/gptui/internal/standin"
	"github.com/gptui/gptui/kernels/cuda"
)

// The NCCL path of a multi-process job, end to end without GPUs: 'gptui
// run --nproc 4' on Global.device=cpu with GPTUI_FABRIC=nccl, its
// libraries the stand-in libcuda.so.1 and libnccl.so.2 that
// internal/standin compiles (NCCL's operations between the processes over
// shared memory, blocking as NCCL's do). The workers load them through
// the same purego binding as NVIDIA's (GPTUI_CUDA_LIBDIR), so the binding,
// the fabric of comm/nccl, its watchdog and its aborts run as they do on
// GPUs, across processes.

// standinJob is one 'gptui run' of these tests: its output lines, each
// with when it came, and the folder of its logs.
type standinJob struct {
	start time.Time
	logs  string

	mu    sync.Mutex
	lines []timedLine
	seen  map[string]chan struct{} // awaited substrings
}

type timedLine struct {
	at   time.Duration // since start
	text string
}

// Write records the lines of the job's output as they come.
func (j *standinJob) Write(p []byte) (int, error) {
	now := time.Since(j.start)
	j.mu.Lock()
	defer j.mu.Unlock()
	sc := bufio.NewScanner(bytes.NewReader(p))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		j.lines = append(j.lines, timedLine{now, line})
		for s, c := range j.seen {
			if strings.Contains(line, s) {
				close(c)
				delete(j.seen, s)
			}
		}
	}
	return len(p), nil
}

// await returns a channel closed once a line holds s.
func (j *standinJob) await(s string) <-chan struct{} {
	j.mu.Lock()
	defer j.mu.Unlock()
	c := make(chan struct{})
	for _, l := range j.lines {
		if strings.Contains(l.text, s) {
			close(c)
			return c
		}
	}
	if j.seen == nil {
		j.seen = map[string]chan struct{}{}
	}
	j.seen[s] = c
	return c
}

// first returns the first line holding s, and whether there is one.
func (j *standinJob) first(s string) (timedLine, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, l := range j.lines {
		if strings.Contains(l.text, s) {
			return l, true
		}
	}
	return timedLine{}, false
}

// all returns the lines so far.
func (j *standinJob) all() []timedLine {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]timedLine(nil), j.lines...)
}

// failure returns the first line of rank r that says why it stopped: its
// NCCL data path's failure, or its last word.
func (j *standinJob) failure(r int) (timedLine, string, bool) {
	re := regexp.MustCompile(fmt.Sprintf(`^\[%d\] (?:\[comm\] rank %d: the NCCL data path failed|gptui): (.*)$`, r, r))
	for _, l := range j.all() {
		if m := re.FindStringSubmatch(l.text); m != nil {
			return l, m[1], true
		}
	}
	return timedLine{}, "", false
}

func (j *standinJob) output() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	var b strings.Builder
	for _, l := range j.lines {
		fmt.Fprintf(&b, "%7.3fs %s\n", l.at.Seconds(), l.text)
	}
	return b.String()
}

// startStandinJob starts 'exe run --no-tui --nproc 4 --show-ranks all' on
// the small job with the overrides o, in the environment env added to
// this process's; wait returns its exit status.
func startStandinJob(t *testing.T, exe string, env []string, o ...string) (j *standinJob, wait func() int) {
	t.Helper()
	dir := t.TempDir()
	j = &standinJob{logs: filepath.Join(dir, "log")}
	args := append([]string{"run", "--no-tui", "--nproc", "4", "--show-ranks", "all"}, small(t)...)
	args = append(args, "-o", "Engine.eval_freq=0", "-o", "Engine.logging_freq=1", "-o", "Engine.save_load.save_steps=0",
		"-o", "Engine.log_dir="+j.logs, "-o", "Engine.save_load.output_dir="+filepath.Join(dir, "out"))
	for _, x := range o {
		args = append(args, "-o", x)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = j, j
	j.start = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	code := 0
	wait = func() int {
		once.Do(func() { code = exitStatus(cmd.Wait()) })
		return code
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		wait()
	})
	return j, wait
}

// stepMetrics is what a rank's metrics.N.jsonl says of a step.
type stepMetrics struct {
	Step     int     `json:"step"`
	Loss     float64 `json:"loss"`
	GradNorm float64 `json:"grad_norm"`
}

// rankMetrics reads the steps of metrics.<rank>.jsonl in dir.
func rankMetrics(t *testing.T, dir string, rank int) []stepMetrics {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("metrics.%d.jsonl", rank)))
	if err != nil {
		t.Fatal(err)
	}
	var out []stepMetrics
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m stepMetrics
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("metrics.%d.jsonl: %q: %v", rank, line, err)
		}
		out = append(out, m)
	}
	return out
}

// standinLayouts are the parallel layouts of 4 ranks run over the
// stand-in: data parallel, tensor × pipeline parallel (1F1B, whose
// neighbours exchange in NCCL groups), sharding stage 3 (the parameters'
// all-gathers and the gradients' reduce-scatters) and Llama with 4 query
// heads sharing 2 key/value heads over mp4 (its key/value copies'
// communicator), and context parallelism's ring beside tensor parallelism
// with sequence parallelism (the ring's grouped sends and receives, the
// regions' all-gathers and reduce-scatters). The last three are left out
// of 'go test -short'.
var standinLayouts = []struct {
	name string
	o    []string
	long bool
}{
	{"dp4", []string{"Distributed.dp_degree=4", "Global.local_batch_size=2", "Global.micro_batch_size=2"}, false},
	{"mp2 pp2", []string{"Distributed.mp_degree=2", "Distributed.pp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=4"}, false},
	{"sharding4 stage3", []string{"Distributed.sharding.sharding_degree=4", "Distributed.sharding.sharding_stage=3", "Global.local_batch_size=2", "Global.micro_batch_size=2"}, true},
	{"llama mp4 kv2", []string{"Model.family=llama", "Model.num_key_value_heads=2", "Model.ffn_hidden_size=128",
		"Model.rope_scaling.rope_type=llama3", "Model.rope_scaling.original_max_position_embeddings=16", "Model.tie_word_embeddings=true",
		"Distributed.mp_degree=4", "Global.local_batch_size=8", "Global.micro_batch_size=4"}, true},
	{"cp2 mp2 sp", []string{"Distributed.cp_degree=2", "Distributed.mp_degree=2", "Distributed.sequence_parallel=true",
		"Model.hidden_dropout_prob=0", "Model.attention_probs_dropout_prob=0", "Global.local_batch_size=8", "Global.micro_batch_size=4"}, true},
}

// TestStandinNCCLLosses: each layout trains 3 steps over the stand-in
// libnccl to the TCP run's losses and gradient norms, on every rank, bit
// for bit: the stand-in adds in the TCP ring's order (see its nccl.c), so
// any difference is a bug of the path (a wrong peer, chunk, type or
// order), not rounding. Every worker says it runs over NCCL, and the jobs
// leave no shared-memory segment behind.
func TestStandinNCCLLosses(t *testing.T) {
	libs := standin.Build(t)
	exe := builtGPTUI(t)
	for _, l := range standinLayouts {
		t.Run(l.name, func(t *testing.T) {
			if l.long {
				long(t)
			}
			tag := standin.Tag(t)
			o := append([]string{"Engine.max_steps=3"}, l.o...)
			tcp, wait := startStandinJob(t, exe, nil, o...)
			if code := wait(); code != 0 {
				t.Fatalf("over TCP: exit %d\n%s", code, tcp.output())
			}
			env := append(standin.Env(libs, tag), fabricEnv+"=nccl")
			nc, wait := startStandinJob(t, exe, env, o...)
			if code := wait(); code != 0 {
				t.Fatalf("over the stand-in NCCL: exit %d\n%s", code, nc.output())
			}
			for r := range 4 {
				if _, ok := nc.first(fmt.Sprintf("[%d] [comm] data path: NCCL 2.18.5 (%s)", r, filepath.Join(libs, "libnccl.so.2"))); !ok {
					t.Errorf("rank %d does not say it runs over the stand-in NCCL:\n%s", r, nc.output())
				}
				want, got := rankMetrics(t, tcp.logs, r), rankMetrics(t, nc.logs, r)
				if len(want) != 3 || len(got) != len(want) {
					t.Fatalf("rank %d: %d steps over NCCL, %d over TCP", r, len(got), len(want))
				}
				for i := range want {
					if got[i] != want[i] {
						t.Errorf("rank %d step %d: loss %v grad norm %v over NCCL, %v %v over TCP", r, want[i].Step, got[i].Loss, got[i].GradNorm, want[i].Loss, want[i].GradNorm)
					}
				}
				if r == 0 {
					t.Logf("rank 0: %+v over both", got)
				}
			}
			if left := standin.Segments(tag); len(left) > 0 {
				t.Errorf("the job left shared-memory segments: %v", left)
			}
		})
	}
}

var (
	opStartRE = regexp.MustCompile(`^\[(\d)\] stand-in libnccl: rank \d: operation #1: `)
	failedRE  = regexp.MustCompile(`^\[(\d)\] \[comm\] rank \d: the NCCL data path failed: (.*)$`)
)

// TestStandinNCCLStoppedRank: rank 2 is stopped (SIGSTOP, by the
// stand-in, as its first operation starts) and the others wait in their
// first collective of dp for it. Their watchdogs give up once that
// operation has run for the first-operation bound, GPTUI_COMM_INIT_TIMEOUT
// (5 s here), and say so: not after the steady timeout (GPTUI_COMM_TIMEOUT,
// 20 s here), nor once the World notices the silent rank (after half of
// it).
func TestStandinNCCLStoppedRank(t *testing.T) {
	long(t)
	t.Parallel() // its processes are its own (ownGPTUI); most of it is waiting
	const initTimeout, timeout = 5 * time.Second, 20 * time.Second
	libs := standin.Build(t)
	exe := ownGPTUI(t)
	env := append(standin.Env(libs, standin.Tag(t)), fabricEnv+"=nccl",
		"GPTUI_COMM_INIT_TIMEOUT="+initTimeout.String(), "GPTUI_COMM_TIMEOUT="+timeout.String(),
		standin.RaiseEnv+"=2:1:STOP", standin.TraceEnv+"=1")
	j, wait := startStandinJob(t, exe, env, append([]string{"Engine.max_steps=3"}, standinLayouts[0].o...)...)
	defer awaitNoProcess(t, exe, 20*time.Second)
	var all []<-chan struct{}
	for _, r := range []int{0, 1, 3} {
		all = append(all, j.await(fmt.Sprintf("[%d] [comm] rank %d: the NCCL data path failed", r, r)))
	}
	deadline := time.After(timeout)
	for _, c := range all {
		select {
		case <-c:
		case <-deadline:
			t.Fatalf("the ranks did not all give up within %v:\n%s", timeout, j.output())
		}
	}
	// Done with the stopped rank: the others leave the World once it is
	// gone (they wait for it to close its connections).
	if pid := localPID(exe, "train", 2); pid != 0 {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	if code := wait(); code == 0 {
		t.Errorf("the job exited 0:\n%s", j.output())
	}
	stop, ok := j.first("[2] stand-in libnccl: rank 2: raising signal 19 (SIGSTOP) in its operation #1")
	if !ok {
		t.Fatalf("rank 2 was not stopped:\n%s", j.output())
	}
	starts := map[string]time.Duration{}
	for _, l := range j.all() {
		if m := opStartRE.FindStringSubmatch(l.text); m != nil {
			if _, seen := starts[m[1]]; !seen {
				starts[m[1]] = l.at // its first communicator's: the one it gave up in
			}
		}
	}
	said := map[string]bool{}
	for _, l := range j.all() {
		m := failedRE.FindStringSubmatch(l.text)
		if m == nil || said[m[1]] {
			continue
		}
		r, why := m[1], m[2]
		said[r] = true
		start, ok := starts[r]
		if !ok {
			t.Errorf("rank %s never started its first operation:\n%s", r, j.output())
			continue
		}
		ran := l.at - start
		t.Logf("rank %s gave up %.2fs after its first operation began, %.2fs after rank 2 stopped: %s", r, ran.Seconds(), (l.at - stop.at).Seconds(), why)
		// The operation's clock starts when the watchdog sees it begin,
		// about when the stand-in logs it; the lines come through pipes
		// (and the message says which bound it was).
		if ran < initTimeout-time.Second {
			t.Errorf("rank %s gave up after %v, before the first-operation bound %v", r, ran, initTimeout)
		}
		if l.at-stop.at > timeout/2-time.Second {
			t.Errorf("rank %s gave up %v after rank 2 stopped: not the first-operation bound %v", r, l.at-stop.at, initTimeout)
		}
		for _, s := range []string{"AllReduce #1 (dp)", "running for " + initTimeout.String() + " without finishing", "GPTUI_COMM_INIT_TIMEOUT"} {
			if !strings.Contains(why, s) {
				t.Errorf("rank %s's diagnosis lacks %q: %s", r, s, why)
			}
		}
	}
}

// TestStandinNCCLKilledRank: rank 2 is killed (SIGKILL) while the job
// trains; the operations of the others that wait for it never end by
// themselves (the stand-in, like NCCL over shared memory, does not notice
// a peer that is gone). The World does, at once, and names it: every other
// rank's watchdog aborts its NCCL communicators within the steady timeout,
// its error naming rank 2, and the job ends. On mp2 × pp2, and on cp2 ×
// mp2 with sequence parallelism (left out of -short).
func TestStandinNCCLKilledRank(t *testing.T) {
	// Tensor × pipeline parallel, and context parallelism's ring, whose
	// grouped sends and receives wait for the killed rank in every layer.
	for _, l := range []int{1, 4} {
		t.Run(standinLayouts[l].name, func(t *testing.T) {
			if standinLayouts[l].long {
				long(t)
			}
			killedRank(t, standinLayouts[l].o)
		})
	}
}

// killedRank is TestStandinNCCLKilledRank on the layout of overrides o.
func killedRank(t *testing.T, o []string) {
	const timeout = 10 * time.Second
	libs := standin.Build(t)
	exe := ownGPTUI(t)
	env := append(standin.Env(libs, standin.Tag(t)), fabricEnv+"=nccl", "GPTUI_COMM_TIMEOUT="+timeout.String())
	j, wait := startStandinJob(t, exe, env, append([]string{"Engine.max_steps=100000"}, o...)...)
	defer awaitNoProcess(t, exe, 20*time.Second)
	select {
	case <-j.await("[0] [train] epoch: 0 step: 2 "):
	case <-time.After(time.Minute):
		t.Fatalf("no step 2:\n%s", j.output())
	}
	pid := localPID(exe, "train", 2)
	if pid == 0 {
		t.Fatalf("no worker of rank 2:\n%s", j.output())
	}
	killed := time.Since(j.start)
	syscall.Kill(pid, syscall.SIGKILL)
	exited := make(chan int, 1)
	go func() { exited <- wait() }()
	select {
	case code := <-exited:
		if code == 0 {
			t.Errorf("the job exited 0")
		}
	case <-time.After(2 * timeout):
		t.Fatalf("the job still runs %v after rank 2 was killed:\n%s", 2*timeout, j.output())
	}
	t.Logf("rank 2 killed %.2fs into the job, which ended %.2fs later", killed.Seconds(), (time.Since(j.start) - killed).Seconds())
	for _, r := range []int{0, 1, 3} {
		l, why, ok := j.failure(r)
		if !ok {
			t.Errorf("rank %d did not say why it stopped:\n%s", r, j.output())
			continue
		}
		t.Logf("rank %d aborted %.3fs after the kill: %s", r, (l.at - killed).Seconds(), why)
		if l.at-killed > timeout {
			t.Errorf("rank %d aborted %v after the kill, past the steady timeout %v", r, l.at-killed, timeout)
		}
		if !strings.Contains(why, "comm: rank 2 ") {
			t.Errorf("rank %d's error does not name rank 2: %s", r, why)
		}
	}
}

// TestStandinNCCLRefusals: GPTUI_FABRIC takes nccl or nothing, and a job
// that asks for NCCL where it cannot be loaded stops at once, every worker
// with one line and exit status 2.
func TestStandinNCCLRefusals(t *testing.T) {
	exe := builtGPTUI(t)
	dp2 := []string{"Engine.max_steps=1", "Distributed.dp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=4"}
	run := func(env []string) string {
		t.Helper()
		args := append([]string{"run", "--no-tui", "--nproc", "2"}, small(t)...)
		args = append(args, "-o", "Engine.log_dir="+filepath.Join(t.TempDir(), "log"))
		for _, o := range append(dp2, "Engine.save_load.output_dir="+filepath.Join(t.TempDir(), "out")) {
			args = append(args, "-o", o)
		}
		cmd := exec.Command(exe, args...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if code := exitStatus(err); code != 2 {
			t.Errorf("%v: exit %d, want 2:\n%s", env, code, out)
		}
		return string(out)
	}
	if out := run([]string{fabricEnv + "=tcp"}); !strings.Contains(out, `GPTUI_FABRIC="tcp": want nccl`) {
		t.Errorf("GPTUI_FABRIC=tcp:\n%s", out)
	}
	if _, _, err := cuda.Find(cuda.LibNCCL, cuda.SystemEnv()); err == nil {
		t.Skip("this machine has an NCCL outside GPTUI_CUDA_LIBDIR")
	}
	out := run([]string{fabricEnv + "=nccl", standin.LibDirEnv + "=" + t.TempDir()})
	for _, want := range []string{"GPTUI_FABRIC=nccl: a job of 2 processes needs NCCL: cuda: libnccl.so not found", "; unset GPTUI_FABRIC"} {
		if !strings.Contains(out, want) {
			t.Errorf("no NCCL: the output lacks %q:\n%s", want, out)
		}
	}
}
