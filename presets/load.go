package presets

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// configFS holds the embedded presets: configs/NAME.yaml for each name in
// Names, plus bases whose names start with "_", which are not listed.
//
//go:embed configs/*.yaml
var configFS embed.FS

// maxBaseDepth bounds _base_ chains.
const maxBaseDepth = 32

// Names returns the names of the embedded presets, smallest model first.
func Names() []string {
	return []string{"tiny", "llama-tiny", "gpt2-124m", "345m-1card", "llama-1b", "1.3b-dp8", "6.7b-sharding16", "llama-8b-4node", "13b-4node"}
}

// Describe returns a one-line description of the embedded preset name, or ""
// if there is no such preset. The description is the first comment line of
// the preset's YAML file.
func Describe(name string) string {
	data, ok := embedded(name)
	if !ok {
		return ""
	}
	first, _, _ := strings.Cut(string(data), "\n")
	if d, ok := strings.CutPrefix(first, "#"); ok {
		return strings.TrimSpace(d)
	}
	return ""
}

// embedded returns the YAML of the embedded preset or base name, which may
// be written with a leading "./" and a ".yaml" or ".yml" suffix.
func embedded(name string) ([]byte, bool) {
	name = strings.TrimPrefix(name, "./")
	for _, ext := range []string{".yaml", ".yml"} {
		name = strings.TrimSuffix(name, ext)
	}
	if name == "" || strings.ContainsAny(name, `/\`) {
		return nil, false
	}
	data, err := configFS.ReadFile("configs/" + name + ".yaml")
	if err != nil {
		return nil, false
	}
	return data, true
}

// isPresetName reports whether s names an embedded preset rather than a
// file: it must equal one of Names exactly.
func isPresetName(s string) bool {
	for _, n := range Names() {
		if s == n {
			return true
		}
	}
	return false
}

// Load loads a configuration. nameOrFile is a preset name (one of [Names],
// exactly) or else the path of a YAML file; to load a file that happens to
// be named like a preset, write it as "./tiny". Bases named by _base_ are
// resolved relative to the including file, falling back to the embedded
// preset or base of that name.
//
// Each override has the form "Section.key=value", where the key is a full
// dotted path such as Model.hidden_size or Data.Train.dataset.split and the
// value is parsed as YAML, so "Data.Train.dataset.split=[1,0,0]" sets a
// list and "Optimizer.lr={max_lr: 3e-4, min_lr: 0}" merges into a
// section. An empty value unsets the key, restoring its default.
// Overrides are applied in order, after _base_ inheritance.
//
// Unset keys are then given their defaults and the result is validated.
// Errors caused by the input are, or wrap, *Error.
func Load(nameOrFile string, overrides []string) (*Config, error) {
	l := newLoader(true)
	var (
		t   *tree
		err error
	)
	switch {
	case nameOrFile == "":
		return nil, &Error{Msg: "no preset or config file given; use one of " + strings.Join(Names(), ", ") + " or a YAML file"}
	case isPresetName(nameOrFile):
		t, err = l.loadEmbedded(nameOrFile)
	default:
		t, err = l.loadFile(nameOrFile)
	}
	if err != nil {
		return nil, err
	}
	for _, o := range overrides {
		if err := l.override(t, o); err != nil {
			return nil, err
		}
	}
	note := l.deriveBatch(t)
	c, err := l.finish(t)
	if err != nil {
		return nil, err
	}
	if note != "" {
		c.Notes = append(c.Notes, note)
	}
	return c, nil
}

// Parse parses data, a single YAML document in the same shape as the files
// [Load] reads, fills in defaults and validates the result. name is used in
// error messages as the file name. Parse reads no files: a _base_ key may
// only name an embedded preset or base.
func Parse(name string, data []byte) (*Config, error) {
	l := newLoader(false)
	t, err := l.load("parse:"+name, name, data, "", false)
	if err != nil {
		return nil, err
	}
	return l.finish(t)
}

// A loader resolves one configuration, with its _base_ chain.
type loader struct {
	s      *schema
	files  bool     // whether _base_ may name files
	stack  []string // sources being loaded, for cycle detection
	labels []string // their names, for messages
}

func newLoader(files bool) *loader {
	return &loader{s: newSchema(), files: files}
}

// loadEmbedded loads the embedded preset or base name.
func (l *loader) loadEmbedded(name string) (*tree, error) {
	data, ok := embedded(name)
	if !ok {
		return nil, &Error{File: name, Msg: "no such preset; presets are " + strings.Join(Names(), ", ")}
	}
	name = strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(name, "./"), ".yaml"), ".yml")
	return l.load("preset:"+name, "preset:"+name, data, "", true)
}

// loadFile loads the YAML file at file.
func (l *loader) loadFile(file string) (*tree, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		msg := "cannot read config"
		if sug := suggestPreset(file); sug != "" && errors.Is(err, fs.ErrNotExist) {
			msg = "no such preset or config file; did you mean the preset " + sug + "?"
			err = nil
		}
		return nil, &Error{File: file, Msg: msg, Err: err}
	}
	id := file
	if abs, err := filepath.Abs(file); err == nil {
		id = abs
	}
	return l.load(id, file, data, filepath.Dir(file), false)
}

// suggestPreset returns the preset whose name is nearest to name, a
// -c argument that is neither a preset nor a file, when it is near enough
// to be a misspelling (at most a third of its letters off, and never a
// path); else "".
func suggestPreset(name string) string {
	if strings.ContainsAny(name, "/\\") || strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml") {
		return ""
	}
	best, bestD := "", len(name)/3+1
	for _, p := range Names() {
		if d := levenshtein(strings.ToLower(name), p); d < bestD {
			best, bestD = p, d
		}
	}
	return best
}

// load builds the tree of one source, identified by id and named label in
// messages, merged over its base. dir is the directory that relative _base_
// paths are resolved against; isEmbedded tells whether the source is an
// embedded preset, whose bases are always embedded.
func (l *loader) load(id, label string, data []byte, dir string, isEmbedded bool) (*tree, error) {
	for i, s := range l.stack {
		if s == id {
			chain := append(append([]string(nil), l.labels[i:]...), label)
			return nil, &Error{File: l.labels[len(l.labels)-1], Key: "_base_",
				Msg: "inheritance cycle: " + strings.Join(chain, " -> ")}
		}
	}
	if len(l.stack) >= maxBaseDepth {
		return nil, &Error{File: label, Key: "_base_", Msg: fmt.Sprintf("more than %d levels of _base_", maxBaseDepth)}
	}
	l.stack, l.labels = append(l.stack, id), append(l.labels, label)
	defer func() {
		l.stack, l.labels = l.stack[:len(l.stack)-1], l.labels[:len(l.labels)-1]
	}()

	root, err := parseDocument(label, data)
	if err != nil {
		return nil, err
	}
	b := builder{file: label, s: l.s}
	t, base, baseAt, err := b.root(root)
	if err != nil || base == "" {
		return t, err
	}
	bt, err := l.loadBase(base, baseAt, dir, isEmbedded)
	if err != nil {
		return nil, err
	}
	bt.merge(t)
	return bt, nil
}

// loadBase loads the base named by a _base_ key at at.
func (l *loader) loadBase(base string, at pos, dir string, isEmbedded bool) (*tree, error) {
	if !isEmbedded && l.files {
		file := base
		if !filepath.IsAbs(file) {
			file = filepath.Join(dir, file)
		}
		switch _, err := os.Stat(file); {
		case err == nil:
			return l.loadFile(file)
		case !errors.Is(err, fs.ErrNotExist):
			return nil, &Error{File: at.file, Line: at.line, Key: "_base_", Msg: "cannot read base " + strconv.Quote(file), Err: err}
		}
	}
	if _, ok := embedded(base); ok {
		return l.loadEmbedded(path.Clean(base))
	}
	msg := fmt.Sprintf("cannot find base %q", base)
	switch {
	case isEmbedded:
		msg += " among the embedded presets"
	case l.files:
		msg += fmt.Sprintf(": no file %s and no preset of that name", filepath.Join(dir, base))
	default:
		msg += ": only embedded presets can be bases here (" + strings.Join(Names(), ", ") + ")"
	}
	return nil, &Error{File: at.file, Line: at.line, Key: "_base_", Msg: msg}
}

// override applies one "Section.key=value" override to t.
func (l *loader) override(t *tree, o string) error {
	at := pos{file: "override " + strconv.Quote(o)}
	key, val, ok := strings.Cut(o, "=")
	key = strings.TrimSpace(key)
	if !ok || key == "" {
		return &Error{File: at.file, Msg: "want Section.key=value, such as Model.hidden_size=128"}
	}
	if ignorable(key) {
		return nil
	}
	path := canonical(key)
	_, isLeaf := l.s.leaf[path]
	if !isLeaf && !l.s.section[path] {
		return l.s.unknownKey(at, key)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(val), &doc); err != nil {
		e := yamlError(at.file, err)
		e.Line, e.Key = 0, key
		return e
	}
	var v *yaml.Node
	if doc.Kind == yaml.DocumentNode && len(doc.Content) > 0 {
		v = doc.Content[0]
	}
	b := builder{file: at.file, s: l.s}
	e, err := b.value(at, path, v)
	if err != nil {
		return err
	}
	t.setPath(path, e)
	return nil
}

// finish decodes t, fills in defaults and validates.
func (l *loader) finish(t *tree) (*Config, error) {
	c, set, err := decode(l.s, t)
	if err != nil {
		return nil, err
	}
	applyDefaults(c, set)
	if err := c.validate(); err != nil {
		if p, ok := set[err.Key]; ok {
			err.File, err.Line = p.file, p.line
		}
		return nil, err
	}
	return c, nil
}
