package presets

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// YAML returns c in the YAML shape that Load reads, every key present (the
// Llama family's own only in a Llama's config), in the schema's fixed order; the lr schedule's keys that were derived
// (Config.DerivedFrom), and the keys a checkpoint settles that were left
// to it (Config.Defaulted), are left unset, their values in comments.
// Parsing the result yields c again.
func (c *Config) YAML() []byte {
	root := &yaml.Node{Kind: yaml.MappingNode}
	sections := map[string]*yaml.Node{"": root}
	var section func(path string) *yaml.Node
	section = func(path string) *yaml.Node {
		if n, ok := sections[path]; ok {
			return n
		}
		parent, name := splitLast(path)
		n := &yaml.Node{Kind: yaml.MappingNode}
		p := section(parent)
		p.Content = append(p.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: name}, n)
		sections[path] = n
		return n
	}
	for _, f := range fields() {
		if LlamaKey(f.path) && !c.Model.Llama() {
			continue // GPT-2 has none of them
		}
		parent, name := splitLast(f.path)
		p := section(parent)
		v := valueNode(f.ref(c))
		if from, ok := c.derived[f.path]; ok {
			// Unset, so that it is derived again; its value as a comment.
			v = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", LineComment: "# derived from " + from + ": " + v.Value}
		} else if c.defaulted[f.path] {
			// Unset, so that a checkpoint the run loads settles it.
			v = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", LineComment: "# a loaded checkpoint's, else the default: " + v.Value}
		}
		p.Content = append(p.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: name}, v)
	}
	var buf bytes.Buffer
	for _, n := range c.Notes {
		fmt.Fprintf(&buf, "# %s\n", strings.ReplaceAll(n, "\n", " "))
	}
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		// Unreachable for the node shapes built above; report it in a
		// form that still parses as YAML (and fails to validate).
		return []byte("# presets: cannot encode config: " + strings.ReplaceAll(err.Error(), "\n", " ") + "\n")
	}
	if err := enc.Close(); err != nil {
		return []byte("# presets: cannot encode config: " + strings.ReplaceAll(err.Error(), "\n", " ") + "\n")
	}
	return buf.Bytes()
}

// valueNode returns the YAML node of the value that ref points to.
func valueNode(ref any) *yaml.Node {
	scalar := func(tag, v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: v} }
	switch p := ref.(type) {
	case *int:
		return scalar("!!int", strconv.Itoa(*p))
	case *int64:
		return scalar("!!int", strconv.FormatInt(*p, 10))
	case *float64:
		return scalar("!!float", formatFloat(*p))
	case *bool:
		return scalar("!!bool", strconv.FormatBool(*p))
	case *string:
		return scalar("!!str", *p)
	case *[3]float64:
		n := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
		for _, v := range p {
			n.Content = append(n.Content, scalar("!!float", formatFloat(v)))
		}
		return n
	}
	return scalar("!!str", fmt.Sprint(ref))
}

// formatFloat formats v as a YAML float that reads back exactly, with a
// decimal point on integral values (32768.0).
func formatFloat(v float64) string {
	switch {
	case math.IsNaN(v):
		return ".nan"
	case math.IsInf(v, 1):
		return ".inf"
	case math.IsInf(v, -1):
		return "-.inf"
	}
	s := strconv.FormatFloat(v, 'g', -1, 64)
	if !strings.ContainsAny(s, ".e") {
		s += ".0"
	}
	return s
}
