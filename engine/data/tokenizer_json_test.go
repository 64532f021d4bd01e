package data

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	tiktoken_loader "github.com/pkoukk/tiktoken-go-loader"
)

// shakespeare returns the text of ../shared/data/tinyshakespeare.txt,
// found by walking up from the package directory (the main checkout and
// its worktrees sit at different depths below it).
func shakespeare(t testing.TB) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "shared", "data", "tinyshakespeare.txt"))
		if err == nil {
			return string(b)
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("shared/data/tinyshakespeare.txt not found above the package directory")
		}
		dir = up
	}
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
// vocabulary and merges tokenizes tinyshakespeare exactly as the built-in
// tokenizer does, and decodes it back.
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
	text := shakespeare(t)
	got, want := tok.Encode(text), builtin.Encode(text)
	if i := firstDiff(got, want); i >= 0 {
		t.Fatalf("token %d of %d differs: tokenizer.json gives %v, built-in %v", i, len(want), got[i:min(i+8, len(got))], want[i:min(i+8, len(want))])
	}
	t.Logf("tinyshakespeare: %d bytes, %d tokens, the same from both tokenizers", len(text), len(got))
	if d := tok.Decode(got); d != text {
		t.Errorf("decode(encode(tinyshakespeare)) differs from the text")
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
