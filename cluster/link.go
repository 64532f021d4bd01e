package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gptui/gptui/badinput"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/planner/profile"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/sshexec"
)

// LinkNodes returns the two nodes of the inventory at hosts between which
// a link measurement runs: the first two, each with one CPU worker
// whatever its devices. An inventory of fewer is bad input.
func LinkNodes(hosts string) ([]sshexec.Node, error) {
	nodes, err := sshexec.LoadInventory(hosts)
	if err != nil {
		return nil, err
	}
	if len(nodes) < 2 {
		return nil, badinput.Wrap(fmt.Errorf("%s: a link is measured between two nodes, the inventory has %d; add a node", hosts, len(nodes)))
	}
	two := slices.Clone(nodes[:2])
	for i := range two {
		two[i].Devices = sshexec.Devices{CPU: 1}
	}
	return two, nil
}

// MeasureLink measures the all-reduce bus bandwidth between the two nodes
// two (from [LinkNodes]) of the inventory at hosts. It sets the job up as
// a training job (connect, push gptui, an agent on each node) with one CPU
// worker per node, each running args instead of training — a command that
// runs [profile.LinkPeer] — and reads the figure rank 0 prints. Progress
// goes to logf. It returns the bandwidth in bytes/s and where and when it
// was measured.
func MeasureLink(ctx context.Context, hosts string, two []sshexec.Node, ssh sshexec.ClientConfig, args []string, logf func(format string, a ...any)) (float64, string, error) {
	cfg, err := presets.Load("tiny", nil) // pushed, never trained
	if err != nil {
		return 0, "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	job := New(Options{Nodes: two, Hosts: hosts, Config: cfg, SSH: ssh,
		JobID: "plan-link-" + time.Now().UTC().Format("20060102T150405")})
	var (
		bw   float64
		tail []string
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range job.Events() {
			if e.Kind == event.KindNode && (e.State == event.NodePushing || e.State == event.NodeFailed) {
				logf("%s: %s %s", e.Node, e.State, e.Message)
			}
			if e.Kind != event.KindLog {
				continue
			}
			if v, ok := profile.ParseLinkLine(e.Line); ok && e.Rank == 0 {
				bw = v
				continue
			}
			tail = append(tail[max(0, len(tail)-9):], fmt.Sprintf("[%s/%d] %s", e.Node, e.Rank, e.Line))
		}
	}()
	plan, err := job.Plan(ctx)
	if err != nil {
		job.Close()
		<-done
		var ie *InputError
		if errors.As(err, &ie) {
			return 0, "", err
		}
		return 0, "", fmt.Errorf("measuring the link between nodes: %w", err)
	}
	// Start runs the specs of the plan Plan returned: the workers measure
	// the link instead of training.
	for i := range plan.Nodes {
		for k := range plan.Nodes[i].Spec.Workers {
			plan.Nodes[i].Spec.Workers[k].Args = args
		}
	}
	if err = job.Start(ctx); err == nil {
		err = job.Wait()
	} else {
		job.Wait()
	}
	<-done
	if err != nil {
		if len(tail) > 0 {
			err = fmt.Errorf("%w; the workers' last lines:\n%s", err, strings.Join(tail, "\n"))
		}
		return 0, "", fmt.Errorf("measuring the link between nodes: %w", err)
	}
	if bw <= 0 {
		return 0, "", fmt.Errorf("measuring the link between nodes: rank 0 on %s reported no bandwidth", plan.Nodes[0].Name)
	}
	desc := fmt.Sprintf("%s between %s and %s", time.Now().UTC().Format(time.RFC3339), plan.Nodes[0].Name, plan.Nodes[1].Name)
	return bw, desc, nil
}
