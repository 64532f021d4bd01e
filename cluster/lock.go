package cluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gptui/gptui/agent"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/sshexec"
)

// One job per workdir (see package agent's lock): a job takes the lock of
// each node's workdir during Plan, before it writes anything there but the
// gptui executable (an SSH node's lock is first checked, read-only, before
// the push), and holds it until the job ends; a Supervisor's attempts hand
// it on to each other (agent.LingerLine). A workdir that another job holds
// refuses the job with an *InputError naming that job.

// lockOrder makes a job take its nodes' workdir locks one after another,
// in one order that every job agrees on — by the workdir's identity: the
// host, port and workdir of an SSH node, the path of a workdir on this
// machine — while the rest of each node's setup runs in parallel. Two jobs
// that want some of the same workdirs then meet first at the lowest of
// those: one takes it and goes on, and the other is refused there, holding
// none of the workdirs both want. (Taken at once, each could take one and
// be refused at the other's: two jobs started at the same instant refused
// each other in 6 of 9 trials.)
type lockOrder struct {
	node []int           // node[k]: the inventory index of the k-th in the order
	turn []int           // turn[i]: node i's place in the order
	done []chan struct{} // done[k] is closed when the k-th node's setup has locked, or ended
	once []sync.Once
}

// newLockOrder orders the inventory's nodes by workdir identity (ties, a
// workdir two nodes of the job share, in the inventory's order).
func newLockOrder(nodes []sshexec.Node) *lockOrder {
	keys := make([]string, len(nodes))
	for i, n := range nodes {
		if n.Local {
			dir, err := expandHome(n.Workdir)
			if err != nil {
				dir = n.Workdir
			}
			keys[i] = "\x00" + filepath.Clean(dir)
		} else {
			keys[i] = n.Host + "\x00" + strconv.Itoa(n.Port) + "\x00" + path.Clean(n.Workdir)
		}
	}
	lo := &lockOrder{node: make([]int, len(nodes)), turn: make([]int, len(nodes)),
		done: make([]chan struct{}, len(nodes)), once: make([]sync.Once, len(nodes))}
	for i := range lo.node {
		lo.node[i] = i
		lo.done[i] = make(chan struct{})
	}
	slices.SortStableFunc(lo.node, func(a, b int) int { return strings.Compare(keys[a], keys[b]) })
	for k, i := range lo.node {
		lo.turn[i] = k
	}
	return lo
}

// wait returns once every node before node i in the order has taken its
// lock or ended its setup, or when ctx ends.
func (lo *lockOrder) wait(ctx context.Context, i int) error {
	k := lo.turn[i]
	if k == 0 {
		return nil
	}
	select {
	case <-lo.done[lo.node[k-1]]:
		return ctx.Err()
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// finish marks node i's turn as over (its lock taken, or its setup ended);
// then the next node in the order takes its turn once it is ready. Each
// node's turn waits for the one before, so that is all of them before.
func (lo *lockOrder) finish(i int) { lo.once[i].Do(func() { close(lo.done[i]) }) }

// takeLockInTurn takes node n's workdir lock (takeLock) in its turn of
// the job's lockOrder; i is the node's index in the inventory.
func (j *Job) takeLockInTurn(ctx context.Context, n *node, i int) error {
	if j.locks == nil {
		return j.takeLock(ctx, n)
	}
	if err := j.locks.wait(ctx, i); err != nil {
		return fmt.Errorf("node %s: workdir lock: %w", n.name, err)
	}
	defer j.locks.finish(i)
	return j.takeLock(ctx, n)
}

// lockTimeout bounds taking a node's workdir lock.
const lockTimeout = 15 * time.Second

// lockRelease bounds the wait for a holder to release the lock at the end
// of a job.
const lockRelease = 3 * time.Second

// nodeLock is a node's holder of its workdir lock: `gptui agent --lock`.
type nodeLock struct {
	proc   *agentProc
	done   chan struct{} // closed when the holder has exited
	linger bool          // a restart follows: keep the lock for it
	gen    uint64        // the workdir's generation: the workers' fence token
}

// commandLine is this process's command line, as a shell would take it:
// the command a lock names by default.
func commandLine() string {
	words := make([]string, len(os.Args))
	for i, a := range os.Args {
		words[i] = shellQuote(a)
	}
	if len(words) > 0 {
		words[0] = path.Base(os.Args[0])
	}
	return strings.Join(words, " ")
}

// lockHolder describes the job for node n's lock.
func (j *Job) lockHolder(n *node) agent.Holder {
	o := j.opts
	launcher, _ := os.Hostname()
	return agent.Holder{Job: o.JobID, Owner: o.lockOwner, Node: n.name, Started: o.lockStarted, Command: o.Command, Launcher: launcher}
}

// lockOwner is the owner a job's workdir locks name: the job it
// continues, or else itself.
func lockOwner(o Options) string {
	if o.Continues != "" {
		return o.Continues
	}
	return o.JobID
}

// lockDir names node n's workdir in messages: as the inventory writes it,
// or for this machine as a path.
func lockDir(n *node) string {
	if n.local() {
		return n.dir
	}
	return n.inv.Workdir
}

// heldError is the *InputError of node n's workdir held by h.
func (j *Job) heldError(n *node, h *agent.Holder) error {
	err := &agent.HeldError{Dir: lockDir(n), Holder: *h}
	if j.opts.Hosts == sshexec.LocalHosts {
		return &InputError{err}
	}
	return inputErrorf("node %s: %w", n.name, err)
}

// checksLock reports whether the job checks, before it writes anything
// on a node, that no other job holds the node's workdir. A restart does
// not: the job's earlier attempt kept the lock for it, and the push
// before takeLock finds the executable there. (A job that continues
// another is checked: the nodes it pushes to may have been taken by a
// third since.)
func (j *Job) checksLock() bool {
	return j.opts.JobID == j.opts.lockOwner || j.opts.Continues != "" || j.opts.DryRun
}

// checkLock refuses, with an *InputError, the local node n when another
// job's live holder has locked its workdir. It changes nothing. (An SSH
// node's lock is checked in the first command run there: hello.)
func (j *Job) checkLock(ctx context.Context, n *node) error {
	if !j.checksLock() {
		return nil
	}
	h, err := agent.ReadLock(n.dir)
	return j.lockVerdict(n, h, err)
}

// lockVerdict is checkLock's answer for node n from its workdir's live
// holder h (nil for none) or the error reading it.
func (j *Job) lockVerdict(n *node, h *agent.Holder, err error) error {
	switch {
	case err != nil:
		return inputErrorf("node %s: %w", n.name, err)
	case h == nil || h.Owner == j.opts.lockOwner:
		return nil
	}
	return j.heldError(n, h)
}

// nodeHello is what the first command run on an SSH node says.
type nodeHello struct {
	uname    string        // `uname -sm`: "Linux x86_64"
	platform string        // uname as GOOS/GOARCH: "linux/amd64"
	binSum   string        // the hex SHA-256 of the executable gptui in its workdir; "" for none or not known
	holder   *agent.Holder // the live holder of its workdir's lock; nil for none or unchecked
}

// unameCmd is the first line of hello's command.
const unameCmd = "uname -sm\n"

// hello runs the first command on the SSH node n, before anything is
// pushed: it asks the node its platform (`uname -sm`), the SHA-256 of the
// gptui its workdir holds (where it is executable and the node has
// sha256sum; the push then needs no session of its own to find it
// unchanged) and, with lock, reads its workdir's lock: the lock file and
// what the node says of the process that the file names (a live holder is
// returned). All come in one round trip. The command, which changes
// nothing, is let finish when ctx ends (another node's setup failed): that
// is quicker than killing it through another session.
func (n *node) hello(ctx context.Context, lock bool) (nodeHello, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lockTimeout)
	defer cancel()
	cmd := unameCmd +
		"s=$(cd " + n.shellDir() + " 2>/dev/null && [ -f gptui ] && [ -x gptui ] && sha256sum -- gptui 2>/dev/null)\n" +
		`s=${s#\\}; printf '%s\n' "${s%% *}"` + "\n"
	if lock {
		// Shell builtins only: a process started on a loaded node costs
		// tens of milliseconds. The file is one line; the pid is its
		// digits.
		cmd += "cd " + n.shellDir() + " 2>/dev/null && [ -f " + agent.LockFile + " ] || exit 0\n" +
			"b= h= f= s= l=\n" +
			"read -r b 2>/dev/null </proc/sys/kernel/random/boot_id\n" +
			"read -r h 2>/dev/null </proc/sys/kernel/hostname || h=$(uname -n)\n" +
			"IFS= read -r l <" + agent.LockFile + "\n" +
			`p=${l#*\"pid\":}; p=${p%%[!0-9]*}` + "\n" +
			`if [ -r /proc/self/stat ]; then f=proc; [ -n "$p" ] && read -r s 2>/dev/null </proc/$p/stat; fi` + "\n" +
			`printf '%s\n%s\n%s\n%s\n%s\n' "$b" "$h" "$f" "$s" "$l"`
	}
	out, err := n.shell(ctx, cmd)
	if err != nil {
		return nodeHello{}, err
	}
	uname, rest, _ := strings.Cut(string(out), "\n")
	var hi nodeHello
	hi.uname = strings.TrimSpace(uname)
	if hi.platform, err = unamePlatform(hi.uname); err != nil {
		return nodeHello{}, fmt.Errorf("%s: %w", n.name, err)
	}
	sum, rest, _ := strings.Cut(rest, "\n")
	if b, err := hex.DecodeString(sum); err == nil && len(b) == sha256.Size {
		hi.binSum = hex.EncodeToString(b) // as spreadOf writes it
	}
	if rest == "" {
		return hi, nil
	}
	f := strings.SplitN(rest, "\n", 5)
	if len(f) < 5 {
		return nodeHello{}, fmt.Errorf("%s: reading the workdir lock: unexpected answer %q", n.name, rest)
	}
	h, err := agent.ParseHolder(path.Join(n.dir, agent.LockFile), []byte(f[4]))
	if err != nil {
		return nodeHello{}, err
	}
	m := agent.Machine{BootID: f[0], Host: f[1], Proc: f[2] == "proc", Stat: f[3]}
	if h.Stale(m) == "" {
		hi.holder = h
	}
	return hi, nil
}

// shell runs the shell command cmd on the SSH node n and returns its
// standard output; a non-zero exit is an error with its standard error.
func (n *node) shell(ctx context.Context, cmd string) ([]byte, error) {
	var stdout, stderr limitedBuffer
	stdout.max, stderr.max = 1<<20, 4096
	code, err := n.client.Run(ctx, cmd, &stdout, &stderr)
	if stdout.over { // the copy stopped there, failing Run
		return nil, fmt.Errorf("%s: more than %d bytes of output from %q", n.name, stdout.max, cmd)
	}
	if err == nil && code != 0 {
		err = fmt.Errorf("exit status %d: %s", code, strings.TrimSpace(stderr.String()))
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", n.name, err)
	}
	return stdout.Bytes(), nil
}

// limitedBuffer keeps the first max bytes written to it and refuses the
// rest with a short write, which ends the copy into it, noting that it
// did (over): what a node sends cannot grow the launcher.
type limitedBuffer struct {
	bytes.Buffer
	max  int
	over bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); len(p) > room {
		b.over = true
		p = p[:max(room, 0)]
	}
	b.Buffer.Write(p)
	return len(p), nil
}

// takeLock takes node n's workdir lock for the job: it starts the node's
// holder, `gptui agent --lock` in the workdir, and waits for its answer.
// A lock another job holds is an *InputError naming it.
func (j *Job) takeLock(ctx context.Context, n *node) error {
	ctx, cancel := context.WithTimeout(ctx, lockTimeout)
	defer cancel()
	ap, err := n.startLockHolder(ctx)
	if err != nil {
		return fmt.Errorf("node %s: workdir lock: %w", n.name, err)
	}
	l := &nodeLock{proc: ap, done: make(chan struct{})}
	var tail bytes.Buffer // the holder's standard error, for errors
	stderrDone := make(chan struct{})
	go func() {
		io.Copy(&tail, io.LimitReader(ap.stderr, 4096))
		io.Copy(io.Discard, ap.stderr)
		close(stderrDone)
	}()
	replies := make(chan []byte, 1)
	go func() {
		br := bufio.NewReader(ap.stdout)
		line, _ := br.ReadBytes('\n')
		replies <- line
		io.Copy(io.Discard, br)
		<-stderrDone
		ap.wait()
		close(l.done)
	}()
	b, err := json.Marshal(j.lockHolder(n))
	if err == nil {
		_, err = ap.stdin.Write(append(b, '\n'))
	}
	var line []byte
	if err == nil {
		select {
		case line = <-replies:
		case <-ctx.Done():
			err = context.Cause(ctx)
		}
	}
	var reply agent.LockReply
	if err == nil && len(line) == 0 && ctx.Err() != nil {
		// The stop ended the session as it answered: both were ready.
		err = context.Cause(ctx)
	}
	if err == nil {
		if jerr := json.Unmarshal(line, &reply); jerr != nil {
			ap.kill()
			select {
			case <-l.done:
			case <-time.After(lockRelease):
			}
			err = fmt.Errorf("no answer from gptui agent --lock (%v): %s", jerr, strings.TrimSpace(tail.String()))
		}
	}
	if err == nil && reply.Locked {
		l.gen = reply.Gen
		n.lock = l
		msg := "workdir " + lockDir(n)
		switch {
		case reply.Joined:
			msg += ", held by another node of this job (a shared workdir)"
		case reply.TookOver != "":
			msg += ": took over " + reply.TookOver
		}
		j.nodeEvent(n.name, event.NodeLocked, msg)
		return nil
	}
	ap.stdin.Close()
	ap.kill()
	switch {
	case err != nil:
		return fmt.Errorf("node %s: workdir lock: %w", n.name, err)
	case reply.Holder != nil:
		return j.heldError(n, reply.Holder)
	}
	return inputErrorf("node %s: workdir %s: %s", n.name, lockDir(n), reply.Error)
}

// startLockHolder starts `gptui agent --lock` in node n's workdir. A local
// holder gets a process group of its own, so that a terminal's Ctrl-C
// reaches the launcher (which stops the job, then releases the lock) and
// not the holder, and it outlives the launcher's death only until it
// reads the end of its input.
func (n *node) startLockHolder(ctx context.Context) (*agentProc, error) {
	if n.local() {
		p, proc, err := n.startLocal(&syscall.SysProcAttr{Setpgid: true}, "agent", "--lock")
		if err != nil {
			return nil, err
		}
		p.kill = func() { _ = proc.Kill() }
		return p, nil
	}
	// The holder lives as long as the job: its session outlives ctx.
	s, err := n.client.Start(context.WithoutCancel(ctx), n.command(true, "agent", "--lock"))
	if err != nil {
		return nil, err
	}
	return &agentProc{stdin: s.Stdin, stdout: s.Stdout, stderr: s.Stderr,
		wait: func() error { _, err := s.Wait(); return err },
		kill: func() { _ = s.Close() }}, nil
}

// releaseLock ends node n's holder: it releases the lock at once, or, if
// a restart follows, keeps it for the restart (agent.LockLinger at most).
func (n *node) releaseLock() {
	l := n.lock
	if l == nil {
		return
	}
	n.lock = nil
	if l.linger {
		io.WriteString(l.proc.stdin, agent.LingerLine+"\n")
		l.proc.stdin.Close()
		return
	}
	l.proc.stdin.Close()
	select {
	case <-l.done:
	case <-time.After(lockRelease):
		l.proc.kill()
	}
}

// lingerLocks has the nodes' holders keep their locks for the restart
// that follows failure, when the job's Supervisor will restart it.
func (j *Job) lingerLocks(nodes []*node, failure *Failure) {
	if !j.opts.lockLinger || failure == nil || failure.Code == 2 {
		return
	}
	for _, n := range nodes {
		if n.lock != nil {
			n.lock.linger = true
		}
	}
}

// checkLocalWorkdirs refuses two nodes of this machine (without SSH) in
// one workdir: their jobs would write each other's files.
func checkLocalWorkdirs(o Options) error {
	seen := map[string]sshexec.Node{}
	for _, n := range o.Nodes {
		if !n.Local {
			continue
		}
		dir, err := expandHome(n.Workdir)
		if err != nil {
			return err
		}
		if prev, ok := seen[dir]; ok {
			return inputErrorf("%s:%d: %s runs on this machine without SSH in the workdir %s, as %s on line %d does: give each node its own workdir=, or ssh=true to reach it over SSH", o.Hosts, n.Line, n.Name, n.Workdir, prev.Name, prev.Line)
		}
		seen[dir] = n
	}
	return nil
}
