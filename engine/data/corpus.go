package data

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"

	"github.com/gptui/gptui/badinput"
)

// BuiltinCorpus tokenizes every *.md file in fsys, searching it
// recursively, in sorted path order, with GPT-2's tokenizer, each document
// preceded by [EOT]: the same layout [Prepare] writes. The command line
// passes gptui.Docs, the project's documentation, which serves as the
// quickstart training corpus.
func BuiltinCorpus(fsys fs.FS) ([]uint16, error) { return BuiltinCorpusWith(fsys, nil) }

// BuiltinCorpusWith is [BuiltinCorpus] with the tokenizer tok (GPT-2's if
// nil), each document preceded by its separator. A tokenizer whose
// vocabulary does not fit 16-bit tokens, or that has no separator, is
// refused.
func BuiltinCorpusWith(fsys fs.FS, tok *Tokenizer) ([]uint16, error) {
	docs, err := readCorpus(fsys)
	if err != nil {
		return nil, err
	}
	if tok, err = corpusTokenizer(tok); err != nil {
		return nil, err
	}
	return docs.tokenize(tok), nil
}

// corpusTokenizer returns tok, or GPT-2's tokenizer if tok is nil, or an
// error if its vocabulary needs more than 16-bit tokens.
func corpusTokenizer(tok *Tokenizer) (*Tokenizer, error) {
	if tok == nil {
		return NewTokenizer()
	}
	if tok.VocabSize() > 1<<16 || tok.sep < 0 {
		return nil, badinput.Wrap(fmt.Errorf("data: built-in corpus: the tokenizer has %d tokens or no document separator; "+
			"the built-in corpus takes a tokenizer of at most 65,536 tokens with one; prepare shards with `gptui data prepare --tokenizer` instead",
			tok.VocabSize()))
	}
	return tok, nil
}

// CachedCorpus returns what [BuiltinCorpus] returns for fsys: see
// [CachedCorpusWith].
func CachedCorpus(fsys fs.FS, dir string) ([]uint16, error) { return CachedCorpusWith(fsys, dir, nil) }

// CachedCorpusWith returns what [BuiltinCorpusWith] returns for fsys and tok, read from a
// token shard in dir that an earlier call wrote, when there is one, so that
// every worker of a job does not tokenize the same documents again (the
// BPE tables' load and the encoding are most of a small worker's start).
//
// The shard's name holds the SHA-256 of the tokenizer's name (for a
// tokenizer.json, the SHA-256 of the file) and every document's path and
// bytes, so an edited document, another build's documents or another
// tokenizer is another shard. A shard that cannot be read, is malformed
// or holds a token outside the vocabulary is ignored: the documents are
// tokenized, and the result written over it. Failing to write the cache
// (no dir, a read-only file system) is not an error; dir "" means no cache.
// Concurrent callers may each tokenize; each writes a whole shard and
// renames it into place, so a reader never sees a partial one.
func CachedCorpusWith(fsys fs.FS, dir string, tok *Tokenizer) ([]uint16, error) {
	docs, err := readCorpus(fsys)
	if err != nil {
		return nil, err
	}
	name := tokenizerName
	if tok != nil {
		name = tok.name
	}
	file := filepath.Join(dir, "corpus-"+docs.key(name)+".bin")
	if dir != "" {
		if toks, err := ReadShard(file); err == nil && inVocab(toks, tok) {
			return toks, nil
		}
	}
	if tok, err = corpusTokenizer(tok); err != nil {
		return nil, err
	}
	toks := docs.tokenize(tok)
	if dir == "" {
		return toks, nil
	}
	if os.MkdirAll(dir, 0o755) == nil {
		_ = WriteShard(file, toks) // a cache: a failed write costs the next start a tokenization
	}
	return toks, nil
}

// corpusSource is a corpus's documents, in the order they are tokenized.
type corpusSource struct {
	names []string
	texts [][]byte
}

// readCorpus reads every *.md file of fsys in sorted path order.
func readCorpus(fsys fs.FS) (*corpusSource, error) {
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
	docs := &corpusSource{names: names}
	for _, name := range names {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("data: built-in corpus: %w", err)
		}
		docs.texts = append(docs.texts, b)
	}
	return docs, nil
}

// tokenize encodes the documents, each after the separator.
func (d *corpusSource) tokenize(tok *Tokenizer) []uint16 {
	var tokens []uint16
	for _, b := range d.texts {
		tokens = tok.appendEncoded(tokens, string(b))
	}
	return tokens
}

// key is the hex SHA-256 of the tokenizer's name and the documents' paths
// and contents, each length-prefixed so that no two corpora share a key.
func (d *corpusSource) key(tokenizer string) string {
	h := sha256.New()
	var n [8]byte
	put := func(b []byte) {
		binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	put([]byte(tokenizer))
	for i, name := range d.names {
		put([]byte(name))
		put(d.texts[i])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// inVocab reports whether every token is below the vocabulary of tok
// (GPT-2's if nil).
func inVocab(toks []uint16, tok *Tokenizer) bool {
	v := VocabSize
	if tok != nil {
		v = tok.VocabSize()
	}
	for _, t := range toks {
		if int(t) >= v {
			return false
		}
	}
	return true
}
