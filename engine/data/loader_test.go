package data

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestSplitRanges(t *testing.T) {
	tests := []struct {
		n     int
		split [3]float64
		want  [3][2]int
	}{
		{1000, [3]float64{949, 50, 1}, [3][2]int{{0, 949}, {949, 999}, {999, 1000}}},
		{100, [3]float64{0.9, 0.1, 0}, [3][2]int{{0, 90}, {90, 100}, {100, 100}}},
		{100, [3]float64{1, 0, 0}, [3][2]int{{0, 100}, {100, 100}, {100, 100}}},
		{10, [3]float64{1, 1, 1}, [3][2]int{{0, 3}, {3, 7}, {7, 10}}},       // 3.33 -> 3, 6.67 -> 7
		{3, [3]float64{1, 1, 0}, [3][2]int{{0, 2}, {2, 3}, {3, 3}}},         // 1.5 rounds up
		{7, [3]float64{0.5, 0.25, 0.25}, [3][2]int{{0, 4}, {4, 5}, {5, 7}}}, // 3.5 -> 4, 5.25 -> 5
		{0, [3]float64{8, 1, 1}, [3][2]int{{0, 0}, {0, 0}, {0, 0}}},
		{5, [3]float64{0, 1, 0}, [3][2]int{{0, 0}, {0, 5}, {5, 5}}},  // all validation
		{6, [3]float64{0, 1, 1}, [3][2]int{{0, 0}, {0, 3}, {3, 6}}},  // no training range
		{5, [3]float64{1, -1, 1}, [3][2]int{{0, 5}, {5, 5}, {5, 5}}}, // invalid: negative
		{5, [3]float64{0, 0, 0}, [3][2]int{{0, 5}, {5, 5}, {5, 5}}},  // invalid: zero sum
		{-3, [3]float64{1, 1, 1}, [3][2]int{{0, 0}, {0, 0}, {0, 0}}},
	}
	for _, tt := range tests {
		got := SplitRanges(tt.n, tt.split)
		if got != tt.want {
			t.Errorf("SplitRanges(%d, %v) = %v, want %v", tt.n, tt.split, got, tt.want)
		}
	}
}

func TestSplitRangesCover(t *testing.T) {
	splits := [][3]float64{{949, 50, 1}, {1, 1, 1}, {0.98, 0.01, 0.01}, {3, 0, 7}, {0, 2, 1}, {1e-9, 1e-9, 1e-9}}
	for _, s := range splits {
		for n := range 200 {
			r := SplitRanges(n, s)
			if r[0][0] != 0 || r[0][1] != r[1][0] || r[1][1] != r[2][0] || r[2][1] != n {
				t.Fatalf("SplitRanges(%d, %v) = %v does not tile [0, %d)", n, s, r, n)
			}
			sum := s[0] + s[1] + s[2]
			for i, rg := range r {
				size := float64(rg[1] - rg[0])
				if exact := float64(n) * s[i] / sum; size < exact-1 || size > exact+1 {
					t.Fatalf("SplitRanges(%d, %v) range %d has %v tokens, want %.2f±1", n, s, i, size, exact)
				}
			}
		}
	}
}

func TestSplitValidate(t *testing.T) {
	tests := []struct {
		s  Split
		ok bool
	}{
		{Split{949, 50, 1}, true},
		{Split{1, 0, 0}, true},
		{Split{0, 1, 0}, true},
		{Split{0, 0, 0}, false},
		{Split{1e308, 1e308, 0}, false}, // sum overflows
		{Split{1, -0.5, 0}, false},
		{Split{1, 0, math.Inf(1)}, false},
		{Split{1, math.NaN(), 0}, false},
	}
	for _, tt := range tests {
		if err := tt.s.Validate(); (err == nil) != tt.ok {
			t.Errorf("Split%v.Validate() = %v, want ok=%t", tt.s, err, tt.ok)
		}
	}
}

// iota16 returns the tokens 0, 1, ..., n-1, so a token's value is its
// position and batches can be checked by arithmetic.
func iota16(n int) []uint16 {
	t := make([]uint16, n)
	for i := range t {
		t[i] = uint16(i)
	}
	return t
}

func next(l *Loader, bt int) (in, tg []int32) {
	in, tg = make([]int32, bt), make([]int32, bt)
	l.Next(in, tg)
	return in, tg
}

func TestLoaderSequential(t *testing.T) {
	// 40 tokens, B=2, T=4: batches start at 0, 8, 16, 24 (24+9 = 33 <= 40)
	// and then wrap, because 32+9 = 41 > 40.
	const B, T, n = 2, 4, 40
	l, err := NewLoader(iota16(n), B, T, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	starts := []int{0, 8, 16, 24, 0, 8, 16, 24, 0}
	for i, pos := range starts {
		wantEpoch := i / 4
		if l.Epoch() != wantEpoch {
			t.Errorf("batch %d: Epoch() = %d before, want %d", i, l.Epoch(), wantEpoch)
		}
		in, tg := next(l, B*T)
		for b := range B {
			for j := range T {
				k := b*T + j
				if want := int32(pos + b*T + j); in[k] != want || tg[k] != want+1 {
					t.Fatalf("batch %d row %d col %d: input %d target %d, want %d %d",
						i, b, j, in[k], tg[k], want, want+1)
				}
			}
		}
	}
}

func TestLoaderSequentialExactFit(t *testing.T) {
	// Exactly B*T+1 tokens: every batch is the same.
	l, err := NewLoader(iota16(7), 2, 3, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []int32{0, 1, 2, 3, 4, 5}
	for i := range 3 {
		in, tg := next(l, 6)
		if !slices.Equal(in, want) || tg[5] != 6 || l.Epoch() != i+1 {
			t.Fatalf("batch %d: inputs %v targets %v epoch %d", i, in, tg, l.Epoch())
		}
	}
}

func TestNewLoaderErrors(t *testing.T) {
	tests := []struct {
		n, B, T int
	}{
		{8, 2, 4}, // needs 9
		{0, 1, 1}, // needs 2
		{100, 0, 4},
		{100, 4, -1},
		{100, 1 << 62, 1 << 62}, // B*T overflows
	}
	for _, tt := range tests {
		if _, err := NewLoader(make([]uint16, tt.n), tt.B, tt.T, false, 0); err == nil {
			t.Errorf("NewLoader(%d tokens, B=%d, T=%d) succeeded", tt.n, tt.B, tt.T)
		}
	}
	_, err := NewLoader(make([]uint16, 8), 2, 4, true, 0)
	if err == nil || !strings.Contains(err.Error(), "at least 9 tokens, have 8") {
		t.Errorf("error %v does not explain the shortfall", err)
	}
}

// windowsOf returns the window index of each row of a shuffled batch,
// checking that each row is a whole window of the iota16 stream.
func windowsOf(t *testing.T, in, tg []int32, B, T int) []int {
	t.Helper()
	var ws []int
	for b := range B {
		first := int(in[b*T])
		if first%T != 0 {
			t.Fatalf("row %d starts at token %d, not a multiple of T=%d", b, first, T)
		}
		for j := range T {
			if in[b*T+j] != int32(first+j) || tg[b*T+j] != int32(first+j+1) {
				t.Fatalf("row %d is not a contiguous window starting at %d", b, first)
			}
		}
		ws = append(ws, first/T)
	}
	return ws
}

func TestLoaderShuffle(t *testing.T) {
	const B, T, n = 3, 4, 4*20 + 3 // W = (n-1)/T = 20 windows, 6 batches per epoch
	l, err := NewLoader(iota16(n), B, T, true, 42)
	if err != nil {
		t.Fatal(err)
	}
	const W, perEpoch = 20, 6
	var epochs [][]int
	everSeen := make(map[int]bool)
	for e := range 4 {
		var order []int
		for range perEpoch {
			if l.Epoch() != e {
				t.Fatalf("Epoch() = %d, want %d", l.Epoch(), e)
			}
			in, tg := next(l, B*T)
			order = append(order, windowsOf(t, in, tg, B, T)...)
		}
		seen := make(map[int]bool)
		for _, w := range order {
			if w < 0 || w >= W || seen[w] {
				t.Fatalf("epoch %d: window %d out of range or repeated in %v", e, w, order)
			}
			seen[w] = true
			everSeen[w] = true
		}
		epochs = append(epochs, order)
	}
	if l.Epoch() != 4 {
		t.Errorf("after 4 epochs Epoch() = %d", l.Epoch())
	}
	if slices.Equal(epochs[0], epochs[1]) {
		t.Error("epochs 0 and 1 used the same order")
	}
	if len(everSeen) != W {
		t.Errorf("4 epochs covered %d of %d windows", len(everSeen), W)
	}

	// The same seed gives the same stream; another seed a different one.
	same, _ := NewLoader(iota16(n), B, T, true, 42)
	other, _ := NewLoader(iota16(n), B, T, true, 43)
	var a, b []int
	for range perEpoch {
		in, tg := next(same, B*T)
		a = append(a, windowsOf(t, in, tg, B, T)...)
		in, tg = next(other, B*T)
		b = append(b, windowsOf(t, in, tg, B, T)...)
	}
	if !slices.Equal(a, epochs[0]) {
		t.Errorf("seed 42 replay = %v, want %v", a, epochs[0])
	}
	if slices.Equal(b, epochs[0]) {
		t.Error("seeds 42 and 43 gave the same order")
	}
}

func TestLoaderStateRestore(t *testing.T) {
	const B, T, n = 2, 5, 157
	for _, shuffle := range []bool{false, true} {
		t.Run(fmt.Sprintf("shuffle=%t", shuffle), func(t *testing.T) {
			ref, _ := NewLoader(iota16(n), B, T, shuffle, 7)
			l, _ := NewLoader(iota16(n), B, T, shuffle, 7)
			for range 37 { // crosses several epochs
				next(l, B*T)
				next(ref, B*T)
			}
			// Save through JSON, as a checkpoint does.
			js, err := json.Marshal(l.State())
			if err != nil {
				t.Fatal(err)
			}
			var st LoaderState
			if err := json.Unmarshal(js, &st); err != nil {
				t.Fatal(err)
			}
			if st != l.State() {
				t.Fatalf("JSON round trip changed the state: %+v vs %+v", st, l.State())
			}
			resumed, _ := NewLoader(iota16(n), B, T, shuffle, 7)
			if err := resumed.Restore(st); err != nil {
				t.Fatalf("Restore: %v", err)
			}
			if resumed.Epoch() != ref.Epoch() || resumed.Epoch() == 0 {
				t.Errorf("resumed Epoch() = %d, reference %d", resumed.Epoch(), ref.Epoch())
			}
			for i := range 40 {
				a, at := next(resumed, B*T)
				b, bt := next(ref, B*T)
				if !slices.Equal(a, b) || !slices.Equal(at, bt) {
					t.Fatalf("batch %d after resume differs: %v vs %v", i, a, b)
				}
			}

			// Reset returns to the very first batch.
			fresh, _ := NewLoader(iota16(n), B, T, shuffle, 7)
			resumed.Reset()
			if resumed.Epoch() != 0 {
				t.Errorf("after Reset Epoch() = %d", resumed.Epoch())
			}
			for i := range 3 {
				a, _ := next(resumed, B*T)
				b, _ := next(fresh, B*T)
				if !slices.Equal(a, b) {
					t.Fatalf("batch %d after Reset differs from a fresh loader", i)
				}
			}
		})
	}
}

func TestLoaderRestoreErrors(t *testing.T) {
	const B, T, n = 2, 5, 157
	seq, _ := NewLoader(iota16(n), B, T, false, 7)
	shuf, _ := NewLoader(iota16(n), B, T, true, 7)
	mod := func(l *Loader, f func(*LoaderState)) LoaderState {
		s := l.State()
		f(&s)
		return s
	}
	tests := []struct {
		name string
		l    *Loader
		s    LoaderState
		want string
	}{
		{"mode", seq, shuf.State(), "shuffle"},
		{"batch", seq, mod(seq, func(s *LoaderState) { s.B = 4 }), "batch"},
		{"tokens", seq, mod(seq, func(s *LoaderState) { s.Tokens = 1000 }), "data changed"},
		{"seed", shuf, mod(shuf, func(s *LoaderState) { s.Seed = 8 }), "seed"},
		{"negative epoch", seq, mod(seq, func(s *LoaderState) { s.Epoch = -1 }), "epoch"},
		{"seq position", seq, mod(seq, func(s *LoaderState) { s.Pos = n - B*T }), "out of range"},
		{"shuffle position", shuf, mod(shuf, func(s *LoaderState) { s.Pos = 30 }), "out of range"},
		{"negative position", seq, mod(seq, func(s *LoaderState) { s.Pos = -1 }), "out of range"},
	}
	for _, tt := range tests {
		before := tt.l.State()
		err := tt.l.Restore(tt.s)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Restore = %v, want an error mentioning %q", tt.name, err, tt.want)
		}
		if tt.l.State() != before {
			t.Errorf("%s: failed Restore changed the loader", tt.name)
		}
	}
	// A different seed is irrelevant, and accepted, in sequential mode.
	if err := seq.Restore(mod(seq, func(s *LoaderState) { s.Seed = 99 })); err != nil {
		t.Errorf("sequential Restore with another seed: %v", err)
	}
}

func TestLoaderNextPanicsOnShortSlices(t *testing.T) {
	l, _ := NewLoader(iota16(100), 2, 4, false, 0)
	defer func() {
		if recover() == nil {
			t.Error("Next with short slices did not panic")
		}
	}()
	l.Next(make([]int32, 7), make([]int32, 8))
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	// Written out of order: Load must sort by name.
	shards := map[string][]uint16{
		"b_000001.bin": {4, 5},
		"a_000000.bin": {1, 2, 3},
		"b_000000.bin": {9},
	}
	for name, toks := range shards {
		if err := WriteShard(filepath.Join(dir, name), toks); err != nil {
			t.Fatal(err)
		}
	}
	// Files that are not shards are ignored.
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("hi"), 0o644)
	os.WriteFile(filepath.Join(dir, ".data_000000.bin.tmp123"), []byte("partial"), 0o644)
	os.Mkdir(filepath.Join(dir, "sub.bin"), 0o755)
	got, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint16{1, 2, 3, 9, 4, 5}; !slices.Equal(got, want) {
		t.Errorf("Load = %v, want %v", got, want)
	}

	// A corrupt shard is reported as a format error naming it.
	bad := filepath.Join(dir, "c.bin")
	os.WriteFile(bad, []byte("garbage"), 0o644)
	var fe *FormatError
	if _, err := Load(dir); !errors.As(err, &fe) || fe.File != bad {
		t.Errorf("Load with a bad shard = %v, want a *FormatError for %s", err, bad)
	}
}

func TestLoadNoShards(t *testing.T) {
	dir := t.TempDir()
	_, err := Load(dir)
	if !errors.Is(err, ErrNoShards) {
		t.Fatalf("Load(empty dir) = %v, want ErrNoShards", err)
	}
	for _, w := range []string{dir, "gptui data prepare"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
	if _, err := Load(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing dir) = %v, want os.ErrNotExist", err)
	}
}

// TestLoad32: LoadOf reads 16-bit and 32-bit shards alike, in name order;
// CheckVocab names byte offsets by each shard's width; a Loader serves
// 32-bit tokens as it does 16-bit ones.
func TestLoad32(t *testing.T) {
	dir := t.TempDir()
	if err := WriteShard(filepath.Join(dir, "a.bin"), []uint16{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if err := WriteShard(filepath.Join(dir, "b.bin"), []uint32{100000, 128255, 7}); err != nil {
		t.Fatal(err)
	}
	got, err := LoadOf[uint32](dir)
	if want := []uint32{1, 2, 3, 100000, 128255, 7}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("LoadOf[uint32] = %v, %v; want %v", got, err, want)
	}
	err = CheckVocab(dir, got, 128000)
	if want := filepath.Join(dir, "b.bin") + ": token 128255 at byte offset 1028 "; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("CheckVocab: %v, want an error starting %q", err, want)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "token 100000 at byte offset 1024 does not fit 16 bits") {
		t.Errorf("Load (16-bit) of a shard with token 100000: %v", err)
	}
	l, err := NewLoader(got, 1, 4, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	in, tg := make([]int32, 4), make([]int32, 4)
	l.Next(in, tg)
	if !slices.Equal(in, []int32{1, 2, 3, 100000}) || !slices.Equal(tg, []int32{2, 3, 100000, 128255}) {
		t.Errorf("batch %v → %v", in, tg)
	}
}

func TestCheckVocab(t *testing.T) {
	dir := t.TempDir()
	a, b := []uint16{1, 2, 3}, []uint16{4, 5, 6, 7}
	for name, toks := range map[string][]uint16{"a.bin": a, "b.bin": b} {
		if err := WriteShard(filepath.Join(dir, name), toks); err != nil {
			t.Fatal(err)
		}
	}
	tokens, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		vocab int
		want  string // "" means no error
	}{
		{8, ""},
		{7, filepath.Join(dir, "b.bin") + ": token 7 at byte offset 1030 "},
		{5, filepath.Join(dir, "b.bin") + ": token 5 at byte offset 1026 "},
		{3, filepath.Join(dir, "a.bin") + ": token 3 at byte offset 1028 "},
		{1, filepath.Join(dir, "a.bin") + ": token 1 at byte offset 1024 "},
	}
	for _, tc := range tests {
		err := CheckVocab(dir, tokens, tc.vocab)
		var fe *FormatError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("vocab %d: %v", tc.vocab, err)
		case tc.want != "" && (!errors.As(err, &fe) || !strings.HasPrefix(err.Error(), tc.want)):
			t.Errorf("vocab %d: error %v (%T), want a FormatError starting %q", tc.vocab, err, err, tc.want)
		}
	}
}
