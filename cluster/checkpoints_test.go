package cluster

import (
	"slices"
	"strings"
	"testing"

	"github.com/gptui/gptui/engine/checkpoint"
)

// TestResumeAgreement: which checkpoints a resume may start from, newest
// first, and which nodes are refused, for what two nodes hold: the run of
// the newest checkpoint of all decides; an older step of that run counts
// whether or not the newest's node still holds it; a step the newest's
// node holds counts only as that very checkpoint.
func TestResumeAgreement(t *testing.T) {
	const runA, runB = "aaaa", "bbbb"
	rec := func(m, run string) checkpoint.Record { return checkpoint.Record{Manifest: m, Run: run} }
	sum := func(step int, m, run string, h map[int]checkpoint.Record) checkpoint.Summary {
		return checkpoint.Summary{Step: step, Manifest: m, Run: run, History: h}
	}
	tests := []struct {
		name    string
		sums    []checkpoint.Summary
		want    []candidate
		refused string // "" if none
	}{
		{"one holds the newest, the other missed it (keep_last 1)",
			[]checkpoint.Summary{
				sum(15, "m15", runA, map[int]checkpoint.Record{15: rec("m15", runA)}),
				sum(10, "m10", runA, map[int]checkpoint.Record{10: rec("m10", runA)}),
			},
			[]candidate{{15, "m15"}, {10, "m10"}}, ""},
		{"the newest damaged on one node: listed, not its newest",
			[]checkpoint.Summary{
				sum(5, "m5", runA, map[int]checkpoint.Record{5: rec("m5", runA), 10: rec("m10", runA)}),
				sum(10, "m10", runA, map[int]checkpoint.Record{5: rec("m5", runA), 10: rec("m10", runA)}),
			},
			[]candidate{{10, "m10"}, {5, "m5"}}, ""},
		{"none on one node",
			[]checkpoint.Summary{checkpoint.None(), sum(10, "m10", runA, map[int]checkpoint.Record{10: rec("m10", runA)})},
			[]candidate{{10, "m10"}}, ""},
		{"another run's older step",
			[]checkpoint.Summary{
				sum(10, "m10", runA, map[int]checkpoint.Record{10: rec("m10", runA)}),
				sum(5, "x5", runB, map[int]checkpoint.Record{5: rec("x5", runB)}),
			},
			[]candidate{{10, "m10"}}, "n2 would start from step 5 (not of this run: written by run bbbb, step 10 by run aaaa)"},
		{"the same step with another manifest",
			[]checkpoint.Summary{
				sum(10, "m10", runA, map[int]checkpoint.Record{5: rec("m5", runA), 10: rec("m10", runA)}),
				sum(5, "x5", runA, map[int]checkpoint.Record{5: rec("x5", runA)}),
			},
			[]candidate{{10, "m10"}, {5, "m5"}}, "n2 would start from step 5 (another checkpoint: manifest x5)"},
		{"no run recorded: only what the newest's node holds",
			[]checkpoint.Summary{
				sum(10, "m10", "", map[int]checkpoint.Record{5: rec("m5", ""), 10: rec("m10", "")}),
				sum(5, "m5", "", map[int]checkpoint.Record{3: rec("m3", ""), 5: rec("m5", "")}),
			},
			[]candidate{{10, "m10"}, {5, "m5"}}, ""},
		{"no run recorded, a step the newest's node lacks",
			[]checkpoint.Summary{
				sum(10, "m10", "", map[int]checkpoint.Record{10: rec("m10", "")}),
				sum(3, "m3", "", map[int]checkpoint.Record{3: rec("m3", "")}),
			},
			[]candidate{{10, "m10"}}, "n2 would start from step 3 (not of this run: n1 has no such checkpoint)"},
	}
	nodes := []*node{{name: "n1"}, {name: "n2"}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := newestOf(tt.sums)
			if got := resumeCandidates(tt.sums, src); !slices.Equal(got, tt.want) {
				t.Errorf("candidates %v, want %v", got, tt.want)
			}
			err := agreeCheckpoints(nodes, tt.sums, src, "output")
			switch {
			case tt.refused == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.refused != "" && (err == nil || !strings.Contains(err.Error(), tt.refused)):
				t.Errorf("agreement: %v, want a refusal with %q", err, tt.refused)
			}
		})
	}
}
