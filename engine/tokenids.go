package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/gptui/gptui/engine/checkpoint"
)

// TokenIDs are a model's special token ids as transformers' config.json
// writes them — bos_token_id, eos_token_id, pad_token_id — each kept as
// compact JSON: an id, a list of ids (Llama 3.1's eos), null where the
// model has none, or "" where it is not known. They are no part of what the model
// computes, but of what an import brings in and an export gives back: a
// checkpoint keeps them (its manifest's extra.special_tokens), and so do
// the checkpoints of a run that loads it.
type TokenIDs struct {
	BOS, EOS, Pad string
}

// Keys of TokenIDs in config.json and in a manifest's special_tokens.
const (
	bosKey = "bos_token_id"
	eosKey = "eos_token_id"
	padKey = "pad_token_id"
)

// specialTokensKey names the TokenIDs in a manifest's extra records.
const specialTokensKey = "special_tokens"

// fields lists t's ids by their keys, in order.
func (t *TokenIDs) fields() []struct {
	key string
	v   *string
} {
	return []struct {
		key string
		v   *string
	}{{bosKey, &t.BOS}, {eosKey, &t.EOS}, {padKey, &t.Pad}}
}

// ParseTokenID returns the special token id raw, a config.json value of
// key, in its compact form: null, an id (an integer: some configs write
// -1 for none) or a non-empty list of them; anything else is an error
// naming key. An empty raw is "".
func ParseTokenID(key string, raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0:
		return "", nil
	case string(raw) == "null":
		return "null", nil
	}
	var id int64
	if json.Unmarshal(raw, &id) == nil {
		return fmt.Sprint(id), nil
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil && len(ids) > 0 {
		b, _ := json.Marshal(ids)
		return string(b), nil
	}
	return "", fmt.Errorf("%s %.40s: want a token id, a list of them, or null", key, raw)
}

// Record returns t as a JSON object of its ids by key, those not known
// ("") left out; nil when none is known.
func (t TokenIDs) Record() json.RawMessage {
	var b bytes.Buffer
	for _, f := range t.fields() {
		if *f.v == "" {
			continue
		}
		if b.Len() == 0 {
			b.WriteByte('{')
		} else {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%q:%s", f.key, *f.v)
	}
	if b.Len() == 0 {
		return nil
	}
	b.WriteByte('}')
	return b.Bytes()
}

// extra returns the manifest's extra records holding t, or nil.
func (t TokenIDs) extra() map[string]json.RawMessage {
	r := t.Record()
	if r == nil {
		return nil
	}
	return map[string]json.RawMessage{specialTokensKey: r}
}

// readTokenIDs returns the special token ids checkpoint c keeps, each ""
// where it keeps none.
func readTokenIDs(c *checkpoint.Checkpoint) (TokenIDs, error) {
	var t TokenIDs
	raw, ok := c.Manifest.Extra[specialTokensKey]
	if !ok {
		return t, nil
	}
	bad := func(err error) error {
		return &checkpoint.FormatError{File: filepath.Join(c.Dir, checkpoint.ManifestFile), Msg: "extra." + specialTokensKey + ": " + err.Error()}
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return t, bad(err)
	}
	for _, f := range t.fields() {
		v, err := ParseTokenID(f.key, m[f.key])
		if err != nil {
			return t, bad(err)
		}
		*f.v = v
	}
	return t, nil
}
