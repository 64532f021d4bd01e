package planner

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestStrategySequenceAndContext: sequence parallelism (sp) and context
// parallelism (cp) in a strategy — its devices, its name and its
// overrides — and each strategy round-trips through a preset:
// StrategyOf(Load(Overrides(s))) is s, and so is StrategyOf(Apply(s)).
func TestStrategySequenceAndContext(t *testing.T) {
	for _, tc := range []struct {
		s       Strategy
		devices int
		name    string
		want    []string // among the overrides
	}{
		{Strategy{MP: 2, SP: true, MicroBatch: 1}, 2, "mp2 sp mb1",
			[]string{"Distributed.sequence_parallel=true", "Distributed.cp_degree=1"}},
		{Strategy{MP: 2, SP: true, CP: 2, PP: 2, MicroBatch: 1, Recompute: RecomputeFull}, 8, "mp2 sp cp2 pp2 mb1 full",
			[]string{"Distributed.sequence_parallel=true", "Distributed.cp_degree=2", "Distributed.mp_degree=2", "Distributed.pp_degree=2"}},
		{Strategy{DP: 2, CP: 4, MicroBatch: 2}, 8, "dp2 cp4 mb2",
			[]string{"Distributed.sequence_parallel=false", "Distributed.cp_degree=4", "Global.local_batch_size=8"}},
		{Strategy{ShardingDegree: 2, ShardingStage: 3, MP: 4, SP: true, CP: 2, MicroBatch: 2, Recompute: RecomputeOnlyAttn}, 16, "sharding2/s3 mp4 sp cp2 mb2 only_attn",
			[]string{"Distributed.sequence_parallel=true", "Distributed.cp_degree=2", "Distributed.sharding.sharding_stage=3"}},
		{Strategy{MP: 2, CP: 2, MicroBatch: 4}, 4, "mp2 cp2 mb4",
			[]string{"Distributed.sequence_parallel=false", "Distributed.cp_degree=2"}},
		// sp without mp has no rows to split: off.
		{Strategy{SP: true, CP: 2, MicroBatch: 1}, 2, "cp2 mb1",
			[]string{"Distributed.sequence_parallel=false", "Distributed.cp_degree=2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.s.normalize()
			if s.Devices() != tc.devices {
				t.Errorf("Devices %d, want %d", s.Devices(), tc.devices)
			}
			if s.String() != tc.name {
				t.Errorf("String %q, want %q", s.String(), tc.name)
			}
			gb := 8 * s.Replicas()
			o := Overrides(s, gb)
			for _, w := range tc.want {
				if !slices.Contains(o, w) {
					t.Errorf("overrides %v lack %s", o, w)
				}
			}
			for _, kv := range o {
				if !ChoosesStrategy(kv) && !strings.HasPrefix(kv, "Global.") && !strings.HasPrefix(kv, "Distributed.pp_schedule") {
					t.Errorf("override %s sets the strategy but ChoosesStrategy says no", kv)
				}
			}
			cfg := mustLoad(t, "tiny", o...)
			if got := StrategyOf(cfg); got != s {
				t.Errorf("StrategyOf(Overrides(s)) = %s %+v, want %+v", got, got, s)
			}
			applied, err := Apply(mustLoad(t, "tiny", "Global.global_batch_size="+strconv.Itoa(gb), "Global.local_batch_size="+strconv.Itoa(gb)), tc.s)
			if err != nil {
				t.Fatal(err)
			}
			if got := StrategyOf(applied); got != s {
				t.Errorf("StrategyOf(Apply(s)) = %+v, want %+v", got, s)
			}
			// What the overrides fix is the strategy's.
			f := FixedByOverrides(cfg, o)
			if f.CP != s.CP || f.SP == nil || *f.SP != s.SP || f.MP != s.MP {
				t.Errorf("FixedByOverrides: cp %d sp %v mp %d, want cp %d sp %v mp %d", f.CP, f.SP, f.MP, s.CP, s.SP, s.MP)
			}
			// The JSON names.
			b, err := json.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			var back Strategy
			if err := json.Unmarshal(b, &back); err != nil || back != s || !strings.Contains(string(b), `"sequence_parallel":`) || !strings.Contains(string(b), `"cp":`) {
				t.Errorf("JSON %s: back %+v (%v)", b, back, err)
			}
		})
	}
}

// longSeq is the 345M preset's shape at a sequence of 4096 (mixed
// precision, fp16), global batch 8, without dropout (which context
// parallelism refuses).
func longSeq(t *testing.T, o ...string) Model {
	return ModelOf(mustLoad(t, "345m-1card", append([]string{"Model.max_position_embeddings=4096", "Data.Train.dataset.max_seq_len=4096",
		"Global.micro_batch_size=1", "Model.hidden_dropout_prob=0", "Model.attention_probs_dropout_prob=0"}, o...)...))
}

// TestSequenceParallelMemory: on the 345M shape at T = 4096 with mp 2,
// sequence parallelism keeps fewer activations than tensor parallelism
// alone, under every recompute granularity, in both accountings; and a
// block's mixed-precision activations are Korthikanti et al.'s with it,
// s·b·h·(34/t + 5·a·s/(h·t)) bytes (F = 4h), against s·b·h·(10 + 24/t +
// 5·a·s/(h·t)) without.
func TestSequenceParallelMemory(t *testing.T) {
	m := longSeq(t)
	if m.SeqLen != 4096 || m.F != 4*m.C {
		t.Fatalf("shape: seq %d, F %d, C %d", m.SeqLen, m.F, m.C)
	}
	for _, dev := range []string{"A100-80G", "cpu"} {
		c := Cluster{Nodes: 1, DevicesPerNode: 2, Device: device(t, dev)}
		for _, rc := range []string{RecomputeNone, RecomputeOnlyAttn, RecomputeFull} {
			tp := Estimate(m, c, Strategy{MP: 2, MicroBatch: 1, Recompute: rc})
			sp := Estimate(m, c, Strategy{MP: 2, SP: true, MicroBatch: 1, Recompute: rc})
			if tp.Mem.Total == 0 || sp.Mem.Total == 0 {
				t.Fatalf("%s %s: not estimated: %s / %s", dev, rc, tp.Reason, sp.Reason)
			}
			t.Logf("%s %s: activations mp2 %.3f GiB, mp2 sp %.3f GiB (%.1f%%); step %.3f s, %.3f s",
				dev, rc, float64(tp.Mem.Activations)/(1<<30), float64(sp.Mem.Activations)/(1<<30),
				100*float64(sp.Mem.Activations)/float64(tp.Mem.Activations), tp.StepTime, sp.StepTime)
			if sp.Mem.Activations >= tp.Mem.Activations {
				t.Errorf("%s %s: sequence parallelism keeps %d bytes of activations, tensor parallelism alone %d", dev, rc, sp.Mem.Activations, tp.Mem.Activations)
			}
			if sp.Mem.Params != tp.Mem.Params || sp.Mem.Optimizer != tp.Mem.Optimizer {
				t.Errorf("%s %s: sequence parallelism changed the model states", dev, rc)
			}
			if sp.CommBytes <= tp.CommBytes {
				t.Errorf("%s %s: sequence parallelism sends %.0f bytes a step, no more than tensor parallelism alone's %.0f (it gathers the regions' inputs again)", dev, rc, sp.CommBytes, tp.CommBytes)
			}
		}
	}
	sbh := float64(m.SeqLen) * float64(m.C) // b = 1
	a, s, h := float64(m.NH), float64(m.SeqLen), float64(m.C)
	for _, tc := range []struct {
		st   Strategy
		want float64
	}{
		{Strategy{MP: 2, MicroBatch: 1}, sbh * (10 + 24.0/2 + 5*a*s/(h*2))},
		{Strategy{MP: 2, SP: true, MicroBatch: 1}, sbh * (34.0/2 + 5*a*s/(h*2))},
		{Strategy{MP: 4, SP: true, MicroBatch: 1}, sbh * (34.0/4 + 5*a*s/(h*4))},
		{Strategy{MP: 4, SP: true, MicroBatch: 1, Recompute: RecomputeOnlyAttn}, sbh * 34.0 / 4},
		{Strategy{MP: 4, SP: true, MicroBatch: 1, Recompute: RecomputeFull}, sbh * 2 / 4},
	} {
		st := tc.st.normalize()
		if got := mixedLayerActivations(m, st, st.Recompute); math.Abs(got-tc.want) > 1e-6*tc.want {
			t.Errorf("%s: a block's activations %.0f bytes, Korthikanti et al. %.0f", st, got, tc.want)
		}
	}
}

// TestContextParallelMemory: with attention recomputed (only_attn), where
// nothing kept grows with the sequence's square, a cp 2 rank keeps half
// the activations of one process (its T/2 rows of every sequence), within
// 1% in both accountings; without recompute, on CPU workers less than
// half (the ring keeps no probabilities, the CPU's attention does), on a
// GPU half again (the CUDA backend's attention is flash-style too); and
// the model states are one process's.
func TestContextParallelMemory(t *testing.T) {
	for _, tc := range []struct {
		model string
		m     Model
	}{
		{"345m T=4096", longSeq(t)},
		{"llama-tiny T=256", ModelOf(mustLoad(t, "llama-tiny", "Data.Train.dataset.max_seq_len=256", "Global.micro_batch_size=2"))},
	} {
		for _, dev := range []string{"A100-80G", "cpu"} {
			one := Cluster{Nodes: 1, DevicesPerNode: 1, Device: device(t, dev)}
			two := Cluster{Nodes: 1, DevicesPerNode: 2, Device: device(t, dev)}
			mb := tc.m.GlobalBatch / 4
			for _, rc := range []string{RecomputeOnlyAttn, RecomputeNone} {
				single := Estimate(tc.m, one, Strategy{MicroBatch: mb, Recompute: rc})
				cp := Estimate(tc.m, two, Strategy{CP: 2, MicroBatch: mb, Recompute: rc})
				if single.Mem.Total == 0 || cp.Mem.Total == 0 {
					t.Fatalf("%s %s %s: not estimated: %s / %s", tc.model, dev, rc, single.Reason, cp.Reason)
				}
				r := float64(cp.Mem.Activations) / float64(single.Mem.Activations)
				t.Logf("%s on %s, %s: activations one process %.3f GiB, cp2 %.3f GiB (%.3f); step %.3f s, %.3f s",
					tc.model, dev, rc, float64(single.Mem.Activations)/(1<<30), float64(cp.Mem.Activations)/(1<<30), r, single.StepTime, cp.StepTime)
				flash := one.Device.Accounting == AccountingEngineGPU
				switch {
				case (rc == RecomputeOnlyAttn || flash) && math.Abs(r-0.5) > 0.01:
					t.Errorf("%s %s %s: cp2 keeps %.3f of one process's activations, want half", tc.model, dev, rc, r)
				case rc == RecomputeNone && !flash && r >= 0.5:
					t.Errorf("%s %s %s: cp2 keeps %.3f of one process's activations, want less than half", tc.model, dev, rc, r)
				}
				if cp.Mem.Params != single.Mem.Params || cp.Mem.Optimizer != single.Mem.Optimizer {
					t.Errorf("%s %s %s: context parallelism changed the model states", tc.model, dev, rc)
				}
			}
		}
	}
}

// TestParallelTrafficMatchesEngineCount: the bytes a CPU worker sends per
// step are the engine's own count (engine's TestModelParallelTraffic, on
// its parity model: B 4, T 32, C 32, 2 layers, 2 micro-batches): a tensor-
// parallel rank the ring volume of 8 halves of a (B,T,C) all-reduce per
// layer and 4 for the embedding and the head, or with sequence parallelism
// 10 and 4 and the norms' weight gradients, plus the loss's row statistics;
// a context-parallel rank the ring's key/value blocks, cp − 1 forward and
// cp − 1 with cp gradient blocks backward per layer, and the gradients'
// all-reduce over the ring.
func TestParallelTrafficMatchesEngineCount(t *testing.T) {
	const B, T, C, L, accum = 4, 32, 32, 2, 2
	m := ModelOf(mustLoad(t, "tiny", "Model.hidden_size=32", "Data.Train.dataset.max_seq_len=32", "Global.micro_batch_size=4"))
	if m.C != C || m.SeqLen != T || m.L != L || m.GlobalBatch/B != accum {
		t.Fatalf("shape: C %d T %d L %d batch %d", m.C, m.SeqLen, m.L, m.GlobalBatch)
	}
	c := engineCluster(t, 2)
	N := float64(B * T)
	act := 4 * N * C
	P := float64(m.Params())
	kv := 2 * float64(C) // GPT-2's keys and values, whole on a cp rank
	for _, tc := range []struct {
		s    Strategy
		want float64
	}{
		{Strategy{MP: 2, MicroBatch: B}, accum * ((4*L+2)*act*2*(2-1)/2 + (2-1)*4*N + (2-1)*8*2*N)},
		{Strategy{MP: 2, SP: true, MicroBatch: B}, accum * ((10*L+4)*act*(2-1)/2 + (2-1)*4*N + (2-1)*8*2*N + 4*(4*C*L+2*C)*2*(2-1)/2)},
		{Strategy{CP: 2, MicroBatch: B}, accum*L*((2-1)+(2-1)+2)*(N/2)*kv*4 + 2*(2-1)/2.0*4*P},
	} {
		p := Estimate(m, c, tc.s)
		if !p.Feasible {
			t.Fatalf("%s: %s", p.Strategy, p.Reason)
		}
		if d := math.Abs(p.CommBytes-tc.want) / tc.want; d > 1e-9 {
			t.Errorf("%s: the planner counts %.0f bytes sent a step, the engine's count %.0f", p.Strategy, p.CommBytes, tc.want)
		} else {
			t.Logf("%s: %.0f bytes a step", p.Strategy, p.CommBytes)
		}
	}
}

// TestSearchSequenceAndContext: the search weighs sequence and context
// parallelism — sp only with mp > 1, cp only where 2·cp divides the
// sequence — keeps what is fixed of them, and says what it fixed.
func TestSearchSequenceAndContext(t *testing.T) {
	m := longSeq(t, "Data.Train.dataset.max_seq_len=4088") // 4088 = 8·511: 2·cp divides it for cp 2 and 4, not 8; mp 4 not a cp 4 rank's 1022 positions
	if m.SeqLen != 4088 {
		t.Fatalf("seq %d", m.SeqLen)
	}
	c := Cluster{Nodes: 1, DevicesPerNode: 8, Device: device(t, "A100-80G")}
	plans, err := Search(m, c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, p := range plans {
		s := p.Strategy
		switch {
		case s.SP && s.MP == 1:
			t.Errorf("%s: sequence parallelism without mp", s)
		case m.SeqLen%(2*s.CP) != 0:
			t.Errorf("%s: 2·cp does not divide the sequence %d", s, m.SeqLen)
		case s.SP && m.SeqLen/s.CP%s.MP != 0:
			t.Errorf("%s: mp does not divide a rank's %d positions", s, m.SeqLen/s.CP)
		case s.Devices() != 8:
			t.Errorf("%s uses %d devices", s, s.Devices())
		}
		if s.SP {
			seen["sp"]++
			if p.Feasible {
				seen["sp feasible"]++
			}
		}
		if s.CP > 1 {
			seen["cp"]++
			seen["cp"+strconv.Itoa(s.CP)]++
			if p.Feasible {
				seen["cp feasible"]++
			}
		}
		if s.SP && s.CP > 1 {
			seen["sp cp"]++
		}
	}
	t.Logf("%d plans: %v; best %s", len(plans), seen, plans[0].Strategy)
	for _, k := range []string{"sp", "sp feasible", "cp", "cp feasible", "cp2", "cp4", "sp cp"} {
		if seen[k] == 0 {
			t.Errorf("the search never tried %s", k)
		}
	}
	if seen["cp8"] > 0 {
		t.Errorf("cp 8 tried: 16 does not divide the sequence 4088")
	}
	// Fixed: cp 2 with sequence parallelism.
	on := true
	f := Fixed{CP: 2, SP: &on}
	plans, err = Search(m, c, Options{Fixed: f})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plans {
		if p.CP != 2 || !p.SP {
			t.Fatalf("fixed cp 2 and sp, got %s", p.Strategy)
		}
	}
	if s := f.String(); !strings.Contains(s, "cp 2") || !strings.Contains(s, "sequence parallel true") {
		t.Errorf("Fixed.String() = %q", s)
	}
	// With dropout every cp plan is refused, with the reason.
	drop := m
	drop.Dropout = true
	plans, err = Search(drop, c, Options{Fixed: Fixed{CP: 2}})
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	for _, p := range plans {
		if p.Feasible {
			t.Fatalf("%s feasible with dropout", p.Strategy)
		}
		if strings.HasPrefix(p.Reason, "dropout: context parallelism") {
			refused++
		}
	}
	if refused == 0 {
		t.Error("no cp plan refused for the model's dropout")
	}
	// cp 8 fixed: no layout, and the error says what was fixed.
	if _, err := Search(m, c, Options{Fixed: Fixed{CP: 8}}); err == nil || !strings.Contains(err.Error(), "cp 8") {
		t.Errorf("cp 8 fixed on a sequence of 4088: %v", err)
	}
}
