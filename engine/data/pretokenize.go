package data

import (
	"unicode"
	"unicode/utf8"
)

// The split patterns a tokenizer.json may name, exactly as they are
// written there (JSON escapes decoded). Go's regexp lacks the lookahead
// (?!\S) both use, so each has a hand-written scanner below that gives the
// matches Hugging Face's tokenizers library (Oniguruma) gives.
const (
	// gpt2Pattern is GPT-2's split, the one a ByteLevel pre-tokenizer with
	// use_regex applies.
	gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	// llama3Pattern is Llama 3's (and tiktoken's cl100k_base) split.
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// qwen2Pattern is Llama 3's with one number a piece (Qwen2's).
	qwen2Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// splitter cuts s into the pieces a split pattern matches, calling emit
// for each in order. Both patterns match every character somewhere, so the
// pieces cover s exactly.
type splitter func(s string, emit func(piece string))

// splitterFor returns the scanner of a supported pattern, or nil.
func splitterFor(pattern string) splitter {
	switch pattern {
	case gpt2Pattern:
		return splitGPT2
	case llama3Pattern:
		return splitLlama3
	case qwen2Pattern:
		return splitQwen2
	}
	return nil
}

// Character classes. A byte that is not part of valid UTF-8 is classed as
// U+FFFD, the replacement character (a symbol: neither letter, number nor
// space), and stays one byte long, so a piece holds the input's bytes
// exactly and byte-level BPE round-trips invalid UTF-8.

// runeAt returns the rune at s[i] and its length in bytes.
func runeAt(s string, i int) (rune, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// isL is \p{L}.
func isL(r rune) bool {
	if r < utf8.RuneSelf {
		return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z'
	}
	return unicode.IsLetter(r)
}

// isN is \p{N}.
func isN(r rune) bool {
	if r < utf8.RuneSelf {
		return '0' <= r && r <= '9'
	}
	return unicode.IsNumber(r)
}

// isS is \s: Unicode's White_Space property, which is what Oniguruma's \s
// (tab to carriage return, NEL and the Z categories) amounts to.
func isS(r rune) bool { return unicode.IsSpace(r) }

// isOther is [^\s\p{L}\p{N}].
func isOther(r rune) bool { return !isS(r) && !isL(r) && !isN(r) }

// runOf returns the end of the longest run of characters from s[i] on for
// which in holds (i when there is none).
func runOf(s string, i int, in func(rune) bool) int {
	for i < len(s) {
		r, n := runeAt(s, i)
		if !in(r) {
			break
		}
		i += n
	}
	return i
}

// spaceRun matches \s+(?!\S)|\s+ at s[i], which holds a space character:
// the whitespace run, less its last character when a non-space follows the
// run and the run is longer than one character (the greedy \s+ gives one
// back so that the lookahead sees a space).
func spaceRun(s string, i int) int {
	end := runOf(s, i, isS)
	if end == len(s) {
		return end
	}
	_, last := utf8.DecodeLastRuneInString(s[i:end])
	if end-last > i {
		return end - last
	}
	return end
}

// contraction returns the length of GPT-2's contractions 's 't 're 've
// 'm 'll 'd at s[i] (0 if none). fold makes the letters case-insensitive
// as Llama 3's (?i:...) does under Unicode case folding, where ſ (U+017F,
// long s) folds to s.
func contraction(s string, i int, fold bool) int {
	if s[i] != '\'' || i+1 >= len(s) {
		return 0
	}
	at := func(j int, c byte) (int, bool) {
		if j >= len(s) {
			return 0, false
		}
		r, n := runeAt(s, j)
		if r == rune(c) || fold && (r == rune(c-'a'+'A') || c == 's' && r == 'ſ') {
			return n, true
		}
		return 0, false
	}
	for _, suf := range [...]string{"s", "t", "re", "ve", "m", "ll", "d"} {
		j := i + 1
		ok := true
		for k := 0; k < len(suf) && ok; k++ {
			var n int
			n, ok = at(j, suf[k])
			j += n
		}
		if ok {
			return j - i
		}
	}
	return 0
}

// splitGPT2 scans gpt2Pattern. At each position the first alternative
// that matches wins:
//
//	's|'t|'re|'ve|'m|'ll|'d   a contraction
//	 ?\p{L}+                  letters, with one leading space (U+0020) if any
//	 ?\p{N}+                  numbers, likewise
//	 ?[^\s\p{L}\p{N}]+        other characters, likewise
//	\s+(?!\S)                 spaces not followed by a non-space
//	\s+                       the last space before a word
func splitGPT2(s string, emit func(string)) {
	for i := 0; i < len(s); {
		end := gpt2Match(s, i)
		emit(s[i:end])
		i = end
	}
}

func gpt2Match(s string, i int) int {
	if n := contraction(s, i, false); n > 0 {
		return i + n
	}
	j := i
	if s[i] == ' ' && i+1 < len(s) {
		j = i + 1
	}
	r, _ := runeAt(s, j)
	switch {
	case isL(r):
		return runOf(s, j, isL)
	case isN(r):
		return runOf(s, j, isN)
	case isOther(r):
		return runOf(s, j, isOther)
	}
	// The optional space did not help: s[j] is a space. Retry at i.
	r, _ = runeAt(s, i)
	switch {
	case isL(r):
		return runOf(s, i, isL)
	case isN(r):
		return runOf(s, i, isN)
	case isOther(r):
		return runOf(s, i, isOther)
	}
	return spaceRun(s, i)
}

// splitLlama3 scans llama3Pattern. At each position the first alternative
// that matches wins:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)  a contraction, in any letter case
//	[^\r\n\p{L}\p{N}]?\p{L}+     letters, after at most one character that is
//	                             not a newline, letter or number
//	\p{N}{1,3}                   one to three numbers
//	 ?[^\s\p{L}\p{N}]+[\r\n]*    other characters with one leading space (U+0020)
//	                             if any, and the newlines that follow them
//	\s*[\r\n]+                   spaces up to and including the run's last newline
//	\s+(?!\S)                    spaces not followed by a non-space
//	\s+                          the last space before a word
func splitLlama3(s string, emit func(string)) {
	for i := 0; i < len(s); {
		end := llama3Match(s, i, 3)
		emit(s[i:end])
		i = end
	}
}

// splitQwen2 scans qwen2Pattern: splitLlama3's alternatives, with \p{N}
// (one number) for \p{N}{1,3}.
func splitQwen2(s string, emit func(string)) {
	for i := 0; i < len(s); {
		end := llama3Match(s, i, 1)
		emit(s[i:end])
		i = end
	}
}

func isNewline(r rune) bool { return r == '\r' || r == '\n' }

// llama3Match returns the end of the match at s[i], with at most digits
// numbers in a number piece.
func llama3Match(s string, i, digits int) int {
	if n := contraction(s, i, true); n > 0 {
		return i + n
	}
	r, n := runeAt(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if isL(r) {
		return runOf(s, i, isL)
	}
	if !isNewline(r) && !isN(r) && i+n < len(s) {
		if r2, _ := runeAt(s, i+n); isL(r2) {
			return runOf(s, i+n, isL)
		}
	}
	// \p{N}{1,3}
	if isN(r) {
		j := i
		for k := 0; k < digits && j < len(s); k++ {
			r, n := runeAt(s, j)
			if !isN(r) {
				break
			}
			j += n
		}
		return j
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n]*
	j := i
	if r == ' ' && i+1 < len(s) {
		if r2, _ := runeAt(s, i+1); isOther(r2) {
			j = i + 1
		}
	}
	if r2, _ := runeAt(s, j); isOther(r2) {
		return runOf(s, runOf(s, j, isOther), isNewline)
	}
	// s[i] is a space character. \s*[\r\n]+: the greedy \s* gives back
	// characters until a newline follows it, so the match ends after the
	// last newline of the whitespace run.
	end := runOf(s, i, isS)
	for k := end; k > i; {
		r, n := utf8.DecodeLastRuneInString(s[i:k])
		if isNewline(r) {
			return k
		}
		k -= n
	}
	return spaceRun(s, i)
}
