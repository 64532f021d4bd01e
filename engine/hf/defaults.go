package hf

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/engine"
)

// tokenIDKeys are the special token ids of a transformers config.json,
// as written: nil where a key is absent, null where it is null.
type tokenIDKeys struct {
	BosTokenID json.RawMessage `json:"bos_token_id"`
	EosTokenID json.RawMessage `json:"eos_token_id"`
	PadTokenID json.RawMessage `json:"pad_token_id"`
}

// A defaulter fills the keys a config.json leaves out with the defaults
// of transformers' config class, as transformers does when it loads the
// file, and tells note, if not nil, of each, in a line naming the file,
// the key and the value.
type defaulter struct {
	file, class string
	note        func(string)
}

// say tells of key, absent, taking value.
func (d defaulter) say(key, value string) {
	if d.note != nil {
		d.note(fmt.Sprintf("%s: %s absent: transformers' %s default, %s", d.file, key, d.class, value))
	}
}

// int sets *p to v where it is absent; why, if not "", follows the value
// in the note.
func (d defaulter) int(p **int, key string, v int, why string) {
	if *p == nil {
		*p = &v
		d.say(key, strconv.Itoa(v)+why)
	}
}

func (d defaulter) float(p **float64, key string, v float64) {
	if *p == nil {
		*p = &v
		d.say(key, strconv.FormatFloat(v, 'g', -1, 64))
	}
}

func (d defaulter) bool(p **bool, key string, v bool) {
	if *p == nil {
		*p = &v
		d.say(key, strconv.FormatBool(v))
	}
}

// tokenIDs reads k, bos_token_id and eos_token_id taking the defaults
// bos and eos where absent; a pad_token_id absent stays unknown.
func (d defaulter) tokenIDs(k tokenIDKeys, bos, eos string) (engine.TokenIDs, error) {
	var t engine.TokenIDs
	for _, f := range []struct {
		key  string
		raw  json.RawMessage
		dflt string
		dst  *string
	}{{"bos_token_id", k.BosTokenID, bos, &t.BOS}, {"eos_token_id", k.EosTokenID, eos, &t.EOS}, {"pad_token_id", k.PadTokenID, "", &t.Pad}} {
		if f.raw == nil {
			if f.dflt != "" {
				*f.dst = f.dflt
				d.say(f.key, f.dflt)
			}
			continue
		}
		v, err := engine.ParseTokenID(f.key, f.raw)
		if err != nil {
			return t, &engine.FormatError{File: d.file, Msg: err.Error()}
		}
		*f.dst = v
	}
	return t, nil
}

// exportTokenIDs are the bos_token_id, eos_token_id and pad_token_id an
// export of cfg writes: its TokenIDs, the ids of the model an import
// brought in; where it has none, GPT-2's <|endoftext|> as BOS and EOS for
// a GPT-2 or a Llama of GPT-2's vocabulary (gptui's built-in
// tokenizer's), else null, and no pad_token_id (nil).
func exportTokenIDs(cfg engine.ModelConfig) (bos, eos, pad json.RawMessage) {
	dflt := json.RawMessage("null")
	if cfg.Family != arch.Llama || cfg.V == gpt2Token+1 {
		dflt = json.RawMessage(strconv.Itoa(gpt2Token))
	}
	or := func(v string, d json.RawMessage) json.RawMessage {
		if v == "" {
			return d
		}
		return json.RawMessage(v)
	}
	return or(cfg.TokenIDs.BOS, dflt), or(cfg.TokenIDs.EOS, dflt), or(cfg.TokenIDs.Pad, nil)
}
