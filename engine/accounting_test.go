package engine

import (
	"slices"
	"testing"

	"github.com/gptui/gptui/internal/paritymatrix"
)

// TestScratchIsAllocated: the scratch of the engine's account
// (Trainer.Memory.Scratch, counted before the first step, the layouts'
// buffers from the shapes they are sized from) is what the passes have
// allocated once a step has run: the model's scratch, sequence
// parallelism's gathered and scattered rows, the vocabulary-parallel
// loss's exchange buffers, context parallelism's ring (and wpe's rows),
// the pipeline's second gradient buffer; and under sharding stages 1 and
// 2 the parameters' account holds the chunk they are all-gathered from.
func TestScratchIsAllocated(t *testing.T) {
	recompute := func(g string) []string {
		return []string{"Engine.use_recompute=true", "Engine.recompute_granularity=" + g, "Global.local_batch_size=8", "Global.micro_batch_size=4"}
	}
	layouts := []paritymatrix.Layout{
		{Name: "single", World: 1, O: []string{"Global.local_batch_size=8", "Global.micro_batch_size=4"}},
		{Name: "single full", World: 1, O: recompute("full")},
		{Name: "single only_attn", World: 1, O: recompute("only_attn")},
	}
	names := []string{"sharding2 stage1", "sharding2 stage2", "mp2", "mp2 sp", "pp2 1f1b", "pp2 interleaved vpp2", "mp2 pp2 sp",
		"cp2", "cp2 mp2", "cp2 pp2", "llama mp4 kv2 sp untied", "llama cp2 mp2 kv2 untied", "llama pp2 interleaved vpp2"}
	short := []string{"single full", "sharding2 stage1", "mp2 sp", "pp2 1f1b", "cp2 pp2", "llama cp2 mp2 kv2 untied"}
	for _, l := range paritymatrix.Layouts() {
		if slices.Contains(names, l.Name) {
			layouts = append(layouts, l)
		}
	}
	if len(layouts) != 3+len(names) {
		t.Fatalf("%d layouts, want %d: a name is not the parity matrix's", len(layouts), 3+len(names))
	}
	for _, l := range layouts {
		if testing.Short() && !slices.Contains(short, l.Name) {
			continue
		}
		t.Run(l.Name, func(t *testing.T) {
			o := append(parityOverrides(t), l.O...)
			o = append(o, "Engine.max_steps=1")
			r := runRanksWith(t, l.World, o, rankOptions{})
			for k, tr := range r.trs {
				got, want := tr.Memory.Scratch, heldScratch(tr)
				if got != want || got == 0 {
					t.Errorf("rank %d: the account's scratch is %d bytes, the buffers hold %d (%+d)", k, got, want, got-want)
				}
				if d := tr.dp; d != nil && d.scratch != nil {
					want := int64(4 * (tr.Model.NumParams() + len(d.scratch)))
					if tr.Memory.Params != want || len(d.scratch) != d.length {
						t.Errorf("rank %d: parameters %d bytes in the account, want %d with the all-gather chunk of %d", k, tr.Memory.Params, want, len(d.scratch))
					}
				}
			}
		})
	}
}

// heldScratch is the bytes of the buffers tr's passes share, read from
// the buffers themselves: the model's scratch, its layout's (each
// dimension's, through the wrappers) and the pipeline's dnext.
func heldScratch(tr *Trainer) int64 {
	m := tr.Model
	var n int64
	add := func(bs ...[]float32) {
		for _, b := range bs {
			n += int64(4 * len(b))
		}
	}
	for _, b := range m.scratch.bufs {
		add(b.([]float32))
	}
	for par := m.par; par != nil; {
		switch p := par.(type) {
		case *stage3:
			par = p.parallel
		case *contextParallel:
			add(p.kv[0], p.kv[1], p.dkv[0], p.dkv[1], p.stats, p.delta, p.acc, p.dacc, p.wpe, p.dwpe)
			par = p.parallel
		case *sequenceParallel:
			add(p.in, p.dout, p.out, p.din)
			par = p.tensorParallel
		case *tensorParallel:
			add(p.maxes, p.gmax, p.embed)
			n += int64(8 * len(p.stats))
			par = nil
		default:
			par = nil
		}
	}
	if tr.pp != nil {
		add(tr.pp.dnext)
	}
	return n
}
