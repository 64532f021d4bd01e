package data

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/gptui/gptui/units"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gptui/gptui/badinput"
)

// Defaults for [PrepareOptions].
const (
	DefaultShardTokens = 100_000_000
	DefaultPrefix      = "data"
)

// PrepareOptions configures [Prepare]. The zero value is ready to use.
type PrepareOptions struct {
	// ShardTokens is the most tokens a shard holds; every shard but the
	// last holds exactly this many. 0 means DefaultShardTokens.
	ShardTokens int
	// Prefix names the shards: <Prefix>_000000.bin, <Prefix>_000001.bin,
	// and so on. It must not contain a path separator. "" means
	// DefaultPrefix.
	Prefix string
	// Progress, if not nil, receives a progress line that is redrawn in
	// place with carriage returns and finished with a newline. Write
	// errors on Progress are ignored.
	Progress io.Writer
	// Workers is the number of goroutines that tokenize in parallel.
	// 0 means runtime.GOMAXPROCS(0). The output does not depend on it.
	Workers int
	// Tokenizer encodes the documents; nil means GPT-2's built-in
	// tokenizer. Its vocabulary decides the shards' token width: 16 bits
	// up to 65,536 tokens, 32 bits above.
	Tokenizer *Tokenizer
}

// PrepareStats summarizes a [Prepare] run.
type PrepareStats struct {
	Files     int   // input files read
	Documents int   // documents tokenized
	Tokens    int   // tokens written, including one separator per document
	Shards    int   // shard files written
	Bytes     int64 // bytes of input read
}

// Prepare tokenizes the documents in inputs and writes them to outDir as
// shards in llm.c's format (see [WriteShard]).
//
// Each input is a file or a directory. Directories are searched
// recursively for *.txt and *.jsonl files, skipping names that begin with
// a dot; a file named explicitly must also be .txt or .jsonl. A .txt file
// is one document (a leading UTF-8 byte order mark is dropped). A .jsonl
// file holds one document per line, the string in the line's "text"
// field; blank lines are skipped, and a line that is not a JSON object
// with a string "text" field stops Prepare with a [*FormatError] naming
// the file and line. Invalid UTF-8 in a document is tokenized as U+FFFD
// by GPT-2's built-in tokenizer, and as its bytes by a tokenizer.json.
//
// Files are processed in sorted path order and every document is written
// as the tokenizer's document separator (GPT-2's EOT, Llama 3's
// <|begin_of_text|>; see [LoadTokenizer]) followed by its tokens, in
// shards of 16-bit tokens when the vocabulary fits them and 32-bit tokens
// otherwise (see [WriteShard]), so the output depends only on the input
// files, never on Workers or timing. Shards are named
// <prefix>_000000.bin, <prefix>_000001.bin, ... and hold at most
// ShardTokens tokens each.
//
// Shards are written to temporary files and renamed into place only when
// every input has been read; after that, shards with the same prefix left
// over from an earlier, larger run are removed. If reading or tokenizing
// fails, or ctx is cancelled, outDir is left as it was.
func Prepare(ctx context.Context, inputs []string, outDir string, opts PrepareOptions) (PrepareStats, error) {
	var stats PrepareStats
	if opts.ShardTokens == 0 {
		opts.ShardTokens = DefaultShardTokens
	}
	if opts.ShardTokens < 0 || opts.ShardTokens > maxShardTokens {
		return stats, fmt.Errorf("data: shard size %d tokens out of range [1, %d]", opts.ShardTokens, maxShardTokens)
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if strings.ContainsAny(opts.Prefix, `/\`) || opts.Prefix == "." || opts.Prefix == ".." {
		return stats, fmt.Errorf("data: shard prefix %q must be a plain file name", opts.Prefix)
	}
	if opts.Workers <= 0 {
		opts.Workers = runtime.GOMAXPROCS(0)
	}
	if len(inputs) == 0 {
		return stats, errors.New("data: no inputs: name .txt or .jsonl files or directories holding them")
	}
	files, total, err := collectInputs(inputs)
	if err != nil {
		return stats, err
	}
	if len(files) == 0 {
		return stats, badinput.Wrap(fmt.Errorf("data: no .txt or .jsonl files found in %s: name files or folders that hold them", strings.Join(inputs, ", ")))
	}
	tok := opts.Tokenizer
	if tok == nil {
		var err error
		if tok, err = NewTokenizer(); err != nil {
			return stats, err
		}
	}
	if tok.sep < 0 {
		return stats, badinput.Wrap(errors.New("data: the tokenizer names no document separator: its tokenizer.json has neither a post_processor TemplateProcessing that puts a special token before a document nor an <|endoftext|> special token, and no tokenizer_config.json beside it names a bos_token or eos_token: give the tokenizer's folder, with its tokenizer_config.json"))
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return stats, fmt.Errorf("data: creating output directory: %w", err)
	}

	p := &preparer{
		outDir: outDir,
		opts:   opts,
		width:  2,
		prog:   newProgress(opts.Progress, total),
	}
	if tok.VocabSize() > 1<<16 {
		p.width = 4
	}
	if err := p.run(ctx, tok, files); err != nil {
		p.discard()
		return p.stats, err
	}
	if p.stats.Documents == 0 {
		p.discard()
		return p.stats, fmt.Errorf("data: no documents found in %s: the .jsonl files hold only blank lines",
			strings.Join(inputs, ", "))
	}
	if err := p.commit(); err != nil {
		p.discard()
		return p.stats, err
	}
	return p.stats, nil
}

// maxShardTokens is the most tokens a shard header can describe.
const maxShardTokens = 1<<31 - 1

// inputFile is one file to tokenize.
type inputFile struct {
	path  string
	size  int64
	jsonl bool
}

// inputKind reports whether name is a .txt or .jsonl file.
func inputKind(name string) (ok, jsonl bool) {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".txt":
		return true, false
	case ".jsonl":
		return true, true
	}
	return false, false
}

// collectInputs expands inputs into a sorted, de-duplicated list of files
// and returns it with their total size.
func collectInputs(inputs []string) ([]inputFile, int64, error) {
	seen := make(map[string]bool)
	var files []inputFile
	add := func(path string, fi fs.FileInfo) {
		key := filepath.Clean(path)
		if abs, err := filepath.Abs(path); err == nil {
			key = abs
		}
		if seen[key] {
			return
		}
		seen[key] = true
		_, jsonl := inputKind(path)
		files = append(files, inputFile{path: path, size: fi.Size(), jsonl: jsonl})
	}
	for _, in := range inputs {
		fi, err := os.Stat(in)
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return nil, 0, badinput.Wrap(fmt.Errorf("data: input %s: %w", in, err))
		}
		if !fi.IsDir() {
			if ok, _ := inputKind(in); !ok || !fi.Mode().IsRegular() {
				return nil, 0, badinput.Wrap(fmt.Errorf("data: input %s: not a .txt or .jsonl file", in))
			}
			add(in, fi)
			continue
		}
		err = filepath.WalkDir(in, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			hidden := strings.HasPrefix(d.Name(), ".") && path != in
			if d.IsDir() {
				if hidden {
					return filepath.SkipDir
				}
				return nil
			}
			if ok, _ := inputKind(path); !ok || hidden {
				return nil
			}
			fi, err := os.Stat(path) // follows symbolic links
			if err != nil {
				return err
			}
			if fi.Mode().IsRegular() {
				add(path, fi)
			}
			return nil
		})
		if err != nil {
			return nil, 0, fmt.Errorf("data: scanning input %s: %w", in, err)
		}
	}
	sort.Slice(files, func(i, j int) bool { return files[i].path < files[j].path })
	var total int64
	for _, f := range files {
		total += f.size
	}
	return files, total, nil
}

// chunk is a batch of document segments handed to a tokenizing worker.
// Chunks are numbered in input order so their results can be written in
// that order.
type chunk struct {
	seq   int
	segs  []segment
	docs  int   // documents that start in this chunk
	text  int   // bytes of segment text
	bytes int64 // input bytes consumed, for progress
	files int   // input files completed by this chunk
}

// segment is a piece of a document. Long documents are cut into segments
// so that they are tokenized in parallel and in bounded memory; see
// splitDoc for why this does not change the tokens.
type segment struct {
	text  string
	first bool // the segment starts a document and is preceded by the separator
}

// segmentBytes is the size beyond which a document is cut into segments.
const segmentBytes = 1 << 20

// splitDoc cuts doc into segments of at least size bytes (the last may be
// shorter) whose tokens, concatenated, equal the tokens of doc; size 0
// leaves doc whole.
//
// GPT-2's and Llama 3's pre-tokenizers split text into pieces before
// applying BPE, and BPE never merges across pieces. A piece never goes on
// past a newline that sits between two printable ASCII characters other
// than space: no piece pattern matches a newline followed by a letter,
// digit or punctuation mark (Llama 3's ends a run of punctuation with the
// newlines after it, GPT-2's makes the newline a piece of its own), and a
// whitespace run cannot extend over the non-space neighbours. Cutting
// right after such a newline therefore ends one piece and starts the next,
// exactly as in the uncut text. Where no such newline exists the document
// stays whole. [Tokenizer.cutSafe] says when a tokenizer.json adds nothing
// that breaks this.
func splitDoc(doc string, size int) []string {
	var segs []string
	for size > 0 && len(doc) > size {
		cut := safeCut(doc, size)
		if cut < 0 {
			break
		}
		segs = append(segs, doc[:cut])
		doc = doc[cut:]
	}
	return append(segs, doc)
}

// safeCut returns the index just after the first newline at or after from
// whose neighbours are both printable non-space ASCII, or -1.
func safeCut(s string, from int) int {
	plain := func(b byte) bool { return b > ' ' && b < 0x7f }
	for i := max(from, 1); i < len(s)-1; {
		j := strings.IndexByte(s[i:len(s)-1], '\n')
		if j < 0 {
			return -1
		}
		i += j
		if plain(s[i-1]) && plain(s[i+1]) {
			return i + 1
		}
		i++
	}
	return -1
}

// encoded is a tokenized chunk.
type encoded struct {
	chunk
	tokens []uint32
}

// Chunks are cut once they hold this much text or this many documents,
// large enough to amortize channel traffic, small enough to spread work.
const (
	chunkText = 1 << 20
	chunkDocs = 4096
)

// preparer holds the state of one Prepare run.
type preparer struct {
	outDir  string
	opts    PrepareOptions
	prog    *progress
	stats   PrepareStats
	width   int            // bytes per token in the shards: 2 or 4
	cur     *shardWriter   // shard being filled, or nil
	written []*shardWriter // finished shards awaiting rename
}

// run tokenizes files on opts.Workers goroutines and writes the results,
// in input order, to temporary shards.
func (p *preparer) run(ctx context.Context, tok *Tokenizer, files []inputFile) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// tickets bounds the chunks in flight, and so the memory held by
	// results that wait for an earlier, slower chunk.
	tickets := make(chan struct{}, 4*p.opts.Workers)
	jobs := make(chan chunk)
	results := make(chan encoded)

	var readErr error
	go func() {
		defer close(jobs)
		seg := segmentBytes
		if !tok.cutSafe() {
			seg = 0
		}
		readErr = readInputs(ctx, files, seg, jobs, tickets)
	}()
	var wg sync.WaitGroup
	for range p.opts.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range jobs {
				if ctx.Err() != nil {
					continue // drain so the reader can finish
				}
				var toks []uint32
				if c.text > 0 || c.docs > 0 {
					toks = make([]uint32, 0, c.text/3+c.docs)
				}
				for _, sg := range c.segs {
					if sg.first {
						toks = append(toks, uint32(tok.sep))
					}
					for _, id := range tok.Encode(sg.text) {
						toks = append(toks, uint32(id))
					}
				}
				select {
				case results <- encoded{chunk: c, tokens: toks}:
				case <-ctx.Done():
				}
			}
		}()
	}
	go func() {
		wg.Wait()
		close(results)
	}()

	var err error
	pending := make(map[int]encoded)
	next := 0
	for r := range results {
		if err != nil {
			continue
		}
		pending[r.seq] = r
		for {
			e, ok := pending[next]
			if !ok {
				break
			}
			delete(pending, next)
			next++
			<-tickets
			if err = p.consume(e); err != nil {
				cancel()
				break
			}
		}
	}
	// results is closed only after every worker has returned, and the
	// workers return only after the reader has closed jobs, so readErr is
	// safe to read here.
	if err == nil {
		err = readErr
	}
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return err
	}
	if p.cur != nil {
		if err := p.cur.finish(); err != nil {
			p.cur = nil
			return err
		}
		p.written = append(p.written, p.cur)
		p.cur = nil
	}
	p.prog.done(p.stats.Bytes, p.stats.Tokens)
	return nil
}

// consume writes one tokenized chunk to the shards.
func (p *preparer) consume(e encoded) error {
	p.stats.Files += e.files
	p.stats.Documents += e.docs
	p.stats.Bytes += e.bytes
	p.stats.Tokens += len(e.tokens)
	toks := e.tokens
	for len(toks) > 0 {
		if p.cur == nil {
			w, err := newShardWriter(p.shardPath(len(p.written)), p.width)
			if err != nil {
				return err
			}
			p.cur = w
		}
		k := min(len(toks), p.opts.ShardTokens-int(p.cur.n))
		if err := writeTokens(p.cur, toks[:k]); err != nil {
			return err
		}
		toks = toks[k:]
		if int(p.cur.n) == p.opts.ShardTokens {
			w := p.cur
			p.cur = nil
			if err := w.finish(); err != nil {
				return err
			}
			p.written = append(p.written, w)
		}
	}
	p.prog.update(p.stats.Bytes, p.stats.Tokens)
	return nil
}

// shardPath returns the path of shard i.
func (p *preparer) shardPath(i int) string {
	return filepath.Join(p.outDir, fmt.Sprintf("%s_%06d.bin", p.opts.Prefix, i))
}

// commit renames the finished shards into place and removes shards with
// the same prefix and a higher index left over from an earlier run.
func (p *preparer) commit() error {
	for i, w := range p.written {
		if err := os.Rename(w.tmp, w.path); err != nil {
			return fmt.Errorf("data: writing shard: %w", err)
		}
		p.written[i] = nil
		p.stats.Shards++
	}
	entries, err := os.ReadDir(p.outDir)
	if err != nil {
		return fmt.Errorf("data: removing stale shards: %w", err)
	}
	for _, e := range entries {
		if i, ok := shardIndex(e.Name(), p.opts.Prefix); ok && i >= p.stats.Shards {
			if err := os.Remove(filepath.Join(p.outDir, e.Name())); err != nil {
				return fmt.Errorf("data: removing stale shard: %w", err)
			}
		}
	}
	return nil
}

// shardIndex parses name as <prefix>_<index>.bin with an index of at least
// six digits.
func shardIndex(name, prefix string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix+"_")
	if !ok {
		return 0, false
	}
	digits, ok := strings.CutSuffix(rest, ".bin")
	if !ok || len(digits) < 6 || strings.TrimLeft(digits, "0123456789") != "" {
		return 0, false
	}
	i, err := strconv.Atoi(digits)
	return i, err == nil
}

// discard removes every temporary shard of a failed run.
func (p *preparer) discard() {
	if p.cur != nil {
		p.cur.abort()
		p.cur = nil
	}
	for _, w := range p.written {
		if w != nil {
			os.Remove(w.tmp)
		}
	}
	p.written = nil
}

// chunker cuts documents into chunks and sends them to the workers,
// taking a ticket for each so that only a bounded number is in flight.
type chunker struct {
	ctx     context.Context
	seg     int // segmentBytes, or 0 when documents must stay whole
	jobs    chan<- chunk
	tickets chan struct{}
	c       chunk
}

// send hands the current chunk to the workers and starts the next one.
func (k *chunker) send() error {
	select {
	case k.tickets <- struct{}{}:
	case <-k.ctx.Done():
		return k.ctx.Err()
	}
	select {
	case k.jobs <- k.c:
	case <-k.ctx.Done():
		return k.ctx.Err()
	}
	k.c = chunk{seq: k.c.seq + 1}
	return nil
}

// addDoc adds a document read from n bytes of input. A long document goes
// out in several chunks, each credited with the input bytes of its text,
// so that progress moves within one large file.
func (k *chunker) addDoc(doc string, n int64) error {
	k.c.docs++
	for i, seg := range splitDoc(doc, k.seg) {
		if i > 0 {
			if err := k.send(); err != nil {
				return err
			}
		}
		k.c.segs = append(k.c.segs, segment{text: seg, first: i == 0})
		k.c.text += len(seg)
		b := min(int64(len(seg)), n)
		k.c.bytes += b
		n -= b
	}
	k.c.bytes += n // what the text does not account for: a BOM, JSON syntax
	if k.c.text >= chunkText || len(k.c.segs) >= chunkDocs {
		return k.send()
	}
	return nil
}

// readInputs reads files in order and sends their documents, in chunks,
// on jobs.
func readInputs(ctx context.Context, files []inputFile, seg int, jobs chan<- chunk, tickets chan struct{}) error {
	k := &chunker{ctx: ctx, seg: seg, jobs: jobs, tickets: tickets}
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return err
		}
		var err error
		if f.jsonl {
			err = readJSONL(ctx, f.path, k)
		} else {
			err = readText(f.path, k)
		}
		if err != nil {
			return err
		}
		k.c.files++
	}
	if len(k.c.segs) > 0 || k.c.files > 0 {
		return k.send()
	}
	return nil
}

// readText reads a .txt file as one document.
func readText(path string, k *chunker) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("data: reading input: %w", err)
	}
	return k.addDoc(strings.TrimPrefix(string(b), "\ufeff"), int64(len(b)))
}

// readJSONL reads a .jsonl file, one document per non-blank line.
func readJSONL(ctx context.Context, path string, k *chunker) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("data: reading input: %w", err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	var pending int64 // bytes of blank lines, credited with the next document
	for line := 1; ; line++ {
		b, err := r.ReadBytes('\n')
		if err != nil && err != io.EOF {
			return fmt.Errorf("data: reading input %s: %w", path, err)
		}
		pending += int64(len(b))
		if len(bytes.TrimSpace(b)) > 0 {
			var rec struct {
				Text *string `json:"text"`
			}
			if jerr := json.Unmarshal(b, &rec); jerr != nil {
				return &FormatError{File: path, Line: line, Err: jerr,
					Msg: `invalid JSON; each line must be an object with a "text" string`}
			}
			if rec.Text == nil {
				return &FormatError{File: path, Line: line,
					Msg: `missing "text" field; each line must be an object with a "text" string`}
			}
			if err := k.addDoc(*rec.Text, pending); err != nil {
				return err
			}
			pending = 0
			if line%1024 == 0 && ctx.Err() != nil {
				return ctx.Err()
			}
		}
		if err == io.EOF {
			break
		}
	}
	k.c.bytes += pending // trailing blank lines
	return nil
}

// progress draws the Prepare progress line.
type progress struct {
	w     io.Writer
	total int64
	start time.Time
	last  time.Time
	width int // length of the previous line, to blank leftovers
}

// newProgress returns a progress line writer; w may be nil.
func newProgress(w io.Writer, total int64) *progress {
	now := time.Now()
	return &progress{w: w, total: total, start: now}
}

// update redraws the line at most ten times a second.
func (p *progress) update(done int64, tokens int) {
	if p.w == nil {
		return
	}
	now := time.Now()
	if now.Sub(p.last) < 100*time.Millisecond {
		return
	}
	p.last = now
	p.draw(done, tokens, now, "")
}

// done draws the final line and ends it.
func (p *progress) done(done int64, tokens int) {
	if p.w == nil {
		return
	}
	p.draw(done, tokens, time.Now(), "\n")
}

func (p *progress) draw(done int64, tokens int, now time.Time, end string) {
	const barWidth = 30
	frac := 1.0
	if p.total > 0 {
		frac = min(float64(done)/float64(p.total), 1)
	}
	fill := int(frac * barWidth)
	bar := strings.Repeat("=", fill) + strings.Repeat(" ", barWidth-fill)
	if fill > 0 && fill < barWidth {
		bar = bar[:fill-1] + ">" + bar[fill:]
	}
	rate := 0.0
	if secs := now.Sub(p.start).Seconds(); secs > 0 {
		rate = float64(tokens) / secs
	}
	line := fmt.Sprintf("prepare [%s] %5.1f%%  %s / %s  %s tokens  %s tokens/s",
		bar, 100*frac, units.Bytes(done), units.Bytes(p.total), units.Metric(float64(tokens)), units.Metric(rate))
	pad := ""
	if len(line) < p.width {
		pad = strings.Repeat(" ", p.width-len(line))
	}
	p.width = len(line)
	fmt.Fprint(p.w, "\r"+line+pad+end)
}
