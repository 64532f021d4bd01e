package cluster

import (
	"context"
	"fmt"
	"path"
	"sync"
	"time"

	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/units"
)

// Bounds of the replica copies: one copy, how long the end of a job waits
// for the copy in flight, and how often and how long the replicator looks
// again for a node's part of a checkpoint that another node has reported
// saved before this one's part shows (replicate).
const (
	replicaTimeout = 10 * time.Minute
	replicaEndWait = 2 * time.Minute
	replicaRetry   = 500 * time.Millisecond
	replicaRetries = 60
)

// replicator keeps each new checkpoint of a running job on
// Engine.save_load.replicas nodes: after a worker reports a save, it copies
// the newest checkpoint of the saving node to the next replicas-1 nodes in
// inventory order, through the launcher (copyCheckpoint), one copy at a
// time, in the background. A save reported while a copy runs is taken up
// after it; of several, only the newest. Each copy is a checkpoint event
// on the receiving node: CheckpointReplicated, or CheckpointReplicaFailed.
//
// A save is reported by one rank, as soon as it has committed it; the
// nodes' listings of their checkpoints (summaries) may show it, the
// saving node's included, a moment later, and a node may already list its
// part of a newer one (the replicator then asks it for its part of the
// reported one). While some node's newest
// checkpoint is older than the one reported, the replicator looks again
// every replicaRetry, replicaRetries times for that step, copying what
// has shown.
type replicator struct {
	j        *Job
	nodes    []*node
	replicas int

	ctx    context.Context
	cancel context.CancelFunc
	wake   chan save // buffered, newest wins
	done   chan struct{}

	mu      sync.Mutex
	closed  bool // wake is closed: no more retries
	step    int  // the step the retries are for
	retries int  // looks again so far for step
}

// save is a checkpoint a node reported saved: the node, and the step.
type save struct{ node, step int }

// newReplicator starts a replicator for the job's nodes, or returns nil
// when each checkpoint is to be kept on one node only.
func newReplicator(j *Job, nodes []*node) *replicator {
	n := min(j.opts.Config.Engine.SaveLoad.Replicas, len(nodes))
	if n <= 1 {
		return nil
	}
	r := &replicator{j: j, nodes: nodes, replicas: n, wake: make(chan save, 1), done: make(chan struct{})}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	go r.loop()
	return r
}

// saved tells r that node src saved the checkpoint of step.
func (r *replicator) saved(src, step int) {
	if r == nil {
		return
	}
	for {
		select {
		case r.wake <- save{src, step}:
			return
		default:
			select { // replace the older pending request
			case <-r.wake:
			default:
			}
		}
	}
}

// close finishes the copy in flight (for at most replicaEndWait; with
// abort, not at all) and the one pending, and stops r.
func (r *replicator) close(abort bool) {
	if r == nil {
		return
	}
	if abort {
		r.cancel()
	}
	r.mu.Lock()
	r.closed = true
	close(r.wake)
	r.mu.Unlock()
	t := time.AfterFunc(replicaEndWait, r.cancel)
	<-r.done
	t.Stop()
	r.cancel()
}

func (r *replicator) loop() {
	defer close(r.done)
	for s := range r.wake {
		if r.ctx.Err() != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(r.ctx, replicaTimeout)
		if r.replicate(ctx, s) {
			r.again(s)
		}
		cancel()
	}
}

// again asks for s to be replicated once more after replicaRetry, unless
// that has been asked replicaRetries times for its step or r is closing.
func (r *replicator) again(s save) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.step != s.step {
		r.step, r.retries = s.step, 0
	}
	if r.retries >= replicaRetries {
		return
	}
	r.retries++
	time.AfterFunc(replicaRetry, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if !r.closed {
			select {
			case r.wake <- s:
			default: // a newer save is pending: it replicates as much
			}
		}
	})
}

// replicate keeps the newest checkpoint, which node src reported saved,
// on replicas nodes: each node's part of it (the files it holds: its own
// ranks', or all of them where one rank wrote them) is copied to the
// replicas-1 nodes after it, each getting the files it does not hold
// verified, so that a node's part survives the node. The copies into one
// node run one after another (each merges into its part). It reports
// whether some node's newest checkpoint is still older than s's step (its
// part of it not yet there to copy).
func (r *replicator) replicate(ctx context.Context, s save) (lag bool) {
	sl := r.j.opts.Config.Engine.SaveLoad
	src := s.node
	all, err := r.j.summaries(ctx, r.nodes, sl.OutputDir)
	if err != nil {
		r.j.checkpointEvent(r.nodes[src].name, event.CheckpointReplicaFailed, nil, "no replica made: "+err.Error())
		return false
	}
	for _, part := range all {
		lag = lag || part.Step < s.step
	}
	want := all[src]
	if want.Step < 0 {
		return lag
	}
	// A node already past want's step (its part of a newer checkpoint
	// written, the others' not yet: a job stopped mid-save) still holds
	// its part of want's: that is the part to copy.
	for i, part := range all {
		if part.Step > want.Step {
			if s, err := summary(ctx, r.nodes[i], sl.OutputDir, want.Step, sl.Run); err == nil && s.Step == want.Step {
				all[i] = s
			}
		}
	}
	same := func(s checkpoint.Summary) bool { return s.Step == want.Step && s.Manifest == want.Manifest }
	type copyJob struct {
		from  int
		files []string
	}
	into := make(map[int][]copyJob) // by receiving node
	for from, part := range all {
		if !same(part) {
			continue
		}
		for k := 1; k < r.replicas; k++ {
			dst := (from + k) % len(r.nodes)
			var files []string
			for _, f := range part.Files[1:] {
				if !same(all[dst]) || !all[dst].Holds(f) {
					files = append(files, f)
				}
			}
			if len(files) > 0 {
				into[dst] = append(into[dst], copyJob{from, files})
			}
		}
	}
	var wg sync.WaitGroup
	for dst, jobs := range into {
		wg.Go(func() {
			for _, cj := range jobs {
				part := all[cj.from]
				t0 := time.Now()
				c := &event.Checkpoint{Step: want.Step, Dir: path.Join(sl.OutputDir, want.Name), From: r.nodes[cj.from].name, Run: want.Run}
				what := fmt.Sprintf("checkpoint %s from %s", c.Dir, c.From)
				if len(cj.files) < len(want.Files)-1+len(want.Missing) {
					what = fmt.Sprintf("%s's part of checkpoint %s (%d %s)", c.From, c.Dir, len(cj.files), units.Plural(len(cj.files), "file"))
				}
				if err := copyCheckpoint(ctx, r.nodes[cj.from], r.nodes[dst], sl.OutputDir, part, cj.files, sl.KeepLast); err != nil {
					r.j.checkpointEvent(r.nodes[dst].name, event.CheckpointReplicaFailed, c, "no replica of "+what+": "+err.Error())
					continue
				}
				r.j.checkpointEvent(r.nodes[dst].name, event.CheckpointReplicated, c, fmt.Sprintf("replica of %s in %.1f s", what, time.Since(t0).Seconds()))
			}
		})
	}
	wg.Wait()
	return lag
}
