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
// int32 values followed by the tokens as little-endian unsigned integers.
// The header holds a magic number at index 0, the version at index 1 and
// the number of tokens at index 2; the remaining entries are reserved and
// written as zero. The magic and version say how wide a token is:
//
//   - ShardMagic, ShardVersion: 16-bit tokens, for vocabularies of up to
//     65,536 tokens such as GPT-2's (llm.c's "gpt-2" shards);
//   - ShardMagic32, ShardVersion32: 32-bit tokens, for larger vocabularies
//     such as Llama 3's 128,256 (llm.c's "llama-3" shards).
//
// These are the formats of llm.c's data preprocessing scripts, so shards
// are interchangeable with llm.c.
const (
	ShardMagic     = 20240520
	ShardVersion   = 1
	ShardMagic32   = 20240801
	ShardVersion32 = 7
	HeaderInts     = 256
	HeaderBytes    = HeaderInts * 4
)

// Token is the type of a token in memory: uint16 holds the ids of
// vocabularies of up to 65,536 tokens, uint32 any.
type Token interface{ ~uint16 | ~uint32 }

// tokenWidth is the size in bytes of a T.
func tokenWidth[T Token]() int {
	if v := uint32(1 << 16); uint32(T(v)) != v {
		return 2
	}
	return 4
}

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
// size, the total length of the file in bytes, and returns the token
// count and the width of a token in bytes.
func checkHeader(name string, h []byte, size int64) (n, width int, err error) {
	magic := int32(binary.LittleEndian.Uint32(h[0:]))
	version := int32(binary.LittleEndian.Uint32(h[4:]))
	ntok := int32(binary.LittleEndian.Uint32(h[8:]))
	var want int32
	switch magic {
	case ShardMagic:
		want, width = ShardVersion, 2
	case ShardMagic32:
		want, width = ShardVersion32, 4
	default:
		return 0, 0, formatErrorf(name, "bad magic number %d (want %d, or %d for 32-bit tokens): not a token shard; %s",
			magic, ShardMagic, ShardMagic32, prepareHint)
	}
	if version != want {
		return 0, 0, formatErrorf(name, "unsupported shard version %d (want %d after magic %d); %s",
			version, want, magic, prepareHint)
	}
	if ntok <= 0 {
		return 0, 0, formatErrorf(name, "header says %d tokens: the shard holds no data; %s", ntok, prepareHint)
	}
	payload := size - HeaderBytes
	if payload%int64(width) != 0 {
		return 0, 0, formatErrorf(name, "truncated: header says %d tokens but the file holds %d bytes of tokens, "+
			"not a whole number of %d-byte tokens; %s", ntok, payload, width, prepareHint)
	}
	if have := payload / int64(width); have != int64(ntok) {
		what := "truncated"
		if have > int64(ntok) {
			what = "trailing data"
		}
		return 0, 0, formatErrorf(name, "%s: header says %d tokens but the file holds %d; %s",
			what, ntok, have, prepareHint)
	}
	return int(ntok), width, nil
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

// decodeTokens fills dst from the little-endian tokens of the given width
// in src, and returns the index in dst of the first token that does not
// fit a T, or -1.
func decodeTokens[T Token](dst []T, src []byte, width int) int {
	if width == 2 {
		for i := range dst {
			dst[i] = T(binary.LittleEndian.Uint16(src[2*i:]))
		}
		return -1
	}
	for i := range dst {
		v := binary.LittleEndian.Uint32(src[4*i:])
		if uint32(T(v)) != v {
			return i
		}
		dst[i] = T(v)
	}
	return -1
}

// ReadShard reads the shard at path as 16-bit tokens: see [ReadShardOf].
func ReadShard(path string) ([]uint16, error) { return ReadShardOf[uint16](path) }

// ReadShardOf reads the shard at path, of either token width, into
// tokens of type T. Malformed input yields a *FormatError that says what
// is wrong: a missing or short header, bad magic, an unsupported version,
// a token count that disagrees with the file length, no tokens at all, or
// a 32-bit token too large for T. I/O problems are returned wrapped.
func ReadShardOf[T Token](path string) ([]T, error) {
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
	n, width, err := checkHeader(path, h[:], size)
	if err != nil {
		return nil, err
	}
	// Decode in bounded chunks so a large shard costs its tokens in memory,
	// not its tokens plus a second copy of its bytes. The header's count
	// has been checked against the file's size, so it is what the file
	// holds, not what a header claims.
	tokens := make([]T, n)
	buf := make([]byte, 1<<20)
	for done := 0; done < n; {
		k := min(n-done, len(buf)/width)
		if _, err := io.ReadFull(f, buf[:width*k]); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
				return nil, formatErrorf(path, "truncated while reading: header says %d tokens, "+
					"file ended after %d; %s", n, done, prepareHint)
			}
			return nil, fmt.Errorf("data: reading shard %s: %w", path, err)
		}
		if i := decodeTokens(tokens[done:done+k], buf[:width*k], width); i >= 0 {
			j := done + i
			return nil, formatErrorf(path, "token %d at byte offset %d does not fit %d bits: the shard is for a vocabulary above 65,536 tokens, which this model does not read",
				binary.LittleEndian.Uint32(buf[width*i:]), HeaderBytes+int64(width)*int64(j), 8*tokenWidth[T]())
		}
		done += k
	}
	return tokens, nil
}

// WriteShard writes tokens to path as a shard of T's width: 16-bit tokens
// (ShardMagic) for []uint16, 32-bit tokens (ShardMagic32) for []uint32.
// It writes a temporary file in the same directory and renames it into
// place, so readers never see a partial shard. tokens must be non-empty
// and hold at most math.MaxInt32 tokens, the most the header can describe.
func WriteShard[T Token](path string, tokens []T) error {
	w, err := newShardWriter(path, tokenWidth[T]())
	if err != nil {
		return err
	}
	if err := writeTokens(w, tokens); err != nil {
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
	path  string // final path
	tmp   string // temporary file being written
	width int    // bytes per token: 2 or 4
	f     *os.File
	n     int64  // tokens written
	buf   []byte // encoding scratch space
}

// newShardWriter creates the temporary file for a shard of width-byte
// tokens bound for path and writes a placeholder header.
func newShardWriter(path string, width int) (*shardWriter, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp*")
	if err != nil {
		return nil, fmt.Errorf("data: writing shard: %w", err)
	}
	w := &shardWriter{path: path, tmp: f.Name(), width: width, f: f, buf: make([]byte, 1<<20)}
	if _, err := f.Write(make([]byte, HeaderBytes)); err != nil {
		w.abort()
		return nil, fmt.Errorf("data: writing shard %s: %w", path, err)
	}
	return w, nil
}

// writeTokens appends tokens to the shard. A token too large for the
// shard's width is an error.
func writeTokens[T Token](w *shardWriter, tokens []T) error {
	if w.n+int64(len(tokens)) > math.MaxInt32 {
		return fmt.Errorf("data: writing shard %s: more than %d tokens do not fit the header", w.path, math.MaxInt32)
	}
	for len(tokens) > 0 {
		k := min(len(tokens), len(w.buf)/w.width)
		for i, t := range tokens[:k] {
			if w.width == 4 {
				binary.LittleEndian.PutUint32(w.buf[4*i:], uint32(t))
				continue
			}
			if uint32(t) > math.MaxUint16 {
				return fmt.Errorf("data: writing shard %s: token %d does not fit a 16-bit shard", w.path, uint32(t))
			}
			binary.LittleEndian.PutUint16(w.buf[2*i:], uint16(t))
		}
		if _, err := w.f.Write(w.buf[:w.width*k]); err != nil {
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
	magic, version := uint32(ShardMagic), uint32(ShardVersion)
	if w.width == 4 {
		magic, version = ShardMagic32, ShardVersion32
	}
	binary.LittleEndian.PutUint32(h[0:], magic)
	binary.LittleEndian.PutUint32(h[4:], version)
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
