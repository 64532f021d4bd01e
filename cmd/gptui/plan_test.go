package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gptui/gptui/planner"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/ranktable"
	"github.com/gptui/gptui/tui"
	"github.com/gptui/gptui/tui/hooks"
)

// TestPlanJSON: --json prints a list of plans with exactly the documented
// fields, feasible ones first and fastest first.
func TestPlanJSON(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	code, out, stderr := runCLI(t, "plan", "-c", "1.3b-dp8", "--nodes", "1", "--devices-per-node", "8", "--json", "--top", "3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var plans []map[string]any
	if err := json.Unmarshal([]byte(out), &plans); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(plans) != 6 {
		t.Fatalf("%d plans, want 3 feasible and 3 rejected", len(plans))
	}
	want := []string{"cp", "dp", "feasible", "mem_bytes", "mfu", "micro_batch_size", "mp", "pp", "reason", "recompute", "sequence_parallel", "sharding_degree", "sharding_stage", "step_time_s", "tokens_per_s", "vpp"}
	for i, p := range plans {
		var keys []string
		for k := range p {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, want) {
			t.Errorf("plan %d has fields %v, want %v", i, keys, want)
		}
		mem, _ := p["mem_bytes"].(map[string]any)
		var mk []string
		for k := range mem {
			mk = append(mk, k)
		}
		slices.Sort(mk)
		if !slices.Equal(mk, []string{"activations", "grads", "optimizer", "other", "params", "scratch", "total"}) {
			t.Errorf("plan %d mem_bytes fields %v", i, mk)
		}
		if feasible := p["feasible"].(bool); feasible != (i < 3) {
			t.Errorf("plan %d feasible %v", i, feasible)
		}
		if i > 0 && i < 3 && p["step_time_s"].(float64) < plans[i-1]["step_time_s"].(float64) {
			t.Errorf("plan %d faster than plan %d", i, i-1)
		}
	}
	if plans[3]["reason"] == "" {
		t.Errorf("a rejected plan without a reason: %v", plans[3])
	}
}

// TestPlanTable: the table, the rejected plans with reasons, the chosen
// plan against the config's own strategy, and what a checkpoint costs
// its ranks.
func TestPlanTable(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	code, out, stderr := runCLI(t, "plan", "-c", "13b-4node", "--nodes", "4", "--devices-per-node", "8", "--top", "3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, w := range []string{"cluster: 4 node(s) × 8 V100-32G", "strategy", "total GiB", "tokens/s", "MFU", "bubble", "rejected:", "out of memory",
		"chosen: ", "config's strategy dp4 mp2 pp4 mb1 full", "as fast",
		// The chosen plan's checkpoint, by the engine's account: every
		// parameter and both moments of 13B once, in fp32.
		"144 GiB per save in all, each rank writing its own part, at most "} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

// TestPlanDefaultCluster: without --hosts, --nodes or --devices-per-node
// the planner plans for the devices the config's own strategy uses.
func TestPlanDefaultCluster(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	for _, tc := range []struct {
		args    []string
		cluster string
	}{
		{[]string{"-c", "13b-4node"}, "cluster: 4 node(s) × 8 V100-32G"},
		{[]string{"-c", "6.7b-sharding16"}, "cluster: 2 node(s) × 8 V100-32G"},
		{[]string{"-c", "1.3b-dp8"}, "cluster: 1 node(s) × 8 V100-32G"},
		{[]string{"-c", "345m-1card"}, "cluster: 1 node(s) × 1 V100-32G"},
		{[]string{"-c", "tiny", "-o", "Distributed.dp_degree=2", "-o", "Global.global_batch_size=16"}, "cluster: 1 node(s) × 2 CPU"},
		{[]string{"-c", "1.3b-dp8", "-o", "Distributed.dp_degree=12"}, "cluster: 1 node(s) × 12 V100-32G"},
		{[]string{"-c", "13b-4node", "--nodes", "2"}, "cluster: 2 node(s) × 8 V100-32G"},
	} {
		code, out, stderr := runCLI(t, append([]string{"plan", "--top", "1"}, tc.args...)...)
		if code != 0 {
			t.Errorf("%v: exit %d: %s", tc.args, code, stderr)
			continue
		}
		if !strings.Contains(out, tc.cluster) {
			t.Errorf("%v: want %q in:\n%s", tc.args, tc.cluster, out)
		}
		if sized := strings.Contains(out, "the devices the config's strategy uses"); sized == slices.Contains(tc.args, "--nodes") {
			t.Errorf("%v: the note on the cluster's size is wrong:\n%s", tc.args, out)
		}
	}
}

// TestPlanFixed: with every degree fixed by -o the planner evaluates that
// one plan; with some fixed, every plan keeps them.
func TestPlanFixed(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	plans := func(args ...string) []planner.Plan {
		t.Helper()
		code, out, stderr := runCLI(t, append([]string{"plan", "-c", "13b-4node", "--nodes", "4", "--devices-per-node", "8", "--json", "--top", "0"}, args...)...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		var ps []planner.Plan
		if err := json.Unmarshal([]byte(out), &ps); err != nil {
			t.Fatal(err)
		}
		return ps
	}
	one := plans("-o", "Distributed.dp_degree=4", "-o", "Distributed.mp_degree=2", "-o", "Distributed.pp_degree=4", "-o", "Distributed.sharding.sharding_degree=1")
	if len(one) != 1 || one[0].DP != 4 || one[0].MP != 2 || one[0].PP != 4 || one[0].MicroBatch != 1 || one[0].Recompute != "full" {
		t.Fatalf("all degrees fixed: %+v, want the one plan dp4 mp2 pp4 mb1 full", one)
	}
	if !one[0].Feasible || one[0].Mem.Total <= 0 || one[0].StepTime <= 0 {
		t.Errorf("the seed's 13B layout: %+v", one[0])
	}
	for _, p := range plans("-o", "Distributed.tensor_parallel_degree=4") {
		if p.MP != 4 {
			t.Fatalf("mp fixed to 4 (seeds' spelling), got %s", p.Strategy)
		}
	}
}

// TestPlanHosts: --hosts counts the inventory's nodes and devices.
func TestPlanHosts(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts")
	os.WriteFile(hosts, []byte("# two nodes\nnode1 devices=0-3\nnode2 devices=0-3\n"), 0o644)
	code, out, stderr := runCLI(t, "plan", "-c", "1.3b-dp8", "--hosts", hosts, "--device", "a100-80", "--top", "1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(out, "cluster: 2 node(s) × 4 A100-80G") {
		t.Errorf("output:\n%s", out)
	}
	cpus := filepath.Join(dir, "cpus")
	os.WriteFile(cpus, []byte("localhost devices=cpu:4\n"), 0o644)
	code, out, stderr = runCLI(t, "plan", "-c", "tiny", "--hosts", cpus, "--top", "1")
	if code != 0 || !strings.Contains(out, "1 node(s) × 4 CPU") || !strings.Contains(stderr, "no measured cpu profile") {
		t.Errorf("cpu inventory: exit %d\n%s\n%s", code, out, stderr)
	}
}

// TestPlanBadInput: mistakes exit 2 with one line naming them.
func TestPlanBadInput(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	dir := t.TempDir()
	uneven := filepath.Join(dir, "uneven")
	os.WriteFile(uneven, []byte("a devices=0-7\nb devices=0-3\n"), 0o644)
	noDev := filepath.Join(dir, "nodev")
	os.WriteFile(noDev, []byte("a\n"), 0o644)
	oneNode := filepath.Join(dir, "onenode")
	os.WriteFile(oneNode, []byte("# one node\nlocalhost devices=cpu:2\n"), 0o644)
	badHosts := filepath.Join(dir, "badhosts")
	os.WriteFile(badHosts, []byte("a devices=cpu:1\nb devices=0-x\n"), 0o644)
	badProfile := filepath.Join(dir, "profile.json")
	os.WriteFile(badProfile, []byte(`{"name": "CPU", "accounting": "engine"}`), 0o644)
	negProfile := filepath.Join(dir, "negative.json")
	os.WriteFile(negProfile, []byte(`{"name": "CPU", "accounting": "engine", "mem_bytes": 10000000000, "peak_flops": 1e11, "gemm_flops": 8e10,
		"optimizer_params_per_s": 5e8, "classifier_per_s": -1, "intra_bw": 1e9, "inter_bw": 1e8, "shared_node": true, "cores": 2}`), 0o644)
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"no config", []string{"plan"}, []string{"-c CONFIG"}},
		{"unknown device", []string{"plan", "-c", "tiny", "--device", "tpu"}, []string{"tpu", "V100-32G"}},
		{"ambiguous device", []string{"plan", "-c", "tiny", "--device", "a100"}, []string{"a100"}},
		{"missing hosts", []string{"plan", "-c", "tiny", "--hosts", filepath.Join(dir, "none")}, []string{"none"}},
		{"uneven hosts", []string{"plan", "-c", "tiny", "--hosts", uneven}, []string{"uneven:2", "same number"}},
		{"hosts without devices", []string{"plan", "-c", "tiny", "--hosts", noDev}, []string{"nodev:1", "devices="}},
		{"hosts and nodes", []string{"plan", "-c", "tiny", "--hosts", uneven, "--nodes", "2"}, []string{"--hosts", "--nodes"}},
		{"zero nodes", []string{"plan", "-c", "tiny", "--nodes", "0"}, []string{"0 node"}},
		{"negative top", []string{"plan", "-c", "tiny", "--top", "-1"}, []string{"--top"}},
		{"profile on one node", []string{"plan", "--profile", "--hosts", oneNode}, []string{"onenode", "two nodes", "has 1"}},
		{"profile, bad inventory", []string{"plan", "--profile", "--hosts", badHosts}, []string{"badhosts:2", "0-x"}},
		{"profile, missing inventory", []string{"plan", "--profile", "--hosts", filepath.Join(dir, "none")}, []string{"none"}},
		{"accept keys without profile", []string{"plan", "-c", "tiny", "--hosts", oneNode, "--accept-new-host-keys"}, []string{"--accept-new-host-keys", "--profile --hosts"}},
		{"bad profile", []string{"plan", "-c", "tiny", "--device", "cpu", "--profile-file", badProfile}, []string{"profile.json", "gptui plan --profile"}},
		{"negative classifier rate", []string{"plan", "-c", "tiny", "--device", "cpu", "--profile-file", negProfile}, []string{"negative.json", "classifier_per_s", "gptui plan --profile"}},
		{"auto not a bool", []string{"plan", "-c", "tiny", "-o", "Distributed.auto=maybe"}, []string{"Distributed.auto"}},
		{"no layout", []string{"plan", "-c", "tiny", "--devices-per-node", "3"}, []string{"no valid layout"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCLI(t, tc.args...)
			checkUserError(t, code, stderr, tc.want)
		})
	}
}

// TestTrainAuto: Distributed.auto plans, prints the choice and applies it,
// and compares the measured step and memory with the prediction.
func TestTrainAuto(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	code, out, stderr := runCLI(t, append([]string{"train", "-c", "tiny", "-o", "Distributed.auto=true", "-o", "Engine.max_steps=3",
		"-o", "Engine.eval_freq=0", "-o", "Engine.log_dir=" + t.TempDir(), "-o", "Global.global_batch_size=4", "-o", "Global.local_batch_size=4", "-o", "Global.micro_batch_size=4"},
		ownOutput(t)...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, w := range []string{"[plan] auto: 1 worker(s)", "[plan] chosen ", "[plan] applied: ", "Global.micro_batch_size=4", "[plan] measured: step ", "(predicted "} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	// micro_batch_size was fixed by -o: the plan keeps it.
	if !strings.Contains(out, "[batch] global: 4 local: 4 micro: 4") {
		t.Errorf("the plan did not keep micro_batch_size 4:\n%s", out)
	}
}

// TestPlanProfile: --profile --hosts measures this machine (re-executing
// the binary for the local link's second end) and the link between two
// sshd nodes (127.0.0.2 and 127.0.0.3, one worker each, started by the
// cluster runner), and saves a profile later plans use: the measured link
// between nodes changes the predicted step of a dp plan that crosses them,
// and a profile saved without it still loads, with the built-in figure and
// a note.
func TestPlanProfile(t *testing.T) {
	long(t)
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	bin := builtGPTUI(t)
	c := newSSHCluster(t, "cpu:1")
	env := append(os.Environ(), "HOME="+c.home, "SSH_AUTH_SOCK=", "GPTUI_THREADS=1")
	gptui := func(args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	path := filepath.Join(t.TempDir(), "p", "cpu.json")
	out, err := gptui("plan", "--profile", "--hosts", c.hosts, "--profile-file", path)
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	d, err := planner.LoadProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	if d.PeakFLOPS < 1e9 || d.IntraBW < 1e7 || d.OptimizerParamsPerS < 1e6 || d.Measured == "" {
		t.Errorf("implausible profile %+v", d)
	}
	if d.InterBW <= 0 || !strings.Contains(d.InterMeasured, "127.0.0.2") || !strings.Contains(d.InterMeasured, "127.0.0.3") {
		t.Errorf("the link between nodes: %.3g B/s, measured %q", d.InterBW, d.InterMeasured)
	}
	t.Logf("profile: sgemm %.1f GFLOP/s, AdamW %.0f M params/s, link %.2f GB/s, between nodes %.2f GB/s", d.PeakFLOPS/1e9, d.OptimizerParamsPerS/1e6, d.IntraBW/1e9, d.InterBW/1e9)

	// dp2 over the two nodes, every degree fixed: one plan.
	step := func(profile string) (float64, string) {
		t.Helper()
		out, err := gptui("plan", "-c", "tiny", "--hosts", c.hosts, "--profile-file", profile, "--json",
			"-o", "Distributed.dp_degree=2", "-o", "Distributed.mp_degree=1", "-o", "Distributed.pp_degree=1", "-o", "Distributed.sharding.sharding_degree=1", "-o", "Global.local_batch_size=4", "-o", "Global.micro_batch_size=4")
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		var ps []planner.Plan
		if err := json.Unmarshal([]byte(out[strings.Index(out, "["):]), &ps); err != nil || len(ps) != 1 || ps[0].StepTime <= 0 {
			t.Fatalf("%v: %s", err, out)
		}
		table, err := gptui("plan", "-c", "tiny", "--hosts", c.hosts, "--profile-file", profile, "--top", "1")
		if err != nil {
			t.Fatalf("%v: %s", err, table)
		}
		return ps[0].StepTime, table
	}
	measured, table := step(path)
	if !strings.Contains(table, "measured ") || !strings.Contains(table, fmt.Sprintf("%.2f GB/s between nodes (measured ", d.InterBW/1e9)) {
		t.Errorf("plan with the measured profile:\n%s", table)
	}

	// The same profile as saved before the link between nodes was
	// measured: no inter_measured, and the built-in inter_bw.
	var old map[string]any
	b, _ := os.ReadFile(path)
	json.Unmarshal(b, &old)
	delete(old, "inter_measured")
	builtin, _ := planner.LookupDevice("cpu")
	old["inter_bw"] = builtin.InterBW
	b, _ = json.Marshal(old)
	oldPath := filepath.Join(t.TempDir(), "old.json")
	os.WriteFile(oldPath, b, 0o644)
	fixed, table := step(oldPath)
	if !strings.Contains(table, "0.10 GB/s between nodes (built-in, not measured: 'gptui plan --profile --hosts FILE'") {
		t.Errorf("plan with an old profile lacks the note:\n%s", table)
	}
	t.Logf("tiny dp2 across the nodes: step %.4f s with the measured link, %.4f s with the built-in one", measured, fixed)
	if (d.InterBW > builtin.InterBW) != (measured < fixed) || measured == fixed {
		t.Errorf("step %.4f s at %.3g B/s between nodes, %.4f s at %.3g B/s", measured, d.InterBW, fixed, builtin.InterBW)
	}
}

// TestTUIPlanner: the Job screen's planner ranks the job's strategies as
// 'gptui plan' does (its command lists the same plans in the same order),
// marks the config's own, and gives each plan the overrides that turn the
// job into it: applied, they resolve to that strategy, replacing the
// seeds' spellings of the keys they set.
func TestTUIPlanner(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir()) // the built-in cpu profile
	plan := hooks.Planner()
	two := ranktable.Build([]ranktable.ServerInput{{ServerID: "127.0.0.1", DeviceIDs: []int{0, 1}}})
	for _, tc := range []struct {
		name      string
		overrides []string
		current   string
	}{
		{"schema keys", []string{"Distributed.dp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=4", "Engine.max_steps=7"}, "dp2 mb4"},
		{"seeds' keys", []string{"Distributed.data_parallel=2", "Global.local_batch_size=4", "Global.micro_batch_size=4", "Engine.max_steps=7"}, "dp2 mb4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := presets.Load("tiny", tc.overrides)
			if err != nil {
				t.Fatal(err)
			}
			req := tui.PlanRequest{Config: "tiny", Overrides: tc.overrides, Resolved: cfg, Table: two, Device: "cpu"}
			r, err := plan(req)
			if err != nil {
				t.Fatal(err)
			}
			if !r.Fits || len(r.Estimate) != 2 || !strings.Contains(r.Estimate[0], "config's strategy "+tc.current+": ") || !strings.Contains(r.Estimate[0], " GiB per device, step ") ||
				!strings.Contains(r.Estimate[0], ", plan ") || !strings.Contains(r.Estimate[1], "on 1 node(s) × 2 CPU, per device: params ") {
				t.Errorf("estimate (fits %v):\n%s", r.Fits, strings.Join(r.Estimate, "\n"))
			}
			if len(r.Plans) < 3 || r.Rejected == 0 || r.Reasons == "" || !strings.Contains(r.Note, "links: ") {
				t.Fatalf("%d plans, %d rejected (%s), note %q", len(r.Plans), r.Rejected, r.Reasons, r.Note)
			}
			currents := 0
			for i, p := range r.Plans {
				if i > 0 && p.StepS < r.Plans[i-1].StepS {
					t.Errorf("plan %d (%s) is faster than plan %d", i+1, p.Strategy, i)
				}
				if p.Current {
					currents++
					if p.Strategy != tc.current || !slices.Equal(p.Overrides, tc.overrides) {
						t.Errorf("the config's plan %s has overrides %q", p.Strategy, p.Overrides)
					}
				}
				got, err := presets.Load("tiny", p.Overrides)
				if err != nil {
					t.Errorf("plan %s: its overrides %q: %v", p.Strategy, p.Overrides, err)
					continue
				}
				if s := planner.StrategyOf(got).String(); s != p.Strategy || got.Global.GlobalBatchSize != cfg.Global.GlobalBatchSize || got.Engine.MaxSteps != 7 {
					t.Errorf("plan %s: its overrides %q resolve to %s, global batch %d, max_steps %d", p.Strategy, p.Overrides, s, got.Global.GlobalBatchSize, got.Engine.MaxSteps)
				}
				dpKeys := 0
				for _, o := range p.Overrides {
					if k, _, _ := strings.Cut(o, "="); presets.CanonicalKey(k) == "Distributed.dp_degree" {
						dpKeys++
					}
				}
				if dpKeys != 1 {
					t.Errorf("plan %s: %d overrides of the dp degree in %q", p.Strategy, dpKeys, p.Overrides)
				}
			}
			if currents != 1 {
				t.Errorf("%d plans marked as the config's", currents)
			}

			// The command lists the same feasible plans in the same order.
			args := strings.Fields(r.Command)
			if args[0] != "gptui" || slices.Contains(args, "Distributed.dp_degree=2") || slices.Contains(args, "Distributed.data_parallel=2") {
				t.Fatalf("command %q", r.Command)
			}
			code, out, stderr := runCLI(t, append(args[1:], "--json")...)
			if code != 0 {
				t.Fatalf("%s: exit %d: %s", r.Command, code, stderr)
			}
			var listed []planner.Plan
			if err := json.Unmarshal([]byte(out), &listed); err != nil {
				t.Fatal(err)
			}
			var feasible []string
			rejected := 0
			for _, p := range listed {
				if p.Feasible {
					feasible = append(feasible, p.Strategy.String())
				} else {
					rejected++
				}
			}
			var shown []string
			for _, p := range r.Plans {
				shown = append(shown, p.Strategy)
			}
			t.Logf("%s: %d plans, the first %q, %d rejected (%s); plan 2's overrides %q", r.Command, len(shown), shown[:3], r.Rejected, r.Reasons, r.Plans[1].Overrides)
			if !slices.Equal(feasible, shown) || rejected != r.Rejected {
				t.Errorf("%s lists %v and %d rejected; the screen %v and %d", r.Command, feasible, rejected, shown, r.Rejected)
			}
		})
	}

	// The seeds' 13B layout on 4 × 8 V100s: ranked, out-of-memory plans
	// counted, the config's own found.
	cfg, err := presets.Load("13b-4node", nil)
	if err != nil {
		t.Fatal(err)
	}
	var servers []ranktable.ServerInput
	for i := range 4 {
		servers = append(servers, ranktable.ServerInput{ServerID: fmt.Sprintf("10.0.0.%d", i), DeviceIDs: []int{0, 1, 2, 3, 4, 5, 6, 7}})
	}
	r, err := plan(tui.PlanRequest{Config: "13b-4node", Resolved: cfg, Table: ranktable.Build(servers), Device: "V100-32G"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.Reasons, "out of memory") || !strings.Contains(r.Command, "--nodes 4 --devices-per-node 8 --device v100-32g") ||
		!slices.ContainsFunc(r.Plans, func(p tui.PlanRow) bool { return p.Current && p.Strategy == "dp4 mp2 pp4 mb1 full" && p.Bubble > 0 }) {
		t.Errorf("13b-4node: %d plans, rejected %d (%s), command %q", len(r.Plans), r.Rejected, r.Reasons, r.Command)
	}

	uneven := ranktable.Build([]ranktable.ServerInput{{ServerID: "a", DeviceIDs: []int{0, 1}}, {ServerID: "b", DeviceIDs: []int{0}}})
	if _, err := plan(tui.PlanRequest{Config: "13b-4node", Resolved: cfg, Table: uneven, Device: "V100-32G"}); err == nil || !strings.Contains(err.Error(), "same number of devices") {
		t.Errorf("uneven nodes: %v", err)
	}
}
