package planner

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestProfileInterNodeLink: a profile with a measured link between nodes
// keeps it through SaveProfile and LoadProfile; one saved before that link
// was measured (no inter_measured; with the built-in inter_bw, or none at
// all) still loads, with the built-in figure, and Links says so. The link
// between nodes sets the step time of a dp group that crosses nodes, and
// only of one that does.
func TestProfileInterNodeLink(t *testing.T) {
	dir := t.TempDir()
	builtin := device(t, "cpu")
	measured := builtin
	measured.Measured = "2026-03-01T12:00:00Z on test"
	measured.InterBW, measured.InterMeasured = 1.2e9, "2026-03-01T12:00:00Z between a and b"
	path := filepath.Join(dir, "new", "cpu.json")
	if err := SaveProfile(path, measured); err != nil {
		t.Fatal(err)
	}
	got, err := LoadProfile(path)
	if err != nil || got != measured {
		t.Fatalf("reloaded %+v, %v; want %+v", got, err, measured)
	}

	old := `{"name": "CPU", "accounting": "engine", "mem_bytes": 25769803776, "peak_flops": 1.1e11, "gemm_flops": 8.25e10,
		"gemm_half_rows": 48, "optimizer_params_per_s": 5e8, "intra_bw": 1.2e9, %s "overlap": 0, "shared_node": true, "cores": 2,
		"measured": "2026-01-01T00:00:00Z on cpu"}`
	for _, tc := range []struct{ name, inter string }{
		{"with the built-in inter_bw", `"inter_bw": 1e8,`},
		{"without inter_bw", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".json")
			os.WriteFile(p, []byte(strings.Replace(old, "%s", tc.inter, 1)), 0o644)
			d, err := LoadProfile(p)
			if err != nil {
				t.Fatal(err)
			}
			if d.InterBW != builtin.InterBW || d.InterMeasured != "" || d.IntraBW != 1.2e9 {
				t.Errorf("old profile: inter %g (%q), intra %g", d.InterBW, d.InterMeasured, d.IntraBW)
			}
			links := Cluster{Nodes: 2, DevicesPerNode: 1, Device: d}.Links()
			for _, w := range []string{"1.20 GB/s inside a node (measured)", "0.10 GB/s between nodes (built-in, not measured", "gptui plan --profile --hosts"} {
				if !strings.Contains(links, w) {
					t.Errorf("Links() = %q, lacks %q", links, w)
				}
			}
		})
	}
	if l := (Cluster{Nodes: 2, DevicesPerNode: 1, Device: measured}).Links(); !strings.Contains(l, "1.20 GB/s between nodes (measured 2026-03-01T12:00:00Z between a and b)") {
		t.Errorf("Links() = %q", l)
	}

	m := ModelOf(mustLoad(t, "tiny", "Distributed.dp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=4"))
	dp2 := Strategy{DP: 2, MicroBatch: 4}
	for _, tc := range []struct {
		nodes, perNode int
		differ         bool
	}{
		{2, 1, true},  // the dp group spans both nodes
		{1, 2, false}, // it stays inside one
	} {
		a := Estimate(m, Cluster{Nodes: tc.nodes, DevicesPerNode: tc.perNode, Device: builtin}, dp2)
		b := Estimate(m, Cluster{Nodes: tc.nodes, DevicesPerNode: tc.perNode, Device: measured}, dp2)
		if !a.Feasible || !b.Feasible {
			t.Fatalf("dp2 on %d×%d: %s / %s", tc.nodes, tc.perNode, a.Reason, b.Reason)
		}
		if differ := a.StepTime != b.StepTime; differ != tc.differ {
			t.Errorf("dp2 on %d node(s) × %d: step %.4f s at 0.1 GB/s between nodes, %.4f s at 1.2 GB/s", tc.nodes, tc.perNode, a.StepTime, b.StepTime)
		}
		if tc.differ && b.StepTime >= a.StepTime {
			t.Errorf("the faster link between nodes made dp2 slower: %.4f s, %.4f s", a.StepTime, b.StepTime)
		}
	}
}

// TestClassifierTime: the softmax cross-entropy adds rows·V/rate to a
// step for the node as a whole, however tensor parallelism splits the
// vocabulary among the node's workers, and nothing where the profile has
// no rate for it.
func TestClassifierTime(t *testing.T) {
	cpu := device(t, "cpu")
	none := cpu
	none.ClassifierPerS = 0
	for _, tc := range []struct {
		name      string
		overrides []string
		s         Strategy
		devices   int
	}{
		{"single", nil, Strategy{MicroBatch: 8}, 1},
		{"accumulate 4", nil, Strategy{MicroBatch: 2}, 1},
		{"mp2", []string{"Distributed.mp_degree=2"}, Strategy{MP: 2, MicroBatch: 8}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := ModelOf(mustLoad(t, "tiny", tc.overrides...))
			with := Estimate(m, Cluster{Nodes: 1, DevicesPerNode: tc.devices, Device: cpu}, tc.s)
			without := Estimate(m, Cluster{Nodes: 1, DevicesPerNode: tc.devices, Device: none}, tc.s)
			if !with.Feasible || !without.Feasible {
				t.Fatalf("%s / %s", with.Reason, without.Reason)
			}
			want := float64(m.GlobalBatch*m.SeqLen) * float64(m.V) / cpu.ClassifierPerS
			if got := with.StepTime - without.StepTime; math.Abs(got-want) > 1e-9*want {
				t.Errorf("the classifier adds %.6f s, want rows·V/rate = %.6f s", got, want)
			}
		})
	}
}
