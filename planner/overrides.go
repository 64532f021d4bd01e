package planner

import (
	"slices"
	"strings"

	"github.com/gptui/gptui/presets"
)

// strategyKeys maps the config keys that choose a part of the strategy
// (schema spellings) to the Fixed field they set.
var strategyKeys = map[string]string{
	"Distributed.dp_degree": "dp", "Distributed.mp_degree": "mp", "Distributed.pp_degree": "pp",
	"Distributed.cp_degree": "cp", "Distributed.sequence_parallel": "sp",
	"Distributed.vpp_degree": "vpp", "Distributed.sharding.sharding_degree": "sharding",
	"Distributed.sharding.sharding_stage": "stage", "Global.micro_batch_size": "micro",
	"Engine.use_recompute": "recompute", "Engine.recompute_granularity": "recompute",
}

// overrideKey is the schema's spelling of the key of a "Section.key=value"
// override.
func overrideKey(kv string) string {
	k, _, _ := strings.Cut(kv, "=")
	return presets.CanonicalKey(strings.TrimSpace(k))
}

// ChoosesStrategy reports whether the override kv sets a part of the
// strategy: a parallel degree, the sharding stage, sequence parallelism,
// the micro-batch size or recompute (in any of the keys' spellings).
func ChoosesStrategy(kv string) bool { return strategyKeys[overrideKey(kv)] != "" }

// FixedByOverrides returns what the overrides fix of the strategy (semi-
// auto planning keeps it), with the values of the resolved cfg.
func FixedByOverrides(cfg *presets.Config, overrides []string) Fixed {
	var f Fixed
	s := StrategyOf(cfg)
	for _, o := range overrides {
		switch strategyKeys[overrideKey(o)] {
		case "dp":
			f.DP = s.DP
		case "mp":
			f.MP = s.MP
		case "cp":
			f.CP = s.CP
		case "sp":
			sp := s.SP
			f.SP = &sp
		case "pp":
			f.PP = s.PP
		case "vpp":
			f.VPP = s.VPP
		case "sharding":
			f.ShardingDegree = s.ShardingDegree
		case "stage":
			f.ShardingStage = s.ShardingStage
		case "micro":
			f.MicroBatch = s.MicroBatch
		case "recompute":
			f.Recompute = s.Recompute
		}
	}
	return f
}

// ApplyOverrides returns the overrides existing with a plan's overrides
// (target, from [Overrides]) applied, where current are those of the
// config's own strategy: each target override whose value differs from the
// current one replaces the existing override of its key (in any spelling)
// or is added; the others are kept.
func ApplyOverrides(existing, target, current []string) []string {
	out := slices.Clone(existing)
	for _, kv := range target {
		if slices.Contains(current, kv) {
			continue
		}
		k := overrideKey(kv)
		i := slices.IndexFunc(out, func(o string) bool { return overrideKey(o) == k })
		if i < 0 {
			out = append(out, kv)
			continue
		}
		out[i] = kv
		// Later overrides of the same key would win: drop them.
		out = append(out[:i+1], slices.DeleteFunc(out[i+1:], func(o string) bool { return overrideKey(o) == k })...)
	}
	return out
}
