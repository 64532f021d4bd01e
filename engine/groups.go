package engine

import (
	"context"
	"fmt"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/kernels"
)

// groups are the communication groups of one rank of a parallel job, the
// tensor-parallel one and stage 3's held by the model's layout (Model.par:
// tensorParallel, stage3). Every rank creates its groups in the same
// order (comm.World.NamedGroup and the fabrics match them up by that
// order), so newGroups is the one place that creates them.
//
// The data path — gradients, activations, the parameters of sharding — runs
// on communicators of the fabric f, which the parallel dimensions see only
// as comm.Communicator; the control plane — the model group's checkpoint
// parts and norm scalars, the stop agreement — stays on w's TCP groups.
type groups struct {
	dp         *dataParallel // the replicas' gradients; nil for one replica
	modelGroup *comm.Group   // the ranks holding the parts of one model; nil if one holds it all
	pp         *pipeline     // nil without pipeline parallelism
	stop       *stopper      // agrees on a stop at step boundaries
	ckpt       *comm.Group   // every rank: a parallel save's token and reports; nil for one process
}

// newGroups creates the groups of m's rank at topo (w nil for one
// process): data parallel and sharding, tensor parallel (joining m's), the
// model's group, the pipeline, then the stop agreement.
func newGroups(w *comm.World, f comm.Fabric, topo Topology, m *Model, accum int, stop <-chan struct{}) (groups, error) {
	var g groups
	var err error
	if w != nil && w.Size() > 1 {
		if topo.Replicas()*topo.CP > 1 { // a context-parallel ring's gradients are summed with the replicas'
			if g.dp, err = newDataParallel(w, f, topo, m); err != nil {
				return g, err
			}
		}
		if topo.MP > 1 {
			if err := m.tp.join(f, topo, m.dims.kvCopies); err != nil {
				return g, err
			}
		}
		if topo.CP > 1 {
			if err := m.cp.join(f, topo); err != nil {
				return g, err
			}
		}
		if topo.MP*topo.PP > 1 {
			if g.modelGroup, err = w.NamedGroup("model", topo.modelGroup()); err != nil {
				return g, err
			}
		}
		if topo.PP > 1 {
			if g.pp, err = newPipeline(f, topo, m, accum); err != nil {
				return g, err
			}
		}
		// A fabric whose communicators all ranks make together (NCCL's)
		// makes them now that every rank has declared its own.
		if cf, ok := f.(comm.CollectiveFabric); ok {
			if err := cf.Ready(context.Background()); err != nil {
				return g, err
			}
		}
	}
	// Created after the others, in the same order on every rank.
	if g.stop, err = newStopper(w, stop); err != nil {
		return g, err
	}
	if w != nil && w.Size() > 1 {
		g.ckpt, err = w.WorldGroup("ckpt")
	}
	return g, err
}

// backendStream is be as the stream the TCP ring waits for before it
// touches a buffer: nil for a backend that computes synchronously.
func backendStream(be kernels.Backend) comm.Stream {
	if m, ok := be.(kernels.Memory); ok {
		return m
	}
	return nil
}

// sum64 adds the scalar x up over the members of c (a loss, a Σ g², a stop
// flag): one float64 all-reduce, its failure wrapped with what.
func sum64(ctx context.Context, c interface {
	AllReduce64(context.Context, []float64) error
}, x float64, what string) (float64, error) {
	b := []float64{x}
	if err := c.AllReduce64(ctx, b); err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return b[0], nil
}
