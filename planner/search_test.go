package planner

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// searchCases are the search-time targets: the 13B model on 32 and on
// 1,024 V100s (global batch 1,536 so that every replica count divides it).
var searchCases = []struct {
	nodes int
	limit time.Duration
}{
	{4, time.Second},
	{128, 10 * time.Second},
}

func searchModel(t testing.TB) Model {
	return ModelOf(mustLoad(t, "13b-4node", "Global.global_batch_size=1536", "Global.local_batch_size=384"))
}

// TestSearchTime: the whole search for 32 devices takes under 1 s and for
// 1,024 devices under 10 s.
func TestSearchTime(t *testing.T) {
	m := searchModel(t)
	for _, tc := range searchCases {
		c := Cluster{Nodes: tc.nodes, DevicesPerNode: 8, Device: device(t, "V100-32G")}
		start := time.Now()
		plans, err := Search(m, c, Options{})
		d := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		feasible := 0
		for _, p := range plans {
			if p.Feasible {
				feasible++
			}
		}
		t.Logf("%d devices: %d plans (%d feasible) in %v; best %s %.3f s/step", c.Size(), len(plans), feasible, d, plans[0].Strategy, plans[0].StepTime)
		if d > tc.limit {
			t.Errorf("%d devices: search took %v, want under %v", c.Size(), d, tc.limit)
		}
	}
}

func BenchmarkSearch(b *testing.B) {
	m := searchModel(b)
	for _, tc := range searchCases {
		c := Cluster{Nodes: tc.nodes, DevicesPerNode: 8, Device: device(b, "V100-32G")}
		b.Run(fmt.Sprintf("devices=%d", c.Size()), func(b *testing.B) {
			for b.Loop() {
				if _, err := Search(m, c, Options{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestSearchSpace checks the rules of the search on one model: every plan
// uses all the devices, mp divides the heads and stays in a node, pp
// divides the layers, vpp only with pp > 2, micro-batches divide the local
// batch, every recompute mode appears, and infeasible plans carry reasons.
func TestSearchSpace(t *testing.T) {
	m := ModelOf(mustLoad(t, "1.3b-dp8"))
	c := Cluster{Nodes: 2, DevicesPerNode: 4, Device: device(t, "A100-40G")}
	plans, err := Search(m, c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i, p := range plans {
		s := p.Strategy
		local := m.GlobalBatch / s.Replicas()
		switch {
		case s.Devices() != 8:
			t.Errorf("%s uses %d devices", s, s.Devices())
		case m.NH%s.MP != 0 || s.MP > 4:
			t.Errorf("%s: mp does not divide the heads or leaves the node", s)
		case m.L%s.PP != 0:
			t.Errorf("%s: pp does not divide the layers", s)
		case s.VPP > 1 && s.PP <= 2:
			t.Errorf("%s: vpp with pp ≤ 2", s)
		case local%s.MicroBatch != 0:
			t.Errorf("%s: micro-batch does not divide the local batch %d", s, local)
		case !p.Feasible && p.Reason == "":
			t.Errorf("%s: infeasible without a reason", s)
		case i > 0 && p.Feasible && plans[i-1].Feasible && p.StepTime < plans[i-1].StepTime:
			t.Errorf("%s ranked after a slower plan", s)
		}
		seen[s.Recompute] = true
		seen[fmt.Sprintf("stage%d", s.ShardingStage)] = true
		if s.VPP > 1 {
			seen["vpp"] = true
		}
		if s.MP == 4 && s.PP == 2 {
			seen["mp4pp2"] = true
		}
	}
	for _, k := range []string{RecomputeNone, RecomputeFull, RecomputeOnlyAttn, "stage1", "stage2", "stage3", "mp4pp2", "vpp"} {
		if !seen[k] {
			t.Errorf("the search never tried %s", k)
		}
	}
}

// TestSemiAutoAndCapabilities: fixed degrees are kept, and capabilities
// refuse the strategies they exclude.
func TestSemiAutoAndCapabilities(t *testing.T) {
	m := ModelOf(mustLoad(t, "13b-4node"))
	c := Cluster{Nodes: 4, DevicesPerNode: 8, Device: device(t, "V100-32G")}
	plans, err := Search(m, c, Options{Fixed: Fixed{MP: 2, PP: 4}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plans {
		if p.MP != 2 || p.PP != 4 {
			t.Fatalf("fixed mp 2 pp 4, got %s", p.Strategy)
		}
	}
	// Capabilities narrower than the engine's refuse what they exclude,
	// with the reason; the engine's own refuse nothing.
	narrow := Capabilities{Name: "a narrow engine", MaxMP: 1 << 30, MaxPP: 1, MaxVPP: 1, MaxShardingStage: 2}
	tiny, cpu := ModelOf(mustLoad(t, "tiny")), Cluster{Nodes: 1, DevicesPerNode: 4, Device: device(t, "cpu")}
	plans, err = Search(tiny, cpu, Options{Caps: narrow})
	if err != nil {
		t.Fatal(err)
	}
	var refused int
	for _, p := range plans {
		unsupported := p.PP > 1 || p.ShardingDegree > 1 && p.ShardingStage == 3
		if p.Feasible && unsupported {
			t.Errorf("%s feasible under %s", p.Strategy, narrow.Name)
		}
		if unsupported && strings.Contains(p.Reason, "not supported by a narrow engine") {
			refused++
		}
	}
	if refused == 0 {
		t.Errorf("no plan refused for %s", narrow.Name)
	}
	// The engine's own refuse nothing, sequence and context parallelism
	// included.
	plans, err = Search(tiny, cpu, Options{Caps: EngineCapabilities()})
	if err != nil {
		t.Fatal(err)
	}
	var sp, cp int
	for _, p := range plans {
		if strings.Contains(p.Reason, "not supported") {
			t.Errorf("%s refused under the engine's capabilities: %s", p.Strategy, p.Reason)
		}
		if p.Feasible && p.SP {
			sp++
		}
		if p.Feasible && p.CP > 1 {
			cp++
		}
	}
	if sp == 0 || cp == 0 {
		t.Errorf("under the engine's capabilities %d feasible plans with sequence parallelism, %d with context parallelism; want some of each", sp, cp)
	}
	if _, ok := Best(plans); !ok {
		t.Error("no best plan under the engine's capabilities")
	}
}

// TestSearchErrorIsASentence: a search with no layout says so in words,
// naming what was fixed, never printing a struct.
func TestSearchErrorIsASentence(t *testing.T) {
	m := ModelOf(mustLoad(t, "tiny"))
	c := Cluster{Nodes: 1, DevicesPerNode: 3, Device: device(t, "cpu")}
	_, err := Search(m, c, Options{})
	if err == nil || strings.ContainsAny(err.Error(), "{}") || strings.Contains(err.Error(), "fixed") {
		t.Errorf("nothing fixed: %v", err)
	}
	_, err = Search(m, Cluster{Nodes: 1, DevicesPerNode: 2, Device: device(t, "cpu")}, Options{Fixed: Fixed{DP: 3, MicroBatch: 2}})
	if err == nil || strings.ContainsAny(err.Error(), "{}") || !strings.Contains(err.Error(), "and dp 3, micro-batch 2 fixed") {
		t.Errorf("dp 3 fixed on 2 devices: %v", err)
	}
}

func TestProfileForGPU(t *testing.T) {
	for _, tc := range []struct {
		name string
		mem  int64
		want string
	}{
		{"NVIDIA H100 80GB HBM3", 80 << 30, "H100-80G"},
		{"NVIDIA A100-SXM4-80GB", 80 << 30, "A100-80G"},
		{"NVIDIA A100-SXM4-40GB", 40 << 30, "A100-40G"},
		{"Tesla V100-SXM2-32GB", 32 << 30, "V100-32G"},
		{"NVIDIA H200", 141e9, "H200-141G"},
		{"NVIDIA GeForce RTX 4090", 24 << 30, ""},
	} {
		if got := ProfileForGPU(tc.name, tc.mem); got != tc.want {
			t.Errorf("ProfileForGPU(%q) = %q, want %q", tc.name, got, tc.want)
		}
		if tc.want != "" {
			if _, err := LookupDevice(tc.want); err != nil {
				t.Errorf("%s: %v", tc.want, err)
			}
		}
	}
}

// TestSearchLlama: the search lays a Llama's key/value heads out as the
// engine can — mp divides them or is a multiple of them — and reaches
// both kinds: a llama-tiny widened to 12 query heads sharing 4 key/value
// heads, on 12 devices of one node, gets plans with mp 1, 2, 4 and 12
// (each key/value head on three ranks) and none with mp 3 or 6, though
// they divide the query heads; fixing mp 6 leaves no layout, and the
// error says so.
func TestSearchLlama(t *testing.T) {
	m := ModelOf(mustLoad(t, "llama-tiny", "Model.hidden_size=96", "Model.num_attention_heads=12", "Model.num_key_value_heads=4",
		"Model.ffn_hidden_size=192", "Global.global_batch_size=24", "Global.local_batch_size=24"))
	c := Cluster{Nodes: 1, DevicesPerNode: 12, Device: device(t, "H100-80G")}
	plans, err := Search(m, c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]int{}
	for _, p := range plans {
		seen[p.MP]++
		if p.MP == 3 || p.MP == 6 {
			t.Errorf("%s: mp %d neither divides the 4 key/value heads nor is a multiple of them", p.Strategy, p.MP)
		}
	}
	for _, mp := range []int{1, 2, 4, 12} {
		if seen[mp] == 0 {
			t.Errorf("the search never tried mp %d", mp)
		}
	}
	t.Logf("plans by mp: %v", seen)
	_, err = Search(m, c, Options{Fixed: Fixed{MP: 6}})
	if err == nil || !strings.Contains(err.Error(), "no valid layout") || !strings.Contains(err.Error(), "mp 6") {
		t.Errorf("mp 6 fixed: got %v, want no valid layout", err)
	}
}
