// Package hooks connects the terminal UI (package tui, which renders
// state and nothing else) to the rest of gptui, through the UI's hooks:
// [Cluster] is its tui.Launcher, setting nodes up with package cluster and
// starting each job under a supervisor of its own in its job folder
// (package jobdir), whose runner the UI follows; [Planner] is its
// tui.Planner, ranking strategies with package planner.
package hooks

import (
	"context"
	"errors"
	"github.com/gptui/gptui/tui"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/jobdir"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/sshexec"
)

// Cluster is the terminal UI's Launcher (tui.Launcher): it runs jobs with the cluster
// runner (package cluster, the launcher of 'gptui run --hosts') on the
// nodes of an inventory, over SSH, or on this machine as a local node
// (sshexec.Node.Local), each under a supervisor of its own, detached from
// the UI (package jobdir). The UI thus gets the same events, the same gang
// stop, hang diagnosis and lost-node detection for a job on this machine
// as for one on a cluster, and a job outlives the UI.
type Cluster struct {
	// Nodes are the inventory's nodes; Hosts its file name, for messages.
	Nodes []sshexec.Node
	Hosts string
	// Config and Overrides are the job's -c and -o at the start: the
	// probe checks the data paths of that config (tiny's when it does not
	// resolve).
	Config    string
	Overrides []string
	// SSH configures the connections.
	SSH sshexec.ClientConfig
	// AgentTimeout and HangTimeout are cluster.Options' (0: the defaults).
	AgentTimeout, HangTimeout time.Duration
	// Exe is the gptui executable that runs a job's supervisor; empty
	// means this one.
	Exe string
}

// Probe sets up each node asked for on its own (connect, push, probe,
// check the data paths: cluster.Job.Plan of a job of that node alone), all
// at once, so that a node that fails holds no other back, and reports it
// all as events; then it gives the jobs up. A mistake that is no one
// node's (a cluster.InputError) comes as a job event in state failed.
func (l *Cluster) Probe(ctx context.Context, req tui.ProbeRequest) <-chan event.Event {
	cfg, err := presets.Load(l.Config, l.Overrides)
	if err != nil {
		cfg, _ = presets.Load("tiny", nil)
	}
	var nodes []sshexec.Node
	for _, n := range l.Nodes {
		if len(req.Nodes) == 0 || slices.Contains(req.Nodes, n.Name) {
			nodes = append(nodes, n)
		}
	}
	ch := make(chan event.Event, 64)
	var wg sync.WaitGroup
	for _, n := range nodes {
		ssh := l.SSH
		if len(nodes) == 1 {
			ssh.AcceptHostKey = req.AcceptHostKey
		}
		// A probe writes no job's files (DryRun): a node whose workdir a
		// running job holds says so.
		job := cluster.New(cluster.Options{Nodes: []sshexec.Node{n}, Hosts: l.Hosts, Config: cfg, SSH: ssh, DryRun: true, Continues: req.Continues})
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := make(chan struct{})
			go func() {
				defer close(done)
				for e := range job.Events() {
					ch <- e
				}
			}()
			_, err := job.Plan(ctx)
			job.Close()
			<-done
			var ie *cluster.InputError
			if errors.As(err, &ie) {
				e := event.New(event.KindJob)
				e.State, e.Node, e.Message = event.JobFailed, n.Name, err.Error()
				ch <- e
			}
		}()
	}
	go func() {
		wg.Wait()
		close(ch)
	}()
	return ch
}

// Start starts the job detached from the UI, as 'gptui run --detach'
// does: it writes what the job runs (the config, its overrides, the UI's
// rank table, the policies) in the job's folder, jobs/<id>/, and starts
// the job's supervisor (package jobdir) in a session of its own; the UI
// is then a view onto it, following its event log and stopping or
// restarting it through its control socket. Quitting the UI, or losing
// its terminal, leaves the job running ('gptui attach' reopens it).
//
// The job runs with its restart policy (Job.Restarts), on the nodes
// Job.Nodes names (every node when none), with the UI's rank table unless
// it is elastic (each attempt's ranks then come from its nodes).
func (l *Cluster) Start(ctx context.Context, job tui.Job) (tui.Runner, error) {
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	spec := jobdir.Spec{
		ID: job.JobID, Dir: wd, Config: job.Config, Overrides: append([]string(nil), job.Overrides...),
		Resume: job.Resume, Continues: job.Continues, RankTable: job.TablePath, AcceptNewHostKeys: l.SSH.AcceptNewHostKeys,
		AgentTimeout: l.AgentTimeout, HangTimeout: l.HangTimeout,
		MaxRestarts: job.Restarts.Max, MinNodes: job.Restarts.MinNodes, MaxNodes: job.Restarts.MaxNodes,
		Nodes: append([]string(nil), job.Nodes...),
	}
	if job.Elastic {
		spec.RankTable = "" // each attempt's, from its nodes
	}
	if l.Hosts == sshexec.LocalHosts {
		spec.Nproc = 0
		for _, n := range l.Nodes {
			spec.Nproc += max(n.Devices.CPU, 1)
		}
		if job.Table != nil {
			spec.Nproc = job.Table.RankSize()
		}
	} else {
		spec.Hosts = l.Hosts
	}
	dir, err := jobdir.Create(wd, spec)
	if err != nil {
		return nil, err
	}
	if _, err := jobdir.Launch(dir, l.Exe); err != nil {
		return nil, err
	}
	return jobdir.Attach(ctx, dir, 0), nil
}

// StartsDetached marks Cluster's jobs as running on their own: quitting the
// UI may leave them running (tui.DetachingLauncher).
func (l *Cluster) StartsDetached() {}
