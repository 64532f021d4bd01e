package fence

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNextAndCheck(t *testing.T) {
	dir := t.TempDir()
	if g, err := Read(dir); err != nil || g != 0 {
		t.Fatalf("a new workdir's generation: %d, %v; want 0", g, err)
	}
	first, err := Next(dir)
	if err != nil || first != 1 {
		t.Fatalf("Next: %d, %v; want 1", first, err)
	}
	tok := &Token{Dir: dir, Gen: first}
	if err := tok.Check(); err != nil {
		t.Fatalf("the current attempt's token: %v", err)
	}
	second, err := Next(dir)
	if err != nil || second != 2 {
		t.Fatalf("Next: %d, %v; want 2", second, err)
	}
	var stale *StaleError
	if err := tok.Check(); !errors.As(err, &stale) || stale.Gen != 1 || stale.Now != 2 || !strings.Contains(err.Error(), "attempt 2 holds") {
		t.Fatalf("the earlier attempt's token: %v, want a *StaleError 1 < 2", err)
	}
	if err := (*Token)(nil).Check(); err != nil {
		t.Errorf("no token: %v, want nil", err)
	}
}

func TestFromEnv(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want uint64
		err  string
	}{
		{"", 0, ""},
		{"7", 7, ""},
		{"0", 0, "not a generation"},
		{"-1", 0, "not a generation"},
		{"x", 0, "not a generation"},
	} {
		tok, err := FromEnv(func(string) string { return tc.env }, "/w")
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), Env) {
				t.Errorf("%s=%q: %v, want an error naming %s, %q", Env, tc.env, err, Env, tc.err)
			}
		case tc.want == 0:
			if tok != nil || err != nil {
				t.Errorf("%s unset: %+v, %v; want no token", Env, tok, err)
			}
		case err != nil || tok == nil || tok.Gen != tc.want || tok.Dir != "/w":
			t.Errorf("%s=%q: %+v, %v; want generation %d in /w", Env, tc.env, tok, err, tc.want)
		}
	}
}

// TestBadFile: a generation file gptui did not write is an error naming
// it, for Check too: a worker that cannot tell writes nothing.
func TestBadFile(t *testing.T) {
	for _, content := range []string{"", "abc\n", strings.Repeat("9", 40)} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, File), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := (&Token{Dir: dir, Gen: 1}).Check(); err == nil || !strings.Contains(err.Error(), File) {
			t.Errorf("file %q: %v, want an error naming %s", content, err, File)
		}
		if _, err := Next(dir); err == nil {
			t.Errorf("file %q: Next succeeded", content)
		}
	}
}
