package presets

import (
	"reflect"
	"strings"
	"testing"

	"github.com/gptui/gptui/arch"
)

// TestLlamaDefaults: a Llama config left to its defaults gets Hugging
// Face LlamaConfig's (as many key/value heads as heads, rms_norm_eps
// 1e-6, rope_theta 10000, no rope scaling, untied), no dropout and Meta's
// intermediate size; its shape says so; and its YAML writes the Llama
// keys, where a GPT-2's has none of them: those a loaded checkpoint
// settles unset, their defaults in comments, and set once Settled.
func TestLlamaDefaults(t *testing.T) {
	c, err := Parse("min.yaml", []byte("Model:\n  family: llama\n  hidden_size: 768\n  num_layers: 2\n  num_attention_heads: 12\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Model{Family: "llama", VocabSize: 50257, HiddenSize: 768, NumLayers: 2, NumAttentionHeads: 12, FFNHiddenSize: 2048,
		MaxPositionEmbeddings: 1024, InitializerRange: 0.02, NumKeyValueHeads: 12, RMSNormEps: 1e-6, RopeTheta: 10000,
		RopeScaling: RopeScaling{RopeType: "default", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}}
	if !reflect.DeepEqual(c.Model, want) {
		t.Errorf("defaults %+v\nwant     %+v", c.Model, want)
	}
	s := c.Shape()
	if s.Family != arch.Llama || s.NKV != 12 || !s.Untied {
		t.Errorf("shape %+v: want a Llama with 12 key/value heads, untied", s)
	}
	out := string(c.YAML())
	const unset = ": # a loaded checkpoint's, else the default: "
	for _, k := range []string{"family: llama", "num_key_value_heads: 12", "rms_norm_eps" + unset + "1e-06", "rope_type" + unset + "default",
		"original_max_position_embeddings" + unset + "8192", "tie_word_embeddings: false"} {
		if !strings.Contains(out, k) {
			t.Errorf("the YAML lacks %q:\n%s", k, out)
		}
	}
	settled := string(c.Settled().YAML())
	for _, k := range []string{"rms_norm_eps: 1e-06", "rope_theta: 10000.0", "rope_type: default", "original_max_position_embeddings: 8192"} {
		if !strings.Contains(settled, k) {
			t.Errorf("the settled YAML lacks %q:\n%s", k, settled)
		}
	}
	if c.Settled().Defaulted("Model.rope_theta") || !c.Defaulted("Model.rope_theta") {
		t.Errorf("Defaulted(rope_theta): %v, settled %v; want true, false", c.Defaulted("Model.rope_theta"), c.Settled().Defaulted("Model.rope_theta"))
	}
	c2, err := Parse("again.yaml", []byte(out))
	if err != nil || !reflect.DeepEqual(c, c2) {
		t.Errorf("the YAML does not parse back to the config (%v):\n%s", err, out)
	}
	tiny, err := Load("tiny", nil)
	if err != nil {
		t.Fatal(err)
	}
	gpt2 := string(tiny.YAML())
	for _, k := range []string{"num_key_value_heads", "rms_norm_eps", "rope", "tie_word_embeddings"} {
		if strings.Contains(gpt2, k) {
			t.Errorf("a GPT-2 config writes %s:\n%s", k, gpt2)
		}
	}
	if !strings.Contains(gpt2, "family: gpt2") || tiny.Shape().Family != arch.GPT2 || !tiny.Shape().Tied() {
		t.Errorf("tiny is not a tied GPT-2: shape %+v\n%s", tiny.Shape(), gpt2)
	}
}

// TestLlamaErrors: each Llama key's bad value, and a Llama key given to a
// GPT-2, is a one-line error naming the key.
func TestLlamaErrors(t *testing.T) {
	llama := []string{"Model.family=llama", "Model.num_key_value_heads=2"}
	for _, tt := range []struct {
		name      string
		overrides []string
		key, msg  string
	}{
		{"unknown family", []string{"Model.family=gpt3"}, "Model.family", `set it to one of ["gpt2" "llama"]`},
		{"kv heads do not divide", append(llama, "Model.num_key_value_heads=3"), "Model.num_key_value_heads", "does not divide num_attention_heads (4)"},
		{"kv heads zero", append(llama, "Model.num_key_value_heads=0"), "Model.num_key_value_heads", "positive divisor"},
		{"odd head size", append(llama, "Model.hidden_size=12"), "Model.hidden_size", "even head size"},
		{"eps", append(llama, "Model.rms_norm_eps=0"), "Model.rms_norm_eps", "> 0"},
		{"theta", append(llama, "Model.rope_theta=-1"), "Model.rope_theta", "> 0"},
		{"rope type", append(llama, "Model.rope_scaling.rope_type=yarn"), "Model.rope_scaling.rope_type", "default (no scaling) or llama3"},
		{"rope factor", append(llama, "Model.rope_scaling.rope_type=llama3", "Model.rope_scaling.factor=0"), "Model.rope_scaling.factor", "> 0"},
		{"rope high below low", append(llama, "Model.rope_scaling.rope_type=llama3", "Model.rope_scaling.high_freq_factor=0.5"), "Model.rope_scaling.high_freq_factor", "above low_freq_factor 1"},
		{"rope positions", append(llama, "Model.rope_scaling.rope_type=llama3", "Model.rope_scaling.original_max_position_embeddings=0"), "Model.rope_scaling.original_max_position_embeddings", "positive"},
		{"mp and kv heads", append(llama, "Model.hidden_size=96", "Model.num_attention_heads=12", "Model.num_key_value_heads=4", "Distributed.mp_degree=6"),
			"Model.num_key_value_heads", "4 key/value heads and mp_degree 6"},
		{"gpt2 with kv heads", []string{"Model.num_key_value_heads=2"}, "Model.num_key_value_heads", "set Model.family to llama"},
		{"gpt2 untied", []string{"Model.tie_word_embeddings=false"}, "Model.tie_word_embeddings", "set Model.family to llama"},
		{"gpt2 with rms_norm_eps", []string{"Model.rms_norm_eps=1e-5"}, "Model.rms_norm_eps", "LayerNorm"},
		{"gpt2 with rope", []string{"Model.rope_theta=500000"}, "Model.rope_theta", "rotary"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load("tiny", tt.overrides)
			if err == nil {
				t.Fatal("Load succeeded")
			}
			e := asError(t, err)
			if e.Key != tt.key || !strings.Contains(e.Msg, tt.msg) || strings.Contains(err.Error(), "\n") {
				t.Errorf("got %v; want one line naming %s: …%s…", err, tt.key, tt.msg)
			}
		})
	}
	c, err := Load("llama-tiny", []string{"Model.rope_scaling.rope_type=llama3", "Distributed.mp_degree=4", "Model.vocab_size=512"})
	if err != nil {
		t.Fatalf("llama-tiny with rope scaling and a tensor degree above its key/value heads: %v", err)
	}
	if s := c.Shape(); s.NKV != 2 || s.Untied {
		t.Errorf("llama-tiny's shape %+v: want 2 key/value heads, tied", s)
	}
}
