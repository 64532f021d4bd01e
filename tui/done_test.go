package tui

import (
	"fmt"
	"testing"
	"time"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/jobdir"
)

// TestDoneAgreesWithJobs: the dashboard's header and `gptui jobs` (the job
// folder's summary, jobdir.Summary) say the same steps done, of the same
// total, from the same events, at every state of a job: running, a
// restart before and after its attempt's first step, stopped, failed,
// done.
func TestDoneAgreesWithJobs(t *testing.T) {
	t.Chdir(t.TempDir())
	const ranks, total = 2, 30
	over := []string{"Distributed.dp_degree=2", "Global.local_batch_size=1", "Global.micro_batch_size=1", "Global.global_batch_size=2", fmt.Sprintf("Engine.max_steps=%d", total)}
	for _, end := range []string{event.JobStopped, event.JobFailed, event.JobDone} {
		t.Run(end, func(t *testing.T) {
			m := launchedJob(t, ranks, over, 0, 140, 40)
			sum := jobdir.NewSummary(total, t0)
			send := func(evs ...event.Event) {
				for _, e := range evs {
					sum.Add(e)
				}
				feed(m, evs...)
			}
			check := func(what string, sec float64) {
				t.Helper()
				m.Update(tickMsg(t0.Add(time.Duration(sec * float64(time.Second)))))
				if got, want := headerStepOf(m.Render()), sum.Done; got != want || sum.MaxSteps != total {
					t.Errorf("%s: the dashboard shows %d steps done, jobs %d/%d:\n%s", what, got, want, sum.MaxSteps, m.Render())
				}
			}
			workers := func(sec float64, state string) {
				for r := range ranks {
					send(ev(event.KindWorker, sec, func(e *event.Event) {
						e.Node, e.Rank, e.State = "localhost", r, state
						e.Proc = &event.Proc{PID: 4200 + r}
					}))
				}
			}
			steps := func(from, to int, sec float64) float64 {
				for s := from; s < to; s++ {
					sec++
					for r := range ranks {
						send(ev(event.KindMetrics, sec, func(e *event.Event) {
							e.Node, e.Rank = "localhost", r
							e.Metrics = &event.Metrics{Step: s, Loss: 5, StepTimeS: 0.25, TokensPerS: 1000}
						}))
					}
				}
				return sec
			}
			send(ev(event.KindJob, 0, func(e *event.Event) { e.State = event.JobStarted }))
			workers(0.5, event.WorkerRunning)
			sec := steps(0, 12, 1)
			check("running, 12 steps", sec)
			send(ev(event.KindCheckpoint, sec, func(e *event.Event) {
				e.Node, e.Rank, e.State, e.Checkpoint = "localhost", 0, event.CheckpointSaved, &event.Checkpoint{Step: 10, Dir: "output/step_00000010"}
			}))
			workers(sec+0.5, event.WorkerFailed)
			send(ev(event.KindJob, sec+1, func(e *event.Event) {
				e.State = event.JobRestarting
				e.Restart = &event.Restart{Count: 1, Max: 2, Cause: "rank 1 was killed by SIGKILL", Step: 10}
			}), ev(event.KindJob, sec+2, func(e *event.Event) { e.State = event.JobStarted }))
			workers(sec+2.5, event.WorkerRunning)
			check("restarted from step 10, before its first step", sec+3)
			sec = steps(10, 20, sec+3)
			check("restarted, 20 steps", sec)
			if end == event.JobDone {
				sec = steps(20, total, sec)
				workers(sec+0.5, event.WorkerExited)
			} else {
				workers(sec+0.5, event.WorkerStopped)
			}
			send(ev(event.KindJob, sec+1, func(e *event.Event) { e.State, e.Rank = end, -1 }))
			m.Update(eventsMsg{stream: m.jobN, closed: true})
			check(end, sec+2)
		})
	}
}
