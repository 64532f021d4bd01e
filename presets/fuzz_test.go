package presets

import (
	"errors"
	"io/fs"
	"reflect"
	"testing"
)

// FuzzParse feeds arbitrary bytes to Parse. It must not panic, every error
// must be an *Error, and every config it accepts must validate and survive
// a YAML round trip unchanged.
func FuzzParse(f *testing.F) {
	entries, err := fs.ReadDir(configFS, "configs")
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range entries {
		data, err := configFS.ReadFile("configs/" + e.Name())
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		"",
		"_base_: tiny\nModel:\n  hiden_size: 3\n",
		"_base_: 1.3b-dp8\nOptimizer:\n  grad_clip: 0.5\n  adam_beta1: 0.8\n",
		"_base_: tiny\nData:\n  Train:\n    dataset: &d\n      split: '1,2,3'\n  Eval:\n    dataset: *d\n",
		"_base_: tiny\nEngine: {mix_precision: {dtype: float16}}\n",
		"Model: [\n",
		"a\n---\nb\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("fuzz.yaml", data)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %q (%T) is not an *Error", err, err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse returned a config that fails Validate: %v", err)
		}
		out := c.YAML()
		c2, err := Parse("resolved.yaml", out)
		if err != nil {
			t.Fatalf("YAML of an accepted config does not parse: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(c, c2) {
			t.Fatalf("YAML round trip changed the config:\n%s\n%s", out, c2.YAML())
		}
	})
}
