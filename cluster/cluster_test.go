package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gptui/gptui/agent"
	"github.com/gptui/gptui/engine/smalljob"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/internal/sshtest"
	"github.com/gptui/gptui/internal/testwd"
	"github.com/gptui/gptui/launch"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/ranktable"
	"github.com/gptui/gptui/sshexec"
)

// gptuiBin is a gptui binary built once for the tests: the executable the
// launcher pushes and the nodes run.
var gptuiBin struct {
	once sync.Once
	path string
	err  error
}

// srcDir is the package's source directory; the tests run in a temporary
// directory of their own (testwd), where a local node's relative output_dir
// lands.
var srcDir string

func TestMain(m *testing.M) {
	code := testwd.Main(m, &srcDir)
	if gptuiBin.path != "" {
		os.RemoveAll(filepath.Dir(gptuiBin.path))
	}
	if smallCfg.dir != "" {
		os.RemoveAll(smallCfg.dir)
	}
	os.Exit(code)
}

// smallCfg is the config the jobs of the tests train (engine/smalljob),
// written once.
var smallCfg struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// small returns the path of the small config.
func small(t *testing.T) string {
	t.Helper()
	smallCfg.once.Do(func() {
		if smallCfg.dir, smallCfg.err = os.MkdirTemp("", "gptui-cluster-small-"); smallCfg.err == nil {
			smallCfg.path, smallCfg.err = smalljob.Write(smallCfg.dir)
		}
	})
	if smallCfg.err != nil {
		t.Fatal(smallCfg.err)
	}
	return smallCfg.path
}

func buildGPTUI(t *testing.T) string {
	t.Helper()
	gptuiBin.once.Do(func() {
		dir, err := os.MkdirTemp("", "gptui-cluster-test-")
		if err != nil {
			gptuiBin.err = err
			return
		}
		gptuiBin.path = filepath.Join(dir, "gptui")
		// As the README builds it: without cgo, so that it starts on the
		// Debian 11 node of TestBullseyeNode.
		build := exec.Command("go", "build", "-o", gptuiBin.path, "github.com/gptui/gptui/cmd/gptui")
		build.Dir = srcDir // the tests run outside the module (testwd)
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := build.CombinedOutput()
		if err != nil {
			gptuiBin.err = fmt.Errorf("go build: %v: %s", err, out)
		}
	})
	if gptuiBin.err != nil {
		t.Fatal(gptuiBin.err)
	}
	return gptuiBin.path
}

// testCluster is two sshd nodes on 127.0.0.2 and 127.0.0.3 and an
// inventory for them.
type testCluster struct {
	servers    []*sshtest.Server
	workdirs   []string
	hosts      string // the inventory file
	knownHosts string
}

// newCluster starts the nodes; each gets the devices given, and the
// known_hosts file knows them.
func newCluster(t *testing.T, devices string) *testCluster {
	t.Helper()
	dir := t.TempDir()
	n := sshtest.StartNodes(t, dir, devices, "127.0.0.2", "127.0.0.3")
	tc := &testCluster{servers: n.Servers, workdirs: n.Workdirs, hosts: n.Hosts, knownHosts: filepath.Join(dir, "known_hosts")}
	if err := os.WriteFile(tc.knownHosts, []byte(sshtest.KnownHosts(tc.servers...)), 0o600); err != nil {
		t.Fatal(err)
	}
	return tc
}

// options returns the job options for the cluster and the small config
// with the given overrides, with the gptui binary built for the tests.
func (tc *testCluster) options(t *testing.T, overrides ...string) Options {
	t.Helper()
	return tc.jobOptions(t, buildGPTUI(t), overrides)
}

// optionsWithout is options without the gptui binary, for the tests whose
// job stops before a node runs it: the executable is a script that exits 1.
func (tc *testCluster) optionsWithout(t *testing.T, overrides ...string) Options {
	t.Helper()
	stand := filepath.Join(t.TempDir(), "gptui")
	if err := os.WriteFile(stand, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return tc.jobOptions(t, stand, overrides)
}

// jobOptions is the options of a job on the cluster running exe.
func (tc *testCluster) jobOptions(t *testing.T, exe string, overrides []string) Options {
	t.Helper()
	nodes, err := sshexec.LoadInventory(tc.hosts)
	if err != nil {
		t.Fatal(err)
	}
	o := append([]string{"Engine.eval_freq=0", "Engine.logging_freq=1", "Engine.log_dir=log"}, overrides...)
	cfg, err := presets.Load(small(t), o)
	if err != nil {
		t.Fatal(err)
	}
	return Options{
		Nodes:  nodes,
		Hosts:  tc.hosts,
		Config: cfg,
		Exe:    exe,
		SSH:    sshexec.ClientConfig{KnownHostsFile: tc.knownHosts, NoAgent: true},
		Env:    []string{"GPTUI_THREADS=1"},
	}
}

// collect receives a job's events until the channel closes.
func collect(j *Job) <-chan []event.Event {
	out := make(chan []event.Event, 1)
	go func() {
		var es []event.Event
		for e := range j.Events() {
			es = append(es, e)
		}
		out <- es
	}()
	return out
}

var dp4 = []string{"Distributed.dp_degree=4", "Global.local_batch_size=2", "Global.micro_batch_size=2"}

// TestPlan: the rank table of two nodes × cpu:2, the pushes (the second
// plan with the same binary skips it), the agents' specs.
func TestPlan(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: cmd/gptui's TestRestartWorkerKilled runs the launcher end to end")
	}
	tc := newCluster(t, "cpu:2")
	// Round 0 pushes the binary to both nodes; round 1 finds it there
	// (the nodes' first command says its SHA-256); before round 2 node 0's
	// copy loses its execute permission (its content is kept, the mode
	// corrected) and node 1's has 16 bytes flipped (it is pushed again).
	skipped := [3][2]bool{{false, false}, {true, true}, {true, false}}
	var took [3][]time.Duration
	for round := range 3 {
		if round == 2 {
			if err := os.Chmod(filepath.Join(tc.workdirs[0], "gptui"), 0o644); err != nil {
				t.Fatal(err)
			}
			flip(t, filepath.Join(tc.workdirs[1], "gptui"))
		}
		j := New(tc.options(t, dp4...))
		events := collect(j)
		p, err := j.Plan(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		// The plan holds each workdir's lock, and Close releases it.
		for _, wd := range tc.workdirs {
			if h, err := agent.ReadLock(wd); err != nil || h == nil || h.Job != p.JobID {
				t.Errorf("%s: the planned job's lock: %+v, %v", wd, h, err)
			}
		}
		j.Close()
		for _, wd := range tc.workdirs {
			if _, err := os.Stat(filepath.Join(wd, agent.LockFile)); !os.IsNotExist(err) {
				t.Errorf("%s: the lock is left after Close (%v)", wd, err)
			}
		}
		es := <-events
		var buf bytes.Buffer
		p.Table.WriteTo(&buf)
		want := `{
    "version": "1.0",
    "server_count": "2",
    "server_list": [
        {
            "server_id": "127.0.0.2",
            "device": [
                {"device_id": "0", "device_ip": "127.0.0.2", "rank_id": "0"},
                {"device_id": "1", "device_ip": "127.0.0.2", "rank_id": "1"}
            ],
            "host_nic_ip": "reserve"
        },
        {
            "server_id": "127.0.0.3",
            "device": [
                {"device_id": "0", "device_ip": "127.0.0.3", "rank_id": "2"},
                {"device_id": "1", "device_ip": "127.0.0.3", "rank_id": "3"}
            ],
            "host_nic_ip": "reserve"
        }
    ],
    "status": "completed"
}
`
		if buf.String() != want {
			t.Errorf("rank table:\n%s\nwant:\n%s", buf.String(), want)
		}
		if p.World != 4 || p.MasterAddr != "127.0.0.2" || p.MasterPort <= 0 {
			t.Errorf("world %d master %s:%d, want 4 at 127.0.0.2", p.World, p.MasterAddr, p.MasterPort)
		}
		for i, n := range p.Nodes {
			if len(n.Pushes) != 2 || !strings.HasSuffix(n.Pushes[0].File, "/gptui") {
				t.Fatalf("node %s pushes %+v", n.Name, n.Pushes)
			}
			if n.Pushes[0].Skipped != skipped[round][i] {
				t.Errorf("round %d: node %s: binary push skipped=%v", round, n.Name, n.Pushes[0].Skipped)
			}
			if fi, err := os.Stat(filepath.Join(tc.workdirs[i], "gptui")); err != nil || fi.Mode().Perm() != 0o755 {
				t.Errorf("round %d: node %s: the binary's mode %v (%v), want 0755", round, n.Name, fi.Mode(), err)
			}
			took[round] = append(took[round], n.Pushes[0].Took)
			if n.Probe.Cores < 1 {
				t.Errorf("node %s probe %+v", n.Name, n.Probe)
			}
			for k, w := range n.Spec.Workers {
				if w.Rank != 2*i+k || w.LocalRank != k || w.Device != -1 {
					t.Errorf("node %d worker %d: %+v", i, k, w)
				}
				env := strings.Join(w.Env, " ")
				for _, kv := range []string{fmt.Sprintf("RANK=%d", 2*i+k), "WORLD_SIZE=4", "MASTER_ADDR=127.0.0.2", fmt.Sprintf("MASTER_PORT=%d", p.MasterPort), "GPTUI_THREADS=1"} {
					if !strings.Contains(" "+env+" ", " "+kv+" ") {
						t.Errorf("rank %d env %q lacks %s", w.Rank, env, kv)
					}
				}
			}
			// The config, whole, and no temporary file beside it.
			jobDir := filepath.Join(tc.workdirs[i], "jobs", p.JobID)
			if b, err := os.ReadFile(filepath.Join(jobDir, "config.yaml")); err != nil || !bytes.Equal(b, j.opts.Config.YAML()) {
				t.Errorf("node %s: config not pushed whole (%v): %q", n.Name, err, b)
			}
			if left, _ := os.ReadDir(jobDir); len(left) != 1 {
				t.Errorf("node %s: %s holds %v, want the config alone", n.Name, jobDir, left)
			}
		}
		var states []string
		for _, e := range es {
			if e.Kind == event.KindNode && e.Node == "127.0.0.2" {
				states = append(states, e.State)
			}
		}
		if got := strings.Join(states, ","); got != "connecting,pushing,locked,pushing,probed,ready" {
			t.Errorf("node events of 127.0.0.2: %s", got)
		}
	}
	t.Logf("binary push per node: first %v, second (skipped) %v, third %v", took[0], took[1], took[2])
}

// flip inverts 16 bytes in the middle of the file p, its size kept.
func flip(t *testing.T, p string) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		b[len(b)/2+i] ^= 0xff
	}
	// A new file: p may be a link to the binary the test runs.
	tmp := p + ".flip"
	if err := os.WriteFile(tmp, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
}

// TestHostKeys: a node the known_hosts file does not know, or whose key
// changed, is refused naming the fingerprint.
func TestHostKeys(t *testing.T) {
	tc := newCluster(t, "cpu:1")
	for _, tt := range []struct {
		name  string
		setup func()
		kind  string
	}{
		{"unknown", func() { os.WriteFile(tc.knownHosts, []byte(tc.servers[0].KnownHostsLine()+"\n"), 0o600) }, sshexec.HostKeyUnknown},
		{"changed", func() { tc.servers[1].RotateHostKey(t) }, sshexec.HostKeyChanged},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name == "changed" {
				os.WriteFile(tc.knownHosts, []byte(sshtest.KnownHosts(tc.servers...)), 0o600)
			}
			tt.setup()
			j := New(tc.optionsWithout(t)) // refused before any push
			events := collect(j)
			_, err := j.Plan(context.Background())
			j.Close()
			es := <-events
			var hk *sshexec.HostKeyError
			if !errors.As(err, &hk) || hk.Kind != tt.kind {
				t.Fatalf("Plan: %v, want a %s host key error", err, tt.kind)
			}
			if !strings.Contains(err.Error(), hk.Fingerprint) || hk.Fingerprint == "" || !strings.Contains(err.Error(), "127.0.0.3") {
				t.Errorf("error %q does not name the node and fingerprint", err)
			}
			failed := false
			for _, e := range es {
				if e.Kind == event.KindNode && e.State == event.NodeFailed && e.Node == "127.0.0.3" && strings.Contains(e.Message, hk.Fingerprint) {
					failed = true
				}
			}
			if !failed {
				t.Errorf("no node failed event naming the fingerprint in %v", es)
			}
		})
	}
}

// finalLoss returns the final loss of rank 0's "[done]" line.
func finalLoss(lines []string) string {
	for _, l := range lines {
		if i := strings.Index(l, "final loss: "); i >= 0 && strings.HasPrefix(l, "[done]") {
			return strings.Fields(l[i+len("final loss: "):])[0]
		}
	}
	return ""
}

// TestTrain: a job on two nodes trains to the end and ends with the loss
// of the same job run by 'gptui run --nproc' on this machine. (Add a row
// for tensor parallelism, dp2×mp2, once the engine has it.)
func TestTrain(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: cmd/gptui's TestRestartWorkerKilled runs the launcher end to end")
	}
	for _, tt := range []struct {
		name      string
		devices   string // per node
		nproc     int
		overrides []string
	}{
		{"dp4", "cpu:2", 4, dp4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tc := newCluster(t, tt.devices)
			o := append([]string{"Engine.max_steps=3"}, tt.overrides...)
			j := New(tc.options(t, o...))
			events := collect(j)
			start := time.Now()
			if _, err := j.Plan(context.Background()); err != nil {
				j.Close()
				t.Fatal(err)
			}
			planned := time.Since(start)
			if err := j.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			err := j.Wait()
			es := <-events
			t.Logf("plan %v, whole job %v", planned, time.Since(start))
			var rank0 []string
			metrics := map[int]int{}
			for _, e := range es {
				switch {
				case e.Kind == event.KindLog && e.Rank == 0:
					rank0 = append(rank0, e.Line)
				case e.Kind == event.KindMetrics:
					metrics[e.Rank]++
				}
			}
			if err != nil {
				t.Fatalf("job: %v\nrank 0: %s", err, strings.Join(rank0, "\n"))
			}
			if last := es[len(es)-1]; last.Kind != event.KindJob || last.State != event.JobDone {
				t.Errorf("last event %+v, want job done", last)
			}
			for r := range tt.nproc {
				if metrics[r] != 3 {
					t.Errorf("rank %d: %d metrics events, want 3", r, metrics[r])
				}
			}
			got := finalLoss(rank0)

			args := []string{"run", "--no-tui", "--nproc", fmt.Sprint(tt.nproc), "-c", small(t), "-o", "Engine.eval_freq=0", "-o", "Engine.logging_freq=1",
				"-o", "Engine.log_dir=" + filepath.Join(t.TempDir(), "log")}
			for _, kv := range o {
				args = append(args, "-o", kv)
			}
			cmd := exec.Command(buildGPTUI(t), args...)
			cmd.Env = append(os.Environ(), "GPTUI_THREADS=1")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("local run: %v\n%s", err, out)
			}
			var local []string
			for _, l := range strings.Split(string(out), "\n") {
				if rest, ok := strings.CutPrefix(l, "[0] "); ok {
					local = append(local, rest)
				}
			}
			want := finalLoss(local)
			if got == "" || got != want {
				t.Errorf("final loss on the cluster %q, locally %q", got, want)
			}
			t.Logf("final loss %s on both", got)
		})
	}
}

// processes returns the pids of live processes running a gptui from one
// of dirs, and of those the agents.
func processes(dirs []string) (all, agents []int) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil {
			continue
		}
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' {
			continue
		}
		for _, d := range dirs {
			if strings.HasPrefix(exe, d+"/") {
				all = append(all, pid)
				cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
				if bytes.Equal(cmdline, []byte("./gptui\x00agent\x00")) {
					agents = append(agents, pid)
				}
			}
		}
	}
	return all, agents
}

// TestNodeLost: a node whose agent dies (as when the machine or its
// connection goes) is reported lost, and the job stops on every node
// within 10 s.
func TestNodeLost(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: cmd/gptui's TestRestartWorkerKilled runs the launcher end to end")
	}
	tc := newCluster(t, "cpu:2")
	j := New(tc.options(t, append([]string{"Engine.max_steps=1000000"}, dp4...)...))
	events := collect(j)
	if _, err := j.Plan(context.Background()); err != nil {
		j.Close()
		t.Fatal(err)
	}
	if err := j.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	deadline := time.Now().Add(30 * time.Second)
	var agents []int
	for {
		var all []int
		all, agents = processes(tc.workdirs)
		if len(all) == 8 && len(agents) == 2 { // and 2 workdir lock holders, 4 workers
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job's processes did not all start: %v (agents %v)", all, agents)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Kill the agent of the second node: its workers die with it.
	var victim int
	for _, pid := range agents {
		if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); strings.HasPrefix(exe, tc.workdirs[1]+"/") {
			victim = pid
		}
	}
	killed := time.Now()
	syscall.Kill(victim, syscall.SIGKILL)
	waited := make(chan error, 1)
	go func() { waited <- j.Wait() }()
	var err error
	select {
	case err = <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("the job still runs 10 s after a node's agent was killed")
	}
	took := time.Since(killed)
	var f *Failure
	if !errors.As(err, &f) || !f.Lost || f.Node != "127.0.0.3" {
		t.Fatalf("Wait: %v, want node 127.0.0.3 lost", err)
	}
	for {
		all, _ := processes(tc.workdirs)
		if len(all) == 0 {
			break
		}
		if time.Since(killed) > 10*time.Second {
			t.Fatalf("processes remain: %v", all)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("job failed %v after the agent was killed; all gone after %v", took, time.Since(killed))
	es := <-events
	lost := false
	for _, e := range es {
		lost = lost || (e.Kind == event.KindNode && e.State == event.NodeLost && e.Node == "127.0.0.3")
	}
	if last := es[len(es)-1]; !lost || last.State != event.JobFailed || last.Node != "127.0.0.3" {
		t.Errorf("lost event %v, last event %+v", lost, last)
	}
}

// TestRankTableGiven: a given rank table decides the ranks: here the
// second node holds ranks 0 and 1, so MASTER_ADDR is its address.
func TestRankTableGiven(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: cmd/gptui's TestRestartWorkerKilled runs the launcher end to end")
	}
	tc := newCluster(t, "cpu:2")
	o := tc.options(t, dp4...)
	tab, err := ranktable.Parse("given.json", []byte(`{"version":"1.0","server_count":"2","server_list":[
		{"server_id":"127.0.0.3","device":[{"device_id":"0","device_ip":"127.0.0.3","rank_id":"0"},{"device_id":"1","device_ip":"127.0.0.3","rank_id":"1"}]},
		{"server_id":"127.0.0.2","device":[{"device_id":"0","device_ip":"127.0.0.2","rank_id":"2"},{"device_id":"1","device_ip":"127.0.0.2","rank_id":"3"}]}],
		"status":"completed"}`))
	if err != nil {
		t.Fatal(err)
	}
	o.RankTable, o.RankTableFile = tab, "given.json"
	j := New(o)
	events := collect(j)
	p, err := j.Plan(context.Background())
	j.Close()
	<-events
	if err != nil {
		t.Fatal(err)
	}
	if p.MasterAddr != "127.0.0.3" || p.World != 4 {
		t.Errorf("master %s world %d, want 127.0.0.3 and 4", p.MasterAddr, p.World)
	}
	for i, want := range [][]int{{2, 3}, {0, 1}} {
		var got []int
		for _, w := range p.Nodes[i].Spec.Workers {
			got = append(got, w.Rank)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("node %s ranks %v, want %v", p.Nodes[i].Name, got, want)
		}
	}
}

// TestLocalNode: a localhost node runs its agent as a local process, next
// to an SSH node, and the job trains to the end, its rank 0 listening on
// the MASTER_PORT given.
func TestLocalNode(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: cmd/gptui's TestRestartWorkerKilled runs the launcher end to end")
	}
	tc := newCluster(t, "cpu:2")
	local := filepath.Join(t.TempDir(), "local")
	inv, _ := os.ReadFile(tc.hosts)
	first := strings.SplitAfter(string(inv), "\n")[0]
	os.WriteFile(tc.hosts, []byte("localhost devices=cpu:2 workdir="+local+"\n"+first), 0o644)
	tc.workdirs = []string{local, tc.workdirs[0]}
	o := tc.options(t, append([]string{"Engine.max_steps=2"}, dp4...)...)
	o.KeepJobs = 2
	port, err := launch.FreePort("")
	if err != nil {
		t.Fatal(err)
	}
	o.MasterPort = port
	j := New(o)
	events := collect(j)
	p, err := j.Plan(context.Background())
	if err != nil {
		j.Close()
		t.Fatal(err)
	}
	if p.Nodes[0].Addr != "local" || p.MasterAddr == "" || p.MasterPort != port {
		t.Errorf("plan %+v", p)
	}
	// Earlier jobs' directories, and two that are not job ids: after the
	// job each node keeps this job's and the newest old one, and the others.
	old := []string{"20200101-000000-aaaaaa", "20200102-000000-bbbbbb", "20200103-000000-cccccc"}
	others := []string{"mine", "20200101-000000-ABCDEF"}
	for _, wd := range tc.workdirs {
		for _, d := range append(old, others...) {
			if err := os.MkdirAll(filepath.Join(wd, "jobs", d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := j.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	err = j.Wait()
	es := <-events
	if err != nil {
		t.Fatal(err)
	}
	ran := map[string]int{}
	for _, e := range es {
		if e.Kind == event.KindWorker && e.State == event.WorkerExited {
			ran[e.Node]++
		}
	}
	if ran["localhost"] != 2 || ran["127.0.0.2"] != 2 {
		t.Errorf("workers that exited 0 by node: %v", ran)
	}
	if _, err := os.Stat(filepath.Join(local, "log", "metrics.0.jsonl")); err != nil {
		t.Errorf("rank 0 did not run in the local workdir: %v", err)
	}
	want := append([]string{old[2], p.JobID}, others...)
	slices.Sort(want)
	for _, wd := range tc.workdirs {
		entries, err := os.ReadDir(filepath.Join(wd, "jobs"))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range entries {
			got = append(got, e.Name())
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s/jobs holds %v, want %v", wd, got, want)
		}
	}
	pruned := 0
	for _, e := range es {
		if e.Kind == event.KindNode && e.State == event.NodePruned {
			pruned++
			if !strings.Contains(e.Message, "removed 2 old jobs (jobs/20200101-000000-aaaaaa, jobs/20200102-000000-bbbbbb), keeping the newest 2") {
				t.Errorf("node %s: pruned event %q", e.Node, e.Message)
			}
		}
	}
	if pruned != 2 {
		t.Errorf("%d pruned events, want one per node", pruned)
	}
	t.Logf("MASTER_ADDR %s", p.MasterAddr)
}

// TestSetupFailsFast: a node that fails its setup (here a host key that
// known_hosts does not have) stops the others' at once: Plan returns its
// error well before a node that never answers would time out (10 s).
func TestSetupFailsFast(t *testing.T) {
	tc := newCluster(t, "cpu:1")
	// A host that accepts the connection and never speaks SSH.
	ln, err := net.Listen("tcp", "127.0.0.4:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	}()
	inv, _ := os.ReadFile(tc.hosts)
	silent := fmt.Sprintf("%s@%s devices=cpu:1 workdir=%s identity=%s\n", tc.servers[0].User, ln.Addr(), filepath.Join(t.TempDir(), "silent"), tc.servers[0].UserKeyFile)
	os.WriteFile(tc.hosts, append([]byte(silent), inv...), 0o644)
	os.WriteFile(tc.knownHosts, []byte(tc.servers[0].KnownHostsLine()+"\n"), 0o600) // not 127.0.0.3's
	// Setup stops before any node runs the executable.
	j := New(tc.optionsWithout(t))
	events := collect(j)
	start := time.Now()
	_, err = j.Plan(context.Background())
	took := time.Since(start)
	j.Close()
	es := <-events
	if err == nil || !strings.Contains(err.Error(), "127.0.0.3") {
		t.Fatalf("Plan: %v, want the error of node 127.0.0.3", err)
	}
	if took > 5*time.Second {
		t.Errorf("Plan took %v to fail, want < 5 s", took)
	}
	var stopped bool
	for _, e := range es {
		if e.Kind == event.KindNode && e.Node == "127.0.0.4" && e.State == event.NodeStopped {
			stopped = strings.HasPrefix(e.Message, "setup stopped: ") && strings.Contains(e.Message, "127.0.0.3")
		}
	}
	if !stopped {
		t.Errorf("the silent node's setup was not reported stopped by 127.0.0.3's failure: %+v", es)
	}
	t.Logf("failed after %v: %v", took, err)
}
