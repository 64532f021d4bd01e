package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/engine/data"
	"github.com/gptui/gptui/kernels/cpu"
)

// writeTokenizerJSON writes a small byte-level BPE tokenizer.json of
// vocab tokens (at least 261) to dir and returns its path: byte b is
// token (97b+13) mod 256, so its ids are not GPT-2's; four merges make
// "th" (256), "the" (257), " t" (258) and " the" (259); the special token
// <|endoftext|> is 260, the document separator; ids from 261 up to
// vocab-1 are more special tokens.
func writeTokenizerJSON(t *testing.T, dir string, vocab int) string {
	t.Helper()
	printable := func(b int) bool { return '!' <= b && b <= '~' || 0xA1 <= b && b <= 0xAC || 0xAE <= b && b <= 0xFF }
	alias := func(b int) string { // GPT-2's printable alias of byte b
		if printable(b) {
			return string(rune(b))
		}
		n := 0
		for c := range b {
			if !printable(c) {
				n++
			}
		}
		return string(rune(256 + n))
	}
	v := map[string]int{"th": 256, "the": 257, "Ġt": 258, "Ġthe": 259}
	for b := range 256 {
		v[alias(b)] = (97*b + 13) % 256
	}
	added := []any{map[string]any{"id": 260, "content": "<|endoftext|>", "special": true, "normalized": false}}
	for id := 261; id < vocab; id++ {
		added = append(added, map[string]any{"id": id, "content": fmt.Sprintf("<|extra_%d|>", id), "special": true})
	}
	doc := map[string]any{
		"added_tokens":   added,
		"normalizer":     nil,
		"pre_tokenizer":  map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
		"post_processor": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true},
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true},
		"model": map[string]any{"type": "BPE", "dropout": nil, "vocab": v,
			"merges": []string{"t h", "th e", "Ġ t", "Ġ the"}},
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, fmt.Sprintf("tokenizer-%d.json", vocab))
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// trainArgs are the arguments of a 2-step tiny run with the tokenizer
// tokFile of 261 tokens.
func trainArgs(dir, tokFile string) []string {
	return []string{"train", "-c", "tiny", "-o", "Engine.max_steps=2", "-o", "Engine.eval_freq=0", "-o", "Model.vocab_size=261",
		"-o", "Engine.log_dir=" + filepath.Join(dir, "log"), "-o", "Data.tokenizer=" + tokFile}
}

// TestPrepareTokenizer: `gptui data prepare --tokenizer FILE` writes the
// tokenizer's ids, each document after its separator, in shards that
// `gptui train` reads.
func TestPrepareTokenizer(t *testing.T) {
	dir := t.TempDir()
	tokFile := writeTokenizerJSON(t, dir, 261)
	tok, err := data.LoadTokenizer(tokFile)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Repeat("the cat sat on the mat; then the end. ", 300)
	txt := filepath.Join(dir, "a.txt")
	os.WriteFile(txt, []byte(text), 0o644)
	shards := filepath.Join(dir, "shards")
	code, out, stderr := runCLI(t, "data", "prepare", "--quiet", "--tokenizer", tokFile, "--input", txt, "--output", shards)
	if code != 0 || !strings.Contains(out, "prepared 1 document from 1 file: ") {
		t.Fatalf("prepare: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	got, err := data.Load(shards)
	if err != nil {
		t.Fatal(err)
	}
	want := []uint16{260}
	for _, id := range tok.Encode(text) {
		want = append(want, uint16(id))
	}
	if !slices.Equal(got, want) || !slices.Contains(got, 259) {
		t.Fatalf("the shard holds %d tokens, want the tokenizer's %d (separator 260, \" the\" 259)", len(got), len(want))
	}

	code, out, stderr = runCLI(t, append(append(trainArgs(dir, tokFile), "-o", "Data.Train.dataset.input_dir="+shards), ownOutput(t)...)...)
	if code != 0 || !strings.Contains(out, "[done] steps: 2") {
		t.Fatalf("train on the shards: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
}

// TestGenerateTokenizer: training with Data.tokenizer tokenizes the
// built-in corpus with it; `gptui generate` encodes the prompt and decodes
// the continuation with the checkpoint's Data.tokenizer or with
// --tokenizer, and refuses a tokenizer larger than the model, as training
// does.
func TestGenerateTokenizer(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", filepath.Join(dir, "cache"))
	tokFile := writeTokenizerJSON(t, dir, 261)
	tok, err := data.LoadTokenizer(tokFile)
	if err != nil {
		t.Fatal(err)
	}
	ckdir := filepath.Join(dir, "out")
	common := trainArgs(dir, tokFile)
	code, out, stderr := runCLI(t, append(common, "-o", "Engine.save_load.save_steps=2", "-o", "Engine.save_load.output_dir="+ckdir)...)
	if code != 0 || !strings.Contains(out, "checkpoint: ") {
		t.Fatalf("train on the built-in corpus: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	corpus, err := os.ReadDir(filepath.Join(dir, "cache", "gptui", "corpus"))
	if err != nil || len(corpus) != 1 {
		t.Fatalf("the corpus cache holds %d files (%v), want the one of this tokenizer", len(corpus), err)
	}
	cached, err := data.ReadShard(filepath.Join(dir, "cache", "gptui", "corpus", corpus[0].Name()))
	if err != nil || cached[0] != 260 || slices.ContainsFunc(cached, func(t uint16) bool { return t >= 261 }) {
		t.Errorf("the built-in corpus was not tokenized with Data.tokenizer (%v)", err)
	}

	// What generate must print: the prompt, then the greedy continuation
	// decoded by the tokenizer.
	m, _, err := engine.LoadModel(cpu.New(), ckdir)
	if err != nil {
		t.Fatal(err)
	}
	prompt := "the"
	ids, err := m.Generate(context.Background(), [][]int{tok.Encode(prompt)}, engine.SampleOptions{MaxNewTokens: 8, Temperature: 0, TopP: 1, Seed: 1234}, nil)
	if err != nil {
		t.Fatal(err)
	}
	expect := prompt + tok.Decode(ids[0]) + "\n"
	if gpt2, err := data.NewTokenizer(); err != nil || gpt2.Decode(ids[0]) == tok.Decode(ids[0]) {
		t.Fatalf("the continuation %v decodes alike with GPT-2's tokenizer (%v): the test would not tell them apart", ids[0], err)
	}
	for _, args := range [][]string{nil, {"--tokenizer", tokFile}} {
		code, out, stderr = runCLI(t, append([]string{"generate", "--ckpt", ckdir, "--prompt", prompt, "--max-new-tokens", "8", "--temperature", "0"}, args...)...)
		if code != 0 || out != expect {
			t.Errorf("generate %v: exit %d, stdout %q, want %q (stderr %q)", args, code, out, expect, stderr)
		}
	}
	big := writeTokenizerJSON(t, dir, 300)
	code, _, stderr = runCLI(t, "generate", "--ckpt", ckdir, "--prompt", prompt, "--tokenizer", big)
	if code != 2 || !strings.Contains(stderr, big) || !strings.Contains(stderr, "300 tokens, more than the model's vocabulary of 261") {
		t.Errorf("generate with a larger tokenizer: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runCLI(t, append(common[:len(common)-1], "Data.tokenizer="+big)...)
	if code != 2 || !strings.Contains(stderr, "Data.tokenizer "+big+" has 300 tokens, more than Model.vocab_size 261") {
		t.Errorf("train with a larger tokenizer: exit %d, stderr %q", code, stderr)
	}
}

// TestTokenizerBadInput: a tokenizer.json gptui does not read, or a
// missing one, is bad input (exit 2) named in one line.
func TestTokenizerBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "tokenizer.json")
	os.WriteFile(bad, []byte(`{"model": {"type": "Unigram", "vocab": []}}`), 0o644)
	txt := filepath.Join(dir, "a.txt")
	os.WriteFile(txt, []byte("hello"), 0o644)
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"data", "prepare", "--tokenizer", bad, "--input", txt, "--output", filepath.Join(dir, "s")}, []string{bad, "model.type", "Unigram"}},
		{[]string{"data", "prepare", "--tokenizer", filepath.Join(dir, "none.json"), "--input", txt, "--output", filepath.Join(dir, "s")}, []string{"none.json", "no such file"}},
		{[]string{"train", "-c", "tiny", "-o", "Data.tokenizer=" + bad}, []string{"Data.tokenizer", bad, "model.type"}},
		// A Llama 3 preset without the tokenizer.json it names.
		{[]string{"train", "-c", "llama-1b", "-o", "Data.tokenizer=" + filepath.Join(dir, "none.json")}, []string{"Data.tokenizer", "none.json", "no such file", "Llama 3's"}},
	} {
		code, _, stderr := runCLI(t, c.args...)
		if code != 2 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line", c.args, code, stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%v: stderr %q does not mention %q", c.args, stderr, w)
			}
		}
	}
}

// TestPrepareTokenizerFolder: `gptui data prepare --tokenizer` takes a
// Hugging Face tokenizer folder shaped like Llama 3's — a tokenizer.json
// whose post_processor is ByteLevel alone, <|begin_of_text|> named as
// bos_token by the tokenizer_config.json beside it — as the folder or as
// its tokenizer.json, and writes <|begin_of_text|> before every document;
// the tokenizer.json alone, or a config naming a token it lacks, is bad
// input named in one line.
func TestPrepareTokenizerFolder(t *testing.T) {
	dir := t.TempDir()
	var doc map[string]any
	if err := json.Unmarshal(readFile(t, writeTokenizerJSON(t, dir, 261)), &doc); err != nil {
		t.Fatal(err)
	}
	doc["added_tokens"].([]any)[0].(map[string]any)["content"] = "<|begin_of_text|>" // 260, no <|endoftext|>
	b, _ := json.Marshal(doc)
	folder, alone := filepath.Join(dir, "llama3"), filepath.Join(dir, "alone")
	for _, d := range []string{folder, alone} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "tokenizer.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	conf := filepath.Join(folder, "tokenizer_config.json")
	if err := os.WriteFile(conf, []byte(`{"bos_token": "<|begin_of_text|>", "eos_token": null, "tokenizer_class": "PreTrainedTokenizerFast"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	txt, jsonl := filepath.Join(dir, "a.txt"), filepath.Join(dir, "b.jsonl")
	os.WriteFile(txt, []byte("the cat"), 0o644)
	os.WriteFile(jsonl, []byte(`{"text": "then the end"}`+"\n"), 0o644)
	tok, err := data.LoadTokenizer(folder)
	if err != nil {
		t.Fatal(err)
	}
	want := []uint16{260}
	for _, id := range tok.Encode("the cat") {
		want = append(want, uint16(id))
	}
	want = append(want, 260)
	for _, id := range tok.Encode("then the end") {
		want = append(want, uint16(id))
	}
	for _, arg := range []string{folder, filepath.Join(folder, "tokenizer.json")} {
		shards := filepath.Join(t.TempDir(), "shards")
		code, out, stderr := runCLI(t, "data", "prepare", "--quiet", "--tokenizer", arg, "--input", txt, "--input", jsonl, "--output", shards)
		if code != 0 || !strings.Contains(out, "prepared 2 documents from 2 files: ") {
			t.Fatalf("prepare --tokenizer %s: exit %d, stdout %q, stderr %q", arg, code, out, stderr)
		}
		got, err := data.Load(shards)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("prepare --tokenizer %s: shard %v, want %v: <|begin_of_text|> (260) before each document", arg, got, want)
		}
	}
	badFolder := filepath.Join(dir, "bad")
	os.Mkdir(badFolder, 0o755)
	os.WriteFile(filepath.Join(badFolder, "tokenizer.json"), b, 0o644)
	os.WriteFile(filepath.Join(badFolder, "tokenizer_config.json"), []byte(`{"bos_token": "<s>"}`), 0o644)
	for _, c := range []struct {
		tokenizer string
		want      []string
	}{
		{alone, []string{"names no document separator", "tokenizer_config.json"}},
		{badFolder, []string{filepath.Join(badFolder, "tokenizer_config.json"), `bos_token: "<s>" is not a token of`}},
		{dir, []string{"holds no tokenizer.json"}},
	} {
		code, _, stderr := runCLI(t, "data", "prepare", "--quiet", "--tokenizer", c.tokenizer, "--input", txt, "--output", filepath.Join(t.TempDir(), "s"))
		checkUserError(t, code, stderr, c.want)
		if strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("--tokenizer %s: stderr %q is not one line", c.tokenizer, stderr)
		}
	}
}
