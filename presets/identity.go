package presets

import "maps"

// The keys of what a Llama computes beyond its shape — RMSNorm's epsilon,
// the rotary frequencies and their scaling — are part of a checkpoint's
// identity: a run that loads one (Model.init_from, or a resume) computes
// with the checkpoint's values. A config may leave them unset: it then
// takes the checkpoint's ([Config.Adopt]), and only where it loads none
// their defaults. One that sets a key to another value than the
// checkpoint's is refused. (The shape's keys, tying and the heads
// included, must equal the checkpoint's whether set or not: they size
// the tensors.)

// checkpointKeys are those keys, in the schema's order; the scaling's
// factors count only where its rope_type is llama3.
var checkpointKeys = []string{
	"Model.rms_norm_eps", "Model.rope_theta", "Model.rope_scaling.rope_type",
	"Model.rope_scaling.factor", "Model.rope_scaling.low_freq_factor", "Model.rope_scaling.high_freq_factor",
	"Model.rope_scaling.original_max_position_embeddings",
}

// scalingFactors is how many of checkpointKeys, at their end, are the
// scaling's factors.
const scalingFactors = 4

// Defaulted reports whether key, one of the keys a loaded checkpoint
// settles (rms_norm_eps, rope_theta, rope_scaling.*), was left unset in
// a Llama's config: it holds its default, which a checkpoint's value
// replaces ([Config.Adopt]). YAML writes such a key unset, so that the
// config it writes (a job's config.yaml) leaves it to the checkpoint too.
func (c *Config) Defaulted(key string) bool { return c.defaulted[key] }

// An Adoption is one of the keys a checkpoint settles whose value a
// config and the checkpoint's config differ on: the value of each, as
// YAML writes it.
type Adoption struct {
	Key, Config, Checkpoint string
}

// Adopt takes, into c, the values of the keys a checkpoint settles
// (rms_norm_eps, rope_theta, rope_scaling: what a Llama computes besides
// its shape) from saved, the config of a checkpoint c's run loads, where
// c leaves them unset and they differ; it returns those it took. Where c
// sets one to another value, it takes none and returns those in
// conflict instead. It does nothing for a GPT-2 (or where the families
// differ: a difference of shape).
func (c *Config) Adopt(saved *Config) (adopted, conflicts []Adoption) {
	if !c.Model.Llama() || !saved.Model.Llama() {
		return nil, nil
	}
	keys := checkpointKeys
	if saved.Model.RopeScaling.RopeType != "llama3" {
		keys = keys[:len(keys)-scalingFactors] // the factors compute nothing
	}
	refs := fieldRefs()
	for _, k := range keys {
		mine, theirs := valueNode(refs[k](c)).Value, valueNode(refs[k](saved)).Value
		if mine == theirs {
			continue
		}
		d := Adoption{Key: k, Config: mine, Checkpoint: theirs}
		if c.defaulted[k] {
			adopted = append(adopted, d)
		} else {
			conflicts = append(conflicts, d)
		}
	}
	if len(conflicts) > 0 {
		return nil, conflicts
	}
	if len(adopted) == 0 {
		return nil, nil
	}
	defaulted := maps.Clone(c.defaulted) // shared with the copies of c
	for _, d := range adopted {
		copyValue(refs[d.Key](c), refs[d.Key](saved))
		delete(defaulted, d.Key)
	}
	c.defaulted = defaulted
	return adopted, nil
}

// Settled returns a copy of c whose keys a checkpoint settles are all
// set, at the values c computes with: the config a checkpoint records,
// which says what its model computes whatever the defaults.
func (c *Config) Settled() *Config {
	s := *c
	s.defaulted = nil
	return &s
}

// fieldRefs maps the schema's keys to their storage.
func fieldRefs() map[string]func(*Config) any {
	fs := fields()
	m := make(map[string]func(*Config) any, len(fs))
	for _, f := range fs {
		m[f.path] = f.ref
	}
	return m
}

// copyValue sets *dst to *src, both pointers a field's ref returns, of
// the same type.
func copyValue(dst, src any) {
	switch d := dst.(type) {
	case *int:
		*d = *src.(*int)
	case *int64:
		*d = *src.(*int64)
	case *float64:
		*d = *src.(*float64)
	case *bool:
		*d = *src.(*bool)
	case *string:
		*d = *src.(*string)
	case *[3]float64:
		*d = *src.(*[3]float64)
	}
}

// defaultedKeys returns the keys a checkpoint settles that c, a Llama's
// config, leaves unset, or nil.
func defaultedKeys(c *Config, unset func(string) bool) map[string]bool {
	if !c.Model.Llama() {
		return nil
	}
	var m map[string]bool
	for _, k := range checkpointKeys {
		if unset(k) {
			if m == nil {
				m = map[string]bool{}
			}
			m[k] = true
		}
	}
	return m
}
