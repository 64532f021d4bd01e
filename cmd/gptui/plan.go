package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"

	"github.com/gptui/gptui/badinput"
	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/planner"
	"github.com/gptui/gptui/planner/profile"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/sshexec"
	"github.com/gptui/gptui/units"
)

// cmdPlan implements 'gptui plan': the parallel strategies of a config on
// a cluster, ranked by predicted step time, and --profile, which measures
// this machine's CPU profile.
func cmdPlan(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("plan", stderr)
	c, o := configFlags(fs)
	hosts := fs.String("hosts", "", "host inventory: count its nodes and devices (no connection is made, except with --profile)")
	nodes := fs.Int("nodes", 1, "number of nodes")
	perNode := fs.Int("devices-per-node", 0, "devices per node (default, without --nodes: the config's strategy's devices, in nodes of 8 accelerators; with --nodes: 8 for accelerators, 1 for cpu)")
	dev := fs.String("device", "", "device profile: V100-32G, A100-40G, A100-80G, H100-80G, H200-141G or cpu (default: cpu for Global.device=cpu, else V100-32G, or A100-80G for a bf16 config: a V100 has no bf16)")
	top := fs.Int("top", 10, "plans to list, feasible and rejected each; 0 lists all")
	asJSON := fs.Bool("json", false, "print the plans as a JSON list")
	profile := fs.Bool("profile", false, "measure this machine's GEMM rate, optimizer rate and the link between two local workers (with --hosts, also between the inventory's first two nodes), and save them as the cpu profile")
	profileFile := fs.String("profile-file", "", "the cpu profile's file (default: gptui/profile-cpu.json in the user cache directory)")
	acceptNew := fs.Bool("accept-new-host-keys", false, "with --profile --hosts: accept and record the host keys of nodes that ~/.ssh/known_hosts does not know")
	if err := parse(fs, args); err != nil {
		return err
	}
	path := *profileFile
	if path == "" {
		var err error
		if path, err = planner.DefaultProfilePath(); err != nil {
			return err
		}
	}
	if *acceptNew && (!*profile || *hosts == "") {
		return usagef("plan: --accept-new-host-keys needs --profile --hosts FILE")
	}
	if *profile {
		var linkNodes []sshexec.Node
		if *hosts != "" {
			// A bad inventory is reported before anything is measured.
			var err error
			if linkNodes, err = cluster.LinkNodes(*hosts); err != nil {
				return fmt.Errorf("plan: --profile --hosts: %w", err)
			}
		}
		d, err := measureProfile(ctx, stderr)
		if err != nil {
			return err
		}
		if linkNodes != nil {
			fmt.Fprintf(stderr, "gptui plan: measuring the link between the first two nodes of %s ...\n", *hosts)
			logf := func(format string, a ...any) { fmt.Fprintf(stderr, "gptui plan: "+format+"\n", a...) }
			bw, desc, err := cluster.MeasureLink(ctx, *hosts, linkNodes, sshexec.ClientConfig{AcceptNewHostKeys: *acceptNew}, []string{planLinkPeer}, logf)
			if err != nil {
				return fmt.Errorf("plan: %w", err)
			}
			d.InterBW, d.InterMeasured = bw, desc
		}
		if err := planner.SaveProfile(path, d); err != nil {
			return err
		}
		inter := "built-in"
		if d.InterMeasured != "" {
			inter = "measured"
		}
		fmt.Fprintf(stderr, "gptui plan: profile saved to %s: sgemm %.1f GFLOP/s (half rate at %.0f rows), softmax cross-entropy %.0f M logits/s, AdamW %.0f M params/s, link %.2f GB/s, between nodes %.2f GB/s (%s), %d cores, %s RAM\n",
			path, d.PeakFLOPS/1e9, d.GEMMHalfRows, d.ClassifierPerS/1e6, d.OptimizerParamsPerS/1e6, d.IntraBW/1e9, d.InterBW/1e9, inter, d.Cores, units.Bytes(d.MemBytes))
		if *c == "" {
			return nil
		}
	}
	cfg, err := loadConfig(*c, *o)
	if err != nil {
		return err
	}
	set := flagsSet(fs)
	cl := planner.Cluster{Nodes: *nodes, DevicesPerNode: *perNode}
	if *hosts != "" {
		if set["nodes"] || set["devices-per-node"] {
			return usagef("plan: give either --hosts or --nodes/--devices-per-node")
		}
		var devCPU bool
		if cl.Nodes, cl.DevicesPerNode, devCPU, err = countInventory(*hosts); err != nil {
			return fmt.Errorf("plan: --hosts: %w", err)
		}
		if devCPU && *dev == "" {
			*dev = "cpu"
		}
	}
	name := *dev
	if name == "" {
		name = planner.DefaultProfile(cfg.Global.Device, cfg.Engine.MixPrecision.Dtype)
	}
	var note string
	if cl.Device, note, err = planner.ProfileFor(name, path); err != nil {
		return fmt.Errorf("plan: --device: %w", err)
	}
	if note != "" {
		fmt.Fprintln(stderr, "gptui: "+note)
	}
	sized := false
	if *hosts == "" && !set["nodes"] && !set["devices-per-node"] {
		// No cluster given: the one the config's strategy runs on, so that
		// 'gptui plan -c 13b-4node' plans for the preset's 32 devices.
		world := planner.StrategyOf(cfg).Devices()
		cl.Nodes, cl.DevicesPerNode, sized = 1, world, true
		if cl.Device.Accounting != planner.AccountingEngine && world > 8 && world%8 == 0 {
			cl.Nodes, cl.DevicesPerNode = world/8, 8
		}
	}
	if cl.DevicesPerNode == 0 {
		cl.DevicesPerNode = 8
		if cl.Device.Accounting == planner.AccountingEngine {
			cl.DevicesPerNode = 1
		}
	}
	if err := cl.Validate(); err != nil {
		return usageError{fmt.Errorf("plan: %w", err)}
	}
	if *top < 0 {
		return usagef("plan: --top %d: want 0 (all) or more", *top)
	}
	caps := planner.Unlimited()
	if cl.Device.Accounting == planner.AccountingEngine {
		caps = planner.EngineCapabilities() // CPU workers run gptui's engine
	}
	m := planner.ModelOf(cfg)
	fixed := planner.FixedByOverrides(cfg, *o)
	ref := planner.Estimate(m, cl, planner.StrategyOf(cfg))
	if r := caps.Unsupported(ref.Strategy); r != "" && ref.Feasible {
		ref.Feasible, ref.Reason = false, r
	}
	var plans []planner.Plan
	if fixed.All() {
		plans = []planner.Plan{ref} // every degree given: evaluate that plan
	} else if plans, err = planner.Search(m, cl, planner.Options{Fixed: fixed, Caps: caps}); err != nil {
		return usageError{fmt.Errorf("plan: %w", err)}
	}
	if *asJSON {
		out := pick(plans, *top)
		if out == nil {
			out = []planner.Plan{}
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	fmt.Fprintf(stdout, "model: %s\ncluster: %s (%s memory accounting", m, cl, cl.Device.Accounting)
	if cl.Device.Measured != "" {
		fmt.Fprintf(stdout, ", measured %s", cl.Device.Measured)
	}
	fmt.Fprintf(stdout, ")\n")
	if sized {
		fmt.Fprintf(stdout, "(the devices the config's strategy uses; --nodes/--devices-per-node or --hosts plan for another cluster)\n")
	}
	fmt.Fprintf(stdout, "%s\n\n", cl.Links())
	if err := planner.WriteTable(stdout, plans, *top); err != nil {
		return err
	}
	shown := ref
	if best, ok := planner.Best(plans); ok && !fixed.All() {
		fmt.Fprintf(stdout, "\nchosen: %s\n%s\n", planner.Summary(best), planner.Compare(best, ref))
		shown = best
	}
	if line := saveLine(cfg, shown.Strategy); line != "" {
		fmt.Fprintln(stdout, line)
	}
	return nil
}

// saveLine says what a checkpoint costs the ranks of cfg laid out as s,
// by the engine's own account (engine.SaveMemory): the most bytes a rank
// writes per save and the host memory an asynchronous save copies them
// into; "" where the layout does not fit the model.
func saveLine(cfg *presets.Config, s planner.Strategy) string {
	c, err := planner.Apply(cfg, s)
	if err != nil {
		return ""
	}
	world := s.Devices()
	var most engine.SaveCost
	var total int64
	for r := range world {
		sc, err := engine.SaveMemory(c, r, world)
		if err != nil {
			return ""
		}
		total += sc.Write
		most.Write, most.Host, most.Block = max(most.Write, sc.Write), max(most.Host, sc.Host), max(most.Block, sc.Block)
	}
	return fmt.Sprintf("checkpoint (%s): %s per save in all, each rank writing its own part, at most %s; save_load.async holds up to %s more per rank in host memory, a synchronous save on CPUs a block of up to %s",
		s, units.Bytes(total), units.Bytes(most.Write), units.Bytes(most.Host), units.Bytes(most.Block))
}

// pick returns the first top feasible and the first top infeasible plans
// of ranked plans (all when top is 0).
func pick(plans []planner.Plan, top int) []planner.Plan {
	var out []planner.Plan
	var nf, ni int
	for _, p := range plans {
		if p.Feasible && (top == 0 || nf < top) {
			out = append(out, p)
			nf++
		} else if !p.Feasible && (top == 0 || ni < top) {
			out = append(out, p)
			ni++
		}
	}
	return out
}

// flagsSet returns the names of the flags given on the command line.
func flagsSet(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// countInventory counts the nodes of the inventory at path and the devices
// of each (which must agree), without connecting to any; cpu reports
// devices given as cpu:N.
func countInventory(path string) (nodes, perNode int, cpu bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, false, badinput.Wrap(err)
	}
	defer f.Close()
	ns, err := sshexec.ParseInventory(path, f, nil)
	if err != nil {
		return 0, 0, false, err
	}
	perNode, cpu, err = sshexec.UniformDevices(path, ns)
	return len(ns), perNode, cpu, err
}

// planLinkPeer is the hidden subcommand 'gptui plan --profile' re-executes,
// here and on the nodes, as the ends of the links it measures.
const planLinkPeer = "__plan-link-peer"

// cmdPlanLinkPeer is planLinkPeer: one end of a measured link.
func cmdPlanLinkPeer(ctx context.Context, stdout io.Writer) error {
	return profile.LinkPeer(ctx, func(line string) { fmt.Fprintln(stdout, line) })
}

// measureProfile measures this machine: the CPU backend's sgemm and AdamW
// rates in this process, and the all-reduce bandwidth between this
// process and a second one (this binary re-executed) over loopback TCP.
func measureProfile(ctx context.Context, stderr io.Writer) (planner.Device, error) {
	be, err := cpuBackend(cpu.Options{}, stderr)
	if err != nil {
		return planner.Device{}, err
	}
	fmt.Fprintln(stderr, "gptui plan: measuring sgemm and AdamW ...")
	d := profile.MeasureCompute(be, runtime.NumCPU(), planner.MemTotal())
	fmt.Fprintln(stderr, "gptui plan: measuring the link between two local workers ...")
	exe, err := os.Executable()
	if err != nil {
		return d, fmt.Errorf("plan: %w", err)
	}
	if d.IntraBW, err = profile.MeasureLocalLink(ctx, exe, []string{planLinkPeer}); err != nil {
		return d, fmt.Errorf("plan: %w", err)
	}
	return d, nil
}
