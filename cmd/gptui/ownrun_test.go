package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gptui/gptui/jobdir"
)

// TestRestartResumesOwnRun: a folder holds an earlier run's step 10; a job
// started there with --force saves steps 2, 4, … and is stopped; 'gptui
// restart ID' resumes it from its own newest checkpoint, never from the
// earlier run's later step 10 (issue 30: a restarted job loaded an earlier
// run's step_00000200 and failed on its schedule).
func TestRestartResumesOwnRun(t *testing.T) {
	long(t)
	t.Parallel() // the job runs in processes of its own
	dir, exe := t.TempDir(), ownGPTUI(t)
	env := []string{"GPTUI_THREADS=1"}
	common := []string{"-c", "tiny", "-o", "Engine.eval_freq=0", "-o", "Engine.logging_freq=1", "-o", "Data.Train.dataset.max_seq_len=16",
		"-o", "Global.global_batch_size=2", "-o", "Global.local_batch_size=2", "-o", "Global.micro_batch_size=2"}
	if code, out, errs := gptuiIn(t, exe, dir, env, append([]string{"run", "--no-tui", "--nproc", "1", "-o", "Engine.max_steps=10", "-o", "Engine.save_load.save_steps=10"}, common...)...); code != 0 {
		t.Fatalf("the earlier run: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs := gptuiIn(t, exe, dir, env, append([]string{"run", "--detach", "--force", "--nproc", "1", "-o", "Engine.max_steps=100000", "-o", "Engine.save_load.save_steps=2"}, common...)...)
	id := strings.TrimSpace(out)
	if code != 0 || !jobIDRE.MatchString(id) {
		t.Fatalf("run --detach --force: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	// Stop it once it has saved step 4 (or later).
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		j, err := jobdir.Read(jobdir.Path(dir, id))
		if err == nil && j.Summary.Checkpoint != nil && j.Summary.Checkpoint.Step >= 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s saved no step 4 in 60 s", id)
		}
	}
	if code, out, errs := gptuiIn(t, exe, dir, env, "stop", id); code != 0 {
		t.Fatalf("stop: exit %d\n%s%s", code, out, errs)
	}
	j, err := jobdir.Read(jobdir.Path(dir, id))
	if err != nil {
		t.Fatal(err)
	}
	own := j.Summary.Checkpoint.Step
	if own >= 10 {
		t.Fatalf("the job saved step %d before its stop: the test wants it below the earlier run's 10", own)
	}
	if code, out, errs := gptuiIn(t, exe, dir, env, "restart", id); code != 0 || strings.TrimSpace(out) != id {
		t.Fatalf("restart: exit %d\n%s%s", code, out, errs)
	}
	// Rank 0's log says where it resumed from.
	resumed := regexp.MustCompile(`\[checkpoint\] resumed from output/step_(\d+) at step (\d+)`)
	var m []string
	for deadline := time.Now().Add(60 * time.Second); m == nil; time.Sleep(100 * time.Millisecond) {
		b, _ := os.ReadFile(filepath.Join(dir, "log", "workerlog.0"))
		if all := resumed.FindAllStringSubmatch(string(b), -1); len(all) > 0 {
			m = all[len(all)-1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no resume in workerlog.0 60 s after the restart:\n%s", b)
		}
	}
	if step, _ := strconv.Atoi(m[2]); step != own {
		t.Errorf("the restart resumed from step_%s at step %s; want the job's own newest, step %d, not the earlier run's 10", m[1], m[2], own)
	}
	if code, out, errs := gptuiIn(t, exe, dir, env, "stop", id); code != 0 {
		t.Errorf("the final stop: exit %d\n%s%s", code, out, errs)
	}
}
