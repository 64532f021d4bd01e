package data

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	gptui "github.com/gptui/gptui"
	"github.com/gptui/gptui/badinput"
	"github.com/gptui/gptui/internal/allocbound"
	"github.com/pkoukk/tiktoken-go"
	tiktoken_loader "github.com/pkoukk/tiktoken-go-loader"
)

// docsText returns gptui's documentation, the corpus embedded in the
// binary, as one text: the documents in their sorted order, each after a
// blank line. Every tokenizer comparison runs on it, so that it holds on
// a clone of the repository alone.
func docsText(t testing.TB) string {
	t.Helper()
	names, err := fs.Glob(gptui.Docs, "docs/*.md")
	if err != nil || len(names) == 0 {
		t.Fatalf("no embedded docs/*.md (%v)", err)
	}
	var sb strings.Builder
	for _, n := range names {
		b, err := fs.ReadFile(gptui.Docs, n)
		if err != nil {
			t.Fatal(err)
		}
		sb.WriteString("\n\n")
		sb.Write(b)
	}
	return sb.String()
}

// shakespeareFile is the outside corpus the comparisons also run on where
// it is present: ../shared/data/tinyshakespeare.txt of the development
// checkout, which a user's clone does not have.
const shakespeareFile = "shared/data/tinyshakespeare.txt"

// shakespeare returns the text of shakespeareFile, found by walking up
// from the package directory (the main checkout and its worktrees sit at
// different depths below it), or skips the test, naming the file, where
// no directory above has it.
func shakespeare(t testing.TB) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(shakespeareFile)))
		if err == nil {
			return string(b)
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Skipf("%s not found above the package directory: the comparison on it is skipped (the embedded docs' twin runs)", shakespeareFile)
		}
		dir = up
	}
}

// corpora are the texts the tokenizer comparisons run on: the embedded
// docs always, tinyshakespeare where it is present.
var corpora = []struct {
	name string
	text func(testing.TB) string
}{
	{"docs", docsText},
	{"tinyshakespeare", shakespeare},
}

// byteLevelString writes bytes in the byte-level alphabet of a vocabulary.
func byteLevelString(b []byte) string {
	var sb strings.Builder
	for _, c := range b {
		sb.WriteRune(byteLevel[c])
	}
	return sb.String()
}

// hfSpec is what hfJSON needs besides the ranks.
type hfSpec struct {
	pre          any              // the pre_tokenizer section
	post         any              // the post_processor section
	added        []map[string]any // added_tokens
	ignoreMerges bool
	pairs        bool // merges as ["a", "b"] pairs instead of "a b" strings
}

// hfJSON writes a tokenizer.json for tiktoken BPE ranks (token bytes →
// rank, which is the token's id). The merges are derived from the ranks:
// the merge that makes token t joins the two parts that BPE with the
// ranks below t's leaves of t's bytes; a token that BPE does not reach in
// two parts gets no merge (only ignore_merges produces it whole).
func hfJSON(ranks map[string]int, spec hfSpec) ([]byte, int) {
	type tok struct {
		b    string
		rank int
	}
	toks := make([]tok, 0, len(ranks))
	vocab := make(map[string]int, len(ranks)+len(spec.added))
	for s, r := range ranks {
		toks = append(toks, tok{s, r})
		vocab[byteLevelString([]byte(s))] = r
	}
	sort.Slice(toks, func(i, j int) bool { return toks[i].rank < toks[j].rank })
	var merges []any
	unreached := 0
	for _, tk := range toks {
		if len(tk.b) < 2 {
			continue
		}
		parts := rankBPE(tk.b, ranks, tk.rank)
		if len(parts) != 2 {
			unreached++
			continue
		}
		a, b := byteLevelString([]byte(parts[0])), byteLevelString([]byte(parts[1]))
		if spec.pairs {
			merges = append(merges, []string{a, b})
		} else {
			merges = append(merges, a+" "+b)
		}
	}
	for _, a := range spec.added {
		vocab[a["content"].(string)] = a["id"].(int)
	}
	doc := map[string]any{
		"version":        "1.0",
		"truncation":     nil,
		"padding":        nil,
		"added_tokens":   spec.added,
		"normalizer":     nil,
		"pre_tokenizer":  spec.pre,
		"post_processor": spec.post,
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": "",
			"end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false,
			"ignore_merges": spec.ignoreMerges, "vocab": vocab, "merges": merges,
		},
	}
	b, err := json.Marshal(doc)
	if err != nil {
		panic(err)
	}
	return b, unreached
}

// rankBPE is tiktoken's BPE over s with the ranks below limit: join the
// adjacent pair whose concatenation has the lowest rank (the leftmost of
// equal ones) until none has one.
func rankBPE(s string, ranks map[string]int, limit int) []string {
	parts := make([]string, len(s))
	for i := range len(s) {
		parts[i] = s[i : i+1]
	}
	for {
		best, at := limit, -1
		for i := 0; i+1 < len(parts); i++ {
			if r, ok := ranks[parts[i]+parts[i+1]]; ok && r < best {
				best, at = r, i
			}
		}
		if at < 0 {
			return parts
		}
		parts[at] += parts[at+1]
		parts = slices.Delete(parts, at+1, at+2)
	}
}

// tiktokenRanks returns the BPE ranks tiktoken-go-loader embeds for one
// of OpenAI's encodings, the data of the built-in tokenizer.
func tiktokenRanks(file string) map[string]int {
	ranks, err := tiktoken_loader.NewOfflineLoader().LoadTiktokenBpe(file)
	if err != nil {
		panic(err)
	}
	return ranks
}

var (
	byteLevelGPT2 = map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
	endOfText     = map[string]any{"id": 50256, "content": "<|endoftext|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": true}
)

// gpt2JSON is a tokenizer.json written from the built-in tokenizer's data
// (r50k_base's ranks), shaped like GPT-2's published file: a ByteLevel
// pre-tokenizer with GPT-2's regex, <|endoftext|> (50256) as a special
// added token, a ByteLevel post-processor, merges as "a b" strings.
var gpt2JSON = sync.OnceValues(func() ([]byte, int) {
	return hfJSON(tiktokenRanks("r50k_base.tiktoken"), hfSpec{
		pre:   byteLevelGPT2,
		post:  map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
		added: []map[string]any{endOfText},
	})
})

// loadJSON writes b as a tokenizer.json in a temporary directory and loads it.
func loadJSON(t testing.TB, b []byte) (*Tokenizer, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := LoadTokenizer(path)
	if err != nil {
		t.Fatal(err)
	}
	return tok, path
}

// TestTokenizerJSONMatchesGPT2: a tokenizer.json written from GPT-2's
// vocabulary and merges tokenizes each of the corpora exactly as the
// built-in tokenizer does, and decodes it back.
func TestTokenizerJSONMatchesGPT2(t *testing.T) {
	b, unreached := gpt2JSON()
	if unreached != 0 {
		t.Errorf("%d GPT-2 tokens are not the merge of two tokens", unreached)
	}
	tok, _ := loadJSON(t, b)
	builtin, err := NewTokenizer()
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() != VocabSize || tok.sep != EOT {
		t.Errorf("vocabulary %d, separator %d; want %d, %d", tok.VocabSize(), tok.sep, VocabSize, EOT)
	}
	for _, c := range corpora {
		t.Run(c.name, func(t *testing.T) {
			text := c.text(t)
			got, want := tok.Encode(text), builtin.Encode(text)
			if i := firstDiff(got, want); i >= 0 {
				t.Fatalf("token %d of %d differs: tokenizer.json gives %v, built-in %v", i, len(want), got[i:min(i+8, len(got))], want[i:min(i+8, len(want))])
			}
			t.Logf("%s: %d bytes, %d tokens, the same from both tokenizers", c.name, len(text), len(got))
			if d := tok.Decode(got); d != text {
				t.Errorf("decode(encode(%s)) differs from the text", c.name)
			}
		})
	}
}

// firstDiff returns the first index where a and b differ, or -1.
func firstDiff(a, b []int) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// TestTokenizerJSONMatchesCl100k: a Llama-3-style tokenizer.json (Llama
// 3's split pattern before a ByteLevel step without regex,
// ignore_merges, a TemplateProcessing that puts <|begin_of_text|> before
// a document) written from tiktoken's cl100k_base ranks, whose split
// pattern Llama 3's is, tokenizes each of the corpora as tiktoken does; its
// 100,277 tokens need 32-bit shards.
func TestTokenizerJSONMatchesCl100k(t *testing.T) {
	if _, err := NewTokenizer(); err != nil { // installs the offline loader
		t.Fatal(err)
	}
	ref, err := tiktoken.GetEncoding(tiktoken.MODEL_CL100K_BASE)
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := loadJSON(t, cl100kJSON())
	if tok.VocabSize() != 100277 || tok.sep != 100264 {
		t.Errorf("vocabulary %d, separator %d; want 100277, 100264", tok.VocabSize(), tok.sep)
	}
	for _, c := range corpora {
		t.Run(c.name, func(t *testing.T) {
			text := c.text(t)
			got, want := tok.Encode(text), ref.EncodeOrdinary(text)
			if i := firstDiff(got, want); i >= 0 {
				t.Fatalf("token %d of %d differs: tokenizer.json gives %v, tiktoken %v", i, len(want), got[i:min(i+8, len(got))], want[i:min(i+8, len(want))])
			}
			t.Logf("%s: %d tokens of cl100k_base, the same from both tokenizers", c.name, len(got))
		})
	}
}

// cl100kJSON is the Llama-3-style tokenizer.json of
// TestTokenizerJSONMatchesCl100k, merges written as pairs.
var cl100kJSON = sync.OnceValue(func() []byte {
	special := func(id int, s string) map[string]any {
		return map[string]any{"id": id, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
	}
	b, _ := hfJSON(tiktokenRanks("cl100k_base.tiktoken"), hfSpec{
		pre: map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": llama3Pattern}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}},
		post: map[string]any{"type": "Sequence", "processors": []any{
			map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
			map[string]any{"type": "TemplateProcessing",
				"single": []any{
					map[string]any{"SpecialToken": map[string]any{"id": "<|begin_of_text|>", "type_id": 0}},
					map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}},
				},
				"pair":           []any{},
				"special_tokens": map[string]any{"<|begin_of_text|>": map[string]any{"id": "<|begin_of_text|>", "ids": []int{100264}, "tokens": []string{"<|begin_of_text|>"}}},
			},
		}},
		added:        []map[string]any{special(100257, "<|endoftext|>"), special(100264, "<|begin_of_text|>"), special(100276, "<|eot_id|>")},
		ignoreMerges: true,
		pairs:        true,
	})
	return b
})

// tinyJSON is a small Llama-3-style tokenizer.json: token b is byte b,
// one merge ("H", "i") makes 256 "Hi", and added tokens of every kind.
func tinyJSON() []byte {
	vocab := map[string]int{"Hi": 256}
	for b := range 256 {
		vocab[string(byteLevel[b])] = b
	}
	added := func(id int, s string, special bool, opts ...string) map[string]any {
		a := map[string]any{"id": id, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": !special, "special": special}
		for _, o := range opts {
			a[o] = true
		}
		return a
	}
	doc := map[string]any{
		"added_tokens": []any{
			added(300, "<|begin_of_text|>", true), added(301, "<|end_of_text|>", true), added(302, "<|eot_id|>", true),
			added(303, "[NS]", false), added(304, "SW", false, "single_word"), added(305, "<L>", false, "lstrip"),
			added(306, "<R>", false, "rstrip"), added(307, "<|x|>", true), added(308, "<|x|>y", true),
		},
		"normalizer": nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": llama3Pattern}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}},
		"post_processor": map[string]any{"type": "TemplateProcessing",
			"single": []any{
				map[string]any{"SpecialToken": map[string]any{"id": "<|begin_of_text|>", "type_id": 0}},
				map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}},
			},
			"special_tokens": map[string]any{"<|begin_of_text|>": map[string]any{"id": "<|begin_of_text|>", "ids": []int{300}, "tokens": []string{"<|begin_of_text|>"}}},
		},
		"decoder": map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{"type": "BPE", "dropout": nil, "ignore_merges": true, "vocab": vocab,
			"merges": []any{[]string{"H", "i"}}},
	}
	b, err := json.Marshal(doc)
	if err != nil {
		panic(err)
	}
	return b
}

// bytesOf returns the byte tokens of tinyJSON for s.
func bytesOf(s string) []int {
	ids := make([]int, len(s))
	for i := range len(s) {
		ids[i] = int(s[i])
	}
	return ids
}

// TestAddedTokens: added tokens are found in the text before the
// pre-tokenizer and BPE, as Hugging Face's tokenizers library finds them:
// the leftmost and then longest match, special ones only when asked for,
// single_word ones only where no word character touches them, lstrip and
// rstrip ones taking the whitespace beside them.
func TestAddedTokens(t *testing.T) {
	tok, _ := loadJSON(t, tinyJSON())
	if tok.VocabSize() != 309 || tok.sep != 300 {
		t.Errorf("vocabulary %d, separator %d; want 309, 300 (<|begin_of_text|> from the template)", tok.VocabSize(), tok.sep)
	}
	cat := func(parts ...[]int) []int { return slices.Concat(parts...) }
	for _, c := range []struct {
		text    string
		special bool
		want    []int
	}{
		{"<|begin_of_text|>Hi", true, []int{300, 256}},
		{"<|begin_of_text|>Hi", false, cat(bytesOf("<|begin_of_text|>"), []int{256})},
		{"a<|eot_id|><|end_of_text|>", true, []int{'a', 302, 301}},
		{"<|x|>y", true, []int{308}},            // the longest match
		{"<|x|>z", true, []int{307, 'z'}},       // the only match
		{"x[NS]y", false, []int{'x', 303, 'y'}}, // not special: found in plain text too
		{"a SW b", false, []int{'a', ' ', 304, ' ', 'b'}},
		{"aSW b", false, bytesOf("aSW b")},       // a word character touches it
		{"a  <L>b", false, []int{'a', 305, 'b'}}, // lstrip takes the spaces before
		{"a<R>  b", false, []int{'a', 306, 'b'}}, // rstrip takes the spaces after
		{"Hi<|eot_id|>", false, cat([]int{256}, bytesOf("<|eot_id|>"))},
		{"", true, nil},
	} {
		enc := tok.Encode
		if c.special {
			enc = tok.EncodeSpecial
		}
		got := enc(c.text)
		if !slices.Equal(got, c.want) {
			t.Errorf("encode(%q, special %v) = %v, want %v", c.text, c.special, got, c.want)
		}
		if d := tok.Decode(got); d != c.text && !strings.Contains(c.text, "<L>") && !strings.Contains(c.text, "<R>") {
			t.Errorf("decode(encode(%q)) = %q", c.text, d)
		}
	}
	// An inverted Removed split of a pattern that matches every character
	// keeps what an Isolated one does (dolma2's tokenizer.json has it).
	var doc map[string]any
	json.Unmarshal(tinyJSON(), &doc)
	split := doc["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[0].(map[string]any)
	split["behavior"], split["invert"] = "Removed", true
	b, _ := json.Marshal(doc)
	inverted, _ := loadJSON(t, b)
	for _, s := range []string{"Hi there, 12345 'S\n\n  x", "<|eot_id|>Hi"} {
		if a, b := tok.Encode(s), inverted.Encode(s); !slices.Equal(a, b) {
			t.Errorf("inverted Removed split of %q: %v, Isolated %v", s, b, a)
		}
	}
	if d := tok.Decode([]int{300, 256, 9999, -1, 302}); d != "<|begin_of_text|>Hi<|eot_id|>" {
		t.Errorf("decode = %q: special tokens decode to their text, unknown ids to nothing", d)
	}

	// GPT-2's <|endoftext|>, from the file and from the built-in tokenizer.
	b, _ = gpt2JSON()
	gpt2, _ := loadJSON(t, b)
	builtin, err := NewTokenizer()
	if err != nil {
		t.Fatal(err)
	}
	text := "Hello<|endoftext|> world"
	if got, want := gpt2.EncodeSpecial(text), builtin.EncodeSpecial(text); !slices.Equal(got, want) || !slices.Contains(got, EOT) {
		t.Errorf("EncodeSpecial(%q) = %v, built-in %v; want equal, with EOT", text, got, want)
	}
	if got, want := gpt2.Encode(text), builtin.Encode(text); !slices.Equal(got, want) || slices.Contains(got, EOT) {
		t.Errorf("Encode(%q) = %v, built-in %v; want equal, without EOT", text, got, want)
	}
}

// TestTokenizerJSONRoundTrip: decode(encode(x)) == x for byte-level BPE,
// over random UTF-8 and invalid bytes.
func TestTokenizerJSONRoundTrip(t *testing.T) {
	b, _ := gpt2JSON()
	gpt2, _ := loadJSON(t, b)
	tiny, _ := loadJSON(t, tinyJSON())
	pieces := []string{"a", "Hi", " ", "  ", "\n", "\r\n", "\t", "'s", "'S", "ſ", "7", "123456", ".", "!!", "é", "中文", "😀", "\u00a0", "\u2028",
		"<|endoftext|>", "<|eot_id|>", "[NS]", "SW", "<L>", "<R>", "\xff", "\xe2\x82", "\xc0\x80", "\xed\xa0\x80"}
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 3000 {
		var sb strings.Builder
		for range r.IntN(30) {
			if r.IntN(4) == 0 {
				sb.WriteByte(byte(r.IntN(256)))
			} else {
				sb.WriteString(pieces[r.IntN(len(pieces))])
			}
		}
		x := sb.String()
		for _, tk := range []*Tokenizer{gpt2, tiny} {
			for _, ids := range [][]int{tk.Encode(x), tk.EncodeSpecial(x)} {
				if d := tk.Decode(ids); d != x && !(tk == tiny && (strings.Contains(x, "<L>") || strings.Contains(x, "<R>"))) {
					t.Fatalf("case %d: decode(encode(%q)) = %q", i, x, d)
				}
				for _, id := range ids {
					if id < 0 || id >= tk.VocabSize() {
						t.Fatalf("case %d: id %d outside the vocabulary of %d", i, id, tk.VocabSize())
					}
				}
			}
		}
	}
}

// TestTokenizerJSONErrors: what gptui does not read, and malformed files,
// get a *FormatError naming the file and the key.
func TestTokenizerJSONErrors(t *testing.T) {
	edit := func(f func(doc map[string]any)) []byte {
		var doc map[string]any
		if err := json.Unmarshal(tinyJSON(), &doc); err != nil {
			t.Fatal(err)
		}
		f(doc)
		b, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	model := func(doc map[string]any) map[string]any { return doc["model"].(map[string]any) }
	steps := func(doc map[string]any) []any { return doc["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any) }
	for _, c := range []struct {
		name string
		b    []byte
		want string
	}{
		{"syntax", []byte("{\n\"model\": {,}"), ":2: invalid JSON"},
		{"not an object", []byte(`[1]`), "the file: array where an object belongs"},
		{"unigram", edit(func(d map[string]any) { model(d)["type"] = "Unigram" }), `model.type: "Unigram" is not supported`},
		{"wordpiece prefix", edit(func(d map[string]any) { model(d)["continuing_subword_prefix"] = "##" }), "model.continuing_subword_prefix"},
		{"dropout", edit(func(d map[string]any) { model(d)["dropout"] = 0.1 }), "model.dropout"},
		{"normalizer", edit(func(d map[string]any) { d["normalizer"] = map[string]any{"type": "NFC"} }), `normalizer.type: "NFC" is not supported`},
		{"metaspace with a byte-level decoder", edit(func(d map[string]any) {
			d["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "▁"}
		}), `decoder.type: "ByteLevel" is not supported`},
		{"unknown split", edit(func(d map[string]any) {
			steps(d)[0].(map[string]any)["pattern"] = map[string]any{"Regex": `\p{L}+|\s+`}
		}), "pre_tokenizer.pretokenizers[0].pattern.Regex"},
		{"string split", edit(func(d map[string]any) {
			steps(d)[0].(map[string]any)["pattern"] = map[string]any{"String": " "}
		}), "pre_tokenizer.pretokenizers[0].pattern"},
		{"merged", edit(func(d map[string]any) { steps(d)[0].(map[string]any)["behavior"] = "MergedWithPrevious" }), "pretokenizers[0].behavior"},
		{"removed", edit(func(d map[string]any) { steps(d)[0].(map[string]any)["behavior"] = "Removed" }), "pretokenizers[0].invert: false is not supported with behavior Removed"},
		{"inverted", edit(func(d map[string]any) { steps(d)[0].(map[string]any)["invert"] = true }), "pretokenizers[0].invert: true is not supported with behavior Isolated"},
		{"no byte level", edit(func(d map[string]any) {
			pre := d["pre_tokenizer"].(map[string]any)
			pre["pretokenizers"] = steps(d)[:1]
		}), "pre_tokenizer: no ByteLevel step"},
		{"byte level first", edit(func(d map[string]any) {
			s := steps(d)
			s[0], s[1] = s[1], s[0]
		}), "pretokenizers[0]: ByteLevel must be the last"},
		{"no pre-tokenizer", edit(func(d map[string]any) { d["pre_tokenizer"] = nil }), "pre_tokenizer: missing"},
		{"decoder", edit(func(d map[string]any) { d["decoder"] = map[string]any{"type": "Metaspace"} }), `decoder.type: "Metaspace"`},
		{"post-processor", edit(func(d map[string]any) { d["post_processor"] = map[string]any{"type": "BertProcessing"} }), `post_processor.type: "BertProcessing"`},
		{"missing byte", edit(func(d map[string]any) { delete(model(d)["vocab"].(map[string]any), "Ġ") }), "model.vocab: no token for byte 0x20"},
		{"merge of unknown", edit(func(d map[string]any) { model(d)["merges"] = []any{"H q"} }), `model.merges[0]: the merged token "Hq"`},
		{"bad merge", edit(func(d map[string]any) { model(d)["merges"] = []any{"Hi"} }), `model.merges[0]: "Hi" is not two tokens`},
		{"huge id", edit(func(d map[string]any) { model(d)["vocab"].(map[string]any)["Hi"] = 1 << 40 }), `model.vocab["Hi"]: id 1099511627776 out of range`},
		{"negative id", edit(func(d map[string]any) { d["added_tokens"].([]any)[0].(map[string]any)["id"] = -1 }), "added_tokens[0].id: id -1 out of range"},
		{"fractional id", edit(func(d map[string]any) { model(d)["vocab"].(map[string]any)["Hi"] = 2.5 }), "model.vocab: number 2.5 where an integer belongs"},
		{"shared id", edit(func(d map[string]any) { model(d)["vocab"].(map[string]any)["Hi"] = 72 }), `model.vocab: id 72 is given to both "H" and "Hi"`},
		{"repeated added", edit(func(d map[string]any) {
			d["added_tokens"] = append(d["added_tokens"].([]any), map[string]any{"id": 309, "content": "SW"})
		}), `added_tokens[9].content: "SW" repeats added_tokens[4]`},
		{"empty added token", edit(func(d map[string]any) {
			d["added_tokens"].([]any)[0].(map[string]any)["content"] = ""
		}), "added_tokens[0].content: a token of 0 bytes"},
		{"added token without id", []byte(`{"added_tokens":[{"content":"x"}]}`), "added_tokens[0].id: missing"},
		{"key given twice", []byte(`{"model":{"type":"BPE","vocab":{},"type":"BPE"}}`), "model.type: given twice"},
		{"data after the document", append(tinyJSON(), " {}"...), "invalid JSON: invalid character '{' after top-level value"},
		{"cut short", tinyJSON()[:1000], "invalid JSON: unexpected EOF"},
		{"merge of three", edit(func(d map[string]any) { model(d)["merges"] = []any{[]string{"H", "i", "x"}} }), `model.merges[0]: a list of other than two strings is neither`},
		{"merge number", edit(func(d map[string]any) { model(d)["merges"] = []any{1} }), `model.merges[0]: number 1 is neither "a b" nor ["a", "b"]`},
		{"vocab list", edit(func(d map[string]any) { model(d)["vocab"] = []any{[]any{"a", 0}} }), "model.vocab: array where an object belongs"},
		{"oversized section", edit(func(d map[string]any) { d["normalizer"] = map[string]any{"type": strings.Repeat("x", maxSectionBytes)} }),
			"bytes, more than the 1048576 a normalizer has room for"},
		{"two separators", edit(func(d map[string]any) {
			p := d["post_processor"].(map[string]any)
			p["single"] = append([]any{p["single"].([]any)[0]}, p["single"].([]any)...)
		}), "post_processor.single: 2 tokens before a document"},
	} {
		path := filepath.Join(t.TempDir(), "tokenizer.json")
		if err := os.WriteFile(path, c.b, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := LoadTokenizer(path)
		var fe *FormatError
		if !errors.As(err, &fe) || fe.File != path || !strings.Contains(err.Error(), c.want) || !errors.Is(err, badinput.Err) {
			t.Errorf("%s: error %v; want a *FormatError naming %s and saying %q", c.name, err, path, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error %q is not one line", c.name, err)
		}
	}
	if _, err := LoadTokenizer(filepath.Join(t.TempDir(), "none.json")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: error %v, want one wrapping os.ErrNotExist", err)
	}
}

// TestLoadTokenizerChecked: the check sees what the file's tables hold
// before they are built, and its error is returned as it is.
func TestLoadTokenizerChecked(t *testing.T) {
	_, path := loadJSON(t, tinyJSON())
	var seen TokenizerTables
	refused := errors.New("refused")
	_, err := LoadTokenizerChecked(path, func(tt TokenizerTables) error { seen = tt; return refused })
	if err != refused {
		t.Errorf("error %v, want the check's", err)
	}
	if seen.Vocab != 257 || seen.Merges != 1 || seen.Added != 9 || seen.Bytes < 257*vocabEntryBytes {
		t.Errorf("the check saw %+v; want 257 vocabulary entries, 1 merge, 9 added tokens and their bytes", seen)
	}
	if _, err := LoadTokenizerChecked(path, func(TokenizerTables) error { return nil }); err != nil {
		t.Errorf("a check that passes: %v", err)
	}
}

// TestTokenizerJSONHostile: files made to cost far more than their size
// to read — long lists of entries that cannot be right, or of more
// entries than any tokenizer holds, a sparse file of 1 GiB — are refused
// at the entry that is wrong or past the limit, quickly, allocating at
// most 10 times their size (the files of 64 MiB, and the peak resident
// memory of the process, are cmd/gptui's TestHostileTokenizer).
func TestTokenizerJSONHostile(t *testing.T) {
	// list is head, then n items separated by commas, then tail.
	list := func(head, item string, n int, tail string) []byte {
		b := append([]byte(head), bytes.Repeat([]byte(item+","), n)...)
		return append(b[:len(b)-1], tail...)
	}
	vocab := func(n int) []byte {
		b := []byte(`{"model":{"type":"BPE","vocab":{`)
		for i := range n {
			b = append(b, `"t`...)
			b = strconv.AppendInt(b, int64(i), 10)
			b = append(b, `":`...)
			b = strconv.AppendInt(b, int64(i), 10)
			b = append(b, ',')
		}
		return append(b[:len(b)-1], "}}}"...)
	}
	merges := `{"model":{"type":"BPE","vocab":{"a":0},"merges":[`
	for _, c := range []struct {
		name string
		b    []byte
		want string
	}{
		{"one-character merges", list(merges, "1", 4<<20, "]}}"), `model.merges[0]: number 1 is neither "a b" nor ["a", "b"]`},
		{"empty added tokens", list(`{"added_tokens":[`, "{}", 3<<20, "]}"), "added_tokens[0].id: missing"},
		{"added tokens without content", list(`{"added_tokens":[`, `{"id":0,"content":""}`, 1<<20, "]}"), "added_tokens[0].content: a token of 0 bytes"},
		{"merges past the limit", list(merges, `"a b"`, maxVocab+1, "]}}"), "model.merges: more than 1048576 merges"},
		{"added tokens past the limit", list(`{"added_tokens":[`, `{"id":1,"content":"x"}`, maxVocab+1, "]}"), "added_tokens: more than 1048576 added tokens"},
		{"vocabulary past the limit", vocab(maxVocab + 1), "model.vocab: more than 1048576 entries"},
		{"a sparse 1 GiB file", nil, "larger than 64 MiB"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tokenizer.json")
			size := int64(len(c.b))
			if err := os.WriteFile(path, c.b, 0o644); err != nil {
				t.Fatal(err)
			}
			if c.b == nil {
				size = 1 << 30
				if err := os.Truncate(path, size); err != nil {
					t.Skipf("a sparse file: %v", err)
				}
			}
			var err error
			start := time.Now()
			used := allocbound.Measure(func() { _, err = LoadTokenizer(path) })
			took := time.Since(start)
			var fe *FormatError
			if !errors.As(err, &fe) || fe.File != path || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %v; want a one-line *FormatError naming %s and saying %q", err, path, c.want)
			}
			t.Logf("%.1f MiB refused in %.2f s, %.1f MiB allocated: %v", float64(size)/(1<<20), took.Seconds(), float64(used)/(1<<20), err)
			if limit := 10 * uint64(len(c.b)); used > max(limit, 64<<10) {
				t.Errorf("allocated %d bytes reading %d, more than 10 times as many", used, len(c.b))
			}
			if took > 5*time.Second {
				t.Errorf("refused after %.1f s", took.Seconds())
			}
		})
	}
}

// FuzzLoadTokenizer feeds arbitrary files to LoadTokenizer: an error is a
// one-line *FormatError naming the file; a file it accepts is valid JSON,
// and its tokenizer round-trips text. Reading never allocates more than
// allocbound.Limit of the file's size.
func FuzzLoadTokenizer(f *testing.F) {
	f.Add(tinyJSON())
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`))
	f.Add([]byte(`{"added_tokens":[{"id":1e9,"content":"x"}]}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"added_tokens":[{},{},{}]}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":[1,1,1]}}`))
	f.Add([]byte(`{"model":{"vocab":[["a",0]],"type":"Unigram"},"x":{"y":[1,"\"]"]}}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"\u0041\ud800":0,"ÿ":1},"merges":[["\"a","b"]]}} `))
	f.Add([]byte(`{"model":{"type":"BPE","type":"BPE"}}`))
	path := filepath.Join(f.TempDir(), "tokenizer.json")
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		var tok *Tokenizer
		var err error
		used := allocbound.Measure(func() { tok, err = LoadTokenizer(path) })
		if limit := allocbound.Limit(len(b)); used > limit {
			t.Errorf("allocated %d bytes reading %d (limit %d); error %v", used, len(b), limit, err)
		}
		if err != nil {
			var fe *FormatError
			if !errors.As(err, &fe) || fe.File != path || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q is not a one-line *FormatError naming the file", err)
			}
			return
		}
		if !json.Valid(b) {
			t.Fatalf("accepted a file that is not valid JSON")
		}
		for _, s := range []string{"Hello, world!\n", "<|begin_of_text|>x'S 12345\xff"} {
			ids := tok.EncodeSpecial(s)
			for _, id := range ids {
				if id < 0 || id >= tok.VocabSize() {
					t.Fatalf("id %d outside the vocabulary of %d", id, tok.VocabSize())
				}
			}
			if d := tok.Decode(tok.Encode(s)); d != s && !bytes.Contains(b, []byte("strip")) {
				t.Fatalf("decode(encode(%q)) = %q", s, d)
			}
		}
	})
}
