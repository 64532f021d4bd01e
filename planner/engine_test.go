package planner

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gptui/gptui"
	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/engine/data"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/launch"
)

// corpus tokenizes the built-in corpus once for every trainer of the tests.
var corpus = sync.OnceValues(func() ([]uint16, error) { return data.BuiltinCorpus(gptui.Docs) })

// measureEngine builds the trainers of a world-rank job in this process
// (each rank with its own communicator over loopback TCP, as 'gptui run'
// workers have) and returns the engine's accounting of the rank with the
// largest total.
func measureEngine(t *testing.T, world int, overrides []string) (engine.Memory, error) {
	t.Helper()
	cfg := mustLoad(t, "tiny", overrides...)
	if world == 1 {
		tr, err := engine.NewTrainer(cfg, cpu.New(), engine.Options{Builtin: corpus})
		if err != nil {
			return engine.Memory{}, err
		}
		return tr.Memory, nil
	}
	port, err := launch.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mems := make([]engine.Memory, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() {
			w, err := comm.Connect(ctx, comm.Config{Rank: r, WorldSize: world, MasterAddr: "127.0.0.1", MasterPort: port, Timeout: 30 * time.Second, Secret: []byte("test")})
			if err != nil {
				errs[r] = err
				return
			}
			defer w.Close()
			tr, err := engine.NewTrainer(mustLoad(t, "tiny", overrides...), cpu.New(), engine.Options{Builtin: corpus, World: w})
			if err != nil {
				errs[r] = err
				return
			}
			mems[r] = tr.Memory
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return engine.Memory{}, err
	}
	best := mems[0]
	for _, m := range mems[1:] {
		if m.Total() > best.Total() {
			best = m
		}
	}
	return best, nil
}

// engineCluster is world CPU workers on one node.
func engineCluster(t testing.TB, world int) Cluster {
	return Cluster{Nodes: 1, DevicesPerNode: world, Device: device(t, "cpu")}
}

// TestMemoryMatchesEngine: the predicted memory of a CPU worker is within
// 5% of the engine's own accounting (engine.Trainer.Memory, the [memory]
// log line), component by component, for each strategy of the table.
//
// A row the planner's EngineCapabilities excluded would be skipped with
// its reason; the engine runs all of them.
func TestMemoryMatchesEngine(t *testing.T) {
	small := []string{"Engine.eval_freq=0", "Engine.log_dir=" + t.TempDir()}
	wide := append([]string{"Model.hidden_size=128", "Model.num_layers=4", "Data.Train.dataset.max_seq_len=128"}, small...)
	deep := append([]string{"Model.num_layers=8"}, small...)
	cases := []struct {
		name  string
		world int
		base  []string
		s     Strategy
	}{
		{"single mb8", 1, small, Strategy{MicroBatch: 8}},
		{"single mb2 accumulate 4", 1, small, Strategy{MicroBatch: 2}},
		{"single only_attn", 1, wide, Strategy{MicroBatch: 4, Recompute: RecomputeOnlyAttn}},
		{"single full", 1, wide, Strategy{MicroBatch: 4, Recompute: RecomputeFull}},
		{"dp2 mb4", 2, small, Strategy{DP: 2, MicroBatch: 4}},
		{"dp4 mb1 accumulate 2", 4, small, Strategy{DP: 4, MicroBatch: 1}},
		{"dp2 only_attn", 2, wide, Strategy{DP: 2, MicroBatch: 2, Recompute: RecomputeOnlyAttn}},
		{"sharding2 stage1", 2, small, Strategy{ShardingDegree: 2, ShardingStage: 1, MicroBatch: 4}},
		{"sharding2 stage2", 2, small, Strategy{ShardingDegree: 2, ShardingStage: 2, MicroBatch: 2}},
		{"sharding4 stage1", 4, wide, Strategy{ShardingDegree: 4, ShardingStage: 1, MicroBatch: 2}},
		{"sharding4 stage2 full", 4, wide, Strategy{ShardingDegree: 4, ShardingStage: 2, MicroBatch: 1, Recompute: RecomputeFull}},
		{"dp2 sharding2 stage2", 4, small, Strategy{DP: 2, ShardingDegree: 2, ShardingStage: 2, MicroBatch: 1}},
		{"dp2 sharding2 stage1 only_attn", 4, wide, Strategy{DP: 2, ShardingDegree: 2, ShardingStage: 1, MicroBatch: 2, Recompute: RecomputeOnlyAttn}},
		{"mp2", 2, small, Strategy{MP: 2, MicroBatch: 4}},
		{"mp4 only_attn", 4, wide, Strategy{MP: 4, MicroBatch: 2, Recompute: RecomputeOnlyAttn}},
		{"dp2 mp2 full", 4, small, Strategy{DP: 2, MP: 2, MicroBatch: 2, Recompute: RecomputeFull}},
		{"sharding2 stage2 mp2", 4, small, Strategy{ShardingDegree: 2, ShardingStage: 2, MP: 2, MicroBatch: 2}},
		{"pp2 1F1B", 2, small, Strategy{PP: 2, MicroBatch: 2}},
		{"pp4 interleaved vpp2", 4, deep, Strategy{PP: 4, VPP: 2, MicroBatch: 1}},
		{"sharding2 stage3", 2, small, Strategy{ShardingDegree: 2, ShardingStage: 3, MicroBatch: 4}},
	}
	// -short: one row of each dimension, one with accumulation and one
	// with recompute.
	short := []string{"single mb2 accumulate 4", "dp2 mb4", "sharding2 stage2", "mp2", "dp2 mp2 full", "pp2 1F1B", "sharding2 stage3"}
	for _, tc := range cases {
		if testing.Short() && !slices.Contains(short, tc.name) {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			s := tc.s.normalize()
			if r := EngineCapabilities().Unsupported(s); r != "" {
				t.Logf("%s: not run: %s", s, r)
				return
			}
			o := append(append([]string{}, tc.base...), Overrides(s, 8)...)
			got, err := measureEngine(t, tc.world, o)
			if err != nil {
				t.Fatal(err)
			}
			m := ModelOf(mustLoad(t, "tiny", o...))
			p := Estimate(m, engineCluster(t, tc.world), s)
			if p.Reason != "" && !p.Feasible && p.Mem.Total == 0 {
				t.Fatalf("planner rejects %s: %s", s, p.Reason)
			}
			for _, c := range []struct {
				part      string
				got, want int64
			}{
				{"params", p.Mem.Params, got.Params},
				{"grads", p.Mem.Grads, got.Grads},
				{"optimizer", p.Mem.Optimizer, got.Optimizer},
				{"activations", p.Mem.Activations, got.Activations},
				{"total", p.Mem.Total, got.Total()},
			} {
				if d := math.Abs(float64(c.got-c.want)) / float64(c.want); d > 0.05 {
					t.Errorf("%s: predicted %d bytes, the engine counts %d (off by %.2f%%)", c.part, c.got, c.want, 100*d)
				}
			}
			t.Logf("%s: predicted %d bytes, engine %d (%+.3f%%)", s, p.Mem.Total, got.Total(), 100*float64(p.Mem.Total-got.Total())/float64(got.Total()))
		})
	}
}

// TestStartupShard13B: a rank of 13b-4node (dp 4 × mp 2 × pp 4 on 4 nodes
// × 8 devices) needs at start-up only its shard of the model — its
// stage's blocks split over mp, and the embeddings or the head — by the
// engine's own accounting (engine.StartupMemory, computed from the layout
// without allocating: 4 bytes a parameter and a gradient, 8 of moments)
// and by the planner (its engine accounting of CPU workers, and the fp16
// figure `gptui plan -c 13b-4node` gives for its V100s: 2 bytes a
// parameter): the same parameter count, a little over an eighth of the
// whole model's 52 GB.
func TestStartupShard13B(t *testing.T) {
	cfg := mustLoad(t, "13b-4node")
	m, s := ModelOf(cfg), StrategyOf(cfg)
	world := s.Devices()
	whole := 4 * m.Params()
	if whole < 50e9 {
		t.Fatalf("13b-4node's model is %d bytes in fp32, not the 52 GB this test is about", whole)
	}
	// The engine's account of every rank: the largest is the planner's.
	var most engine.Memory
	for r := range world {
		em, err := engine.StartupMemory(cfg, r, world)
		if err != nil {
			t.Fatal(err)
		}
		P := em.Params / 4
		if em.Grads != 4*P || em.Optimizer != 8*P {
			t.Errorf("rank %d: grads %d optimizer %d bytes for %d parameters; want 4 and 8 bytes each", r, em.Grads, em.Optimizer, P)
		}
		// The rank's stage: ranks are numbered mp innermost, then
		// sharding, then the stage (docs/parallelism.md).
		st := r / (s.MP * s.ShardingDegree) % s.PP
		if want := stageParams(m, s, st); P != want {
			t.Errorf("rank %d (stage %d): the engine counts %d parameters, the planner %d", r, st, P, want)
		}
		if float64(em.Params) > 1.1*float64(whole)/float64(s.MP*s.PP) {
			t.Errorf("rank %d holds %d bytes of parameters: more than 1.1 × its eighth of the whole model's %d", r, em.Params, whole)
		}
		if em.Params+em.Grads+em.Optimizer > most.Params+most.Grads+most.Optimizer {
			most = em
		}
	}
	cpu := Estimate(m, Cluster{Nodes: 4, DevicesPerNode: 8, Device: device(t, "cpu")}, s)
	if cpu.Mem.Params != most.Params || cpu.Mem.Grads != most.Grads || cpu.Mem.Optimizer != most.Optimizer {
		t.Errorf("planner (engine accounting): params %d grads %d optimizer %d; the engine's largest rank %d %d %d",
			cpu.Mem.Params, cpu.Mem.Grads, cpu.Mem.Optimizer, most.Params, most.Grads, most.Optimizer)
	}
	v100 := Estimate(m, Cluster{Nodes: 4, DevicesPerNode: 8, Device: device(t, "V100-32G")}, s)
	if v100.Mem.Params != most.Params/2 {
		t.Errorf("planner (fp16 on V100): params %d bytes; want 2 bytes for each of the %d parameters of the largest rank", v100.Mem.Params, most.Params/4)
	}
	t.Logf("13b-4node: whole model %.1f GB; the largest rank's parameters %.2f GB, with gradients and moments %.2f GB (engine), %.2f GB of fp16 parameters (planner, V100)",
		float64(whole)/1e9, float64(most.Params)/1e9, float64(most.Params+most.Grads+most.Optimizer)/1e9, float64(v100.Mem.Params)/1e9)
}
