package data

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"testing/fstest"

	"github.com/gptui/gptui"
)

func TestBuiltinCorpusDocs(t *testing.T) {
	toks, err := BuiltinCorpus(gptui.Docs)
	if err != nil {
		t.Fatalf("BuiltinCorpus(gptui.Docs): %v", err)
	}
	if len(toks) <= 8000 {
		t.Errorf("built-in corpus has %d tokens, want more than 8000", len(toks))
	}
	if toks[0] != EOT {
		t.Errorf("corpus starts with token %d, want EOT", toks[0])
	}
	docs := 0
	for _, tk := range toks {
		if tk == EOT {
			docs++
		}
		if int(tk) >= VocabSize {
			t.Fatalf("token %d outside the vocabulary", tk)
		}
	}
	files, err := fs.Glob(gptui.Docs, "docs/*.md")
	if err != nil || len(files) < 3 {
		t.Fatalf("gptui.Docs holds %d docs/*.md files (%v), want at least 3", len(files), err)
	}
	if docs != len(files) {
		t.Errorf("corpus holds %d documents, want one per file of docs/: %d", docs, len(files))
	}
	t.Logf("built-in corpus: %d documents, %d tokens", docs, len(toks))
}

func TestBuiltinCorpusOrder(t *testing.T) {
	fsys := fstest.MapFS{
		"docs/b.md":     {Data: []byte("second")},
		"docs/a.md":     {Data: []byte("first")},
		"docs/c.txt":    {Data: []byte("not markdown")},
		"docs/sub/z.md": {Data: []byte("nested")},
		"readme.md":     {Data: []byte("top")},
	}
	got, err := BuiltinCorpus(fsys)
	if err != nil {
		t.Fatal(err)
	}
	want := expectTokens(t, "first", "second", "nested", "top")
	if !slices.Equal(got, want) {
		t.Errorf("BuiltinCorpus = %v, want %v (sorted by path, each after EOT)", got, want)
	}
	if _, err := BuiltinCorpus(fstest.MapFS{"x.txt": {Data: []byte("x")}}); err == nil {
		t.Error("BuiltinCorpus without .md files succeeded")
	}
}

// TestCachedCorpus: the first call tokenizes and writes the cache, later
// calls read it; a cache file that is damaged, foreign or holds a token
// outside the vocabulary is tokenized again and rewritten; another corpus
// has another file; no directory, or one that cannot be written, still
// returns the tokens.
func TestCachedCorpus(t *testing.T) {
	fsys := fstest.MapFS{"docs/a.md": {Data: []byte("first")}, "docs/b.md": {Data: []byte("second")}}
	want := expectTokens(t, "first", "second")
	cacheFile := func(t *testing.T, dir string) string {
		t.Helper()
		m, _ := filepath.Glob(filepath.Join(dir, "corpus-*.bin"))
		if len(m) != 1 {
			t.Fatalf("cache files %v, want one", m)
		}
		return m[0]
	}
	planted := []uint16{EOT, 1, 2, 3}
	tests := []struct {
		name  string
		plant func(t *testing.T, file string) // changes the cache file after the first call
		want  []uint16                        // what the second call returns
	}{
		{"read back", nil, want},
		{"its tokens are used", func(t *testing.T, f string) { mustWriteShard(t, f, planted) }, planted},
		{"truncated", func(t *testing.T, f string) { os.Truncate(f, HeaderBytes+1) }, want},
		{"not a shard", func(t *testing.T, f string) { os.WriteFile(f, []byte("hostile"), 0o644) }, want},
		{"token outside the vocabulary", func(t *testing.T, f string) { mustWriteShard(t, f, []uint16{EOT, VocabSize}) }, want},
		{"a directory", func(t *testing.T, f string) { os.Remove(f); os.Mkdir(f, 0o755) }, want},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "cache")
			got, err := CachedCorpus(fsys, dir)
			if err != nil || !slices.Equal(got, want) {
				t.Fatalf("first call: %v, %v; want %v", got, err, want)
			}
			f := cacheFile(t, dir)
			if tc.plant != nil {
				tc.plant(t, f)
			}
			got, err = CachedCorpus(fsys, dir)
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("second call: %v, %v; want %v", got, err, tc.want)
			}
			if tc.name != "a directory" {
				if toks, err := ReadShard(f); err != nil || !slices.Equal(toks, tc.want) {
					t.Errorf("cache file after the second call holds %v (%v), want %v", toks, err, tc.want)
				}
			}
		})
	}

	t.Run("another corpus, another file", func(t *testing.T) {
		dir := t.TempDir()
		other := fstest.MapFS{"docs/a.md": {Data: []byte("first")}, "docs/b.md": {Data: []byte("Second")}}
		for _, f := range []fs.FS{fsys, other} {
			if _, err := CachedCorpus(f, dir); err != nil {
				t.Fatal(err)
			}
		}
		got, err := CachedCorpus(other, dir)
		if m, _ := filepath.Glob(filepath.Join(dir, "corpus-*.bin")); len(m) != 2 || err != nil || !slices.Equal(got, expectTokens(t, "first", "Second")) {
			t.Errorf("two corpora: files %v, tokens %v (%v)", m, got, err)
		}
	})
	t.Run("no cache", func(t *testing.T) {
		ro := t.TempDir()
		os.Chmod(ro, 0o500)
		for _, dir := range []string{"", ro, filepath.Join(ro, "sub")} {
			got, err := CachedCorpus(fsys, dir)
			if err != nil || !slices.Equal(got, want) {
				t.Errorf("dir %q: %v, %v; want %v", dir, got, err, want)
			}
		}
	})
}

func mustWriteShard(t *testing.T, path string, toks []uint16) {
	t.Helper()
	if err := WriteShard(path, toks); err != nil {
		t.Fatal(err)
	}
}
