package data

import (
	"io/fs"
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
