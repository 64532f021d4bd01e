package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gptui/gptui/internal/sshtest"
)

// TestClusterGuide follows docs/cluster.md, the first-cluster-job page, as
// a newcomer on the head machine would: its blocks marked
// <!-- cluster guide --> run in order, each as one bash script (set -e),
// in a scratch directory (the head's), against two nodes — sshd servers
// on 127.0.0.2 and 127.0.0.3, each with a workdir of its own — and each
// must exit 0; a block marked <!-- cluster guide, file: NAME --> is
// written to NAME there, and one marked <!-- cluster guide, output --> is
// part of what the block before it printed, compared by shape as
// TestDocExamples compares an output (matchShape), each run of spaces as
// one (a table's columns are as wide as its names), with the test's node
// addresses, workdirs and user written back as the page's.
//
// What the test puts in place of what a reader has, and why:
//
//   - HOME is a scratch home with an empty ~/.ssh, so the page's
//     ssh-keygen makes the key and --accept-new-host-keys records the
//     host keys (known_hosts starts empty); SSH_AUTH_SOCK is unset.
//   - The build line, 'CGO_ENABLED=0 go build -o gptui ./cmd/gptui',
//     links the test's binary to ./gptui instead (as TestDocExamples
//     does): the scratch directory is no clone, a build on 2 shared cores
//     costs half a minute, and TestBinaryGLIBC checks what that line
//     builds.
//   - 'ssh-copy-id alice@nodeN' appends ~/.ssh/id_ed25519.pub to the
//     node's authorized_keys: ssh-copy-id asks for the password, and the
//     test's sshd takes keys alone.
//   - The user alice is the user running the test; in the inventory,
//     nodeN is the address and port of the N-th sshd (127.0.0.2:PORT),
//     and each node's line gets a workdir= of its own: the two nodes are
//     this machine, whose home directory (and so ~/.gptui) they share.
//   - Every './gptui run' gets the overrides of guideJob just after
//     'run': 4 steps of tiny on the page's dp4 (under a second a step
//     here), not 200; the page's own -o come later and win, so the
//     detached job of step 8 keeps its max_steps=400, and the page's
//     'gptui stop' right after it stops it (as it starts, here).
//     tiny rather than the tests' small config: the page tokenizes its
//     text with GPT-2's tokenizer, whose ids small's 256 do not hold.
//   - texts/, the text the page tokenizes, is the documentation's pages
//     (as TestDocExamples's corpus/).
//
// The blocks the test cannot run (a GPU node, an aarch64 node, a login
// host, a firewall) are marked <!-- not run: WHY -->; TestRunHostsJump
// runs a job through a login host. After the page, the test checks
// what the page says is left where: the staged data, the workers' logs and
// the checkpoint in the nodes' workdirs, the jobs' folders on the head.
func TestClusterGuide(t *testing.T) {
	long(t)
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	start := time.Now()
	root, _ := docPages(t)
	const page = "docs/cluster.md"
	blocks, err := readDocBlocks(root, page)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	head := filepath.Join(dir, "head")
	home := filepath.Join(dir, "home")
	for _, d := range []string{head, filepath.Join(home, ".ssh")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	n := sshtest.StartNodes(t, dir, "cpu:2", "127.0.0.2", "127.0.0.3")
	c := &sshCluster{servers: n.Servers, workdirs: n.Workdirs, home: home}
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	giveTextDir(t, root, filepath.Join(head, "texts"))
	g := &guide{user: u.Username, nodes: c, bin: builtGPTUI(t)}
	env := append(os.Environ(), "HOME="+home, "SSH_AUTH_SOCK=", "GPTUI_THREADS=1", "GPTUI_BLAS=go",
		"XDG_CACHE_HOME="+filepath.Join(dir, "cache"), "NO_COLOR=1")
	t.Logf("two sshd nodes up in %v", time.Since(start).Round(time.Millisecond))

	var last []string // what the last block run printed
	ran := 0
	for _, b := range blocks {
		mk, err := parseDocMark(b)
		if err != nil {
			t.Fatal(err)
		}
		switch mk.kind {
		case "guide":
			script := g.script(b.lines)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			cmd := exec.CommandContext(ctx, "bash", "-c", "set -eo pipefail\n"+script)
			cmd.Dir, cmd.Env = head, env
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			began := time.Now()
			err := cmd.Run()
			cancel()
			last = docLines(g.unsubstitute(out.String()))
			if err != nil {
				t.Fatalf("%s: %v\nthe block as run:\n%s\nprinted:\n%s", b.where(), err, script, out.String())
			}
			ran++
			t.Logf("%s: %d lines in %v; printed:\n%s", b.where(), len(b.lines), time.Since(began).Round(time.Millisecond), out.String())
		case "guide file":
			writeFile(t, filepath.Join(head, mk.path), []byte(g.file(b.lines)))
		case "guide output":
			if err := matchShape(guideSpaces(b.lines), guideSpaces(last)); err != nil {
				t.Errorf("%s: the output of the block before: %v", b.where(), err)
			}
		}
	}
	if ran == 0 {
		t.Fatalf("%s: no block marked <!-- cluster guide -->", page)
	}

	// What the page says is where.
	for i, wd := range c.workdirs {
		for _, f := range []string{"gptui", "data/texts", fmt.Sprintf("log/workerlog.%d", 2*i), fmt.Sprintf("log/metrics.%d.jsonl", 2*i)} {
			if _, err := os.Stat(filepath.Join(wd, f)); err != nil {
				t.Errorf("node%d: %v", i+1, err)
			}
		}
	}
	// The run's checkpoint, gathered whole on rank 0's node: a file per rank.
	if files, _ := filepath.Glob(filepath.Join(c.workdirs[0], "output", "step_00000004", "rank_*")); len(files) != 4 {
		t.Errorf("node1: %d rank files in output/step_00000004, want 4: %q", len(files), files)
	}
	if jobs, _ := filepath.Glob(filepath.Join(head, "jobs", "*", "events.jsonl")); len(jobs) == 0 {
		t.Errorf("no jobs/<id>/events.jsonl on the head")
	}
	c.awaitGone(t, time.Now(), 10*time.Second)
	t.Logf("the page followed in %v", time.Since(start).Round(time.Millisecond))
}

// guideJob is what every './gptui run' of the page gets added: 4 steps,
// each logged, no evaluation.
var guideJob = "-o Engine.max_steps=4 -o Engine.eval_freq=0 -o Engine.logging_freq=1"

// A guide rewrites the page's blocks for the test's nodes (see
// TestClusterGuide).
type guide struct {
	user  string
	nodes *sshCluster
	bin   string
}

var guideNodeRE = regexp.MustCompile(`\bnode(\d+)\b`)

// node returns the index of the test's node that the page's nodeN names.
func (g *guide) node(name string) (int, bool) {
	m := guideNodeRE.FindStringSubmatch(name)
	if m == nil {
		return 0, false
	}
	var i int
	fmt.Sscan(m[1], &i)
	if i < 1 || i > len(g.nodes.servers) {
		return 0, false
	}
	return i - 1, true
}

// script returns a command block as the test runs it.
func (g *guide) script(lines []string) string {
	var b strings.Builder
	for _, l := range lines {
		switch {
		case strings.TrimSpace(l) == strings.Join(docBuild, " "):
			l = "ln -s " + g.bin + " gptui"
		case strings.HasPrefix(l, "ssh-copy-id "):
			i, ok := g.node(l)
			if !ok {
				panic("cluster guide: " + l + " names no node of the test")
			}
			l = "cat ~/.ssh/id_ed25519.pub >> " + filepath.Join(g.nodes.servers[i].Dir, "authorized_keys")
		}
		l = strings.ReplaceAll(l, "./gptui run ", "./gptui run "+guideJob+" ")
		b.WriteString(strings.ReplaceAll(l, "alice", g.user) + "\n")
	}
	return b.String()
}

// file returns a file block as the test writes it: in the inventory's
// lines, nodeN is the N-th sshd's address and port, with its workdir.
func (g *guide) file(lines []string) string {
	var b strings.Builder
	for _, l := range lines {
		l = strings.ReplaceAll(l, "alice", g.user)
		if i, ok := g.node(l); ok && !strings.HasPrefix(strings.TrimSpace(l), "#") {
			s := g.nodes.servers[i]
			l = guideNodeRE.ReplaceAllString(l, s.HostPort()) + " workdir=" + g.nodes.workdirs[i]
		}
		b.WriteString(l + "\n")
	}
	return b.String()
}

var guideSpaceRE = regexp.MustCompile(` {2,}`)

// guideSpaces returns lines with each run of spaces made one: a table's
// columns are as wide as the names in them, and the page's node names are
// not the test's.
func guideSpaces(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = guideSpaceRE.ReplaceAllString(l, " ")
	}
	return out
}

// unsubstitute names the test's nodes in what a block printed as the page
// does.
func (g *guide) unsubstitute(s string) string {
	for i, srv := range g.nodes.servers {
		s = strings.ReplaceAll(s, g.nodes.workdirs[i], "~/.gptui")
		s = strings.ReplaceAll(s, srv.HostPort(), fmt.Sprintf("node%d", i+1))
		s = strings.ReplaceAll(s, srv.Addr, fmt.Sprintf("node%d", i+1))
	}
	return strings.ReplaceAll(s, g.user, "alice")
}
