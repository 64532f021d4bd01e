package data

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
)

// BuiltinCorpus tokenizes every *.md file in fsys, searching it
// recursively, in sorted path order, each document preceded by [EOT]: the
// same layout [Prepare] writes. The command line passes gptui.Docs, the
// project's documentation, which serves as the quickstart training corpus.
func BuiltinCorpus(fsys fs.FS) ([]uint16, error) {
	var names []string
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && path.Ext(p) == ".md" {
			names = append(names, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("data: built-in corpus: %w", err)
	}
	if len(names) == 0 {
		return nil, errors.New("data: built-in corpus: no .md files found")
	}
	sort.Strings(names)
	tok, err := NewTokenizer()
	if err != nil {
		return nil, err
	}
	var tokens []uint16
	for _, name := range names {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("data: built-in corpus: %w", err)
		}
		tokens = tok.appendEncoded(tokens, string(b))
	}
	return tokens, nil
}
