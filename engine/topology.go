package engine

import (
	"fmt"

	"github.com/gptui/gptui/layout"
)

// Topology is one rank's place in the parallel layout.
//
// The world is a dp × pp × sharding × mp grid, with tensor parallel
// innermost so that a tensor-parallel group stays inside a node, and data
// parallel outermost (Paddle's hybrid order):
//
//	rank = ((dp_index · pp + pp_index) · sharding + shard_index) · mp + mp_index
//
// Ranks that differ only in dp_index and shard_index hold the same part of
// the model and train on different samples: there are dp · sharding such
// replicas, the data index of a rank is dp_index · sharding + shard_index,
// and the global batch is local_batch_size · dp · sharding. Among them, the
// ranks with the same dp_index form a sharding group (they split the
// optimizer state, from stage 2 the gradients), and the ranks with the same
// shard_index a dp group. Ranks that differ only in mp_index form a
// tensor-parallel group, only in pp_index a pipeline.
type Topology struct {
	Rank, World int
	DP          int // dp_degree
	Sharding    int // sharding_degree
	Stage       int // sharding_stage: 1 optimizer state, 2 + gradients, 3 + parameters (0 without sharding)
	MP          int // mp_degree
	PP          int // pp_degree
	VPP         int // virtual stages (model chunks) per pipeline rank
	Schedule    string
	SP          bool // sequence parallelism inside the tensor-parallel group

	DPIndex, ShardIndex, PPIndex, MPIndex int
}

// NewTopology checks layout l and batch b against the world size and the
// model (the one rule, [layout.Check]) and places rank in the grid.
func NewTopology(l layout.Layout, b layout.Batch, cfg ModelConfig, rank, world int) (Topology, error) {
	if p := layout.Check(cfg.Shape, l, b); p != nil {
		return Topology{}, &ConfigError{Err: p}
	}
	s, dp, mp, pp, vpp := l.Sharding, l.DP, l.MP, l.PP, l.VPP
	if n := dp * s * mp * pp; n != world {
		return Topology{}, &ConfigError{Msg: fmt.Sprintf("Distributed: dp_degree %d × sharding_degree %d × mp_degree %d × pp_degree %d = %d ranks, but the job has %d process(es); start them with `gptui run --no-tui --nproc %d` or change the degrees", dp, s, mp, pp, n, world, n)}
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
	t := Topology{Rank: rank, World: world, DP: dp, Sharding: s, Stage: stage, MP: mp, PP: pp, VPP: vpp, Schedule: sched, SP: l.SP}
	t.MPIndex = rank % mp
	t.ShardIndex = rank / mp % s
	t.PPIndex = rank / (mp * s) % pp
	t.DPIndex = rank / (mp * s * pp)
	return t, nil
}

// Replicas is the number of ranks that train on different samples.
func (t Topology) Replicas() int { return t.DP * t.Sharding }

// DataIndex is this rank's place among the replicas.
func (t Topology) DataIndex() int { return t.DPIndex*t.Sharding + t.ShardIndex }

// rankOf is the world rank at the given grid coordinates.
func (t Topology) rankOf(dp, pp, shard, mp int) int {
	return ((dp*t.PP+pp)*t.Sharding+shard)*t.MP + mp
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
// one: every data index.
func (t Topology) replicaGroup() []int {
	r := make([]int, 0, t.Replicas())
	for dp := 0; dp < t.DP; dp++ {
		for s := 0; s < t.Sharding; s++ {
			r = append(r, t.rankOf(dp, t.PPIndex, s, t.MPIndex))
		}
	}
	return r
}

// shardGroup lists the world ranks of this rank's sharding group.
func (t Topology) shardGroup() []int {
	return t.group(t.Sharding, func(i int) int { return t.rankOf(t.DPIndex, t.PPIndex, i, t.MPIndex) })
}

// dpGroup lists the world ranks holding the same shard as this rank.
func (t Topology) dpGroup() []int {
	return t.group(t.DP, func(i int) int { return t.rankOf(i, t.PPIndex, t.ShardIndex, t.MPIndex) })
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
	p.SP = t.SP
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
