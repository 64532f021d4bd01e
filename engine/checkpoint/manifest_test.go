package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// validManifest returns a manifest that passes ParseManifest: one tensor
// split by rows across two files, and a scalar.
func validManifest() Manifest {
	return Manifest{
		FormatVersion:   FormatVersion,
		Step:            7,
		ConsumedSamples: 56,
		Config:          "Global:\n  seed: 1\n",
		Data:            json.RawMessage(`{"epoch":0,"pos":56}`),
		RNG:             map[string]uint64{"seed": 1<<64 - 1},
		Tensors: []TensorInfo{
			{Name: "w", Dtype: "F32", Shape: []int{4, 6}, Slices: []Slice{
				{File: "rank_00000.safetensors", Start: []int{0, 0}, Shape: []int{2, 6}},
				{File: "rank_00001.safetensors", Start: []int{2, 0}, Shape: []int{2, 6}},
			}},
			{Name: "s", Dtype: "F32", Shape: []int{}, Slices: []Slice{
				{File: "rank_00000.safetensors", Start: []int{}, Shape: []int{}},
			}},
		},
		Files: map[string]string{
			"rank_00000.safetensors": strings.Repeat("ab", 32),
			"rank_00001.safetensors": strings.Repeat("cd", 32),
		},
	}
}

func TestParseManifest(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(m *Manifest)
		raw    string // used instead of the edited manifest when set
		errHas string // "" means valid
	}{
		{name: "valid", edit: func(*Manifest) {}},
		{name: "not JSON", raw: `{"format_version":1,`, errHas: "not a valid manifest"},
		{name: "no version", raw: `{"step":1}`, errHas: "no format_version"},
		{name: "version 0", edit: func(m *Manifest) { m.FormatVersion = 0 }, errHas: "invalid format version 0"},
		{name: "newer version", edit: func(m *Manifest) { m.FormatVersion = 3 },
			errHas: "format version 3 is newer than version 2"},
		{name: "newer version with unknown layout", raw: `{"format_version":9,"tensors":"elsewhere"}`,
			errHas: "format version 9 is newer than version 2"},
		{name: "version 1 unsealed", raw: `{"format_version":1,"step":0,"tensors":[],"files":{}}`},
		{name: "version 2 unsealed", raw: `{"format_version":2,"step":0,"tensors":[],"files":{}}`, errHas: "without its manifest_sha256 seal"},
		{name: "negative step", edit: func(m *Manifest) { m.Step = -1 }, errHas: "negative step"},
		{name: "negative samples", edit: func(m *Manifest) { m.ConsumedSamples = -1 }, errHas: "negative consumed_samples"},
		{name: "negative loss scale", edit: func(m *Manifest) { m.LossScale = -1 }, errHas: "invalid loss_scale"},
		{name: "run", edit: func(m *Manifest) { m.Run = NewRun() }},
		{name: "run not hex", edit: func(m *Manifest) { m.Run = "../x" }, errHas: `run "../x" is not a run identifier`},
		{name: "run too long", edit: func(m *Manifest) { m.Run = strings.Repeat("a", 65) }, errHas: "is not a run identifier"},
		{name: "unnamed tensor", edit: func(m *Manifest) { m.Tensors[1].Name = "" }, errHas: "tensor 1 has no name"},
		{name: "duplicate tensor", edit: func(m *Manifest) { m.Tensors[1].Name = "w" }, errHas: `tensor "w" appears twice`},
		{name: "dtype", edit: func(m *Manifest) { m.Tensors[0].Dtype = "BF16" }, errHas: `unsupported dtype "BF16"`},
		{name: "zero dimension", edit: func(m *Manifest) { m.Tensors[0].Shape = []int{4, 0} }, errHas: "dimension 0 is below 1"},
		{name: "huge tensor", edit: func(m *Manifest) { m.Tensors[0].Shape = []int{1 << 40, 1 << 40} }, errHas: "too many elements"},
		{name: "no slices", edit: func(m *Manifest) { m.Tensors[1].Slices = nil }, errHas: `tensor "s" has no slices`},
		{name: "unlisted file", edit: func(m *Manifest) { m.Tensors[0].Slices[1].File = "rank_00002.safetensors" },
			errHas: `file "rank_00002.safetensors" is not listed`},
		{name: "slice rank", edit: func(m *Manifest) { m.Tensors[0].Slices[0].Start = []int{0} }, errHas: "do not have the tensor's 2 dimensions"},
		{name: "slice outside", edit: func(m *Manifest) { m.Tensors[0].Slices[1].Start = []int{3, 0} }, errHas: "reaches outside"},
		{name: "slice negative start", edit: func(m *Manifest) { m.Tensors[0].Slices[0].Start = []int{-1, 0} }, errHas: "reaches outside"},
		{name: "slice empty", edit: func(m *Manifest) { m.Tensors[0].Slices[0].Shape = []int{0, 6} }, errHas: "dimension 0 is below 1"},
		{name: "overlap", edit: func(m *Manifest) { m.Tensors[0].Slices[1].Start = []int{1, 0} }, errHas: "slices 0 and 1 overlap"},
		{name: "hole", edit: func(m *Manifest) { m.Tensors[0].Slices[1].Shape = []int{1, 6} }, errHas: "slices hold 18 of its 24 elements"},
		{name: "shared entry", edit: func(m *Manifest) {
			m.Tensors[1].Slices[0].Key = "w"
		}, errHas: `entry "w" of "rank_00000.safetensors" already holds a block of "w"`},
		{name: "bad checksum", edit: func(m *Manifest) { m.Files["rank_00001.safetensors"] = "xyz" }, errHas: "is not a lowercase hex SHA-256"},
		{name: "upper-case checksum", edit: func(m *Manifest) { m.Files["rank_00001.safetensors"] = strings.Repeat("AB", 32) },
			errHas: "is not a lowercase hex SHA-256"},
		{name: "path in file name", edit: func(m *Manifest) { m.Files["../x"] = strings.Repeat("00", 32) }, errHas: "not a plain file name"},
		{name: "manifest as data", edit: func(m *Manifest) { m.Files[ManifestFile] = strings.Repeat("00", 32) },
			errHas: "the manifest is not a data file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := []byte(tt.raw)
			if tt.raw == "" {
				m := validManifest()
				tt.edit(&m)
				var err error
				if b, err = json.Marshal(m); err != nil {
					t.Fatal(err)
				}
				b = Seal(b)
			}
			m, err := ParseManifest("dir/manifest.json", b)
			if tt.errHas == "" {
				if err != nil {
					t.Fatalf("ParseManifest: %v", err)
				}
				if tt.raw == "" && (m.Step != 7 || m.RNG["seed"] != 1<<64-1 || string(m.Data) != `{"epoch":0,"pos":56}`) {
					t.Errorf("decoded %+v", m)
				}
				return
			}
			if err == nil {
				t.Fatalf("ParseManifest accepted it; want an error containing %q", tt.errHas)
			}
			var fe *FormatError
			if !errors.As(err, &fe) || fe.File != "dir/manifest.json" {
				t.Errorf("error %v (%T) is not a *FormatError naming dir/manifest.json", err, err)
			}
			if !strings.Contains(err.Error(), tt.errHas) {
				t.Errorf("error %q does not contain %q", err, tt.errHas)
			}
		})
	}
}

func FuzzParseManifest(f *testing.F) {
	good, err := json.Marshal(validManifest())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(Seal(good))
	f.Add([]byte(`{"format_version":1,"step":0,"tensors":[],"files":{}}`))
	f.Add([]byte(`{"format_version":2}`))
	f.Add([]byte(`{"format_version":1,"tensors":[{"name":"a","dtype":"F32","shape":[2,2],"slices":[` +
		`{"file":"f","start":[0,0],"shape":[1,2]},{"file":"f","key":"b","start":[1,0],"shape":[1,2]}]}],` +
		`"files":{"f":"` + strings.Repeat("0", 64) + `"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseManifest("m.json", b)
		if err != nil {
			var fe *FormatError
			if !errors.As(err, &fe) || fe.File != "m.json" {
				t.Fatalf("error %v (%T) is not a *FormatError naming the file", err, err)
			}
			return
		}
		// What was accepted must survive being written and read again.
		b2, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("re-encoding an accepted manifest: %v", err)
		}
		b2 = Seal(b2)
		m2, err := ParseManifest("m.json", b2)
		if err != nil {
			t.Fatalf("re-reading an accepted manifest: %v\n%s", err, b2)
		}
		b3, err := json.Marshal(m2)
		if err != nil {
			t.Fatal(err)
		}
		b3 = Seal(b3)
		if !bytes.Equal(b2, b3) {
			t.Fatalf("manifest changed on a round trip:\n%s\n%s", b2, b3)
		}
	})
}
