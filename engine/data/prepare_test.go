package data

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/gptui/gptui/units"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gptui/gptui/badinput"
)

// writeFiles creates the named files, with their parent directories, in
// dir.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// expectTokens is what Prepare must produce for docs, in order.
func expectTokens(t *testing.T, docs ...string) []uint16 {
	tok := newTestTokenizer(t)
	var want []uint16
	for _, d := range docs {
		want = tok.appendEncoded(want, d)
	}
	return want
}

// shardNames lists the files in dir.
func shardNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

var corpusFiles = map[string]string{
	"in/b.txt":             "\ufeffSecond file, with a byte order mark.",
	"in/a.txt":             "First file.\nTwo lines.",
	"in/sub/c.jsonl":       "{\"text\": \"json one\", \"id\": 1}\n\n   \n{\"text\": \"json two <|endoftext|>\"}\r\n{\"text\": \"\"}\n",
	"in/sub/notes.md":      "ignored: not .txt or .jsonl",
	"in/.hidden/x.txt":     "ignored: hidden directory",
	"in/.y.txt":            "ignored: hidden file",
	"in/z/UPPER.TXT":       "extension case does not matter",
	"extra/explicit.jsonl": `{"text":"named explicitly"}`,
}

// corpusDocs are the documents of corpusFiles in Prepare's order.
var corpusDocs = []string{
	"named explicitly",        // extra/explicit.jsonl
	"First file.\nTwo lines.", // in/a.txt
	"Second file, with a byte order mark.",
	"json one", "json two <|endoftext|>", "", // in/sub/c.jsonl
	"extension case does not matter", // in/z/UPPER.TXT
}

func TestPrepare(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, corpusFiles)
	want := expectTokens(t, corpusDocs...)
	inputs := []string{filepath.Join(dir, "in"), filepath.Join(dir, "extra", "explicit.jsonl"),
		filepath.Join(dir, "in", "a.txt")} // a.txt twice: read once

	for _, shardTokens := range []int{0, 7, len(want), len(want) - 1} {
		for _, workers := range []int{1, 3} {
			t.Run(fmt.Sprintf("shard=%d/workers=%d", shardTokens, workers), func(t *testing.T) {
				out := filepath.Join(t.TempDir(), "out", "nested")
				stats, err := Prepare(context.Background(), inputs, out,
					PrepareOptions{ShardTokens: shardTokens, Prefix: "tiny", Workers: workers})
				if err != nil {
					t.Fatalf("Prepare: %v", err)
				}
				size := shardTokens
				if size == 0 {
					size = DefaultShardTokens
				}
				nshards := (len(want) + size - 1) / size
				wantStats := PrepareStats{Files: 5, Documents: len(corpusDocs), Tokens: len(want),
					Shards: nshards, Bytes: stats.Bytes}
				if stats != wantStats {
					t.Errorf("stats = %+v, want %+v", stats, wantStats)
				}
				var total int64
				for _, name := range []string{"in/a.txt", "in/b.txt", "in/sub/c.jsonl", "in/z/UPPER.TXT", "extra/explicit.jsonl"} {
					total += int64(len(corpusFiles[name]))
				}
				if stats.Bytes != total {
					t.Errorf("stats.Bytes = %d, want %d", stats.Bytes, total)
				}
				names := shardNames(t, out)
				if len(names) != nshards {
					t.Fatalf("output holds %v, want %d shards", names, nshards)
				}
				var got []uint16
				for i, name := range names {
					if wantName := fmt.Sprintf("tiny_%06d.bin", i); name != wantName {
						t.Errorf("shard %d is %s, want %s", i, name, wantName)
					}
					toks, err := ReadShard(filepath.Join(out, name))
					if err != nil {
						t.Fatal(err)
					}
					if i < nshards-1 && len(toks) != size {
						t.Errorf("shard %d holds %d tokens, want %d", i, len(toks), size)
					}
					got = append(got, toks...)
				}
				if !slices.Equal(got, want) {
					t.Errorf("shard tokens differ from [EOT]+encode(doc) for each document in order")
				}
				if loaded, err := Load(out); err != nil || !slices.Equal(loaded, want) {
					t.Errorf("Load(out) = %d tokens, %v", len(loaded), err)
				}
			})
		}
	}
}

func TestPrepareReplacesStaleShards(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.txt": "small corpus"})
	out := filepath.Join(dir, "out")
	// An earlier, larger run left three shards; other prefixes and files
	// must survive.
	os.MkdirAll(out, 0o755)
	for _, name := range []string{"data_000000.bin", "data_000001.bin", "data_000002.bin", "other_000005.bin"} {
		if err := WriteShard(filepath.Join(out, name), []uint16{1}); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(out, "data_notes.bin.txt"), nil, 0o644)
	stats, err := Prepare(context.Background(), []string{filepath.Join(dir, "a.txt")}, out, PrepareOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if stats.Shards != 1 {
		t.Errorf("Shards = %d, want 1", stats.Shards)
	}
	want := []string{"data_000000.bin", "data_notes.bin.txt", "other_000005.bin"}
	if got := shardNames(t, out); !slices.Equal(got, want) {
		t.Errorf("output holds %v, want %v", got, want)
	}
	if got, _ := ReadShard(filepath.Join(out, "data_000000.bin")); !slices.Equal(got, expectTokens(t, "small corpus")) {
		t.Errorf("shard 0 was not replaced: %v", got)
	}
}

func TestPrepareErrors(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"ok.txt":           "fine",
		"bad/x.jsonl":      "{\"text\": \"ok\"}\n\n{\"text\": oops}\n",
		"notext/x.jsonl":   "{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n",
		"nulltext/x.jsonl": "{\"text\": null}\n",
		"array/x.jsonl":    "[\"text\"]\n",
		"number/x.jsonl":   "{\"text\": 5}\n",
		"blank/x.jsonl":    "\n\n",
		"empty/readme.md":  "no inputs here",
		"unsupported.csv":  "a,b",
	})
	in := func(name string) string { return filepath.Join(dir, filepath.FromSlash(name)) }
	tests := []struct {
		name   string
		inputs []string
		opts   PrepareOptions
		line   int      // for *FormatError, the line it must name
		want   []string // substrings of the message
	}{
		{"bad json", []string{in("ok.txt"), in("bad")}, PrepareOptions{}, 3, []string{in("bad/x.jsonl") + ":3", "invalid JSON"}},
		{"missing text", []string{in("notext")}, PrepareOptions{}, 2, []string{in("notext/x.jsonl") + ":2", `missing "text"`}},
		{"null text", []string{in("nulltext")}, PrepareOptions{}, 1, []string{":1", `missing "text"`}},
		{"array", []string{in("array")}, PrepareOptions{}, 1, []string{":1", "invalid JSON"}},
		{"number", []string{in("number")}, PrepareOptions{}, 1, []string{":1", "invalid JSON"}},
		{"missing input", []string{in("ok.txt"), in("nope.txt")}, PrepareOptions{}, 0, []string{in("nope.txt"), "no such file"}},
		{"unsupported file", []string{in("unsupported.csv")}, PrepareOptions{}, 0, []string{"unsupported.csv", ".txt or .jsonl"}},
		{"no files", []string{in("empty")}, PrepareOptions{}, 0, []string{"no .txt or .jsonl files", in("empty")}},
		{"only blank lines", []string{in("blank")}, PrepareOptions{}, 0, []string{"no documents"}},
		{"no inputs", nil, PrepareOptions{}, 0, []string{"no inputs"}},
		{"bad prefix", []string{in("ok.txt")}, PrepareOptions{Prefix: "a/b"}, 0, []string{"prefix"}},
		{"bad shard size", []string{in("ok.txt")}, PrepareOptions{ShardTokens: -1}, 0, []string{"shard size"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			os.MkdirAll(out, 0o755)
			// A previous good dataset must survive a failed run.
			if err := WriteShard(filepath.Join(out, "data_000000.bin"), []uint16{42}); err != nil {
				t.Fatal(err)
			}
			_, err := Prepare(context.Background(), tt.inputs, out, tt.opts)
			if err == nil {
				t.Fatal("Prepare succeeded")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			var fe *FormatError
			if isFE := errors.As(err, &fe); isFE != (tt.line > 0) {
				t.Errorf("error %v: *FormatError = %t, want %t", err, isFE, tt.line > 0)
			} else if isFE && fe.Line != tt.line {
				t.Errorf("FormatError.Line = %d, want %d", fe.Line, tt.line)
			}
			if got := shardNames(t, out); !slices.Equal(got, []string{"data_000000.bin"}) {
				t.Errorf("failed Prepare left %v in the output directory", got)
			}
			if got, _ := ReadShard(filepath.Join(out, "data_000000.bin")); !slices.Equal(got, []uint16{42}) {
				t.Errorf("failed Prepare changed the existing shard")
			}
		})
	}
	_, err := Prepare(context.Background(), []string{in("nope")}, t.TempDir(), PrepareOptions{})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing input error %v does not wrap fs.ErrNotExist", err)
	}
}

func TestPrepareCancelled(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.txt": "text", "b.txt": "more"})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out := filepath.Join(dir, "out")
	_, err := Prepare(ctx, []string{dir}, out, PrepareOptions{})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Prepare(cancelled) = %v, want context.Canceled", err)
	}
	if names := shardNames(t, out); len(names) != 0 {
		t.Errorf("cancelled Prepare left %v", names)
	}
}

func TestPrepareProgress(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.txt": strings.Repeat("progress ", 1000)})
	var buf bytes.Buffer
	stats, err := Prepare(context.Background(), []string{dir}, filepath.Join(dir, "out"), PrepareOptions{Progress: &buf})
	if err != nil {
		t.Fatal(err)
	}
	s := buf.String()
	if !strings.HasPrefix(s, "\r") || !strings.HasSuffix(s, "\n") || strings.Count(s, "\n") != 1 {
		t.Errorf("progress %q is not a line redrawn with \\r and ended with one newline", s)
	}
	last := s[strings.LastIndex(s, "\r")+1:]
	for _, w := range []string{"100.0%", "8.8 KiB / 8.8 KiB", units.Metric(float64(stats.Tokens)) + " tokens", "tokens/s",
		"[" + strings.Repeat("=", 30) + "]"} {
		if !strings.Contains(last, w) {
			t.Errorf("final progress line %q does not contain %q", last, w)
		}
	}
}

func TestSplitDocPreservesTokens(t *testing.T) {
	tok := newTestTokenizer(t)
	var sb strings.Builder
	lines := []string{
		"First Citizen:", "Before we proceed any further, hear me speak.", "",
		"  indented line", "it's they're we'll I'd", "\ttab\tseparated", "trailing spaces   ",
		"x", "numbers 12345 and 3.14", "héllo wörld 世界", "!!!???", "", "", "end.",
		"'quoted'", "\"double\"", "a\r", "mixed \n", "(parens)",
	}
	for i := range 300 {
		sb.WriteString(lines[i%len(lines)])
		sb.WriteByte('\n')
	}
	text := sb.String()
	want := tok.Encode(text)
	for _, size := range []int{1, 7, 64, 500, len(text) - 3, len(text) + 1} {
		segs := splitDoc(text, size)
		if strings.Join(segs, "") != text {
			t.Fatalf("size %d: segments do not rebuild the text", size)
		}
		if size == 1 && len(segs) < 100 {
			t.Errorf("size %d: only %d segments; the test text should be cut often", size, len(segs))
		}
		var got []int
		for _, s := range segs {
			if len(s) < size && s != segs[len(segs)-1] {
				t.Errorf("size %d: segment of %d bytes before the last", size, len(s))
			}
			got = append(got, tok.Encode(s)...)
		}
		if !slices.Equal(got, want) {
			t.Errorf("size %d (%d segments): tokens differ from encoding the whole text", size, len(segs))
		}
	}
	// Without a safe newline the document stays whole.
	for _, s := range []string{"no newline at all", "a \nb", "a\n b", "a\n\nb", "é\nb", "ab\n"} {
		if got := splitDoc(s, 1); len(got) != 1 {
			t.Errorf("splitDoc(%q) = %q, want it whole", s, got)
		}
	}
	if got := splitDoc("ab\ncd\nef", 1); !slices.Equal(got, []string{"ab\n", "cd\n", "ef"}) {
		t.Errorf("splitDoc = %q", got)
	}
}

func TestPrepareLongDocument(t *testing.T) {
	// A document several segments long must come out exactly as if it had
	// been tokenized whole, and count as one document.
	var sb strings.Builder
	for i := 0; sb.Len() < 2*segmentBytes+100; i++ {
		fmt.Fprintf(&sb, "Line %d of a long document, with words.\n", i)
	}
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"long.txt": sb.String(), "short.txt": "short"})
	out := filepath.Join(dir, "out")
	stats, err := Prepare(context.Background(), []string{dir}, out, PrepareOptions{Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	want := expectTokens(t, sb.String(), "short")
	got, err := Load(out)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("long document tokens differ from tokenizing it whole (%d vs %d tokens)", len(got), len(want))
	}
	if stats.Documents != 2 || stats.Files != 2 || stats.Tokens != len(want) {
		t.Errorf("stats = %+v, want 2 files, 2 documents, %d tokens", stats, len(want))
	}
}

// TestProgressWithinAFile: a .txt file of several segments is sent in
// chunks that each carry the input bytes of their text, so the progress
// line moves while one large file is tokenized; together they carry the
// whole file.
func TestProgressWithinAFile(t *testing.T) {
	line := strings.Repeat("word ", 20) + "x\ny"
	doc := "\ufeff" + strings.Repeat(line, 3*segmentBytes/len(line)+10)
	path := filepath.Join(t.TempDir(), "big.txt")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	jobs := make(chan chunk, 16)
	tickets := make(chan struct{}, 16)
	k := &chunker{ctx: context.Background(), seg: segmentBytes, jobs: jobs, tickets: tickets}
	if err := readText(path, k); err != nil {
		t.Fatal(err)
	}
	close(jobs)
	var got []int64
	var sum int64
	for c := range jobs {
		got = append(got, c.bytes)
		sum += c.bytes
	}
	// The last segment is still in the chunker, waiting for more text.
	if len(got) < 3 {
		t.Fatalf("%d chunks sent for a %d-byte file, want at least 3", len(got), len(doc))
	}
	for i, b := range got {
		if b < segmentBytes {
			t.Errorf("chunk %d carries %d input bytes, want at least a segment's %d", i, b, segmentBytes)
		}
	}
	if sum+k.c.bytes != int64(len(doc)) {
		t.Errorf("the chunks carry %d + %d bytes of a %d-byte file", sum, k.c.bytes, len(doc))
	}
}

// TestPrepareTokenizerJSON: Prepare with a tokenizer.json written from
// GPT-2's data writes the very shards the built-in tokenizer writes; with
// a Llama-3-style one of 100,277 tokens it writes 32-bit shards, each
// document after <|begin_of_text|>, that LoadOf reads back. A document
// longer than a segment, cut for the workers, tokenizes as a whole.
func TestPrepareTokenizerJSON(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, corpusFiles)
	long := longText(t, segmentBytes+segmentBytes/2) // cut in two for the workers
	writeFiles(t, dir, map[string]string{"in/long.txt": long})
	inputs := []string{filepath.Join(dir, "in"), filepath.Join(dir, "extra", "explicit.jsonl")}
	docs := slices.Insert(slices.Clone(corpusDocs), 3, long) // in/long.txt sorts after in/b.txt

	b, _ := gpt2JSON()
	gpt2, _ := loadJSON(t, b)
	builtinOut, jsonOut := filepath.Join(dir, "builtin"), filepath.Join(dir, "gpt2json")
	if _, err := Prepare(context.Background(), inputs, builtinOut, PrepareOptions{ShardTokens: 50_000}); err != nil {
		t.Fatal(err)
	}
	st, err := Prepare(context.Background(), inputs, jsonOut, PrepareOptions{ShardTokens: 50_000, Tokenizer: gpt2})
	if err != nil {
		t.Fatal(err)
	}
	if st.Documents != len(docs) || st.Shards < 2 {
		t.Errorf("stats %+v: want %d documents in several shards", st, len(docs))
	}
	for _, name := range shardNames(t, builtinOut) {
		a, _ := os.ReadFile(filepath.Join(builtinOut, name))
		b, err := os.ReadFile(filepath.Join(jsonOut, name))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s differs between the built-in tokenizer and its tokenizer.json (%v)", name, err)
		}
	}

	llama, _ := loadJSON(t, cl100kJSON())
	out := filepath.Join(dir, "llama")
	if _, err := Prepare(context.Background(), inputs, out, PrepareOptions{Tokenizer: llama}); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(out, "data_000000.bin"))
	if err != nil || len(raw) < 8 || binary.LittleEndian.Uint32(raw) != ShardMagic32 || binary.LittleEndian.Uint32(raw[4:]) != ShardVersion32 {
		t.Fatalf("the shard of a 100,277-token vocabulary does not have the 32-bit header (%v)", err)
	}
	got, err := LoadOf[uint32](out)
	if err != nil {
		t.Fatal(err)
	}
	var want []uint32
	for _, d := range docs {
		want = append(want, 100264)
		for _, id := range llama.Encode(d) {
			want = append(want, uint32(id))
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("32-bit shards hold %d tokens, want %d: each document as <|begin_of_text|> and its tokens", len(got), len(want))
	}

	// A tokenizer without a separator cannot prepare.
	var doc map[string]any
	json.Unmarshal(tinyJSON(), &doc)
	doc["post_processor"] = nil
	b, _ = json.Marshal(doc)
	nosep, _ := loadJSON(t, b)
	_, err = Prepare(context.Background(), inputs, filepath.Join(dir, "nosep"), PrepareOptions{Tokenizer: nosep})
	if err == nil || !strings.Contains(err.Error(), "no document separator") || !errors.Is(err, badinput.Err) {
		t.Errorf("Prepare with no separator: %v", err)
	}
}

// longText is the embedded docs repeated to at least n bytes: one
// document longer than a segment.
func longText(t testing.TB, n int) string {
	docs := docsText(t)
	return strings.Repeat(docs, n/len(docs)+1)
}
