package engine

import (
	"fmt"

	"github.com/gptui/gptui/presets"
)

// Topology is one rank's place in the parallel layout.
//
// Ranks are ordered with the sharding index innermost and the data-parallel
// index outermost (tensor and pipeline parallel, when they land, go inside
// sharding, with tensor parallel innermost so that it stays inside a node):
//
//	rank = dp_index · sharding_degree + shard_index
//
// Every rank of the dp × sharding grid trains on different samples: its data
// index is its rank, and the global batch is local_batch_size · dp ·
// sharding. Ranks with the same dp_index form a sharding group (they split
// the optimizer state, and from stage 2 the gradients); ranks with the same
// shard_index form a dp group (they hold the same shard).
type Topology struct {
	Rank, World int
	DP          int // dp_degree
	Sharding    int // sharding_degree
	Stage       int // sharding_stage: 1 optimizer state, 2 + gradients
	DPIndex     int // rank / Sharding
	ShardIndex  int // rank % Sharding
}

// NewTopology checks the degrees of d against the world size and places
// rank in the grid.
func NewTopology(d presets.Distributed, rank, world int) (Topology, error) {
	if d.MPDegree > 1 || d.PPDegree > 1 {
		return Topology{}, &ConfigError{fmt.Sprintf("Distributed.mp_degree=%d pp_degree=%d: tensor and pipeline parallelism are not built yet; set both to 1", d.MPDegree, d.PPDegree)}
	}
	s := max(d.Sharding.ShardingDegree, 1)
	dp := max(d.DPDegree, 1)
	if dp*s != world {
		return Topology{}, &ConfigError{fmt.Sprintf("Distributed: dp_degree %d × sharding_degree %d = %d ranks, but the job has %d process(es); start them with `gptui run --no-tui --nproc %d` or change the degrees", dp, s, dp*s, world, dp*s)}
	}
	stage := d.Sharding.ShardingStage
	if s == 1 {
		stage = 0
	} else if stage == 3 {
		return Topology{}, &ConfigError{"Distributed.sharding.sharding_stage=3 (sharded parameters) is not built yet; use stage 1 or 2"}
	}
	if rank < 0 || rank >= world {
		return Topology{}, fmt.Errorf("rank %d outside a world of %d", rank, world)
	}
	return Topology{Rank: rank, World: world, DP: dp, Sharding: s, Stage: stage, DPIndex: rank / s, ShardIndex: rank % s}, nil
}

// Replicas is the number of ranks that train on different samples.
func (t Topology) Replicas() int { return t.DP * t.Sharding }

// shardGroup lists the world ranks of this rank's sharding group.
func (t Topology) shardGroup() []int {
	r := make([]int, t.Sharding)
	for i := range r {
		r[i] = t.DPIndex*t.Sharding + i
	}
	return r
}

// dpGroup lists the world ranks holding the same shard as this rank.
func (t Topology) dpGroup() []int {
	r := make([]int, t.DP)
	for i := range r {
		r[i] = i*t.Sharding + t.ShardIndex
	}
	return r
}

// allRanks lists every rank.
func (t Topology) allRanks() []int {
	r := make([]int, t.World)
	for i := range r {
		r[i] = i
	}
	return r
}
