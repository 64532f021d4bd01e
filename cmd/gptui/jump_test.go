package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gptui/gptui/internal/sshtest"
	"github.com/gptui/gptui/sshexec"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// TestRunHostsJump: two nodes in a network namespace that only a bastion
// (another namespace) reaches run TestRunHosts's dp4 job, once through
// jump= in the inventory and once through ProxyJump in ~/.ssh/config
// (node names that only the bastion resolves, the bastion logged in to
// with a key of its own); each gives, step by step, the losses of the job
// on two sshd nodes reached directly. The workers on the two nodes reach
// each other inside their namespace.
func TestRunHostsJump(t *testing.T) {
	long(t)
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	jn := sshtest.NewJumpNet(t, 2)
	bastion := sshtest.StartIn(t, jn.BastionNS, jn.Bastion)
	var nodes []*sshtest.Server
	for _, a := range jn.Nodes {
		nodes = append(nodes, sshtest.StartIn(t, jn.NodesNS, a))
	}
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(filepath.Join(home, ".ssh"), 0o700); err != nil {
		t.Fatal(err)
	}
	known := filepath.Join(home, ".ssh", "known_hosts")
	// No SSH connection reaches a node from here but through the bastion
	// (a TCP connect may: this machine's network may take any).
	knownText := sshtest.KnownHosts(append([]*sshtest.Server{bastion}, nodes...)...)
	if err := os.WriteFile(known, []byte(knownText), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := sshexec.ClientConfig{KnownHostsFile: known, IdentityFiles: []string{nodes[0].UserKeyFile}, NoAgent: true, ConnectTimeout: 2 * time.Second}
	if c, err := sshexec.Dial(ctx, nodes[0].Addr, 22, cfg); err == nil {
		c.Close()
		t.Fatalf("%s is reached directly, not only through the bastion", nodes[0].HostPort())
	} else {
		t.Logf("directly: %v", err)
	}
	cfg.Jump = []sshexec.JumpHost{{Name: "bastion", Host: jn.Bastion, Port: 22, IdentityFiles: []string{bastion.UserKeyFile}}}
	c, err := sshexec.Dial(ctx, nodes[0].Addr, 22, cfg)
	if err != nil {
		t.Fatalf("through the bastion: %v", err)
	}
	c.Close()

	args := append(small(t), "-o", "Engine.max_steps=4", "-o", "Engine.eval_freq=0", "-o", "Engine.logging_freq=1",
		"-o", "Distributed.dp_degree=4", "-o", "Global.local_batch_size=2", "-o", "Global.micro_batch_size=2")

	// The job on nodes reached directly.
	direct := newSSHCluster(t, "cpu:2")
	want, _ := jobLosses(t, direct, "127.0.0.2", args)

	// authorize makes the bastion take the logins of keys alone.
	authorize := func(keys ...ssh.PublicKey) {
		var auth []byte
		for _, k := range keys {
			auth = append(auth, ssh.MarshalAuthorizedKey(k)...)
		}
		if err := os.WriteFile(filepath.Join(bastion.Dir, "authorized_keys"), auth, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var config, jumpHosts, configHosts strings.Builder
	fmt.Fprintf(&config, "Host gj-bastion\n  HostName %s\n  IdentityFile %s\n\n", jn.Bastion, bastion.UserKeyFile)
	for i, n := range nodes {
		knownText += knownhosts.Line([]string{jn.NodeName(i)}, n.HostKey) + "\n"
		fmt.Fprintf(&config, "Host gj-node%d\n  HostName %s\n  IdentityFile %s\n  ProxyJump gj-bastion\n\n", i, jn.NodeName(i), n.UserKeyFile)
		fmt.Fprintf(&jumpHosts, "%s@%s devices=cpu:2 workdir=%s identity=%s jump=%s@%s:22\n",
			n.User, n.Addr, filepath.Join(dir, "jump", fmt.Sprintf("node%d", i)), n.UserKeyFile, bastion.User, jn.Bastion)
		fmt.Fprintf(&configHosts, "gj-node%d devices=cpu:2 workdir=%s\n", i, filepath.Join(dir, "config", fmt.Sprintf("node%d", i)))
	}
	for name, text := range map[string]string{
		"home/.ssh/known_hosts": knownText, "home/.ssh/config": config.String(),
		"jump.txt": jumpHosts.String(), "config.txt": configHosts.String(),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	for _, tt := range []struct {
		name, hosts, rank0 string
		keys               []ssh.PublicKey // those the bastion takes
	}{
		// The nodes' keys are offered to the bastion.
		{"jump=", "jump.txt", nodes[0].Addr, []ssh.PublicKey{nodes[0].UserKey, nodes[1].UserKey}},
		// The bastion's IdentityFile alone is.
		{"ProxyJump", "config.txt", "gj-node0", []ssh.PublicKey{bastion.UserKey}},
	} {
		authorize(tt.keys...)
		c := &sshCluster{servers: nodes, hosts: filepath.Join(dir, tt.hosts), home: home}
		for i := range nodes {
			c.workdirs = append(c.workdirs, filepath.Join(dir, strings.TrimSuffix(tt.hosts, ".txt"), fmt.Sprintf("node%d", i)))
		}
		got, _ := jobLosses(t, c, tt.rank0, args)
		if !slices.Equal(got, want) {
			t.Errorf("through %s the losses are\n%s\ndirectly\n%s", tt.name, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		for _, k := range tt.keys {
			if !strings.Contains(bastion.Log(), ssh.FingerprintSHA256(k)) {
				t.Errorf("through %s the bastion took no login with %s:\n%s", tt.name, ssh.FingerprintSHA256(k), bastion.Log())
			}
		}
	}
	// The nodes were reached from the bastion's end of their link.
	for _, n := range nodes {
		if !strings.Contains(n.Log(), "Accepted publickey for "+n.User+" from 198.19.0.1 port ") {
			t.Errorf("node %s took no login from the bastion:\n%s", n.HostPort(), n.Log())
		}
	}
	t.Logf("the losses of every step, the same through jump=, ProxyJump and directly:\n%s", strings.Join(want, "\n"))
}

// jumpTrainLine matches the step and loss of a [train] line.
var jumpTrainLine = regexp.MustCompile(`\[train\] (epoch: \d+ step: \d+ lr: \S+ loss: \S+)`)

// jobLosses runs the job 'gptui run --no-tui' with args on c's nodes,
// whose rank 0 is named rank0, and returns its losses — rank 0's step and
// loss of each [train] line, and the final one — and its standard output.
func jobLosses(t *testing.T, c *sshCluster, rank0 string, args []string) ([]string, string) {
	t.Helper()
	var stdout, stderr syncBuffer
	start := time.Now()
	err := c.command(t, &stdout, &stderr, args...).Run()
	took := time.Since(start)
	out := stdout.String()
	if err != nil {
		t.Fatalf("%s: exit %d after %v\nstdout:\n%s\nstderr:\n%s", c.hosts, exitStatus(err), took, out, stderr.String())
	}
	gone := c.awaitGone(t, time.Now(), 10*time.Second)
	var losses []string
	for _, l := range strings.Split(out, "\n") {
		if m := jumpTrainLine.FindStringSubmatch(l); m != nil {
			if !strings.HasPrefix(l, "["+rank0+"/0] ") {
				t.Errorf("%s: a [train] line not of rank 0 on %s: %q", c.hosts, rank0, l)
			}
			losses = append(losses, m[1])
		}
	}
	if len(losses) != 4 {
		t.Errorf("%s: %d [train] lines, want 4:\n%s", c.hosts, len(losses), out)
	}
	losses = append(losses, "final loss "+finalLoss(t, out))
	t.Logf("%s: the job took %v, its processes gone %v after", c.hosts, took.Round(time.Millisecond), gone.Round(time.Millisecond))
	return losses, out
}
