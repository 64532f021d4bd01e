package presets

import (
	"strings"
	"testing"
)

// TestDeriveBatch: overrides that change the ranks sharing the global batch
// re-derive the local batch (and the micro-batch, when it no longer
// divides it) that the preset fixed, and say so; anything else is left to
// validation as before.
func TestDeriveBatch(t *testing.T) {
	for _, tt := range []struct {
		name                 string
		preset               string
		overrides            []string
		global, local, micro int
		note                 string // a part of the note; "" for none
		err                  string // a part of the error; "" for none
	}{
		{"preset as it is", "tiny", nil, 8, 8, 8, "", ""},
		{"dp2", "tiny", []string{"Distributed.dp_degree=2"}, 8, 4, 4, "local_batch_size 4 derived from global_batch_size 8 ÷ (dp_degree 2 × sharding_degree 1)", ""},
		{"sharding4", "tiny", []string{"Distributed.sharding.sharding_degree=4"}, 8, 2, 2, "÷ (dp_degree 1 × sharding_degree 4)", ""},
		{"alias", "tiny", []string{"Distributed.data_parallel=2"}, 8, 4, 4, "dp_degree 2", ""},
		{"micro kept where it divides", "gpt2-124m", []string{"Distributed.dp_degree=2"}, 8, 4, 4, "local_batch_size 4", ""},
		{"micro lowered", "gpt2-124m", []string{"Distributed.dp_degree=4"}, 8, 2, 2, "micro_batch_size 4 → 2", ""},
		{"global overridden", "tiny", []string{"Global.global_batch_size=16", "Distributed.dp_degree=4"}, 16, 4, 4, "global_batch_size 16", ""},
		{"local given", "tiny", []string{"Distributed.dp_degree=2", "Global.local_batch_size=8"}, 0, 0, 0, "", "set it to 16"},
		{"does not divide", "tiny", []string{"Distributed.dp_degree=3"}, 0, 0, 0, "", "dp_degree (3)"},
		{"micro given and not dividing", "tiny", []string{"Distributed.dp_degree=2", "Global.micro_batch_size=8"}, 0, 0, 0, "", "micro_batch_size"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(tt.preset, tt.overrides)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if g := c.Global; g.GlobalBatchSize != tt.global || g.LocalBatchSize != tt.local || g.MicroBatchSize != tt.micro {
				t.Errorf("batches %d/%d/%d, want %d/%d/%d", g.GlobalBatchSize, g.LocalBatchSize, g.MicroBatchSize, tt.global, tt.local, tt.micro)
			}
			notes := strings.Join(c.Notes, "\n")
			if tt.note == "" && notes != "" || !strings.Contains(notes, tt.note) {
				t.Errorf("notes %q, want %q", notes, tt.note)
			}
			if tt.note != "" && !strings.HasPrefix(string(c.YAML()), "# Global.local_batch_size ") {
				t.Errorf("the emitted config does not start with the note:\n%s", c.YAML())
			}
		})
	}
}
