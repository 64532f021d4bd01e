package data

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// rawShard builds shard bytes by hand: the given header values followed by
// the tokens.
func rawShard(magic, version, ntok int32, tokens []uint16) []byte {
	b := make([]byte, HeaderBytes+2*len(tokens))
	binary.LittleEndian.PutUint32(b[0:], uint32(magic))
	binary.LittleEndian.PutUint32(b[4:], uint32(version))
	binary.LittleEndian.PutUint32(b[8:], uint32(ntok))
	for i, t := range tokens {
		binary.LittleEndian.PutUint16(b[HeaderBytes+2*i:], t)
	}
	return b
}

// rawShard32 builds a shard of 32-bit tokens by hand.
func rawShard32(magic, version, ntok int32, tokens []uint32) []byte {
	b := make([]byte, HeaderBytes+4*len(tokens))
	binary.LittleEndian.PutUint32(b[0:], uint32(magic))
	binary.LittleEndian.PutUint32(b[4:], uint32(version))
	binary.LittleEndian.PutUint32(b[8:], uint32(ntok))
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(b[HeaderBytes+4*i:], t)
	}
	return b
}

func seqTokens(n int) []uint16 {
	t := make([]uint16, n)
	for i := range t {
		t[i] = uint16(i*7919 + 3)
	}
	return t
}

func TestShardRoundTrip(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []int{1, 2, 1000, 1<<19 + 3} { // the last spans several read chunks
		path := filepath.Join(dir, "s.bin")
		want := seqTokens(n)
		if err := WriteShard(path, want); err != nil {
			t.Fatalf("WriteShard(%d tokens): %v", n, err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		// The file must match the format byte for byte, with zeroed
		// reserved header entries.
		if !slices.Equal(b, rawShard(ShardMagic, ShardVersion, int32(n), want)) {
			t.Fatalf("%d tokens: file bytes differ from the llm.c layout", n)
		}
		got, err := ReadShard(path)
		if err != nil {
			t.Fatalf("ReadShard: %v", err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("ReadShard(%d tokens) differs from what was written", n)
		}
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
			t.Errorf("shard mode = %v, %v; want 0644", fi.Mode().Perm(), err)
		}
	}
	// Overwriting replaces the file, and no temporary files are left.
	path := filepath.Join(dir, "s.bin")
	if err := WriteShard(path, []uint16{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadShard(path); err != nil || !slices.Equal(got, []uint16{1, 2, 3}) {
		t.Errorf("after overwrite ReadShard = %v, %v", got, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want just the shard", len(entries))
	}
}

// TestShard32RoundTrip: []uint32 tokens make a shard of llm.c's llama-3
// layout (magic 20240801, version 7, 32-bit tokens), read back whole as
// uint32 and, when every token fits, as uint16; a token above 65,535
// refuses to be read as uint16, naming its byte offset, or written into a
// 16-bit shard.
func TestShard32RoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.bin")
	want := make([]uint32, 1<<18+5) // spans several read chunks
	for i := range want {
		want[i] = uint32(i*7919+3) % 128256
	}
	if err := WriteShard(path, want); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(b, rawShard32(ShardMagic32, ShardVersion32, int32(len(want)), want)) {
		t.Fatal("file bytes differ from llm.c's llama-3 layout")
	}
	if got, err := ReadShardOf[uint32](path); err != nil || !slices.Equal(got, want) {
		t.Fatalf("ReadShardOf[uint32] = %d tokens, %v; want what was written", len(got), err)
	}
	first := slices.IndexFunc(want, func(v uint32) bool { return v > 0xffff })
	_, err = ReadShard(path)
	var fe *FormatError
	if !errors.As(err, &fe) || fe.File != path || !strings.Contains(err.Error(),
		fmt.Sprintf("token %d at byte offset %d does not fit 16 bits", want[first], HeaderBytes+4*first)) {
		t.Errorf("ReadShard of 32-bit tokens above 65,535: %v", err)
	}
	small := []uint32{0, 1, 65535}
	if err := WriteShard(path, small); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadShard(path); err != nil || !slices.Equal(got, []uint16{0, 1, 65535}) {
		t.Errorf("ReadShard of small 32-bit tokens = %v, %v", got, err)
	}
	// The 16-bit writer refuses what it cannot hold.
	w, err := newShardWriter(filepath.Join(dir, "n.bin"), 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeTokens(w, []uint32{1, 70000}); err == nil || !strings.Contains(err.Error(), "token 70000 does not fit") {
		t.Errorf("writing 70000 into a 16-bit shard: %v", err)
	}
	w.abort()
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("directory holds %d entries, want just s.bin", len(entries))
	}
}

func TestWriteShardErrors(t *testing.T) {
	dir := t.TempDir()
	if err := WriteShard[uint16](filepath.Join(dir, "empty.bin"), nil); err == nil {
		t.Error("WriteShard(no tokens) succeeded")
	}
	if err := WriteShard(filepath.Join(dir, "missing", "x.bin"), []uint16{1}); err == nil {
		t.Error("WriteShard into a missing directory succeeded")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("failed writes left %d files behind", len(entries))
	}
}

func TestShardFormatErrors(t *testing.T) {
	good := rawShard(ShardMagic, ShardVersion, 10, seqTokens(10))
	tests := []struct {
		name string
		b    []byte
		want []string // substrings of the error message
	}{
		{"empty", nil, []string{"empty file"}},
		{"short header", good[:100], []string{"truncated header", "100 bytes"}},
		{"bad magic", rawShard(12345, ShardVersion, 10, seqTokens(10)), []string{"bad magic number 12345", "20240520"}},
		{"version", rawShard(ShardMagic, 2, 10, seqTokens(10)), []string{"unsupported shard version 2"}},
		{"truncated", good[:len(good)-2], []string{"truncated", "header says 10 tokens but the file holds 9"}},
		{"odd length", good[:len(good)-1], []string{"truncated", "not a whole number"}},
		{"trailing", append(slices.Clone(good), 0, 0), []string{"trailing data", "holds 11"}},
		{"zero tokens", rawShard(ShardMagic, ShardVersion, 0, nil), []string{"header says 0 tokens"}},
		{"negative count", rawShard(ShardMagic, ShardVersion, -5, nil), []string{"header says -5 tokens"}},
		{"header only", rawShard(ShardMagic, ShardVersion, 10, nil), []string{"truncated", "holds 0"}},
		{"32-bit version", rawShard32(ShardMagic32, 1, 2, []uint32{1, 2}), []string{"unsupported shard version 1 (want 7 after magic 20240801)"}},
		{"16-bit version 7", rawShard(ShardMagic, ShardVersion32, 2, []uint16{1, 2}), []string{"unsupported shard version 7 (want 1 after magic 20240520)"}},
		{"32-bit truncated", rawShard32(ShardMagic32, ShardVersion32, 3, []uint32{1, 2}), []string{"truncated", "header says 3 tokens but the file holds 2"}},
		{"32-bit part token", rawShard32(ShardMagic32, ShardVersion32, 2, []uint32{1, 2})[:HeaderBytes+6], []string{"not a whole number of 4-byte tokens"}},
	}
	dir := t.TempDir()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "_")+".bin")
			if err := os.WriteFile(path, tt.b, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := ReadShard(path)
			var fe *FormatError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v is not a *FormatError", err)
			}
			if fe.File != path {
				t.Errorf("FormatError.File = %q, want %q", fe.File, path)
			}
			msg := err.Error()
			for _, w := range append(tt.want, path, "gptui data prepare") {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not mention %q", msg, w)
				}
			}
		})
	}
}

func TestReadShardMissing(t *testing.T) {
	_, err := ReadShard(filepath.Join(t.TempDir(), "nope.bin"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ReadShard(missing) = %v, want an error wrapping os.ErrNotExist", err)
	}
	var fe *FormatError
	if errors.As(err, &fe) {
		t.Errorf("a missing file is an I/O error, not a *FormatError")
	}
}

func TestFormatErrorMessage(t *testing.T) {
	inner := errors.New("boom")
	tests := []struct {
		err  *FormatError
		want string
	}{
		{&FormatError{File: "a.bin", Msg: "bad"}, "a.bin: bad"},
		{&FormatError{File: "a.jsonl", Line: 3, Msg: "bad"}, "a.jsonl:3: bad"},
		{&FormatError{File: "a.jsonl", Line: 3, Msg: "bad", Err: inner}, "a.jsonl:3: bad: boom"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
	if !errors.Is(tests[2].err, inner) {
		t.Error("FormatError does not unwrap to Err")
	}
}

// FuzzReadShard feeds arbitrary files to ReadShard: an error is a
// *FormatError naming the file, and a success is exactly a well-formed
// shard.
func FuzzReadShard(f *testing.F) {
	f.Add(rawShard(ShardMagic, ShardVersion, 3, []uint16{1, 2, 3}))
	f.Add(rawShard(ShardMagic, ShardVersion, 4, []uint16{1, 2, 3}))
	f.Add(rawShard(ShardMagic, 2, 1, []uint16{9}))
	f.Add(rawShard(1, 1, 1, []uint16{9}))
	f.Add(rawShard32(ShardMagic32, ShardVersion32, 2, []uint32{1, 1 << 20}))
	f.Add(rawShard32(ShardMagic32, ShardVersion32, 2, []uint32{1, 2}))
	f.Add([]byte{})
	f.Add([]byte("not a shard"))
	path := filepath.Join(f.TempDir(), "fuzz.bin")
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		tokens, err := ReadShard(path)
		if err != nil {
			var fe *FormatError
			if !errors.As(err, &fe) || fe.File != path {
				t.Fatalf("error %v is not a *FormatError naming the file", err)
			}
			if tokens != nil {
				t.Fatalf("tokens returned with error %v", err)
			}
			return
		}
		// Success means the input is exactly a well-formed shard, of
		// 16-bit tokens or of 32-bit ones that fit 16 bits.
		want := rawShard(ShardMagic, ShardVersion, int32(len(tokens)), tokens)
		if binary.LittleEndian.Uint32(b) == ShardMagic32 {
			wide := make([]uint32, len(tokens))
			for i, v := range tokens {
				wide[i] = uint32(v)
			}
			want = rawShard32(ShardMagic32, ShardVersion32, int32(len(tokens)), wide)
		}
		if len(tokens) == 0 || len(b) != len(want) {
			t.Fatalf("accepted %d bytes as %d tokens", len(b), len(tokens))
		}
		if !slices.Equal(b[:12], want[:12]) || !slices.Equal(b[HeaderBytes:], want[HeaderBytes:]) {
			t.Fatalf("decoded tokens do not re-encode to the input")
		}
	})
}
