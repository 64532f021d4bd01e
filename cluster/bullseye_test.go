package cluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/internal/sshtest"
	"github.com/gptui/gptui/sshexec"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// bullseyeRootEnv names a Debian 11 root for TestBullseyeNode; without it
// the test looks in ~/.cache/gptui/bullseye, where
// scripts/bullseye-root.sh makes one.
const bullseyeRootEnv = "GPTUI_BULLSEYE_ROOT"

// bullseyeRoot returns the Debian 11 root, or skips the test saying how
// to make one.
func bullseyeRoot(t *testing.T) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("a chroot with its own sshd: Linux only")
	}
	root := os.Getenv(bullseyeRootEnv)
	if root == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Skipf("no $%s and no home directory: %v", bullseyeRootEnv, err)
		}
		root = filepath.Join(home, ".cache", "gptui", "bullseye")
	}
	v, err := os.ReadFile(filepath.Join(root, "etc", "debian_version"))
	if _, serr := os.Stat(filepath.Join(root, "usr", "sbin", "sshd")); err != nil || serr != nil {
		t.Skipf("no Debian 11 root with sshd at %s ($%s): make one with scripts/bullseye-root.sh (as root; about 200 MB from deb.debian.org, a few minutes)", root, bullseyeRootEnv)
	}
	if !strings.HasPrefix(string(v), "11.") {
		t.Skipf("%s is Debian %s, not 11", root, strings.TrimSpace(string(v)))
	}
	if os.Geteuid() != 0 {
		t.Skip("the Debian 11 node runs sshd in a chroot, with mounts of its own: run as root")
	}
	root, err = filepath.EvalSymlinks(root)
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// chrootNode is an sshd of a Debian root, running in that root.
type chrootNode struct {
	addr    string
	port    int
	key     string        // the user key's file, for root
	hostKey ssh.PublicKey // the server's
}

// startChrootNode runs the root's own sshd in a chroot of root on a free
// port of addr (loopback), as a node whose system is the root's: what the
// launcher pushes runs there with the root's dynamic loader and C
// library. It runs in a mount and PID namespace of its own, where the
// root gets /proc, /dev, a /run of its own and, at the same path, this
// machine's temporary directory (where the tests' workdirs, configs and
// data are), and nothing of it is seen outside: when the test ends, sshd
// (PID 1 there) is killed, which kills every process of the namespace,
// and the mounts go with it. Nothing is written in the root, nor in this
// machine's /etc.
func startChrootNode(t *testing.T, root, addr string) *chrootNode {
	t.Helper()
	dir := t.TempDir() // in os.TempDir(), which the chroot sees too
	tmp, err := filepath.EvalSymlinks(os.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(dir, tmp+"/") && !strings.HasPrefix(dir, os.TempDir()+"/") {
		t.Skipf("the test's directory %s is not under %s", dir, tmp)
	}
	if fi, err := os.Stat(filepath.Join(root, tmp)); err != nil || !fi.IsDir() {
		t.Skipf("%s has no %s to bind this machine's temporary directory on (TMPDIR=%s)", root, tmp, os.Getenv("TMPDIR"))
	}

	hostPub, hostKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	userPub, userKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	n := &chrootNode{addr: addr, key: filepath.Join(dir, "id_ed25519")}
	if n.hostKey, err = ssh.NewPublicKey(hostPub); err != nil {
		t.Fatal(err)
	}
	userSSH, err := ssh.NewPublicKey(userPub)
	if err != nil {
		t.Fatal(err)
	}
	writeKey := func(file string, key ed25519.PrivateKey) {
		b, err := ssh.MarshalPrivateKey(key, "")
		if err == nil {
			err = os.WriteFile(file, pem.EncodeToMemory(b), 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	writeKey(filepath.Join(dir, "ssh_host_ed25519_key"), hostKey)
	writeKey(n.key, userKey)
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), ssh.MarshalAuthorizedKey(userSSH), 0o600); err != nil {
		t.Fatal(err)
	}

	var log bytes.Buffer
	for attempt := 0; ; attempt++ {
		ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
		if err != nil {
			t.Fatal(err)
		}
		n.port = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		// OpenSSH 8.4: no SetEnv here (8.7); root's ~/.bashrc in the
		// root prints nothing.
		config := fmt.Sprintf(`ListenAddress %s
HostKey %s
PidFile none
AuthorizedKeysFile %s
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PubkeyAuthentication yes
PasswordAuthentication no
ChallengeResponseAuthentication no
UseDNS no
PrintMotd no
PrintLastLog no
MaxStartups 100
LogLevel VERBOSE
Subsystem sftp internal-sftp
`, net.JoinHostPort(addr, strconv.Itoa(n.port)), filepath.Join(dir, "ssh_host_ed25519_key"), filepath.Join(dir, "authorized_keys"))
		conf := filepath.Join(dir, "sshd_config")
		if err := os.WriteFile(conf, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
		// The namespace's first process (PID 1) is this shell, then
		// chroot, then sshd. Its mounts are private: none propagates
		// to this machine's.
		script := `set -e
mount --make-rprivate /
mount -t proc proc "$R/proc"
mount --rbind /dev "$R/dev"
mount -t tmpfs -o mode=755 run "$R/run"
mkdir -m 755 "$R/run/sshd"
mount --bind "$T" "$R$T"
exec chroot "$R" /usr/sbin/sshd -D -e -f "$C"`
		cmd := exec.Command("/bin/sh", "-c", script)
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "R=" + root, "T=" + tmp, "C=" + conf}
		log.Reset()
		cmd.Stdout, cmd.Stderr = &log, &log
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID,
			Pdeathsig:  syscall.SIGKILL,
		}
		cmd.WaitDelay = time.Second
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		ready := waitSSH(n.hostPort(), exited, 10*time.Second)
		if ready == nil {
			t.Cleanup(func() {
				// PID 1 of the namespace: its end ends every process
				// there (the node's agent and workers, sessions left).
				cmd.Process.Kill()
				<-exited
				if t.Failed() {
					t.Logf("sshd in %s:\n%s", root, log.String())
				}
				checkNoneIn(t, root)
			})
			return n
		}
		cmd.Process.Kill()
		<-exited
		if attempt == 4 {
			t.Fatalf("sshd in the chroot %s on %s: %v\n%s", root, n.hostPort(), ready, log.String())
		}
	}
}

func (n *chrootNode) hostPort() string { return net.JoinHostPort(n.addr, strconv.Itoa(n.port)) }

// waitSSH waits until an SSH server answers at hostPort with its banner,
// or its process exits, or timeout passes.
func waitSSH(hostPort string, exited <-chan error, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if c, err := net.DialTimeout("tcp", hostPort, time.Second); err == nil {
			c.SetDeadline(time.Now().Add(2 * time.Second))
			line, err := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if err == nil && strings.HasPrefix(line, "SSH-2.0-") {
				return nil
			}
		}
		select {
		case err := <-exited:
			return fmt.Errorf("sshd exited: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no SSH banner on %s within %v", hostPort, timeout)
		}
	}
}

// checkNoneIn fails the test if a process still runs in root, or a mount
// of this machine's lies under it.
func checkNoneIn(t *testing.T, root string) {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if r, err := os.Readlink(filepath.Join("/proc", e.Name(), "root")); err == nil && r == root {
			cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			t.Errorf("process %s still runs in %s: %q", e.Name(), root, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
		}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(l); len(f) > 4 && (f[4] == root || strings.HasPrefix(f[4], root+"/")) {
			t.Errorf("a mount left under %s: %s", root, l)
		}
	}
}

// TestBullseyeNode: a 2-node job whose second node is Debian 11 (glibc
// 2.31; the root of scripts/bullseye-root.sh, served by its own sshd in
// a chroot) and whose first is this machine (Debian 12 here) runs to the
// end with the executable built as the README builds it.
func TestBullseyeNode(t *testing.T) {
	root := bullseyeRoot(t)
	if testing.Short() {
		t.Skip("-short: a 2-node job")
	}
	exe := buildGPTUI(t)
	dir := t.TempDir()
	head := sshtest.Start(t, "127.0.0.2")
	old := startChrootNode(t, root, "127.0.0.4")
	hosts := filepath.Join(dir, "hosts.txt")
	inv := fmt.Sprintf("%s@%s devices=cpu:1 workdir=%s identity=%s\n", head.User, head.HostPort(), filepath.Join(dir, "node0"), head.UserKeyFile) +
		fmt.Sprintf("root@%s devices=cpu:1 workdir=%s identity=%s\n", old.hostPort(), filepath.Join(dir, "node1"), old.key)
	known := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(hosts, []byte(inv), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(known, []byte(head.KnownHostsLine()+"\n"+knownhosts.Line([]string{old.hostPort()}, old.hostKey)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// The node is Debian 11 with glibc 2.31, as a session there sees it.
	ctx := context.Background()
	c, err := sshexec.Dial(ctx, old.addr, old.port, sshexec.ClientConfig{User: "root", IdentityFiles: []string{old.key}, KnownHostsFile: known, NoAgent: true})
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code, err := c.Run(ctx, "cat /etc/debian_version && /lib/x86_64-linux-gnu/libc.so.6 | head -n 1", &out, &errOut)
	c.Close()
	if err != nil || code != 0 || !strings.HasPrefix(out.String(), "11.") || !strings.Contains(out.String(), "version 2.31") {
		t.Fatalf("the node's system: %q (exit %d, %v): %s; want Debian 11, glibc 2.31", out.String(), code, err, errOut.String())
	}
	t.Logf("the node: Debian %s", strings.Join(strings.Fields(out.String()), " "))

	tc := &testCluster{hosts: hosts, knownHosts: known}
	o := tc.jobOptions(t, exe, []string{"Engine.max_steps=3", "Distributed.dp_degree=2", "Global.global_batch_size=4", "Global.local_batch_size=2", "Global.micro_batch_size=2"})
	o.Env = append(o.Env, "GPTUI_BLAS=go") // the root has no OpenBLAS: the same GEMM on both nodes
	j := New(o)
	events := collect(j)
	start := time.Now()
	p, err := j.Plan(ctx)
	if err != nil {
		j.Close()
		t.Fatalf("Plan: %v", err)
	}
	for _, n := range p.Nodes {
		t.Logf("node %s: %s, %s", n.Name, n.Platform, describeProbe(&n.Probe))
	}
	if err := j.Start(ctx); err != nil {
		t.Fatal(err)
	}
	err = j.Wait()
	es := <-events
	metrics := map[int]int{}
	var lines, rank0 []string
	for _, e := range es {
		switch e.Kind {
		case event.KindMetrics:
			metrics[e.Rank]++
		case event.KindLog:
			lines = append(lines, fmt.Sprintf("[%d] %s", e.Rank, e.Line))
			if e.Rank == 0 {
				rank0 = append(rank0, e.Line)
			}
		case event.KindNode:
			if e.State == event.NodeFailed {
				lines = append(lines, e.Node+": "+e.Message)
			}
		}
	}
	if err != nil {
		t.Fatalf("job: %v\n%s", err, strings.Join(lines, "\n"))
	}
	if last := es[len(es)-1]; last.Kind != event.KindJob || last.State != event.JobDone {
		t.Errorf("last event %+v, want job done", last)
	}
	for r := range 2 {
		if metrics[r] != 3 {
			t.Errorf("rank %d: %d metrics events, want 3", r, metrics[r])
		}
	}
	t.Logf("2-node job, rank 1 on Debian 11: %v; final loss %s", time.Since(start).Round(time.Millisecond), finalLoss(rank0))
}
