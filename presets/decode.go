package presets

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// decode decodes the merged tree t into a Config and returns it with the
// position of every key that was set (null values count as unset).
func decode(s *schema, t *tree) (*Config, map[string]pos, error) {
	c := new(Config)
	set := map[string]pos{}
	var walk func(t *tree, prefix string) error
	walk = func(t *tree, prefix string) error {
		for _, name := range t.order {
			e, path := t.items[name], join(prefix, name)
			if e.sub != nil {
				if err := walk(e.sub, path); err != nil {
					return err
				}
				continue
			}
			if isNull(e.value) {
				continue
			}
			i, ok := s.leaf[path]
			if !ok {
				// The builder admits only schema keys.
				return s.unknownKey(e.at, path)
			}
			if err := setValue(s.fields[i].ref(c), e.value); err != nil {
				return errAt(e.at, path, err.Error())
			}
			set[path] = e.at
		}
		return nil
	}
	if err := walk(t, ""); err != nil {
		return nil, nil, err
	}
	return c, set, nil
}

// setValue decodes the YAML value n into ref, a pointer returned by a
// field's ref. Its errors are bare messages, placed by the caller.
func setValue(ref any, n *yaml.Node) error {
	n = deref(n)
	switch p := ref.(type) {
	case *int:
		v, err := intValue(n)
		if err != nil {
			return err
		}
		if int64(int(v)) != v {
			return fmt.Errorf("%d is out of range", v)
		}
		*p = int(v)
	case *int64:
		v, err := intValue(n)
		if err != nil {
			return err
		}
		*p = v
	case *float64:
		v, err := floatValue(n)
		if err != nil {
			return err
		}
		*p = v
	case *bool:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
			return fmt.Errorf("want true or false, got %s", describeNode(n))
		}
		var b bool
		if err := n.Decode(&b); err != nil {
			return fmt.Errorf("want true or false, got %s", describeNode(n))
		}
		*p = b
	case *string:
		if n.Kind != yaml.ScalarNode {
			return fmt.Errorf("want a string, got %s", describeNode(n))
		}
		*p = n.Value
	case *[3]float64:
		v, err := splitValue(n)
		if err != nil {
			return err
		}
		*p = v
	default:
		return fmt.Errorf("internal error: unsupported field type %T", ref)
	}
	return nil
}

// intValue decodes an integer; integral floats such as 1e6 are accepted.
func intValue(n *yaml.Node) (int64, error) {
	if n.Kind == yaml.ScalarNode {
		switch n.ShortTag() {
		case "!!int":
			var v int64
			if err := n.Decode(&v); err == nil {
				return v, nil
			}
			return 0, fmt.Errorf("%s is out of range", n.Value)
		case "!!float":
			var f float64
			if err := n.Decode(&f); err == nil && f == math.Trunc(f) && math.Abs(f) <= 1<<53 {
				return int64(f), nil
			}
		}
	}
	return 0, fmt.Errorf("want an integer, got %s", describeNode(n))
}

// floatValue decodes a number.
func floatValue(n *yaml.Node) (float64, error) {
	if n.Kind == yaml.ScalarNode {
		switch n.ShortTag() {
		case "!!int", "!!float":
			var f float64
			if err := n.Decode(&f); err == nil {
				return f, nil
			}
		}
	}
	return 0, fmt.Errorf("want a number, got %s", describeNode(n))
}

// splitValue decodes a data split given as a list of three numbers or as
// the PaddleFleetX string form "949,50,1".
func splitValue(n *yaml.Node) ([3]float64, error) {
	var out [3]float64
	const want = "want three numbers such as [949, 50, 1] or '949,50,1'"
	switch n.Kind {
	case yaml.SequenceNode:
		if len(n.Content) != 3 {
			return out, fmt.Errorf("%s, got a list of %d", want, len(n.Content))
		}
		for i, e := range n.Content {
			f, err := floatValue(deref(e))
			if err != nil {
				return out, fmt.Errorf("%s: element %d: %w", want, i+1, err)
			}
			out[i] = f
		}
		return out, nil
	case yaml.ScalarNode:
		parts := strings.Split(n.Value, ",")
		if n.ShortTag() != "!!str" || len(parts) != 3 {
			break
		}
		for i, s := range parts {
			f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
			if err != nil {
				return out, fmt.Errorf("%s, got %s", want, describeNode(n))
			}
			out[i] = f
		}
		return out, nil
	}
	return out, fmt.Errorf("%s, got %s", want, describeNode(n))
}
