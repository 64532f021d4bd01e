package data

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Sentencepiece-style BPE: the tokenizer.json that transformers writes
// for Llama 2's, Mistral's and other sentencepiece models. Its vocabulary
// is written in text, not in GPT-2's byte aliases, with a space written
// as ▁ (U+2581): either the normalizer puts ▁ in front of the text and
// writes its spaces as ▁ (Prepend and Replace, Llama 2's), or a Metaspace
// pre-tokenizer does. BPE starts from one symbol per character; a
// character the vocabulary lacks is its bytes' <0xNN> tokens (byte
// fallback), else the unknown token. The decoder writes ▁ back as a space,
// the <0xNN> tokens as their bytes, and drops the space in front of the
// text (Strip: one; Metaspace: those of the first token).

// metaspaceRune is sentencepiece's space.
const metaspaceRune = "▁"

// metaspace is what a sentencepiece-style BPE does around the model.
type metaspace struct {
	prepend bool // the normalizer puts ▁ in front of every piece of text (Prepend)
	replace bool // the normalizer writes spaces as ▁ (Replace)

	pre    bool   // a Metaspace pre-tokenizer: spaces as ▁, ...
	scheme string // ... ▁ put in front of the text: "always", "first" (of the input only) or "never" ...
	split  bool   // ... and the text cut in front of each ▁

	byteFallback bool
	byteIDs      [256]int32 // the <0xNN> tokens, -1 where missing
	unk          int32      // the unknown token, -1 for none (the character is dropped)
	fuseUnk      bool

	decodeBytes bool // the decoder writes <0xNN> tokens as their bytes (ByteFallback)
	strip       bool // the decoder drops a space in front of the text (Strip)
	stripFirst  bool // the decoder drops the spaces of the first token (Metaspace)
}

// normalize is the normalizer on a piece of text between added tokens.
func (sp *metaspace) normalize(s string) string {
	if s == "" {
		return s
	}
	if sp.prepend {
		s = metaspaceRune + s
	}
	if sp.replace {
		s = strings.ReplaceAll(s, " ", metaspaceRune)
	}
	return s
}

// pretokenize calls word for the words of s, a normalized piece of text
// (first: the input's first), as the Metaspace pre-tokenizer cuts them:
// s whole where there is none.
func (sp *metaspace) pretokenize(s string, first bool, word func(string)) {
	if s == "" {
		return
	}
	if !sp.pre {
		word(s)
		return
	}
	s = strings.ReplaceAll(s, " ", metaspaceRune)
	if (sp.scheme == "always" || sp.scheme == "first" && first) && !strings.HasPrefix(s, metaspaceRune) {
		s = metaspaceRune + s
	}
	if !sp.split {
		word(s)
		return
	}
	// Each ▁ begins a word (HF's MergedWithNext).
	start := 0
	for i := 0; i < len(s); {
		j := strings.Index(s[i:], metaspaceRune)
		if j < 0 {
			break
		}
		i += j
		if i > start {
			word(s[start:i])
			start = i
		}
		i += len(metaspaceRune)
	}
	word(s[start:])
}

// symbols appends the first symbols of word, one per character, to sym:
// its token, else (byte fallback) its bytes' <0xNN> tokens, else the
// unknown token (one for a run of unknown characters with fuse_unk), else
// none, as HF's BPE model starts a word.
func (m *bpeModel) spSymbols(sym []symbol, word string) []symbol {
	sp := m.sp
	add := func(id uint32, n int) { sym = append(sym, symbol{id: id, len: int32(n)}) }
	unkOpen := false // the last symbol is an unknown token that a fused one may extend
	for i := 0; i < len(word); {
		_, n := utf8.DecodeRuneInString(word[i:])
		c := word[i : i+n]
		i += n
		if id, ok := m.byBytes[c]; ok {
			add(id, n)
			unkOpen = false
			continue
		}
		if sp.byteFallback && sp.hasBytes(c) {
			for k := range len(c) {
				add(uint32(sp.byteIDs[c[k]]), 1)
			}
			unkOpen = false
			continue
		}
		switch {
		case sp.unk < 0:
		case unkOpen && sp.fuseUnk:
			sym[len(sym)-1].len += int32(n)
		default:
			add(uint32(sp.unk), n)
			unkOpen = true
		}
	}
	return sym
}

// hasBytes reports whether every byte of c has its <0xNN> token.
func (sp *metaspace) hasBytes(c string) bool {
	for k := range len(c) {
		if sp.byteIDs[c[k]] < 0 {
			return false
		}
	}
	return true
}

// byteToken returns the byte a byte-fallback token (<0x0A>) stands for.
func byteToken(s string) (byte, bool) {
	var b byte
	if len(s) != 6 || !strings.HasPrefix(s, "<0x") || s[5] != '>' {
		return 0, false
	}
	if _, err := fmt.Sscanf(s[3:5], "%02X", &b); err != nil || fmt.Sprintf("<0x%02X>", b) != s {
		return 0, false
	}
	return b, true
}

// decodeToken is what the decoder makes of the token string s.
func (sp *metaspace) decodeToken(s string) []byte {
	if b, ok := byteToken(s); ok && sp.decodeBytes {
		return []byte{b}
	}
	return []byte(strings.ReplaceAll(s, metaspaceRune, " "))
}

// parseNormalizer reads the normalizer of a sentencepiece-style BPE into
// sp: Prepend ▁, Replace " " by ▁, or a Sequence of them.
func parseNormalizer(file string, raw json.RawMessage, sp *metaspace) error {
	const key = "normalizer"
	st, err := decodeStep(file, key, raw, "Prepend", "Replace", "Sequence")
	if err != nil {
		return err
	}
	steps, keys := []json.RawMessage{raw}, []string{key}
	if st.Type == "Sequence" {
		steps, keys = st.Normalizers, nil
		for i := range steps {
			keys = append(keys, fmt.Sprintf("%s.normalizers[%d]", key, i))
		}
	}
	for i, raw := range steps {
		st, err := decodeStep(file, keys[i], raw, "Prepend", "Replace")
		if err != nil {
			return err
		}
		switch st.Type {
		case "Prepend":
			if st.Prepend != metaspaceRune {
				return tokErr(file, keys[i]+".prepend", "%q is not supported: gptui reads sentencepiece-style normalizers, which prepend %q", st.Prepend, metaspaceRune)
			}
			sp.prepend = true
		case "Replace":
			if pat := stringPattern(st.Pattern); pat != " " || st.Content != metaspaceRune {
				return tokErr(file, keys[i], "replacing %q by %q is not supported: gptui reads sentencepiece-style normalizers, which write spaces as %q", pat, st.Content, metaspaceRune)
			}
			sp.replace = true
		}
	}
	if !sp.replace {
		return tokErr(file, key, "writes no space as %q: gptui reads sentencepiece-style normalizers (Prepend and Replace); %s", metaspaceRune, tokenizerHint)
	}
	return nil
}

// stringPattern is the String of a Replace or Split pattern, or "".
func stringPattern(raw json.RawMessage) string {
	var p struct {
		String *string `json:"String"`
	}
	if json.Unmarshal(raw, &p) != nil || p.String == nil {
		return ""
	}
	return *p.String
}

// parseMetaspace reads a Metaspace pre-tokenizer into sp: its replacement
// must be ▁; prepend_scheme (older files: add_prefix_space) and split
// (default true) as HF reads them.
func parseMetaspace(file, key string, st hfStep, sp *metaspace) error {
	if st.Replacement != metaspaceRune {
		return tokErr(file, key+".replacement", "%q is not supported (want %q)", st.Replacement, metaspaceRune)
	}
	sp.pre, sp.split, sp.scheme = true, true, "always"
	if st.Split != nil {
		sp.split = *st.Split
	}
	switch {
	case st.PrependScheme != "":
		switch st.PrependScheme {
		case "always", "first", "never":
			sp.scheme = st.PrependScheme
		default:
			return tokErr(file, key+".prepend_scheme", "%q is not one of always, first, never", st.PrependScheme)
		}
	case st.AddPrefixSpace != nil && !*st.AddPrefixSpace:
		sp.scheme = "never"
	}
	return nil
}

// parseMetaspaceDecoder reads the decoder of a sentencepiece-style BPE:
// Metaspace, or a Sequence of Replace ▁ by " ", ByteFallback, Fuse, Strip
// of a leading space and Metaspace, which must write ▁ back as a space.
func parseMetaspaceDecoder(file string, raw json.RawMessage, sp *metaspace) error {
	const key = "decoder"
	if isNull(raw) {
		return tokErr(file, key, "missing; a sentencepiece-style BPE decodes with Replace or Metaspace")
	}
	kinds := []string{"Replace", "ByteFallback", "Fuse", "Strip", "Metaspace"}
	st, err := decodeStep(file, key, raw, append(kinds, "Sequence")...)
	if err != nil {
		return err
	}
	steps, keys := []json.RawMessage{raw}, []string{key}
	if st.Type == "Sequence" {
		steps, keys = st.Decoders, nil
		for i := range steps {
			keys = append(keys, fmt.Sprintf("%s.decoders[%d]", key, i))
		}
	}
	spaces := false
	for i, raw := range steps {
		st, err := decodeStep(file, keys[i], raw, kinds...)
		if err != nil {
			return err
		}
		switch st.Type {
		case "Replace":
			if pat := stringPattern(st.Pattern); pat != metaspaceRune || st.Content != " " {
				return tokErr(file, keys[i], "replacing %q by %q is not supported: a sentencepiece-style decoder writes %q as a space", pat, st.Content, metaspaceRune)
			}
			spaces = true
		case "ByteFallback":
			sp.decodeBytes = true
		case "Fuse":
		case "Strip":
			if st.Content != " " || st.Start > 1 || st.Stop != 0 {
				return tokErr(file, keys[i], "Strip of %q (start %d, stop %d) is not supported: gptui reads the strip of one leading space", st.Content, st.Start, st.Stop)
			}
			sp.strip = st.Start == 1
		case "Metaspace":
			spaces = true
			sp.stripFirst = st.PrependScheme != "never" && (st.AddPrefixSpace == nil || *st.AddPrefixSpace || st.PrependScheme != "")
		}
	}
	if !spaces {
		return tokErr(file, key, "does not write %q back as a space; a sentencepiece-style BPE decodes with Replace or Metaspace", metaspaceRune)
	}
	return nil
}
