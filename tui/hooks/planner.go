package hooks

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gptui/gptui/planner"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/tui"
	"github.com/gptui/gptui/units"
)

// Planner returns the Job screen's planner (tui.Planner): the strategies of the job's
// config on the rank table's devices, with the device profile the UI
// picked from the nodes' probes, ranked as 'gptui plan' ranks them with no
// degree fixed, the config's own marked, each with the overrides that
// select it. The UI calls it in a command when the job changes.
func Planner() tui.Planner {
	return func(req tui.PlanRequest) (*tui.PlanReport, error) {
		cl, err := jobCluster(req)
		if err != nil {
			return nil, err
		}
		return planReport(req, cl)
	}
}

// jobCluster is the cluster of a job's rank table: its nodes and devices
// per node, with the profile req names (the cpu profile measured by
// --profile when there is one).
func jobCluster(req tui.PlanRequest) (planner.Cluster, error) {
	t := req.Table
	if t == nil || len(t.Servers) == 0 {
		return planner.Cluster{}, errors.New("no devices in the rank table")
	}
	per := len(t.Servers[0].Devices)
	for _, s := range t.Servers {
		if len(s.Devices) != per {
			return planner.Cluster{}, fmt.Errorf("the planner needs the same number of devices on every node (%s has %d, %s %d)", t.Servers[0].ServerID, per, s.ServerID, len(s.Devices))
		}
	}
	path, _ := planner.DefaultProfilePath()
	dev, _, err := planner.ProfileFor(req.Device, path)
	if err != nil {
		return planner.Cluster{}, err
	}
	cl := planner.Cluster{Nodes: len(t.Servers), DevicesPerNode: per, Device: dev}
	return cl, cl.Validate()
}

// planReport ranks the strategies of the job on cl for the Job screen.
func planReport(req tui.PlanRequest, cl planner.Cluster) (*tui.PlanReport, error) {
	cfg := req.Resolved
	caps := planner.Unlimited()
	if cl.Device.Accounting == planner.AccountingEngine {
		caps = planner.EngineCapabilities() // CPU workers run gptui's engine
	}
	m := planner.ModelOf(cfg)
	ref := planner.Estimate(m, cl, planner.StrategyOf(cfg))
	if r := caps.Unsupported(ref.Strategy); r != "" && ref.Feasible {
		ref.Feasible, ref.Reason = false, r
	}
	plans, err := planner.Search(m, cl, planner.Options{Caps: caps})
	if err != nil {
		return nil, err
	}
	r := &tui.PlanReport{Fits: ref.Feasible, Command: planCommand(req, cl, m.GlobalBatch), Note: cl.Links()}
	refOverrides := planner.Overrides(ref.Strategy, m.GlobalBatch)
	feasible := len(plans) - planner.Rejected(plans)
	place := ""
	for _, p := range plans {
		if !p.Feasible {
			r.Rejected++
			continue
		}
		bubble := -1.0
		if p.PP > 1 {
			bubble = p.BubbleFraction
		}
		current := p.Strategy == ref.Strategy
		if current {
			place = fmt.Sprintf("plan %d of %d", len(r.Plans)+1, feasible)
		}
		r.Plans = append(r.Plans, tui.PlanRow{
			Strategy: p.Strategy.String(), MemBytes: p.Mem.Total, StepS: p.StepTime, TokensPerS: p.TokensPerS,
			MFU: p.MFU, Bubble: bubble, CommS: p.Time.Comm, Current: current,
			Overrides: planner.ApplyOverrides(req.Overrides, planner.Overrides(p.Strategy, m.GlobalBatch), refOverrides),
		})
	}
	r.Reasons = planner.ReasonCounts(plans)
	if !ref.Feasible {
		place = "rejected: " + ref.Reason
	}
	mem := ref.Mem
	r.Estimate = []string{
		fmt.Sprintf("config's strategy %s: %s per device, step %.3f s, %s", ref.Strategy, units.BytesOf(mem.Total, ref.Capacity), ref.StepTime, place),
		fmt.Sprintf("on %s, per device: params %s, grads %s, optimizer %s, activations %s, scratch %s, other %s",
			cl, units.Bytes(mem.Params), units.Bytes(mem.Grads), units.Bytes(mem.Optimizer), units.Bytes(mem.Activations), units.Bytes(mem.Scratch), units.Bytes(mem.Other)),
	}
	return r, nil
}

// planCommand is the 'gptui plan' command line that ranks the same plans
// as the Job screen: the job's config and overrides, less those that would
// fix part of the strategy (the search has nothing fixed), with the global
// batch kept.
func planCommand(req tui.PlanRequest, cl planner.Cluster, globalBatch int) string {
	args := []string{"gptui", "plan", "-c", shellWord(req.Config)}
	dropped := false
	for _, o := range req.Overrides {
		k, _, _ := strings.Cut(o, "=")
		switch k = presets.CanonicalKey(strings.TrimSpace(k)); {
		case planner.ChoosesStrategy(o), k == "Distributed.pp_schedule", k == "Global.local_batch_size", k == "Global.global_batch_size":
			dropped = true
		default:
			args = append(args, "-o", shellWord(o))
		}
	}
	if dropped {
		args = append(args, "-o", fmt.Sprintf("Global.global_batch_size=%d", globalBatch), "-o", "Global.local_batch_size=")
	}
	args = append(args, "--nodes", strconv.Itoa(cl.Nodes), "--devices-per-node", strconv.Itoa(cl.DevicesPerNode),
		"--device", strings.ToLower(cl.Device.Name), "--top", "0")
	return strings.Join(args, " ")
}

// shellWord quotes s for a POSIX shell when it needs it.
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./=:,+-@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
