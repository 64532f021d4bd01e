package planner

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/kernels/cuda"
	"github.com/gptui/gptui/presets"
)

// flashCPU is the CPU backend with the CUDA backend's attention store and
// activation size: its att buffers are as long as kernels/cuda's (one
// log-sum-exp per row and query head, cuda.Backend.AttentionFloats, which
// reads nothing of the backend), and its activations count ab bytes each
// (kernels.ActivationBytes: 2 under bf16, as the GPU stores them), so the
// engine accounts on it what it allocates on a GPU. It only builds
// trainers: the CPU's attention kernels would overrun so short a buffer.
type flashCPU struct {
	*cpu.Backend
	ab int
}

var _ kernels.AttentionStore = flashCPU{}

func (flashCPU) AttentionFloats(B, NH, T int) int {
	return (*cuda.Backend)(nil).AttentionFloats(B, NH, T)
}

func (f flashCPU) ActivationBytes() int { return f.ab }

// presetCluster is the cluster 'gptui plan -c preset' plans for without
// --nodes, --devices-per-node or --hosts (cmd/gptui plan.go): the devices
// the preset's strategy uses, in nodes of 8 accelerators (of any number
// of CPU workers on one machine), and the search's limits there.
func presetCluster(t testing.TB, cfg *presets.Config, dev string) (Cluster, Capabilities) {
	world := StrategyOf(cfg).Devices()
	c := Cluster{Nodes: 1, DevicesPerNode: world, Device: device(t, dev)}
	if c.Device.Accounting != AccountingEngine && world > 8 && world%8 == 0 {
		c.Nodes, c.DevicesPerNode = world/8, 8
	}
	caps := Unlimited()
	if c.Device.Accounting == AccountingEngine {
		caps = EngineCapabilities()
	}
	return c, caps
}

// reduced are the overrides that shrink preset's model for the engine to
// build every rank of layout s here, keeping what the layout needs of it:
// the heads (of 4 channels: each rank's parameters are drawn, and at 8
// channels the 32 ranks of 13b-4node's layouts took 6 s) and key/value
// heads; 2 blocks a pipeline chunk (1 where the model has fewer); a
// sequence of 64 (2·cp and, with sequence parallelism, mp dividing a
// rank's part of it for every cp and mp the searches choose here); a
// vocabulary of 256 tokens (the shards in dir); no evaluation. The batch
// is the layout's (Overrides).
func reduced(t *testing.T, cfg *presets.Config, s Strategy, dir string) []string {
	nh := cfg.Model.NumAttentionHeads
	chunks := s.PP * s.VPP
	layers := chunks
	if 2*chunks <= cfg.Model.NumLayers {
		layers = 2 * chunks
	}
	o := []string{"Engine.eval_freq=0", "Engine.log_dir=" + t.TempDir(), "Model.vocab_size=256", "Data.Train.dataset.input_dir=" + dir,
		fmt.Sprintf("Model.hidden_size=%d", 4*nh), fmt.Sprintf("Model.num_layers=%d", layers), "Data.Train.dataset.max_seq_len=64"}
	if ModelOf(cfg).llama() {
		o = append(o, fmt.Sprintf("Model.ffn_hidden_size=%d", 4*nh))
	} else {
		o = append(o, "Model.max_position_embeddings=64")
	}
	return o
}

// stageOf is the pipeline stage of rank r under s: ranks are numbered dp ×
// pp × sharding × cp × mp, mp innermost (engine/topology.go).
func stageOf(s Strategy, r int) int { return r / (s.MP * s.cp() * s.ShardingDegree) % s.PP }

// TestGPUMemoryMatchesEngine: for every preset, the planner's top 5
// feasible layouts on the preset's default device ('gptui plan -c PRESET'
// as a new user runs it: DefaultProfile's device, the cluster of the
// preset's own strategy), the planner's memory per device is the
// engine's own accounting of that layout within 5%, component by
// component, on the first and on the last pipeline stage (those the
// planner prices; its figure is the fuller of the two):
//
//   - the model states at full size against engine.StartupMemory, which
//     lays out every rank's parameters, gradients and moments from the
//     layout without allocating them (13B costs nothing): the fullest
//     rank of each stage;
//   - the activations and the scratch against what the engine allocates,
//     to the byte, at reduced sizes (reduced: the layout, the heads and
//     the batch kept, every rank built here), with the attention store of
//     the device's backend: the CUDA backend's (flashCPU) on an
//     accelerator, the CPU's on the CPU, as TestMemoryMatchesEngine does
//     for the CPU.
//
// The presets that train on the CPU by default (tiny, llama-tiny,
// gpt2-124m) are checked on it and on an H100 too, where BENCHMARKS.md
// quotes the 124M model's step. Beside the engine's account a GPU holds
// the CUDA backend's workspaces and the runtime's reserve (Other), which
// the engine does not count; they are logged, not compared.
func TestGPUMemoryMatchesEngine(t *testing.T) {
	const top = 5
	shards := smallVocabShards(t, 256)
	for _, preset := range presets.Names() {
		cfg := mustLoad(t, preset)
		devs := []string{DefaultProfile(cfg.Global.Device, cfg.Engine.MixPrecision.Dtype)}
		if devs[0] == "cpu" {
			devs = append(devs, "H100-80G")
		}
		for _, dev := range devs {
			t.Run(preset+"/"+dev, func(t *testing.T) {
				c, caps := presetCluster(t, cfg, dev)
				m := ModelOf(cfg)
				plans, err := Search(m, c, Options{Caps: caps})
				if err != nil {
					t.Fatal(err)
				}
				worst, worstAt := 0.0, "every figure exact"
				n := 0
				for _, p := range plans {
					if !p.Feasible || n == top {
						break
					}
					n++
					if testing.Short() && n > 1 {
						break
					}
					d, at := checkLayout(t, preset, cfg, m, c, p, shards)
					if d > worst {
						worst, worstAt = d, at
					}
				}
				if n == 0 {
					t.Fatalf("no feasible plan on %s; first rejected: %s: %s", c, plans[0].Strategy, plans[0].Reason)
				}
				t.Logf("%s on %s: %d layouts, worst difference from the engine %.4f%% (%s)", preset, c, n, 100*worst, worstAt)
			})
		}
	}
}

// checkLayout compares the planner's memory of plan p (of model m from
// cfg, on cluster c) with the engine's, stage by stage, and returns the
// largest relative difference and where it was.
func checkLayout(t *testing.T, preset string, cfg *presets.Config, m Model, c Cluster, p Plan, shards string) (float64, string) {
	t.Helper()
	s := p.Strategy
	world := s.Devices()
	gpu := c.Device.Accounting == AccountingEngineGPU
	full, err := Apply(cfg, s)
	if err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	stages := []int{0}
	if s.PP > 1 {
		stages = append(stages, s.PP-1)
	}
	// The model states at full size: the fullest rank of each stage.
	states := map[int]engine.Memory{}
	for r := range world {
		em, err := engine.StartupMemory(full, r, world)
		if err != nil {
			t.Fatalf("%s rank %d: %v", s, r, err)
		}
		st := stageOf(s, r)
		if was, ok := states[st]; !ok || em.Params+em.Grads+em.Optimizer > was.Params+was.Grads+was.Optimizer {
			states[st] = em
		}
	}
	// The activations at reduced sizes: every rank built.
	o := append(reduced(t, cfg, s, shards), Overrides(s, m.GlobalBatch)...)
	mr := ModelOf(mustLoad(t, preset, o...))
	newBackend := func() kernels.Backend { return cpu.New() }
	if gpu {
		ab := 4
		if mr.Dtype == "bf16" {
			ab = 2
		}
		newBackend = func() kernels.Backend { return flashCPU{cpu.New(), ab} }
	}
	ranks, err := measureRanks(t, preset, world, o, newBackend)
	if err != nil {
		t.Fatalf("%s at reduced sizes: %v", s, err)
	}
	acts := map[int]engine.Memory{}
	for r, em := range ranks {
		if st := stageOf(s, r); em.Total() > acts[st].Total() {
			acts[st] = em
		}
	}
	worst, worstAt := 0.0, "every figure exact"
	for _, st := range stages {
		want, small := states[st], acts[st]
		got, gotSmall := stageMemory(m, c, s, st), stageMemory(mr, c, s, st)
		for _, x := range []struct {
			part      string
			got, want int64
		}{
			{"params", got.Params, want.Params},
			{"grads", got.Grads, want.Grads},
			{"optimizer", got.Optimizer, want.Optimizer},
			{"activations (reduced)", gotSmall.Activations, small.Activations},
			{"scratch (reduced)", gotSmall.Scratch, small.Scratch},
			{"params (reduced)", gotSmall.Params, small.Params},
			{"grads (reduced)", gotSmall.Grads, small.Grads},
			{"optimizer (reduced)", gotSmall.Optimizer, small.Optimizer},
		} {
			d := math.Abs(float64(x.got-x.want)) / float64(x.want)
			if d > 0.05 {
				t.Errorf("%s stage %d %s: predicted %d bytes, the engine counts %d (off by %.2f%%)", s, st, x.part, x.got, x.want, 100*d)
			}
			if d > worst {
				worst, worstAt = d, fmt.Sprintf("%s, stage %d, %s: %d against %d bytes", s, st, x.part, x.got, x.want)
			}
		}
		if gotSmall.Activations != small.Activations {
			t.Errorf("%s stage %d: activations at reduced sizes: predicted %d bytes, the engine counts %d (%+d): the planner counts the engine's buffers, to the byte",
				s, st, gotSmall.Activations, small.Activations, gotSmall.Activations-small.Activations)
		}
		if gotSmall.Scratch != small.Scratch {
			t.Errorf("%s stage %d: scratch at reduced sizes: predicted %d bytes, the engine counts %d (%+d): the planner counts the engine's buffers, to the byte",
				s, st, gotSmall.Scratch, small.Scratch, gotSmall.Scratch-small.Scratch)
		}
		t.Logf("%s stage %d: states %.3f GB (engine %.3f GB), activations %.3f GB, scratch %.3f GB, other %.3f GB (the backend's workspaces and the reserve), total %.2f GiB; reduced: activations %d bytes (engine %d), scratch %d bytes (engine %d)",
			s, st, gbf(got.Params+got.Grads+got.Optimizer), gbf(want.Params+want.Grads+want.Optimizer), gbf(got.Activations), gbf(got.Scratch), gbf(got.Other),
			float64(got.Total)/(1<<30), gotSmall.Activations, small.Activations, gotSmall.Scratch, small.Scratch)
	}
	if stage := slices.IndexFunc(stages, func(st int) bool { return stageMemory(m, c, s, st) == p.Mem }); stage < 0 {
		t.Errorf("%s: the plan's memory %+v is neither stage's", s, p.Mem)
	}
	return worst, worstAt
}

// TestGPUMemoryIsTheEngines: on a GPU the planner counts the engine's
// buffers as on the CPU but for the attention (a log-sum-exp per row and
// head instead of the probabilities) and, under bf16, the activations (2
// bytes each, not 4), and the CUDA backend's own
// allocations beside them: its cuBLAS workspace and Sum's partials, and
// with 16-bit GEMMs the two buffers its float32 operands are rounded
// into, as large as the largest — under bf16, whose activations are read
// as they are, none: the weights are rounded once into a copy of them all,
// 2 bytes a parameter — and, with
// bfloat16 activations, the MLP's bias rounded for cuBLASLt's epilogue
// (F) and attention's dq (N × C); none of them in fp32.
func TestGPUMemoryIsTheEngines(t *testing.T) {
	m := ModelOf(mustLoad(t, "gpt2-124m", "Engine.mix_precision.dtype=bf16"))
	s := Strategy{MicroBatch: 16}.normalize()
	h100 := Cluster{Nodes: 1, DevicesPerNode: 1, Device: device(t, "H100-80G")}
	gpu, host := stageMemory(m, h100, s, 0), engineMemory(m, s, 0, false)
	N, NH, L := int64(16*1024), int64(m.NH), int64(m.L)
	probs, lse := 4*L*16*NH*1024*1024, 4*L*N*NH
	if gpu.Params != host.Params || gpu.Grads != host.Grads || gpu.Optimizer != host.Optimizer {
		t.Errorf("model states: GPU %+v, CPU %+v", gpu, host)
	}
	// The layers' outputs, 2 bytes each on the GPU: the residual stream,
	// each block's ln1, res2, ln2, qkv, attention output and the MLP's
	// two tensors, the final norm (the logits are scratch, a chunk of rows
	// at a time).
	C, F := int64(m.C), int64(m.F)
	acts := (L+1)*N*C + L*N*(3*C+3*C+C+2*F) + N*C
	if d := host.Activations - gpu.Activations; d != probs-lse+2*acts {
		t.Errorf("activations: GPU %d bytes, CPU %d: differ by %d, want the probabilities less the log-sum-exps, and 2 bytes of each of %d activations, %d",
			gpu.Activations, host.Activations, d, acts, probs-lse+2*acts)
	}
	casts := 2 * stageParams(m, s, 0)       // the weights' bfloat16 copy
	halves := 2*int64(m.F) + 4*N*int64(m.C) // the MLP's bias rounded for cuBLASLt's epilogue, attention's dq
	if m.flash(s) {
		halves += 4 * int64(cuda.FlashDeltaFloats(16, m.NH, 1024))
	}
	if want := h100.Device.ReservedBytes + cuda.WorkspaceBytes + cuda.SumScratch + casts + halves; gpu.Other != want {
		t.Errorf("other: %d bytes, want the reserve, the workspaces, %d of cast buffers and %d of bfloat16 activations' scratch, %d", gpu.Other, casts, halves, want)
	}
	fp32 := m
	fp32.Dtype = "fp32"
	if got, want := stageMemory(fp32, h100, s, 0).Other, h100.Device.ReservedBytes+cuda.WorkspaceBytes+cuda.SumScratch; got != want {
		t.Errorf("fp32: other %d bytes, want %d: no cast buffers", got, want)
	}
	t.Logf("124M B16 T1024 on an H100: states %.2f GB, activations %.2f GB (the CPU's %.2f GB), other %.2f GB (the weights' copy %.2f GB)",
		gbf(gpu.Params+gpu.Grads+gpu.Optimizer), gbf(gpu.Activations), gbf(host.Activations), gbf(gpu.Other), gbf(casts))
}

// TestReduceBF16: under Engine.mix_precision.reduce_dtype bf16, a GPU's
// data-parallel all-reduce moves bfloat16 gradients — half the bytes of
// float32 ones — from a bfloat16 copy of them (2 bytes a parameter, under
// Grads), while a CPU worker's TCP ring moves the same float32s from a
// copy of 4 bytes a parameter; sharding stage 2 reduce-scatters float32
// either way.
func TestReduceBF16(t *testing.T) {
	fp32 := ModelOf(mustLoad(t, "gpt2-124m", "Engine.mix_precision.dtype=bf16", "Global.global_batch_size=16"))
	bf16 := fp32
	bf16.ReduceBF16 = true
	P := float64(fp32.Params())
	for _, tc := range []struct {
		device     string
		s          Strategy
		bytes      float64 // of the gradients' all-reduce, sent per step
		copyPerPar int64
	}{
		{"H100-80G", Strategy{DP: 2, MicroBatch: 2}, 2 * 0.5 * 2 * P, 2},
		{"cpu", Strategy{DP: 2, MicroBatch: 2}, 2 * 0.5 * 4 * P, 4},
		{"H100-80G", Strategy{ShardingDegree: 2, ShardingStage: 2, MicroBatch: 2}, 0, 0},
	} {
		c := Cluster{Nodes: 1, DevicesPerNode: 2, Device: device(t, tc.device)}
		s := tc.s.normalize()
		a, b := Estimate(fp32, c, s), Estimate(bf16, c, s)
		if !a.Feasible || !b.Feasible {
			t.Fatalf("%s on %s: %s %s", s, tc.device, a.Reason, b.Reason)
		}
		if got, want := b.Mem.Grads-a.Mem.Grads, tc.copyPerPar*fp32.Params(); got != want {
			t.Errorf("%s on %s: the bfloat16 copy takes %d bytes, want %d", s, tc.device, got, want)
		}
		if tc.bytes == 0 {
			if b.CommBytes != a.CommBytes {
				t.Errorf("%s on %s: %.0f bytes sent with reduce_dtype bf16, %.0f without: stage 2 reduces in float32", s, tc.device, b.CommBytes, a.CommBytes)
			}
			continue
		}
		if got := b.CommBytes - a.CommBytes + 2*0.5*4*P; math.Abs(got-tc.bytes) > 1 {
			t.Errorf("%s on %s: the all-reduce sends %.0f bytes, want %.0f", s, tc.device, got, tc.bytes)
		}
	}
}
