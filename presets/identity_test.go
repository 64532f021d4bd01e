package presets

import (
	"reflect"
	"strings"
	"testing"
)

// TestAdopt: a Llama config takes a checkpoint's rms_norm_eps, rope_theta
// and rope_scaling where it leaves them unset, refuses to where it sets
// one otherwise (naming both values, taking nothing), ignores the
// scaling's factors where the checkpoint has no scaling, and a GPT-2's
// takes nothing; what it took is written set by YAML.
func TestAdopt(t *testing.T) {
	llama3 := []string{"Model.family=llama", "Model.rms_norm_eps=1e-5", "Model.rope_theta=500000", "Model.rope_scaling.rope_type=llama3",
		"Model.rope_scaling.factor=32"}
	for _, tt := range []struct {
		name               string
		cfg, saved         []string
		adopted, conflicts []Adoption
		theta, eps, factor float64 // c's after
		ropeType           string
	}{
		{"unset: takes them", []string{"Model.family=llama"}, llama3,
			[]Adoption{{"Model.rms_norm_eps", "1e-06", "1e-05"}, {"Model.rope_theta", "10000.0", "500000.0"}, {"Model.rope_scaling.rope_type", "default", "llama3"},
				{"Model.rope_scaling.factor", "8.0", "32.0"}}, nil, 500000, 1e-5, 32, "llama3"},
		{"set otherwise: refused", []string{"Model.family=llama", "Model.rope_theta=10000", "Model.rms_norm_eps=1e-6"}, llama3,
			nil, []Adoption{{"Model.rms_norm_eps", "1e-06", "1e-05"}, {"Model.rope_theta", "10000.0", "500000.0"}}, 10000, 1e-6, 8, "default"},
		{"set alike: the rest taken", []string{"Model.family=llama", "Model.rope_theta=500000"}, llama3,
			[]Adoption{{"Model.rms_norm_eps", "1e-06", "1e-05"}, {"Model.rope_scaling.rope_type", "default", "llama3"}, {"Model.rope_scaling.factor", "8.0", "32.0"}},
			nil, 500000, 1e-5, 32, "llama3"},
		{"factors without scaling count for nothing", []string{"Model.family=llama", "Model.rope_scaling.factor=16"}, []string{"Model.family=llama"},
			nil, nil, 10000, 1e-6, 16, "default"},
		{"a factor set otherwise under scaling", []string{"Model.family=llama", "Model.rope_scaling.factor=16"}, llama3,
			nil, []Adoption{{"Model.rope_scaling.factor", "16.0", "32.0"}}, 10000, 1e-6, 16, "default"},
		{"GPT-2", nil, nil, nil, nil, 0, 0, 0, "default"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load("tiny", tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			saved, err := Load("tiny", tt.saved)
			if err != nil {
				t.Fatal(err)
			}
			before := string(c.YAML())
			adopted, conflicts := c.Adopt(saved)
			if !reflect.DeepEqual(adopted, tt.adopted) || !reflect.DeepEqual(conflicts, tt.conflicts) {
				t.Errorf("adopted %v, conflicts %v\nwant    %v, %v", adopted, conflicts, tt.adopted, tt.conflicts)
			}
			m := c.Model
			if m.RopeTheta != tt.theta || m.RMSNormEps != tt.eps || m.RopeScaling.Factor != tt.factor || m.RopeScaling.RopeType != tt.ropeType {
				t.Errorf("after: rope_theta %v rms_norm_eps %v factor %v rope_type %s; want %v %v %v %s",
					m.RopeTheta, m.RMSNormEps, m.RopeScaling.Factor, m.RopeScaling.RopeType, tt.theta, tt.eps, tt.factor, tt.ropeType)
			}
			after := string(c.YAML())
			if len(tt.adopted) == 0 && after != before {
				t.Errorf("nothing adopted, but the YAML changed:\n%s\nto\n%s", before, after)
			}
			for _, d := range tt.adopted {
				_, name, _ := strings.Cut(strings.TrimPrefix(d.Key, "Model."), ".")
				if name == "" {
					name = strings.TrimPrefix(d.Key, "Model.")
				}
				if c.Defaulted(d.Key) || !strings.Contains(after, name+": "+d.Checkpoint+"\n") {
					t.Errorf("%s taken, but still defaulted (%v) or not written %s:\n%s", d.Key, c.Defaulted(d.Key), d.Checkpoint, after)
				}
			}
			// The copy adoption started from keeps its defaults.
			if saved.Model.Llama() && tt.adopted != nil {
				c0, _ := Load("tiny", tt.cfg)
				c1 := *c0
				c1.Adopt(saved)
				if !c0.Defaulted("Model.rms_norm_eps") {
					t.Errorf("adopting into a copy changed the original's defaults")
				}
			}
		})
	}
}
