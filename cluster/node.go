package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/gptui/gptui/jobdir"
	"github.com/gptui/gptui/sshexec"
)

// node is one machine of the job: over SSH, or this one.
type node struct {
	inv    sshexec.Node
	name   string
	client *sshexec.Client // nil for a local node
	// dir is the workdir: for an SSH node as the shell and SFTP take it
	// (~/ kept, which both resolve against the login directory); for a
	// local node an absolute path.
	dir string
	// exe is the gptui program on the node: for an SSH node relative to
	// dir, for a local node the launcher's own.
	exe string
	// lock holds the workdir's lock for the job; nil before it is taken.
	lock *nodeLock
}

// local reports whether the node runs without SSH.
func (n *node) local() bool { return n.client == nil }

// addr describes how the node is reached.
func (n *node) addr() string {
	if n.local() {
		return "local"
	}
	a := n.client.Addr()
	if n.inv.User != "" {
		a = n.inv.User + "@" + a
	}
	return a
}

func (n *node) close() {
	n.releaseLock()
	if n.client != nil {
		n.client.Close()
	}
}

// shellDir is dir for a shell command line: ~/ stays unquoted so that the
// shell expands it.
func (n *node) shellDir() string {
	if rest, ok := strings.CutPrefix(n.dir, "~/"); ok {
		return "~/" + shellQuote(rest)
	}
	if n.dir == "~" {
		return "~"
	}
	return shellQuote(n.dir)
}

// command returns the shell command line that runs gptui with args in the
// node's workdir.
func (n *node) command(exec bool, args ...string) string {
	var b strings.Builder
	b.WriteString("cd " + n.shellDir() + " && ")
	if exec {
		b.WriteString("exec ")
	}
	b.WriteString("./gptui")
	for _, a := range args {
		b.WriteString(" " + shellQuote(a))
	}
	return b.String()
}

// gptui runs gptui with args in the node's workdir and returns its
// standard output; a non-zero exit is an error with its standard error.
func (n *node) gptui(ctx context.Context, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	if n.local() {
		cmd := exec.CommandContext(ctx, n.exe, args...)
		cmd.Dir = n.dir
		if _, err := os.Stat(n.dir); err != nil {
			// A dry run creates no workdir: its probe runs here.
			cmd.Dir = ""
		}
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("%s %s: %w: %s", n.exe, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return stdout.Bytes(), nil
	}
	cmd := n.command(false, args...)
	code, err := n.client.Run(ctx, cmd, &stdout, &stderr)
	if err == nil && code != 0 {
		err = fmt.Errorf("exit status %d", code)
	}
	if err != nil {
		return nil, fmt.Errorf("%s on %s: %w: %s", cmd, n.name, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// The exit statuses of prepare's script, besides 0.
const (
	prepareNoDir  = 81 // no workdir to cd into
	prepareConfig = 82 // the config not written
	prepareProbe  = 83 // gptui agent --probe failed
)

// missingMarker is the line between the probe's output and the missing
// paths in prepare's standard output.
const missingMarker = "gptui-missing-paths:"

// prepare is an SSH node's part of the job's set-up once its lock is
// held, in one session, since each costs the node a shell or more and a
// round trip or more behind a login host: the config written to rel
// under the workdir (unless config is nil: a dry run writes nothing),
// through a temporary file renamed into place once all its bytes are
// there, gptui's probe, and those of paths (relative ones to the workdir)
// that do not exist there. It returns the probe's output and the missing
// paths; an error names the step that failed.
func (n *node) prepare(ctx context.Context, rel string, config []byte, paths []string) (probe []byte, missing []string, err error) {
	var b strings.Builder
	fmt.Fprintf(&b, "cd %s || exit %d\n", n.shellDir(), prepareNoDir)
	if config != nil {
		tmp := shellQuote(rel + ".tmp-" + strings.ToLower(rand.Text()[:12]))
		fmt.Fprintf(&b, "umask 022\n"+
			"mkdir -p -- %s && cat > %s && [ \"$(wc -c < %s)\" -eq %d ] && mv -f -- %s %s || { rm -f -- %s; exit %d; }\n",
			shellQuote(path.Dir(rel)), tmp, tmp, len(config), tmp, shellQuote(rel), tmp, prepareConfig)
	}
	fmt.Fprintf(&b, "./gptui agent --probe || { echo $?; exit %d; }\n", prepareProbe)
	fmt.Fprintf(&b, "printf '%%s\\n' %s\n", missingMarker)
	if len(paths) > 0 {
		var quoted []string
		for _, p := range paths {
			quoted = append(quoted, shellQuote(p))
		}
		b.WriteString("for p in " + strings.Join(quoted, " ") + `; do [ -e "$p" ] || printf '%s\n' "$p"; done` + "\n")
	}
	var stdin io.Reader
	if config != nil {
		stdin = bytes.NewReader(config)
	}
	var stdout, stderr limitedBuffer
	stdout.max, stderr.max = 1<<20, 4096
	code, err := n.client.RunInput(ctx, b.String(), stdin, &stdout, &stderr)
	msg := strings.TrimSpace(stderr.String())
	switch {
	case stdout.over: // the copy stopped there, failing Run
		return nil, nil, fmt.Errorf("node %s: setting up: more than %d bytes of output", n.name, stdout.max)
	case err != nil:
		return nil, nil, fmt.Errorf("node %s: setting up: %w: %s", n.name, err, msg)
	case code == prepareNoDir:
		return nil, nil, fmt.Errorf("node %s: no workdir %s: %s", n.name, n.dir, msg)
	case code == prepareConfig:
		return nil, nil, fmt.Errorf("node %s: config: writing %s under %s failed: %s", n.name, rel, n.dir, msg)
	case code == prepareProbe: // the last line of stdout is the probe's exit status
		status := strings.TrimSpace(stdout.String())
		status = status[strings.LastIndexByte(status, '\n')+1:]
		return nil, nil, fmt.Errorf("node %s: probe: ./gptui agent --probe: exit status %s: %s", n.name, status, msg)
	case code != 0:
		return nil, nil, fmt.Errorf("node %s: setting up: exit status %d: %s", n.name, code, msg)
	}
	probe, rest, ok := bytes.Cut(stdout.Bytes(), []byte(missingMarker+"\n"))
	if !ok {
		return nil, nil, fmt.Errorf("node %s: setting up: no %q line in the output %q", n.name, missingMarker, stdout.String())
	}
	for _, l := range strings.Split(string(rest), "\n") {
		if l != "" {
			missing = append(missing, l)
		}
	}
	return probe, missing, nil
}

// put writes content to this machine's node n's workdir under rel
// (slash-separated).
func (n *node) put(rel string, content []byte) error {
	p := filepath.Join(n.dir, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, content, 0o644)
}

// agentProc is a running agent: its standard streams, and ways to wait
// for it and to kill it.
type agentProc struct {
	stdin          io.WriteCloser
	stdout, stderr io.Reader
	wait           func() error // after stdout and stderr reached EOF
	kill           func()       // kills the agent and so its workers
}

// startLocal starts `gptui ARGS` on the local node n, in its workdir
// with attr, its standard streams piped; the caller sets the agentProc's
// kill.
func (n *node) startLocal(attr *syscall.SysProcAttr, args ...string) (*agentProc, *os.Process, error) {
	cmd := exec.Command(n.exe, args...)
	cmd.Dir = n.dir
	cmd.SysProcAttr = attr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	return &agentProc{stdin: stdin, stdout: stdout, stderr: stderr, wait: cmd.Wait}, cmd.Process, nil
}

// startAgent starts `gptui agent` on the node; ctx bounds only the
// start.
func (n *node) startAgent(ctx context.Context) (*agentProc, error) {
	if n.local() {
		p, proc, err := n.startLocal(agentSysProcAttr(), "agent")
		if err != nil {
			return nil, fmt.Errorf("start the agent: %w", err)
		}
		p.kill = func() { _ = syscall.Kill(-proc.Pid, syscall.SIGKILL) }
		return p, nil
	}
	// The session outlives ctx: it ends when the agent exits or is killed.
	s, err := n.client.Start(context.WithoutCancel(ctx), n.command(true, "agent"))
	if err != nil {
		return nil, err
	}
	return &agentProc{
		stdin: s.Stdin, stdout: s.Stdout, stderr: s.Stderr,
		wait: func() error {
			code, err := s.Wait()
			if err == nil && code != 0 {
				err = fmt.Errorf("exit status %d", code)
			}
			return err
		},
		kill: func() { _ = s.Close() },
	}, nil
}

// jobIDPattern matches the job ids New and a Supervisor make, such as
// 20250102-150405-1a2b3c and its restarts 20250102-150405-1a2b3c-r1:
// only such directories are ever pruned.
var jobIDPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^` + jobdir.IDPattern + `(-r[0-9]+)?$`) })

// oldJobs returns the names of names that look like job ids, but for the
// newest keep of them (the ids sort by time), in order.
func oldJobs(names []string, keep int) []string {
	var ids []string
	for _, name := range names {
		if jobIDPattern().MatchString(name) {
			ids = append(ids, name)
		}
	}
	slices.Sort(ids)
	if len(ids) <= keep {
		return nil
	}
	return ids[:len(ids)-keep]
}

// pruneJobs removes the node's jobs/<id> directories but the newest keep
// and returns the ids removed.
func (n *node) pruneJobs(ctx context.Context, keep int) ([]string, error) {
	if n.local() {
		entries, err := os.ReadDir(filepath.Join(n.dir, "jobs"))
		if err != nil {
			return nil, err
		}
		var names []string
		for _, e := range entries {
			if e.IsDir() {
				names = append(names, e.Name())
			}
		}
		// A detached job's folder (package jobdir) is kept while its
		// supervisor runs.
		old := slices.DeleteFunc(oldJobs(names, keep), func(id string) bool {
			j, err := jobdir.Read(filepath.Join(n.dir, "jobs", id))
			return err == nil && j.Alive
		})
		for _, id := range old {
			if err := os.RemoveAll(filepath.Join(n.dir, "jobs", id)); err != nil {
				return nil, err
			}
		}
		return old, nil
	}
	run := func(cmd string) (string, error) {
		var stdout, stderr bytes.Buffer
		code, err := n.client.Run(ctx, "cd "+n.shellDir()+"/jobs && "+cmd, &stdout, &stderr)
		if err == nil && code != 0 {
			err = fmt.Errorf("exit status %d: %s", code, strings.TrimSpace(stderr.String()))
		}
		return stdout.String(), err
	}
	// The directories of jobs/, one per line (job ids hold no newlines).
	out, err := run(`for d in */; do [ -d "$d" ] && printf '%s\n' "${d%/}"; done; true`)
	if err != nil {
		return nil, fmt.Errorf("listing jobs/ on %s: %w", n.name, err)
	}
	old := oldJobs(strings.Split(out, "\n"), keep)
	if len(old) == 0 {
		return nil, nil
	}
	cmd := "rm -rf --"
	for _, id := range old {
		cmd += " " + shellQuote(id)
	}
	if _, err := run(cmd); err != nil {
		return nil, fmt.Errorf("removing old jobs on %s: %w", n.name, err)
	}
	return old, nil
}
