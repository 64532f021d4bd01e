package cluster

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gptui/gptui/agent"
)

// TestSimultaneousStarts starts two jobs on the same two sshd nodes at the
// same instant, 6 times (GPTUI_RACE_TRIALS=20 for more; a plan on two
// nodes takes 0.7 s here), the second listing the nodes in the other order:
// each time exactly one job plans, and the other is refused naming it.
// (With the locks taken in parallel, each could take one node and be
// refused at the other's: both refused.)
func TestSimultaneousStarts(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: two sshd nodes, 40 plans")
	}
	tc := newCluster(t, "cpu:1")
	trials := raceTrials(t, 6)
	for trial := range trials {
		var jobs [2]*Job
		for k := range jobs {
			o := tc.options(t)
			if k == 1 {
				slices.Reverse(o.Nodes)
			}
			jobs[k] = New(o)
			go func(j *Job) {
				for range j.Events() {
				}
			}(jobs[k])
		}
		var errs [2]error
		var wg sync.WaitGroup
		for k, j := range jobs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[k] = j.Plan(context.Background())
			}()
		}
		wg.Wait()
		refused := 0
		for k, err := range errs {
			if err == nil {
				continue
			}
			refused++
			var held *agent.HeldError
			other := jobs[1-k].opts.JobID
			if !errors.As(err, &held) || held.Holder.Job != other || !strings.Contains(err.Error(), other) {
				t.Errorf("trial %d: job %d refused with %v, want the workdir held by job %s", trial, k, err, other)
			}
		}
		if refused != 1 {
			t.Fatalf("trial %d: %d of 2 simultaneous jobs refused (%v), want exactly 1", trial, refused, errs)
		}
		for _, j := range jobs {
			j.Close()
		}
		for _, wd := range tc.workdirs {
			if h, err := agent.ReadLock(wd); err != nil || h != nil {
				t.Fatalf("trial %d: %s still locked after both jobs closed: %+v, %v", trial, wd, h, err)
			}
		}
	}
}

// raceTrials is the number of trials of a race test: GPTUI_RACE_TRIALS, or
// def.
func raceTrials(t *testing.T, def int) int {
	if v := os.Getenv("GPTUI_RACE_TRIALS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("GPTUI_RACE_TRIALS=%q: want a count of trials", v)
		}
		return n
	}
	return def
}
