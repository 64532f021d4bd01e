package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/launch"
)

// printPlan prints what --dry-run shows: the rank table, and each node's
// agent command and workers.
func printPlan(w io.Writer, p *cluster.Plan) error {
	if _, err := p.Table.WriteTo(w); err != nil {
		return err
	}
	fmt.Fprintf(w, "# job %s: %d ranks, MASTER_ADDR=%s MASTER_PORT=%d\n", p.JobID, p.World, p.MasterAddr, p.MasterPort)
	for _, n := range p.Nodes {
		fmt.Fprintf(w, "[%s] %s: %s\n", n.Name, n.Addr, n.Command)
		for _, wk := range n.Spec.Workers {
			dev := "cpu"
			if wk.Device >= 0 {
				dev = "device " + strconv.Itoa(wk.Device)
			}
			exe := "./gptui"
			if n.Spec.Exe != "" {
				exe = n.Spec.Exe
			}
			fmt.Fprintf(w, "[%s/%d] %s: %s %s %s\n", n.Name, wk.Rank, dev, strings.Join(launch.Redact(wk.Env), " "), exe, strings.Join(wk.Args, " "))
		}
	}
	return printPreflight(w, p)
}

// printPreflight prints the pre-flight table of a plan: a row per node
// and check, with what was found, and for a warning or a failure the
// problem and its fix.
func printPreflight(w io.Writer, p *cluster.Plan) error {
	fmt.Fprintln(w, "# pre-flight")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tCHECK\tSTATUS\tFOUND\tPROBLEM")
	for _, n := range p.Nodes {
		if n.Preflight == nil {
			continue
		}
		for _, c := range n.Preflight.Checks {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n.Name, c.Name, c.Status, c.Value, c.Problem())
		}
	}
	return tw.Flush()
}

// preflightLines are the lines of a node's pre-flight event: one per
// problem, or one saying that every check passed.
func preflightLines(e event.Event) []string {
	if e.Preflight == nil {
		return []string{fmt.Sprintf("[%s] preflight %s: %s", e.Node, e.State, e.Message)}
	}
	var out []string
	for _, c := range e.Preflight.Checks {
		if pr := c.Problem(); pr != "" {
			out = append(out, fmt.Sprintf("[%s] preflight %s: %s", e.Node, c.Status, pr))
		}
	}
	if len(out) == 0 {
		out = append(out, fmt.Sprintf("[%s] preflight ok: %s", e.Node, e.Message))
	}
	return out
}

// printer is the headless front end: it prints a job's events as lines.
//
// A job on an inventory's nodes prints everything: each node's setup,
// each shown rank's lines as "[node/rank] line", the job's state and a
// summary every so often and at the end. A local job (local: this machine
// alone, 'gptui run --nproc N') prints its shown ranks' lines as "[rank]
// line", each on the stream the worker wrote it to, and of the launcher's
// own lines only those of a hang or a restart.
type printer struct {
	out   io.Writer
	err   io.Writer      // a local job's lines of standard error
	local bool           // the job is this machine alone
	show  func(int) bool // nil: every rank
	every time.Duration
	start time.Time

	last    map[int]*event.Metrics // rank -> newest training metrics
	nodeOf  map[int]string
	changed bool
	ckpt    *event.Event // the newest checkpoint saved (a checkpoint event)
}

func (p *printer) shown(rank int) bool { return p.show == nil || p.show(rank) }

func (p *printer) printf(format string, args ...any) {
	fmt.Fprintf(p.out, format+"\n", args...)
}

// consume prints events until the channel is closed, and a summary line
// every p.every while metrics come in.
func (p *printer) consume(events <-chan event.Event) {
	p.last, p.nodeOf = map[int]*event.Metrics{}, map[int]string{}
	t := time.NewTicker(p.every)
	defer t.Stop()
	for {
		select {
		case e, ok := <-events:
			if !ok {
				return
			}
			p.event(e)
		case <-t.C:
			if p.changed {
				p.summary()
				p.changed = false
			}
		}
	}
}

func (p *printer) event(e event.Event) {
	if p.local {
		p.localEvent(e)
		return
	}
	switch e.Kind {
	case event.KindNode:
		msg := e.Message
		if msg != "" {
			msg = ": " + msg
		}
		p.printf("[%s] %s%s", e.Node, e.State, msg)
	case event.KindPreflight:
		for _, l := range preflightLines(e) {
			p.printf("%s", l)
		}
	case event.KindLog:
		p.nodeOf[e.Rank] = e.Node
		if p.shown(e.Rank) {
			p.printf("[%s/%d] %s", e.Node, e.Rank, e.Line)
		}
	case event.KindCheckpoint:
		switch e.State {
		case event.CheckpointSaved:
			if c := e.Checkpoint; c != nil && (p.ckpt == nil || c.Step >= p.ckpt.Checkpoint.Step) {
				p.ckpt = &e
			}
		case event.CheckpointReplicated, event.CheckpointReplicaFailed:
			p.printf("[%s] replica: %s", e.Node, e.Message)
		}
	case event.KindMetrics:
		if e.Metrics != nil && e.Metrics.EvalLoss == 0 {
			p.last[e.Rank] = e.Metrics
			p.nodeOf[e.Rank] = e.Node
			p.changed = true
		}
	case event.KindWorker:
		switch {
		case e.State == event.WorkerFailed && e.Signal != "":
			p.printf("[%s/%d] killed by %s", e.Node, e.Rank, e.Signal)
		case e.State == event.WorkerFailed:
			p.printf("[%s/%d] exited with code %d", e.Node, e.Rank, e.Code)
		}
	case event.KindJob:
		switch e.State {
		case event.JobRestarting:
			p.printf("[restart] %s", e.Message)
			return
		case event.JobReplanned:
			if e.Restart != nil {
				p.printf("[restart] %s", e.Message)
				return
			}
			p.printf("[elastic] %s", e.Message)
			return
		case event.JobHung:
			p.printf("[hang] %s", e.Message)
			return
		}
		msg := e.Message
		if msg != "" {
			msg = ": " + msg
		}
		p.printf("[job] %s%s", e.State, msg)
	}
}

// localEvent prints an event of a local job.
func (p *printer) localEvent(e event.Event) {
	switch {
	case e.Kind == event.KindLog && p.shown(e.Rank):
		w := p.out
		if e.Stderr {
			w = p.err
		}
		fmt.Fprintf(w, "[%d] %s\n", e.Rank, e.Line)
	case e.Kind == event.KindJob && e.State == event.JobRestarting:
		p.printf("[restart] %s", e.Message)
	case e.Kind == event.KindJob && e.State == event.JobHung:
		p.printf("[hang] %s", e.Message)
	case e.Kind == event.KindPreflight && e.State != event.PreflightOK:
		// This machine's problems: a small /dev/shm on a GPU job, a
		// full disk.
		for _, l := range preflightLines(e) {
			if !strings.Contains(l, "] preflight ok: ") {
				fmt.Fprintln(p.err, l)
			}
		}
	}
}

// summary prints the periodic line: rank 0's step and loss, the job's
// tokens/s and the slowest rank.
func (p *printer) summary() {
	if p.local || len(p.last) == 0 {
		return
	}
	ranks := make([]int, 0, len(p.last))
	for r := range p.last {
		ranks = append(ranks, r)
	}
	sort.Ints(ranks)
	lead := p.last[ranks[0]]
	if m, ok := p.last[0]; ok {
		lead = m
	}
	slow := slices.MaxFunc(ranks, func(a, b int) int {
		ma, mb := p.last[a], p.last[b]
		return cmp.Or(cmp.Compare(mb.Step, ma.Step), cmp.Compare(ma.StepTimeS, mb.StepTimeS)) // behind is slower
	})
	sm := p.last[slow]
	p.printf("[summary] step %d loss %.4f tokens/s %.0f slowest rank %d (%s) step %d %.3f s/step elapsed %v",
		lead.Step, lead.Loss, lead.TokensPerS, slow, p.nodeOf[slow], sm.Step, sm.StepTimeS, time.Since(p.start).Round(time.Second))
}

// final prints the end-of-job summary.
func (p *printer) final(err error) {
	if p.local {
		return // a local job's rank 0 has said how it ended ([done])
	}
	wall := time.Since(p.start).Round(time.Millisecond)
	var le *cluster.LogError // finished: its log failures are said after
	if err != nil && !errors.As(err, &le) {
		p.printf("[summary] wall time %v", wall)
		return
	}
	// Rank 0's last step is always logged: its metrics are the run's end.
	steps, loss, tps := 0, "none", "none"
	if m, ok := p.last[0]; ok {
		// The loss as 'gptui train' prints it (a float32).
		steps, loss, tps = m.Step+1, fmt.Sprintf("%.6f", float32(m.Loss)), strconv.FormatFloat(m.TokensPerS, 'f', 0, 64)
	}
	ckpt := "none"
	if c := p.ckpt; c != nil {
		// The path is on the saving rank's node (relative to its workdir).
		ckpt = c.Node + ":" + c.Checkpoint.Dir
	}
	p.printf("[summary] steps %d final loss %s tokens/s %s wall time %v checkpoint %s", steps, loss, tps, wall, ckpt)
}

// printFailure prints on w how the job failed: the rank that failed (or
// the node lost, or the hang) and its last lines, prefixed as the job's
// output lines are: "[rank]" for a local job, "[node/rank]" otherwise.
func printFailure(w io.Writer, f *cluster.Failure, local bool) {
	what, prefix := f.Error(), "["+f.Node+"]"
	if !f.Lost {
		prefix = fmt.Sprintf("[%s/%d]", f.Node, f.Rank)
	}
	if local && !f.Lost {
		prefix = fmt.Sprintf("[%d]", f.Rank)
		if !f.Hung {
			what = fmt.Sprintf("rank %d exited with code %d", f.Rank, f.Code)
			if f.Signal != "" {
				what = fmt.Sprintf("rank %d was killed by %s", f.Rank, f.Signal)
			}
		}
	}
	switch {
	case f.Lost:
		fmt.Fprintf(w, "gptui run: node %s was lost: %s\n", f.Node, f.Msg)
	case len(f.Tail) == 0:
		fmt.Fprintf(w, "gptui run: %s without printing anything\n", what)
	default:
		fmt.Fprintf(w, "gptui run: %s; its last lines:\n", what)
	}
	for _, line := range f.Tail {
		fmt.Fprintf(w, "%s %s\n", prefix, line)
	}
}
