package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gptui/gptui/agent"
	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/fence"
	"github.com/gptui/gptui/launch"
	"github.com/gptui/gptui/ranktable"
	"github.com/gptui/gptui/sshexec"
	"github.com/gptui/gptui/units"
)

// Plan sets the job up on every node (connect, push, probe, check the data
// paths; at most Options.Parallel nodes at a time), then builds the rank
// table and the agents' job specs. It reports each node's progress on
// Events. On error the job is left to Close; an *InputError is the
// user's to fix.
func (j *Job) Plan(ctx context.Context) (*Plan, error) {
	j.mu.Lock()
	if j.plan != nil || j.closed {
		j.mu.Unlock()
		return nil, errors.New("cluster: Plan called twice, or after Close")
	}
	j.mu.Unlock()
	o := j.opts
	if len(o.Nodes) == 0 {
		return nil, inputErrorf("%s: no nodes", o.Hosts)
	}
	if o.Config == nil {
		return nil, errors.New("cluster: no config")
	}
	if err := checkLocalWorkdirs(o); err != nil {
		return nil, err
	}
	exe, err := j.exe()
	if err != nil {
		return nil, err
	}
	// The platform exe is built for, from its header; "" for a file that
	// does not say (a script), which every node gets unless Binaries has
	// one for it.
	exePlat, err := exePlatform(exe)
	if err != nil && !errors.Is(err, errUnknownExe) {
		return nil, fmt.Errorf("cluster: the gptui executable to push: %w", err)
	}
	if err := checkBinaries(o.Binaries); err != nil {
		return nil, err
	}
	names := nodeNames(o.Nodes)
	nodes := make([]*node, len(o.Nodes))
	plans := make([]NodePlan, len(o.Nodes))
	j.mu.Lock()
	j.nodes = nodes
	j.mu.Unlock()
	configYAML := o.Config.YAML()
	configRel := path.Join("jobs", o.JobID, "config.yaml")

	// The first node that fails stops the others' setup. The plan's error
	// is that of the first node in the inventory whose own setup failed
	// (several may fail before the stop reaches them), so it does not
	// depend on timing.
	setupCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	// The executable and the staged data spread from node to node
	// (distribute.go), but for a stand-in that is no executable.
	j.dist = newDistributor(setupCtx, !o.NoRelay && exePlat != "")
	defer j.dist.close()
	own := make([]bool, len(nodes))
	// The nodes are set up in the order their workdir locks are taken
	// (lockOrder), so that a node waiting for its turn to lock never
	// waits for one that has not started.
	order := newLockOrder(o.Nodes)
	j.locks = order
	sorted := sshexec.ForEach(setupCtx, len(nodes), o.Parallel, func(sctx context.Context, k int) error {
		i := order.node[k]
		defer order.finish(i)
		n, err := j.setUp(sctx, i, names[i], exe, exePlat, configRel, configYAML, &plans[i])
		if n != nil {
			j.mu.Lock()
			nodes[i] = n
			j.mu.Unlock()
		}
		if err != nil {
			if ctx.Err() == nil && sctx.Err() != nil {
				j.nodeEvent(names[i], event.NodeStopped, "setup stopped: "+context.Cause(sctx).Error())
				return context.Cause(sctx)
			}
			own[i] = true
			stop(err)
			e := event.New(event.KindNode)
			e.Node, e.State, e.Message = names[i], event.NodeFailed, err.Error()
			if ke := (*sshexec.HostKeyError)(nil); errors.As(err, &ke) {
				e.HostKey = &event.HostKey{Kind: ke.Kind, Fingerprint: ke.Fingerprint, Known: ke.Known}
			}
			j.emit(e)
			return err
		}
		return nil
	})
	j.dist.close()
	errs := make([]error, len(nodes)) // in the inventory's order
	for k, err := range sorted {
		errs[order.node[k]] = err
	}
	if cause := context.Cause(setupCtx); ctx.Err() == nil && cause != nil {
		for i, err := range errs {
			if own[i] && err != nil {
				return nil, err
			}
		}
		return nil, cause
	}
	if err := errorsFirst(errs); err != nil {
		return nil, err
	}
	var resume string // a dry run copies no checkpoint
	var step int
	if !o.DryRun {
		if resume, step, err = j.syncCheckpoints(ctx, nodes); err != nil {
			return nil, err
		}
	}

	p := &Plan{JobID: o.JobID, Nodes: plans, Resume: resume, ResumeStep: step}
	workers, err := j.assign(p, nodes)
	if err != nil {
		return nil, err
	}
	p.World = p.Table.RankSize()
	if err := j.pickMaster(ctx, p, nodes, workers); err != nil {
		return nil, err
	}
	if err := j.preflight(ctx, p, nodes, workers); err != nil {
		return nil, err
	}
	if err := j.specs(p, nodes, workers, configRel); err != nil {
		return nil, err
	}
	for i := range nodes {
		j.nodeEvent(names[i], event.NodeReady, fmt.Sprintf("%d workers", len(p.Nodes[i].Spec.Workers)))
	}
	j.mu.Lock()
	j.plan = p
	j.mu.Unlock()
	return p, nil
}

// setUp connects to node i of the inventory, asks it its platform and
// picks the executable built for it (exe, built for exePlat, or one of
// Options.Binaries), pushes that and the config, takes the workdir's lock
// in its turn, probes the node and checks the data paths.
func (j *Job) setUp(ctx context.Context, i int, name, exe, exePlat, configRel string, configYAML []byte, np *NodePlan) (*node, error) {
	o := j.opts
	inv := o.Nodes[i]
	np.Name, np.Workdir = name, inv.Workdir
	n := &node{inv: inv, name: name, dir: inv.Workdir}
	if inv.Local {
		j.nodeEvent(name, event.NodeConnecting, "this machine, without SSH")
		dir, err := expandHome(inv.Workdir)
		if err != nil {
			return nil, err
		}
		np.Platform = localPlatform()
		bin, err := j.binaryFor(n, np.Platform, "", exe, exePlat)
		if err != nil {
			return nil, err
		}
		n.dir, n.exe = dir, bin
		if o.DryRun {
			if err := j.checkLock(ctx, n); err != nil {
				return n, err
			}
		} else {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, fmt.Errorf("node %s: workdir: %w", name, err)
			}
			if err := j.takeLockInTurn(ctx, n, i); err != nil {
				return n, err
			}
		}
	} else {
		cfg := o.SSH
		cfg.Jump = inv.Jump
		if inv.User != "" {
			cfg.User = inv.User
		}
		if inv.Identity != "" {
			cfg.IdentityFiles = []string{inv.Identity}
		}
		j.nodeEvent(name, event.NodeConnecting, net.JoinHostPort(inv.Host, strconv.Itoa(inv.Port)))
		c, err := sshexec.Dial(ctx, inv.Host, inv.Port, cfg)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", name, err)
		}
		n.client, n.exe = c, "./gptui"
	}
	np.Addr = n.addr()

	if !n.local() {
		// The first command on the node, before anything is written
		// there: its platform, and (but at a restart, whose earlier
		// attempt kept the lock for it) whether another job holds the
		// workdir; the lock itself is taken by the gptui pushed.
		check := j.checksLock()
		hi, err := n.hello(ctx, check)
		if err != nil {
			if check {
				return n, inputErrorf("node %s: %w", name, err)
			}
			return n, fmt.Errorf("node %s: %w", name, err)
		}
		np.Platform = hi.platform
		bin, err := j.binaryFor(n, hi.platform, hi.uname, exe, exePlat)
		if err != nil {
			return n, err
		}
		if err := j.lockVerdict(n, hi.holder, nil); err != nil {
			return n, err
		}
		fi, err := os.Stat(bin)
		if err != nil {
			return n, fmt.Errorf("cluster: %w", err)
		}
		ps, notes, err := j.dist.push(ctx, n, bin, path.Join(n.dir, "gptui"), 0o755, hi.binSum)
		if err != nil {
			return n, fmt.Errorf("node %s: %w", name, err)
		}
		ps.Bytes = fi.Size()
		np.Pushes = append(np.Pushes, ps)
		msg := ps.String()
		if bin != exe {
			msg += fmt.Sprintf(": %s, the binary for %s", bin, hi.platform)
		}
		msg += relayNotes(notes)
		j.nodeEvent(name, event.NodePushing, msg)
		if !o.DryRun {
			if err := j.takeLockInTurn(ctx, n, i); err != nil {
				return n, err
			}
		}
	}
	// The config, the probe, and on an SSH node which data paths it lacks.
	var out []byte
	var missing []string
	if n.local() {
		if !o.DryRun {
			start := time.Now()
			if err := n.put(configRel, configYAML); err != nil {
				return n, fmt.Errorf("node %s: config: %w", name, err)
			}
			np.Pushes = append(np.Pushes, Push{File: path.Join(n.dir, configRel), Bytes: int64(len(configYAML)), Took: time.Since(start)})
		}
		var err error
		if out, err = n.gptui(ctx, "agent", "--probe"); err != nil {
			return n, fmt.Errorf("node %s: probe: %w", name, err)
		}
	} else {
		var config []byte
		if !o.DryRun {
			config = configYAML
		}
		start := time.Now()
		var err error
		if out, missing, err = n.prepare(ctx, configRel, config, dataPaths(o)); err != nil {
			return n, err
		}
		if config != nil {
			// One session wrote it and probed the node: its time is both's.
			ps := Push{File: path.Join(n.dir, configRel), Bytes: int64(len(config)), Took: time.Since(start)}
			np.Pushes = append(np.Pushes, ps)
			j.nodeEvent(name, event.NodePushing, ps.String()+", one session with the probe")
		}
	}
	e, err := event.NewReader(strings.NewReader(string(out))).Next()
	if err != nil || e.Kind != event.KindProbe || e.Probe == nil {
		return n, fmt.Errorf("node %s: probe: no probe event in %q (%v)", name, out, err)
	}
	np.Probe = *e.Probe
	pe := event.New(event.KindNode)
	pe.Node, pe.State, pe.Probe = name, event.NodeProbed, e.Probe
	pe.Message = describeProbe(e.Probe)
	j.emit(pe)

	if n.local() {
		// This machine's workers find a missing path themselves, as
		// 'gptui train' does, and say which in their last lines (exit
		// status 2): there is no other machine whose files could differ.
		return n, nil
	}
	if len(missing) > 0 && !o.NoStaging {
		if missing, err = j.stageData(ctx, n, missing); err != nil {
			return n, err
		}
	}
	if len(missing) > 0 {
		return n, j.missingData(n, inv.Line, missing)
	}
	return n, nil
}

// String describes the push for a node event.
func (p Push) String() string {
	if p.Skipped {
		return fmt.Sprintf("%s unchanged (SHA-256 matches), push skipped in %v", p.File, p.Took.Round(time.Millisecond))
	}
	s := fmt.Sprintf("%s pushed (%s) in %v", p.File, units.Bytes(p.Bytes), p.Took.Round(time.Millisecond))
	if p.Via != "" {
		s += ", relayed from " + p.Via
	}
	return s
}

// describeProbe sums a probe up in a few words.
func describeProbe(p *event.Probe) string {
	s := fmt.Sprintf("%s: %d cores, %s", p.Hostname, p.Cores, units.Bytes(p.MemBytes))
	if len(p.Devices) > 0 {
		s += fmt.Sprintf(", %d× %s", len(p.Devices), p.Devices[0].Name)
	} else {
		s += ", no GPU"
	}
	return s
}

// dataPaths are the config's paths that must exist on every node.
func dataPaths(o Options) []string {
	c := o.Config
	var ps []string
	for _, p := range []string{c.Data.Train.Dataset.InputDir, c.Data.Eval.Dataset.InputDir, c.Data.Tokenizer, c.Model.InitFrom, c.Engine.SaveLoad.CkptDir} {
		if p != "" && p != "auto" && !slices.Contains(ps, p) {
			ps = append(ps, p)
		}
	}
	return ps
}

// expandHome expands a leading ~/ to the home directory.
func expandHome(p string) (string, error) {
	if p != "~" && !strings.HasPrefix(p, "~/") {
		return filepath.Abs(p)
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(home, strings.TrimPrefix(p, "~")), nil
}

// slot is one worker's place before the specs are made.
type slot struct {
	rank, localRank int
	device          int // -1 for a CPU worker
}

// assign sets p.Table and returns each node's workers: from the given rank
// table, or built from the inventory's devices and the probes.
func (j *Job) assign(p *Plan, nodes []*node) ([][]slot, error) {
	o := j.opts
	workers := make([][]slot, len(nodes))
	if o.RankTable != nil {
		return workers, j.assignTable(p, nodes, workers)
	}
	inputs := make([]ranktable.ServerInput, len(nodes))
	rank := 0
	for i, n := range nodes {
		d, probe := n.inv.Devices, p.Nodes[i].Probe
		var ids []int
		cpu := false
		switch {
		case d.CPU > 0:
			cpu = true
			for k := range d.CPU {
				ids = append(ids, k)
			}
		case len(d.IDs) > 0:
			ids = d.IDs
			if len(probe.Devices) > 0 {
				for _, id := range ids {
					if id >= len(probe.Devices) {
						return nil, inputErrorf("%s:%d: node %s has no device %d: it has %d GPUs (0-%d)", o.Hosts, n.inv.Line, n.name, id, len(probe.Devices), len(probe.Devices)-1)
					}
				}
			}
		case len(probe.Devices) > 0:
			for _, dev := range probe.Devices {
				ids = append(ids, dev.Index)
			}
		default:
			// No devices= and no GPU: one CPU worker using every core.
			cpu, ids = true, []int{0}
		}
		in := ranktable.ServerInput{ServerID: n.inv.Host, DeviceIDs: ids, DeviceIPs: n.inv.DeviceIPsFor(ids)}
		inputs[i] = in
		for k, id := range ids {
			s := slot{rank: rank, localRank: k, device: id}
			if cpu {
				s.device = -1
			}
			workers[i] = append(workers[i], s)
			rank++
		}
	}
	p.Table = ranktable.Build(inputs)
	return workers, nil
}

// assignTable maps the servers of the given rank table onto the nodes by
// server_id (the node's host, name or address).
func (j *Job) assignTable(p *Plan, nodes []*node, workers [][]slot) error {
	o := j.opts
	t := o.RankTable
	if errs := ranktable.Check(t); len(errs) > 0 {
		return inputErrorf("%s: %w", o.RankTableFile, errs[0])
	}
	used := make([]bool, len(nodes))
	for si, s := range t.Servers {
		found := -1
		for i, n := range nodes {
			if !used[i] && serverMatches(s.ServerID, n) {
				found = i
				break
			}
		}
		if found < 0 {
			return inputErrorf("%s: server_list[%d]: server_id %q is not a node of %s", o.RankTableFile, si, s.ServerID, o.Hosts)
		}
		used[found] = true
		n := nodes[found]
		cpu := n.inv.Devices.CPU > 0 || (len(n.inv.Devices.IDs) == 0 && len(p.Nodes[found].Probe.Devices) == 0)
		for k, d := range s.Devices {
			sl := slot{rank: d.RankID, localRank: k, device: d.DeviceID}
			if cpu {
				sl.device = -1
			}
			workers[found] = append(workers[found], sl)
		}
	}
	for i, n := range nodes {
		if !used[i] {
			return inputErrorf("%s:%d: node %s is not in the rank table %s", o.Hosts, n.inv.Line, n.name, o.RankTableFile)
		}
	}
	p.Table = t
	return nil
}

// serverMatches reports whether a rank table's server_id names node n.
func serverMatches(id string, n *node) bool {
	if strings.EqualFold(id, n.inv.Host) || strings.EqualFold(id, n.inv.Name) || strings.EqualFold(id, n.name) {
		return true
	}
	if n.client != nil {
		if host, _, err := net.SplitHostPort(n.client.RemoteAddr().String()); err == nil && host == id {
			return true
		}
	}
	return false
}

// pickMaster sets p.MasterAddr, the address of rank 0's node as the other
// nodes reach it, and p.MasterPort, Options.MasterPort or a port free
// there.
func (j *Job) pickMaster(ctx context.Context, p *Plan, nodes []*node, workers [][]slot) error {
	m := -1
	for i, ws := range workers {
		for _, w := range ws {
			if w.rank == 0 {
				m = i
			}
		}
	}
	if m < 0 {
		return inputErrorf("cluster: no node holds rank 0")
	}
	mn := nodes[m]
	switch {
	case !mn.local():
		host, _, err := net.SplitHostPort(mn.client.RemoteAddr().String())
		if err != nil {
			return fmt.Errorf("cluster: address of %s: %w", mn.name, err)
		}
		p.MasterAddr = host
	default:
		// This machine, as the first remote node reaches it; loopback if
		// every node is this machine.
		p.MasterAddr = "127.0.0.1"
		for _, n := range nodes {
			if !n.local() {
				host, _, err := net.SplitHostPort(n.client.LocalAddr().String())
				if err == nil {
					p.MasterAddr = host
				}
				break
			}
		}
	}
	if j.opts.MasterPort != 0 {
		p.MasterPort = j.opts.MasterPort
		return nil
	}
	out, err := mn.gptui(ctx, "agent", "--free-port", p.MasterAddr)
	if err != nil {
		return fmt.Errorf("cluster: MASTER_PORT: %w", err)
	}
	p.MasterPort, err = strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		return fmt.Errorf("cluster: MASTER_PORT: %q from %s", out, mn.name)
	}
	return nil
}

// specs makes each node's job spec and agent command.
func (j *Job) specs(p *Plan, nodes []*node, workers [][]slot, configRel string) error {
	o := j.opts
	env := append(passedEnv(os.Environ()), o.Env...)
	// A new secret for every plan: each start of the job, a restart too.
	secret, err := comm.NewSecret()
	if err != nil {
		return err
	}
	threadsSet := slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "GPTUI_THREADS=") })
	if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "GPTUI_COMM_TIMEOUT=") }) {
		// The launcher's hang diagnosis comes before a rank's own timeout.
		env = append(env, "GPTUI_COMM_TIMEOUT="+(2*o.hangTimeout()+10*time.Second).String())
	}
	for i, n := range nodes {
		np := &p.Nodes[i]
		spec := agent.Spec{Job: p.JobID, Node: n.name, LogDir: o.Config.Engine.LogDir}
		if n.local() {
			spec.Exe = n.exe
		}
		slices.SortFunc(workers[i], func(a, b slot) int { return a.localRank - b.localRank })
		for _, w := range workers[i] {
			wenv := launch.Env(w.rank, w.localRank, p.World, p.MasterAddr, p.MasterPort, secret)
			wenv = append(wenv, "GPTUI_JOB="+p.JobID, "GPTUI_NODE="+n.name)
			if n.lock != nil && n.lock.gen > 0 {
				// The workers write into the workdir while this attempt
				// holds it (package fence).
				wenv = append(wenv, fence.Env+"="+strconv.FormatUint(n.lock.gen, 10))
			}
			if !threadsSet {
				// The node's workers share its cores.
				wenv = append(wenv, "GPTUI_THREADS="+strconv.Itoa(max(1, np.Probe.Cores/len(workers[i]))))
			}
			wenv = append(wenv, ifaceEnv(env, np.Preflight)...)
			wenv = append(wenv, env...)
			spec.Workers = append(spec.Workers, agent.WorkerSpec{
				Rank: w.rank, LocalRank: w.localRank, Device: w.device,
				Args: resumeArgs([]string{"train", "-c", configRel}, p.Resume),
				Env:  wenv,
			})
		}
		np.Spec = spec
		if n.local() {
			np.Command = shellQuote(n.exe) + " agent  (in " + n.dir + ")"
		} else {
			np.Command = n.command(true, "agent")
		}
	}
	return nil
}

// resumeArgs adds to a worker's arguments the checkpoint every rank
// resumes from, when the launcher chose it (syncCheckpoints).
func resumeArgs(args []string, resume string) []string {
	if resume == "" {
		return args
	}
	return append(args, "-o", "Engine.save_load.ckpt_dir="+resume)
}

// passedEnv is what of the launcher's environment every worker gets: the
// GPTUI_* variables, and NCCL's (NCCL_SOCKET_IFNAME, NCCL_IB_HCA,
// NCCL_DEBUG, …), which tune a GPU job's communicators on every node.
func passedEnv(environ []string) []string {
	var env []string
	for _, kv := range environ {
		if strings.HasPrefix(kv, fence.Env+"=") {
			continue // each attempt's own (specs)
		}
		if strings.HasPrefix(kv, "GPTUI_") || strings.HasPrefix(kv, "NCCL_") {
			env = append(env, kv)
		}
	}
	return env
}

// specLine is the spec as the agent reads it: one JSON line.
func specLine(s *agent.Spec) ([]byte, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
