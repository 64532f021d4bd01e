package engine

import (
	"fmt"

	"github.com/gptui/gptui/layout"
)

// Topology is one rank's place in the parallel layout.
//
// The world is a dp × pp × sharding × cp × mp grid, with tensor parallel
// innermost so that a tensor-parallel group stays inside a node, context
// parallel next to it (its ring passes keys and values in every layer),
// and data parallel outermost (Paddle's hybrid order):
//
//	rank = (((dp_index · pp + pp_index) · sharding + shard_index) · cp + cp_index) · mp + mp_index
//
// Ranks that differ only in dp_index and shard_index hold the same part of
// the model and train on different samples: there are dp · sharding such
// replicas, the data index of a rank is dp_index · sharding + shard_index,
// and the global batch is local_batch_size · dp · sharding. Among them, the
// ranks with the same dp_index form a sharding group (they split the
// optimizer state, from stage 2 the gradients), and the ranks with the same
// shard_index a dp group. Ranks that differ only in mp_index form a
// tensor-parallel group, only in pp_index a pipeline, only in cp_index a
// context-parallel ring: they hold the same part of the model and train
// on the same samples, each on its chunks of every sequence, so their
// gradients are summed with the replicas' (replicaGroup and dpGroup take
// them in) while the sharding group stays within one cp_index.
type Topology struct {
	Rank, World int
	DP          int // dp_degree
	Sharding    int // sharding_degree
	Stage       int // sharding_stage: 1 optimizer state, 2 + gradients, 3 + parameters (0 without sharding)
	MP          int // mp_degree
	CP          int // cp_degree
	PP          int // pp_degree
	VPP         int // virtual stages (model chunks) per pipeline rank
	Schedule    string
	SP          bool // sequence parallelism inside the tensor-parallel group

	DPIndex, ShardIndex, PPIndex, MPIndex, CPIndex int
}

// NewTopology checks layout l and batch b against the world size and the
// model (the one rule, [layout.Check]) and places rank in the grid.
func NewTopology(l layout.Layout, b layout.Batch, cfg ModelConfig, rank, world int) (Topology, error) {
	if p := layout.Check(cfg.Shape, l, b); p != nil {
		return Topology{}, &ConfigError{Err: p}
	}
	s, dp, mp, pp, vpp, cp := l.Sharding, l.DP, l.MP, l.PP, l.VPP, l.CPDegree()
	if n := l.Ranks(); n != world {
		cps := ""
		if cp > 1 {
			cps = fmt.Sprintf(" × cp_degree %d", cp)
		}
		return Topology{}, &ConfigError{Msg: fmt.Sprintf("Distributed: dp_degree %d × sharding_degree %d × mp_degree %d × pp_degree %d%s = %d ranks, but the job has %d process(es); start them with `gptui run --no-tui --nproc %d` or change the degrees", dp, s, mp, pp, cps, n, world, n)}
	}
	sched := l.Schedule
	if sched == "" || sched == "interleaved" && vpp == 1 {
		sched = "1f1b" // one chunk per rank: interleaving is 1F1B
	}
	stage := l.Stage
	if s == 1 {
		stage = 0
	}
	if rank < 0 || rank >= world {
		return Topology{}, fmt.Errorf("rank %d outside a world of %d", rank, world)
	}
	t := Topology{Rank: rank, World: world, DP: dp, Sharding: s, Stage: stage, MP: mp, CP: cp, PP: pp, VPP: vpp, Schedule: sched, SP: l.SP}
	t.MPIndex = rank % mp
	t.CPIndex = rank / mp % cp
	t.ShardIndex = rank / (mp * cp) % s
	t.PPIndex = rank / (mp * cp * s) % pp
	t.DPIndex = rank / (mp * cp * s * pp)
	return t, nil
}

// Replicas is the number of ranks that train on different samples.
func (t Topology) Replicas() int { return t.DP * t.Sharding }

// DataIndex is this rank's place among the replicas.
func (t Topology) DataIndex() int { return t.DPIndex*t.Sharding + t.ShardIndex }

// rankOf is the world rank at the given grid coordinates and this rank's
// cp_index.
func (t Topology) rankOf(dp, pp, shard, mp int) int { return t.rankAt(dp, pp, shard, t.CPIndex, mp) }

// rankAt is the world rank at the given grid coordinates.
func (t Topology) rankAt(dp, pp, shard, cp, mp int) int {
	return (((dp*t.PP+pp)*t.Sharding+shard)*t.CP+cp)*t.MP + mp
}

// group lists at(0) … at(n−1): the world ranks of a group, ascending.
func (t Topology) group(n int, at func(i int) int) []int {
	r := make([]int, n)
	for i := range r {
		r[i] = at(i)
	}
	return r
}

// replicaGroup lists the ranks holding the same part of the model as this
// one: every data index, and every cp_index of each.
func (t Topology) replicaGroup() []int {
	r := make([]int, 0, t.Replicas()*t.CP)
	for dp := 0; dp < t.DP; dp++ {
		for s := 0; s < t.Sharding; s++ {
			for cp := 0; cp < t.CP; cp++ {
				r = append(r, t.rankAt(dp, t.PPIndex, s, cp, t.MPIndex))
			}
		}
	}
	return r
}

// shardGroup lists the world ranks of this rank's sharding group.
func (t Topology) shardGroup() []int {
	return t.group(t.Sharding, func(i int) int { return t.rankOf(t.DPIndex, t.PPIndex, i, t.MPIndex) })
}

// dpGroup lists the world ranks holding the same shard as this rank: its
// shard_index at every dp_index and cp_index.
func (t Topology) dpGroup() []int {
	return t.group(t.DP*t.CP, func(i int) int { return t.rankAt(i/t.CP, t.PPIndex, t.ShardIndex, i%t.CP, t.MPIndex) })
}

// cpGroup lists the ranks of this rank's context-parallel ring, in ring
// order.
func (t Topology) cpGroup() []int {
	return t.group(t.CP, func(i int) int { return t.rankAt(t.DPIndex, t.PPIndex, t.ShardIndex, i, t.MPIndex) })
}

// mpGroup lists the ranks of this rank's tensor-parallel group.
func (t Topology) mpGroup() []int {
	return t.group(t.MP, func(i int) int { return t.rankOf(t.DPIndex, t.PPIndex, t.ShardIndex, i) })
}

// ppGroup lists the ranks of this rank's pipeline, first stage first.
func (t Topology) ppGroup() []int {
	return t.group(t.PP, func(i int) int { return t.rankOf(t.DPIndex, i, t.ShardIndex, t.MPIndex) })
}

// modelGroup lists the ranks that together hold one whole model: this
// rank's data index, every pp and mp index.
func (t Topology) modelGroup() []int {
	r := make([]int, 0, t.PP*t.MP)
	for pp := 0; pp < t.PP; pp++ {
		for mp := 0; mp < t.MP; mp++ {
			r = append(r, t.rankOf(t.DPIndex, pp, t.ShardIndex, mp))
		}
	}
	return r
}

// part is the part of the model cfg this rank holds: its tensor-parallel
// slice, and its pipeline stage's blocks. With vpp virtual stages per rank,
// the model is cut into pp·vpp chunks of L/(pp·vpp) blocks and rank p holds
// chunks p, p+pp, p+2pp, … (Megatron's interleaved assignment).
func (t Topology) part(cfg ModelConfig) Part {
	p := partAt(cfg, t.MP, t.MPIndex, t.PP, t.VPP, t.PPIndex)
	p.SP, p.CP, p.CPRank = t.SP, t.CP, t.CPIndex
	return p
}

func partAt(cfg ModelConfig, mp, mpIndex, pp, vpp, ppIndex int) Part {
	lc := cfg.L / (pp * vpp)
	var layers []int
	for k := 0; k < vpp; k++ {
		first := (k*pp + ppIndex) * lc
		for i := 0; i < lc; i++ {
			layers = append(layers, first+i)
		}
	}
	return Part{MP: mp, MPRank: mpIndex, Layers: layers, Embed: ppIndex == 0, Head: ppIndex == pp-1}
}
