package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gptui/gptui/agent"
	"github.com/gptui/gptui/internal/sshtest"
	"github.com/gptui/gptui/internal/testwd"
)

// The tests of 'gptui run --hosts' run a real gptui binary as the launcher
// (the pushed executable is the launcher's own) against real sshd servers
// on 127.0.0.2 and 127.0.0.3.

var gptuiBin struct {
	once sync.Once
	dir  string
	err  error
}

// builtGPTUI returns the path of the gptui binary for these tests: this
// test binary, linked as dir/gptui, which TestMain runs as the command
// (main, with its arguments) rather than as the tests. It holds the
// command's own code, so no second build is needed; the cluster package's
// tests run a binary built by 'go build'.
func builtGPTUI(t *testing.T) string {
	t.Helper()
	gptuiBin.once.Do(func() {
		gptuiBin.dir, gptuiBin.err = os.MkdirTemp("", "gptui-run-test-")
		if gptuiBin.err != nil {
			return
		}
		var self string
		if self, gptuiBin.err = os.Executable(); gptuiBin.err != nil {
			return
		}
		bin := filepath.Join(gptuiBin.dir, "gptui")
		if os.Link(self, bin) == nil {
			return
		}
		// Another file system: copy.
		b, err := os.ReadFile(self)
		if err == nil {
			err = os.WriteFile(bin, b, 0o755)
		}
		gptuiBin.err = err
	})
	if gptuiBin.err != nil {
		t.Fatal(gptuiBin.err)
	}
	return filepath.Join(gptuiBin.dir, "gptui")
}

// ownGPTUI is builtGPTUI under a name of the test's own (a hard link in
// its temporary directory, or a copy): the processes it starts are the
// test's alone by their executable's path (/proc/PID/exe), so that a
// test that checks none is left (awaitNoProcess, localPID) may run in
// parallel with others.
func ownGPTUI(t *testing.T) string {
	t.Helper()
	shared := builtGPTUI(t)
	bin := filepath.Join(t.TempDir(), "gptui")
	if os.Link(shared, bin) == nil {
		return bin
	}
	b, err := os.ReadFile(shared)
	if err == nil {
		err = os.WriteFile(bin, b, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// srcDir is the package's source directory: the tests run in a temporary
// directory of their own (testwd), so that what the commands write to
// relative paths (tiny's output_dir, log_dir) stays out of the source tree.
var srcDir string

func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == "gptui" { // builtGPTUI's link: the command
		main()
	}
	code := testwd.Main(m, &srcDir)
	for _, dir := range []string{gptuiBin.dir, smallFiles.dir} {
		if dir != "" {
			os.RemoveAll(dir)
		}
	}
	os.Exit(code)
}

// sshCluster is two sshd nodes, an inventory of them and a home directory
// for the launcher whose ~/.ssh/known_hosts knows them.
type sshCluster struct {
	servers  []*sshtest.Server
	workdirs []string
	hosts    string
	home     string
}

func newSSHCluster(t *testing.T, devices string) *sshCluster {
	t.Helper()
	dir := t.TempDir()
	n := sshtest.StartNodes(t, dir, devices, "127.0.0.2", "127.0.0.3")
	c := &sshCluster{servers: n.Servers, workdirs: n.Workdirs, hosts: n.Hosts, home: filepath.Join(dir, "home")}
	if err := os.MkdirAll(filepath.Join(c.home, ".ssh"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.home, ".ssh", "known_hosts"), []byte(sshtest.KnownHosts(c.servers...)), 0o600); err != nil {
		t.Fatal(err)
	}
	return c
}

// command returns the launcher 'gptui run --no-tui --hosts ... ARGS'.
func (c *sshCluster) command(t *testing.T, stdout, stderr *syncBuffer, args ...string) *exec.Cmd {
	cmd := exec.Command(builtGPTUI(t), append([]string{"run", "--no-tui", "--hosts", c.hosts}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+c.home, "GPTUI_THREADS=1", "SSH_AUTH_SOCK=")
	cmd.Stdout, cmd.Stderr = stdout, stderr
	return cmd
}

// start starts the launcher 'gptui run --no-tui --hosts ... ARGS'; when
// the test ends it is killed, and every process of the job must be gone
// within 10 s.
func (c *sshCluster) start(t *testing.T, stdout, stderr *syncBuffer, args ...string) *startedJob {
	t.Helper()
	return startJob(t, c.command(t, stdout, stderr, args...), stdout, stderr, func() { c.awaitGone(t, time.Now(), 10*time.Second) })
}

// exitStatus returns the exit status of a command's Run or Wait error.
func exitStatus(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// jobProcesses returns the pids of the processes running a gptui from one
// of the workdirs: the agents and the workers.
func (c *sshCluster) jobProcesses() []int {
	return liveProcesses(func(proc string) bool {
		exe, err := os.Readlink(filepath.Join(proc, "exe"))
		return err == nil && slices.ContainsFunc(c.workdirs, func(wd string) bool { return strings.HasPrefix(exe, wd+string(filepath.Separator)) })
	})
}

// workerPID returns the pid of the worker of rank among the job's
// processes; it fails the test if there is none.
func (c *sshCluster) workerPID(t *testing.T, rank int) int {
	t.Helper()
	return rankWorker(t, c.jobProcesses(), rank)
}

// loseNode takes node i of c away as a machine lost goes: its sshd stops
// listening first, then its agent and workers are killed. The listener
// must be gone before the agent dies: otherwise a restart can still reach
// the node and set it up on a new connection, and the node is not the one
// lost the test means. sshd's Stop ends its listener on the SIGTERM it
// sends first, and then waits for sshd's output to close: that wait is
// over when the test ends.
func (c *sshCluster) loseNode(t *testing.T, i int) {
	t.Helper()
	stopped := make(chan struct{})
	go func() { c.servers[i].Stop(); close(stopped) }()
	t.Cleanup(func() { <-stopped })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		conn, err := net.DialTimeout("tcp", c.servers[i].HostPort(), time.Second)
		if err != nil {
			break
		}
		conn.Close()
		if time.Now().After(deadline) {
			t.Fatalf("node %d's sshd still listens 10 s after its stop", i)
		}
	}
	wd := c.workdirs[i] + string(filepath.Separator)
	for _, pid := range c.jobProcesses() {
		if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); strings.HasPrefix(exe, wd) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// awaitGone waits up to limit for every process of the job to end and
// returns how long that took; it fails the test (and kills them) if some
// remain.
func (c *sshCluster) awaitGone(t *testing.T, since time.Time, limit time.Duration) time.Duration {
	t.Helper()
	return awaitNone(t, "processes of the job", c.jobProcesses, since, limit)
}

// TestRunHosts: two nodes × 2 CPU workers train small to the end; the job
// exits 0 with the final loss of the same job run locally with --nproc; a
// dry run before it pushed the binary, so the job's own setup skips the
// push. Tensor parallel groups (mp2) hold ranks 0-1 and 2-3, one per node.
func TestRunHosts(t *testing.T) {
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	for _, tt := range []struct {
		name      string
		devices   string
		nproc     int
		overrides []string
	}{
		{"dp4", "cpu:2", 4, []string{"Distributed.dp_degree=4", "Global.local_batch_size=2", "Global.micro_batch_size=2"}},
		{"dp2xmp2", "cpu:2", 4, []string{"Distributed.dp_degree=2", "Distributed.mp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=4"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// -short's sshd job is TestRestartWorkerKilled's.
			long(t)
			c := newSSHCluster(t, tt.devices)
			args := append(small(t), "-o", "Engine.max_steps=4", "-o", "Engine.eval_freq=0", "-o", "Engine.logging_freq=1")
			for _, kv := range tt.overrides {
				args = append(args, "-o", kv)
			}

			var dryOut, dryErr syncBuffer
			err := c.command(t, &dryOut, &dryErr, append([]string{"--dry-run"}, args...)...).Run()
			if err != nil {
				t.Fatalf("dry run: %v\n%s%s", err, dryOut.String(), dryErr.String())
			}
			for _, want := range []string{`"server_count": "2"`, `{"device_id": "1", "device_ip": "127.0.0.3", "rank_id": "3"}`,
				"exec ./gptui agent", "[127.0.0.3/3] cpu: RANK=3 WORLD_SIZE=4 LOCAL_RANK=1 MASTER_ADDR=127.0.0.2", "pushed ("} {
				if !strings.Contains(dryOut.String(), want) {
					t.Errorf("dry run output lacks %q:\n%s", want, dryOut.String())
				}
			}
			for _, wd := range c.workdirs {
				if _, err := os.Stat(filepath.Join(wd, "log")); err == nil {
					t.Errorf("the dry run started workers: %s/log exists", wd)
				}
			}

			var stdout, stderr syncBuffer
			start := time.Now()
			err = c.command(t, &stdout, &stderr, args...).Run()
			took := time.Since(start)
			out := stdout.String()
			if err != nil {
				t.Fatalf("exit %d after %v\nstdout:\n%s\nstderr:\n%s", exitStatus(err), took, out, stderr.String())
			}
			for _, node := range []string{"127.0.0.2", "127.0.0.3"} {
				var line string
				for _, l := range strings.Split(out, "\n") {
					if strings.HasPrefix(l, "["+node+"] pushing: ") && strings.Contains(l, "/gptui ") {
						line = l
					}
				}
				if !strings.Contains(line, "unchanged (SHA-256 matches), push skipped") {
					t.Errorf("second launch on %s did not skip the binary push: %q", node, line)
				}
				t.Logf("%s", line)
			}
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				if strings.HasPrefix(l, "[127.0.0.3/") {
					t.Errorf("rank 0's lines only by default, got %q", l)
				}
			}
			got := finalLoss(t, out)
			if !strings.Contains(out, "[127.0.0.2/0] [train] epoch: 0 step: 3 ") || !strings.Contains(out, "[summary] steps 4 final loss "+got) {
				t.Errorf("stdout lacks rank 0's last step or the final summary:\n%s", out)
			}

			local := exec.Command(builtGPTUI(t), append(append([]string{"run", "--no-tui", "--nproc", strconv.Itoa(tt.nproc), "-o", "Engine.log_dir=" + filepath.Join(t.TempDir(), "log")}, ownOutput(t)...), args...)...)
			local.Env = append(os.Environ(), "GPTUI_THREADS=1")
			lout, err := local.CombinedOutput()
			if err != nil {
				t.Fatalf("local run: %v\n%s", err, lout)
			}
			if want := finalLoss(t, string(lout)); got != want {
				t.Errorf("final loss %s on two nodes, %s locally", got, want)
			}
			t.Logf("final loss %s on both; the job took %v", got, took)
		})
	}
}

// TestRunHostsWorkerKilled: SIGKILL one worker; the whole job stops within
// 10 s, exits non-zero naming the rank and node with its last lines, and
// leaves no process on either node.
func TestRunHostsWorkerKilled(t *testing.T) {
	long(t)
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	c := newSSHCluster(t, "cpu:2")
	var stdout, stderr syncBuffer
	job := startTraining(t, c, &stdout, &stderr, "] [train] epoch", 30*time.Second, nil)
	pid := c.workerPID(t, 3)
	killed := time.Now()
	syscall.Kill(pid, syscall.SIGKILL)
	err := job.wait(t, 10*time.Second, "rank 3 was killed")
	took := time.Since(killed)
	gone := c.awaitGone(t, killed, 10*time.Second)
	t.Logf("launcher exited %v after the kill; every process gone after %v", took, gone)
	msg := stderr.String()
	if exitStatus(err) == 0 || !strings.Contains(msg, "rank 3 on 127.0.0.3 was killed by SIGKILL; its last lines:\n[127.0.0.3/3] ") {
		t.Errorf("exit %d, stderr:\n%s", exitStatus(err), msg)
	}
}

// TestRunHostsLauncherKilled: with the launcher killed by SIGKILL its SSH
// connections drop, and the agents stop their workers within 10 s.
func TestRunHostsLauncherKilled(t *testing.T) {
	long(t)
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	c := newSSHCluster(t, "cpu:2")
	var stdout, stderr syncBuffer
	job := startTraining(t, c, &stdout, &stderr, "] [train] epoch", 30*time.Second, nil)
	if n := len(c.jobProcesses()); n != 8 {
		t.Errorf("%d job processes, want 2 agents, 2 workdir lock holders and 4 workers", n)
	}
	killed := time.Now()
	job.cmd.Process.Kill()
	<-job.done
	gone := c.awaitGone(t, killed, 10*time.Second)
	t.Logf("every process gone %v after the launcher was killed", gone)
}

// TestRunHostsBadInput: bad inventories, rank tables and flags exit 2
// with the file and line; an unknown host key is refused naming its
// fingerprint.
func TestRunHostsBadInput(t *testing.T) {
	long(t)
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	c := newSSHCluster(t, "cpu:1")
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.txt")
	os.WriteFile(bad, []byte("# nodes\nnode1 devices=0-3\nnode2 gpus=8\n"), 0o644)
	table := filepath.Join(dir, "table.json")
	os.WriteFile(table, []byte(`{"version":"1.0","server_count":"1","server_list":[{"server_id":"10.9.9.9","device":[{"device_id":"0","device_ip":"10.9.9.9","rank_id":"0"}]}],"status":"completed"}`), 0o644)
	dp2 := []string{"-o", "Distributed.dp_degree=2", "-o", "Global.local_batch_size=4", "-o", "Global.micro_batch_size=4"}
	for _, tt := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"bad inventory", []string{"--hosts", bad, "-c", "tiny"}, 2, []string{bad + ":3", "gpus"}},
		{"missing inventory", []string{"--hosts", filepath.Join(dir, "none.txt"), "-c", "tiny"}, 2, []string{"none.txt"}},
		{"nproc with hosts", []string{"--hosts", c.hosts, "--nproc", "2", "-c", "tiny"}, 2, []string{"--nproc"}},
		{"dry run without hosts", []string{"--dry-run", "-c", "tiny"}, 2, []string{"--hosts"}},
		{"preset and -c", []string{"--hosts", c.hosts, "--preset", "tiny", "-c", "gpt2-124m"}, 2, []string{"--preset"}},
		{"rank table of other nodes", []string{"--hosts", c.hosts, "--rank-table", table, "-c", "tiny"}, 2, []string{table, "10.9.9.9"}},
		{"rank beyond the job", []string{"--hosts", c.hosts, "--show-ranks", "0,4", "-c", "tiny"}, 2, []string{`--show-ranks "0,4"`, "ranks from 0 to 1"}}, // one device a node
		// dp2: the two nodes' ranks (a layout for another world is refused
		// before any node is reached: TestEarlyRefusals).
		{"missing data", append([]string{"--hosts", c.hosts, "-c", "tiny", "-o", "Data.Train.dataset.input_dir=/no/such/shards"}, dp2...), 2, []string{c.hosts + ":", "has no /no/such/shards"}},
		{"unknown host key", append([]string{"--hosts", c.hosts, "-c", "tiny"}, dp2...), 1, []string{"unknown host key", "SHA256:", "--accept-new-host-keys"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr syncBuffer
			cmd := exec.Command(builtGPTUI(t), append([]string{"run", "--no-tui"}, tt.args...)...)
			home := c.home
			if tt.name == "unknown host key" {
				home = t.TempDir()
			}
			cmd.Env = append(os.Environ(), "HOME="+home, "SSH_AUTH_SOCK=")
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			code := exitStatus(cmd.Run())
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			last := lines[len(lines)-1]
			if code != tt.code {
				t.Errorf("exit %d, want %d; stderr %q", code, tt.code, stderr.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(last, w) {
					t.Errorf("error line %q lacks %q", last, w)
				}
			}
		})
	}
	// Accepting new host keys records them, after which the dry run works.
	home := t.TempDir()
	var stdout, stderr syncBuffer
	cmd := exec.Command(builtGPTUI(t), "run", "--no-tui", "--hosts", c.hosts, "-c", "tiny", "--accept-new-host-keys", "--dry-run")
	cmd.Env = append(os.Environ(), "HOME="+home, "SSH_AUTH_SOCK=")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("--accept-new-host-keys: %v\n%s", err, stderr.String())
	}
	known, _ := os.ReadFile(filepath.Join(home, ".ssh", "known_hosts"))
	if n := strings.Count(string(known), "ssh-ed25519"); n != 2 {
		t.Errorf("known_hosts after --accept-new-host-keys:\n%s", known)
	}
}

// agentPID returns the pid of the agent of the node whose workdir is
// c.workdirs[node].
func (c *sshCluster) agentPID(node int) int {
	for _, pid := range c.jobProcesses() {
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		// "gptui agent", not the workdir's lock holder "gptui agent --lock".
		if strings.HasPrefix(exe, c.workdirs[node]+string(filepath.Separator)) && bytes.HasSuffix(cmdline, []byte("\x00agent\x00")) {
			return pid
		}
	}
	return 0
}

// startTraining starts an endless small dp4 job on c's two nodes with the
// launcher flags args, and waits up to limit for stdout to show await.
// When the test ends the launcher is killed, the process *stopped names
// (if stopped is not nil and *stopped not 0) is continued, and every
// process of the job must be gone within 10 s.
func startTraining(t *testing.T, c *sshCluster, stdout, stderr *syncBuffer, await string, limit time.Duration, stopped *int, args ...string) *startedJob {
	t.Helper()
	training := stdout.await(await)
	cmd := c.command(t, stdout, stderr, append(append(args, small(t)...), "-o", "Engine.max_steps=1000000", "-o", "Engine.eval_freq=0", "-o", "Engine.logging_freq=1",
		"-o", "Distributed.dp_degree=4", "-o", "Global.local_batch_size=2", "-o", "Global.micro_batch_size=2")...)
	job := startJob(t, cmd, stdout, stderr, func() {
		if stopped != nil && *stopped != 0 {
			syscall.Kill(*stopped, syscall.SIGCONT)
		}
		c.awaitGone(t, time.Now(), 10*time.Second)
	})
	job.awaitLine(t, training, fmt.Sprintf("%q", await), limit)
	return job
}

// TestRunHostsAgentStopped: a node frozen whole — its agent and its
// workers stopped (SIGSTOP) — sends no heartbeat, and the other node's
// ranks, which wait for its ranks in their collectives, show nothing of
// them either; the launcher takes the node for lost after --agent-timeout,
// stops the job naming the node and how long it was silent, and kills the
// stopped agent, so nothing is left once it is continued. (An agent
// frozen alone, its workers training on, is not lost: TestFrozenAgent.)
func TestRunHostsAgentStopped(t *testing.T) {
	long(t)
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	c := newSSHCluster(t, "cpu:2")
	var stdout, stderr syncBuffer
	var stopped int
	job := startTraining(t, c, &stdout, &stderr, "] [train] epoch", 60*time.Second, &stopped, "--agent-timeout", "3s")
	if stopped = c.agentPID(1); stopped == 0 {
		t.Fatalf("no agent of node 1 among %v", c.jobProcesses())
	}
	var frozen []int
	for _, pid := range c.jobProcesses() {
		if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); strings.HasPrefix(exe, c.workdirs[1]+string(filepath.Separator)) {
			frozen = append(frozen, pid)
		}
	}
	for _, pid := range frozen {
		syscall.Kill(pid, syscall.SIGSTOP)
	}
	at := time.Now()
	// The bound: 3 s of silence, checked every 0.3 s, then the kill.
	const bound = 15 * time.Second
	err := job.wait(t, bound, "node 1's agent was stopped")
	took := time.Since(at)
	for _, pid := range frozen {
		syscall.Kill(pid, syscall.SIGCONT)
	}
	gone := c.awaitGone(t, at, 20*time.Second)
	stopped = 0
	t.Logf("launcher exited %v after the SIGSTOP; every process gone after %v", took, gone)
	msg := stderr.String()
	if exitStatus(err) == 0 || !strings.Contains(msg, "node 127.0.0.3 lost: its agent has been silent for ") {
		t.Errorf("exit %d, stderr:\n%s", exitStatus(err), msg)
	}
	// The silence counts from the agent's last message, which can come up
	// to one heartbeat interval before the SIGSTOP.
	if min := 3*time.Second - agent.HeartbeatEvery; took < min {
		t.Errorf("the node was lost %v after the SIGSTOP, before %v (3 s of silence less one heartbeat interval)", took, min)
	}
}

// TestRunHostsWorkerStopped: one worker of a 2×2 job stopped (SIGSTOP)
// stops reporting its progress while its agent stays well; after
// --hang-timeout the launcher names it as the stuck rank, before which
// collective, and the ranks waiting in it, then stops the gang: the
// stopped worker is killed, so nothing is left once it is continued.
func TestRunHostsWorkerStopped(t *testing.T) {
	long(t)
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	c := newSSHCluster(t, "cpu:2")
	var stdout, stderr syncBuffer
	var stopped int
	job := startTraining(t, c, &stdout, &stderr, "/3] [train] epoch: 0 step: 3 ", 60*time.Second, &stopped, "--hang-timeout", "3s", "--show-ranks", "all")
	stopped = c.workerPID(t, 3)
	syscall.Kill(stopped, syscall.SIGSTOP)
	at := time.Now()
	// The bound: 3 s without a report, checked every second, then the
	// gang stop (SIGTERM, SIGKILL after the agent's grace).
	const bound = 20 * time.Second
	err := job.wait(t, bound, "rank 3 was stopped")
	took := time.Since(at)
	syscall.Kill(stopped, syscall.SIGCONT)
	gone := c.awaitGone(t, at, 20*time.Second)
	stopped = 0
	out := stdout.String() + stderr.String()
	i := strings.Index(out, "[hang] ")
	if i < 0 {
		t.Fatalf("no [hang] line: exit %d\n%s", exitStatus(err), out)
	}
	line, _, _ := strings.Cut(out[i:], "\n")
	t.Logf("launcher exited %v after the SIGSTOP; every process gone after %v\n%s", took, gone, line)
	// Where the others wait depends on when the stop hit (ranks 0–2 in
	// one operation, or some in the next): every one of them is named.
	want := regexp.MustCompile(`^\[hang\] rank 3 on 127\.0\.0\.3 stuck: no progress report for \d+ s \(the process is stopped or frozen\)(; ranks? [0-2–, ]+ waiting in \w+ #\d+ \([\w-]+\) for \d+ s)+$`)
	if !want.MatchString(line) || !strings.Contains(line, "0") || !strings.Contains(line, "2") {
		t.Errorf("the diagnosis %q does not match %s", line, want)
	}
	if exitStatus(err) == 0 || !strings.Contains(stderr.String(), "job hung: rank 3 on 127.0.0.3 stuck") {
		t.Errorf("exit %d, stderr:\n%s", exitStatus(err), stderr.String())
	}
	if took < 3*time.Second {
		t.Errorf("the hang was called %v after the SIGSTOP, before its 3 s", took)
	}
}
