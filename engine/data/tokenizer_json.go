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
	"strings"

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
const tokenizerHint = "gptui reads byte-level BPE tokenizer.json files like GPT-2's and Llama 3's, and sentencepiece-style ones like Llama 2's"

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
// tokenizer.json, or the folder holding it, with the tokenizer_config.json
// beside it (in the folder, or beside a file named tokenizer.json), if
// any; or GPT-2's built-in tokenizer (see [NewTokenizer]) when path is
// empty.
//
// The file must describe a BPE model, byte-level as GPT-2's and Llama
// 3's are, or sentencepiece-style as Llama 2's and Mistral's are (see
// metaspace.go): model {type BPE, vocab, merges as "a b" strings or
// ["a", "b"] pairs, ignore_merges; byte_fallback, unk_token and fuse_unk
// for sentencepiece}; pre_tokenizer ByteLevel (add_prefix_space,
// use_regex), or a Sequence of Split steps with GPT-2's, Llama 3's or
// Qwen2's pattern (behavior Isolated, or Removed inverted) ending in
// ByteLevel, or (sentencepiece) Metaspace or none; decoder ByteLevel, or
// (sentencepiece) Metaspace or a Sequence of Replace, ByteFallback, Fuse
// and Strip; normalizer none, or (sentencepiece) Prepend and Replace;
// added_tokens (id, content, special, single_word, lstrip, rstrip,
// normalized); post_processor ByteLevel, TemplateProcessing or a Sequence
// of them. Anything else, a malformed file or one beyond the size limits
// yields a *[FormatError] naming the file and the key; so does a
// tokenizer_config.json whose bos_token, eos_token or pad_token is not a
// token of the file.
//
// The special tokens ([Tokenizer.Special]) are those tokenizer_config.json
// names, else those the template puts around a sequence. The document
// separator [Prepare] writes before every document is the token the
// template puts before a single sequence (Llama 2's <s>), else the BOS of
// tokenizer_config.json (Llama 3's <|begin_of_text|>), else the special
// added token <|endoftext|> (GPT-2's), else its EOS. A tokenizer with none
// encodes and decodes, but Prepare refuses it.
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
	path, confPath, err := tokenizerFiles(path)
	if err != nil {
		return nil, err
	}
	var conf *tokenizerConfig
	if confPath != "" {
		if conf, err = readTokenizerConfig(confPath); err != nil {
			return nil, err
		}
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
	return parseTokenizerJSON(path, buf.Bytes(), check, conf)
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
	byteFallback bool    // byte_fallback: a character not in vocab is its bytes' <0xNN> tokens
	unk          *string // unk_token
	fuseUnk      bool    // fuse_unk: unknown characters in a row are one unk_token
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
	// Sentencepiece-style steps (metaspace.go): normalizers Sequence,
	// Prepend and Replace; the Metaspace pre-tokenizer and decoder;
	// decoders Sequence and Strip.
	Normalizers   []json.RawMessage `json:"normalizers"`
	Prepend       string            `json:"prepend"`
	Content       string            `json:"content"`
	Replacement   string            `json:"replacement"`
	PrependScheme string            `json:"prepend_scheme"`
	Split         *bool             `json:"split"`
	Decoders      []json.RawMessage `json:"decoders"`
	Start         int               `json:"start"`
	Stop          int               `json:"stop"`
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
// file and, if not nil, the tokenizer_config.json beside it, conf,
// calling check, if not nil, before it builds its tables.
func parseTokenizerJSON(file string, b []byte, check func(TokenizerTables) error, conf *tokenizerConfig) (*Tokenizer, error) {
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
	if m.sp, err = sentencepiece(file, doc); err != nil {
		return nil, err
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
		if m.sp != nil {
			// Text, its spaces ▁, and the bytes of byte fallback.
			m.byBytes[s] = uint32(id)
			m.decode[id] = m.sp.decodeToken(s)
			if c, ok := byteToken(s); ok {
				m.sp.byteIDs[c] = int32(id)
			}
			continue
		}
		raw, ok := byteLevelDecode(s)
		if ok {
			m.byBytes[string(raw)] = uint32(id)
		} else {
			raw = []byte(s)
		}
		m.decode[id] = raw
	}
	if m.sp != nil {
		m.sp.byteFallback, m.sp.fuseUnk = hm.byteFallback, hm.fuseUnk
		if u := hm.unk; u != nil {
			id, ok := vocab[*u]
			if !ok {
				return nil, tokErr(file, "model.unk_token", "%.40q is not in model.vocab", *u)
			}
			m.sp.unk = int32(id)
		}
	}
	for c := range 256 {
		if m.sp != nil {
			break // a character not in the vocabulary falls back on <0xNN> tokens or unk_token
		}
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
		// An added token's content wins, as in HF.
		if m.sp != nil {
			m.decode[id] = []byte(strings.ReplaceAll(s, metaspaceRune, " "))
		} else {
			m.decode[id] = tokenBytes(s)
		}
	}

	// pre_tokenizer and decoder (sentencepiece's: sentencepiece)
	if m.sp == nil {
		pre, err := parsePreTokenizer(file, doc.preTokenizer)
		if err != nil {
			return nil, err
		}
		m.pre = pre
		if err := checkDecoder(file, doc.decoder); err != nil {
			return nil, err
		}
	}

	// The special tokens: post_processor's template and tokenizer_config.json.
	tmpl, err := template(sc, doc.postProcessor)
	if err != nil {
		return nil, err
	}
	for _, id := range []int64{tmpl.bos, tmpl.eos} {
		if id > maxID {
			return nil, tokErr(file, "post_processor", "the special token id %d is not a token of the vocabulary", id)
		}
	}
	sp := SpecialTokens{BOS: int(tmpl.bos), EOS: int(tmpl.eos), Pad: -1}
	if conf != nil {
		// A token the config names by its content: an added token, else
		// one of the vocabulary.
		resolve := func(key, content string) (int, error) {
			if content == "" {
				return -1, nil
			}
			if i, ok := byContent[content]; ok {
				return int(doc.added[i].ID), nil
			}
			if id, ok := vocab[content]; ok {
				return int(id), nil
			}
			if id, ok := m.byBytes[content]; ok && m.sp == nil {
				return int(id), nil
			}
			return -1, tokErr(conf.file, key, "%.40q is not a token of %s", content, file)
		}
		for _, k := range []struct {
			key, content string
			dst          *int
		}{{"bos_token", conf.bos, &sp.BOS}, {"eos_token", conf.eos, &sp.EOS}, {"pad_token", conf.pad, &sp.Pad}} {
			id, err := resolve(k.key, k.content)
			if err != nil {
				return nil, err
			}
			if id >= 0 {
				*k.dst = id
			}
		}
	}
	// The document separator: the template's, else the BOS the config
	// names, else <|endoftext|>, else the EOS the config names.
	eot := int64(-1)
	for _, t := range doc.added {
		if t.Special && sc.text(t.Content) == "<|endoftext|>" {
			eot = t.ID
		}
	}
	sp.Separator = int(firstID(tmpl.sep, int64(sp.BOS), eot, int64(sp.EOS)))
	if sp.EOS < 0 {
		sp.EOS = int(eot)
	}

	h := sha256.New()
	h.Write(b)
	if conf != nil {
		h.Write([]byte{0}) // the config's bytes name its special tokens
		h.Write(conf.raw)
	}
	return &Tokenizer{
		name:    "tokenizer.json:" + hex.EncodeToString(h.Sum(nil)),
		vocab:   int(maxID + 1),
		sep:     sp.Separator,
		special: sp,
		bpe:     m,
	}, nil
}

// firstID returns the first of ids that is one (not negative), or -1.
func firstID(ids ...int64) int64 {
	for _, id := range ids {
		if id >= 0 {
			return id
		}
	}
	return -1
}

// sentencepiece returns what a sentencepiece-style BPE does around its
// model (metaspace.go) where doc's Metaspace pre-tokenizer, or its
// normalizer without a pre-tokenizer, make it one; nil for a byte-level
// BPE, which has no normalizer.
func sentencepiece(file string, doc *tokenizerDoc) (*metaspace, error) {
	sp := &metaspace{unk: -1}
	for i := range sp.byteIDs {
		sp.byteIDs[i] = -1
	}
	if !isNull(doc.preTokenizer) {
		key := "pre_tokenizer"
		st, err := decodeStep(file, key, doc.preTokenizer)
		if err != nil {
			return nil, err
		}
		if st.Type == "Sequence" && len(st.Pretokenizers) == 1 {
			key += ".pretokenizers[0]"
			if st, err = decodeStep(file, key, st.Pretokenizers[0]); err != nil {
				return nil, err
			}
		}
		if st.Type != "Metaspace" {
			if !isNull(doc.normalizer) { // a byte-level BPE's
				typ, err := stepType(file, "normalizer", doc.normalizer)
				if err != nil {
					return nil, err
				}
				return nil, tokErr(file, "normalizer.type", "%q is not supported: gptui reads byte-level tokenizers without a normalizer (null), as GPT-2's and Llama 3's are, and sentencepiece-style ones", typ)
			}
			return nil, nil
		}
		if err := parseMetaspace(file, key, st, sp); err != nil {
			return nil, err
		}
	} else if isNull(doc.normalizer) {
		return nil, nil // parsePreTokenizer says what is missing
	}
	if !isNull(doc.normalizer) {
		if err := parseNormalizer(file, doc.normalizer, sp); err != nil {
			return nil, err
		}
	}
	return sp, parseMetaspaceDecoder(file, doc.decoder, sp)
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

// templateTokens are the special tokens a post_processor's
// TemplateProcessing puts around a single sequence: the one before it
// (sep and bos), and the one after it (eos); -1 where it puts none.
type templateTokens struct{ sep, bos, eos int64 }

// template reads the post_processor section raw: ByteLevel,
// TemplateProcessing or a Sequence of them.
func template(sc *jscan, raw json.RawMessage) (templateTokens, error) {
	file := sc.file
	tt := templateTokens{-1, -1, -1}
	if isNull(raw) {
		return tt, nil
	}
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
			before, after, err := templateSides(file, key, st)
			if err != nil {
				return err
			}
			if len(before) > 1 {
				return tokErr(file, key+".single", "%d tokens before a document; gptui separates documents with one token", len(before))
			}
			if len(before) == 1 {
				tt.sep, tt.bos = before[0], before[0]
			}
			if len(after) == 1 {
				tt.eos = after[0]
			}
		}
		return nil
	}
	return tt, walk(raw, "post_processor")
}

// templateSides returns the ids of the special tokens that a
// TemplateProcessing puts before a single sequence ($A) and after it.
func templateSides(file, key string, st hfStep) (before, after []int64, err error) {
	seen := false
	for i, piece := range st.Single {
		var p struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
			Sequence *struct{} `json:"Sequence"`
		}
		if err := json.Unmarshal(piece, &p); err != nil {
			return nil, nil, jsonError(file, fmt.Sprintf("%s.single[%d]", key, i), nil, err)
		}
		if p.Sequence != nil {
			seen = true
			continue
		}
		if p.SpecialToken == nil {
			return nil, nil, tokErr(file, fmt.Sprintf("%s.single[%d]", key, i), "neither SpecialToken nor Sequence")
		}
		spec, ok := st.SpecialTokens[p.SpecialToken.ID]
		if !ok {
			return nil, nil, tokErr(file, key+".special_tokens", "no entry for %q", p.SpecialToken.ID)
		}
		if seen {
			after = append(after, spec.IDs...)
		} else {
			before = append(before, spec.IDs...)
		}
	}
	return before, after, nil
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
