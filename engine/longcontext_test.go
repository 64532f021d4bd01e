package engine

import (
	"os"
	"runtime/debug"
	"testing"

	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/presets"
)

// TestLongContextActivations measures, for BENCHMARKS.md, the activation
// memory a rank keeps between the forward and backward pass of one
// 4096-token sequence of the 345M model (the engine's own account,
// Model.ActivationBytes: what newActivations allocates), under one
// process, mp2 and mp4 without and with sequence parallelism, cp2 and cp2 × mp2 with
// sequence parallelism, without recompute, with attention recompute and
// with full recompute, and beside them the head's chunk of logits (scratch,
// not kept between the passes: classify). It
// allocates tens of GB of address space (untouched), so it runs only with
// GPTUI_LONG_CONTEXT=1. It checks issue 36's bounds — context
// parallelism's (cp2 ≤ 0.55 × one process) and, under full recompute,
// sequence parallelism's (mp2 + sp ≤ 0.6 × mp2), both of what is kept
// between the passes — and logs the rest, the ratios with the head's
// chunk too.
func TestLongContextActivations(t *testing.T) {
	if os.Getenv("GPTUI_LONG_CONTEXT") == "" {
		t.Skip("set GPTUI_LONG_CONTEXT=1 to measure the 345M model's activations at T=4096")
	}
	const T = 4096
	cfg, err := presets.Load("345m-1card", []string{"Data.Train.dataset.max_seq_len=4096", "Model.max_position_embeddings=4096"})
	if err != nil {
		t.Fatal(err)
	}
	shape := ShapeOf(cfg)
	layouts := []struct {
		name   string
		mp, cp int
		sp     bool
	}{{"one process", 1, 1, false}, {"mp2", 2, 1, false}, {"mp2 sp", 2, 1, true}, {"mp4", 4, 1, false}, {"mp4 sp", 4, 1, true}, {"cp2", 1, 2, false}, {"cp2 mp2 sp", 2, 2, true}}
	for _, rc := range []Recompute{RecomputeNone, RecomputeOnlyAttn, RecomputeFull} {
		got, chunk := map[string]float64{}, map[string]float64{}
		for _, l := range layouts {
			p := WholePart(shape)
			p.MP, p.CP, p.SP = l.mp, l.cp, l.sp
			m, err := newModel(cpu.New(), shape, p)
			if err != nil {
				t.Fatal(err)
			}
			m.SetRecompute(rc)
			got[l.name] = float64(m.ActivationBytes(1, T/l.cp))
			chunk[l.name] = float64(4 * len(m.scratch.logits))
			m.acts.free(m.be)
			m.scratch.free(m.be)
			debug.FreeOSMemory()
			t.Logf("recompute %d, %-12s %6.3f GiB (%.2f × one process); the head's chunk of logits %4d rows, %.3f GiB", rc, l.name,
				got[l.name]/(1<<30), got[l.name]/got["one process"], m.scratch.headRows, chunk[l.name]/(1<<30))
		}
		if r := got["cp2"] / got["one process"]; r > 0.55 {
			t.Errorf("recompute %d: cp2 keeps %.2f × one process's activations, want ≤ 0.55", rc, r)
		}
		sp, spChunk := got["mp2 sp"]/got["mp2"], (got["mp2 sp"]+chunk["mp2 sp"])/(got["mp2"]+chunk["mp2"])
		if rc == RecomputeFull && sp > 0.6 {
			t.Errorf("full recompute: mp2 sp keeps %.3f × mp2's activations, want ≤ 0.6", sp)
		}
		t.Logf("recompute %d: mp2 sp / mp2 = %.3f (%.3f with the head's chunks), mp4 sp / mp4 = %.3f (%.3f)", rc, sp, spChunk,
			got["mp4 sp"]/got["mp4"], (got["mp4 sp"]+chunk["mp4 sp"])/(got["mp4"]+chunk["mp4"]))
	}
}
