package data

import (
	"bytes"
	"unicode"
	"unicode/utf8"
)

// byteLevel is GPT-2's printable alias of every byte, the alphabet a
// byte-level BPE vocabulary is written in: the bytes '!'..'~', '¡'..'¬'
// and '®'..'ÿ' stand for themselves, and the other 68 bytes, in order, for
// U+0100 onwards (so ' ' is 'Ġ' and '\n' is 'Ċ').
var byteLevel, byteLevelInv = func() (enc [256]rune, dec map[rune]byte) {
	dec = make(map[rune]byte, 256)
	n := rune(0)
	for b := range 256 {
		if '!' <= b && b <= '~' || 0xA1 <= b && b <= 0xAC || 0xAE <= b && b <= 0xFF {
			enc[b] = rune(b)
		} else {
			enc[b] = 256 + n
			n++
		}
		dec[enc[b]] = byte(b)
	}
	return enc, dec
}()

// byteLevelDecode returns the bytes a token string of a byte-level
// vocabulary stands for, and whether every character of s is a byte alias.
func byteLevelDecode(s string) ([]byte, bool) {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		b, ok := byteLevelInv[r]
		if !ok {
			return nil, false
		}
		out = append(out, b)
	}
	return out, true
}

// merge is one rule of a BPE model: the pair it applies to becomes token
// id; rules with lower ranks apply first.
type merge struct {
	rank uint32
	id   uint32
}

// pairKey is the key of the merge map for the adjacent tokens a, b.
func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

// bpeModel is a byte-level BPE model, or a sentencepiece-style one (sp):
// vocabulary, merges and the steps that a Hugging Face tokenizer.json
// puts around it (added tokens, the normalizer and the pre-tokenizer). It
// is read-only after loading, so one model serves any number of
// goroutines.
type bpeModel struct {
	byteID       [256]uint32       // the token of each single byte (byte-level)
	byBytes      map[string]uint32 // the model vocabulary, keyed by the bytes a token stands for (sp: its string)
	merges       map[uint64]merge  // pairKey(a, b) → merge
	ignoreMerges bool              // a piece that is a whole token is that token
	decode       [][]byte          // id → bytes (nil: an id with no token)
	pre          []preStep         // the pre-tokenizer's steps, in order (byte-level)
	added        addedTokens
	sp           *metaspace // nil for byte-level BPE
}

// preStep is one step of the pre-tokenizer: a split by a known pattern,
// or ByteLevel (optionally a space in front of each piece, then GPT-2's
// split if useRegex).
type preStep struct {
	split          splitter // nil for ByteLevel
	addPrefixSpace bool
	useRegex       bool
}

// encode appends the tokens of text to ids. With special, added tokens
// marked special are recognised in the text; without, they are not, and
// their text is tokenized like any other (HF's encode_special_tokens).
func (m *bpeModel) encode(ids []int, text string, special bool) []int {
	var w bpeWork
	if m.sp == nil {
		m.added.split(text, special, func(seg string, id int) {
			if id >= 0 {
				ids = append(ids, id)
				return
			}
			ids = m.pretokenize(ids, seg, 0, &w)
		})
		return ids
	}
	// As HF's AddedVocabulary: the tokens not marked normalized found in
	// the text, the normalizer run on each piece between them, and those
	// marked normalized found in its result.
	at := 0 // the bytes of text before seg
	m.added.stages[0].split(text, special, func(seg string, id int) {
		first := at == 0
		at += len(seg)
		if id >= 0 {
			ids = append(ids, id)
			return
		}
		k := 0
		m.added.stages[1].split(m.sp.normalize(seg), special, func(piece string, id int) {
			first := first && k == 0
			k += len(piece)
			if id >= 0 {
				ids = append(ids, id)
				return
			}
			m.sp.pretokenize(piece, first, func(word string) { ids = m.bpe(ids, word, &w) })
		})
	})
	return ids
}

// pretokenize runs step i of the pre-tokenizer over piece and BPE over
// what comes out of the last step. Empty pieces are dropped, as HF does.
func (m *bpeModel) pretokenize(ids []int, piece string, i int, w *bpeWork) []int {
	if piece == "" {
		return ids
	}
	if i == len(m.pre) {
		return m.bpe(ids, piece, w)
	}
	st := &m.pre[i]
	split := st.split
	if split == nil { // ByteLevel
		if st.addPrefixSpace && piece[0] != ' ' {
			piece = " " + piece
		}
		if !st.useRegex {
			return m.pretokenize(ids, piece, i+1, w)
		}
		split = splitGPT2
	}
	split(piece, func(p string) { ids = m.pretokenize(ids, p, i+1, w) })
	return ids
}

// bpeWork is scratch space for bpe, reused across the pieces of a text.
type bpeWork struct {
	sym  []symbol
	heap []candidate
}

// symbol is a token of a piece being merged, in a doubly linked list
// over the piece's bytes; a symbol merged into its left neighbour has
// gone (len 0).
type symbol struct {
	id         uint32
	prev, next int32
	len        int32
}

// candidate is a merge that may apply at pos, ordered by rank then by
// position: the lowest rank first, the leftmost of equal ranks first.
type candidate struct {
	rank uint32
	pos  int32
	id   uint32
}

func (a candidate) less(b candidate) bool {
	return a.rank < b.rank || a.rank == b.rank && a.pos < b.pos
}

// bpe appends the tokens of one pre-tokenized piece. It starts from one
// token per byte (sentencepiece-style: per character, spSymbols) and
// applies merges lowest rank first (the leftmost of equal ranks first)
// until none applies, as HF's BPE model does; a heap of candidate merges
// keeps a long piece O(n log n).
func (m *bpeModel) bpe(ids []int, piece string, w *bpeWork) []int {
	if m.ignoreMerges {
		if id, ok := m.byBytes[piece]; ok {
			return append(ids, int(id))
		}
	}
	sym := w.sym[:0]
	if m.sp != nil {
		sym = m.spSymbols(sym, piece)
	} else {
		if len(piece) == 1 {
			return append(ids, int(m.byteID[piece[0]]))
		}
		for i := range len(piece) {
			sym = append(sym, symbol{id: m.byteID[piece[i]], len: 1})
		}
	}
	if len(sym) == 0 {
		return ids
	}
	for i := range sym {
		sym[i].prev, sym[i].next = int32(i-1), int32(i+1)
	}
	sym[len(sym)-1].next = -1
	h := w.heap[:0]
	for i := 0; i+1 < len(sym); i++ {
		if mg, ok := m.merges[pairKey(sym[i].id, sym[i+1].id)]; ok {
			h = heapPush(h, candidate{mg.rank, int32(i), mg.id})
		}
	}
	for len(h) > 0 {
		var c candidate
		c, h = heapPop(h)
		s := &sym[c.pos]
		if s.len == 0 || s.next < 0 {
			continue
		}
		right := sym[s.next]
		// A candidate pushed before a neighbour changed is stale unless
		// the pair now there still makes the same token.
		if mg, ok := m.merges[pairKey(s.id, right.id)]; !ok || mg.id != c.id {
			continue
		}
		s.id = c.id
		s.len += right.len
		sym[s.next].len = 0
		s.next = right.next
		if right.next >= 0 {
			sym[right.next].prev = c.pos
		}
		if s.prev >= 0 {
			if mg, ok := m.merges[pairKey(sym[s.prev].id, s.id)]; ok {
				h = heapPush(h, candidate{mg.rank, s.prev, mg.id})
			}
		}
		if s.next >= 0 {
			if mg, ok := m.merges[pairKey(s.id, sym[s.next].id)]; ok {
				h = heapPush(h, candidate{mg.rank, c.pos, mg.id})
			}
		}
	}
	for i := int32(0); i >= 0; i = sym[i].next {
		ids = append(ids, int(sym[i].id))
	}
	w.sym, w.heap = sym, h
	return ids
}

// heapPush adds c to the binary min-heap h.
func heapPush(h []candidate, c candidate) []candidate {
	h = append(h, c)
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !h[i].less(h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	return h
}

// heapPop removes and returns the least candidate of the non-empty h.
func heapPop(h []candidate) (candidate, []candidate) {
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	for i := 0; ; {
		l, least := 2*i+1, i
		if l < n && h[l].less(h[least]) {
			least = l
		}
		if r := l + 1; r < n && h[r].less(h[least]) {
			least = r
		}
		if least == i {
			break
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
	return top, h
}

// decodeTo appends the bytes of ids to dst; ids with no token add nothing.
// A sentencepiece-style decoder drops the space in front of the text:
// one (Strip), or every space of the first token (Metaspace).
func (m *bpeModel) decodeTo(dst []byte, ids []int) []byte {
	start, first := len(dst), true
	for _, id := range ids {
		if id < 0 || id >= len(m.decode) || m.decode[id] == nil {
			continue
		}
		b := m.decode[id]
		if first && m.sp != nil && m.sp.stripFirst {
			b = bytes.ReplaceAll(b, []byte(" "), nil)
		}
		first = false
		dst = append(dst, b...)
	}
	if m.sp != nil && m.sp.strip && len(dst) > start && dst[start] == ' ' {
		dst = append(dst[:start], dst[start+1:]...)
	}
	return dst
}

// addedToken is a token of tokenizer.json's added_tokens, matched in the
// text before the pre-tokenizer runs.
type addedToken struct {
	id         int
	content    string
	special    bool // recognised only when encoding with special tokens
	singleWord bool // only where no word character touches it
	lstrip     bool // takes the whitespace on its left
	rstrip     bool // takes the whitespace on its right
}

// addedTokens finds added tokens as HF's AddedVocabulary does: first the
// tokens not marked normalized, in the whole text, then those marked
// normalized, in the gaps (with no normalizer the text is the same).
// Each pass takes, from left to right, the leftmost match and of those
// the longest, and goes on after it.
type addedTokens struct {
	stages [2]trie
}

// trie matches a set of byte strings.
type trie struct {
	tokens []addedToken
	first  [256]bool        // bytes that begin some token
	edges  map[uint64]int32 // node<<8 | byte → child node; the root is 0
	term   map[int32]int32  // node → index in tokens of the token ending there
}

func (t *trie) add(tok addedToken) {
	if t.edges == nil {
		t.edges, t.term = map[uint64]int32{}, map[int32]int32{}
	}
	node := int32(0)
	for i := range len(tok.content) {
		k := uint64(node)<<8 | uint64(tok.content[i])
		child, ok := t.edges[k]
		if !ok {
			child = int32(len(t.edges) + 1)
			t.edges[k] = child
		}
		node = child
	}
	t.first[tok.content[0]] = true
	t.term[node] = int32(len(t.tokens))
	t.tokens = append(t.tokens, tok)
}

// longest returns the index of the longest token that s begins with, or -1.
func (t *trie) longest(s string) int {
	best, node := -1, int32(0)
	for i := range len(s) {
		child, ok := t.edges[uint64(node)<<8|uint64(s[i])]
		if !ok {
			break
		}
		node = child
		if k, ok := t.term[node]; ok {
			best = int(k)
		}
	}
	return best
}

// split calls emit for the pieces of text in order: an added token with
// its id, or text between them with id -1.
func (a *addedTokens) split(text string, special bool, emit func(seg string, id int)) {
	a.stages[0].split(text, special, func(seg string, id int) {
		if id >= 0 {
			emit(seg, id)
			return
		}
		a.stages[1].split(seg, special, emit)
	})
}

// split is one pass of addedTokens.split over text.
func (t *trie) split(text string, special bool, emit func(seg string, id int)) {
	if len(t.tokens) == 0 {
		emit(text, -1)
		return
	}
	done := 0 // text[:done] has been emitted
	for i := 0; i < len(text); {
		if !t.first[text[i]] {
			i++
			continue
		}
		k := t.longest(text[i:])
		if k < 0 {
			i++
			continue
		}
		tok := &t.tokens[k]
		start, stop := i, i+len(tok.content)
		i = stop // a discarded match is not searched again, as in HF
		if tok.special && !special {
			continue
		}
		if tok.singleWord && (start > 0 && endsWithWord(text[:start]) || stop < len(text) && startsWithWord(text[stop:])) {
			continue
		}
		if tok.lstrip {
			start = max(len(trimRightSpace(text[:start])), done)
		}
		if tok.rstrip {
			stop = len(text) - len(trimLeftSpace(text[stop:]))
			i = stop
		}
		if done < start {
			emit(text[done:start], -1)
		}
		emit(text[start:stop], tok.id)
		done = stop
	}
	if done < len(text) {
		emit(text[done:], -1)
	}
}

// isWord is the \w of Rust's regex crate: alphabetic, mark, decimal digit,
// connector punctuation or join control.
func isWord(r rune) bool {
	return unicode.IsLetter(r) || unicode.In(r, unicode.Other_Alphabetic, unicode.Nl, unicode.M, unicode.Nd, unicode.Pc, unicode.Join_Control)
}

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return isWord(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return isWord(r)
}

func trimRightSpace(s string) string {
	for len(s) > 0 {
		r, n := utf8.DecodeLastRuneInString(s)
		if !unicode.IsSpace(r) {
			break
		}
		s = s[:len(s)-n]
	}
	return s
}

func trimLeftSpace(s string) string {
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		if !unicode.IsSpace(r) {
			break
		}
		s = s[n:]
	}
	return s
}
