package main

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/jobdir"
)

// TestSpecOfFlags: a job's spec gives back the flags, config and
// overrides it was made of; with Resume, resuming from the newest
// checkpoint.
func TestSpecOfFlags(t *testing.T) {
	for _, cf := range []clusterFlags{
		{nproc: 4, port: 29500, show: "all", summaryEvery: 3 * time.Second, keepJobs: 2},
		{hosts: "hosts.txt", rankTable: "rt.json", acceptNew: true, show: "0,1", summaryEvery: 10 * time.Second, keepJobs: -1,
			agentTimeout: 5 * time.Second, hangTimeout: 7 * time.Second, restarts: cluster.Restarts{Max: 3, MinNodes: 1, MaxNodes: 2}, nproc: 1},
	} {
		o := []string{"Engine.max_steps=10"}
		back, c, bo := flagsOf(specOf(cf, "tiny", o))
		if !reflect.DeepEqual(back, cf) || c != "tiny" || !reflect.DeepEqual(bo, o) {
			t.Errorf("%+v: back %+v, %q, %q", cf, back, c, bo)
		}
		s := specOf(cf, "tiny", o)
		s.Resume = true
		if _, _, bo := flagsOf(s); bo[len(bo)-1] != "Engine.save_load.ckpt_dir=auto" {
			t.Errorf("resume: overrides %q", bo)
		}
	}
}

func TestAge(t *testing.T) {
	for d, want := range map[time.Duration]string{
		42 * time.Second: "42s", 12*time.Minute + 5*time.Second: "12m", 3*time.Hour + 5*time.Minute: "3h05m", 50 * time.Hour: "2d02h",
	} {
		if got := age(d); got != want {
			t.Errorf("age(%v) = %q, want %q", d, got, want)
		}
	}
}

// TestJobNodes: gptui jobs lists a job's lost nodes among its nodes,
// marked lost, and counts them when the names do not fit.
func TestJobNodes(t *testing.T) {
	for _, tt := range []struct {
		nodes []string
		lost  map[string]string
		want  string
	}{
		{nil, nil, "-"},
		{[]string{"n1", "n2"}, nil, "n1,n2"},
		{[]string{"n1", "n2"}, map[string]string{"n2": "its agent has been silent for 10 s"}, "n1,n2(lost)"},
		{[]string{"n1"}, map[string]string{"n2": "connection refused"}, "n1,n2(lost)"}, // lost at its setup
		{[]string{"gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"}, map[string]string{"gpu-node-03": "lost"}, "4 nodes, 1 lost"},
		{[]string{"gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"}, nil, "4 nodes"},
	} {
		j := &jobdir.Job{Summary: jobdir.Summary{Nodes: tt.nodes, Lost: tt.lost}}
		if got := jobNodes(j); got != tt.want {
			t.Errorf("nodes %v, lost %v: %q, want %q", tt.nodes, tt.lost, got, tt.want)
		}
	}
}

// TestJobCommandsBadInput: the job commands name what is wrong in one
// line, exit 2, before touching any job.
func TestJobCommandsBadInput(t *testing.T) {
	t.Chdir(t.TempDir())
	if code, _, errs := runCLI(t, "jobs"); code != 0 || !strings.Contains(errs, "no job in jobs") {
		t.Errorf("gptui jobs with none: exit %d, %q", code, errs)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"stop"}, "stop ID: which job"},
		{[]string{"restart", "a", "b"}, "restart ID: which job"},
		{[]string{"stop", "nope"}, `"nope" is not a job id`},
		{[]string{"attach", "20261121-201141-455c59"}, "no job 20261121-201141-455c59 in jobs"},
		{[]string{"attach"}, "no job in jobs"},
		{[]string{"run", "--detach", "--dry-run", "--hosts", "h.txt", "-c", "tiny"}, "--dry-run starts nothing"},
		{[]string{"run", "--detach", "--nproc", "1", "-c", "tiny", "-o", "Model.nope=1"}, "Model.nope"},
		{[]string{jobdir.SuperviseCommand}, "the job's folder"},
	} {
		code, _, errs := runCLI(t, tt.args...)
		if code != 2 || !strings.Contains(errs, tt.want) || strings.Count(strings.TrimSpace(errs), "\n") > 0 {
			t.Errorf("%q: exit %d, %q; want 2 and one line with %q", tt.args, code, errs, tt.want)
		}
	}
}
