package data

import (
	"slices"
	"strings"
	"testing"
)

// TestSplitPatterns checks the hand-written scanners against splits
// derived by hand from the published patterns' semantics: an alternation
// whose first matching alternative wins at each position, greedy
// quantifiers that give back characters when what follows fails, and
// (?!\S) that holds before a space or at the end. The derivation of each
// is in its comment. (They were also checked against Oniguruma, the
// regex engine of Hugging Face's tokenizers library.)
func TestSplitPatterns(t *testing.T) {
	for _, c := range []struct {
		in           string
		llama3, gpt2 []string
		why          string
	}{
		{"Hello world", []string{"Hello", " world"}, []string{"Hello", " world"},
			"letters; a space joins the word after it"},
		{"I'm", []string{"I", "'m"}, []string{"I", "'m"},
			"the contraction alternative comes first"},
		{"I'M", []string{"I", "'M"}, []string{"I", "'", "M"},
			"Llama 3's contractions are (?i:...); GPT-2's are lower case only, so ' is punctuation"},
		{"'ſ", []string{"'ſ"}, []string{"'", "ſ"},
			"under Unicode case folding ſ (long s) is s"},
		{"don't", []string{"don", "'t"}, []string{"don", "'t"}, ""},
		{"12345", []string{"123", "45"}, []string{"12345"},
			`Llama 3 takes \p{N}{1,3}, GPT-2 \p{N}+`},
		{" 123", []string{" ", "123"}, []string{" 123"},
			`Llama 3's numbers take no space, so \s+ takes it; GPT-2's take one`},
		{"a  b", []string{"a", " ", " b"}, []string{"a", " ", " b"},
			`\s+(?!\S) gives back the last space, which joins the word`},
		{"a\n\nb", []string{"a", "\n\n", "b"}, []string{"a", "\n", "\n", "b"},
			`Llama 3: \s*[\r\n]+ takes the newlines; GPT-2: \s+(?!\S) gives back one, then \s+ takes it`},
		{"hi!!\n\nyo", []string{"hi", "!!\n\n", "yo"}, []string{"hi", "!!", "\n", "\n", "yo"},
			"Llama 3's punctuation takes the newlines after it"},
		{"x  \n  y", []string{"x", "  \n", " ", " y"}, []string{"x", "  \n ", " y"},
			`Llama 3: \s*[\r\n]+ ends at the run's last newline; GPT-2: \s+(?!\S) keeps all but the last space`},
		{"\tfoo", []string{"\tfoo"}, []string{"\t", "foo"},
			`Llama 3's letters take one leading non-newline non-letter; GPT-2's only a space`},
		{"...hello", []string{"...", "hello"}, []string{"...", "hello"},
			"a run of punctuation comes before the letters alternative can start inside it"},
		{".hello", []string{".hello"}, []string{".", "hello"},
			"Llama 3's letters take one leading punctuation mark"},
		{"3.14", []string{"3", ".", "14"}, []string{"3", ".", "14"}, ""},
		{"a\r\nb", []string{"a", "\r\n", "b"}, []string{"a", "\r", "\n", "b"}, ""},
		{"  ", []string{"  "}, []string{"  "}, "(?!\\S) holds at the end"},
		{"e\u0301", []string{"e", "\u0301"}, []string{"e", "\u0301"},
			"a combining mark is neither letter, number nor space"},
		{"a\u00a0b", []string{"a", "\u00a0b"}, []string{"a", "\u00a0", "b"},
			"no-break space is \\s; Llama 3's letters take it in front, GPT-2's optional space is U+0020 only"},
		{"a\xffb", []string{"a", "\xffb"}, []string{"a", "\xff", "b"},
			"an invalid byte is classed as U+FFFD, a symbol, and kept as it is"},
		{"<|begin_of_text|>Hi", []string{"<|", "begin", "_of", "_text", "|>", "Hi"}, []string{"<|", "begin", "_", "of", "_", "text", "|>", "Hi"},
			"special tokens' text is ordinary text to the pre-tokenizer"},
	} {
		for _, p := range []struct {
			name  string
			split splitter
			want  []string
		}{{"llama3", splitLlama3, c.llama3}, {"gpt2", splitGPT2, c.gpt2}} {
			var got []string
			p.split(c.in, func(s string) { got = append(got, s) })
			if !slices.Equal(got, p.want) {
				t.Errorf("%s split of %q = %q, want %q (%s)", p.name, c.in, got, p.want, c.why)
			}
		}
		// Qwen2's pattern is Llama 3's with \p{N} for \p{N}{1,3}: the same
		// pieces where there are no numbers.
		if !strings.ContainsAny(c.in, "0123456789") {
			var got []string
			splitQwen2(c.in, func(s string) { got = append(got, s) })
			if !slices.Equal(got, c.llama3) {
				t.Errorf("qwen2 split of %q = %q, want Llama 3's %q", c.in, got, c.llama3)
			}
		}
	}
	for in, want := range map[string][]string{
		"12345": {"1", "2", "3", "4", "5"},
		" 12":   {" ", "1", "2"},
		"3.14":  {"3", ".", "1", "4"},
		"a1b":   {"a", "1", "b"},
	} {
		var got []string
		splitQwen2(in, func(s string) { got = append(got, s) })
		if !slices.Equal(got, want) {
			t.Errorf("qwen2 split of %q = %q, want %q (\\p{N}: one number a piece)", in, got, want)
		}
	}
}
