package engine

import (
	"bytes"
	"context"
	"github.com/gptui/gptui/arch"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/internal/allocbound"
	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/kernels/deferred"
	"github.com/gptui/gptui/presets"
)

// TestBoxes: a flat range of a tensor is cut into at most 2·d−1 boxes
// that are blocks of the tensor, contiguous, in order and covering the
// range exactly.
func TestBoxes(t *testing.T) {
	for _, tc := range []struct {
		shape []int
		s, e  int
	}{
		{[]int{10}, 3, 7},
		{[]int{4, 5}, 0, 20},
		{[]int{4, 5}, 3, 17},
		{[]int{4, 5}, 6, 9},
		{[]int{4, 5}, 5, 15},
		{[]int{3, 4, 5}, 7, 53},
		{[]int{3, 4, 5}, 1, 2},
		{[]int{3, 4, 5}, 20, 40},
		{[]int{2, 3, 4, 5}, 13, 107},
	} {
		bs := boxes(tc.shape, tc.s, tc.e)
		if len(bs) > 2*len(tc.shape)-1 {
			t.Errorf("%v [%d, %d): %d boxes, want at most %d", tc.shape, tc.s, tc.e, len(bs), 2*len(tc.shape)-1)
		}
		next := tc.s
		for _, b := range bs {
			// The box's elements, in order, must be next, next+1, ….
			var got []int
			forRuns(tc.shape, b.at, b.shape, b.shape, make([]int, len(b.shape)), func(k, g, n int) {
				for i := range n {
					got = append(got, g+i)
				}
			})
			for i, g := range got {
				if g != next+i {
					t.Fatalf("%v [%d, %d): box %+v holds %v, want a run from %d", tc.shape, tc.s, tc.e, b, got, next)
				}
			}
			if b.offset != next {
				t.Errorf("%v [%d, %d): box %+v at offset %d, want %d", tc.shape, tc.s, tc.e, b, b.offset, next)
			}
			next += len(got)
		}
		if next != tc.e {
			t.Errorf("%v [%d, %d): boxes end at %d", tc.shape, tc.s, tc.e, next)
		}
	}
}

// TestNewModelPartAllocatesThePart: building a rank's part of a model
// allocates its parameters and gradients and nothing on the scale of the
// whole model (which is 3.6 times the part here).
func TestNewModelPartAllocatesThePart(t *testing.T) {
	cfg := ModelConfig{Shape: arch.Shape{MaxT: 256, V: 8000, Vp: 8064, L: 8, NH: 8, C: 256, F: 1024}}
	part := partAt(cfg, 2, 1, 2, 1, 1)
	_, n := PartTensors(cfg, part)
	_, whole := Tensors(cfg)
	var err error
	used := allocbound.Measure(func() { _, err = NewModelPart(nil, cfg, part, 0.02, 1) })
	if err != nil {
		t.Fatal(err)
	}
	if limit := uint64(8*n + 1<<20); used > limit {
		t.Errorf("a part of %d parameters (the model has %d) allocated %d bytes, want at most %d (its parameters and gradients and 1 MiB)", n, whole, used, limit)
	}
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r *bytes.Reader
	n atomic.Int64
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.n.Add(int64(n))
	return n, err
}

// TestLLMCReadsTheRanksSlices: each rank's part read from an llm.c model
// file equals its slice of the whole model, read through at most a
// window of memory, and a rank reads only the spans of its blocks: under
// pipeline parallelism exactly its own bytes, under tensor parallelism at
// most the gaps between its columns besides.
func TestLLMCReadsTheRanksSlices(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(srcDir, "testdata/llmc/model.bin"))
	if err != nil {
		t.Fatal(err)
	}
	whole, err := loadLLMC(nil, "model.bin", bytes.NewReader(b), int64(len(b)), ModelConfig{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg := whole.Cfg
	for _, tc := range []struct {
		name        string
		mp, pp      int
		readsFactor int // bytes read at most this times the part's
	}{
		{"pp2", 1, 2, 1}, {"mp2", 2, 1, 2}, {"mp2 pp2", 2, 2, 2}, {"mp4", 4, 1, 4},
	} {
		for s := range tc.pp {
			for r := range tc.mp {
				part := partAt(cfg, tc.mp, r, tc.pp, 1, s)
				cr := &countingReader{r: bytes.NewReader(b)}
				f, err := newLLMCFile("model.bin", cr, int64(len(b)))
				if err != nil {
					t.Fatal(err)
				}
				m, err := newModel(nil, cfg, part)
				if err != nil {
					t.Fatal(err)
				}
				header := cr.n.Load()
				used := allocbound.Measure(func() { err = fillRange(m.Tensors, 0, len(m.Params), m.Params, f.block) })
				if err != nil {
					t.Fatal(err)
				}
				if used > llmcWindow+64<<10 {
					t.Errorf("%s rank %d/%d: reading the part allocated %d bytes, more than a window", tc.name, s, r, used)
				}
				read, own := cr.n.Load()-header, int64(4*len(m.Params))
				if read < own || read > int64(tc.readsFactor)*own {
					t.Errorf("%s stage %d rank %d: read %d bytes for a part of %d (whole model %d)", tc.name, s, r, read, own, 4*len(whole.Params))
				}
				checkPart(t, tc.name, m, whole)
			}
		}
	}
}

// checkPart fails t unless every element of m, a part, equals its place in
// whole (a model in host memory); m's weights are downloaded from its
// backend.
func checkPart(t *testing.T, name string, m, whole *Model) {
	t.Helper()
	want, got := partParams(m, whole), download(t, m.be, m.Params)
	for _, tn := range m.Tensors {
		if !slices.Equal(got[tn.Offset:tn.Offset+tn.Size], want[tn.Offset:tn.Offset+tn.Size]) {
			t.Errorf("%s: %s differs from its slice of the whole model", name, tn.Name)
		}
	}
}

// partParams returns the parameters of m's part, laid out by m.Tensors,
// as whole holds them.
func partParams(m, whole *Model) []float32 {
	out := make([]float32, m.NumParams())
	for _, tn := range m.Tensors {
		g, _ := whole.tensor(tn.Name)
		for _, pc := range tn.Pieces {
			copyBlock(out[tn.Offset:tn.Offset+tn.Size], tn.Shape, pc.Local, whole.Params[g.Offset:g.Offset+g.Size], g.Shape, pc.Global, pc.Shape)
		}
	}
	return out
}

// newRanks builds the trainers of a world-rank job of tiny with overrides,
// one per goroutine with its own communicator over loopback TCP, on the
// deferred backend (so the host fills the buffers only through uploads),
// and returns them (closed at the end of the test).
func newRanks(t *testing.T, world int, overrides []string) []*Trainer {
	t.Helper()
	return newRanksOn(t, world, overrides, func(int) kernels.Backend { return deferredBackend() })
}

// newRanksOn is newRanks with rank r on the backend be(r).
func newRanksOn(t *testing.T, world int, overrides []string, be func(r int) kernels.Backend) []*Trainer {
	t.Helper()
	port := freePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	trs := make([]*Trainer, world)
	errs := make([]error, world)
	worlds := make([]*comm.World, world)
	t.Cleanup(func() {
		// Together: a world's Close waits for its peers'.
		var wg sync.WaitGroup
		for _, w := range worlds {
			if w != nil {
				wg.Go(func() { w.Close() })
			}
		}
		wg.Wait()
	})
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() {
			w, err := comm.Connect(ctx, comm.Config{Rank: r, WorldSize: world, MasterAddr: "127.0.0.1", MasterPort: port, Timeout: 30 * time.Second, Secret: []byte("test")})
			if err != nil {
				errs[r] = err
				return
			}
			worlds[r] = w
			cfg, err := presets.Load("tiny", append([]string{"Engine.save_load.output_dir=" + t.TempDir()}, overrides...))
			if err != nil {
				errs[r] = err
				return
			}
			trs[r], errs[r] = NewTrainer(cfg, be(r), Options{Builtin: corpusFor(cfg), World: w})
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return trs
}

// TestInitFromUnderEveryLayout: Model.init_from an llm.c file or a gptui
// checkpoint gives each rank its slice of the file's model — under tensor
// and pipeline parallelism its part, under sharding stage 3 its shard of
// the part and nothing outside it — and the fresh initialisation of a
// layout equals one process's. Each rank's account of its parameters,
// gradients and optimizer state, which counts its buffers, is
// StartupMemory's, from the layout alone.
func TestInitFromUnderEveryLayout(t *testing.T) {
	model := filepath.Join(srcDir, "testdata/llmc/model.bin")
	whole, err := LoadLLMC(nil, model, ModelConfig{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	// model.bin's shape, as config keys.
	shape := []string{"Model.vocab_size=1000", "Model.hidden_size=64", "Model.num_layers=2", "Model.num_attention_heads=4",
		"Model.ffn_hidden_size=256", "Model.max_position_embeddings=64", "Data.Train.dataset.max_seq_len=64", "Engine.log_dir=" + t.TempDir()}
	cfg, err := presets.Load("tiny", append([]string{"Engine.save_load.output_dir=" + t.TempDir()}, shape...))
	if err != nil {
		t.Fatal(err)
	}
	ckpt, err := SaveModel(whole, cfg, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := NewModel(nil, whole.Cfg, cfg.Model.InitializerRange, uint64(cfg.Global.Seed))
	if err != nil {
		t.Fatal(err)
	}
	layouts := []struct {
		name  string
		world int
		o     []string
	}{
		{"mp2 pp2", 4, []string{"Distributed.mp_degree=2", "Distributed.pp_degree=2", "Global.global_batch_size=8", "Global.micro_batch_size=4"}},
		{"sharding2 stage3", 2, []string{"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=3", "Global.global_batch_size=8", "Global.micro_batch_size=4"}},
		{"pp2 sharding2 stage3", 4, []string{"Distributed.pp_degree=2", "Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=3", "Global.global_batch_size=8", "Global.micro_batch_size=2"}},
		{"mp2 sharding2 stage2", 4, []string{"Distributed.mp_degree=2", "Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=2", "Global.global_batch_size=8", "Global.micro_batch_size=4"}},
	}
	sources := []struct {
		name string
		o    []string
		want *Model
	}{
		{"llm.c file", []string{"Model.init_from=" + model}, whole},
		{"checkpoint", []string{"Model.init_from=" + ckpt}, whole},
		{"initialisation", nil, fresh},
	}
	for _, l := range layouts {
		for _, src := range sources {
			name := l.name + " from " + src.name
			trs := newRanks(t, l.world, slices.Concat(shape, l.o, src.o))
			for _, tr := range trs {
				m := tr.Model
				// The start-up account from the layout alone is the
				// trainer's.
				sm, err := StartupMemory(tr.Cfg, tr.topo.Rank, l.world)
				if got := tr.Memory; err != nil || sm.Params != got.Params || sm.Grads != got.Grads || sm.Optimizer != got.Optimizer {
					t.Errorf("%s: rank %d: StartupMemory %+v (%v), the trainer's account %+v", name, tr.topo.Rank, sm, err, got)
				}
				if m.stage3 == nil {
					checkPart(t, name, m, src.want)
					continue
				}
				// Stage 3: the shard holds the model's values, and no
				// buffer holds the rest.
				if m.Params != nil {
					t.Errorf("%s: rank %d holds a whole buffer of %d parameters", name, tr.topo.Rank, len(m.Params))
				}
				want, shard := partParams(m, src.want), download(t, tr.be, m.stage3.shard)
				for _, s := range tr.dp.own() {
					if !slices.Equal(shard[s.At:s.At+s.N], want[s.Flat:s.Flat+s.N]) {
						t.Errorf("%s: rank %d's shard differs from the model in elements [%d, %d)", name, tr.topo.Rank, s.Flat, s.Flat+s.N)
					}
				}
			}
		}
	}
}

// allocRecorder is the deferred backend recording the size of every
// float32 buffer it hands out.
type allocRecorder struct {
	*deferred.Backend
	mu    sync.Mutex
	sizes []int
}

func (a *allocRecorder) Float32s(n int) []float32 {
	a.mu.Lock()
	a.sizes = append(a.sizes, n)
	a.mu.Unlock()
	return a.Backend.Float32s(n)
}

// TestRankAllocatesOnlyItsBuffers: a sharding rank's buffers are laid out
// for the sharding from the start, in the backend's memory: under stages
// 1 and 2 its part's parameters and gradients are allocated once, padded
// (none is allocated again to pad it, here where the part does not divide
// by the degree), and a stage 3 rank allocates no buffer of its whole
// part at all, and no more than its account of parameters, gradients,
// optimizer state, activations and scratch.
func TestRankAllocatesOnlyItsBuffers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		world int
		o     []string
	}{
		{"sharding3 stage2", 3, []string{"Distributed.sharding.sharding_degree=3", "Distributed.sharding.sharding_stage=2", "Global.global_batch_size=6", "Global.micro_batch_size=2"}},
		{"sharding3 stage3", 3, []string{"Distributed.sharding.sharding_degree=3", "Distributed.sharding.sharding_stage=3", "Global.global_batch_size=6", "Global.micro_batch_size=2"}},
	} {
		recs := make([]*allocRecorder, tc.world)
		trs := newRanksOn(t, tc.world, append(tc.o, "Engine.log_dir="+t.TempDir()), func(r int) kernels.Backend {
			recs[r] = &allocRecorder{Backend: deferred.New(fixedPeak{cpu.New()})}
			return recs[r]
		})
		for r, tr := range trs {
			n := tr.Model.NumParams()
			if r == 0 && n%tc.world == 0 {
				t.Errorf("%s: the part's %d parameters divide by %d: the test needs a part that does not", tc.name, n, tc.world)
			}
			whole, total := 0, 0
			for _, k := range recs[r].sizes {
				total += k
				if k >= n && k < n+tc.world { // the part, padded or not
					whole++
				}
			}
			want := 2 // parameters and gradients
			if tr.topo.Stage == 3 {
				want = 0
				// The account, activations and scratch included.
				limit := tr.Memory.Total()
				if int64(4*total) > limit {
					t.Errorf("%s: rank %d allocated %d bytes, more than its account, %d", tc.name, r, 4*total, limit)
				}
			}
			if whole != want {
				t.Errorf("%s: rank %d allocated %d buffers of its part's %d parameters, want %d", tc.name, r, whole, n, want)
			}
		}
	}
}
