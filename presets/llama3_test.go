package presets

import (
	"testing"

	"github.com/gptui/gptui/arch"
)

// TestLlama3Presets: llama-1b and llama-8b-4node are Llama 3.2 1B's and
// Llama 3 8B's shapes — their exact parameter counts (arch.Shape.Params,
// as the engine lays the tensors out) are Meta's published 1,235,814,400
// and 8,030,261,248 — with the family's settings: 8 key/value heads,
// rope_theta 500000, the 1B tied with Llama 3.1's rope scaling (factor
// 32, frequency factors 1 and 4, 8192 original positions), the 8B untied
// without scaling.
func TestLlama3Presets(t *testing.T) {
	for _, tc := range []struct {
		name    string
		params  int64
		untied  bool
		scaling RopeScaling
	}{
		{"llama-1b", 1_235_814_400, false, RopeScaling{RopeType: "llama3", Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}},
		{"llama-8b-4node", 8_030_261_248, true, RopeScaling{RopeType: "default", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(tc.name, nil)
			if err != nil {
				t.Fatal(err)
			}
			s, m := c.Shape(), c.Model
			if got := s.Params(); got != tc.params {
				t.Errorf("%d parameters, want the published %d", got, tc.params)
			}
			if s.Family != arch.Llama || s.KVHeads() != 8 || s.Untied != tc.untied || s.V != 128256 || s.Vp != 128256 {
				t.Errorf("shape %+v: want a Llama with 8 key/value heads, untied %v, vocabulary 128256 unpadded", s, tc.untied)
			}
			if m.RopeTheta != 500000 || m.RMSNormEps != 1e-5 || m.RopeScaling != tc.scaling {
				t.Errorf("rope_theta %v rms_norm_eps %v rope_scaling %+v; want 500000, 1e-5 and %+v", m.RopeTheta, m.RMSNormEps, m.RopeScaling, tc.scaling)
			}
			if m.HiddenDropoutProb != 0 || m.AttentionProbsDropoutProb != 0 {
				t.Errorf("dropout %v and %v; a Llama has none", m.HiddenDropoutProb, m.AttentionProbsDropoutProb)
			}
		})
	}
}

// TestLargeVocabularyPresets: a preset whose vocabulary is beyond 16-bit
// tokens names a tokenizer.json (Data.tokenizer: GPT-2's cannot make its
// tokens) and token shards (input_dir: the built-in corpus is 16-bit).
func TestLargeVocabularyPresets(t *testing.T) {
	large := 0
	for _, name := range Names() {
		c, err := Load(name, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.Model.VocabSize <= 1<<16 {
			continue
		}
		large++
		if c.Data.Tokenizer == "" || c.Data.Train.Dataset.InputDir == "" {
			t.Errorf("%s: vocabulary %d with Data.tokenizer %q and input_dir %q; want both set", name, c.Model.VocabSize, c.Data.Tokenizer, c.Data.Train.Dataset.InputDir)
		}
	}
	if large < 2 {
		t.Errorf("%d presets with a vocabulary beyond 65536; want the two Llama 3 ones", large)
	}
}
