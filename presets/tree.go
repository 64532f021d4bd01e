package presets

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// A tree is a configuration as read from YAML before decoding: an ordered
// mapping from key to entry, whose keys are all known to the schema. Trees
// are what _base_ inheritance and overrides merge.
type tree struct {
	order []string
	items map[string]*entry
}

// An entry is one key of a tree: a section (sub != nil) or a leaf whose
// value is a YAML node, possibly null, meaning "unset".
type entry struct {
	at    pos
	value *yaml.Node
	sub   *tree
}

func newTree() *tree { return &tree{items: map[string]*entry{}} }

// set stores e under name, keeping the first position of name in order.
func (t *tree) set(name string, e *entry) {
	if _, ok := t.items[name]; !ok {
		t.order = append(t.order, name)
	}
	t.items[name] = e
}

// merge deep-merges o into t; o wins. A null leaf in o replaces t's value
// (it unsets the key); sections merge key by key.
func (t *tree) merge(o *tree) {
	for _, name := range o.order {
		oe := o.items[name]
		if te, ok := t.items[name]; ok && te.sub != nil && oe.sub != nil {
			te.sub.merge(oe.sub)
			continue
		}
		t.set(name, oe)
	}
}

// setPath stores e at the dotted path, creating sections on the way.
func (t *tree) setPath(path string, e *entry) {
	segs := strings.Split(path, ".")
	for _, s := range segs[:len(segs)-1] {
		next, ok := t.items[s]
		if !ok || next.sub == nil {
			next = &entry{at: e.at, sub: newTree()}
			t.set(s, next)
		}
		t = next.sub
	}
	last := segs[len(segs)-1]
	if old, ok := t.items[last]; ok && old.sub != nil && e.sub != nil {
		old.sub.merge(e.sub)
		return
	}
	t.set(last, e)
}

// maxAliasDepth bounds chains of YAML aliases.
const maxAliasDepth = 64

// deref follows YAML aliases.
func deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < maxAliasDepth; i++ {
		n = n.Alias
	}
	return n
}

// isNull reports whether n is absent or an explicit YAML null.
func isNull(n *yaml.Node) bool {
	n = deref(n)
	return n == nil || n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null")
}

// describeNode names the kind of n for error messages.
func describeNode(n *yaml.Node) string {
	n = deref(n)
	switch {
	case n == nil:
		return "nothing"
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.Kind == yaml.ScalarNode:
		return strconv.Quote(n.Value)
	}
	return "an unsupported YAML node"
}

// parseDocument parses data, which must hold at most one YAML document, and
// returns its root node (nil for an empty document).
func parseDocument(file string, data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, yamlError(file, err)
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, yamlError(file, err)
	default:
		return nil, &Error{File: file, Line: extra.Line, Msg: "more than one YAML document; a config holds exactly one"}
	}
	if doc.Kind == yaml.DocumentNode {
		if len(doc.Content) == 0 {
			return nil, nil
		}
		return doc.Content[0], nil
	}
	return &doc, nil
}

// yamlError converts a YAML syntax error into an *Error, moving the line
// number yaml reports ("yaml: line 3: ...") into Error.Line.
func yamlError(file string, err error) *Error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, tail, ok := strings.Cut(rest, ": "); ok {
			if n, err := strconv.Atoi(num); err == nil {
				line, msg = n, tail
			}
		}
	}
	return &Error{File: file, Line: line, Msg: "invalid YAML: " + msg}
}

// A builder turns the YAML nodes of one source into a tree, checking every
// key against the schema.
type builder struct {
	file string
	s    *schema
}

// root builds the tree of a whole document and returns the value of its
// _base_ key ("" if none) with that key's position.
func (b *builder) root(n *yaml.Node) (t *tree, base string, baseAt pos, err error) {
	n = deref(n)
	if isNull(n) {
		return newTree(), "", pos{}, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, "", pos{}, &Error{File: b.file, Line: n.Line,
			Msg: fmt.Sprintf("a config is a mapping of sections (Global, Engine, Model, Data, Optimizer, Distributed), got %s", describeNode(n))}
	}
	var rest []*yaml.Node
	seen := false
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], deref(n.Content[i+1])
		if k.Kind != yaml.ScalarNode || k.Value != "_base_" {
			rest = append(rest, n.Content[i], n.Content[i+1])
			continue
		}
		at := pos{b.file, k.Line}
		if seen {
			return nil, "", pos{}, errAt(at, "_base_", "duplicate key")
		}
		seen, baseAt = true, at
		if isNull(v) {
			continue
		}
		if v.Kind != yaml.ScalarNode || v.Value == "" {
			return nil, "", pos{}, errAt(at, "_base_", "want the name of a base file or preset, got "+describeNode(v))
		}
		base = v.Value
	}
	stripped := *n
	stripped.Content = rest
	t, err = b.mapping(&stripped, "")
	if err != nil {
		return nil, "", pos{}, err
	}
	return t, base, baseAt, nil
}

// mapping builds the tree of the section at prefix from n, which must be a
// mapping or null (an empty section).
func (b *builder) mapping(n *yaml.Node, prefix string) (*tree, error) {
	n = deref(n)
	t := newTree()
	if isNull(n) {
		return t, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, &Error{File: b.file, Line: n.Line, Key: prefix,
			Msg: "want a mapping of keys, got " + describeNode(n)}
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), n.Content[i+1]
		at := pos{b.file, k.Line}
		if k.Kind != yaml.ScalarNode {
			return nil, errAt(at, prefix, "keys must be plain names, got "+describeNode(k))
		}
		if strings.Contains(k.Value, ".") {
			return nil, errAt(at, join(prefix, k.Value), "dotted keys are only for overrides; in a file, nest each part under its section")
		}
		path := join(prefix, k.Value)
		if ignorable(path) {
			continue
		}
		path = canonical(path)
		_, name := splitLast(path)
		if prev, dup := t.items[name]; dup {
			msg := "duplicate key"
			if prev.at.line > 0 {
				msg += fmt.Sprintf(" (first set at line %d)", prev.at.line)
			}
			if path != join(prefix, k.Value) {
				msg += "; " + k.Value + " is another spelling of " + name
			}
			return nil, errAt(at, path, msg)
		}
		e, err := b.value(at, path, v)
		if err != nil {
			return nil, err
		}
		t.set(name, e)
	}
	return t, nil
}

// value builds the entry for the canonical key path with value v.
func (b *builder) value(at pos, path string, v *yaml.Node) (*entry, error) {
	v = deref(v)
	if _, ok := b.s.leaf[path]; ok {
		return &entry{at: at, value: v}, nil
	}
	switch {
	case path == gradClipPath && v != nil && v.Kind == yaml.ScalarNode && !isNull(v):
		sub := newTree()
		sub.set("clip_norm", &entry{at: at, value: v})
		return &entry{at: at, sub: sub}, nil
	case b.s.section[path]:
		sub, err := b.mapping(v, path)
		if err != nil {
			return nil, err
		}
		return &entry{at: at, sub: sub}, nil
	}
	return nil, b.s.unknownKey(at, path)
}
