package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/jobdir"
)

// cmdJobs implements 'gptui jobs': the jobs started from this directory
// (jobs/<id>/), oldest first, with their state, steps done, loss, nodes
// and age.
func cmdJobs(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("jobs", stderr)
	if err := parse(fs, args); err != nil {
		return err
	}
	jobs, err := jobdir.List(".")
	if err != nil {
		return err
	}
	if len(jobs) == 0 {
		fmt.Fprintf(stderr, "gptui: no job in %s: 'gptui run --detach' or the UI starts one\n", jobdir.Root)
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tSTEPS\tLOSS\tNODES\tAGE\t")
	now := time.Now()
	for _, j := range jobs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", j.ID, j.State(), jobStep(j), jobLoss(j), jobNodes(j), age(now.Sub(j.Spec.Created)))
	}
	return tw.Flush()
}

// jobStep is the steps a job has completed of its total
// (jobdir.Summary.Done), "-" before it has completed or resumed from any.
func jobStep(j *jobdir.Job) string {
	s := j.Summary
	if s.Done == 0 {
		return fmt.Sprintf("-/%d", s.MaxSteps)
	}
	return fmt.Sprintf("%d/%d", s.Done, s.MaxSteps)
}

func jobLoss(j *jobdir.Job) string {
	if j.Summary.Loss == 0 {
		return "-"
	}
	return fmt.Sprintf("%.4f", j.Summary.Loss)
}

// jobNodes is a job's nodes, a lost one marked so: their names if short
// ("node1,node2(lost)"), else how many ("12 nodes, 1 lost"). Why a node
// was lost is in the job's summary.json and on attach's dashboard.
func jobNodes(j *jobdir.Job) string {
	n, lost := j.Summary.Nodes, j.Summary.Lost
	for _, name := range slices.Sorted(maps.Keys(lost)) {
		if !slices.Contains(n, name) {
			n = append(slices.Clone(n), name) // lost before it was ready
		}
	}
	names := make([]string, len(n))
	for i, name := range n {
		names[i] = name
		if _, ok := lost[name]; ok {
			names[i] += "(lost)"
		}
	}
	switch s := strings.Join(names, ","); {
	case len(n) == 0:
		return "-"
	case len(s) <= 40:
		return s
	case len(lost) > 0:
		return fmt.Sprintf("%d nodes, %d lost", len(n), len(lost))
	default:
		return fmt.Sprintf("%d nodes", len(n))
	}
}

// age formats d as "45s", "12m", "3h05m" or "4d03h".
func age(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

// jobArg parses the job id of a command that takes one (optional: the
// newest when none is given).
func jobArg(name string, pos []string, optional bool) (*jobdir.Job, error) {
	if len(pos) > 1 || len(pos) == 0 && !optional {
		return nil, usagef("%s ID: which job ('gptui jobs' lists them)", name)
	}
	id := ""
	if len(pos) == 1 {
		id = pos[0]
	}
	j, err := jobdir.Find(".", id)
	if err != nil {
		return nil, usageError{fmt.Errorf("%s: %w", name, err)}
	}
	return j, nil
}

// eventsSize is the size of a job's event log: where what is written
// next begins.
func eventsSize(j *jobdir.Job) int64 {
	fi, err := os.Stat(filepath.Join(j.Dir, jobdir.EventsFile))
	if err != nil {
		return 0
	}
	return fi.Size()
}

// cmdStop implements 'gptui stop ID': through the job's control socket,
// the stop of the UI's s — the workers save their finished steps and
// exit — then it waits for the job's end and says where its newest
// checkpoint is.
func cmdStop(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("stop", stderr)
	wait := fs.Duration("wait", cluster.InterruptTimeout+10*time.Second, "how long to wait for the job's end (0: return at once)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	j, err := jobArg("stop", pos, false)
	if err != nil {
		return err
	}
	if !j.Alive {
		return fmt.Errorf("stop: job %s is not running (%s)", j.ID, j.State())
	}
	from := eventsSize(j)
	if err := jobdir.Call(j.Supervisor.Socket, jobdir.OpStop); err != nil {
		return fmt.Errorf("stop: job %s: %w", j.ID, err)
	}
	fmt.Fprintf(stderr, "gptui: stopping job %s: its workers save their finished steps and exit\n", j.ID)
	if *wait <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, *wait)
	defer cancel()
	var end *event.Event
	for e := range jobdir.Follow(ctx, j.Dir, from) {
		if e.Ends() {
			end = &e
		}
	}
	if end == nil {
		return fmt.Errorf("stop: job %s has not ended after %v", j.ID, *wait)
	}
	if j, err = jobdir.Read(j.Dir); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "job %s %s\n", j.ID, end.State)
	if ck := j.Summary.Checkpoint; ck != nil {
		fmt.Fprintf(stdout, "the newest checkpoint: %s:%s (step %d)\n", j.Summary.CheckpointNode, ck.Dir, ck.Step)
	} else {
		fmt.Fprintln(stdout, "no checkpoint was saved")
	}
	if end.State == event.JobFailed {
		return fmt.Errorf("stop: job %s failed: %s", j.ID, end.Message)
	}
	return nil
}

// cmdRestart implements 'gptui restart ID': a running job's gang is
// stopped with a checkpoint and started again from it (its control
// socket); an ended job gets a new supervisor that resumes it from its
// newest checkpoint, writing on in the same folder and event log.
func cmdRestart(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("restart", stderr)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	j, err := jobArg("restart", pos, false)
	if err != nil {
		return err
	}
	if j.Alive {
		if err := jobdir.Call(j.Supervisor.Socket, jobdir.OpRestart); err != nil {
			return fmt.Errorf("restart: job %s: %w", j.ID, err)
		}
		fmt.Fprintf(stderr, "gptui: job %s restarts from its newest checkpoint\n", j.ID)
		fmt.Fprintln(stdout, j.ID)
		return nil
	}
	if err := restartEnded(j); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	fmt.Fprintf(stderr, "gptui: job %s resumes from its newest checkpoint (it was %s)\n", j.ID, j.State())
	fmt.Fprintln(stdout, j.ID)
	return nil
}

// restartEnded starts a new supervisor for the ended job j, resuming it
// from its newest checkpoint: one of its own run, where it saved any, not
// another run's in the same output_dir.
//
// The restart holds the job's claim (jobdir.TakeClaim) from before it reads
// the job again until its supervisor has the claim: of two restarts at the
// same instant, the second is refused naming the first.
func restartEnded(j *jobdir.Job) error {
	c, err := jobdir.TakeClaim(j.Dir)
	if err != nil {
		return err
	}
	defer c.Release()
	if j, err = jobdir.Read(j.Dir); err != nil {
		return err
	}
	if j.Alive {
		return fmt.Errorf("job %s is running (its supervisor: pid %d, started by another restart)", j.ID, j.Supervisor.PID)
	}
	spec := j.Spec
	spec.Resume = true
	if c := j.Summary.Checkpoint; c != nil && c.Run != "" {
		spec.Overrides = append(slices.DeleteFunc(slices.Clone(spec.Overrides), func(o string) bool {
			return strings.HasPrefix(o, "Engine.save_load.run=")
		}), "Engine.save_load.run="+c.Run)
	}
	if err := jobdir.WriteSpec(j.Dir, spec); err != nil {
		return err
	}
	_, err = c.Launch("")
	return err
}
