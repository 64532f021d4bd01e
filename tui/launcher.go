package tui

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/sshexec"
)

// ClusterLauncher is the Launcher of gptui: it runs jobs with the cluster
// runner (package cluster, the launcher of 'gptui run --hosts') on the
// nodes of an inventory, over SSH, or on this machine as a local node
// (sshexec.Node.Local). The UI thus gets the same events, the same gang
// stop, hang diagnosis and lost-node detection for a job on this machine
// as for one on a cluster.
type ClusterLauncher struct {
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
}

// Probe sets up each node asked for on its own (connect, push, probe,
// check the data paths: cluster.Job.Plan of a job of that node alone), all
// at once, so that a node that fails holds no other back, and reports it
// all as events; then it gives the jobs up. A mistake that is no one
// node's (a cluster.InputError) comes as a job event in state failed.
func (l *ClusterLauncher) Probe(ctx context.Context, req ProbeRequest) <-chan event.Event {
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
		job := cluster.New(cluster.Options{Nodes: []sshexec.Node{n}, Hosts: l.Hosts, Config: cfg, SSH: ssh, DryRun: true})
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

// Start plans the job with the UI's rank table and starts it under a
// cluster.Supervisor with the job's restart policy; both happen in the
// background, reported on the runner's events.
func (l *ClusterLauncher) Start(ctx context.Context, job Job) (Runner, error) {
	cfg := job.Resolved
	if job.Resume {
		// The same as 'gptui train --resume'.
		var err error
		if cfg, err = presets.Load(job.Config, append(append([]string(nil), job.Overrides...), "Engine.save_load.ckpt_dir=auto")); err != nil {
			return nil, err
		}
	}
	nodes := l.Nodes
	if len(job.Nodes) > 0 {
		nodes = slices.DeleteFunc(slices.Clone(nodes), func(n sshexec.Node) bool { return !slices.Contains(job.Nodes, n.Name) })
	}
	table, tableFile := job.Table, job.TablePath
	if job.Elastic {
		table, tableFile = nil, "" // each attempt's, from its nodes
	}
	cj := cluster.NewSupervisor(cluster.Options{
		Nodes: nodes, Hosts: l.Hosts, Config: cfg, SSH: l.SSH,
		RankTable: table, RankTableFile: tableFile, JobID: job.JobID,
		AgentTimeout: l.AgentTimeout, HangTimeout: l.HangTimeout,
	}, job.Restarts)
	ctx, cancel := context.WithCancel(ctx)
	r := &clusterRunner{events: make(chan event.Event, 256), cancel: cancel}
	failed := make(chan error, 1)
	go func() {
		defer close(r.events)
		for e := range cj.Events() {
			r.events <- e
		}
		if err := <-failed; err != nil {
			e := event.New(event.KindJob)
			e.State, e.Message = event.JobFailed, err.Error()
			if ctx.Err() != nil {
				e.State = event.JobStopped // Stop while the job was being planned
			}
			r.events <- e
		}
		cancel()
	}()
	go func() {
		if _, err := cj.Plan(ctx); err != nil {
			cj.Close()
			failed <- err
			return
		}
		if err := cj.Start(ctx); err != nil {
			cj.Wait() // its events end with the job's failure
		}
		failed <- nil
	}()
	return r, nil
}

// clusterRunner is a job of the cluster runner.
type clusterRunner struct {
	events chan event.Event
	cancel context.CancelFunc // stops the job, while it is planned or runs
}

func (r *clusterRunner) Events() <-chan event.Event { return r.events }

// Stop ends the job's context: during the setup that ends it; once the job
// runs it is an interrupt (cluster.Job.Start), on which the workers save
// their finished steps and exit, and which no restart follows.
func (r *clusterRunner) Stop() { r.cancel() }
