package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/jobdir"
)

// TestRestartRaceHosts: an ended job on two sshd nodes gets two 'gptui
// restart ID' at the same instant, 3 times (GPTUI_RACE_TRIALS=20 for
// more): each time one restart starts a supervisor, never two at once
// (sampled every 5 ms), and the other is refused naming the job — or,
// finding the first's supervisor running, restarts the job in place; the
// event log gains one restart for each that started; the metrics files
// stay whole (one JSON record a line).
func TestRestartRaceHosts(t *testing.T) {
	long(t)
	t.Parallel() // its processes are its own: ownGPTUI
	trials := 3
	if v := os.Getenv("GPTUI_RACE_TRIALS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("GPTUI_RACE_TRIALS=%q: want a count of trials", v)
		}
		trials = n
	}
	dir := t.TempDir()
	exe := ownGPTUI(t)
	c := newSSHCluster(t, "cpu:1")
	env := []string{"HOME=" + c.home, "SSH_AUTH_SOCK=", "GPTUI_THREADS=1"}
	args := append([]string{"run", "--detach", "--hosts", c.hosts}, small(t)...)
	args = append(args, "-o", "Distributed.dp_degree=2", "-o", "Global.local_batch_size=4", "-o", "Global.micro_batch_size=4",
		"-o", "Engine.max_steps=4", "-o", "Engine.eval_freq=0", "-o", "Engine.logging_freq=1", "-o", "Engine.save_load.save_steps=2")
	run := func(args ...string) (int, string, string) {
		cmd := exec.Command(exe, args...)
		cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		return exitStatus(err), out.String(), errb.String()
	}
	code, out, errs := run(args...)
	id := strings.TrimSpace(out)
	if code != 0 || !jobIDRE.MatchString(id) {
		t.Fatalf("run --detach: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	awaitEnded := func(what string) {
		t.Helper()
		deadline := time.Now().Add(120 * time.Second)
		for {
			j, err := jobdir.Read(jobdir.Path(dir, id))
			if err == nil && !j.Alive && j.Summary.State != "" && j.Summary.State != "running" && j.Summary.State != "restarting" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: job %s has not ended after 120 s (%+v, %v)", what, id, j, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	awaitEnded("the first run")
	restarts := func() int {
		f, err := os.Open(filepath.Join(jobdir.Path(dir, id), jobdir.EventsFile))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		n := 0
		for r := event.NewReader(f); ; {
			e, err := r.Next()
			if err != nil {
				break
			}
			if e.Kind == event.KindJob && e.State == event.JobRestarting {
				n++
			}
		}
		return n
	}
	// supervisors counts the processes supervising the job now.
	jobDir := jobdir.Path(dir, id)
	supervisors := func() int {
		return len(liveProcesses(func(proc string) bool {
			b, _ := os.ReadFile(filepath.Join(proc, "cmdline"))
			return strings.Contains(string(b), jobdir.SuperviseCommand+"\x00") && strings.Contains(string(b), jobDir)
		}))
	}
	for trial := range trials {
		before := restarts()
		var codes [2]int
		var outs, errs [2]string
		var wg sync.WaitGroup
		// Never two supervisors at once, sampled every 5 ms while the
		// restarts run and the job ends.
		most := 0
		sampling := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				most = max(most, supervisors())
				select {
				case <-sampling:
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
		}()
		for k := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				codes[k], outs[k], errs[k] = run("restart", id)
			}()
		}
		wg.Wait()
		won := 0
		for k := range 2 {
			switch {
			case codes[k] == 0 && strings.TrimSpace(outs[k]) == id:
				won++
			// Refused naming the job: its supervisor is starting or
			// running ("job ID is supervised by pid …"), or the job it
			// found running has ended meanwhile ("job ID: the job is not
			// running").
			case codes[k] != 0 && strings.Contains(errs[k], "job "+id) && outs[k] == "":
			default:
				t.Errorf("trial %d: restart %d: exit %d, stdout %q, stderr %q", trial, k, codes[k], outs[k], errs[k])
			}
		}
		// The second may find the first's supervisor running and restart
		// the job in place (one after the other, never side by side).
		if won < 1 {
			t.Fatalf("trial %d: neither of 2 simultaneous restarts started the job (%q, %q)", trial, errs[0], errs[1])
		}
		awaitEnded("trial " + strconv.Itoa(trial))
		close(sampling)
		<-sampled
		if most > 1 {
			t.Fatalf("trial %d: %d supervisors of the job ran at once", trial, most)
		}
		if n := restarts() - before; n != won {
			t.Fatalf("trial %d: the event log has %d new restarts, want %d (one a restart that started)", trial, n, won)
		}
	}
	for _, wd := range c.workdirs {
		files, err := event.MetricsFiles(filepath.Join(wd, "log"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := event.ReadMetrics(f, strings.NewReader(string(b))); err != nil {
				t.Errorf("%s: %v", f, err)
			}
		}
	}
	c.awaitGone(t, time.Now(), 10*time.Second)
}
