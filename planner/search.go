package planner

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/gptui/gptui/layout"
)

// Fixed holds the parts of a strategy the user chose (semi-auto); zero
// values and an empty Recompute are left to the search.
type Fixed struct {
	DP, ShardingDegree, ShardingStage, MP, CP, PP, VPP, MicroBatch int
	SP                                                             *bool // sequence parallelism; nil: free
	Recompute                                                      string
}

// String lists the fixed degrees in words, such as "dp 2, mp 4,
// micro-batch 2"; "" when none is fixed.
func (f Fixed) String() string {
	var parts []string
	for _, d := range []struct {
		name string
		v    int
	}{{"dp", f.DP}, {"sharding", f.ShardingDegree}, {"sharding stage", f.ShardingStage}, {"mp", f.MP}, {"cp", f.CP}, {"pp", f.PP}, {"vpp", f.VPP}, {"micro-batch", f.MicroBatch}} {
		if d.v > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", d.name, d.v))
		}
	}
	if f.SP != nil {
		parts = append(parts, fmt.Sprintf("sequence parallel %v", *f.SP))
	}
	if f.Recompute != "" {
		parts = append(parts, "recompute "+f.Recompute)
	}
	return strings.Join(parts, ", ")
}

// All reports whether every degree is fixed, so that the search has one
// layout to evaluate (micro-batch and recompute may still vary): dp,
// sharding, mp and pp; the context-parallel degree is then what the
// devices leave, and the plan evaluated is the config's own.
func (f Fixed) All() bool {
	return f.DP > 0 && f.ShardingDegree > 0 && f.MP > 0 && f.PP > 0
}

// Capabilities is what the engine that will run a plan can do; the search
// marks plans beyond it infeasible.
type Capabilities struct {
	Name             string // says whose capabilities these are, in reasons
	MaxMP            int    // largest tensor-parallel degree
	SP               bool   // runs sequence parallelism
	MaxCP            int    // largest context-parallel degree (0 is 1: none)
	MaxPP            int    // largest pipeline degree
	MaxVPP           int    // largest virtual pipeline degree
	MaxShardingStage int    // highest sharding stage
}

// Unlimited allows every strategy: for planning accelerator clusters.
func Unlimited() Capabilities {
	return Capabilities{Name: "unlimited", MaxMP: 1 << 30, SP: true, MaxCP: 1 << 30, MaxPP: 1 << 30, MaxVPP: 1 << 30, MaxShardingStage: 3}
}

// EngineCapabilities is what gptui's engine runs: data parallelism,
// sharding stages 1–3, tensor parallelism with or without sequence
// parallelism, context parallelism and pipeline parallelism (1F1B,
// interleaved), composed. Context parallelism with dropout the config
// refuses, and so does the planner, for every engine (Estimate).
func EngineCapabilities() Capabilities {
	return Capabilities{Name: "the engine", MaxMP: 1 << 30, SP: true, MaxCP: 1 << 30, MaxPP: 1 << 30, MaxVPP: 1 << 30, MaxShardingStage: 3}
}

// Unsupported returns why caps cannot run s, or "".
func (caps Capabilities) Unsupported(s Strategy) string {
	switch {
	case s.MP > caps.MaxMP:
		return fmt.Sprintf("not supported by %s yet: mp %d (at most %d)", caps.Name, s.MP, caps.MaxMP)
	case s.SP && s.MP > 1 && !caps.SP:
		return fmt.Sprintf("not supported by %s yet: sequence parallelism", caps.Name)
	case s.CP > 1 && caps.MaxCP <= 1:
		return fmt.Sprintf("not supported by %s yet: context parallelism (cp %d)", caps.Name, s.CP)
	case s.CP > 1 && s.CP > caps.MaxCP:
		return fmt.Sprintf("not supported by %s yet: cp %d (at most %d)", caps.Name, s.CP, caps.MaxCP)
	case s.PP > caps.MaxPP:
		return fmt.Sprintf("not supported by %s yet: pp %d (at most %d)", caps.Name, s.PP, caps.MaxPP)
	case s.VPP > caps.MaxVPP:
		return fmt.Sprintf("not supported by %s yet: vpp %d (at most %d)", caps.Name, s.VPP, caps.MaxVPP)
	case s.ShardingDegree > 1 && s.ShardingStage > caps.MaxShardingStage:
		return fmt.Sprintf("not supported by %s yet: sharding stage %d (at most %d)", caps.Name, s.ShardingStage, caps.MaxShardingStage)
	}
	return ""
}

// Options configure [Search].
type Options struct {
	Fixed Fixed
	// Caps limits the strategies; the zero value means [Unlimited].
	Caps Capabilities
}

// Search evaluates every valid strategy for m on c ([layout.Check]) that
// agrees with o.Fixed: each split of the devices into dp × sharding × cp ×
// mp × pp (mp at most the devices of a node, 2·cp dividing the sequence),
// with and without sequence parallelism where mp > 1 (and divides a rank's
// T/cp positions), each sharding stage, each virtual
// pipeline degree (searched on pipelines of more than two stages), each
// micro-batch size dividing the local batch and each recompute
// granularity. It returns them ranked: the feasible ones fastest first,
// then the infeasible ones with their reasons. It fails only when no
// layout is valid at all.
func Search(m Model, c Cluster, o Options) ([]Plan, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	caps := o.Caps
	if caps.Name == "" {
		caps = Unlimited()
	}
	f := o.Fixed
	n := c.Size()
	recomputes := []string{RecomputeNone, RecomputeOnlyAttn, RecomputeFull}
	if f.Recompute != "" {
		recomputes = []string{f.Recompute}
	}
	// valid asks the layout rule about the degrees chosen so far (the
	// others 1) and the global batch over dp replicas, with the sequence
	// that context and sequence parallelism cut.
	valid := func(mp, pp, vpp, dp, cp int, sp bool) bool {
		s := Strategy{DP: dp, ShardingDegree: 1, ShardingStage: 1, MP: mp, SP: sp, CP: cp, PP: pp, VPP: vpp}
		return layout.Check(m.Shape, s.layout(), layout.Batch{Global: m.GlobalBatch, Seq: m.SeqLen}) == nil
	}
	sps := []bool{false, true}
	if f.SP != nil {
		sps = []bool{*f.SP}
	}
	var plans []Plan
	for _, mp := range divisors(n) {
		if !fits(f.MP, mp) || mp > c.DevicesPerNode || !valid(mp, 1, 1, 1, 1, false) {
			continue
		}
		for _, pp := range divisors(n / mp) {
			if !fits(f.PP, pp) || !valid(mp, pp, 1, 1, 1, false) {
				continue
			}
			// Virtual stages only on pipelines of more than two stages,
			// as Megatron-LM interleaves: a search choice, not a rule.
			vpps := []int{1}
			for v := 2; pp > 2 && v <= m.L/pp; v++ {
				if valid(mp, pp, v, 1, 1, false) {
					vpps = append(vpps, v)
				}
			}
			for _, cp := range divisors(n / (mp * pp)) {
				R := n / (mp * pp * cp)
				if !fits(f.CP, cp) || !valid(mp, pp, 1, R, cp, false) {
					continue
				}
				// Sequence parallelism only where there are mp ranks to
				// split the rows over.
				var spOK []bool
				for _, sp := range sps {
					if !sp || mp > 1 && valid(mp, pp, 1, R, cp, true) {
						spOK = append(spOK, sp)
					}
				}
				local := m.GlobalBatch / R
				for _, sh := range divisors(R) {
					if !fits(f.ShardingDegree, sh) || !fits(f.DP, R/sh) {
						continue
					}
					stages := []int{1}
					if sh > 1 {
						stages = []int{1, 2, 3}
					}
					for _, stage := range stages {
						if sh > 1 && !fits(f.ShardingStage, stage) {
							continue
						}
						for _, sp := range spOK {
							for _, vpp := range vpps {
								if !fits(f.VPP, vpp) {
									continue
								}
								for _, mb := range divisors(local) {
									if !fits(f.MicroBatch, mb) {
										continue
									}
									for _, rc := range recomputes {
										s := Strategy{DP: R / sh, ShardingDegree: sh, ShardingStage: stage, MP: mp, SP: sp, CP: cp, PP: pp, VPP: vpp, MicroBatch: mb, Recompute: rc}
										p := Estimate(m, c, s)
										if r := caps.Unsupported(s); r != "" && p.Reason == "" {
											p.Feasible, p.Reason = false, r
										}
										plans = append(plans, p)
									}
								}
							}
						}
					}
				}
			}
		}
	}
	if len(plans) == 0 {
		fixed := ""
		if s := f.String(); s != "" {
			fixed = " and " + s + " fixed"
		}
		return nil, fmt.Errorf("no valid layout of %s for %d devices with global batch %d%s: change the global batch or the number of devices", m, n, m.GlobalBatch, fixed)
	}
	Rank(plans)
	return plans, nil
}

// Rank sorts plans: feasible before infeasible, then by predicted step
// time, then by memory, then by name, so the order is deterministic.
//
// It sorts indices and names a plan only when a tie needs its name: the
// plans are large and many (over 100,000 for 1,024 devices), and most
// infeasible ones tie on time and memory.
func Rank(plans []Plan) {
	names := make([]string, len(plans))
	name := func(i int) string {
		if names[i] == "" {
			names[i] = plans[i].String()
		}
		return names[i]
	}
	idx := make([]int, len(plans))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(i, j int) int {
		a, b := &plans[i], &plans[j]
		if a.Feasible != b.Feasible {
			if a.Feasible {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(a.StepTime, b.StepTime), cmp.Compare(a.Mem.Total, b.Mem.Total), cmp.Compare(name(i), name(j)))
	})
	sorted := make([]Plan, len(plans))
	for k, i := range idx {
		sorted[k] = plans[i]
	}
	copy(plans, sorted)
}

// Best returns the first feasible plan of ranked plans.
func Best(plans []Plan) (Plan, bool) {
	if len(plans) > 0 && plans[0].Feasible {
		return plans[0], true
	}
	return Plan{}, false
}

// fits reports whether v agrees with the fixed value want (0: free).
func fits(want, v int) bool { return want == 0 || want == v }

// divisors returns the divisors of n in increasing order.
func divisors(n int) []int {
	var d []int
	for i := 1; i <= n; i++ {
		if n%i == 0 {
			d = append(d, i)
		}
	}
	return d
}
