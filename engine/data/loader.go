package data

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gptui/gptui/badinput"
)

// ErrNoShards is returned, wrapped, by [Load] for a directory without
// token shards.
var ErrNoShards = badinput.New("no token shards")

// Load reads every *.bin shard in dir as 16-bit tokens: see [LoadOf].
func Load(dir string) ([]uint16, error) { return LoadOf[uint16](dir) }

// LoadOf reads every *.bin shard in dir, in sorted name order, and
// returns their tokens concatenated, as tokens of type T; the shards may
// hold 16-bit or 32-bit tokens (see [ReadShardOf]). Names beginning with a
// dot are skipped. It fails with an error wrapping [ErrNoShards] if dir
// holds no shards, and with a [*FormatError] if a shard is malformed or
// holds a token too large for T.
func LoadOf[T Token](dir string) ([]T, error) {
	paths, sizes, err := shardFiles(dir)
	if err != nil {
		return nil, err
	}
	if len(paths) == 1 {
		return ReadShardOf[T](paths[0])
	}
	// A capacity from the files' sizes, which are bytes on disk.
	var size int64
	for _, s := range sizes {
		size += s
	}
	tokens := make([]T, 0, max(0, (size-int64(len(paths))*HeaderBytes)/int64(tokenWidth[T]())))
	for _, p := range paths {
		t, err := ReadShardOf[T](p)
		if err != nil {
			return nil, err
		}
		tokens = append(tokens, t...)
	}
	return tokens, nil
}

// shardFiles lists the shards [Load] reads in dir, in its order, with
// their sizes in bytes.
func shardFiles(dir string) ([]string, []int64, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("data: loading shards: %w", err)
	}
	var paths []string
	var sizes []int64
	for _, e := range entries { // ReadDir sorts by name
		name := e.Name()
		if !strings.HasSuffix(name, ".bin") || strings.HasPrefix(name, ".") || e.IsDir() {
			continue
		}
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p)
		if err != nil {
			return nil, nil, fmt.Errorf("data: loading shards: %w", err)
		}
		if !fi.Mode().IsRegular() {
			continue
		}
		paths = append(paths, p)
		sizes = append(sizes, fi.Size())
	}
	if len(paths) == 0 {
		return nil, nil, fmt.Errorf("data: %w (*.bin) in %s; create them with `gptui data prepare`", ErrNoShards, dir)
	}
	return paths, sizes, nil
}

// CheckVocab returns a *[FormatError] naming the shard of dir and the byte
// offset in it of the first token of tokens (as [Load] returned them from
// dir) that is not below vocab, or nil if every token is.
func CheckVocab[T Token](dir string, tokens []T, vocab int) error {
	i := slices.IndexFunc(tokens, func(t T) bool { return int64(t) >= int64(vocab) })
	if i < 0 {
		return nil
	}
	paths, sizes, err := shardFiles(dir)
	if err != nil {
		return err
	}
	k := int64(i)
	for j, p := range paths {
		// Load has checked every shard: its size is its header and tokens.
		width, err := shardWidth(p)
		if err != nil {
			return err
		}
		if n := (sizes[j] - HeaderBytes) / width; k >= n {
			k -= n
			continue
		}
		return formatErrorf(p, "token %d at byte offset %d is outside the model's vocabulary of %d; check Model.vocab_size or the data",
			tokens[i], HeaderBytes+width*k, vocab)
	}
	return fmt.Errorf("data: %s: token %d at position %d is outside the vocabulary of %d, past the shards' end (did they change while loading?)", dir, tokens[i], i, vocab)
}

// shardWidth returns the bytes per token of the shard at path, which Load
// has checked.
func shardWidth(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("data: reading shard: %w", err)
	}
	defer f.Close()
	var h [4]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		return 0, fmt.Errorf("data: reading shard %s: %w", path, err)
	}
	if binary.LittleEndian.Uint32(h[:]) == ShardMagic32 {
		return 4, nil
	}
	return 2, nil
}

// Split gives the relative sizes of the train, validation and test parts
// of a token stream, such as {949, 50, 1} or {0.9, 0.1, 0}. Only the
// proportions matter.
type Split [3]float64

// Validate reports whether s can be used: every part must be a finite
// number >= 0, and their sum must be positive and finite. A part may be
// zero, so {0, 1, 0} gives all tokens to validation, as for an evaluation
// data set prepared separately.
func (s Split) Validate() error {
	sum := 0.0
	for i, v := range s {
		if !(v >= 0) || math.IsInf(v, 0) {
			return fmt.Errorf("data: split %v: part %d is %v, want a finite number >= 0", [3]float64(s), i, v)
		}
		sum += v
	}
	if !(sum > 0) || math.IsInf(sum, 0) {
		return fmt.Errorf("data: split %v: the parts must have a positive, finite sum", [3]float64(s))
	}
	return nil
}

// SplitRanges divides the token positions [0, n) into contiguous train,
// validation and test ranges, in that order, proportional to split. Each
// range is a half-open interval [start, end). The ranges are adjacent and
// together cover [0, n) exactly.
//
// The two inner boundaries are the cumulative fractions of n rounded to the
// nearest integer, halves rounding up:
//
//	train = [0, round(n·s0/S))
//	valid = [round(n·s0/S), round(n·(s0+s1)/S))
//	test  = [round(n·(s0+s1)/S), n)
//
// where S = s0+s1+s2. Rounding cumulative boundaries, rather than each
// size, keeps the total exact and errs by at most one token per range. A
// split that fails [Split.Validate] gives every token to train.
func SplitRanges(n int, split [3]float64) [3][2]int {
	n = max(n, 0)
	if Split(split).Validate() != nil {
		return [3][2]int{{0, n}, {n, n}, {n, n}}
	}
	sum := split[0] + split[1] + split[2]
	bound := func(frac float64) int {
		b := int(math.Floor(float64(n)*frac + 0.5))
		return min(max(b, 0), n)
	}
	b1 := bound(split[0] / sum)
	b2 := max(bound((split[0]+split[1])/sum), b1)
	return [3][2]int{{0, b1}, {b1, b2}, {b2, n}}
}

// Loader serves batches of B sequences of T tokens from a token range.
// Targets are the inputs shifted by one token, so each batch reads B
// windows of T+1 tokens.
//
// In sequential mode a Loader behaves exactly like llm.c's training data
// loader: batch i reads the B*T+1 tokens starting at position pos, row b
// being tokens [pos+b*T, pos+b*T+T) with targets one token later; pos
// starts at 0 and advances by B*T, and when fewer than B*T+1 tokens
// remain after pos it returns to 0 and a new epoch begins.
//
// In shuffle mode the range is cut into W = (n-1)/T windows of T+1
// tokens starting at multiples of T (consecutive windows share one
// token). Each epoch visits the windows in a random permutation derived
// only from the seed and the epoch number, B windows per batch; the W mod
// B windows left at the end of a permutation are skipped that epoch.
//
// A Loader is not safe for concurrent use.
type Loader struct {
	tokens  tokenSource
	b, t    int
	shuffle bool
	seed    uint64
	epoch   int
	pos     int   // sequential: token offset; shuffle: index into perm
	perm    []int // shuffle: window order of the current epoch
}

// LoaderState is the position of a [Loader], as saved in checkpoints. It
// also records the loader's shape so that [Loader.Restore] can refuse a
// state taken from a differently configured loader.
type LoaderState struct {
	Epoch   int    `json:"epoch"`
	Pos     int    `json:"pos"` // token offset (sequential) or windows served this epoch (shuffle)
	Shuffle bool   `json:"shuffle"`
	Seed    uint64 `json:"seed"`
	B       int    `json:"b"`
	T       int    `json:"t"`
	Tokens  int    `json:"tokens"`
}

// tokenSource is the token stream of a Loader, of either token type.
type tokenSource interface {
	len() int
	// fill copies w[:len(in)] to in and w[1:len(in)+1] to tg, where w is
	// the stream from off on.
	fill(in, tg []int32, off int)
}

// tokenSlice is a tokenSource.
type tokenSlice[E Token] []E

func (s tokenSlice[E]) len() int { return len(s) }

func (s tokenSlice[E]) fill(in, tg []int32, off int) {
	w := s[off : off+len(in)+1]
	for i := range in {
		in[i] = int32(w[i])
		tg[i] = int32(w[i+1])
	}
}

// NewLoader returns a loader over toks, 16-bit or 32-bit tokens, that
// fills batches of B sequences of length T. toks must hold at least B*T+1
// tokens. seed is used only in shuffle mode. The loader keeps toks; the
// caller must not modify them while it is in use.
func NewLoader[E Token](toks []E, B, T int, shuffle bool, seed uint64) (*Loader, error) {
	if B <= 0 || T <= 0 {
		return nil, fmt.Errorf("data: batch size %d and sequence length %d must be positive", B, T)
	}
	if B > (math.MaxInt-1)/T || len(toks) < B*T+1 {
		return nil, fmt.Errorf("data: a batch of %d×%d tokens needs at least %d tokens, have %d; "+
			"use a smaller batch size or sequence length, or more data", B, T, B*T+1, len(toks))
	}
	l := &Loader{tokens: tokenSlice[E](toks), b: B, t: T, shuffle: shuffle, seed: seed}
	if shuffle {
		l.perm = make([]int, (len(toks)-1)/T)
		l.permute()
	}
	return l, nil
}

// permute sets perm to the window order of the current epoch. It depends
// only on the seed and the epoch, never on the loader's history.
func (l *Loader) permute() {
	for i := range l.perm {
		l.perm[i] = i
	}
	r := rand.New(rand.NewPCG(l.seed, uint64(l.epoch)))
	r.Shuffle(len(l.perm), func(i, j int) { l.perm[i], l.perm[j] = l.perm[j], l.perm[i] })
}

// Next fills inputs and targets, each of which must hold at least B*T
// values, with the next batch in row-major order: row b occupies
// [b*T, (b+1)*T). targets[i] is the token that follows inputs[i]. Next
// panics if a slice is too short.
func (l *Loader) Next(inputs, targets []int32) {
	bt := l.b * l.t
	if len(inputs) < bt || len(targets) < bt {
		panic(fmt.Sprintf("data: Loader.Next: need %d inputs and targets, got %d and %d", bt, len(inputs), len(targets)))
	}
	if !l.shuffle {
		l.tokens.fill(inputs[:bt], targets[:bt], l.pos)
		l.pos += bt
		if l.pos+bt+1 > l.tokens.len() {
			l.pos = 0
			l.epoch++
		}
		return
	}
	for b := range l.b {
		off := l.perm[l.pos+b] * l.t
		l.tokens.fill(inputs[b*l.t:(b+1)*l.t], targets[b*l.t:(b+1)*l.t], off)
	}
	l.pos += l.b
	if l.pos+l.b > len(l.perm) {
		l.pos = 0
		l.epoch++
		l.permute()
	}
}

// Epoch returns the number of times the loader has run through its range
// and started over: 0 during the first pass.
func (l *Loader) Epoch() int { return l.epoch }

// Reset returns the loader to its initial state: epoch 0, first batch.
// Evaluation calls it before reading the validation range so that every
// evaluation sees the same batches.
func (l *Loader) Reset() {
	changed := l.epoch != 0
	l.epoch, l.pos = 0, 0
	if l.shuffle && changed {
		l.permute()
	}
}

// State returns the loader's position, to be saved with a checkpoint.
func (l *Loader) State() LoaderState {
	return LoaderState{
		Epoch:   l.epoch,
		Pos:     l.pos,
		Shuffle: l.shuffle,
		Seed:    l.seed,
		B:       l.b,
		T:       l.t,
		Tokens:  l.tokens.len(),
	}
}

// Restore moves the loader to a position saved by [Loader.State], after
// which it serves the same batches the saved loader would have. It fails,
// leaving the loader unchanged, if the state comes from a loader with a
// different mode, batch shape, token count or (in shuffle mode) seed, or
// if the position is out of range.
func (l *Loader) Restore(s LoaderState) error {
	cur := l.State()
	switch {
	case s.Shuffle != cur.Shuffle:
		return fmt.Errorf("data: restoring loader: saved shuffle=%t, loader has shuffle=%t", s.Shuffle, cur.Shuffle)
	case s.B != cur.B || s.T != cur.T:
		return fmt.Errorf("data: restoring loader: saved batch %d×%d, loader has %d×%d", s.B, s.T, cur.B, cur.T)
	case s.Tokens != cur.Tokens:
		return fmt.Errorf("data: restoring loader: saved for %d tokens, loader has %d; the data changed since the checkpoint",
			s.Tokens, cur.Tokens)
	case s.Shuffle && s.Seed != cur.Seed:
		return fmt.Errorf("data: restoring loader: saved seed %d, loader has seed %d", s.Seed, cur.Seed)
	case s.Epoch < 0:
		return fmt.Errorf("data: restoring loader: negative epoch %d", s.Epoch)
	}
	if s.Shuffle {
		if s.Pos < 0 || s.Pos+l.b > len(l.perm) {
			return fmt.Errorf("data: restoring loader: window index %d out of range [0, %d]", s.Pos, len(l.perm)-l.b)
		}
	} else if s.Pos < 0 || s.Pos+l.b*l.t+1 > l.tokens.len() {
		return fmt.Errorf("data: restoring loader: position %d out of range [0, %d]", s.Pos, l.tokens.len()-l.b*l.t-1)
	}
	epochChanged := s.Epoch != l.epoch
	l.epoch, l.pos = s.Epoch, s.Pos
	if l.shuffle && epochChanged {
		l.permute()
	}
	return nil
}
