package planner

import (
	"fmt"
	"strings"

	"github.com/gptui/gptui/layout"
	"github.com/gptui/gptui/presets"
)

// Recompute granularities, as Engine.recompute_granularity spells them.
const (
	RecomputeNone     = "none"
	RecomputeFull     = "full"
	RecomputeOnlyAttn = "only_attn"
)

// Strategy is one way to lay a training step out over the devices.
//
// The five degrees (dp, sharding, cp, mp, pp) multiply to the number of
// devices; the replicas that train on different samples are
// DP·ShardingDegree, each with GlobalBatch/(DP·ShardingDegree) sequences
// per step in micro-batches of MicroBatch. The CP ranks of a
// context-parallel ring train on the same samples, each on 1/CP of every
// sequence's positions; SP splits the rows of the residual stream between
// the tensor-parallel regions over the MP ranks (meaningful only with MP
// > 1).
type Strategy struct {
	DP             int    `json:"dp"`
	ShardingDegree int    `json:"sharding_degree"`
	ShardingStage  int    `json:"sharding_stage"` // 1, 2 or 3; 1 when ShardingDegree is 1
	MP             int    `json:"mp"`
	SP             bool   `json:"sequence_parallel"` // sequence parallelism in the tensor-parallel group; false when MP is 1
	CP             int    `json:"cp"`                // context-parallel degree
	PP             int    `json:"pp"`
	VPP            int    `json:"vpp"` // virtual stages per pipeline rank; > 1 is interleaved 1F1B
	MicroBatch     int    `json:"micro_batch_size"`
	Recompute      string `json:"recompute"` // RecomputeNone, RecomputeFull or RecomputeOnlyAttn
}

// layout is s as the layout rule reads it.
func (s Strategy) layout() layout.Layout {
	sched := "1f1b"
	if s.VPP > 1 {
		sched = "interleaved"
	}
	return layout.Layout{DP: s.DP, Sharding: s.ShardingDegree, MP: s.MP, PP: s.PP, VPP: s.VPP, Stage: s.ShardingStage, Schedule: sched,
		SP: s.SP, CP: s.CP}
}

// batch is m's global batch in s's micro-batches (the local batch derived).
func (s Strategy) batch(m Model) layout.Batch {
	return layout.Batch{Global: m.GlobalBatch, Micro: s.MicroBatch, Seq: m.SeqLen}
}

// Devices is the number of devices the strategy uses.
func (s Strategy) Devices() int { return s.DP * s.ShardingDegree * s.cp() * s.MP * s.PP }

// cp is the context-parallel degree, 1 when CP is unset.
func (s Strategy) cp() int { return max(s.CP, 1) }

// Replicas is the number of ranks that train on different samples.
func (s Strategy) Replicas() int { return s.DP * s.ShardingDegree }

// Schedule names the pipeline schedule: "" without a pipeline, "1F1B" or
// "interleaved".
func (s Strategy) Schedule() string {
	switch {
	case s.PP <= 1:
		return ""
	case s.VPP > 1:
		return "interleaved"
	}
	return "1F1B"
}

// String is a compact description such as "dp2 sharding4/s2 mp2 pp4v2 mb1
// full" or "mp2 sp cp2 pp2 mb1 full": sp after the tensor-parallel degree
// it splits the rows of, then the context-parallel degree.
func (s Strategy) String() string {
	var parts []string
	if s.DP > 1 {
		parts = append(parts, fmt.Sprintf("dp%d", s.DP))
	}
	if s.ShardingDegree > 1 {
		parts = append(parts, fmt.Sprintf("sharding%d/s%d", s.ShardingDegree, s.ShardingStage))
	}
	if s.MP > 1 {
		parts = append(parts, fmt.Sprintf("mp%d", s.MP))
		if s.SP {
			parts = append(parts, "sp")
		}
	}
	if s.CP > 1 {
		parts = append(parts, fmt.Sprintf("cp%d", s.CP))
	}
	if s.PP > 1 {
		p := fmt.Sprintf("pp%d", s.PP)
		if s.VPP > 1 {
			p += fmt.Sprintf("v%d", s.VPP)
		}
		parts = append(parts, p)
	}
	if len(parts) == 0 {
		parts = append(parts, "single")
	}
	parts = append(parts, fmt.Sprintf("mb%d", s.MicroBatch))
	if s.Recompute != RecomputeNone && s.Recompute != "" {
		parts = append(parts, s.Recompute)
	}
	return strings.Join(parts, " ")
}

// normalize fills zero fields with their neutral values, and turns
// sequence parallelism off without tensor parallelism (it has no rows to
// split).
func (s Strategy) normalize() Strategy {
	for _, p := range []*int{&s.DP, &s.ShardingDegree, &s.ShardingStage, &s.MP, &s.CP, &s.PP, &s.VPP, &s.MicroBatch} {
		if *p < 1 {
			*p = 1
		}
	}
	if s.ShardingDegree == 1 {
		s.ShardingStage = 1
	}
	if s.MP == 1 {
		s.SP = false
	}
	if s.Recompute == "" {
		s.Recompute = RecomputeNone
	}
	return s
}

// StrategyOf returns the strategy cfg describes.
func StrategyOf(cfg *presets.Config) Strategy {
	d, e := cfg.Distributed, cfg.Engine
	rc := RecomputeNone
	if e.UseRecompute {
		rc = e.RecomputeGranularity
	}
	return Strategy{DP: d.DPDegree, ShardingDegree: d.Sharding.ShardingDegree, ShardingStage: d.Sharding.ShardingStage,
		MP: d.MPDegree, SP: d.SequenceParallel, CP: d.CPDegree, PP: d.PPDegree, VPP: d.VPPDegree, MicroBatch: cfg.Global.MicroBatchSize, Recompute: rc}.normalize()
}

// Overrides returns the "-o" overrides that make a config of global batch
// globalBatch run s: the degrees, sequence parallelism, the local and
// micro-batch sizes and the recompute setting.
func Overrides(s Strategy, globalBatch int) []string {
	s = s.normalize()
	o := []string{
		fmt.Sprintf("Distributed.dp_degree=%d", s.DP),
		fmt.Sprintf("Distributed.mp_degree=%d", s.MP),
		fmt.Sprintf("Distributed.sequence_parallel=%v", s.SP),
		fmt.Sprintf("Distributed.cp_degree=%d", s.CP),
		fmt.Sprintf("Distributed.pp_degree=%d", s.PP),
		fmt.Sprintf("Distributed.vpp_degree=%d", s.VPP),
		fmt.Sprintf("Distributed.sharding.sharding_degree=%d", s.ShardingDegree),
		fmt.Sprintf("Distributed.sharding.sharding_stage=%d", s.ShardingStage),
		fmt.Sprintf("Global.global_batch_size=%d", globalBatch),
		fmt.Sprintf("Global.local_batch_size=%d", globalBatch/s.Replicas()),
		fmt.Sprintf("Global.micro_batch_size=%d", s.MicroBatch),
		fmt.Sprintf("Engine.use_recompute=%v", s.Recompute != RecomputeNone),
	}
	if s.Recompute != RecomputeNone {
		o = append(o, "Engine.recompute_granularity="+s.Recompute)
	}
	if s.PP > 1 {
		o = append(o, "Distributed.pp_schedule="+strings.ToLower(s.Schedule()))
	}
	return o
}
