package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gptui/gptui/engine/safetensors"
)

// specials are float32 values whose bits a round trip must keep.
var specials = []float32{0, float32(math.Copysign(0, -1)), 1, -2.5, math.MaxFloat32, math.SmallestNonzeroFloat32,
	float32(math.Inf(1)), float32(math.Inf(-1)), math.Float32frombits(0x7fc00001), math.Float32frombits(0xffbfffff)}

func sameBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

// count is the element count of shape.
func count(shape []int) int64 {
	n, _ := safetensors.Elements(shape, 0)
	return n
}

// blockOffset returns where element i of the block start/ext, counted
// row-major, lies in the row-major array of shape outer that holds it.
func blockOffset(i int64, start, ext, outer []int) int64 {
	var off, stride int64 = 0, 1
	for d := len(ext) - 1; d >= 0; d-- {
		off += (i%int64(ext[d]) + int64(start[d])) * stride
		i /= int64(ext[d])
		stride *= int64(outer[d])
	}
	return off
}

// readAll reads the whole of the named tensor of c with Read and returns
// it with its global shape.
func readAll(c *Checkpoint, name string) ([]float32, []int, error) {
	t, ok := c.Tensor(name)
	if !ok {
		return nil, nil, fmt.Errorf("no tensor %q", name)
	}
	dst := make([]float32, count(t.Shape))
	if err := c.Read(name, make([]int, len(t.Shape)), t.Shape, dst); err != nil {
		return nil, nil, err
	}
	return dst, slices.Clone(t.Shape), nil
}

// wholeParts returns the parts of a single writer holding every tensor
// whole, with values that depend on seed.
func wholeParts(seed int) []Part {
	shapes := []struct {
		name  string
		shape []int
	}{
		{"params/wte", []int{16, 8}},
		{"params/qkvw", []int{2, 24, 8}},
		{"params/lnfb", []int{8}},
		{"adam/step_scale", []int{}},
	}
	parts := make([]Part, len(shapes))
	for i, s := range shapes {
		n := count(s.shape)
		data := make([]float32, n)
		for j := range data {
			data[j] = float32(seed*100000+i*1000+j) * 0.125
		}
		parts[i] = Part{Name: s.name, GlobalShape: s.shape, Start: make([]int, len(s.shape)), Shape: s.shape, Data: data}
	}
	parts[0].Data[0] = specials[1] // -0
	parts[0].Data[1] = specials[8] // NaN with a payload
	parts[0].Data[2] = specials[6] // +Inf
	parts[0].Data[3] = specials[5] // smallest subnormal
	parts[0].Data[4] = specials[9] // negative NaN
	parts[0].Data[5] = specials[4] // largest finite
	parts[0].Data[6] = specials[7] // -Inf
	parts[0].Data[7] = specials[3] // -2.5
	parts[0].Data[8] = specials[2] // 1
	parts[0].Data[9] = specials[0] // +0
	parts[1].Data[0] = -parts[1].Data[0]
	return parts
}

func testManifest(step int) Manifest {
	return Manifest{
		Step:            step,
		ConsumedSamples: int64(step) * 8,
		Config:          "Global:\n  global_batch_size: 8\n",
		Data:            json.RawMessage(`{"epoch":1,"position":40,"seed":1234}`),
		RNG:             map[string]uint64{"dropout.hi": 1<<64 - 1, "dropout.lo": 3},
		LossScale:       32768,
		Extra:           map[string]json.RawMessage{"note": json.RawMessage(`"hello"`)},
	}
}

// mustSave saves a checkpoint of step with wholeParts(step).
func mustSave(t *testing.T, out string, step, keepLast int) string {
	t.Helper()
	dir, err := Save(out, testManifest(step), wholeParts(step), keepLast)
	if err != nil {
		t.Fatalf("Save step %d: %v", step, err)
	}
	return dir
}

// checkParts fails unless c holds exactly parts, bit for bit.
func checkParts(t *testing.T, c *Checkpoint, parts []Part) {
	t.Helper()
	if len(c.Manifest.Tensors) != len(parts) {
		t.Errorf("checkpoint has %d tensors, want %d", len(c.Manifest.Tensors), len(parts))
	}
	for i, p := range parts {
		if c.Manifest.Tensors[i].Name != p.Name {
			t.Errorf("tensor %d is %q, want %q", i, c.Manifest.Tensors[i].Name, p.Name)
		}
		got, shape, err := readAll(c, p.Name)
		if err != nil {
			t.Fatalf("readAll(%q): %v", p.Name, err)
		}
		if !slices.Equal(shape, p.GlobalShape) || !sameBits(got, p.Data) {
			t.Errorf("readAll(%q) = %v %v…, want %v %v…", p.Name, shape, got[:min(len(got), 12)], p.GlobalShape, p.Data[:min(len(p.Data), 12)])
		}
	}
}

// dirEntries lists dir, with the random suffix of .tmp- names replaced by *.
func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		n := de.Name()
		if strings.HasPrefix(n, tmpPrefix) {
			n = n[:strings.LastIndex(n, "-")+1] + "*"
		}
		names = append(names, n)
	}
	return names
}

func TestSaveLoadRoundTrip(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out") // created by Save
	dir := mustSave(t, out, 200, 0)
	if want := filepath.Join(out, "step_00000200"); dir != want {
		t.Errorf("Save returned %q, want %q", dir, want)
	}
	if got := dirEntries(t, out); !slices.Equal(got, []string{"latest", "step_00000200"}) {
		t.Errorf("output dir holds %v", got)
	}
	if got := dirEntries(t, dir); !slices.Equal(got, []string{"manifest.json", "rank_00000.safetensors"}) {
		t.Errorf("checkpoint dir holds %v", got)
	}
	if b, err := os.ReadFile(filepath.Join(out, "latest")); err != nil || string(b) != "step_00000200\n" {
		t.Errorf("latest = %q, %v", b, err)
	}

	c, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, want := c.Manifest, testManifest(200)
	if m.FormatVersion != FormatVersion || m.Step != 200 || m.ConsumedSamples != want.ConsumedSamples ||
		m.Config != want.Config || m.LossScale != want.LossScale || m.RNG["dropout.hi"] != 1<<64-1 || m.RNG["dropout.lo"] != 3 {
		t.Errorf("manifest %+v", m)
	}
	var pos struct{ Epoch, Position, Seed int }
	if err := json.Unmarshal(m.Data, &pos); err != nil || pos.Position != 40 || pos.Seed != 1234 {
		t.Errorf("data state %s: %+v %v", m.Data, pos, err)
	}
	if string(m.Extra["note"]) != `"hello"` {
		t.Errorf("extra %v", m.Extra)
	}
	if len(m.Files) != 1 || len(m.Files["rank_00000.safetensors"]) != 64 {
		t.Errorf("files %v", m.Files)
	}
	checkParts(t, c, wholeParts(200))

	// A checkpoint is also a set of ordinary safetensors files.
	raw, err := os.ReadFile(filepath.Join(dir, "rank_00000.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := safetensors.Parse("rank_00000.safetensors", bytes.NewReader(raw), int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	e, _ := st.Tensor("params/lnfb")
	got := make([]float32, count(e.Shape))
	if err := st.Read(bytes.NewReader(raw), e, got); err != nil || !sameBits(got, wholeParts(200)[2].Data) {
		t.Errorf("params/lnfb read directly: %v, %v", got, err)
	}
}

func TestSaveDeterministic(t *testing.T) {
	var files [2][]byte
	for i := range files {
		dir := mustSave(t, t.TempDir(), 3, 0)
		b, err := os.ReadFile(filepath.Join(dir, "rank_00000.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		m, err := os.ReadFile(filepath.Join(dir, ManifestFile))
		if err != nil {
			t.Fatal(err)
		}
		files[i] = append(b, m...)
	}
	if string(files[0]) != string(files[1]) {
		t.Error("saving the same state twice wrote different bytes")
	}
}

func TestSaveErrors(t *testing.T) {
	good := func() []Part { return wholeParts(1) }
	tests := []struct {
		name   string
		m      Manifest
		parts  func() []Part
		errHas string
	}{
		{"negative step", Manifest{Step: -1}, good, "negative step"},
		{"no name", Manifest{}, func() []Part { p := good(); p[1].Name = ""; return p }, "part 1 has no name"},
		{"short data", Manifest{}, func() []Part { p := good(); p[0].Data = p[0].Data[1:]; return p }, "needs 128 values, have 127"},
		{"rank mismatch", Manifest{}, func() []Part { p := good(); p[0].Start = []int{0}; return p }, "do not match global shape"},
		{"duplicate", Manifest{}, func() []Part { p := good(); return append(p, p[2]) }, `two blocks named "params/lnfb@0"`},
		{"overlap", Manifest{}, func() []Part {
			p := good()
			q := p[0]
			q.Start, q.Shape, q.Data = []int{8, 0}, []int{2, 8}, q.Data[:16]
			return append(p, q)
		}, `tensor "params/wte": slices 0 and 1 overlap`},
		{"incomplete", Manifest{}, func() []Part {
			p := good()
			p[0].Shape = []int{8, 8}
			p[0].Data = p[0].Data[:64]
			return p
		}, `tensor "params/wte": slices hold 64 of its 128 elements`},
		{"global shapes disagree", Manifest{}, func() []Part {
			p := good()
			q := p[2]
			q.GlobalShape = []int{9}
			return append(p, q)
		}, "disagree on the global shape"},
		{"bad data state", Manifest{Data: json.RawMessage(`{`)}, good, "encoding the manifest"},
		{"NaN loss scale", Manifest{LossScale: math.NaN()}, good, "invalid loss_scale"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := t.TempDir()
			_, err := Save(out, tt.m, tt.parts(), 0)
			if err == nil || !strings.Contains(err.Error(), tt.errHas) {
				t.Fatalf("Save error %v, want one containing %q", err, tt.errHas)
			}
			if got := dirEntries(t, out); len(got) != 0 {
				t.Errorf("a failed save left %v", got)
			}
		})
	}
}

// writeTwoRanks writes, as two ranks of a parallel run would, a checkpoint
// of step whose tensors are split between rank_00000 and rank_00001, and
// returns the global tensors it holds.
func writeTwoRanks(t *testing.T, out string, step int) map[string]Part {
	t.Helper()
	global := map[string]Part{}
	for _, g := range []struct {
		name  string
		shape []int
	}{{"w", []int{6, 10}}, {"q", []int{4, 6, 8}}, {"b", []int{7}}, {"s", []int{}}} {
		n := count(g.shape)
		data := make([]float32, n)
		for i := range data {
			data[i] = float32(len(g.name)*1000+i) + 0.5
		}
		global[g.name] = Part{Name: g.name, GlobalShape: g.shape, Data: data}
	}
	// block cuts the block start/shape out of a global tensor.
	block := func(name string, start, shape []int) Part {
		g := global[name]
		p := Part{Name: name, GlobalShape: g.GlobalShape, Start: start, Shape: shape, Data: make([]float32, count(shape))}
		for i := range p.Data {
			p.Data[i] = g.Data[blockOffset(int64(i), start, shape, g.GlobalShape)]
		}
		return p
	}
	ranks := [][]Part{
		{ // rank 0: rows 0-2 of w and the left of rows 3-5, the first half of q's rows, the start of b
			block("w", []int{0, 0}, []int{3, 10}),
			block("q", []int{0, 0, 0}, []int{4, 3, 8}),
			block("w", []int{3, 0}, []int{3, 4}),
			block("b", []int{0}, []int{3}),
			block("s", []int{}, []int{}),
		},
		{ // rank 1: the rest
			block("w", []int{3, 4}, []int{3, 6}),
			block("b", []int{3}, []int{4}),
			block("q", []int{0, 3, 0}, []int{4, 3, 8}),
		},
	}
	if err := os.MkdirAll(out, 0o777); err != nil {
		t.Fatal(err)
	}
	tmp, err := makeTempDir(out, DirName(step))
	if err != nil {
		t.Fatal(err)
	}
	var shards []shardInfo
	for rank, parts := range ranks {
		entries, err := planShard(rank, parts)
		if err != nil {
			t.Fatal(err)
		}
		sh, err := writeShard(tmp, rank, parts, entries, saveOptions{})
		if err != nil {
			t.Fatal(err)
		}
		shards = append(shards, sh)
	}
	if _, err := commit(out, tmp, testManifest(step), shards, saveOptions{}); err != nil {
		t.Fatal(err)
	}
	return global
}

func TestReadAcrossSlices(t *testing.T) {
	out := t.TempDir()
	global := writeTwoRanks(t, out, 5)
	c, err := Load(filepath.Join(out, DirName(5)))
	if err != nil {
		t.Fatal(err)
	}
	w, _ := c.Tensor("w")
	if len(w.Slices) != 3 || w.Slices[0].Key != "w@0,0" || w.Slices[1].Key != "w@3,0" || w.Slices[2].Key != "" ||
		w.Slices[2].File != "rank_00001.safetensors" {
		t.Errorf("slices of w: %+v", w.Slices)
	}
	// Every block of every tensor, read from whichever slices hold it.
	for name, g := range global {
		shape := g.GlobalShape
		reads := 0
		forEachBlock(shape, func(start, ext []int) {
			reads++
			dst := make([]float32, count(ext))
			if err := c.Read(name, start, ext, dst); err != nil {
				t.Fatalf("Read(%q, %v, %v): %v", name, start, ext, err)
			}
			for i := range dst {
				off := blockOffset(int64(i), start, ext, shape)
				if math.Float32bits(dst[i]) != math.Float32bits(g.Data[off]) {
					t.Fatalf("Read(%q, %v, %v)[%d] = %v, want %v", name, start, ext, i, dst[i], g.Data[off])
				}
			}
		})
		if reads < 2 && len(shape) > 0 {
			t.Errorf("%s: only %d blocks read", name, reads)
		}
		got, gotShape, err := readAll(c, name)
		if err != nil || !sameBits(got, g.Data) || !slices.Equal(gotShape, shape) {
			t.Errorf("readAll(%q) = %v %v, %v", name, gotShape, got, err)
		}
	}
}

// forEachBlock calls f with every block (start, extent) of shape whose
// extents are all at least 1.
func forEachBlock(shape []int, f func(start, ext []int)) {
	n := len(shape)
	start, ext := make([]int, n), make([]int, n)
	var rec func(d int)
	rec = func(d int) {
		if d == n {
			f(start, ext)
			return
		}
		for s := 0; s < shape[d]; s++ {
			for e := 1; s+e <= shape[d]; e++ {
				start[d], ext[d] = s, e
				rec(d + 1)
			}
		}
	}
	rec(0)
}

func TestReadErrors(t *testing.T) {
	out := t.TempDir()
	c, err := Load(mustSave(t, out, 1, 0))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		tensor string
		start  []int
		shape  []int
		dstLen int
		errHas string
	}{
		{"unknown tensor", "nope", []int{0}, []int{1}, 1, `no tensor "nope"`},
		{"rank", "params/wte", []int{0}, []int{1}, 1, "has 2 dimensions"},
		{"outside", "params/wte", []int{15, 0}, []int{2, 8}, 16, "reaches outside"},
		{"negative start", "params/wte", []int{-1, 0}, []int{1, 8}, 8, "reaches outside"},
		{"negative extent", "params/wte", []int{1, 0}, []int{-1, 8}, 0, "dimension -1 is below 0"},
		{"dst size", "params/wte", []int{0, 0}, []int{2, 8}, 15, "needs 16 values, dst has 15"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := c.Read(tt.tensor, tt.start, tt.shape, make([]float32, tt.dstLen))
			if err == nil || !strings.Contains(err.Error(), tt.errHas) {
				t.Errorf("Read error %v, want one containing %q", err, tt.errHas)
			}
		})
	}
	if err := c.Read("params/wte", []int{3, 2}, []int{0, 5}, nil); err != nil {
		t.Errorf("reading an empty block: %v", err)
	}
}

// damage functions change a saved checkpoint directory.
func flipByte(t *testing.T, path string, at func(size int) int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[at(len(b))] ^= 0x01
	if err := os.WriteFile(path, b, 0o666); err != nil {
		t.Fatal(err)
	}
}

func editManifest(t *testing.T, dir string, edit func(m map[string]any)) {
	t.Helper()
	path := filepath.Join(dir, ManifestFile)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // keep uint64 RNG states exact
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, Seal(b), 0o666); err != nil {
		t.Fatal(err)
	}
}

func TestLoadDamaged(t *testing.T) {
	const rank0 = "rank_00000.safetensors"
	tests := []struct {
		name     string
		damage   func(t *testing.T, dir string)
		errFile  string // base name of the file the error must name
		errHas   string
		notExist bool // errors.Is(err, fs.ErrNotExist)
	}{
		{"altered data byte", func(t *testing.T, dir string) {
			flipByte(t, filepath.Join(dir, rank0), func(n int) int { return n - 100 })
		}, rank0, "truncated or altered", false},
		{"altered header byte", func(t *testing.T, dir string) {
			flipByte(t, filepath.Join(dir, rank0), func(int) int { return 20 })
		}, rank0, "truncated or altered", false},
		{"truncated", func(t *testing.T, dir string) {
			if err := os.Truncate(filepath.Join(dir, rank0), 1000); err != nil {
				t.Fatal(err)
			}
		}, rank0, "truncated or altered", false},
		{"data file missing", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, rank0)); err != nil {
				t.Fatal(err)
			}
		}, rank0, "missing or unreadable", true},
		{"manifest missing", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, ManifestFile)); err != nil {
				t.Fatal(err)
			}
		}, ManifestFile, "cannot read the manifest", true},
		{"manifest truncated", func(t *testing.T, dir string) {
			if err := os.Truncate(filepath.Join(dir, ManifestFile), 50); err != nil {
				t.Fatal(err)
			}
		}, ManifestFile, "not a manifest_sha256 seal", false},
		{"manifest byte altered", func(t *testing.T, dir string) {
			flipByte(t, filepath.Join(dir, ManifestFile), func(n int) int { return n / 2 })
		}, ManifestFile, "the manifest was altered or damaged", false},
		{"manifest unsealed", func(t *testing.T, dir string) {
			b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
			if err != nil {
				t.Fatal(err)
			}
			_, rest, _ := strings.Cut(string(b), "\n")
			if err := os.WriteFile(filepath.Join(dir, ManifestFile), []byte("{"+rest), 0o644); err != nil {
				t.Fatal(err)
			}
		}, ManifestFile, "format version 2 without its manifest_sha256 seal", false},
		{"newer format", func(t *testing.T, dir string) {
			editManifest(t, dir, func(m map[string]any) { m["format_version"] = FormatVersion + 1 })
		}, ManifestFile, "format version 3 is newer than version 2", false},
		{"shape disagrees with file", func(t *testing.T, dir string) {
			editManifest(t, dir, func(m map[string]any) {
				wte := m["tensors"].([]any)[0].(map[string]any)
				wte["shape"] = []int{8, 16}
				wte["slices"].([]any)[0].(map[string]any)["shape"] = []int{8, 16}
			})
		}, rank0, `entry "params/wte" is F32 [16 8]; the manifest says F32 [8 16]`, false},
		{"entry missing from file", func(t *testing.T, dir string) {
			editManifest(t, dir, func(m map[string]any) {
				m["tensors"].([]any)[0].(map[string]any)["slices"].([]any)[0].(map[string]any)["key"] = "other"
			})
		}, rank0, `no entry "other" for tensor "params/wte"`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := mustSave(t, t.TempDir(), 1, 0)
			tt.damage(t, dir)
			_, err := Load(dir)
			if err == nil {
				t.Fatal("Load accepted a damaged checkpoint")
			}
			var fe *FormatError
			if !errors.As(err, &fe) || fe.File != filepath.Join(dir, tt.errFile) {
				t.Errorf("error %v (%T) is not a *FormatError naming %s", err, err, tt.errFile)
			}
			if !strings.Contains(err.Error(), tt.errHas) {
				t.Errorf("error %q does not contain %q", err, tt.errHas)
			}
			if got := errors.Is(err, fs.ErrNotExist); got != tt.notExist {
				t.Errorf("errors.Is(err, fs.ErrNotExist) = %v, want %v", got, tt.notExist)
			}
		})
	}
}

func TestRotation(t *testing.T) {
	tests := []struct {
		name     string
		steps    []int // saved in this order
		keepLast int
		want     []string
	}{
		{"keep all", []int{1, 2, 3}, 0, []string{"latest", "step_00000001", "step_00000002", "step_00000003"}},
		{"keep 2", []int{1, 2, 3, 4, 5}, 2, []string{"latest", "step_00000004", "step_00000005"}},
		{"keep 1", []int{1, 2, 3}, 1, []string{"latest", "step_00000003"}},
		{"numeric order", []int{9, 100000000, 10}, 2, []string{"latest", "step_00000010", "step_100000000"}},
		// After resuming from an older checkpoint the new one is kept,
		// with the highest of the others.
		{"resumed from older", []int{10, 20, 30, 15}, 2, []string{"latest", "step_00000015", "step_00000030"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := t.TempDir()
			for _, s := range tt.steps {
				mustSave(t, out, s, tt.keepLast)
			}
			if got := dirEntries(t, out); !slices.Equal(got, tt.want) {
				t.Errorf("output dir holds %v, want %v", got, tt.want)
			}
			c, warnings, err := Latest(out)
			if err != nil || len(warnings) != 0 || c.Manifest.Step != tt.steps[len(tt.steps)-1] {
				t.Errorf("Latest = %v, %v, %v; want the last saved", c, warnings, err)
			}
		})
	}
}

func TestSaveReplacesSameStep(t *testing.T) {
	out := t.TempDir()
	mustSave(t, out, 4, 0)
	parts := wholeParts(99)
	if _, err := Save(out, testManifest(4), parts, 0); err != nil {
		t.Fatal(err)
	}
	if got := dirEntries(t, out); !slices.Equal(got, []string{"latest", "step_00000004"}) {
		t.Errorf("output dir holds %v", got)
	}
	c, _, err := Latest(out)
	if err != nil {
		t.Fatal(err)
	}
	checkParts(t, c, parts)
}

func TestSaveRemovesStaleTemporaries(t *testing.T) {
	out := t.TempDir()
	stale := filepath.Join(out, ".tmp-step_00000002-deadbeef")
	if err := os.MkdirAll(stale, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stale, "rank_00000.safetensors"), []byte("partial"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, ".tmp-latest-0123"), []byte("step_"), 0o666); err != nil {
		t.Fatal(err)
	}
	mustSave(t, out, 3, 0)
	if got := dirEntries(t, out); !slices.Equal(got, []string{"latest", "step_00000003"}) {
		t.Errorf("output dir holds %v", got)
	}
}

func TestLatest(t *testing.T) {
	tests := []struct {
		name     string
		setup    func(t *testing.T, out string)
		wantStep int        // -1: an error
		noCkpt   bool       // the error wraps ErrNoCheckpoint
		warns    [][]string // warning i contains every string of warns[i]
	}{
		{"follows latest", func(t *testing.T, out string) {
			mustSave(t, out, 1, 0)
			mustSave(t, out, 2, 0)
		}, 2, false, nil},
		{"latest names an older complete step", func(t *testing.T, out string) {
			mustSave(t, out, 1, 0)
			mustSave(t, out, 2, 0)
			os.WriteFile(filepath.Join(out, "latest"), []byte("step_00000001\n"), 0o666)
		}, 1, false, nil},
		{"damaged newest", func(t *testing.T, out string) {
			mustSave(t, out, 1, 0)
			mustSave(t, out, 2, 0)
			dir := mustSave(t, out, 3, 0)
			flipByte(t, filepath.Join(dir, "rank_00000.safetensors"), func(n int) int { return n / 2 })
		}, 2, false, [][]string{{"skipping step_00000003, named by latest", "rank_00000.safetensors", "truncated or altered"}}},
		{"two damaged", func(t *testing.T, out string) {
			mustSave(t, out, 1, 0)
			d2 := mustSave(t, out, 2, 0)
			d3 := mustSave(t, out, 3, 0)
			os.Remove(filepath.Join(d3, ManifestFile))
			os.Truncate(filepath.Join(d2, "rank_00000.safetensors"), 10)
		}, 1, false, [][]string{{"skipping step_00000003, named by latest", "manifest.json"}, {"skipping step_00000002:", "truncated or altered"}}},
		{"latest missing", func(t *testing.T, out string) {
			mustSave(t, out, 1, 0)
			mustSave(t, out, 2, 0)
			os.Remove(filepath.Join(out, "latest"))
		}, 2, false, [][]string{{"has no readable latest file"}}},
		{"latest names a missing dir", func(t *testing.T, out string) {
			mustSave(t, out, 1, 0)
			os.WriteFile(filepath.Join(out, "latest"), []byte("step_00000007\n"), 0o666)
		}, 1, false, [][]string{{"skipping step_00000007, named by latest", "cannot read the manifest"}}},
		{"latest is garbage", func(t *testing.T, out string) {
			mustSave(t, out, 1, 0)
			os.WriteFile(filepath.Join(out, "latest"), []byte("../../etc\n"), 0o666)
		}, 1, false, [][]string{{`"../../etc" does not name a checkpoint directory`}}},
		{"temporaries ignored", func(t *testing.T, out string) {
			mustSave(t, out, 1, 0)
			os.Mkdir(filepath.Join(out, ".tmp-step_00000009-x"), 0o777)
			os.Mkdir(filepath.Join(out, "step_notanumber"), 0o777)
			os.WriteFile(filepath.Join(out, "step_00000008"), nil, 0o666) // a file, not a directory
		}, 1, false, nil},
		{"empty dir", func(*testing.T, string) {}, -1, true, nil},
		{"no such dir", func(t *testing.T, out string) { os.Remove(out) }, -1, true, nil},
		{"all damaged", func(t *testing.T, out string) {
			d := mustSave(t, out, 1, 0)
			os.Remove(filepath.Join(d, ManifestFile))
		}, -1, false, [][]string{{"skipping step_00000001, named by latest"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := t.TempDir()
			tt.setup(t, out)
			c, warnings, err := Latest(out)
			if tt.wantStep < 0 {
				if err == nil {
					t.Fatalf("Latest = step %d; want an error", c.Manifest.Step)
				}
				if got := errors.Is(err, ErrNoCheckpoint); got != tt.noCkpt {
					t.Errorf("error %v: errors.Is(err, ErrNoCheckpoint) = %v, want %v", err, got, tt.noCkpt)
				}
			} else {
				if err != nil {
					t.Fatalf("Latest: %v (warnings %q)", err, warnings)
				}
				if c.Manifest.Step != tt.wantStep || c.Dir != filepath.Join(out, DirName(tt.wantStep)) {
					t.Errorf("Latest = step %d in %s; want step %d", c.Manifest.Step, c.Dir, tt.wantStep)
				}
				checkParts(t, c, wholeParts(tt.wantStep))
			}
			if len(warnings) != len(tt.warns) {
				t.Fatalf("warnings %q; want %d", warnings, len(tt.warns))
			}
			for i, want := range tt.warns {
				for _, w := range want {
					if !strings.Contains(warnings[i], w) {
						t.Errorf("warning %q does not mention %q", warnings[i], w)
					}
				}
			}
		})
	}
}

// TestEveryFlipDetected flips each byte of the newest checkpoint's
// manifest in turn (each bit of it once over the run: bit k of byte i for
// k = i mod 8), and 200 random bytes of its data file: no flip loads,
// Latest falls back to the checkpoint before it with a warning naming
// the damaged one, and the damaged one is left in place (nothing is
// removed because of it).
func TestEveryFlipDetected(t *testing.T) {
	out := t.TempDir()
	mustSave(t, out, 1, 0)
	dir := mustSave(t, out, 2, 0)
	check := func(t *testing.T, path string, i int, bit byte) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		b[i] ^= bit
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		defer func() {
			b[i] ^= bit
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}()
		if _, err := Load(dir); err == nil {
			t.Fatalf("byte %d of %s flipped (^%#x): Load accepted it", i, filepath.Base(path), bit)
		}
		c, warn, err := Latest(out)
		if err != nil || c.Manifest.Step != 1 {
			t.Fatalf("byte %d of %s flipped: Latest gave %v, %v; want step 1", i, filepath.Base(path), c, err)
		}
		if len(warn) == 0 || !strings.Contains(strings.Join(warn, "\n"), DirName(2)) {
			t.Fatalf("byte %d of %s flipped: warnings %q do not name %s", i, filepath.Base(path), warn, DirName(2))
		}
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("byte %d of %s flipped: %v", i, filepath.Base(path), err)
		}
	}
	man := filepath.Join(dir, ManifestFile)
	fi, err := os.Stat(man)
	if err != nil {
		t.Fatal(err)
	}
	for i := range int(fi.Size()) {
		check(t, man, i, 1<<(i%8))
	}
	data := filepath.Join(dir, "rank_00000.safetensors")
	dfi, err := os.Stat(data)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		check(t, data, rng.IntN(int(dfi.Size())), byte(1+rng.IntN(255)))
	}
	t.Logf("%d manifest bytes and 200 of the %d data bytes flipped one at a time: each detected", fi.Size(), dfi.Size())
}
