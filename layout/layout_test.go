package layout

import (
	"github.com/gptui/gptui/arch"
	"strings"
	"testing"
)

// TestCheck: each rule refuses the layouts that break it, naming the key to
// change, and lets the others through.
func TestCheck(t *testing.T) {
	gpt2 := arch.Shape{L: 12, NH: 12, F: 3072, Vp: 50304}
	llama := arch.Shape{Family: arch.Llama, L: 12, NH: 8, NKV: 4, F: 3072, Vp: 50304}
	one := Layout{DP: 1, Sharding: 1, MP: 1, PP: 1, VPP: 1, Stage: 1}
	with := func(f func(*Layout)) Layout { l := one; f(&l); return l }
	batch := Batch{Global: 8, Local: 8, Micro: 2}
	for _, tt := range []struct {
		name  string
		m     arch.Shape
		l     Layout
		b     Batch
		key   string // "" for none
		inMsg string
	}{
		{"one process", gpt2, one, batch, "", ""},
		{"no batch given", gpt2, with(func(l *Layout) { l.DP = 3 }), Batch{}, "", ""},
		{"dp 0", gpt2, with(func(l *Layout) { l.DP = 0 }), batch, "Distributed.dp_degree", "got 0"},
		{"vpp 0", gpt2, with(func(l *Layout) { l.VPP = 0 }), batch, "Distributed.vpp_degree", "positive"},
		{"stage 4", gpt2, with(func(l *Layout) { l.Stage = 4 }), batch, "Distributed.sharding.sharding_stage", "1, 2 or 3"},
		{"unknown schedule", gpt2, with(func(l *Layout) { l.Schedule = "zigzag" }), batch, "Distributed.pp_schedule", `"zigzag"`},
		{"mp divides all", gpt2, with(func(l *Layout) { l.MP = 4 }), batch, "", ""},
		{"mp and heads", gpt2, with(func(l *Layout) { l.MP = 5 }), batch, "Model.num_attention_heads", "mp_degree (5)"},
		{"mp and ffn", arch.Shape{L: 12, NH: 12, F: 102, Vp: 50304}, with(func(l *Layout) { l.MP = 4 }), batch, "Model.ffn_hidden_size", "mp_degree (4)"},
		{"mp and vocabulary", arch.Shape{L: 12, NH: 12, F: 3072, Vp: 50304 + 128}, with(func(l *Layout) { l.MP = 12 }), batch, "Distributed.mp_degree", "padded vocabulary 50432"},
		{"llama mp divides kv heads", llama, with(func(l *Layout) { l.MP = 2 }), batch, "", ""},
		{"llama mp a multiple of kv heads", llama, with(func(l *Layout) { l.MP = 8 }), batch, "", ""},
		{"llama mp and kv heads", arch.Shape{Family: arch.Llama, L: 12, NH: 12, NKV: 4, F: 3072, Vp: 50304}, with(func(l *Layout) { l.MP = 6 }), batch, "Model.num_key_value_heads", "4 key/value heads and mp_degree 6"},
		{"llama mp and query heads", llama, with(func(l *Layout) { l.MP = 16 }), batch, "Model.num_attention_heads", "mp_degree (16)"},
		{"pp and layers", gpt2, with(func(l *Layout) { l.PP = 5 }), batch, "Model.num_layers", "pp_degree (5)"},
		{"sp without mp", gpt2, with(func(l *Layout) { l.SP = true }), batch, "Distributed.sequence_parallel", "mp_degree is 1"},
		{"sp and sequence", gpt2, with(func(l *Layout) { l.SP, l.MP = true, 4 }), Batch{Global: 8, Micro: 2, Seq: 1022}, "Data.Train.dataset.max_seq_len", "1022 is not a multiple"},
		{"sp", gpt2, with(func(l *Layout) { l.SP, l.MP = true, 4 }), Batch{Global: 8, Micro: 2, Seq: 1024}, "", ""},
		{"cp degree", gpt2, with(func(l *Layout) { l.CP = -1 }), batch, "Distributed.cp_degree", "got -1"},
		{"cp and sequence", gpt2, with(func(l *Layout) { l.CP = 4 }), Batch{Global: 8, Micro: 2, Seq: 1020}, "Data.Train.dataset.max_seq_len", "2 × cp_degree (8)"},
		{"cp", gpt2, with(func(l *Layout) { l.CP = 4 }), Batch{Global: 8, Micro: 2, Seq: 1024}, "", ""},
		{"cp and sp", gpt2, with(func(l *Layout) { l.CP, l.SP, l.MP = 4, true, 4 }), Batch{Global: 8, Micro: 2, Seq: 1032}, "Data.Train.dataset.max_seq_len", "mp_degree × cp_degree (16)"},
		{"pp divides", gpt2, with(func(l *Layout) { l.PP = 4 }), batch, "", ""},
		{"vpp without pp", gpt2, with(func(l *Layout) { l.VPP = 2; l.Schedule = "interleaved" }), batch, "Distributed.vpp_degree", "pp_degree > 1"},
		{"pp·vpp and layers", gpt2, with(func(l *Layout) { l.PP = 4; l.VPP = 2; l.Schedule = "interleaved" }), batch, "Model.num_layers", "4 × 2 = 8"},
		{"vpp with 1f1b", gpt2, with(func(l *Layout) { l.PP = 2; l.VPP = 2 }), batch, "Distributed.pp_schedule", "use interleaved"},
		{"interleaved", gpt2, with(func(l *Layout) { l.PP = 2; l.VPP = 2; l.Schedule = "interleaved" }), batch, "", ""},
		{"interleaved micro-batches", gpt2, with(func(l *Layout) { l.PP = 2; l.VPP = 2; l.Schedule = "interleaved" }), Batch{Global: 8, Local: 8, Micro: 8}, "Global.micro_batch_size", "(local_batch_size / micro_batch_size = 1) to be a multiple of pp_degree 2"},
		{"interleaved with one chunk is 1f1b", gpt2, with(func(l *Layout) { l.PP = 2; l.Schedule = "interleaved" }), Batch{Global: 8, Local: 8, Micro: 8}, "", ""},
		{"global batch", gpt2, with(func(l *Layout) { l.DP = 2 }), batch, "Global.global_batch_size", "set it to 16"},
		{"global batch with sharding", gpt2, with(func(l *Layout) { l.DP, l.Sharding = 2, 2 }), Batch{Global: 8, Local: 2, Micro: 1}, "", ""},
		{"micro-batch", gpt2, one, Batch{Global: 8, Local: 8, Micro: 3}, "Global.local_batch_size", "micro_batch_size (3)"},
		{"local batch derived", gpt2, with(func(l *Layout) { l.DP = 4 }), Batch{Global: 8, Local: 0, Micro: 2}, "", ""},
		{"replicas do not divide", gpt2, with(func(l *Layout) { l.DP = 3 }), Batch{Global: 8, Local: 0, Micro: 1}, "Global.global_batch_size", "does not divide into 3 replicas"},
		{"derived local and micro-batch", gpt2, with(func(l *Layout) { l.DP = 2 }), Batch{Global: 8, Local: 0, Micro: 3}, "Global.local_batch_size", "4 is not a multiple of micro_batch_size (3)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := Check(tt.m, tt.l, tt.b)
			switch {
			case tt.key == "" && p != nil:
				t.Errorf("refused: %v", p)
			case tt.key != "" && p == nil:
				t.Errorf("accepted; want a problem with %s", tt.key)
			case tt.key != "" && (p.Key != tt.key || !strings.Contains(p.Msg, tt.inMsg)):
				t.Errorf("got %v; want %s: …%s…", p, tt.key, tt.inMsg)
			}
		})
	}
}
