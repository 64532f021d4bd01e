package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/launch"
	"github.com/gptui/gptui/planner"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/sshexec"
	"github.com/gptui/gptui/tui"
)

// planLinkPeer is the hidden subcommand 'gptui plan --profile' re-executes
// as the second end of the link it measures.
const planLinkPeer = "__plan-link-peer"

// cmdPlan implements 'gptui plan': the parallel strategies of a config on
// a cluster, ranked by predicted step time, and --profile, which measures
// this machine's CPU profile.
func cmdPlan(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("plan", stderr)
	c, o := configFlags(fs)
	hosts := fs.String("hosts", "", "host inventory: count its nodes and devices (no connection is made, except with --profile)")
	nodes := fs.Int("nodes", 1, "number of nodes")
	perNode := fs.Int("devices-per-node", 0, "devices per node (default, without --nodes: the config's strategy's devices, in nodes of 8 accelerators; with --nodes: 8 for accelerators, 1 for cpu)")
	dev := fs.String("device", "", "device profile: V100-32G, A100-40G, A100-80G, H100-80G, H200-141G or cpu (default: cpu for Global.device=cpu, else V100-32G)")
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
			if linkNodes, err = nodeLinkNodes(*hosts); err != nil {
				return err
			}
		}
		d, err := measureProfile(ctx, stderr)
		if err != nil {
			return err
		}
		if linkNodes != nil {
			fmt.Fprintf(stderr, "gptui plan: measuring the link between the first two nodes of %s ...\n", *hosts)
			bw, desc, err := measureNodeLink(ctx, *hosts, linkNodes, sshexec.ClientConfig{AcceptNewHostKeys: *acceptNew}, stderr)
			if err != nil {
				return err
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
		fmt.Fprintf(stderr, "gptui plan: profile saved to %s: sgemm %.1f GFLOP/s (half rate at %.0f rows), softmax cross-entropy %.0f M logits/s, AdamW %.0f M params/s, refilling released memory %.2f GB/s, link %.2f GB/s, between nodes %.2f GB/s (%s), %d cores, %.1f GB\n",
			path, d.PeakFLOPS/1e9, d.GEMMHalfRows, d.ClassifierPerS/1e6, d.OptimizerParamsPerS/1e6, d.RefaultBPS/1e9, d.IntraBW/1e9, d.InterBW/1e9, inter, d.Cores, float64(d.MemBytes)/1e9)
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
			return err
		}
		if devCPU && *dev == "" {
			*dev = "cpu"
		}
	}
	name := *dev
	if name == "" {
		name = "V100-32G"
		if cfg.Global.Device == "cpu" {
			name = "cpu"
		}
	}
	if cl.Device, err = deviceProfile(name, path, stderr); err != nil {
		return err
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
	fixed := fixedByOverrides(cfg, *o)
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
	if best, ok := planner.Best(plans); ok && !fixed.All() {
		fmt.Fprintf(stdout, "\nchosen: %s\n%s\n", planner.Summary(best), planner.Compare(best, ref))
	}
	return nil
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
		return 0, 0, false, usageError{fmt.Errorf("plan: --hosts: %w", err)}
	}
	defer f.Close()
	ns, err := sshexec.ParseInventory(path, f, nil)
	if err != nil {
		return 0, 0, false, usageError{fmt.Errorf("plan: %w", err)}
	}
	for _, n := range ns {
		d := n.Devices.Count()
		if d == 0 {
			return 0, 0, false, usagef("plan: %s:%d: %s lists no devices; add devices=0-7 or devices=cpu:N", path, n.Line, n.Name)
		}
		if perNode != 0 && d != perNode {
			return 0, 0, false, usagef("plan: %s:%d: %s has %d devices, the nodes before it %d; the planner needs the same number on every node", path, n.Line, n.Name, d, perNode)
		}
		perNode, cpu = d, n.Devices.CPU > 0
	}
	return len(ns), perNode, cpu, nil
}

// deviceProfile returns the profile called name; for the cpu, the one
// measured by --profile when profilePath holds one.
func deviceProfile(name, profilePath string, stderr io.Writer) (planner.Device, error) {
	d, err := planner.LookupDevice(name)
	if err != nil {
		return d, usageError{fmt.Errorf("plan: --device: %w", err)}
	}
	if d.Accounting != planner.AccountingEngine {
		return d, nil
	}
	m, err := planner.LoadProfile(profilePath)
	switch {
	case err == nil:
		return m, nil
	case errors.Is(err, fs.ErrNotExist):
		if stderr != nil {
			fmt.Fprintf(stderr, "gptui: no measured cpu profile at %s (run 'gptui plan --profile'); using the built-in one\n", profilePath)
		}
		return d, nil
	}
	var pe *planner.ProfileError
	if errors.As(err, &pe) {
		return d, usageError{err}
	}
	return d, err
}

// degreeKeys maps the override keys of the parallel degrees, under the
// schema's and the seeds' names, to the Fixed field they set.
var degreeKeys = map[string]string{
	"Distributed.dp_degree": "dp", "Distributed.data_parallel": "dp",
	"Distributed.mp_degree": "mp", "Distributed.tensor_parallel_degree": "mp", "Distributed.model_parallel": "mp",
	"Distributed.vpp_degree": "vpp", "Distributed.virtual_pp_degree": "vpp", "Distributed.virtual_pipeline_model_parallel_size": "vpp",
	"Distributed.pp_degree": "pp", "Distributed.pipeline_parallel_degree": "pp", "Distributed.pipeline_stage": "pp",
	"Distributed.sharding.sharding_degree": "sharding", "Distributed.sharding_parallel_degree": "sharding",
	"Distributed.sharding.sharding_stage": "stage",
	"Global.micro_batch_size":             "micro",
	"Engine.use_recompute":                "recompute", "Engine.recompute_granularity": "recompute",
}

// fixedByOverrides returns what the -o overrides fix, with the values of
// the resolved cfg.
func fixedByOverrides(cfg *presets.Config, overrides []string) planner.Fixed {
	var f planner.Fixed
	s := planner.StrategyOf(cfg)
	for _, o := range overrides {
		k, _, _ := strings.Cut(o, "=")
		switch degreeKeys[strings.TrimSpace(k)] {
		case "dp":
			f.DP = s.DP
		case "mp":
			f.MP = s.MP
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

// measureProfile measures this machine: the CPU backend's sgemm and AdamW
// rates in this process, and the all-reduce bandwidth between this
// process and a second one (this binary re-executed as planLinkPeer,
// started by the launcher) over loopback TCP.
func measureProfile(ctx context.Context, stderr io.Writer) (planner.Device, error) {
	be, err := cpuBackend(cpu.Options{}, stderr)
	if err != nil {
		return planner.Device{}, err
	}
	fmt.Fprintln(stderr, "gptui plan: measuring sgemm and AdamW ...")
	d := planner.MeasureCompute(be, runtime.NumCPU(), planner.MemTotal())
	fmt.Fprintln(stderr, "gptui plan: measuring the link between two local workers ...")
	bw, err := measureLocalLink(ctx)
	if err != nil {
		return d, err
	}
	d.IntraBW = bw
	return d, nil
}

// measureLocalLink starts a peer process and measures the all-reduce bus
// bandwidth between it and this process.
func measureLocalLink(ctx context.Context) (float64, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, fmt.Errorf("plan: %w", err)
	}
	port, err := launch.FreePort(masterAddr)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	secret, err := comm.NewSecret()
	if err != nil {
		return 0, err
	}
	peer := make(chan error, 1)
	go func() {
		_, err := launch.Run(ctx, launch.Options{Exe: exe, Workers: []launch.Worker{{
			Rank: 1, LocalRank: 1, Args: []string{planLinkPeer},
			Env: launch.Env(1, 1, 2, masterAddr, port, secret),
		}}})
		peer <- err
	}()
	w, err := comm.Connect(ctx, comm.Config{Rank: 0, WorldSize: 2, MasterAddr: masterAddr, MasterPort: port, Timeout: time.Minute, Secret: []byte(secret)})
	if err != nil {
		cancel()
		return 0, errors.Join(fmt.Errorf("plan: connecting to the link peer: %w", err), <-peer)
	}
	bw, err := linkBandwidth(ctx, w)
	w.Close()
	if perr := <-peer; err == nil && perr != nil {
		err = fmt.Errorf("plan: link peer: %w", perr)
	}
	return bw, err
}

func linkBandwidth(ctx context.Context, w *comm.World) (float64, error) {
	g, err := w.Group([]int{0, 1})
	if err != nil {
		return 0, err
	}
	return planner.MeasureLink(ctx, g)
}

// linkLine starts the line on which rank 0 of planLinkPeer prints the
// bandwidth it measured, in bytes/s.
const linkLine = "plan-link-bw "

// cmdPlanLinkPeer is one end of a measured link: the second end of
// measureLocalLink, or either worker of measureNodeLink. Rank 0 prints the
// bandwidth on stdout as linkLine and the figure.
func cmdPlanLinkPeer(ctx context.Context, stdout io.Writer) error {
	cc, err := comm.ConfigFromEnv()
	if err != nil {
		return usageError{err}
	}
	w, err := comm.Connect(ctx, cc)
	if err != nil {
		return err
	}
	defer w.Close()
	bw, err := linkBandwidth(ctx, w)
	if err == nil && cc.Rank == 0 {
		fmt.Fprintf(stdout, "%s%g\n", linkLine, bw)
	}
	return err
}

// nodeLinkNodes returns the two nodes of the inventory at hosts between
// which 'plan --profile' measures the link: the first two, each with one
// CPU worker whatever its devices.
func nodeLinkNodes(hosts string) ([]sshexec.Node, error) {
	nodes, err := sshexec.LoadInventory(hosts)
	if err != nil {
		return nil, usageError{fmt.Errorf("plan: %w", err)}
	}
	if len(nodes) < 2 {
		return nil, usagef("plan: %s: --profile --hosts measures the link between two nodes, the inventory has %d; add a node or leave --hosts out", hosts, len(nodes))
	}
	two := slices.Clone(nodes[:2])
	for i := range two {
		two[i].Devices = sshexec.Devices{CPU: 1}
	}
	return two, nil
}

// measureNodeLink measures the all-reduce bus bandwidth between two nodes
// of the inventory at hosts (from nodeLinkNodes). It sets the job up as
// 'gptui run --hosts' does (the cluster runner connects, pushes gptui and
// starts an agent on each node) with one CPU worker per node, each running
// planLinkPeer instead of training, and reads the figure rank 0 prints.
// It returns the bandwidth in bytes/s and where it was measured.
func measureNodeLink(ctx context.Context, hosts string, two []sshexec.Node, ssh sshexec.ClientConfig, stderr io.Writer) (float64, string, error) {
	cfg, err := presets.Load("tiny", nil) // pushed, never trained
	if err != nil {
		return 0, "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	job := cluster.New(cluster.Options{Nodes: two, Hosts: hosts, Config: cfg, SSH: ssh,
		JobID: "plan-link-" + time.Now().UTC().Format("20060102T150405")})
	var (
		bw   float64
		tail []string
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range job.Events() {
			switch {
			case e.Kind == event.KindNode && (e.State == event.NodePushing || e.State == event.NodeFailed):
				fmt.Fprintf(stderr, "gptui plan: %s: %s %s\n", e.Node, e.State, e.Message)
			case e.Kind == event.KindLog && e.Rank == 0 && strings.HasPrefix(e.Line, linkLine):
				bw, _ = strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(e.Line, linkLine)), 64)
			case e.Kind == event.KindLog:
				tail = append(tail[max(0, len(tail)-9):], fmt.Sprintf("[%s/%d] %s", e.Node, e.Rank, e.Line))
			}
		}
	}()
	plan, err := job.Plan(ctx)
	if err != nil {
		job.Close()
		<-done
		var ie *cluster.InputError
		if errors.As(err, &ie) {
			return 0, "", usageError{fmt.Errorf("plan: %w", err)}
		}
		return 0, "", fmt.Errorf("plan: measuring the link between nodes: %w", err)
	}
	// Start runs the specs of the plan Plan returned: the workers measure
	// the link instead of training.
	for i := range plan.Nodes {
		for k := range plan.Nodes[i].Spec.Workers {
			plan.Nodes[i].Spec.Workers[k].Args = []string{planLinkPeer}
		}
	}
	if err = job.Start(ctx); err == nil {
		err = job.Wait()
	} else {
		job.Wait()
	}
	<-done
	if err != nil {
		if len(tail) > 0 {
			err = fmt.Errorf("%w; the workers' last lines:\n%s", err, strings.Join(tail, "\n"))
		}
		return 0, "", fmt.Errorf("plan: measuring the link between nodes: %w", err)
	}
	if bw <= 0 {
		return 0, "", fmt.Errorf("plan: measuring the link between nodes: rank 0 on %s reported no bandwidth", plan.Nodes[0].Name)
	}
	desc := fmt.Sprintf("%s between %s and %s", time.Now().UTC().Format(time.RFC3339), plan.Nodes[0].Name, plan.Nodes[1].Name)
	return bw, desc, nil
}

// autoPlan implements Distributed.auto for 'gptui train': it plans the
// strategy for world CPU workers on this machine (what the engine runs,
// keeping the degrees the overrides or the config fix), prints the choice
// and its prediction, and returns cfg with the chosen degrees, batch split
// and recompute applied.
func autoPlan(cfg *presets.Config, overrides []string, world int, stdout io.Writer) (*presets.Config, *planner.Plan, error) {
	path, _ := planner.DefaultProfilePath()
	dev, err := deviceProfile("cpu", path, nil)
	if err != nil {
		return nil, nil, err
	}
	cl := planner.Cluster{Nodes: 1, DevicesPerNode: world, Device: dev}
	fixed := fixedByOverrides(cfg, overrides)
	// Degrees the config itself sets above 1 are kept too (semi-auto).
	d := cfg.Distributed
	for _, kv := range []struct {
		v int
		p *int
	}{{d.DPDegree, &fixed.DP}, {d.MPDegree, &fixed.MP}, {d.PPDegree, &fixed.PP}, {d.Sharding.ShardingDegree, &fixed.ShardingDegree}} {
		if kv.v > 1 {
			*kv.p = kv.v
		}
	}
	m := planner.ModelOf(cfg)
	plans, err := planner.Search(m, cl, planner.Options{Fixed: fixed, Caps: planner.EngineCapabilities()})
	if err != nil {
		return nil, nil, &engine.ConfigError{Msg: fmt.Sprintf("Distributed.auto: %v", err)}
	}
	best, ok := planner.Best(plans)
	if !ok {
		return nil, nil, &engine.ConfigError{Msg: fmt.Sprintf("Distributed.auto: no strategy for %d worker(s) fits (best rejected: %s: %s); lower the batch or the model, or add workers", world, plans[0].Strategy, plans[0].Reason)}
	}
	out := *cfg
	s := best.Strategy
	out.Distributed.DPDegree, out.Distributed.MPDegree, out.Distributed.PPDegree = s.DP, s.MP, s.PP
	out.Distributed.VPPDegree, out.Distributed.PPSchedule = s.VPP, strings.ToLower(s.Schedule())
	if s.PP == 1 {
		out.Distributed.PPSchedule = cfg.Distributed.PPSchedule
	}
	out.Distributed.Sharding.ShardingDegree, out.Distributed.Sharding.ShardingStage = s.ShardingDegree, s.ShardingStage
	out.Global.LocalBatchSize = m.GlobalBatch / s.Replicas()
	out.Global.MicroBatchSize = s.MicroBatch
	out.Engine.UseRecompute = s.Recompute != planner.RecomputeNone
	if out.Engine.UseRecompute {
		out.Engine.RecomputeGranularity = s.Recompute
	}
	if err := out.Validate(); err != nil {
		return nil, nil, fmt.Errorf("Distributed.auto: the chosen plan %s: %w", s, err)
	}
	fmt.Fprintf(stdout, "[plan] auto: %d worker(s) on %s; %d plans, %d rejected\n", world, dev.Name, len(plans), countRejected(plans))
	fmt.Fprintf(stdout, "[plan] chosen %s\n", planner.Summary(best))
	fmt.Fprintf(stdout, "[plan] applied: %s\n", strings.Join(planner.Overrides(s, m.GlobalBatch), " "))
	return &out, &best, nil
}

func countRejected(plans []planner.Plan) int {
	n := 0
	for _, p := range plans {
		if !p.Feasible {
			n++
		}
	}
	return n
}

// reportPlan logs the measured step time and memory beside the plan's
// prediction.
func reportPlan(stdout io.Writer, p *planner.Plan, stepS float64, mem engine.Memory) {
	rel := func(got, want float64) string {
		if want == 0 {
			return "n/a"
		}
		return strconv.FormatFloat(100*(got-want)/want, 'f', 1, 64) + "%"
	}
	fmt.Fprintf(stdout, "[plan] measured: step %.3f s (predicted %.3f s, %s), memory %.3f GB (predicted %.3f GB, %s)\n",
		stepS, p.StepTime, rel(stepS, p.StepTime), float64(mem.Total())/1e9, float64(p.Mem.Total)/1e9, rel(float64(mem.Total()), float64(p.Mem.Total)))
}

// worldSize is the number of ranks of w; 1 without one.
func worldSize(w *comm.World) int {
	if w == nil {
		return 1
	}
	return w.Size()
}

// newPlanner returns the Job screen's planner: the strategies of the job's
// config on the rank table's devices, with the device profile the UI
// picked from the nodes' probes, ranked as 'gptui plan' ranks them with no
// degree fixed, the config's own marked, each with the overrides that
// select it. The UI calls it in a command when the job changes.
func newPlanner() tui.Planner {
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
	dev, err := deviceProfile(req.Device, path, nil)
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
			place = fmt.Sprintf("plan %d of %d", len(r.Plans)+1, countFeasible(plans))
		}
		r.Plans = append(r.Plans, tui.PlanRow{
			Strategy: p.Strategy.String(), MemBytes: p.Mem.Total, StepS: p.StepTime, TokensPerS: p.TokensPerS,
			MFU: p.MFU, Bubble: bubble, CommS: p.Time.Comm, Current: current,
			Overrides: applyOverrides(req.Overrides, planner.Overrides(p.Strategy, m.GlobalBatch), refOverrides),
		})
	}
	r.Reasons = planner.ReasonCounts(plans)
	if !ref.Feasible {
		place = "rejected: " + ref.Reason
	}
	mem := ref.Mem
	gb := func(b int64) float64 { return float64(b) / 1e9 }
	r.Estimate = []string{
		fmt.Sprintf("config's strategy %s: %.2f of %.2f GB/device, step %.3f s, %s", ref.Strategy, gb(mem.Total), gb(ref.Capacity), ref.StepTime, place),
		fmt.Sprintf("on %s, per device: params %.2f, grads %.2f, optimizer %.2f, activations %.2f, other %.2f GB",
			cl, gb(mem.Params), gb(mem.Grads), gb(mem.Optimizer), gb(mem.Activations), gb(mem.Other)),
	}
	return r, nil
}

func countFeasible(plans []planner.Plan) int { return len(plans) - countRejected(plans) }

// overrideAliases maps the seeds' spellings of the keys planner.Overrides
// sets to the schema's, which planner.Overrides uses.
var overrideAliases = map[string]string{
	"Distributed.data_parallel":          "Distributed.dp_degree",
	"Distributed.tensor_parallel_degree": "Distributed.mp_degree", "Distributed.model_parallel": "Distributed.mp_degree",
	"Distributed.pipeline_parallel_degree": "Distributed.pp_degree", "Distributed.pipeline_stage": "Distributed.pp_degree",
	"Distributed.virtual_pp_degree": "Distributed.vpp_degree", "Distributed.virtual_pipeline_model_parallel_size": "Distributed.vpp_degree",
	"Distributed.sharding_parallel_degree": "Distributed.sharding.sharding_degree",
}

// overrideKey is the schema's spelling of an override's key.
func overrideKey(kv string) string {
	k, _, _ := strings.Cut(kv, "=")
	k = strings.TrimSpace(k)
	if c, ok := overrideAliases[k]; ok {
		return c
	}
	return k
}

// applyOverrides returns the overrides existing with the plan whose
// overrides are target applied, where current are those of the config's
// own strategy: each target override whose value differs from the
// current one replaces the existing override of its key (in any spelling)
// or is added; the others are kept.
func applyOverrides(existing, target, current []string) []string {
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

// planCommand is the 'gptui plan' command line that ranks the same plans
// as the Job screen: the job's config and overrides, less those that would
// fix part of the strategy (the search has nothing fixed), with the global
// batch kept.
func planCommand(req tui.PlanRequest, cl planner.Cluster, globalBatch int) string {
	args := []string{"gptui", "plan", "-c", shellWord(req.Config)}
	dropped := false
	for _, o := range req.Overrides {
		k, _, _ := strings.Cut(o, "=")
		k = strings.TrimSpace(k)
		switch {
		case degreeKeys[k] != "", k == "Distributed.pp_schedule", k == "Global.local_batch_size", k == "Global.global_batch_size":
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
