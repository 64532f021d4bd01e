package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/presets"
)

// TestParallelSave: under every kind of layout, each of 4 ranks writes
// its own file of the checkpoint, and the checkpoint holds exactly every
// rank's parameters and moments, read back into the rank's layout. Where
// ranks hold the same state (replicas, the sharding group's parameters)
// the writing is spread evenly: no file holds more than a quarter of the
// bytes and 10%.
func TestParallelSave(t *testing.T) {
	for _, tc := range []struct {
		name     string
		o        []string
		balanced bool // every rank writes about a quarter
	}{
		{"dp4", []string{"Distributed.dp_degree=4", "Global.local_batch_size=2", "Global.micro_batch_size=2"}, true},
		{"sharding4 stage1", []string{"Distributed.sharding.sharding_degree=4", "Distributed.sharding.sharding_stage=1", "Global.local_batch_size=2", "Global.micro_batch_size=2"}, true},
		{"sharding4 stage3 async", []string{"Distributed.sharding.sharding_degree=4", "Distributed.sharding.sharding_stage=3", "Global.local_batch_size=2", "Global.micro_batch_size=2", "Engine.save_load.async=true"}, true},
		{"dp2 sharding2 stage2", []string{"Distributed.dp_degree=2", "Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=2", "Global.local_batch_size=2", "Global.micro_batch_size=2"}, true},
		{"mp2×pp2", []string{"Distributed.mp_degree=2", "Distributed.pp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=4"}, false},
		{"dp2×mp2 async", []string{"Distributed.dp_degree=2", "Distributed.mp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=4", "Engine.save_load.async=true"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			o := append(parityOverrides(t), "Engine.max_steps=2", "Engine.save_load.save_steps=2", "Engine.save_load.output_dir="+out)
			r := runRanksWith(t, 4, append(o, tc.o...), rankOptions{})
			c, err := checkpoint.Load(filepath.Join(out, checkpoint.DirName(2)))
			if err != nil {
				t.Fatal(err)
			}
			var files []string
			var sizes []int64
			var total int64
			for f := range c.Manifest.Files {
				fi, err := os.Stat(filepath.Join(c.Dir, f))
				if err != nil {
					t.Fatal(err)
				}
				files = append(files, f)
				sizes = append(sizes, fi.Size())
				total += fi.Size()
			}
			slices.Sort(files)
			if want := []string{"rank_00000.safetensors", "rank_00001.safetensors", "rank_00002.safetensors", "rank_00003.safetensors"}; !slices.Equal(files, want) {
				t.Errorf("files %v, want one per rank: %v", files, want)
			}
			t.Logf("file sizes %v, %d bytes in all", sizes, total)
			if tc.balanced {
				for i, n := range sizes {
					if float64(n) > 1.1*float64(total)/4 {
						t.Errorf("%s holds %d of %d bytes: over a quarter and 10%%", files[i], n, total)
					}
				}
			}
			// Each rank's file holds the bytes the engine's account of a
			// save (SaveMemory) says it writes.
			data := map[string]int64{}
			for _, ti := range c.Manifest.Tensors {
				for _, sl := range ti.Slices {
					data[sl.File] += 4 * int64(numel(sl.Shape))
				}
			}
			for k, tr := range r.trs {
				cost, err := SaveMemory(tr.Cfg, k, 4)
				if err != nil {
					t.Fatal(err)
				}
				if got := data[fmt.Sprintf("rank_%05d.safetensors", k)]; got != cost.Write {
					t.Errorf("rank %d wrote %d bytes of tensors; SaveMemory says %d", k, got, cost.Write)
				}
			}
			// Every rank's state, read back into its layout, is the state
			// it holds.
			for k, tr := range r.trs {
				m := tr.Model
				got := make([]float32, m.NumParams())
				if err := readParams(tr.be, c, m.Tensors, ckptParams, []Span{{0, 0, len(got)}}, got); err != nil {
					t.Fatal(err)
				}
				if d := maxRelDiff(got, r.params[k]); d != 0 {
					t.Errorf("rank %d: the checkpoint's parameters differ from the rank's by %.3g", k, d)
				}
				for _, mv := range []struct {
					prefix string
					held   []float32
				}{{ckptAdamM, tr.Opt.M}, {ckptAdamV, tr.Opt.V}} {
					got := make([]float32, len(mv.held))
					if err := readParams(tr.be, c, m.Tensors, mv.prefix, tr.Opt.Spans, got); err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(got, mv.held) {
						t.Errorf("rank %d: the checkpoint's %s differs from the rank's", k, mv.prefix)
					}
				}
			}
		})
	}
}

// TestCutRanges: the pieces of ranges cut n ways are disjoint, in order,
// and cover them, each within one element of an n-th.
func TestCutRanges(t *testing.T) {
	ranges := [][2]int{{0, 10}, {20, 23}, {30, 31}, {40, 57}}
	for n := 1; n <= 7; n++ {
		var all [][2]int
		for i := range n {
			p := cutRanges(ranges, n, i)
			size := 0
			for _, r := range p {
				size += r[1] - r[0]
			}
			if size < 31/n || size > 31/n+1 {
				t.Errorf("n=%d: piece %d holds %d of 31 elements", n, i, size)
			}
			all = append(all, p...)
		}
		var flat []int
		for _, r := range all {
			for e := r[0]; e < r[1]; e++ {
				flat = append(flat, e)
			}
		}
		var want []int
		for _, r := range ranges {
			for e := r[0]; e < r[1]; e++ {
				want = append(want, e)
			}
		}
		if !slices.Equal(flat, want) {
			t.Errorf("n=%d: pieces %v do not cover %v in order", n, all, ranges)
		}
	}
}

// TestPackBytes: bytes survive packBytes and unpackBytes, odd lengths too.
func TestPackBytes(t *testing.T) {
	for _, b := range [][]byte{nil, {0}, {255}, {1, 2, 3}, []byte("{\"report\":{}}\xff\x00")} {
		if got := unpackBytes(packBytes(b), len(b)); !slices.Equal(got, b) && len(b) > 0 {
			t.Errorf("%q came back as %q", b, got)
		}
	}
}

// killHelperEnv carries "<output dir>|<log dir>|<rank>|<port>|<async>" to
// TestParallelSaveKillsHelper.
const killHelperEnv = "GPTUI_PARALLEL_SAVE_HELPER"

// TestParallelSaveKillsHelper is not a test: run as a child process by
// TestParallelSaveKills, it is one rank of a 2-rank sharding job that
// resumes from the newest checkpoint and saves after every step until it
// is killed, or its peer is.
func TestParallelSaveKillsHelper(t *testing.T) {
	spec := os.Getenv(killHelperEnv)
	if spec == "" {
		return
	}
	f := strings.Split(spec, "|")
	rank, _ := strconv.Atoi(f[2])
	port, _ := strconv.Atoi(f[3])
	ctx := context.Background()
	w, err := comm.Connect(ctx, comm.Config{Rank: rank, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: port, Timeout: 5 * time.Second, Secret: []byte("test")})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	cfg := smallConfig(t, f[0], f[1], 1<<30, "Engine.save_load.save_steps=1", "Engine.save_load.async="+f[4],
		"Engine.save_load.keep_last=2", "Engine.save_load.ckpt_dir=auto",
		"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=3", "Global.local_batch_size=2")
	tr, err := NewTrainer(cfg, fixedPeak{cpu.New()}, Options{Builtin: smallTokens, World: w})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestParallelSaveKills: 20 times, a 2-rank job saving after every step
// (synchronous and asynchronous saves by turns), each rank writing its
// own file, loses one rank, chosen at random, to SIGKILL at a random
// moment after its second step; the other rank ends on the lost peer.
// After each kill the newest checkpoint loads whole — every file of it
// verified — and is never older than the one before: no kill leaves a
// partial checkpoint where a resume would take it. Each job resumes from
// it, so the run moves on.
func TestParallelSaveKills(t *testing.T) {
	kills := 20
	if testing.Short() {
		kills = 4
	}
	out, logs := t.TempDir(), t.TempDir()
	r := rand.New(rand.NewPCG(5, 6))
	last, inWrite := 0, 0
	for i := range kills {
		logDir := filepath.Join(logs, fmt.Sprint(i))
		port := freePort(t)
		async := fmt.Sprint(i%2 == 1)
		cmds := make([]*exec.Cmd, 2)
		errs := make([]*strings.Builder, 2)
		before, _ := filepath.Glob(filepath.Join(out, ".tmp-*"))
		for k := range cmds {
			cmds[k] = exec.Command(os.Args[0], "-test.run=^TestParallelSaveKillsHelper$", "-test.count=1")
			cmds[k].Env = append(os.Environ(), fmt.Sprintf("%s=%s|%s|%d|%d|%s", killHelperEnv, out, logDir, k, port, async))
			errs[k] = &strings.Builder{}
			cmds[k].Stderr = errs[k]
			if err := cmds[k].Start(); err != nil {
				t.Fatal(err)
			}
		}
		metrics := filepath.Join(logDir, "metrics.0.jsonl")
		for start := time.Now(); len(stepLossesOf(t, metrics)) < 2; time.Sleep(2 * time.Millisecond) {
			// A job that trains no further steps is hung: a save whose
			// commit the ranks did not enter together.
			if time.Since(start) > 30*time.Second {
				t.Fatalf("kill %d: the job ran no 2 steps in 30 s", i)
			}
		}
		time.Sleep(time.Duration(r.IntN(40)) * time.Millisecond)
		victim := r.IntN(2)
		cmds[victim].Process.Kill()
		for k, cmd := range cmds {
			if k != victim {
				// The survivor ends on its lost peer; a hung one fails the test.
				t0 := time.AfterFunc(20*time.Second, func() { cmd.Process.Kill() })
				err := cmd.Wait()
				t0.Stop()
				if err == nil {
					t.Fatalf("kill %d: rank %d ended without error after its peer was killed", i, k)
				}
				if ee, ok := err.(*exec.ExitError); ok && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL {
					t.Fatalf("kill %d: rank %d hung after its peer was killed:\n%s", i, k, errs[k])
				}
			} else {
				cmd.Wait()
			}
		}
		if tmps, _ := filepath.Glob(filepath.Join(out, ".tmp-*")); len(tmps) > 0 && !slices.Equal(tmps, before) {
			inWrite++
		}
		if c := newestAfterKill(t, out, i, last); c != nil {
			if len(c.Manifest.Files) != 2 {
				t.Fatalf("after kill %d step %d has files %v, want one per rank", i, c.Manifest.Step, c.Manifest.Files)
			}
			last = c.Manifest.Step
		}
	}
	if last < kills/2 {
		t.Fatalf("the jobs got to step %d only", last)
	}
	t.Logf("%d kills (%d with a new save's temporary directory left): checkpoints up to step %d, each loading whole", kills, inWrite, last)
}

// TestParallelSaveMachines: ranks on two machines (node names a, a, b, b,
// each machine its own output directory) save a checkpoint as two parts:
// each machine's directory holds the manifest, the same on both, and its
// own ranks' files, and names it latest; a part does not load, and the
// two parts together are the checkpoint, every rank's state in it.
func TestParallelSaveMachines(t *testing.T) {
	for _, async := range []bool{false, true} {
		t.Run(fmt.Sprintf("async %v", async), func(t *testing.T) {
			outs := map[string]string{"a": t.TempDir(), "b": t.TempDir()}
			hosts := []string{"a", "a", "b", "b"}
			o := append(parityOverrides(t), "Engine.max_steps=2", "Engine.save_load.save_steps=2", fmt.Sprintf("Engine.save_load.async=%v", async),
				"Distributed.mp_degree=2", "Distributed.pp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=4")
			r := runRanksWith(t, 4, o, rankOptions{edit: func(tr *Trainer) {
				tr.hosts = hosts
				tr.Cfg.Engine.SaveLoad.OutputDir = outs[hosts[tr.topo.Rank]]
			}})
			if want := filepath.Join(outs["a"], checkpoint.DirName(2)); r.res[0].Checkpoint != want {
				t.Errorf("rank 0 reports %q, want %q", r.res[0].Checkpoint, want)
			}
			var manifests [][]byte
			for node, files := range map[string][]string{"a": {"rank_00000.safetensors", "rank_00001.safetensors"}, "b": {"rank_00002.safetensors", "rank_00003.safetensors"}} {
				dir := filepath.Join(outs[node], checkpoint.DirName(2))
				c, missing, err := checkpoint.Open(dir)
				if err != nil {
					t.Fatalf("machine %s: %v", node, err)
				}
				var names []string
				for _, m := range missing {
					names = append(names, m.Name)
				}
				if len(c.Manifest.Files) != 4 || len(missing) != 2 || slices.ContainsFunc(names, func(n string) bool { return slices.Contains(files, n) }) {
					t.Errorf("machine %s: manifest files %d, missing %v; want 4, the other machine's two", node, len(c.Manifest.Files), names)
				}
				if _, err := checkpoint.Load(dir); err == nil {
					t.Errorf("machine %s's part loads as a whole checkpoint", node)
				}
				if b, _ := os.ReadFile(filepath.Join(outs[node], checkpoint.LatestFile)); string(b) != checkpoint.DirName(2)+"\n" {
					t.Errorf("machine %s: latest names %q", node, b)
				}
				b, _ := os.ReadFile(filepath.Join(dir, checkpoint.ManifestFile))
				manifests = append(manifests, b)
			}
			if !slices.Equal(manifests[0], manifests[1]) {
				t.Error("the machines' manifests differ")
			}
			// Machine b's files beside machine a's: the whole checkpoint.
			da, db := filepath.Join(outs["a"], checkpoint.DirName(2)), filepath.Join(outs["b"], checkpoint.DirName(2))
			for _, f := range []string{"rank_00002.safetensors", "rank_00003.safetensors"} {
				b, err := os.ReadFile(filepath.Join(db, f))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(da, f), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			c, err := checkpoint.Load(da)
			if err != nil {
				t.Fatal(err)
			}
			for k, tr := range r.trs {
				got := make([]float32, tr.Model.NumParams())
				if err := readParams(tr.be, c, tr.Model.Tensors, ckptParams, []Span{{0, 0, len(got)}}, got); err != nil {
					t.Fatal(err)
				}
				if d := maxRelDiff(got, r.params[k]); d != 0 {
					t.Errorf("rank %d: the checkpoint's parameters differ from the rank's by %.3g", k, d)
				}
			}
		})
	}
}

// TestSaveBalance: by the engine's own account of a save (SaveMemory, which
// TestParallelSave checks against the files written), no rank of the
// seeds' model-parallel layouts writes more than its share of the
// checkpoint and 10%: the tied wte, held by the first and the last
// pipeline stage, is written half by each.
func TestSaveBalance(t *testing.T) {
	for _, tc := range []struct {
		preset string
		world  int
		o      []string
	}{
		{"345m-1card", 4, []string{"Global.local_batch_size=4", "Global.micro_batch_size=4", "Distributed.mp_degree=2", "Distributed.pp_degree=2"}},
		{"345m-1card", 2, []string{"Global.local_batch_size=4", "Global.micro_batch_size=4", "Distributed.pp_degree=2"}},
		{"13b-4node", 32, nil},
	} {
		cfg, err := presets.Load(tc.preset, append([]string{"Global.device=cpu", "Engine.mix_precision.dtype=fp32"}, tc.o...))
		if err != nil {
			t.Fatal(err)
		}
		var writes []int64
		var total int64
		for r := range tc.world {
			c, err := SaveMemory(cfg, r, tc.world)
			if err != nil {
				t.Fatalf("%s: %v", tc.preset, err)
			}
			writes, total = append(writes, c.Write), total+c.Write
		}
		share := float64(total) / float64(tc.world)
		worst := slices.Max(writes)
		if float64(worst) > 1.1*share {
			t.Errorf("%s on %d ranks: a rank writes %d bytes, %.1f%% over its share %.0f (%v)", tc.preset, tc.world, worst, 100*(float64(worst)/share-1), share, writes)
		} else {
			t.Logf("%s on %d ranks: the most a rank writes is %.2f%% over its share", tc.preset, tc.world, 100*(float64(worst)/share-1))
		}
	}
}
