package planner

import (
	"fmt"
	"strings"

	"github.com/gptui/gptui/badinput"
	"github.com/gptui/gptui/presets"
)

// Auto plans Distributed.auto: the fastest strategy for world CPU workers
// on one machine of device dev (what the engine runs), keeping what the
// overrides fix and the degrees the config itself sets above 1, and its
// sequence parallelism when it turns it on (semi-auto). It returns cfg with the chosen degrees, batch split and
// recompute applied, the plan chosen and every plan weighed. An impossible
// request is bad input.
func Auto(cfg *presets.Config, overrides []string, world int, dev Device) (*presets.Config, Plan, []Plan, error) {
	cl := Cluster{Nodes: 1, DevicesPerNode: world, Device: dev}
	fixed := FixedByOverrides(cfg, overrides)
	d := cfg.Distributed
	for _, kv := range []struct {
		v int
		p *int
	}{{d.DPDegree, &fixed.DP}, {d.MPDegree, &fixed.MP}, {d.CPDegree, &fixed.CP}, {d.PPDegree, &fixed.PP}, {d.Sharding.ShardingDegree, &fixed.ShardingDegree}} {
		if kv.v > 1 {
			*kv.p = kv.v
		}
	}
	if d.SequenceParallel && fixed.SP == nil {
		sp := true // the config's own choice, kept with its mp_degree (> 1: the config's rule)
		fixed.SP = &sp
	}
	m := ModelOf(cfg)
	plans, err := Search(m, cl, Options{Fixed: fixed, Caps: EngineCapabilities()})
	if err != nil {
		return nil, Plan{}, nil, badinput.Wrap(fmt.Errorf("Distributed.auto: %w", err))
	}
	best, ok := Best(plans)
	if !ok {
		return nil, Plan{}, plans, badinput.Wrap(fmt.Errorf("Distributed.auto: no strategy for %d worker(s) fits (best rejected: %s: %s); lower the batch or the model, or add workers",
			world, plans[0].Strategy, plans[0].Reason))
	}
	out, err := Apply(cfg, best.Strategy)
	if err != nil {
		return nil, Plan{}, plans, fmt.Errorf("Distributed.auto: the chosen plan %s: %w", best.Strategy, err)
	}
	return out, best, plans, nil
}

// Apply returns cfg laid out as strategy s says: its degrees, sequence
// parallelism, sharding stage, batch split and recompute, for cfg's global
// batch.
func Apply(cfg *presets.Config, s Strategy) (*presets.Config, error) {
	s = s.normalize()
	out := *cfg
	out.Distributed.DPDegree, out.Distributed.MPDegree, out.Distributed.PPDegree = s.DP, s.MP, s.PP
	out.Distributed.CPDegree, out.Distributed.SequenceParallel = s.CP, s.SP
	out.Distributed.VPPDegree, out.Distributed.PPSchedule = s.VPP, strings.ToLower(s.Schedule())
	if s.PP == 1 {
		out.Distributed.PPSchedule = cfg.Distributed.PPSchedule
	}
	out.Distributed.Sharding.ShardingDegree, out.Distributed.Sharding.ShardingStage = s.ShardingDegree, s.ShardingStage
	out.Global.LocalBatchSize = ModelOf(cfg).GlobalBatch / s.Replicas()
	out.Global.MicroBatchSize = s.MicroBatch
	out.Engine.UseRecompute = s.Recompute != RecomputeNone
	if out.Engine.UseRecompute {
		out.Engine.RecomputeGranularity = s.Recompute
	}
	if err := out.Validate(); err != nil {
		return nil, err
	}
	return &out, nil
}

// Rejected counts the infeasible plans.
func Rejected(plans []Plan) int {
	n := 0
	for _, p := range plans {
		if !p.Feasible {
			n++
		}
	}
	return n
}
