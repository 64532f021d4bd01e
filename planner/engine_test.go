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
