package engine

import (
	"slices"
	"strings"
	"testing"

	"github.com/gptui/gptui/internal/paritymatrix"
	"github.com/gptui/gptui/kernels"
)

// TestCPRows: each rank of a ring takes, of every sequence, chunk r then
// chunk 2·cp−1−r, and the ranks' rows together are every token once.
func TestCPRows(t *testing.T) {
	const B, T = 3, 16
	x := make([]int32, B*T)
	for i := range x {
		x[i] = int32(i)
	}
	for _, cp := range []int{1, 2, 4, 8} {
		var all []int32
		for r := range cp {
			rows := cpRows(x, T, cp, r)
			if len(rows) != B*T/cp {
				t.Fatalf("cp %d rank %d: %d rows, want %d", cp, r, len(rows), B*T/cp)
			}
			c := T / (2 * cp)
			if cp > 1 && (rows[0] != int32(r*c) || rows[c] != int32((2*cp-1-r)*c)) {
				t.Errorf("cp %d rank %d: rows begin %d and %d, want chunks %d and %d", cp, r, rows[0], rows[c], r, 2*cp-1-r)
			}
			p := (&contextParallel{rank: r, size: cp}).positions(T / cp)
			for j := range T / cp { // the positions are the rows' places in their sequence
				if cp > 1 && int(rows[j]) != p[j] {
					t.Fatalf("cp %d rank %d: row %d is token %d, positions says %d", cp, r, j, rows[j], p[j])
				}
			}
			all = append(all, rows...)
		}
		slices.Sort(all)
		if !slices.Equal(all, x) {
			t.Errorf("cp %d: the ranks' rows are not every token once", cp)
		}
	}
}

// TestContextParallelGradients: after one step, the gradients a
// context-parallel job reduces equal one process's within 5e-7 (relative
// L2 per tensor): the ring's attention, the positions of the rows, the
// losses' weights and the sum over the ring are the single process's,
// up to fp32's rounding. The gradient, not the weights after AdamW, which
// amplifies rounding (parityEpsilon), is what this checks tightly.
func TestContextParallelGradients(t *testing.T) {
	for _, name := range []string{"cp2", "cp4", "llama cp2 kv1"} {
		t.Run(name, func(t *testing.T) {
			var tc paritymatrix.Layout
			for _, l := range paritymatrix.Layouts() {
				if l.Name == name {
					tc = l
				}
			}
			var shape []string
			for _, o := range tc.O {
				if strings.HasPrefix(o, "Model.") {
					shape = append(shape, o)
				}
			}
			one := append(parityOverrides(t), "Engine.max_steps=1", "Optimizer.grad_clip.clip_norm=0")
			ref, _ := trainPresetOn(t, cpuBackend(), "tiny", append(append(slices.Clone(one), "Global.local_batch_size=8", "Global.micro_batch_size=2"), shape...)...)
			r := runRanksWith(t, tc.World, append(slices.Clone(one), tc.O...), rankOptions{})
			n := ref.Model.NumParams()
			want, got := make([]float32, n), make([]float32, n)
			if err := kernels.Download(ref.be, want, ref.Model.Grads); err != nil {
				t.Fatal(err)
			}
			for k, tr := range r.trs {
				if err := kernels.Download(tr.be, got, tr.Model.Grads[:n]); err != nil {
					t.Fatal(err)
				}
				worst := 0.0
				for _, x := range ref.Model.Tensors {
					d := relNorm(got[x.Offset:x.Offset+x.Size], want[x.Offset:x.Offset+x.Size])
					if d > 5e-7 {
						t.Errorf("rank %d: %s's gradient differs from one process's by %.3g (relative L2)", k, x.Name, d)
					}
					worst = max(worst, d)
				}
				if k == 0 {
					t.Logf("%s: worst tensor %.3g", name, worst)
				}
			}
		})
	}
}

// TestResumeAcrossContextParallel: a checkpoint saved by a cp2 × mp2 job
// with sequence parallelism resumes on one process, on a cp4 ring and on
// mp2 × pp2 with the losses of the uninterrupted run (the ring's ranks
// hold the same parameters and each writes its share of them once).
func TestResumeAcrossContextParallel(t *testing.T) {
	base := func(extra ...string) []string {
		return append(append(parityOverrides(t), "Engine.max_steps=10"), extra...)
	}
	single := func(extra ...string) *Result {
		_, res := trainPreset(t, "tiny", base(append([]string{"Global.local_batch_size=8", "Global.micro_batch_size=2"}, extra...)...)...)
		return res
	}
	straight := single()
	out := t.TempDir()
	runRanks(t, 4, base("Engine.max_steps=5", "Engine.save_load.save_steps=5", "Engine.save_load.output_dir="+out,
		"Distributed.cp_degree=2", "Distributed.mp_degree=2", "Distributed.sequence_parallel=true", "Global.local_batch_size=8", "Global.micro_batch_size=4"))
	resume := "Engine.save_load.ckpt_dir=" + out + "/step_00000005"
	checkResumed(t, "cp2×mp2 sp → single process", single(resume).Losses, straight.Losses, 5)
	_, res := runRanks(t, 4, base(resume, "Distributed.cp_degree=4", "Global.local_batch_size=8", "Global.micro_batch_size=2"))
	checkResumed(t, "cp2×mp2 sp → cp4", res.Losses, straight.Losses, 5)
	_, res = runRanks(t, 4, base(resume, "Distributed.mp_degree=2", "Distributed.pp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=4"))
	checkResumed(t, "cp2×mp2 sp → mp2×pp2", res.Losses, straight.Losses, 5)
}
