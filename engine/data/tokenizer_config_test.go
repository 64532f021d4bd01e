package data

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gptui/gptui/badinput"
)

// llama3JSON is tinyJSON shaped as Llama 3's own tokenizer.json is: its
// post_processor a ByteLevel step alone, which names no token to put
// before a document, and <|end_of_text|>, not <|endoftext|>.
func llama3JSON(t *testing.T) []byte {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(tinyJSON(), &doc); err != nil {
		t.Fatal(err)
	}
	doc["post_processor"] = map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tokenizerDir writes a tokenizer folder: tokenizer.json, and
// tokenizer_config.json where conf is not "".
func tokenizerDir(t *testing.T, tok []byte, conf string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, TokenizerFile), tok, 0o644); err != nil {
		t.Fatal(err)
	}
	if conf != "" {
		if err := os.WriteFile(filepath.Join(dir, TokenizerConfigFile), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestLlama3TokenizerConfig: a tokenizer.json shaped like Llama 3's
// (ByteLevel post-processor alone) with the tokenizer_config.json beside
// it that names <|begin_of_text|> its bos_token — given as the folder or
// as the file — prepares data with <|begin_of_text|> before every
// document; alone, it names no separator and Prepare refuses it, naming
// tokenizer_config.json.
func TestLlama3TokenizerConfig(t *testing.T) {
	const conf = `{"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "model_max_length": 131072,
		"added_tokens_decoder": {"300": {"content": "<|begin_of_text|>", "special": true}}, "tokenizer_class": "PreTrainedTokenizerFast"}`
	dir := tokenizerDir(t, llama3JSON(t), conf)
	in := t.TempDir()
	writeFiles(t, in, map[string]string{"a.txt": "Hi there", "b.jsonl": `{"text": "Hi"}` + "\n" + `{"text": "<|begin_of_text|>"}` + "\n"})
	for _, path := range []string{dir, filepath.Join(dir, TokenizerFile)} {
		tok, err := LoadTokenizer(path)
		if err != nil {
			t.Fatal(err)
		}
		if sp := tok.Special(); sp != (SpecialTokens{BOS: 300, EOS: 301, Pad: -1, Separator: 300}) {
			t.Errorf("%s: special tokens %+v; want <|begin_of_text|> (300) as BOS and separator, <|end_of_text|> (301) as EOS", path, sp)
		}
		out := t.TempDir()
		if _, err := Prepare(context.Background(), []string{in}, out, PrepareOptions{Tokenizer: tok}); err != nil {
			t.Fatal(err)
		}
		got, err := ReadShard(filepath.Join(out, "data_000000.bin"))
		if err != nil {
			t.Fatal(err)
		}
		var want []uint16
		for _, doc := range []string{"Hi there", "Hi", "<|begin_of_text|>"} {
			want = append(want, 300)
			for _, id := range tok.Encode(doc) {
				want = append(want, uint16(id))
			}
		}
		if !slices.Equal(got, want) || got[0] != 300 || slices.Contains(got[1:4], 300) {
			t.Errorf("%s: shard %v, want %v: <|begin_of_text|> (300) before each document and nowhere else", path, got, want)
		}
	}
	alone, err := LoadTokenizer(filepath.Join(tokenizerDir(t, llama3JSON(t), ""), TokenizerFile))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Prepare(context.Background(), []string{in}, t.TempDir(), PrepareOptions{Tokenizer: alone})
	if err == nil || !errors.Is(err, badinput.Err) || !strings.Contains(err.Error(), "names no document separator") || !strings.Contains(err.Error(), TokenizerConfigFile) {
		t.Errorf("Llama 3's tokenizer.json alone: error %v; want bad input saying it names no separator, naming %s", err, TokenizerConfigFile)
	}
}

// TestTokenizerSpecialTokens: BOS, EOS, pad and the separator come from
// whichever file names them — the template, tokenizer_config.json (a
// string or transformers' AddedToken object), the special added token
// <|endoftext|> — and a config naming a token the tokenizer lacks, or
// naming it as neither, is a one-line error naming tokenizer_config.json
// and the key.
func TestTokenizerSpecialTokens(t *testing.T) {
	var gpt2Style map[string]any // tinyJSON with <|endoftext|> and no template
	if err := json.Unmarshal(llama3JSON(t), &gpt2Style); err != nil {
		t.Fatal(err)
	}
	gpt2Style["added_tokens"] = append(gpt2Style["added_tokens"].([]any),
		map[string]any{"id": 309, "content": "<|endoftext|>", "special": true, "normalized": false})
	gpt2, _ := json.Marshal(gpt2Style)
	for _, tc := range []struct {
		name      string
		tok       []byte
		conf      string
		want      SpecialTokens
		errKey    string // the error's key, where the config is refused
		errString string
	}{
		{"template alone", tinyJSON(), "", SpecialTokens{BOS: 300, EOS: -1, Pad: -1, Separator: 300}, "", ""},
		{"template and config", tinyJSON(), `{"bos_token": "<|eot_id|>", "eos_token": "<|end_of_text|>", "pad_token": "<|x|>"}`,
			SpecialTokens{BOS: 302, EOS: 301, Pad: 307, Separator: 300}, "", ""},
		{"AddedToken objects", llama3JSON(t), `{"bos_token": {"__type": "AddedToken", "content": "<|begin_of_text|>", "lstrip": false}, "eos_token": {"content": "<|eot_id|>"}, "pad_token": null}`,
			SpecialTokens{BOS: 300, EOS: 302, Pad: -1, Separator: 300}, "", ""},
		{"a vocabulary token", llama3JSON(t), `{"bos_token": "Hi"}`, SpecialTokens{BOS: 256, EOS: -1, Pad: -1, Separator: 256}, "", ""},
		{"<|endoftext|>", gpt2, "", SpecialTokens{BOS: -1, EOS: 309, Pad: -1, Separator: 309}, "", ""},
		{"EOS alone", llama3JSON(t), `{"bos_token": null, "eos_token": "<|end_of_text|>"}`, SpecialTokens{BOS: -1, EOS: 301, Pad: -1, Separator: 301}, "", ""},
		{"BOS before <|endoftext|>", gpt2, `{"bos_token": "<|begin_of_text|>"}`, SpecialTokens{BOS: 300, EOS: 309, Pad: -1, Separator: 300}, "", ""},
		{"unknown token", llama3JSON(t), `{"bos_token": "<s>"}`, SpecialTokens{}, "bos_token", `"<s>" is not a token of`},
		{"not a token", llama3JSON(t), `{"eos_token": 7}`, SpecialTokens{}, "eos_token", "neither a token's string nor an object"},
		{"empty", llama3JSON(t), `{"pad_token": ""}`, SpecialTokens{}, "pad_token", "an empty token"},
		{"not JSON", llama3JSON(t), `{"bos_token": `, SpecialTokens{}, "", "invalid JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := tokenizerDir(t, tc.tok, tc.conf)
			tok, err := LoadTokenizer(dir)
			if tc.errString != "" {
				conf := filepath.Join(dir, TokenizerConfigFile)
				var fe *FormatError
				if !errors.As(err, &fe) || fe.File != conf || !strings.Contains(err.Error(), tc.errKey+": ") || !strings.Contains(err.Error(), tc.errString) ||
					strings.Contains(err.Error(), "\n") {
					t.Errorf("error %v; want a one-line *FormatError naming %s, %q and saying %q", err, conf, tc.errKey, tc.errString)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if sp := tok.Special(); sp != tc.want || tok.sep != tc.want.Separator {
				t.Errorf("special tokens %+v (separator %d), want %+v", sp, tok.sep, tc.want)
			}
		})
	}
	// A folder without tokenizer.json names it.
	_, err := LoadTokenizer(t.TempDir())
	if err == nil || !errors.Is(err, os.ErrNotExist) || !errors.Is(err, badinput.Err) || !strings.Contains(err.Error(), "holds no "+TokenizerFile) {
		t.Errorf("a folder without %s: error %v", TokenizerFile, err)
	}
}

// TestTokenizerConfigIdentity: tokenizer_config.json is part of the
// tokenizer's identity (the name tokenization caches are keyed by): the
// same tokenizer.json with another config is another tokenizer.
func TestTokenizerConfigIdentity(t *testing.T) {
	a, err := LoadTokenizer(tokenizerDir(t, llama3JSON(t), `{"bos_token": "<|begin_of_text|>"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadTokenizer(tokenizerDir(t, llama3JSON(t), `{"bos_token": "<|eot_id|>"}`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := LoadTokenizer(tokenizerDir(t, llama3JSON(t), ""))
	if err != nil {
		t.Fatal(err)
	}
	if a.name == b.name || a.name == c.name || b.name == c.name {
		t.Errorf("names %s, %s, %s: want three", a.name, b.name, c.name)
	}
}
