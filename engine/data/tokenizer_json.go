package data

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"

	"github.com/gptui/gptui/badinput"
)

// Limits on a tokenizer.json, which is untrusted input. They are far above
// any published vocabulary (Llama 3's file is 9 MB, 128,256 tokens, tokens
// of at most 128 bytes) and keep a hostile file from steering allocations:
// the file is read in place, value by value (jscan), each list and table
// counted as it is read and refused as soon as it passes its limit or holds
// an entry that cannot be right, and every table is sized by what the file
// holds, never by a number in it. What the reading holds at its peak is a
// small multiple of the file's size: the file, its entries (spans of the
// file), and the tables built from them (cmd/gptui's TestHostileTokenizer
// measures the process at 1.3–2.4 times the size of 64 MiB hostile files;
// an accepted 25 MB file of a million tokens takes some 9 times its size,
// the tables mostly).
const (
	maxTokenizerBytes = 64 << 20 // the file
	maxVocab          = 1 << 20  // vocabulary entries, merges and added tokens, each
	maxTokenBytes     = 4096     // one token's string
	maxSectionBytes   = 1 << 20  // each of normalizer, pre_tokenizer, post_processor and decoder
)

// tokenizerHint ends the errors of a tokenizer.json.
const tokenizerHint = "gptui reads byte-level BPE tokenizer.json files like GPT-2's and Llama 3's"

// TokenizerTables is what the tables of a tokenizer.json hold, counted as
// the file is read, and Bytes, an estimate (erring high) of what the
// tables built from them take: what [LoadTokenizerChecked] asks its check
// before it builds them.
type TokenizerTables struct {
	Vocab, Merges, Added int // vocabulary entries, merges, added tokens
	Bytes                int64
}

// The bytes of the tables a tokenizer.json's entries become, with Go's
// map overhead: a vocabulary entry is in the maps by string, by id and by
// bytes, and in the id-indexed decode table (ids run to twice the
// entries); a merge is an entry of the merge map; an added token is in
// the maps that check them, and each byte of its content a node of its
// stage's trie. Each byte of a vocabulary token is held about three times
// (its string, its bytes, its decoded bytes).
const (
	vocabEntryBytes = 192
	mergeEntryBytes = 64
	addedEntryBytes = 256
	addedByteBytes  = 64
	tokenByteCopies = 3
)

// LoadTokenizer returns the tokenizer that path names: a Hugging Face
// tokenizer.json, or GPT-2's built-in tokenizer (see [NewTokenizer]) when
// path is empty.
//
// The file must describe a byte-level BPE model, as GPT-2's and Llama 3's
// do: model {type BPE, vocab, merges as "a b" strings or ["a", "b"]
// pairs, ignore_merges}; pre_tokenizer ByteLevel (add_prefix_space,
// use_regex), or a Sequence of Split steps with GPT-2's, Llama 3's or
// Qwen2's pattern (behavior Isolated, or Removed inverted) ending in
// ByteLevel; decoder ByteLevel; no
// normalizer; added_tokens (id, content, special, single_word, lstrip,
// rstrip, normalized); post_processor ByteLevel, TemplateProcessing or a
// Sequence of them. Anything else, a malformed file or one beyond the
// size limits yields a *[FormatError] naming the file and the key.
//
// The document separator [Prepare] writes before every document is the
// special token a TemplateProcessing post-processor puts before a single
// sequence (Llama 3's <|begin_of_text|>), else the special added token
// <|endoftext|> (GPT-2's). A tokenizer with neither encodes and decodes,
// but Prepare refuses it.
func LoadTokenizer(path string) (*Tokenizer, error) {
	return LoadTokenizerChecked(path, nil)
}

// LoadTokenizerChecked is [LoadTokenizer] calling check, if not nil, with
// what the file's tables hold once it has been read and before they are
// built (a caller's memory check); an error from check is returned as it
// is.
func LoadTokenizerChecked(path string, check func(TokenizerTables) error) (*Tokenizer, error) {
	if path == "" {
		return NewTokenizer()
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, badinput.Wrap(fmt.Errorf("data: tokenizer: %w", err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, badinput.Wrap(fmt.Errorf("data: tokenizer: %w", err))
	}
	tooLarge := &FormatError{File: path, Msg: fmt.Sprintf("larger than %d MiB, more than any tokenizer.json gptui reads", maxTokenizerBytes>>20)}
	if fi.Size() > maxTokenizerBytes {
		return nil, tooLarge // refused unread: a sparse file costs nothing
	}
	// One buffer of the file's size; a file that grows meanwhile is read
	// to the limit and no further.
	var buf bytes.Buffer
	buf.Grow(int(fi.Size()) + bytes.MinRead)
	if _, err := buf.ReadFrom(io.LimitReader(f, maxTokenizerBytes+1)); err != nil {
		return nil, fmt.Errorf("data: reading tokenizer %s: %w", path, err)
	}
	if buf.Len() > maxTokenizerBytes {
		return nil, tooLarge
	}
	return parseTokenizerJSON(path, buf.Bytes(), check)
}

// tokErr is the error for key of the tokenizer.json file.
func tokErr(file, key, format string, args ...any) *FormatError {
	return &FormatError{File: file, Msg: key + ": " + fmt.Sprintf(format, args...)}
}

// tokenizerDoc is the part of tokenizer.json gptui reads, as readDoc reads
// it. The sections whose type decides how to read them stay raw until
// then.
type tokenizerDoc struct {
	added                                            []hfAddedToken
	model                                            *modelDoc // nil: missing or null
	normalizer, preTokenizer, postProcessor, decoder json.RawMessage
}

// hfAddedToken is an entry of added_tokens (id, content, special,
// single_word, lstrip, rstrip, normalized), its content a span of the
// file (jscan).
type hfAddedToken struct {
	ID                                  int64
	Content                             span
	HasID                               bool
	Special, SingleWord, LStrip, RStrip bool
	Normalized, HasNormalized           bool
}

// modelDoc is the model section as read. Pointers tell a missing key from
// a zero.
type modelDoc struct {
	typ          *string
	vocab        []vocabEntry // in the file's order
	merges       [][2]span
	ignoreMerges bool
	dropout      *float64
	prefix       *string // continuing_subword_prefix
	suffix       *string // end_of_word_suffix
	vocabBytes   int64   // of the vocabulary's strings
	err          error   // what is wrong with vocab or merges, read before type (jscan.table)
}

// vocabEntry is an entry of model.vocab.
type vocabEntry struct {
	s  span
	id int64
}

// hfStep is any typed section: a pre-tokenizer, post-processor,
// normalizer or decoder, or a step of a Sequence of them.
type hfStep struct {
	Type           string            `json:"type"`
	AddPrefixSpace *bool             `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
	Pretokenizers  []json.RawMessage `json:"pretokenizers"`
	Processors     []json.RawMessage `json:"processors"`
	Pattern        json.RawMessage   `json:"pattern"`
	Behavior       string            `json:"behavior"`
	Invert         bool              `json:"invert"`
	// TemplateProcessing
	Single        []json.RawMessage          `json:"single"`
	SpecialTokens map[string]hfSpecialTokens `json:"special_tokens"`
}

type hfSpecialTokens struct {
	IDs []int64 `json:"ids"`
}

// isNull reports whether a raw section is absent or null.
func isNull(m json.RawMessage) bool {
	return len(bytes.TrimSpace(m)) == 0 || string(bytes.TrimSpace(m)) == "null"
}

// tables is what the tables of m and added, read by sc, hold
// (TokenizerTables).
func tables(sc *jscan, m *modelDoc, added []hfAddedToken) TokenizerTables {
	t := TokenizerTables{Vocab: len(m.vocab), Merges: len(m.merges), Added: len(added)}
	t.Bytes = int64(t.Vocab)*vocabEntryBytes + tokenByteCopies*m.vocabBytes + int64(t.Merges)*mergeEntryBytes + int64(t.Added)*addedEntryBytes
	for _, a := range added {
		t.Bytes += int64(sc.len(a.Content)) * addedByteBytes
	}
	return t
}

// parseTokenizerJSON builds a tokenizer from the bytes b of the file named
// file, calling check, if not nil, before it builds its tables.
func parseTokenizerJSON(file string, b []byte, check func(TokenizerTables) error) (*Tokenizer, error) {
	sc := &jscan{file: file, b: b}
	doc, err := sc.readDoc()
	if err != nil {
		return nil, err
	}
	m := &bpeModel{}

	// model
	hm := doc.model
	if hm == nil {
		return nil, tokErr(file, "model", "missing; %s", tokenizerHint)
	}
	if hm.typ == nil || *hm.typ != "BPE" {
		typ := ""
		if hm.typ != nil {
			typ = *hm.typ
		}
		return nil, tokErr(file, "model.type", "%q is not supported; %s", typ, tokenizerHint)
	}
	if hm.err != nil {
		return nil, hm.err
	}
	if hm.dropout != nil && *hm.dropout != 0 {
		return nil, tokErr(file, "model.dropout", "%g: BPE dropout makes tokenization random; set it to null", *hm.dropout)
	}
	if hm.prefix != nil && *hm.prefix != "" {
		return nil, tokErr(file, "model.continuing_subword_prefix", "%q is not supported; %s", *hm.prefix, tokenizerHint)
	}
	if hm.suffix != nil && *hm.suffix != "" {
		return nil, tokErr(file, "model.end_of_word_suffix", "%q is not supported; %s", *hm.suffix, tokenizerHint)
	}
	if len(hm.vocab) == 0 {
		return nil, tokErr(file, "model.vocab", "missing or empty; %s", tokenizerHint)
	}
	if check != nil {
		if err := check(tables(sc, hm, doc.added)); err != nil {
			return nil, err
		}
	}
	m.ignoreMerges = hm.ignoreMerges
	// A token listed twice keeps its last id, as when the object is read
	// into a map.
	vocab := make(map[string]int64, len(hm.vocab))
	for _, e := range hm.vocab {
		vocab[sc.text(e.s)] = e.id
	}
	hm.vocab = nil

	// Ids are checked against the number of entries the file holds, so the
	// id-indexed decode table is at most twice what the file pays for.
	entries := int64(len(vocab) + len(doc.added))
	idLimit := 2*entries + 1024
	checkID := func(key func() string, id int64) error {
		if id < 0 || id >= idLimit {
			return tokErr(file, key(), "id %d out of range [0, %d): ids must be dense, below twice the number of tokens", id, idLimit)
		}
		return nil
	}

	// vocab: the tokens' byte-level strings, keyed by string for the merges
	// and by the bytes they stand for for BPE; the id-indexed decode table
	// (what HF's ByteLevel decoder makes of each id's string: its bytes
	// when every character is a byte alias, else the string itself) is
	// sized by the ids first, and tells an id given twice.
	maxID := int64(-1)
	for s, id := range vocab {
		key := func() string { return fmt.Sprintf("model.vocab[%.40q]", s) }
		if err := checkID(key, id); err != nil {
			return nil, err
		}
		if len(s) > maxTokenBytes || s == "" {
			return nil, tokErr(file, key(), "a token of %d bytes (the limit is %d, and tokens are not empty)", len(s), maxTokenBytes)
		}
		maxID = max(maxID, id)
	}
	for _, t := range doc.added {
		if t.ID < idLimit { // the others are refused below
			maxID = max(maxID, t.ID)
		}
	}
	m.decode = make([][]byte, maxID+1)
	m.byBytes = make(map[string]uint32, len(vocab))
	for s, id := range vocab {
		if m.decode[id] != nil {
			for prev, pid := range vocab {
				if pid == id && prev != s {
					a, b := min(prev, s), max(prev, s) // name them in a stable order
					return nil, tokErr(file, "model.vocab", "id %d is given to both %.40q and %.40q", id, a, b)
				}
			}
		}
		raw, ok := byteLevelDecode(s)
		if ok {
			m.byBytes[string(raw)] = uint32(id)
		} else {
			raw = []byte(s)
		}
		m.decode[id] = raw
	}
	for c := range 256 {
		id, ok := m.byBytes[string([]byte{byte(c)})]
		if !ok {
			return nil, tokErr(file, "model.vocab", "no token for byte 0x%02X (%q): a byte-level BPE vocabulary holds all 256 bytes; %s",
				c, string(byteLevel[c]), tokenizerHint)
		}
		m.byteID[c] = id
	}

	// merges
	m.merges = make(map[uint64]merge, len(hm.merges))
	var ab []byte
	for i, p := range hm.merges {
		key := func() string { return fmt.Sprintf("model.merges[%d]", i) }
		a, b := sc.bytesOf(p[0]), sc.bytesOf(p[1])
		ab = append(append(ab[:0], a...), b...)
		ida, oka := vocab[string(a)]
		idb, okb := vocab[string(b)]
		idn, okn := vocab[string(ab)]
		switch {
		case !oka:
			return nil, tokErr(file, key(), "%.40q is not in model.vocab", a)
		case !okb:
			return nil, tokErr(file, key(), "%.40q is not in model.vocab", b)
		case !okn:
			return nil, tokErr(file, key(), "the merged token %.40q is not in model.vocab", ab)
		}
		// A pair listed twice keeps its last rank, as in HF's merge map.
		m.merges[pairKey(uint32(ida), uint32(idb))] = merge{rank: uint32(i), id: uint32(idn)}
	}
	hm.merges = nil

	// added_tokens (their ids and contents are there: addedTokens)
	var added [2][]addedToken
	byContent := map[string]int{}
	addedIDs := map[int64]string{}
	for i, t := range doc.added {
		key := fmt.Sprintf("added_tokens[%d]", i)
		content := sc.text(t.Content)
		if err := checkID(func() string { return key + ".id" }, t.ID); err != nil {
			return nil, err
		}
		if j, dup := byContent[content]; dup {
			return nil, tokErr(file, key+".content", "%.40q repeats added_tokens[%d]", content, j)
		}
		byContent[content] = i
		addedIDs[t.ID] = content
		maxID = max(maxID, t.ID)
		normalized := !t.Special
		if t.HasNormalized {
			normalized = t.Normalized
		}
		stage := 0
		if normalized {
			stage = 1
		}
		added[stage] = append(added[stage], addedToken{id: int(t.ID), content: content, special: t.Special,
			singleWord: t.SingleWord, lstrip: t.LStrip, rstrip: t.RStrip})
	}
	for s := range added {
		for _, t := range added[s] {
			m.added.stages[s].add(t)
		}
	}

	for id, s := range addedIDs {
		m.decode[id] = tokenBytes(s) // an added token's content wins, as in HF
	}

	// normalizer, pre_tokenizer, decoder, post_processor
	if !isNull(doc.normalizer) {
		typ, err := stepType(file, "normalizer", doc.normalizer)
		if err != nil {
			return nil, err
		}
		return nil, tokErr(file, "normalizer.type", "%q is not supported: gptui reads tokenizers without a normalizer (null), as GPT-2's and Llama 3's are", typ)
	}
	pre, err := parsePreTokenizer(file, doc.preTokenizer)
	if err != nil {
		return nil, err
	}
	m.pre = pre
	if err := checkDecoder(file, doc.decoder); err != nil {
		return nil, err
	}
	sep, err := separator(sc, doc.postProcessor, doc.added)
	if err != nil {
		return nil, err
	}
	if sep > maxID {
		return nil, tokErr(file, "post_processor", "the separator id %d is not a token of the vocabulary", sep)
	}

	sum := sha256.Sum256(b)
	return &Tokenizer{
		name:  "tokenizer.json:" + hex.EncodeToString(sum[:]),
		vocab: int(maxID + 1),
		sep:   int(sep),
		bpe:   m,
	}, nil
}

// tokenBytes is what HF's ByteLevel decoder makes of a token's string.
func tokenBytes(s string) []byte {
	if raw, ok := byteLevelDecode(s); ok {
		return raw
	}
	return []byte(s)
}

// parsePreTokenizer reads the pre_tokenizer section into steps.
func parsePreTokenizer(file string, raw json.RawMessage) ([]preStep, error) {
	const key = "pre_tokenizer"
	if isNull(raw) {
		return nil, tokErr(file, key, "missing; a byte-level BPE needs a ByteLevel pre-tokenizer; %s", tokenizerHint)
	}
	st, err := decodeStep(file, key, raw, "ByteLevel", "Sequence")
	if err != nil {
		return nil, err
	}
	steps := []json.RawMessage{raw}
	keys := []string{key}
	if st.Type == "Sequence" {
		steps = st.Pretokenizers
		keys = keys[:0]
		for i := range steps {
			keys = append(keys, fmt.Sprintf("%s.pretokenizers[%d]", key, i))
		}
	}
	var pre []preStep
	for i, raw := range steps {
		k := keys[i]
		st, err := decodeStep(file, k, raw, "ByteLevel", "Split")
		if err != nil {
			return nil, err
		}
		last := i == len(steps)-1
		switch st.Type {
		case "ByteLevel":
			if !last {
				return nil, tokErr(file, k, "ByteLevel must be the last pre-tokenizer step; %s", tokenizerHint)
			}
			if st.AddPrefixSpace == nil {
				return nil, tokErr(file, k+".add_prefix_space", "missing")
			}
			useRegex := st.UseRegex == nil || *st.UseRegex // HF's default is true
			pre = append(pre, preStep{addPrefixSpace: *st.AddPrefixSpace, useRegex: useRegex})
		case "Split":
			var pat struct {
				Regex  *string `json:"Regex"`
				String *string `json:"String"`
			}
			if err := json.Unmarshal(st.Pattern, &pat); err != nil || pat.Regex == nil {
				return nil, tokErr(file, k+".pattern", "only a Regex pattern (GPT-2's or Llama 3's) is supported; %s", tokenizerHint)
			}
			split := splitterFor(*pat.Regex)
			if split == nil {
				return nil, tokErr(file, k+".pattern.Regex", "%.60q is not a pattern gptui knows; it splits with GPT-2's and Llama 3's", *pat.Regex)
			}
			// The known patterns match every character, so the pieces of
			// an Isolated split are the matches, and so are those an
			// inverted Removed split keeps.
			switch {
			case st.Behavior == "Isolated" && !st.Invert, st.Behavior == "Removed" && st.Invert:
			case st.Behavior != "Isolated" && st.Behavior != "Removed":
				return nil, tokErr(file, k+".behavior", "%q is not supported; gptui reads Isolated splits (and inverted Removed ones)", st.Behavior)
			default:
				return nil, tokErr(file, k+".invert", "%v is not supported with behavior %s", st.Invert, st.Behavior)
			}
			pre = append(pre, preStep{split: split})
		}
	}
	if len(pre) == 0 || pre[len(pre)-1].split != nil {
		return nil, tokErr(file, key, "no ByteLevel step; %s", tokenizerHint)
	}
	return pre, nil
}

// checkDecoder accepts a ByteLevel decoder only.
func checkDecoder(file string, raw json.RawMessage) error {
	if isNull(raw) {
		return tokErr(file, "decoder", "missing; byte-level BPE decodes with a ByteLevel decoder")
	}
	_, err := stepType(file, "decoder", raw, "ByteLevel")
	return err
}

// separator returns the document separator (see LoadTokenizer), or -1.
func separator(sc *jscan, raw json.RawMessage, added []hfAddedToken) (int64, error) {
	file := sc.file
	sep := int64(-1)
	if !isNull(raw) {
		var walk func(raw json.RawMessage, key string) error
		walk = func(raw json.RawMessage, key string) error {
			st, err := decodeStep(file, key, raw, "ByteLevel", "Sequence", "TemplateProcessing")
			if err != nil {
				return err
			}
			switch st.Type {
			case "ByteLevel":
			case "Sequence":
				for i, p := range st.Processors {
					if err := walk(p, fmt.Sprintf("%s.processors[%d]", key, i)); err != nil {
						return err
					}
				}
			case "TemplateProcessing":
				id, err := templateSeparator(file, key, st)
				if err != nil {
					return err
				}
				if id >= 0 {
					sep = id
				}
			}
			return nil
		}
		if err := walk(raw, "post_processor"); err != nil {
			return 0, err
		}
	}
	if sep < 0 {
		for _, t := range added {
			if t.Special && sc.text(t.Content) == "<|endoftext|>" {
				sep = t.ID
			}
		}
	}
	return sep, nil
}

// templateSeparator returns the id of the one special token that a
// TemplateProcessing puts before a single sequence ($A), or -1 if it puts
// none.
func templateSeparator(file, key string, st hfStep) (int64, error) {
	var ids []int64
	for i, piece := range st.Single {
		var p struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
			Sequence *struct{} `json:"Sequence"`
		}
		if err := json.Unmarshal(piece, &p); err != nil {
			return 0, jsonError(file, fmt.Sprintf("%s.single[%d]", key, i), nil, err)
		}
		if p.Sequence != nil {
			break
		}
		if p.SpecialToken == nil {
			return 0, tokErr(file, fmt.Sprintf("%s.single[%d]", key, i), "neither SpecialToken nor Sequence")
		}
		spec, ok := st.SpecialTokens[p.SpecialToken.ID]
		if !ok {
			return 0, tokErr(file, key+".special_tokens", "no entry for %q", p.SpecialToken.ID)
		}
		ids = append(ids, spec.IDs...)
	}
	switch len(ids) {
	case 0:
		return -1, nil
	case 1:
		return ids[0], nil
	}
	return 0, tokErr(file, key+".single", "%d tokens before a document; gptui separates documents with one token", len(ids))
}

// stepType returns the "type" of the section raw at key, refusing any but
// those accepted (none given: any).
func stepType(file, key string, raw json.RawMessage, accept ...string) (string, error) {
	var t struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return "", jsonError(file, key, nil, err)
	}
	if len(accept) > 0 && !slices.Contains(accept, t.Type) {
		return "", tokErr(file, key+".type", "%q is not supported; %s", t.Type, tokenizerHint)
	}
	return t.Type, nil
}

// decodeStep reads the section raw at key, once its type is accepted.
func decodeStep(file, key string, raw json.RawMessage, accept ...string) (hfStep, error) {
	var st hfStep
	if _, err := stepType(file, key, raw, accept...); err != nil {
		return st, err
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, jsonError(file, key, nil, err)
	}
	return st, nil
}

// jsonError turns a JSON decoding error into a *FormatError naming the
// file, the key and, for syntax errors in whole (non-nil b), the line.
func jsonError(file, key string, b []byte, err error) *FormatError {
	fe := &FormatError{File: file, Msg: "invalid JSON", Err: err}
	if key != "" {
		fe.Msg = key + ": invalid JSON"
	}
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se) && b != nil:
		fe.Line = 1 + bytes.Count(b[:min(int(se.Offset), len(b))], []byte("\n"))
	case errors.As(err, &te):
		k := te.Field
		if key != "" && k != "" {
			k = key + "." + k
		} else if k == "" {
			k = key
		}
		if k == "" {
			k = "the file"
		}
		fe.Msg, fe.Err = fmt.Sprintf("%s: %s where %s belongs", k, te.Value, jsonKind(te.Type)), nil
	}
	return fe
}

// jsonKind says in JSON's words what a Go type reads.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "an integer"
	case reflect.Float64, reflect.Float32:
		return "a number"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return t.String()
}
