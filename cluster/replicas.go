package cluster

import (
	"context"
	"fmt"
	"path"
	"sync"
	"time"

	"github.com/gptui/gptui/event"
)

// Bounds of the replica copies: one copy, and how long the end of a job
// waits for the copy in flight.
const (
	replicaTimeout = 10 * time.Minute
	replicaEndWait = 2 * time.Minute
)

// replicator keeps each new checkpoint of a running job on
// Engine.save_load.replicas nodes: after a worker reports a save, it copies
// the newest checkpoint of the saving node to the next replicas-1 nodes in
// inventory order, through the launcher (copyCheckpoint), one copy at a
// time, in the background. A save reported while a copy runs is taken up
// after it; of several, only the newest. Each copy is a checkpoint event
// on the receiving node: CheckpointReplicated, or CheckpointReplicaFailed.
type replicator struct {
	j        *Job
	nodes    []*node
	replicas int

	ctx    context.Context
	cancel context.CancelFunc
	wake   chan int // the node that saved; buffered, newest wins
	done   chan struct{}
}

// newReplicator starts a replicator for the job's nodes, or returns nil
// when each checkpoint is to be kept on one node only.
func newReplicator(j *Job, nodes []*node) *replicator {
	n := min(j.opts.Config.Engine.SaveLoad.Replicas, len(nodes))
	if n <= 1 {
		return nil
	}
	r := &replicator{j: j, nodes: nodes, replicas: n, wake: make(chan int, 1), done: make(chan struct{})}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	go r.loop()
	return r
}

// saved tells r that node src saved a checkpoint.
func (r *replicator) saved(src int) {
	if r == nil {
		return
	}
	for {
		select {
		case r.wake <- src:
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
	close(r.wake)
	t := time.AfterFunc(replicaEndWait, r.cancel)
	<-r.done
	t.Stop()
	r.cancel()
}

func (r *replicator) loop() {
	defer close(r.done)
	for src := range r.wake {
		if r.ctx.Err() != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(r.ctx, replicaTimeout)
		r.replicate(ctx, src)
		cancel()
	}
}

// replicate copies the newest checkpoint of node src to the replicas-1
// nodes after it whose newest checkpoint that loads it is not.
func (r *replicator) replicate(ctx context.Context, src int) {
	sl := r.j.opts.Config.Engine.SaveLoad
	all, err := r.j.summaries(ctx, r.nodes, sl.OutputDir)
	if err != nil {
		r.j.checkpointEvent(r.nodes[src].name, event.CheckpointReplicaFailed, nil, "no replica made: "+err.Error())
		return
	}
	want := all[src]
	if want.Step < 0 {
		return
	}
	var wg sync.WaitGroup
	for k := 1; k < r.replicas; k++ {
		dst := (src + k) % len(r.nodes)
		if all[dst].Verified(want) {
			continue // its newest checkpoint that loads; one it holds damaged is replaced
		}
		wg.Go(func() {
			t0 := time.Now()
			c := &event.Checkpoint{Step: want.Step, Dir: path.Join(sl.OutputDir, want.Name), From: r.nodes[src].name}
			what := fmt.Sprintf("checkpoint %s from %s", c.Dir, c.From)
			if err := copyCheckpoint(ctx, r.nodes[src], r.nodes[dst], sl.OutputDir, want, sl.KeepLast); err != nil {
				r.j.checkpointEvent(r.nodes[dst].name, event.CheckpointReplicaFailed, c, "no replica of "+what+": "+err.Error())
				return
			}
			r.j.checkpointEvent(r.nodes[dst].name, event.CheckpointReplicated, c, fmt.Sprintf("replica of %s in %.1f s", what, time.Since(t0).Seconds()))
		})
	}
	wg.Wait()
}
