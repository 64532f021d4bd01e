package data

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"unicode/utf8"
)

// jscan reads the JSON of a tokenizer.json in place, value by value: the
// lists and tables that a file can make long — model.vocab, model.merges,
// added_tokens — are read entry by entry, each counted and checked as it
// is read, so that a hostile file is refused at the entry that is wrong
// or past the limit, holding no more than the entries before it. Their
// entries are read by hand (a string, an integer, an added token's few
// keys), which is some ten times faster than encoding/json's Decoder; the
// other values are cut out whole and given to encoding/json. Strings and
// numbers read as encoding/json reads them (escapes, invalid UTF-8 as
// U+FFFD), and malformed JSON is an error naming its line.
type jscan struct {
	file    string
	b       []byte
	i       int      // the next byte to read
	decoded []string // the strings of spans that are not the file's bytes
}

// span is a string of the file, held without a copy: the bytes b[lo:hi]
// of its content, or, for a string whose JSON decoding changes it
// (escapes, invalid UTF-8), decoded[-lo-1]. The entries of model.vocab
// and model.merges are held as spans until the tables are built, at 8
// bytes a string rather than a string's 16 and its own allocation.
type span struct{ lo, hi int32 }

// text is the string of sp.
func (s *jscan) text(sp span) string {
	if sp.lo < 0 {
		return s.decoded[-sp.lo-1]
	}
	return string(s.b[sp.lo:sp.hi])
}

// bytesOf is the bytes of sp's string, not to be changed.
func (s *jscan) bytesOf(sp span) []byte {
	if sp.lo < 0 {
		return []byte(s.decoded[-sp.lo-1])
	}
	return s.b[sp.lo:sp.hi]
}

// len is the length of sp's string.
func (s *jscan) len(sp span) int {
	if sp.lo < 0 {
		return len(s.decoded[-sp.lo-1])
	}
	return int(sp.hi - sp.lo)
}

// spanOf is the span of the decoded string v.
func (s *jscan) spanOf(v string) span {
	s.decoded = append(s.decoded, v)
	return span{lo: int32(-len(s.decoded))}
}

// grow makes room in x for one more element, doubling its capacity when it
// is full (append grows large slices by a quarter, leaving four times
// their size behind as garbage while they grow).
func grow[T any](x []T) []T {
	if len(x) == cap(x) {
		return slices.Grow(x, max(len(x), 64))
	}
	return x
}

// line is the line of byte at.
func (s *jscan) line(at int) int { return 1 + bytes.Count(s.b[:min(at, len(s.b))], []byte("\n")) }

// syntax is the error of malformed JSON at byte at.
func (s *jscan) syntax(at int, err error) error {
	return &FormatError{File: s.file, Line: s.line(at), Msg: "invalid JSON", Err: err}
}

// unexpected is the error for the byte at s.i (or the end of the file),
// which is not what, ("looking for beginning of value"), belongs there.
func (s *jscan) unexpected(what string) error {
	if s.i >= len(s.b) {
		return s.syntax(s.i, io.ErrUnexpectedEOF)
	}
	return s.syntax(s.i, fmt.Errorf("invalid character %q %s", s.b[s.i], what))
}

// ws skips white space.
func (s *jscan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek skips white space and returns the next byte, 0 at the end.
func (s *jscan) peek() byte {
	s.ws()
	if s.i >= len(s.b) {
		return 0
	}
	return s.b[s.i]
}

// isEnd reports whether c ends a number or literal.
func isEnd(c byte) bool {
	switch c {
	case ',', '}', ']', ':', ' ', '\t', '\n', '\r', '"', '{', '[':
		return true
	}
	return false
}

// word returns the number or literal at s.i, unread.
func (s *jscan) word() []byte {
	j := s.i
	for j < len(s.b) && !isEnd(s.b[j]) {
		j++
	}
	return s.b[s.i:j]
}

// kind says what the value at s.i is, as encoding/json's type errors do
// ("number 2.5", "array"), or returns the syntax error there.
func (s *jscan) kind() (string, error) {
	switch c := s.peek(); c {
	case '{':
		return "object", nil
	case '[':
		return "array", nil
	case '"':
		return "string", nil
	}
	w := s.word()
	switch {
	case string(w) == "true", string(w) == "false":
		return "bool", nil
	case string(w) == "null":
		return "null", nil
	case len(w) > 0 && json.Valid(w) && (w[0] == '-' || '0' <= w[0] && w[0] <= '9'):
		return "number " + string(w), nil
	}
	return "", s.unexpected("looking for beginning of value")
}

// typeError is a value of another type than the one that belongs where
// it is; the caller names the key (keyed), which it spells out only then.
type typeError struct{ msg string }

func (e *typeError) Error() string { return e.msg }

// mismatch is the error for the value at s.i, of another type than want
// ("an object").
func (s *jscan) mismatch(want string) error {
	k, err := s.kind()
	if err != nil {
		return err
	}
	return &typeError{k + " where " + want + " belongs"}
}

// keyed is err, a typeError made a *FormatError naming key.
func (s *jscan) keyed(err error, key string) error {
	if te, ok := err.(*typeError); ok {
		return tokErr(s.file, key, "%s", te.msg)
	}
	return err
}

// null reads a null if one is next.
func (s *jscan) null() bool {
	if s.peek() == 'n' && string(s.word()) == "null" {
		s.i += 4
		return true
	}
	return false
}

// open reads the start of the object or list (delim '{' or '[') at key:
// true, or false for null; another value is an error saying what belongs.
func (s *jscan) open(key string, delim byte) (bool, error) {
	if s.null() {
		return false, nil
	}
	if s.peek() == delim {
		s.i++
		return true, nil
	}
	if delim == '{' {
		return false, s.keyed(s.mismatch("an object"), key)
	}
	return false, s.keyed(s.mismatch("a list"), key)
}

// more reports whether the object or list (closed by end) that the
// caller has read n entries of has another, reading the comma before it,
// or reads its end.
func (s *jscan) more(end byte, n int) (bool, error) {
	switch c := s.peek(); {
	case c == end:
		s.i++
		return false, nil
	case n == 0:
		return true, nil
	case c == ',':
		s.i++
		return true, nil
	}
	if end == '}' {
		return false, s.unexpected("after object key:value pair")
	}
	return false, s.unexpected("after array element")
}

// rawKey reads the key of an object's next entry and the colon after it,
// as bytes not to be kept or changed: no allocation for a plain key.
func (s *jscan) rawKey() ([]byte, error) {
	if s.peek() != '"' {
		return nil, s.unexpected("looking for beginning of object key string")
	}
	sp, err := s.strSpan()
	if err != nil {
		return nil, err
	}
	if s.peek() != ':' {
		return nil, s.unexpected("after object key")
	}
	s.i++
	return s.bytesOf(sp), nil
}

// key reads the key of an object's next entry and the colon after it. A
// key given twice in seen (if not nil) is an error naming it with prefix
// ("" or "model."), as in Hugging Face's reader.
func (s *jscan) key(seen map[string]bool, prefix string) (string, error) {
	kb, err := s.rawKey()
	if err != nil {
		return "", err
	}
	k := string(kb)
	if seen[k] {
		return "", tokErr(s.file, prefix+k, "given twice")
	}
	seen[k] = true
	return k, nil
}

// str reads the string at s.i (its opening quote).
func (s *jscan) str() (string, error) {
	sp, err := s.strSpan()
	if err != nil {
		return "", err
	}
	return s.text(sp), nil
}

// strSpan reads the string at s.i (its opening quote) as a span: the
// file's bytes when JSON decoding leaves them as they are.
func (s *jscan) strSpan() (span, error) {
	start := s.i
	s.i++
	plain := true // no escapes, valid UTF-8
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			if plain {
				return span{int32(start + 1), int32(s.i - 1)}, nil
			}
			var v string
			if err := json.Unmarshal(s.b[start:s.i], &v); err != nil {
				var se *json.SyntaxError
				if errors.As(err, &se) {
					return span{}, s.syntax(start+int(se.Offset), err)
				}
				return span{}, s.syntax(start, err)
			}
			return s.spanOf(v), nil
		case c == '\\':
			plain = false
			s.i += 2
		case c < 0x20:
			return span{}, s.unexpected("in string literal")
		case c >= utf8.RuneSelf:
			r, n := utf8.DecodeRune(s.b[s.i:])
			if r == utf8.RuneError && n == 1 {
				plain = false // encoding/json makes it U+FFFD
			}
			s.i += n
		default:
			s.i++
		}
	}
	return span{}, s.syntax(len(s.b), io.ErrUnexpectedEOF)
}

// int reads an integer (another value: a typeError).
func (s *jscan) int() (int64, error) {
	if c := s.peek(); c != '-' && (c < '0' || c > '9') {
		return 0, s.mismatch("an integer")
	}
	w := s.word()
	// JSON's integers: -?(0|[1-9][0-9]*).
	d := w
	if len(d) > 0 && d[0] == '-' {
		d = d[1:]
	}
	integer := len(d) > 0 && len(d) <= 18 && (d[0] != '0' || len(d) == 1) // 18 digits: no overflow
	var n int64
	for _, c := range d {
		integer = integer && '0' <= c && c <= '9'
		n = 10*n + int64(c-'0')
	}
	if integer {
		s.i += len(w)
		if w[0] == '-' {
			n = -n
		}
		return n, nil
	}
	if n, err := strconv.ParseInt(string(w), 10, 64); err == nil && json.Valid(w) {
		s.i += len(w) // 19 digits
		return n, nil
	}
	if !json.Valid(w) {
		return 0, s.unexpected("in numeric literal")
	}
	return 0, &typeError{"number " + string(w) + " where an integer belongs"}
}

// bool reads true or false (another value: a typeError).
func (s *jscan) bool() (bool, error) {
	s.ws()
	switch string(s.word()) {
	case "true":
		s.i += 4
		return true, nil
	case "false":
		s.i += 5
		return false, nil
	}
	return false, s.mismatch("true or false")
}

// raw reads the next value whole, checked to be valid JSON.
func (s *jscan) raw() (json.RawMessage, error) {
	c := s.peek()
	start := s.i
	switch c {
	case '"':
		if _, err := s.strSpan(); err != nil {
			return nil, err
		}
		return s.b[start:s.i], nil
	case '{', '[':
		depth := 0
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case '"':
				// Its end: the next quote not escaped.
				for s.i++; s.i < len(s.b) && s.b[s.i] != '"'; s.i++ {
					if s.b[s.i] == '\\' {
						s.i++
					}
				}
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			s.i++
			if depth == 0 {
				break
			}
		}
		if depth != 0 {
			return nil, s.syntax(len(s.b), io.ErrUnexpectedEOF)
		}
	default:
		w := s.word()
		if len(w) == 0 {
			return nil, s.unexpected("looking for beginning of value")
		}
		s.i += len(w)
	}
	v := s.b[start:s.i]
	if !json.Valid(v) {
		var x any
		err := json.Unmarshal(v, &x)
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, s.syntax(start+int(se.Offset), err)
		}
		return nil, s.syntax(start, err)
	}
	return v, nil
}

// decode reads the next value into v with encoding/json, a value of
// another type an error naming key.
func (s *jscan) decode(key string, v any) error {
	raw, err := s.raw()
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return jsonError(s.file, key, nil, err)
	}
	return nil
}

// section reads the raw section at key, of at most maxSectionBytes.
func (s *jscan) section(key string) (json.RawMessage, error) {
	r, err := s.raw()
	if err != nil {
		return nil, err
	}
	if len(r) > maxSectionBytes {
		return nil, tokErr(s.file, key, "%d bytes, more than the %d a %s has room for; %s", len(r), maxSectionBytes, key, tokenizerHint)
	}
	return r, nil
}

// readDoc reads the whole of a tokenizer.json.
func (s *jscan) readDoc() (*tokenizerDoc, error) {
	doc := &tokenizerDoc{}
	ok, err := s.open("the file", '{')
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for n := 0; ok; n++ {
		if ok, err = s.more('}', n); err != nil || !ok {
			break
		}
		var key string
		if key, err = s.key(seen, ""); err != nil {
			break
		}
		switch key {
		case "added_tokens":
			doc.added, err = s.addedTokens()
		case "model":
			doc.model, err = s.model()
		case "normalizer":
			doc.normalizer, err = s.section(key)
		case "pre_tokenizer":
			doc.preTokenizer, err = s.section(key)
		case "post_processor":
			doc.postProcessor, err = s.section(key)
		case "decoder":
			doc.decoder, err = s.section(key)
		default:
			_, err = s.raw()
		}
		if err != nil {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	if s.ws(); s.i < len(s.b) {
		return nil, s.unexpected("after top-level value")
	}
	return doc, nil
}

// addedTokens reads added_tokens, refusing at once an entry without an id
// or with an empty or overlong content, and the entry past maxVocab.
func (s *jscan) addedTokens() ([]hfAddedToken, error) {
	const key = "added_tokens"
	ok, err := s.open(key, '[')
	if err != nil || !ok {
		return nil, err
	}
	var added []hfAddedToken
	for i := 0; ; i++ {
		if ok, err := s.more(']', i); err != nil || !ok {
			return added, err
		}
		if i == maxVocab {
			return nil, tokErr(s.file, key, "more than %d added tokens", maxVocab)
		}
		k := func() string { return fmt.Sprintf("%s[%d]", key, i) }
		t, field, err := s.addedToken()
		if err != nil {
			return nil, s.keyed(err, k()+field)
		}
		if !t.HasID {
			return nil, tokErr(s.file, k()+".id", "missing")
		}
		if n := s.len(t.Content); n == 0 || n > maxTokenBytes {
			return nil, tokErr(s.file, k()+".content", "a token of %d bytes (the limit is %d, and tokens are not empty)", n, maxTokenBytes)
		}
		added = append(grow(added), t)
	}
}

// addedToken reads an entry of added_tokens; an error is about its key
// field ("", ".id").
func (s *jscan) addedToken() (t hfAddedToken, field string, err error) {
	if s.null() {
		return t, "", nil
	}
	if s.peek() != '{' {
		return t, "", s.mismatch("an object")
	}
	s.i++
	for n := 0; ; n++ {
		if ok, err := s.more('}', n); err != nil || !ok {
			return t, "", err
		}
		kb, err := s.rawKey()
		if err != nil {
			return t, "", err
		}
		// As encoding/json reads them: null leaves a value unset, and a
		// key given twice takes its last value.
		if s.null() {
			switch string(kb) {
			case "id":
				t.HasID = false
			case "normalized":
				t.HasNormalized = false
			}
			continue
		}
		var b *bool
		switch string(kb) {
		case "id":
			t.ID, err = s.int()
			t.HasID = true
		case "content":
			if s.peek() != '"' {
				err = s.mismatch("a string")
				break
			}
			t.Content, err = s.strSpan()
		case "special":
			b = &t.Special
		case "single_word":
			b = &t.SingleWord
		case "lstrip":
			b = &t.LStrip
		case "rstrip":
			b = &t.RStrip
		case "normalized":
			t.HasNormalized = true
			b = &t.Normalized
		default:
			_, err = s.raw()
		}
		if b != nil {
			*b, err = s.bool()
		}
		if err != nil {
			return t, "." + string(kb), err
		}
	}
}

// model reads the model section (nil for null).
func (s *jscan) model() (*modelDoc, error) {
	ok, err := s.open("model", '{')
	if err != nil || !ok {
		return nil, err
	}
	m := &modelDoc{}
	seen := map[string]bool{}
	for n := 0; ; n++ {
		if ok, err := s.more('}', n); err != nil || !ok {
			return m, err
		}
		key, err := s.key(seen, "model.")
		if err != nil {
			return nil, err
		}
		k := "model." + key
		switch key {
		case "type":
			err = s.decode(k, &m.typ)
		case "vocab", "merges":
			err = s.table(m, key)
		case "ignore_merges":
			err = s.decode(k, &m.ignoreMerges)
		case "dropout":
			err = s.decode(k, &m.dropout)
		case "continuing_subword_prefix":
			err = s.decode(k, &m.prefix)
		case "end_of_word_suffix":
			err = s.decode(k, &m.suffix)
		case "byte_fallback":
			err = s.decode(k, &m.byteFallback)
		case "unk_token":
			err = s.decode(k, &m.unk)
		case "fuse_unk":
			err = s.decode(k, &m.fuseUnk)
		default:
			_, err = s.raw()
		}
		if err != nil {
			return nil, err
		}
	}
}

// table reads model.vocab or model.merges (key). What is wrong with them
// matters only for a BPE model: a table read once the model's type is
// known to be another is skipped, and the error of one read before is
// kept (m.err) until the type is known, the table skipped.
func (s *jscan) table(m *modelDoc, key string) error {
	start := s.i
	if m.typ == nil || *m.typ == "BPE" {
		var err error
		if key == "vocab" {
			err = s.vocab(m)
		} else {
			err = s.merges(m)
		}
		var fe *FormatError
		if err == nil || m.typ != nil || !errors.As(err, &fe) || fe.Line > 0 { // a syntax error is the file's
			return err
		}
		m.err = cmp.Or(m.err, err)
		s.i = start
	}
	_, err := s.raw()
	return err
}

// vocab reads model.vocab, an object of token strings and integer ids,
// refusing the entry past maxVocab.
func (s *jscan) vocab(m *modelDoc) error {
	const key = "model.vocab"
	ok, err := s.open(key, '{')
	if err != nil || !ok {
		return err
	}
	for n := 0; ; n++ {
		if ok, err := s.more('}', n); err != nil || !ok {
			return err
		}
		if len(m.vocab) == maxVocab {
			return tokErr(s.file, key, "more than %d entries", maxVocab)
		}
		if s.peek() != '"' {
			return s.unexpected("looking for beginning of object key string")
		}
		tok, err := s.strSpan()
		if err != nil {
			return err
		}
		if s.peek() != ':' {
			return s.unexpected("after object key")
		}
		s.i++
		id, err := s.int()
		if err != nil {
			return s.keyed(err, key)
		}
		m.vocab = append(grow(m.vocab), vocabEntry{tok, id})
		m.vocabBytes += int64(s.len(tok))
	}
}

// merges reads model.merges, refusing at once a merge that is neither "a
// b" nor ["a", "b"], and the merge past maxVocab.
func (s *jscan) merges(m *modelDoc) error {
	const key = "model.merges"
	ok, err := s.open(key, '[')
	if err != nil || !ok {
		return err
	}
	for i := 0; ; i++ {
		if ok, err := s.more(']', i); err != nil || !ok {
			return err
		}
		if i == maxVocab {
			return tokErr(s.file, key, "more than %d merges", maxVocab)
		}
		a, b, err := s.merge(func() string { return fmt.Sprintf("%s[%d]", key, i) })
		if err != nil {
			return err
		}
		m.merges = append(grow(m.merges), [2]span{a, b})
	}
}

// merge reads a merge written as "a b" or as ["a", "b"]; key names it.
func (s *jscan) merge(key func() string) (span, span, error) {
	neither := func(what string) (span, span, error) {
		return span{}, span{}, tokErr(s.file, key(), "%.40s is neither \"a b\" nor [\"a\", \"b\"]", what)
	}
	switch s.peek() {
	case '"':
		sp, err := s.strSpan()
		if err != nil {
			return span{}, span{}, err
		}
		v := s.bytesOf(sp)
		cut := bytes.IndexByte(v, ' ')
		if cut < 0 || bytes.IndexByte(v[cut+1:], ' ') >= 0 {
			return span{}, span{}, tokErr(s.file, key(), "%.40q is not two tokens separated by one space", v)
		}
		if sp.lo >= 0 {
			return span{sp.lo, sp.lo + int32(cut)}, span{sp.lo + int32(cut) + 1, sp.hi}, nil
		}
		return s.spanOf(string(v[:cut])), s.spanOf(string(v[cut+1:])), nil
	case '[':
		s.i++
		var p [2]span
		for n := 0; ; n++ {
			ok, err := s.more(']', n)
			if err != nil {
				return span{}, span{}, err
			}
			if !ok && n == 2 {
				return p[0], p[1], nil
			}
			if !ok || n == 2 || s.peek() != '"' {
				return neither("a list of other than two strings")
			}
			if p[n], err = s.strSpan(); err != nil {
				return span{}, span{}, err
			}
		}
	}
	k, err := s.kind()
	if err != nil {
		return span{}, span{}, err
	}
	return neither(k)
}
