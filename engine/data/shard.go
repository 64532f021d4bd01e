package data

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"

	"github.com/gptui/gptui/badinput"
)

// Shard format constants. A shard is a header of HeaderInts little-endian
// int32 values followed by the tokens as little-endian uint16 values. The
// header holds ShardMagic at index 0, ShardVersion at index 1 and the
// number of tokens at index 2; the remaining entries are reserved and
// written as zero. This is the format of llm.c's fineweb/tinyshakespeare
// preprocessing scripts, so shards are interchangeable with llm.c.
const (
	ShardMagic   = 20240520
	ShardVersion = 1
	HeaderInts   = 256
	HeaderBytes  = HeaderInts * 4
)

// prepareHint is appended to format errors: a damaged or foreign shard is
// fixed by regenerating it.
const prepareHint = "re-run `gptui data prepare` to regenerate it"

// FormatError reports a file whose contents are not what gptui expects:
// a malformed token shard, or a malformed line of a .jsonl input. The
// command line maps it to its data-error exit status.
type FormatError struct {
	// File is the path of the offending file.
	File string
	// Line is the 1-based line number for line-oriented inputs, or 0.
	Line int
	// Msg says what is wrong and what to do about it.
	Msg string
	// Err is the underlying error, if any, such as a JSON syntax error.
	Err error
}

// Error returns "file: msg", or "file:line: msg" when Line is set,
// followed by ": err" when Err is set.
func (e *FormatError) Error() string {
	where := e.File
	if e.Line > 0 {
		where = fmt.Sprintf("%s:%d", e.File, e.Line)
	}
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", where, e.Msg, e.Err)
	}
	return where + ": " + e.Msg
}

// Is reports that a FormatError is bad input (badinput.Err).
func (e *FormatError) Is(target error) bool { return badinput.Is(target) }

// Unwrap returns e.Err.
func (e *FormatError) Unwrap() error { return e.Err }

// formatErrorf returns a *FormatError for a shard.
func formatErrorf(file, format string, args ...any) *FormatError {
	return &FormatError{File: file, Msg: fmt.Sprintf(format, args...)}
}

// checkHeader validates the shard header in h (HeaderBytes long) against
// size, the total length of the file in bytes, and returns the token count.
func checkHeader(name string, h []byte, size int64) (int, error) {
	magic := int32(binary.LittleEndian.Uint32(h[0:]))
	version := int32(binary.LittleEndian.Uint32(h[4:]))
	ntok := int32(binary.LittleEndian.Uint32(h[8:]))
	if magic != ShardMagic {
		return 0, formatErrorf(name, "bad magic number %d (want %d): not a token shard; %s",
			magic, ShardMagic, prepareHint)
	}
	if version != ShardVersion {
		return 0, formatErrorf(name, "unsupported shard version %d (want %d); %s",
			version, ShardVersion, prepareHint)
	}
	if ntok <= 0 {
		return 0, formatErrorf(name, "header says %d tokens: the shard holds no data; %s", ntok, prepareHint)
	}
	payload := size - HeaderBytes
	if payload%2 != 0 {
		return 0, formatErrorf(name, "truncated: header says %d tokens but the file holds %d bytes of tokens, "+
			"not a whole number of 2-byte tokens; %s", ntok, payload, prepareHint)
	}
	if have := payload / 2; have != int64(ntok) {
		what := "truncated"
		if have > int64(ntok) {
			what = "trailing data"
		}
		return 0, formatErrorf(name, "%s: header says %d tokens but the file holds %d; %s",
			what, ntok, have, prepareHint)
	}
	return int(ntok), nil
}

// checkSize rejects files too short to hold a header.
func checkSize(name string, size int64) error {
	switch {
	case size == 0:
		return formatErrorf(name, "empty file, not a token shard; %s", prepareHint)
	case size < HeaderBytes:
		return formatErrorf(name, "truncated header: %d bytes, a shard header is %d bytes; %s",
			size, HeaderBytes, prepareHint)
	}
	return nil
}

// decodeTokens fills dst from the little-endian uint16 values in src.
func decodeTokens(dst []uint16, src []byte) {
	for i := range dst {
		dst[i] = binary.LittleEndian.Uint16(src[2*i:])
	}
}

// ReadShard reads the shard at path. Malformed input yields a *FormatError
// that says what is wrong: a missing or short header, bad magic, an
// unsupported version, a token count that disagrees with the file length,
// or no tokens at all. I/O problems are returned wrapped.
func ReadShard(path string) ([]uint16, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: reading shard: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("data: reading shard: %w", err)
	}
	size := fi.Size()
	if err := checkSize(path, size); err != nil {
		return nil, err
	}
	var h [HeaderBytes]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		return nil, fmt.Errorf("data: reading shard %s: %w", path, err)
	}
	n, err := checkHeader(path, h[:], size)
	if err != nil {
		return nil, err
	}
	// Decode in bounded chunks so a large shard costs its tokens in memory,
	// not its tokens plus a second copy of its bytes.
	tokens := make([]uint16, n)
	buf := make([]byte, 1<<20)
	for done := 0; done < n; {
		k := min(n-done, len(buf)/2)
		if _, err := io.ReadFull(f, buf[:2*k]); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
				return nil, formatErrorf(path, "truncated while reading: header says %d tokens, "+
					"file ended after %d; %s", n, done, prepareHint)
			}
			return nil, fmt.Errorf("data: reading shard %s: %w", path, err)
		}
		decodeTokens(tokens[done:done+k], buf[:2*k])
		done += k
	}
	return tokens, nil
}

// WriteShard writes tokens to path as a shard. It writes a temporary file
// in the same directory and renames it into place, so readers never see a
// partial shard. tokens must be non-empty and hold at most math.MaxInt32
// tokens, the most the header can describe.
func WriteShard(path string, tokens []uint16) error {
	w, err := newShardWriter(path)
	if err != nil {
		return err
	}
	if err := w.write(tokens); err != nil {
		w.abort()
		return err
	}
	if err := w.finish(); err != nil {
		return err
	}
	if err := os.Rename(w.tmp, path); err != nil {
		os.Remove(w.tmp)
		return fmt.Errorf("data: writing shard: %w", err)
	}
	return nil
}

// shardWriter streams tokens into a temporary shard file next to its final
// path. finish fills in the header, and the caller renames tmp to path.
type shardWriter struct {
	path string // final path
	tmp  string // temporary file being written
	f    *os.File
	n    int64  // tokens written
	buf  []byte // encoding scratch space
}

// newShardWriter creates the temporary file for a shard bound for path and
// writes a placeholder header.
func newShardWriter(path string) (*shardWriter, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp*")
	if err != nil {
		return nil, fmt.Errorf("data: writing shard: %w", err)
	}
	w := &shardWriter{path: path, tmp: f.Name(), f: f, buf: make([]byte, 1<<20)}
	if _, err := f.Write(make([]byte, HeaderBytes)); err != nil {
		w.abort()
		return nil, fmt.Errorf("data: writing shard %s: %w", path, err)
	}
	return w, nil
}

// write appends tokens to the shard.
func (w *shardWriter) write(tokens []uint16) error {
	if w.n+int64(len(tokens)) > math.MaxInt32 {
		return fmt.Errorf("data: writing shard %s: more than %d tokens do not fit the header", w.path, math.MaxInt32)
	}
	for len(tokens) > 0 {
		k := min(len(tokens), len(w.buf)/2)
		for i, t := range tokens[:k] {
			binary.LittleEndian.PutUint16(w.buf[2*i:], t)
		}
		if _, err := w.f.Write(w.buf[:2*k]); err != nil {
			return fmt.Errorf("data: writing shard %s: %w", w.path, err)
		}
		w.n += int64(k)
		tokens = tokens[k:]
	}
	return nil
}

// finish writes the header, syncs and closes the temporary file. On error
// the temporary file is removed.
func (w *shardWriter) finish() error {
	if w.n == 0 {
		w.abort()
		return fmt.Errorf("data: writing shard %s: no tokens to write", w.path)
	}
	var h [HeaderBytes]byte
	binary.LittleEndian.PutUint32(h[0:], ShardMagic)
	binary.LittleEndian.PutUint32(h[4:], ShardVersion)
	binary.LittleEndian.PutUint32(h[8:], uint32(w.n))
	_, err := w.f.WriteAt(h[:], 0)
	if err == nil {
		err = w.f.Chmod(0o644)
	}
	if err == nil {
		err = w.f.Sync()
	}
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(w.tmp)
		return fmt.Errorf("data: writing shard %s: %w", w.path, err)
	}
	return nil
}

// abort closes and removes the temporary file.
func (w *shardWriter) abort() {
	w.f.Close()
	os.Remove(w.tmp)
}
