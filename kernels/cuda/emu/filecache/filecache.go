// Package filecache keeps what the tests build with a C or C++ compiler
// (the kernel emulator's programs, the stand-in GPU libraries) under the
// user's cache directory, so that the tests of a run, and the next run,
// build each once. An entry is a directory named by Key of everything
// that went into it, written whole by Store or not at all.
package filecache

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
)

// Dir returns gptui/name under the user's cache directory, or "" where
// there is none.
func Dir(name string) string {
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "gptui", name)
}

// Key is the hex SHA-256 of parts (strings or byte slices), each
// length-prefixed.
func Key(parts ...any) string {
	h := sha256.New()
	for _, p := range parts {
		var b []byte
		switch p := p.(type) {
		case string:
			b = []byte(p)
		case []byte:
			b = p
		}
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Store stores the files of from (name in the entry → path) as the entry
// dir, written in a directory of its own beside it and renamed into
// place, so that a process reading it alongside sees the whole entry or
// none. An entry another process stored first is kept, and Store returns
// the rename's error.
func Store(dir string, from map[string]string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".tmp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	for name, path := range from {
		b, err := os.ReadFile(path)
		if err == nil {
			err = os.WriteFile(filepath.Join(tmp, name), b, 0o755)
		}
		if err != nil {
			return err
		}
	}
	return os.Rename(tmp, dir)
}
