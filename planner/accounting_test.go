package planner

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/presets"
)

// TestParamAccounting ties every parameter count to the one accounting,
// arch's list of a part's tensors (arch.Shape.Tensors), for every preset
// (and an untied llama-tiny) under every layout of the table that the
// preset can take: one process, dp, mp 2, 4 and 16 (a Llama's key/value
// heads split, and replicated where mp exceeds them), pp 2 and 4, virtual
// stages, mp × pp, dp × mp × pp, sharding stages 1, 2 and 3, sequence
// parallelism and context parallelism (neither changes a rank's part; a
// ring's ranks share the writing of a save). For each it checks, exactly:
//
//   - arch: Params and ParamBound are the whole model's tensors;
//   - planner: every rank's stage count (stageParams) is arch's count of
//     that rank's part;
//   - engine: the parameter buffer every rank lays out
//     (engine.StartupMemory, from the layout, allocating nothing of the
//     model, so 13B costs nothing) is 4 bytes for each of them — under
//     stages 1 and 2 with the chunk of them the updated parameters are
//     all-gathered from, under stage 3 its resident shard and gather
//     buffers instead — and is the
//     planner's engine accounting of the rank's stage (engineMemory); a
//     save (engine.SaveMemory) writes each of the model's parameters, and
//     both its moments, exactly once over all ranks.
func TestParamAccounting(t *testing.T) {
	models := [][]string{}
	for _, name := range presets.Names() {
		models = append(models, []string{name})
	}
	models = append(models, []string{"llama-tiny", "Model.tie_word_embeddings=false"})
	layouts := []Strategy{
		{},
		{DP: 2},
		{MP: 2},
		{MP: 4},
		{MP: 16},
		{PP: 2},
		{PP: 4},
		{PP: 2, VPP: 2},
		{MP: 2, PP: 2},
		{DP: 2, MP: 2, PP: 2},
		{MP: 4, PP: 4},
		{ShardingDegree: 2, ShardingStage: 1},
		{ShardingDegree: 4, ShardingStage: 2},
		{ShardingDegree: 2, ShardingStage: 2, MP: 2},
		{ShardingDegree: 2, ShardingStage: 3},
		{ShardingDegree: 4, ShardingStage: 3, MP: 2},
		{ShardingDegree: 2, ShardingStage: 3, PP: 2},
		{MP: 2, SP: true},
		{MP: 4, PP: 2, SP: true},
		{CP: 2},
		{DP: 2, MP: 2, SP: true, CP: 2},
		{ShardingDegree: 2, ShardingStage: 3, CP: 2},
	}
	rows, byLayout, byModel := 0, map[string]int{}, map[string]int{}
	for _, mo := range models {
		model := strings.Join(mo, " ")
		for _, s := range layouts {
			s = s.normalize()
			const local = 8 // micro-batches of 1: a multiple of every pp here
			o := append(Overrides(s, local*s.Replicas()), mo[1:]...)
			cfg, err := presets.Load(mo[0], o)
			if err != nil {
				continue // a layout this model cannot take (presets says why)
			}
			rows++
			byLayout[s.String()]++
			byModel[model]++
			t.Run(model+"/"+s.String(), func(t *testing.T) { checkAccounting(t, cfg, s) })
		}
	}
	for _, s := range layouts {
		if s := s.normalize(); byLayout[s.String()] == 0 {
			t.Errorf("layout %s: no preset takes it; the table checks nothing there", s)
		}
	}
	for _, mo := range models {
		if model := strings.Join(mo, " "); byModel[model] < 5 {
			t.Errorf("%s: only %d layouts of the table checked", model, byModel[model])
		}
	}
	t.Logf("%d (model, layout) rows of %d × %d", rows, len(models), len(layouts))
}

// checkAccounting checks the counts of one (model, layout) row of
// TestParamAccounting.
func checkAccounting(t *testing.T, cfg *presets.Config, s Strategy) {
	m := ModelOf(cfg)
	var whole int64
	for _, ts := range m.Tensors(m.Whole()) {
		whole += ts.Size()
	}
	if m.Params() != whole || m.ParamBound() != float64(whole) {
		t.Errorf("arch: Params %d, ParamBound %.0f; its tensors hold %d", m.Params(), m.ParamBound(), whole)
	}
	world := s.Devices()
	var written int64
	for r := range world {
		// Ranks are numbered mp innermost, then cp, then sharding,
		// then the pipeline stage (engine/topology.go).
		st := r / (s.MP * s.CP * s.ShardingDegree) % s.PP
		part := m.Stage(s.MP, s.PP, st)
		want := m.PartParams(part)
		if got := stageParams(m, s, st); got != want {
			t.Errorf("rank %d: the planner counts %d parameters, arch %d", r, got, want)
		}
		em, err := engine.StartupMemory(cfg, r, world)
		if err != nil {
			t.Fatal(err)
		}
		if pm := engineMemory(m, s, st, false); em.Params != pm.Params {
			t.Errorf("rank %d: the engine holds %d bytes of parameters, the planner's engine accounting %d", r, em.Params, pm.Params)
		}
		gather := int64(0) // stages 1 and 2: the all-gather's chunk, 1/S of the part padded to a multiple of S
		if S := int64(s.ShardingDegree); S > 1 && s.ShardingStage != 3 {
			gather = (want + S - 1) / S
		}
		if s.ShardingStage != 3 && em.Params != 4*(want+gather) {
			t.Errorf("rank %d: the engine lays out %d bytes of parameters, arch counts %d parameters (%d bytes, and %d of the all-gather's chunk): %s",
				r, em.Params, want, 4*want, 4*gather, tensorSizes(m, part))
		}
		c, err := engine.SaveMemory(cfg, r, world)
		if err != nil {
			t.Fatal(err)
		}
		written += c.Write
	}
	if written != 12*whole {
		t.Errorf("a save writes %d bytes over the %d ranks; want 12 bytes (a parameter, two moments) for each of arch's %d parameters", written, world, whole)
	}
}

// tensorSizes lists arch's tensors of part with their sizes, for a
// failure's message.
func tensorSizes(m Model, part arch.Part) string {
	var b strings.Builder
	for _, ts := range m.Tensors(part) {
		fmt.Fprintf(&b, " %s%v=%d", ts.Name, ts.Shape, ts.Size())
	}
	return b.String()
}
