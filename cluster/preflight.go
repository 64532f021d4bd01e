package cluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gptui/gptui/agent"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/sshexec"
	"github.com/gptui/gptui/units"
)

// Bounds of the pre-flight.
const (
	// preflightStartTimeout bounds the start of every node's pre-flight
	// (an SSH session each, at once) until each listens.
	preflightStartTimeout = 30 * time.Second
	// preflightReportSlack is how long after PreflightDialTimeout the
	// launcher waits for the nodes' reports.
	preflightReportSlack = 3 * time.Second
	// MaxClockSkew is how far a node's clock may be from the launcher's
	// (beyond the uncertainty of the round trip that measures it) before
	// the pre-flight warns: the events' times are their senders' clocks.
	MaxClockSkew = 2 * time.Second
	// checkpointOverhead is what a checkpoint holds on a node besides its
	// tensor data: its manifest, latest.
	checkpointOverhead = 64 << 10
)

// The variables that name the interface NCCL and Gloo-style
// communicators use; the pre-flight sets them to the interface each node
// reaches the master through, unless they are set.
var ifaceVars = []string{"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}

// pfNode is one node's pre-flight as the launcher runs it.
type pfNode struct {
	spec   agent.PreflightSpec
	proc   *agentProc
	out    *bufio.Reader
	stderr *lockedBuffer
	listen agent.PreflightListening
	t0, t1 time.Time // the spec sent, the listening line read
	report *event.Preflight
}

// preflight runs the pre-flight of every node at once (agent.RunPreflight,
// `gptui agent --preflight`), once MASTER_ADDR and MASTER_PORT are known
// and before any worker starts: each node listens where the job's
// processes will (the master node on MASTER_PORT, every node on a port
// of its ephemeral range on the address toward the master), then dials
// the master's port and each peer's, while it checks its limits, disk
// and CUDA libraries; the launcher adds the GPU count and the clock. Each
// node's result is an event of kind preflight and its NodePlan's
// Preflight. A check that failed refuses the job with an *InputError,
// unless it is a dry run, whose plan shows it.
func (j *Job) preflight(ctx context.Context, p *Plan, nodes []*node, workers [][]slot) error {
	o := j.opts
	pctx, cancel := context.WithTimeout(ctx, preflightStartTimeout)
	defer cancel()
	specs := j.preflightSpecs(p, nodes, workers)
	pf := make([]*pfNode, len(nodes))
	for i := range pf {
		pf[i] = &pfNode{spec: specs[i], stderr: &lockedBuffer{}}
	}
	defer func() {
		for _, f := range pf {
			if f.proc != nil {
				f.proc.kill()
			}
		}
	}()
	fail := func(i int, err error) error {
		err = fmt.Errorf("node %s: pre-flight: %w", nodes[i].name, err)
		if s := strings.TrimSpace(pf[i].stderr.String()); s != "" {
			err = fmt.Errorf("%w: %s", err, s)
		}
		j.nodeEvent(nodes[i].name, event.NodeFailed, err.Error())
		return err
	}

	// Every node listens, all at once: a node must not dial before its
	// peers listen.
	errs := sshexec.ForEach(pctx, len(nodes), 0, func(ctx context.Context, i int) error {
		return pf[i].start(ctx, nodes[i])
	})
	for i, err := range errs {
		if err != nil {
			return fail(i, err)
		}
	}
	// Then each dials the others, all at once, within one deadline.
	rctx, rcancel := context.WithTimeout(pctx, agent.PreflightDialTimeout+preflightReportSlack)
	defer rcancel()
	stop := context.AfterFunc(rctx, func() {
		for _, f := range pf {
			f.proc.kill()
		}
	})
	defer stop()
	errs = sshexec.ForEach(rctx, len(nodes), 0, func(ctx context.Context, i int) error {
		return pf[i].finish(targets(p, pf, nodes, i))
	})
	// Every node has reported (or one failed): the listeners can go.
	var wg sync.WaitGroup
	for _, f := range pf {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.end()
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			if rctx.Err() != nil && ctx.Err() == nil {
				err = fmt.Errorf("no report within %v: %w", agent.PreflightDialTimeout+preflightReportSlack, err)
			}
			return fail(i, err)
		}
	}

	var problems []string
	for i, n := range nodes {
		f := pf[i]
		r := f.report
		// This machine's GPU workers say themselves what they lack, as
		// 'gptui train' does.
		if c, ok := gpuCheck(n, &p.Nodes[i].Probe, workers[i]); ok && !n.local() {
			r.Checks = append(r.Checks, c)
		}
		r.Checks = append(r.Checks, clockCheck(f.listen.Time, f.t0, f.t1))
		p.Nodes[i].Preflight = r
		e := event.New(event.KindPreflight)
		e.Node, e.State, e.Preflight = n.name, r.Status(), r
		var msgs []string
		for _, c := range r.Checks {
			if pr := c.Problem(); pr != "" {
				msgs = append(msgs, pr)
				if c.Status == event.PreflightFailed {
					problems = append(problems, "node "+n.name+": "+pr)
				}
			}
		}
		e.Message = strings.Join(msgs, "; ")
		if e.Message == "" {
			e.Message = fmt.Sprintf("%d %s passed", len(r.Checks), units.Plural(len(r.Checks), "check"))
			if r.Iface != "" {
				e.Message = r.Iface + " " + r.Addr + ", " + e.Message
			}
		}
		j.emit(e)
	}
	if len(problems) == 0 || o.DryRun {
		return nil
	}
	more := ""
	if len(problems) > 1 {
		more = fmt.Sprintf(" (and %d more %s, each on a line above)", len(problems)-1, units.Plural(len(problems)-1, "problem"))
	}
	return inputErrorf("pre-flight: %s%s", problems[0], more)
}

// start starts the node's pre-flight, sends it its spec and reads where
// it listens.
func (f *pfNode) start(ctx context.Context, n *node) error {
	proc, err := n.startPreflight(ctx, f.stderr)
	if err != nil {
		return err
	}
	f.proc = proc
	f.out = bufio.NewReader(proc.stdout)
	line, err := json.Marshal(f.spec)
	if err != nil {
		return err
	}
	f.t0 = time.Now()
	if _, err := proc.stdin.Write(append(line, '\n')); err != nil {
		return err
	}
	b, err := f.out.ReadBytes('\n')
	f.t1 = time.Now()
	if err != nil {
		return fmt.Errorf("no answer: %w", err)
	}
	if err := json.Unmarshal(b, &f.listen); err != nil {
		return fmt.Errorf("answer %q: %w", b, err)
	}
	return nil
}

// finish sends the node its targets and reads its report.
func (f *pfNode) finish(ts []agent.PreflightTarget) error {
	line, err := json.Marshal(agent.PreflightTargets{Targets: ts})
	if err != nil {
		return err
	}
	if _, err := f.proc.stdin.Write(append(line, '\n')); err != nil {
		return err
	}
	e, err := event.NewReader(f.out).Next()
	if err != nil {
		return fmt.Errorf("no report: %w", err)
	}
	if e.Kind != event.KindPreflight || e.Preflight == nil {
		return fmt.Errorf("a %s event instead of its report", e.Kind)
	}
	f.report = e.Preflight
	return nil
}

// end closes the node's standard input, on which its pre-flight closes
// its listeners and exits, and waits up to a second for that.
func (f *pfNode) end() {
	if f.proc == nil {
		return
	}
	f.proc.stdin.Close()
	exited := make(chan struct{})
	go func() {
		f.proc.wait()
		close(exited)
	}()
	select {
	case <-exited:
	case <-time.After(time.Second):
	}
}

// targets returns what node i dials: the master's port (the master node
// too: its other ranks reach it there), and each other node's listener.
func targets(p *Plan, pf []*pfNode, nodes []*node, i int) []agent.PreflightTarget {
	if p.World <= 1 || pf[i].spec.MasterAddr == "" {
		return nil // a job of one rank, or on this machine alone, needs no network
	}
	var ts []agent.PreflightTarget
	for k, f := range pf {
		if f.spec.Master && f.listen.MasterErr == "" {
			ts = append(ts, agent.PreflightTarget{Node: nodes[k].name, Addr: net.JoinHostPort(p.MasterAddr, strconv.Itoa(p.MasterPort)), Master: true, Range: f.listen.Range})
		}
	}
	for k, f := range pf {
		if k != i && f.listen.Port > 0 {
			ts = append(ts, agent.PreflightTarget{Node: nodes[k].name, Addr: net.JoinHostPort(f.listen.Addr, strconv.Itoa(f.listen.Port)), Range: f.listen.Range})
		}
	}
	return ts
}

// preflightSpecs makes each node's pre-flight spec.
func (j *Job) preflightSpecs(p *Plan, nodes []*node, workers [][]slot) []agent.PreflightSpec {
	cfg := j.opts.Config
	gpus := 0
	for _, ws := range workers {
		for _, w := range ws {
			if w.device >= 0 {
				gpus++
			}
		}
	}
	need, why := diskNeeds(cfg, p.World, workers, p.Resume != "")
	// A job on this machine alone has no network to check: its workers
	// meet over loopback, and set no interface.
	alone := len(nodes) == 1 && nodes[0].local()
	specs := make([]agent.PreflightSpec, len(nodes))
	for i, n := range nodes {
		s := agent.PreflightSpec{
			Node: n.name, World: p.World,
			GPU:  slices.ContainsFunc(workers[i], func(w slot) bool { return w.device >= 0 }),
			NCCL: gpus > 1,
		}
		if !alone {
			s.MasterAddr, s.MasterPort = p.MasterAddr, p.MasterPort
		}
		for _, w := range workers[i] {
			if w.rank == 0 && p.World > 1 && !alone {
				s.Master = true
			}
		}
		if dir := cfg.Engine.SaveLoad.OutputDir; dir != "" && need != nil {
			if n.local() && !filepath.IsAbs(dir) {
				dir = filepath.Join(n.dir, dir)
			}
			s.CkptDir, s.DiskNeed, s.DiskWhy = dir, need[i], why[i]
		}
		specs[i] = s
	}
	return specs
}

// diskNeeds returns the bytes each node's checkpoints need where they go
// (Engine.save_load.output_dir), by the engine's own account of what a
// rank writes (engine.SaveMemory), and how each was counted; nil when
// nothing is saved or the layout does not fit (the workers say why). A
// node holds its own ranks' part of each checkpoint, or the whole
// checkpoint with replicas (the copies of other nodes') or when the job
// resumes (every node gets the checkpoint it starts from); it holds
// keep_last of them and the one being written, or every one saved when
// keep_last is 0, each with its manifest (checkpointOverhead).
func diskNeeds(cfg *presets.Config, world int, workers [][]slot, resume bool) ([]int64, []string) {
	sl := cfg.Engine.SaveLoad
	if sl.SaveSteps <= 0 || cfg.Engine.MaxSteps <= 0 {
		return nil, nil
	}
	saves := (cfg.Engine.MaxSteps + sl.SaveSteps - 1) / sl.SaveSteps
	count := saves
	kept := fmt.Sprintf("all %d saves of max_steps %d every save_steps %d", saves, cfg.Engine.MaxSteps, sl.SaveSteps)
	if sl.KeepLast > 0 && sl.KeepLast+1 < saves {
		count, kept = sl.KeepLast+1, fmt.Sprintf("keep_last %d and the one being written", sl.KeepLast)
	}
	own := make([]int64, len(workers))
	var total int64
	for i, ws := range workers {
		for _, w := range ws {
			c, err := engine.SaveMemory(cfg, w.rank, world)
			if err != nil {
				return nil, nil
			}
			own[i] += c.Write
			total += c.Write
		}
	}
	whole := ""
	switch {
	case sl.Replicas > 1:
		whole = fmt.Sprintf("the whole checkpoint (replicas %d)", sl.Replicas)
	case resume:
		whole = "the whole checkpoint (a resumed job copies it to every node)"
	}
	need := make([]int64, len(workers))
	why := make([]string, len(workers))
	for i := range need {
		per, of := own[i], fmt.Sprintf("the node's ranks' part of a %s checkpoint", units.Bytes(total))
		if whole != "" {
			per, of = total, whole
		}
		need[i] = int64(count) * (per + checkpointOverhead)
		why[i] = fmt.Sprintf("%d %s (%s) of %s each, %s with its manifest", count, units.Plural(count, "checkpoint"), kept, units.Bytes(per+checkpointOverhead), of)
	}
	return need, why
}

// gpuCheck checks the GPUs the node shows (its probe) against those its
// workers use (devices=, or a rank table); ok is false for a node of CPU
// workers.
func gpuCheck(n *node, probe *event.Probe, ws []slot) (event.Check, bool) {
	var ids []int
	for _, w := range ws {
		if w.device >= 0 {
			ids = append(ids, w.device)
		}
	}
	if len(ids) == 0 {
		return event.Check{}, false
	}
	c := event.Check{Name: event.CheckGPUs, Have: int64(len(probe.Devices)), Need: int64(slices.Max(ids) + 1)}
	names := "devices=" + n.inv.Devices.String()
	if len(n.inv.Devices.IDs) == 0 {
		names = "the rank table"
	}
	switch {
	case len(probe.Devices) == 0:
		c.Status, c.Value = event.PreflightFailed, "none"
		c.Message = fmt.Sprintf("%s names %d %s on %s, but the node shows none (%s)", names, len(ids), units.Plural(len(ids), "GPU"), n.name, probe.NoGPU)
		c.Fix = "install the NVIDIA driver there (its NVML, libnvidia-ml.so.1, counts the GPUs), or give the node devices=cpu:N"
	case c.Need > c.Have:
		c.Status, c.Value = event.PreflightFailed, strconv.Itoa(len(probe.Devices))
		c.Message = fmt.Sprintf("%s names device %d on %s, which has %d %s", names, c.Need-1, n.name, len(probe.Devices), units.Plural(len(probe.Devices), "GPU"))
		c.Fix = fmt.Sprintf("name devices 0-%d only", len(probe.Devices)-1)
	default:
		c.Status = event.PreflightOK
		c.Value = fmt.Sprintf("%d of %d × %s used", len(ids), len(probe.Devices), probe.Devices[0].Name)
	}
	return c, true
}

// clockCheck compares a node's clock, at read between sent and got on
// the launcher's, with the launcher's.
func clockCheck(at, sent, got time.Time) event.Check {
	mid := sent.Add(got.Sub(sent) / 2)
	skew := at.Sub(mid)
	slack := got.Sub(sent) / 2
	c := event.Check{Name: event.CheckClock, Have: skew.Milliseconds(), Need: MaxClockSkew.Milliseconds(),
		Value: fmt.Sprintf("%+.3f s ± %.3f s", skew.Seconds(), slack.Seconds())}
	abs := max(skew, -skew)
	if abs-slack <= MaxClockSkew {
		c.Status = event.PreflightOK
		return c
	}
	c.Status = event.PreflightWarning
	c.Message = fmt.Sprintf("the node's clock is %s the launcher's by %v", map[bool]string{true: "ahead of", false: "behind"}[skew > 0], abs.Round(time.Millisecond))
	c.Fix = "synchronise the clocks (chrony or systemd-timesyncd against one NTP server): the events' times, and so the UI's, are each sender's clock"
	return c
}

// ifaceEnv is what a worker of a node with pre-flight pf gets for the
// interface variables (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME): the
// interface the node reaches the master through, for each that neither
// env (the launcher's, for every worker) nor the node's own environment
// sets.
func ifaceEnv(env []string, pf *event.Preflight) []string {
	if pf == nil || pf.Iface == "" {
		return nil
	}
	var out []string
	for _, k := range ifaceVars {
		set := func(kv string) bool { return strings.HasPrefix(kv, k+"=") }
		if !slices.ContainsFunc(env, set) && !slices.ContainsFunc(pf.NodeEnv, set) {
			out = append(out, k+"="+pf.Iface)
		}
	}
	return out
}

// startPreflight starts `gptui agent --preflight` on the node, in its
// workdir (on this machine, where a dry run made none, in the current
// directory), its standard error copied to stderr: ctx bounds it.
func (n *node) startPreflight(ctx context.Context, stderr io.Writer) (*agentProc, error) {
	if !n.local() {
		s, err := n.client.Start(ctx, n.command(true, "agent", "--preflight"))
		if err != nil {
			return nil, err
		}
		go io.Copy(stderr, s.Stderr)
		return &agentProc{
			stdin: s.Stdin, stdout: s.Stdout,
			wait: func() error { _, err := s.Wait(); return err },
			kill: func() { _ = s.Close() },
		}, nil
	}
	cmd := exec.CommandContext(ctx, n.exe, "agent", "--preflight")
	if _, err := os.Stat(n.dir); err == nil {
		cmd.Dir = n.dir
	}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s agent --preflight: %w", n.exe, err)
	}
	// One waiter, once the launcher has read what it needs of stdout
	// (Wait closes the pipe) or kills the process.
	var once sync.Once
	waited := make(chan error, 1)
	reap := func() { once.Do(func() { go func() { waited <- cmd.Wait() }() }) }
	var werr error
	var wonce sync.Once
	return &agentProc{stdin: stdin, stdout: stdout,
		wait: func() error {
			reap()
			wonce.Do(func() { werr = <-waited })
			return werr
		},
		kill: func() {
			_ = cmd.Process.Kill()
			reap()
		}}, nil
}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// PreflightFailures returns the pre-flight problems that refuse the plan
// (a dry run's plan keeps them), one line each naming the node and the
// fix.
func (p *Plan) PreflightFailures() []string {
	var out []string
	for _, n := range p.Nodes {
		if n.Preflight == nil {
			continue
		}
		for _, c := range n.Preflight.Checks {
			if c.Status == event.PreflightFailed {
				out = append(out, "node "+n.Name+": "+c.Problem())
			}
		}
	}
	return out
}
