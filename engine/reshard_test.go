package engine

import (
	"context"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/presets"
)

// reshardLayouts are the layouts of the resume matrix, each of world
// ranks: one process and every parallel dimension, on a model of 4 layers
// (so that the interleaved pipeline has two chunks a rank).
var reshardLayouts = []struct {
	name  string
	world int
	o     []string
}{
	{"single", 1, []string{"Global.local_batch_size=8", "Global.micro_batch_size=4"}},
	{"dp2", 2, []string{"Distributed.dp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=2"}},
	{"sharding2 stage1", 2, []string{"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=1", "Global.local_batch_size=4", "Global.micro_batch_size=2"}},
	{"sharding2 stage2", 2, []string{"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=2", "Global.local_batch_size=4", "Global.micro_batch_size=2"}},
	{"sharding2 stage3", 2, []string{"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=3", "Global.local_batch_size=4", "Global.micro_batch_size=2"}},
	{"mp2", 2, []string{"Distributed.mp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=4"}},
	{"pp2", 2, []string{"Distributed.pp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=4"}},
	{"mp2 pp2", 4, []string{"Distributed.mp_degree=2", "Distributed.pp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=4"}},
	{"pp2 vpp2", 2, []string{"Distributed.pp_degree=2", "Distributed.vpp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=2"}},
}

// TestReshardMatrix: a checkpoint saved in each layout of reshardLayouts
// after 2 steps is loaded in each other layout, which saves it again at
// once: the two checkpoints hold the same parameters and AdamW moments,
// bit for bit, for GPT-2 and for a Llama (2 query heads a key/value head,
// untied head). Loading reads only each rank's slices; saving writes each
// rank's part; so every pair checks that the two cut the model the same
// way.
func TestReshardMatrix(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: 18 trainings and 144 loads")
	}
	for _, family := range []struct {
		name string
		o    []string
	}{
		{"gpt2", nil},
		{"llama", []string{"Model.family=llama", "Model.num_attention_heads=4", "Model.num_key_value_heads=2", "Model.ffn_hidden_size=64", "Model.tie_word_embeddings=false"}},
	} {
		t.Run(family.name, func(t *testing.T) {
			base := append(parityOverrides(t), "Model.num_layers=4", "Engine.max_steps=2", "Engine.save_load.save_steps=2")
			base = append(base, family.o...)
			saved := make([]string, len(reshardLayouts))
			for i, from := range reshardLayouts {
				out := t.TempDir()
				runRanks(t, from.world, append(append(slices.Clone(base), from.o...), "Engine.save_load.output_dir="+out))
				saved[i] = filepath.Join(out, "step_00000002")
			}
			for i, from := range reshardLayouts {
				want := readCheckpoint(t, saved[i])
				for j, to := range reshardLayouts {
					if i == j {
						continue
					}
					out := t.TempDir()
					o := append(append(slices.Clone(base), to.o...), "Engine.save_load.ckpt_dir="+saved[i], "Engine.save_load.output_dir="+out)
					resaveRanks(t, to.world, o)
					got := readCheckpoint(t, filepath.Join(out, "step_00000002"))
					if msg := sameState(want, got); msg != "" {
						t.Errorf("%s → %s: %s", from.name, to.name, msg)
					}
				}
			}
		})
	}
}

// readCheckpoint reads every tensor of the checkpoint in dir whole.
func readCheckpoint(t *testing.T, dir string) map[string][]float32 {
	t.Helper()
	c, missing, err := checkpoint.Open(dir)
	if err != nil || len(missing) > 0 {
		t.Fatalf("%s: %v (missing %v)", dir, err, missing)
	}
	out := map[string][]float32{}
	for _, ti := range c.Manifest.Tensors {
		n := 1
		for _, d := range ti.Shape {
			n *= d
		}
		buf := make([]float32, n)
		if err := c.Read(ti.Name, make([]int, len(ti.Shape)), ti.Shape, buf); err != nil {
			t.Fatalf("%s: %s: %v", dir, ti.Name, err)
		}
		out[ti.Name] = buf
	}
	return out
}

// sameState says how got differs from want, bit for bit, or "".
func sameState(want, got map[string][]float32) string {
	var diffs []string
	for name, w := range want {
		g, ok := got[name]
		switch {
		case !ok:
			diffs = append(diffs, name+" missing")
		case len(g) != len(w):
			diffs = append(diffs, fmt.Sprintf("%s has %d values, want %d", name, len(g), len(w)))
		default:
			for k := range w {
				if math.Float32bits(g[k]) != math.Float32bits(w[k]) {
					diffs = append(diffs, fmt.Sprintf("%s[%d] = %v, want %v", name, k, g[k], w[k]))
					break
				}
			}
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			diffs = append(diffs, name+" not in the first")
		}
	}
	slices.Sort(diffs)
	if len(diffs) > 4 {
		diffs = append(diffs[:4], fmt.Sprintf("and %d more", len(diffs)-4))
	}
	return strings.Join(diffs, "; ")
}

// resaveRanks builds world ranks of the job of overrides, which load its
// checkpoint (ckpt_dir), and has them save it again at once, as a stop
// before the first step would if it saved: every rank writes its part.
func resaveRanks(t *testing.T, world int, overrides []string) {
	t.Helper()
	port := freePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	errs := make([]error, world)
	var wg sync.WaitGroup
	for k := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[k] = func() error {
				w, err := comm.Connect(ctx, comm.Config{Rank: k, WorldSize: world, MasterAddr: "127.0.0.1", MasterPort: port, Timeout: 60 * time.Second, Secret: []byte("test")})
				if err != nil {
					return err
				}
				defer w.Close()
				cfg, err := presets.Load("tiny", overrides)
				if err != nil {
					return err
				}
				tr, err := NewTrainer(cfg, cpuBackend(), Options{Builtin: corpusFor(cfg), World: w})
				if err != nil {
					return err
				}
				if tr.log, err = openRunLog(t.TempDir(), k, 0, io.Discard, io.Discard, nil); err != nil {
					return err
				}
				defer tr.log.Close()
				sv := tr.newSaver(&Result{})
				if err := sv.save(ctx, tr.start-1); err != nil {
					return err
				}
				return sv.collect(true)
			}()
		}()
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			t.Fatalf("rank %d of %d: %v", k, world, err)
		}
	}
}
