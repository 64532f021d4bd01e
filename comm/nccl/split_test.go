package nccl

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/internal/paritymatrix"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/presets"
)

// parityLayouts are the layouts of the engine's parity matrix
// (engine.TestParallelParity), on the "tiny" preset, and past the matrix
// pp4, whose middle stages hold no tied embedding.
var parityLayouts = append(paritymatrix.Layouts(),
	paritymatrix.Layout{Name: "pp4 dp2", World: 8, O: []string{"Distributed.pp_degree=4", "Distributed.dp_degree=2", "Model.num_layers=4", "Global.local_batch_size=4", "Global.micro_batch_size=2"}})

// layoutBase is the parity matrix's model, one step.
var layoutBase = append(slices.Clone(paritymatrix.Model), "Engine.max_steps=1", "Engine.eval_freq=0")

func layoutTokens() ([]uint16, error) {
	toks := make([]uint16, 1<<15)
	for i := range toks {
		toks[i] = uint16(i*7919%96) % 96
	}
	return toks, nil
}

// expectedGroups is, for each communicator the engine makes in topology
// t's job, the key that tells its groups apart: ranks with the same key
// form one group; ok is false for a rank outside every group of that
// name. It follows engine.Topology's description of its groups.
func expectedGroups(t engine.Topology, shape arch.Shape) map[string]func(engine.Topology) (key string, ok bool) {
	g := map[string]func(engine.Topology) (string, bool){}
	key := func(f func(engine.Topology) []int) func(engine.Topology) (string, bool) {
		return func(u engine.Topology) (string, bool) { return fmt.Sprint(f(u)), true }
	}
	// A context-parallel ring's ranks are summed with the replicas.
	if t.Replicas()*t.CP > 1 {
		g["dp"] = key(func(u engine.Topology) []int { return []int{u.PPIndex, u.MPIndex} })
		g["sharding"] = key(func(u engine.Topology) []int { return []int{u.DPIndex, u.PPIndex, u.MPIndex, u.CPIndex} })
		g["dp-shard"] = key(func(u engine.Topology) []int { return []int{u.ShardIndex, u.PPIndex, u.MPIndex} })
	}
	if t.MP > 1 {
		g["mp"] = key(func(u engine.Topology) []int { return []int{u.DPIndex, u.PPIndex, u.ShardIndex, u.CPIndex} })
	}
	// A Llama's key/value head on the MP/NKV ranks that share it, where
	// mp exceeds the key/value heads (their gradients are summed).
	if nkv := shape.KVHeads(); t.MP > nkv {
		copies := t.MP / nkv
		g["mpkv"] = key(func(u engine.Topology) []int {
			return []int{u.DPIndex, u.PPIndex, u.ShardIndex, u.CPIndex, u.MPIndex / copies}
		})
	}
	if t.CP > 1 {
		g["cp"] = key(func(u engine.Topology) []int { return []int{u.DPIndex, u.PPIndex, u.ShardIndex, u.MPIndex} })
	}
	if t.PP > 1 {
		g["pp"] = key(func(u engine.Topology) []int { return []int{u.DPIndex, u.ShardIndex, u.MPIndex, u.CPIndex} })
	}
	// The embedding tied to the head, on the first and last stages.
	if t.PP > 1 && shape.Tied() {
		g["tied"] = func(u engine.Topology) (string, bool) {
			k, _ := g["pp"](u)
			return k, u.PPIndex == 0 || u.PPIndex == u.PP-1
		}
	}
	return g
}

// partition describes how a split divides the world: its groups, each as
// its ascending world ranks, sorted, and the ranks in none.
func partition(groups map[string][]int, none []int) string {
	gs := slices.Collect(maps.Values(groups))
	slices.SortFunc(gs, slices.Compare)
	return fmt.Sprintf("%v none %v", gs, none)
}

// TestSplitsOfParallelLayouts: for every layout of the engine's parity
// matrix, the engine's ranks declare their communicators (engine.NewTrainer
// on the fabric) and Ready splits the world communicator once per
// communicator, every rank taking part in every split in the same order:
// the members of each group the topology makes pass one colour, their
// places in the group as keys (member order), every other rank
// NCCL_SPLIT_NOCOLOR, and each rank's communicator is the group it
// declared.
func TestSplitsOfParallelLayouts(t *testing.T) {
	for _, tc := range parityLayouts {
		t.Run(tc.Name, func(t *testing.T) {
			fk := newFake(t)
			rs := fabrics(t, fk, tc.World, 20*time.Second)
			topos := make([]engine.Topology, tc.World)
			var cfg0 *presets.Config // rank 0's
			mustAll(t, tc.World, func(r int) error {
				cfg, err := presets.Load("tiny", append(append(slices.Clone(layoutBase), "Engine.log_dir="+t.TempDir(), "Engine.save_load.output_dir="+t.TempDir()), tc.O...))
				if err != nil {
					return err
				}
				if r == 0 {
					cfg0 = cfg
				}
				if topos[r], err = engine.NewTopology(cfg.Layout(), cfg.Batch(), engine.ShapeOf(cfg), r, tc.World); err != nil {
					return err
				}
				_, err = engine.NewTrainer(cfg, cpu.New(), engine.Options{World: rs[r].w, Fabric: rs[r].f, Builtin: layoutTokens})
				return err
			})

			// The splits each rank took part in, by number.
			byN := map[int]map[int]splitCall{}
			for _, s := range fk.splits {
				if byN[s.n] == nil {
					byN[s.n] = map[int]splitCall{}
				}
				if _, dup := byN[s.n][s.world]; dup {
					t.Fatalf("rank %d took part in split %d twice", s.world, s.n)
				}
				byN[s.n][s.world] = s
			}
			var got []string
			for n := range len(byN) {
				calls := byN[n]
				if len(calls) != tc.World {
					t.Fatalf("split %d: %d ranks took part, want all %d", n, len(calls), tc.World)
				}
				groups := map[int][]int{}
				var none []int
				for r := range tc.World {
					if c := calls[r]; c.color == -1 {
						none = append(none, r)
					} else {
						groups[c.color] = append(groups[c.color], r)
					}
				}
				named := map[string][]int{}
				for color, members := range groups {
					for i, r := range members {
						if calls[r].key != i {
							t.Errorf("split %d: rank %d is member %d of group %v (colour %d) but passed key %d", n, r, i, members, color, calls[r].key)
						}
					}
					named[fmt.Sprint(color)] = members
				}
				got = append(got, partition(named, none))
			}

			// The groups the topology makes.
			var want []string
			for name, key := range expectedGroups(topos[0], cfg0.Shape()) {
				groups := map[string][]int{}
				var none []int
				for r, u := range topos {
					if k, ok := key(u); ok {
						groups[k] = append(groups[k], r)
					} else {
						none = append(none, r)
					}
				}
				want = append(want, partition(groups, none))
				_ = name
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("splits:\n  %s\nthe topology's groups:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
			}

			// Each declared communicator is the group declared.
			for r, rk := range rs {
				for _, c := range rk.f.decls {
					h, _ := c.h.(*fhandle)
					if h == nil || !slices.Equal(h.c.world, c.ranks) || h.rank != c.rank {
						t.Errorf("rank %d's %s %v: %+v", r, c.name, c.ranks, h)
					}
				}
			}
		})
	}
}

// trainLayout trains the layout tc on every rank, over NCCL (the fake)
// when nccl is set, else over the TCP ring, and returns rank 0's losses.
func trainLayout(t *testing.T, tc paritymatrix.Layout, nccl bool) []float32 {
	t.Helper()
	fk := newFake(t)
	rs := fabrics(t, fk, tc.World, 60*time.Second)
	losses := make([][]float32, tc.World)
	mustAll(t, tc.World, func(r int) error {
		cfg, err := presets.Load("tiny", append(append(slices.Clone(layoutBase), "Engine.max_steps=3", "Engine.logging_freq=1", "Engine.log_dir="+t.TempDir(),
			"Engine.save_load.save_steps=0", "Engine.save_load.output_dir="+t.TempDir()), tc.O...))
		if err != nil {
			return err
		}
		opts := engine.Options{World: rs[r].w, Builtin: layoutTokens}
		if nccl {
			opts.Fabric = rs[r].f
		}
		tr, err := engine.NewTrainer(cfg, cpu.New(), opts)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res, err := tr.Run(ctx)
		losses[r] = res.Losses
		return err
	})
	if p := rs[0].f.Progress(); nccl != (p.Done > 0) {
		t.Errorf("nccl %v: rank 0's fabric did %d operations", nccl, p.Done)
	}
	return losses[0]
}

// TestTrainOverFabric: the engine trains layouts of the parity matrix
// through the NCCL fabric (the fake, on the CPU backend, whose buffers
// are host memory the fabric stages) to the TCP ring's losses. (1F1B
// pipelines send before they receive on both neighbours, which NCCL's
// rendezvous deadlocks: they need the pipeline's Exchange.)
func TestTrainOverFabric(t *testing.T) {
	for _, tc := range parityLayouts {
		if !slices.Contains([]string{"dp2", "sharding2 stage3 dp2", "dp2 mp2", "pp2 gpipe", "pp2 1f1b", "pp2 interleaved vpp2", "llama mp2 kv1 untied", "mp2 sp", "cp2", "cp2 mp2"}, tc.Name) {
			continue
		}
		t.Run(tc.Name, func(t *testing.T) {
			want := trainLayout(t, tc, false)
			got := trainLayout(t, tc, true)
			if len(got) != len(want) || len(got) == 0 {
				t.Fatalf("losses %v over NCCL, %v over TCP", got, want)
			}
			for i := range got {
				if d := math.Abs(float64(got[i]-want[i])) / float64(want[i]); d > 1e-5 {
					t.Errorf("step %d: loss %.7f over NCCL, %.7f over TCP", i, got[i], want[i])
				}
			}
		})
	}
}
