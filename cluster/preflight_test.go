package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/internal/sshtest"
	"github.com/gptui/gptui/presets"
)

// The pre-flight tests make each fault real: a node's firewall rule (nft
// in its network namespace), a dead-end bridge beside its link, a 64 MiB
// /dev/shm or a full disk mounted in its sshd's mount namespace. They need
// root, ip netns and nft, and skip saying so without them.

// nsCluster starts n sshd nodes, each in a network namespace of its own
// (sshtest.NodeNet, with deadEnd as its bridge, if any), and writes their
// inventory, each node with devices, and a known_hosts file.
func nsCluster(t *testing.T, n int, deadEnd, devices string) (*testCluster, *sshtest.NodeNet) {
	t.Helper()
	nn := sshtest.NewNodeNet(t, n, deadEnd)
	dir := t.TempDir()
	tc := &testCluster{hosts: filepath.Join(dir, "hosts.txt"), knownHosts: filepath.Join(dir, "known_hosts")}
	var inv strings.Builder
	for i, a := range nn.Nodes {
		s := sshtest.StartIn(t, nn.NodeNS[i], a)
		wd := filepath.Join(dir, fmt.Sprintf("node%d", i))
		tc.servers, tc.workdirs = append(tc.servers, s), append(tc.workdirs, wd)
		fmt.Fprintf(&inv, "%s@%s:22 devices=%s workdir=%s identity=%s\n", s.User, a, devices, wd, s.UserKeyFile)
	}
	if err := os.WriteFile(tc.hosts, []byte(inv.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tc.knownHosts, []byte(sshtest.KnownHosts(tc.servers...)), 0o600); err != nil {
		t.Fatal(err)
	}
	return tc, nn
}

// preflightOf returns the preflight event of node, failing the test if
// there is none.
func preflightOf(t *testing.T, es []event.Event, node string) *event.Preflight {
	t.Helper()
	for _, e := range es {
		if e.Kind == event.KindPreflight && e.Node == node && e.Preflight != nil {
			return e.Preflight
		}
	}
	t.Fatalf("no preflight event of %s in %d events", node, len(es))
	return nil
}

// checkOf returns the first check of p named name, or nil.
func checkOf(p *event.Preflight, name string) *event.Check {
	for i := range p.Checks {
		if p.Checks[i].Name == name {
			return &p.Checks[i]
		}
	}
	return nil
}

// lastProbed returns when the last node was probed: the setup before
// the pre-flight is done.
func lastProbed(es []event.Event) time.Time {
	var at time.Time
	for _, e := range es {
		if e.Kind == event.KindNode && e.State == event.NodeProbed && e.Time.After(at) {
			at = e.Time
		}
	}
	return at
}

// TestPreflightBlockedPort: a rule on the second node drops its packets
// to MASTER_PORT; the job is refused, before any worker starts and within
// 5 s of the setup, naming the node and the port; the first node (the
// master) reaches its own port.
func TestPreflightBlockedPort(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skipf("nft (nftables) not found: %v", err)
	}
	tc, nn := nsCluster(t, 2, "", "cpu:1")
	const port = 29500
	nn.Exec(t, 1, "nft", "add table inet gptuitest")
	nn.Exec(t, 1, "nft", "add chain inet gptuitest out { type filter hook output priority 0 ; }")
	nn.Exec(t, 1, "nft", fmt.Sprintf("add rule inet gptuitest out tcp dport %d drop", port))
	o := tc.options(t, "Distributed.dp_degree=2", "Engine.max_steps=2")
	o.MasterPort = port
	j := New(o)
	events := collect(j)
	start := time.Now()
	_, err := j.Plan(context.Background())
	refused := time.Now()
	j.Close()
	es := <-events
	var ie *InputError
	if !errors.As(err, &ie) {
		t.Fatalf("Plan: %v, want an *InputError", err)
	}
	master, blocked := nn.Nodes[0], nn.Nodes[1]
	for _, s := range []string{"node " + blocked, fmt.Sprintf("%s:%d", master, port), fmt.Sprintf("open TCP port %d on %s to %s", port, master, blocked)} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("the refusal does not say %q: %v", s, err)
		}
	}
	c := checkOf(preflightOf(t, es, blocked), event.CheckMaster)
	if c == nil || c.Status != event.PreflightFailed || c.Port != port || c.Peer != master {
		t.Errorf("%s's master check: %+v, want failed, port %d of %s", blocked, c, port, master)
	}
	if c := checkOf(preflightOf(t, es, master), event.CheckMaster); c == nil || c.Status != event.PreflightOK {
		t.Errorf("%s's own master check: %+v, want ok", master, c)
	}
	if c := checkOf(preflightOf(t, es, master), event.CheckPeer); c == nil || c.Status != event.PreflightOK {
		t.Errorf("%s reaching %s's range: %+v, want ok (only MASTER_PORT is blocked)", master, blocked, c)
	}
	for _, e := range es {
		if e.Kind == event.KindWorker {
			t.Errorf("a worker event of a refused job: %+v", e)
		}
	}
	pre := refused.Sub(lastProbed(es))
	if pre > 5*time.Second {
		t.Errorf("refused %v after the last node's probe, want within 5 s", pre)
	}
	t.Logf("refused %v after the last probe (%v after Plan began): %v", pre.Round(time.Millisecond), refused.Sub(start).Round(time.Millisecond), err)
}

// TestPreflightInterface: each node has a dead-end bridge, virbr0, which
// comes before its link in its list of interfaces; the pre-flight picks
// eth0, the interface toward the master, for NCCL_SOCKET_IFNAME and
// GLOO_SOCKET_IFNAME, and the job runs.
func TestPreflightInterface(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs a job")
	}
	tc, nn := nsCluster(t, 2, "virbr0", "cpu:1")
	for i := range nn.Nodes {
		// The trap: the first interface with an address, but loopback.
		var first string
		for _, l := range strings.Split(nn.Exec(t, i, "ip", "-4", "-o", "addr", "show"), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[1] != "lo" {
				first = f[1]
				break
			}
		}
		if first != "virbr0" {
			t.Fatalf("node %d lists %q first, want the dead end virbr0", i, first)
		}
	}
	j := New(tc.options(t, "Distributed.dp_degree=2", "Engine.max_steps=2"))
	events := collect(j)
	p, err := j.Plan(context.Background())
	if err != nil {
		j.Close()
		t.Fatal(err)
	}
	for i, n := range p.Nodes {
		if pf := n.Preflight; pf == nil || pf.Iface != "eth0" || pf.Addr != nn.Nodes[i] {
			t.Errorf("node %s: pre-flight %+v, want eth0 %s", n.Name, pf, nn.Nodes[i])
		}
		for _, w := range n.Spec.Workers {
			for _, kv := range []string{"NCCL_SOCKET_IFNAME=eth0", "GLOO_SOCKET_IFNAME=eth0"} {
				if !slices.Contains(w.Env, kv) {
					t.Errorf("rank %d's env lacks %s: %q", w.Rank, kv, w.Env)
				}
			}
		}
	}
	if err := j.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := j.Wait(); err != nil {
		t.Fatalf("the job: %v", err)
	}
	es := <-events
	if last := es[len(es)-1]; last.Kind != event.KindJob || last.State != event.JobDone {
		t.Errorf("the last event: %+v, want the job done", last)
	}
	t.Logf("interfaces chosen: %s %s, %s %s", p.Nodes[0].Name, p.Nodes[0].Preflight.Iface, p.Nodes[1].Name, p.Nodes[1].Preflight.Iface)
}

// fakeGPUs writes a gptui for the nodes that reports two GPUs to the
// probe and runs the real gptui for everything else: a GPU node where
// there is none.
func fakeGPUs(t *testing.T, real string) string {
	t.Helper()
	e := event.New(event.KindProbe)
	host, _ := os.Hostname()
	e.Probe = &event.Probe{Hostname: host, OS: "linux/amd64", Cores: 2, MemBytes: 8 << 30}
	for i := range 2 {
		e.Probe.Devices = append(e.Probe.Devices, event.Device{Index: i, Name: "NVIDIA H100 80GB HBM3 (faked)", MemTotal: 80 << 30, MemFree: 79 << 30})
	}
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf("#!/bin/sh\n# Two faked GPUs for the probe; the real gptui for the rest.\nif [ \"$1 $2\" = \"agent --probe\" ]; then\n  printf '%%s\\n' '%s'\n  exit 0\nfi\nexec %s \"$@\"\n", b, real)
	p := filepath.Join(t.TempDir(), "gptui")
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPreflightShm: a GPU node (its probe faked) whose /dev/shm is a
// 64 MiB tmpfs gets a warning naming the fix.
func TestPreflightShm(t *testing.T) {
	tc, _ := nsCluster(t, 1, "", "0,1")
	tc.servers[0].Mount(t, "tmpfs", "size=64m", "/dev/shm")
	o := tc.jobOptions(t, fakeGPUs(t, buildGPTUI(t)), nil)
	o.DryRun = true // no worker could start: there is no GPU
	j := New(o)
	events := collect(j)
	p, err := j.Plan(context.Background())
	j.Close()
	es := <-events
	if err != nil {
		t.Fatal(err)
	}
	pf := p.Nodes[0].Preflight
	c := checkOf(pf, event.CheckShm)
	if c == nil || c.Status != event.PreflightWarning || c.Have != 64<<20 {
		t.Fatalf("shm check %+v, want a warning at 64 MiB", c)
	}
	line := c.Problem()
	for _, s := range []string{"/dev/shm is 64.0 MiB", "--shm-size", "remount,size="} {
		if !strings.Contains(line, s) {
			t.Errorf("the warning does not say %q: %s", s, line)
		}
	}
	if g := checkOf(pf, event.CheckGPUs); g == nil || g.Status != event.PreflightOK {
		t.Errorf("gpus check %+v, want ok", g)
	}
	// The event carries the same.
	if e := preflightOf(t, es, p.Nodes[0].Name); !strings.Contains(fmt.Sprint(e.Checks), "64.0 MiB") {
		t.Errorf("the event's checks %+v lack the shm figure", e.Checks)
	}
	t.Logf("the warning: %s", line)
}

// TestPreflightDiskFull: the second node's output directory is a full
// 1 MiB tmpfs; the job is refused naming the node and the bytes its
// checkpoints need.
func TestPreflightDiskFull(t *testing.T) {
	tc, nn := nsCluster(t, 2, "", "cpu:1")
	out := filepath.Join(tc.workdirs[1], "output")
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	tc.servers[1].Mount(t, "tmpfs", "size=1m", out)
	// Fill it: dd stops at "No space left on device".
	tc.servers[1].InMountNS(t, "dd", "if=/dev/zero", "of="+filepath.Join(out, "fill"), "bs=64k")
	j := New(tc.options(t, "Distributed.dp_degree=2", "Engine.max_steps=4", "Engine.save_load.save_steps=2", "Engine.save_load.keep_last=1"))
	events := collect(j)
	_, err := j.Plan(context.Background())
	j.Close()
	es := <-events
	var ie *InputError
	if !errors.As(err, &ie) {
		t.Fatalf("Plan: %v, want an *InputError", err)
	}
	full := nn.Nodes[1]
	c := checkOf(preflightOf(t, es, full), event.CheckDisk)
	if c == nil || c.Status != event.PreflightFailed || c.Need <= c.Have || c.Have > 64<<10 {
		t.Fatalf("%s's disk check %+v, want failed with next to nothing free", full, c)
	}
	for _, s := range []string{"node " + full, fmt.Sprintf("(%d bytes)", c.Need), "output_dir"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("the refusal does not say %q: %v", s, err)
		}
	}
	if c := checkOf(preflightOf(t, es, nn.Nodes[0]), event.CheckDisk); c == nil || c.Status != event.PreflightOK {
		t.Errorf("%s's disk check %+v, want ok", nn.Nodes[0], c)
	}
	t.Logf("refused: %v", err)
}

// TestIfaceEnv: the interface goes to NCCL_SOCKET_IFNAME and
// GLOO_SOCKET_IFNAME unless the launcher's environment or the node's sets
// either.
func TestIfaceEnv(t *testing.T) {
	pf := &event.Preflight{Iface: "eth0"}
	for _, tt := range []struct {
		env, node []string
		want      string
	}{
		{nil, nil, "NCCL_SOCKET_IFNAME=eth0 GLOO_SOCKET_IFNAME=eth0"},
		{[]string{"NCCL_SOCKET_IFNAME=ib0"}, nil, "GLOO_SOCKET_IFNAME=eth0"},
		{nil, []string{"GLOO_SOCKET_IFNAME=bond0"}, "NCCL_SOCKET_IFNAME=eth0"},
		{[]string{"NCCL_SOCKET_IFNAME=^docker"}, []string{"GLOO_SOCKET_IFNAME=bond0"}, ""},
	} {
		pf.NodeEnv = tt.node
		if got := strings.Join(ifaceEnv(tt.env, pf), " "); got != tt.want {
			t.Errorf("env %q, node %q: %q, want %q", tt.env, tt.node, got, tt.want)
		}
	}
	if got := ifaceEnv(nil, &event.Preflight{}); got != nil {
		t.Errorf("no interface: %q", got)
	}
}

// TestClockCheck: a node 5 s ahead warns; one within the round trip's
// uncertainty does not.
func TestClockCheck(t *testing.T) {
	sent := time.Now()
	got := sent.Add(200 * time.Millisecond)
	if c := clockCheck(sent.Add(100*time.Millisecond+5*time.Second), sent, got); c.Status != event.PreflightWarning || c.Have != 5000 || !strings.Contains(c.Message, "ahead of") {
		t.Errorf("5 s ahead: %+v", c)
	}
	if c := clockCheck(sent.Add(-2*time.Second), sent, got); c.Status != event.PreflightOK {
		t.Errorf("2.1 s behind with 0.1 s of uncertainty: %+v, want ok", c)
	}
}

// TestDiskNeeds: keep_last and the one being written, every save with
// keep_last 0, the whole checkpoint with replicas, nothing without
// save_steps.
func TestDiskNeeds(t *testing.T) {
	workers := [][]slot{{{rank: 0}}, {{rank: 1}}}
	need := func(overrides ...string) ([]int64, []string) {
		cfg, err := presets.Load(small(t), append([]string{"Distributed.dp_degree=2", "Engine.max_steps=10"}, overrides...))
		if err != nil {
			t.Fatal(err)
		}
		return diskNeeds(cfg, 2, workers, false)
	}
	if n, _ := need("Engine.save_load.save_steps=0"); n != nil {
		t.Errorf("no saves: %v", n)
	}
	kept, why := need("Engine.save_load.save_steps=2", "Engine.save_load.keep_last=2")
	all, _ := need("Engine.save_load.save_steps=2", "Engine.save_load.keep_last=0")
	whole, wwhy := need("Engine.save_load.save_steps=2", "Engine.save_load.keep_last=2", "Engine.save_load.replicas=2")
	per := kept[0]/3 - checkpointOverhead
	if per <= 0 || kept[0] != 3*(per+checkpointOverhead) || all[0] != 5*(per+checkpointOverhead) {
		t.Errorf("keep_last 2: %d, all 5 saves: %d (a part of %d)", kept[0], all[0], per)
	}
	if whole[0] != 3*(2*per+checkpointOverhead) {
		t.Errorf("replicas 2: %d, want 3 whole checkpoints of 2×%d", whole[0], per)
	}
	if !strings.Contains(why[0], "3 checkpoints (keep_last 2 and the one being written)") || !strings.Contains(wwhy[1], "the whole checkpoint (replicas 2)") {
		t.Errorf("why: %q, %q", why[0], wwhy[1])
	}
}
