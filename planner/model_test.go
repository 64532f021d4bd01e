package planner

import (
	"testing"
)

// TestModelCounts: the planner's per-rank counts agree with the model's
// own (package arch). For GPT-2 and Llama presets, one block on one rank
// is arch's block (layerParamsTP(1) = LayerParams), the stages of a
// pipeline hold the whole model (plus the tied embedding's copy on the
// last stage), and the GEMM work the step time prices per token — 6 ×
// (the blocks' matrices and the head) — is arch's FLOPsPerToken less its
// attention term and the norms (which no multiply touches). Under tensor
// parallelism the ranks' matrices add up to the block's, but for a
// Llama's key/value heads replicated when mp exceeds them: each of the
// mp − NKV extra copies is 2·hd·C more.
func TestModelCounts(t *testing.T) {
	for _, preset := range []string{"gpt2-124m", "13b-4node", "llama-tiny", "llama-1b", "llama-8b-4node"} {
		t.Run(preset, func(t *testing.T) {
			m := ModelOf(mustLoad(t, preset))
			C, L := int64(m.C), int64(m.L)
			if got, want := m.layerParamsTP(1), m.LayerParams(); got != want {
				t.Errorf("a block: %d parameters, arch counts %d", got, want)
			}
			for _, pp := range []int{1, 2, 4} {
				if m.L%pp != 0 {
					continue
				}
				s := Strategy{PP: pp}.normalize()
				var sum int64
				for st := range pp {
					sum += stageParams(m, s, st)
				}
				want := m.Params()
				if pp > 1 && m.Tied() {
					want += int64(m.Vp) * C // the last stage's copy of the tied embedding
				}
				if sum != want {
					t.Errorf("pp %d: the stages hold %d parameters, want %d", pp, sum, want)
				}
			}
			finalNorm := 2 * C // GPT-2's LayerNorm; a Llama's RMSNorm has no bias
			if m.llama() {
				finalNorm = C
			}
			gemm := 6 * float64(L*m.layerMatmulTP(1)+int64(m.V)*C)
			attention := 6 * float64(L) * float64(C) * float64(m.SeqLen)
			rest := m.FLOPsPerToken(m.SeqLen) - attention - gemm
			if want := 6 * float64(L*(m.layerParamsTP(1)-m.layerMatmulTP(1))+finalNorm); rest != want {
				t.Errorf("FLOPs per token %.6g: GEMMs %.6g and attention %.6g leave %.6g, want 6 × the norms' and biases' parameters, %.6g",
					m.FLOPsPerToken(m.SeqLen), gemm, attention, rest, want)
			}
			for _, tp := range []int{1, 2, 4, 8, 16} {
				if m.NH%tp != 0 || (m.llama() && m.KVHeads()%tp != 0 && tp%m.KVHeads() != 0) {
					continue
				}
				extra := int64(0)
				if m.llama() && tp > m.KVHeads() {
					extra = 2 * int64(m.C/m.NH) * C * int64(tp-m.KVHeads())
				}
				if got, want := int64(tp)*m.layerMatmulTP(tp), m.layerMatmulTP(1)+extra; got != want {
					t.Errorf("mp %d: the ranks' matrices of a block add up to %d, want %d", tp, got, want)
				}
			}
		})
	}
}
