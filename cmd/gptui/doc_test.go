package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The doc tests hold the documentation (README.md and docs/*.md) to the
// binary: its examples run as written and the output it quotes has the
// shape of what the binary prints (here); its map of the code names every
// package and its command tables every command (overview_test.go).
//
// A page marks a code block with an HTML comment on the line just before
// the opening fence (a reader of the rendered page sees nothing of it):
//
//	<!-- example -->                    run the block's commands
//	<!-- example, given: hosts.txt corpus/ -->
//	                                    the same, with these inputs put in
//	                                    the directory first (see docGiven)
//	<!-- output of: CMD -->             the block is what CMD prints, or part
//	                                    of it (stdout and stderr together),
//	                                    and CMD exits 0
//	<!-- file PATH after: CMD -->       the block is the file PATH that CMD
//	                                    writes, or part of it
//	<!-- file: NAME -->                 the block is saved as NAME in the
//	                                    page's directory, for the examples
//	                                    after it
//	<!-- not run: WHY -->               not run, for the reason given (a
//	                                    cluster, a GPU, a terminal)
//	<!-- cluster guide -->              docs/cluster.md alone: run by
//	                                    TestClusterGuide against two sshd
//	                                    nodes (clusterguide_test.go), with
//	<!-- cluster guide, file: NAME -->  a file it writes, and
//	<!-- cluster guide, output -->      what the block before printed
//
// Every fenced block without a language, or with a shell's (sh, bash,
// shell, console), carries one of them; formulas and diagrams are fenced
// as text, files as their language (yaml, json, python). Indented code
// blocks are refused: a fence can carry a mark.

// A docBlock is one fenced code block of a page.
type docBlock struct {
	page  string   // README.md, docs/training.md
	line  int      // the opening fence's line, from 1
	lang  string   // the fence's info string: "", "yaml", "text", ...
	mark  string   // the comment on the line before, without <!-- -->; "" for none
	lines []string // the block's lines, without the fence's indentation
}

func (b docBlock) where() string { return fmt.Sprintf("%s:%d", b.page, b.line) }

var (
	fenceRE    = regexp.MustCompile("^( *)```\\s*([^`\\s]*)\\s*$")
	markRE     = regexp.MustCompile(`^<!--\s*(.*?)\s*-->$`)
	listItemRE = regexp.MustCompile(`^\s*([-*+]|\d+[.)])\s`)
)

// readDocBlocks returns the fenced code blocks of a page, and an error for
// an indented code block or a fence left open.
func readDocBlocks(root, page string) ([]docBlock, error) {
	b, err := os.ReadFile(filepath.Join(root, page))
	if err != nil {
		return nil, err
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	var blocks []docBlock
	var open *docBlock
	indent := ""
	inList, prevBlank := false, true
	for i, line := range lines {
		if open != nil {
			if m := fenceRE.FindStringSubmatch(line); m != nil && m[2] == "" {
				blocks = append(blocks, *open)
				open = nil
				prevBlank = false
				continue
			}
			open.lines = append(open.lines, strings.TrimPrefix(line, indent))
			continue
		}
		if m := fenceRE.FindStringSubmatch(line); m != nil {
			open = &docBlock{page: page, line: i + 1, lang: m[2]}
			indent = m[1]
			if i > 0 {
				if mm := markRE.FindStringSubmatch(strings.TrimSpace(lines[i-1])); mm != nil {
					open.mark = mm[1]
				}
			}
			continue
		}
		trimmed := strings.TrimLeft(line, " \t")
		if trimmed == "" {
			prevBlank = true
			continue
		}
		lead := len(line) - len(trimmed)
		switch {
		case listItemRE.MatchString(line):
			inList = true
		case lead == 0 && prevBlank:
			inList = false
		}
		if (lead >= 4 || strings.HasPrefix(line, "\t")) && prevBlank && !inList {
			return nil, fmt.Errorf("%s:%d: an indented code block; fence it (```) so that it can carry a mark", page, i+1)
		}
		prevBlank = false
	}
	if open != nil {
		return nil, fmt.Errorf("%s:%d: a code block is never closed", page, open.line)
	}
	return blocks, nil
}

// A docMark is a block's mark, parsed.
type docMark struct {
	kind  string   // "example", "output", "file", "save", "not run", "guide", "guide file", "guide output", "" (none)
	given []string // example: the inputs it needs
	cmd   string   // output, file: the command
	path  string   // file: the file the command writes; save, guide file: the name
}

var (
	exampleMarkRE = regexp.MustCompile(`^example(?:, given: (.+))?$`)
	outputMarkRE  = regexp.MustCompile(`^output of: (.+)$`)
	fileMarkRE    = regexp.MustCompile(`^file (\S+) after: (.+)$`)
	saveMarkRE    = regexp.MustCompile(`^file: (\S+)$`)
	notRunMarkRE  = regexp.MustCompile(`^not run: \S`)
	guideMarkRE   = regexp.MustCompile(`^cluster guide(?:, (output|file: (\S+)))?$`)
)

func parseDocMark(b docBlock) (docMark, error) {
	s := b.mark
	switch {
	case s == "":
		switch b.lang {
		case "", "sh", "bash", "shell", "console":
			return docMark{}, fmt.Errorf("%s: a code block without a mark: precede it with <!-- example -->, <!-- output of: CMD -->, <!-- not run: WHY --> (see cmd/gptui/doc_test.go), or fence a formula as text", b.where())
		}
		return docMark{}, nil
	case exampleMarkRE.MatchString(s):
		given := strings.Fields(exampleMarkRE.FindStringSubmatch(s)[1])
		for _, name := range given {
			if _, ok := docGiven[name]; !ok {
				return docMark{}, fmt.Errorf("%s: no input %q to give (docGiven has %v)", b.where(), name, slices.Sorted(maps.Keys(docGiven)))
			}
		}
		return docMark{kind: "example", given: given}, nil
	case outputMarkRE.MatchString(s):
		return docMark{kind: "output", cmd: outputMarkRE.FindStringSubmatch(s)[1]}, nil
	case fileMarkRE.MatchString(s):
		g := fileMarkRE.FindStringSubmatch(s)
		return docMark{kind: "file", path: g[1], cmd: g[2]}, nil
	case saveMarkRE.MatchString(s):
		return docMark{kind: "save", path: saveMarkRE.FindStringSubmatch(s)[1]}, nil
	case notRunMarkRE.MatchString(s):
		return docMark{kind: "not run"}, nil
	case guideMarkRE.MatchString(s):
		// TestClusterGuide runs docs/cluster.md's alone.
		if b.page != filepath.Join("docs", "cluster.md") {
			return docMark{}, fmt.Errorf("%s: <!-- %s --> is for docs/cluster.md, which TestClusterGuide runs; mark it <!-- example --> or <!-- not run: WHY -->", b.where(), s)
		}
		switch g := guideMarkRE.FindStringSubmatch(s); {
		case g[1] == "output":
			return docMark{kind: "guide output"}, nil
		case g[2] != "":
			return docMark{kind: "guide file", path: g[2]}, nil
		}
		return docMark{kind: "guide"}, nil
	}
	return docMark{}, fmt.Errorf("%s: unknown mark <!-- %s --> (see cmd/gptui/doc_test.go)", b.where(), s)
}

// TestDocMarks: every code block of the pages that a reader could paste
// or take for the binary's output carries a mark the doc tests know, so
// that no example or sample output escapes TestDocExamples unnoticed.
func TestDocMarks(t *testing.T) {
	root, pages := docPages(t)
	counts := map[string]int{}
	for _, page := range pages {
		blocks, err := readDocBlocks(root, page)
		if err != nil {
			t.Error(err)
			continue
		}
		for _, b := range blocks {
			mk, err := parseDocMark(b)
			if err != nil {
				t.Error(err)
				continue
			}
			counts[mk.kind]++
			if mk.kind == "example" {
				cmds, err := docCommands(b)
				if err != nil {
					t.Error(err)
				}
				for _, c := range cmds {
					if err := docRunnable(c.words); err != nil {
						t.Errorf("%s:%d: %v", b.page, c.line, err)
					}
				}
			}
		}
	}
	if counts["example"] == 0 || counts["output"] == 0 {
		t.Errorf("the pages mark %d examples and %d outputs; the marks went missing", counts["example"], counts["output"])
	}
}

// A docCmd is one command line of an example: its words, and for a
// "$ " line the output lines that follow it in the block.
type docCmd struct {
	line  int      // in the page
	words []string // comments dropped, continuations joined
	out   []string // "$ " form: the output shown after it
	shown bool     // "$ " form: out is to be compared
}

// docCommands splits an example block into its commands. A block in the
// "$ " form has a command on each line beginning "$ " and its output on
// the lines after it; otherwise every line is a command. A line ending in
// a backslash continues on the next; '#' at the start of a word begins a
// comment.
func docCommands(b docBlock) ([]docCmd, error) {
	dollar := false
	for _, l := range b.lines {
		if strings.HasPrefix(l, "$ ") {
			dollar = true
		}
	}
	var cmds []docCmd
	for i := 0; i < len(b.lines); i++ {
		l := b.lines[i]
		if dollar && !strings.HasPrefix(l, "$ ") {
			if len(cmds) == 0 {
				return nil, fmt.Errorf("%s: output before the first '$ ' command", b.where())
			}
			cmds[len(cmds)-1].out = append(cmds[len(cmds)-1].out, l)
			continue
		}
		line := b.line + 1 + i
		text := strings.TrimPrefix(l, "$ ")
		for strings.HasSuffix(text, `\`) && i+1 < len(b.lines) {
			i++
			text = strings.TrimSuffix(text, `\`) + " " + strings.TrimSpace(b.lines[i])
		}
		words, err := shellWords(text)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %v", b.page, line, err)
		}
		if len(words) == 0 {
			continue
		}
		cmds = append(cmds, docCmd{line: line, words: words, shown: dollar})
	}
	return cmds, nil
}

// shellWords splits a command line as a shell would, for the little the
// examples use: quotes, '#' comments and "&&" between commands.
func shellWords(s string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case c == '#' && !inWord:
			i = len(s)
		case c == '\'' || c == '"':
			j := strings.IndexByte(s[i+1:], c)
			if j < 0 {
				return nil, fmt.Errorf("unclosed %c in %q", c, s)
			}
			w.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

// docGiven are the inputs an example may be given ("given: NAME" in its
// mark), which a reader would have of their own: text to tokenize and a
// host inventory.
var docGiven = map[string]func(t *testing.T, root, dir string){
	// A folder of text: the documentation's pages as .txt files.
	"corpus/": func(t *testing.T, root, dir string) { giveTextDir(t, root, filepath.Join(dir, "corpus")) },
	"books/":  func(t *testing.T, root, dir string) { giveTextDir(t, root, filepath.Join(dir, "books")) },
	// JSON Lines with a text field: the README's paragraphs, one a line.
	"extra.jsonl": func(t *testing.T, root, dir string) {
		b, err := os.ReadFile(filepath.Join(root, "README.md"))
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		enc := json.NewEncoder(&out)
		for _, p := range strings.Split(string(b), "\n\n") {
			enc.Encode(map[string]string{"text": p, "source": "README.md"})
		}
		writeFile(t, filepath.Join(dir, "extra.jsonl"), out.Bytes())
	},
	// An inventory of two nodes of 8 accelerators each, which the
	// examples read (the planner counts its devices) and never connect to.
	"hosts.txt": func(t *testing.T, root, dir string) {
		writeFile(t, filepath.Join(dir, "hosts.txt"), []byte("# two nodes of 8 GPUs\ngpu0 devices=0-7\ngpu1 devices=0-7\n"))
	},
}

func giveTextDir(t *testing.T, root, dir string) {
	t.Helper()
	pages, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	for _, p := range pages {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, strings.TrimSuffix(filepath.Base(p), ".md")+".txt"), b)
	}
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// docMaxSteps is the overrides the doc tests append to every 'train' and
// 'run' command of the examples, which train tiny for 200 steps or more
// (a minute each on 2 cores): two steps, and an evaluation of one batch,
// show every kind of line (a [train] line for each, [eval] and the
// checkpoint at the last step, [done]).
var docMaxSteps = []string{"-o", "Engine.max_steps=2", "-o", "Engine.eval_iters=1"}

// A docRun is what one command printed and the exit status it ended with.
type docRun struct {
	out   []string          // stdout and stderr as they came
	code  int               // exit status
	files map[string]string // the files that a "file PATH after" mark quotes, as the command left them
}

// docRunner runs the examples' commands and keeps what each printed, so
// that an output quoted on another page is compared with the same run.
type docRunner struct {
	env   []string
	files []string // every PATH of a "file PATH after" mark

	mu   sync.Mutex
	runs map[string]docRun // by the command's words after the program
}

// docTrains reports whether a command line trains (train, run) or needs
// what training left (generate), which -short leaves out.
func docTrains(words []string) bool {
	for i := 0; i+1 < len(words); i++ {
		if (i == 0 || words[i-1] == "&&") && (words[i] == "gptui" || words[i] == "./gptui") {
			switch words[i+1] {
			case "train", "run", "generate":
				return true
			}
		}
	}
	return false
}

// docBuild is the README's command that builds gptui (without cgo:
// TestBinaryGLIBC builds with it and checks what the binary needs).
var docBuild = []string{"CGO_ENABLED=0", "go", "build", "-o", "gptui", "./cmd/gptui"}

// docRunnable says why the doc tests cannot run a command line, if they
// cannot: they run gptui (the binary under test), ./gptui, and the
// README's 'CGO_ENABLED=0 go build -o gptui ./cmd/gptui' (docBuild), for
// which they link their binary to ./gptui.
func docRunnable(words []string) error {
	for len(words) > 0 {
		cmd := words
		if i := slices.Index(words, "&&"); i >= 0 {
			cmd, words = words[:i], words[i+1:]
		} else {
			words = nil
		}
		switch {
		case len(cmd) == 0:
			return errors.New("an empty command")
		case cmd[0] == "gptui", cmd[0] == "./gptui":
		case slices.Equal(cmd, docBuild):
		default:
			return fmt.Errorf("%q: the doc tests run gptui, ./gptui and '%s'; mark the block <!-- not run: WHY -->", strings.Join(cmd, " "), strings.Join(docBuild, " "))
		}
	}
	return nil
}

// run runs one command line (its "&&"-joined commands in turn, until one
// fails) in dir and returns the last command's run.
func (r *docRunner) run(t *testing.T, dir string, words []string) docRun {
	t.Helper()
	var res docRun
	for len(words) > 0 {
		cmd := words
		if i := slices.Index(words, "&&"); i >= 0 {
			cmd, words = words[:i], words[i+1:]
		} else {
			words = nil
		}
		res = r.run1(t, dir, cmd)
		if res.code != 0 {
			break
		}
	}
	return res
}

func (r *docRunner) run1(t *testing.T, dir string, words []string) docRun {
	t.Helper()
	if err := docRunnable(words); err != nil {
		t.Fatal(err)
	}
	var bin string
	switch words[0] {
	case docBuild[0]:
		// The README builds the binary; the test links the one it has.
		if err := os.Symlink(builtGPTUI(t), filepath.Join(dir, "gptui")); err != nil {
			t.Fatal(err)
		}
		return docRun{}
	case "gptui":
		bin = builtGPTUI(t)
	case "./gptui":
		bin = filepath.Join(dir, "gptui")
	}
	args := slices.Clone(words[1:])
	if len(args) > 0 && (args[0] == "train" || args[0] == "run") {
		args = append(args, docMaxSteps...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, bin, args...)
	c.Dir, c.Env = dir, r.env
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	err := c.Run()
	res := docRun{out: docLines(out.String()), files: map[string]string{}}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		res.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("%s: %v", strings.Join(words, " "), err)
	}
	for _, f := range r.files {
		if b, err := os.ReadFile(filepath.Join(dir, f)); err == nil {
			res.files[f] = string(b)
		}
	}
	key := strings.Join(words[1:], " ")
	r.mu.Lock()
	if _, ok := r.runs[key]; !ok {
		r.runs[key] = res
	}
	r.mu.Unlock()
	return res
}

// docLines splits what a command printed into the lines a terminal shows:
// at line ends, and at the carriage returns of a progress line.
func docLines(s string) []string {
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		if !strings.Contains(l, "\r") {
			lines = append(lines, l)
			continue
		}
		for _, p := range strings.Split(l, "\r") {
			if p != "" {
				lines = append(lines, p)
			}
		}
	}
	return lines
}

// quoted returns the run of a command that an output block quotes: the
// run of an example with the same words, else a run of its own in a
// directory of its own.
func (r *docRunner) quoted(t *testing.T, cmd string) docRun {
	t.Helper()
	words, err := shellWords(cmd)
	if err != nil || len(words) < 2 || (words[0] != "gptui" && words[0] != "./gptui") {
		t.Fatalf("%q: an output mark names a gptui command (%v)", cmd, err)
	}
	r.mu.Lock()
	res, ok := r.runs[strings.Join(words[1:], " ")]
	r.mu.Unlock()
	if ok {
		return res
	}
	words[0] = "gptui"
	return r.run(t, t.TempDir(), words)
}

// TestDocExamples runs the runnable examples of README.md and docs/*.md
// against the built binary, and compares the output the pages quote with
// what it prints.
//
// Each page's examples run in order in a directory of the page's own, as
// a reader following the page would run them (the pages side by side);
// each command must exit 0.
// Commands are gptui (the binary under test), ./gptui and the README's
// 'CGO_ENABLED=0 go build -o gptui ./cmd/gptui' (for which the test
// links its binary to ./gptui). To each 'train' and 'run' command the test appends
// '-o Engine.max_steps=2' (docMaxSteps): the examples train for 200 steps
// and more. Every command runs with GPTUI_BLAS=go (so the [backend] line
// names the built-in GEMM on any machine) and an XDG_CACHE_HOME of the
// test's own (so plans use the built-in CPU profile, not one measured on
// this machine). Under -short the examples that train (train, run,
// generate) are left out, and so are the outputs they quote.
//
// An output's shape is compared, not its figures: every line the page
// quotes is a line the command printed, each number in it standing for
// any number and "..." (or "…") for any text; lines quoted one after the
// other were printed one after the other, and a line that is only "..."
// stands for any number of lines. The quoted lines may be a part of the
// output (a page quotes the lines it explains), in the order printed.
func TestDocExamples(t *testing.T) {
	t.Parallel() // beside the other tests that look for no process of theirs left
	root, pages := docPages(t)
	cache := t.TempDir()
	r := &docRunner{runs: map[string]docRun{},
		env: append(os.Environ(), "GPTUI_BLAS=go", "XDG_CACHE_HOME="+cache)}
	type page struct {
		name   string
		blocks []docBlock
		marks  []docMark
	}
	var all []page
	for _, name := range pages {
		blocks, err := readDocBlocks(root, name)
		if err != nil {
			t.Fatal(err)
		}
		p := page{name: name, blocks: blocks}
		for _, b := range blocks {
			mk, err := parseDocMark(b)
			if err != nil {
				t.Fatal(err) // TestDocMarks says which
			}
			if mk.kind == "file" && !slices.Contains(r.files, mk.path) {
				r.files = append(r.files, mk.path)
			}
			p.marks = append(p.marks, mk)
		}
		all = append(all, p)
	}
	// First every page's examples, the pages side by side (as many as
	// -parallel lets run), each page's in order in its directory; then the
	// outputs the pages quote, from the examples' runs where they ran the
	// command.
	t.Run("examples", func(t *testing.T) {
		for _, p := range all {
			t.Run(strings.ReplaceAll(p.name, "/", "_"), func(t *testing.T) {
				t.Parallel()
				dir := t.TempDir()
				for i, b := range p.blocks {
					switch mk := p.marks[i]; mk.kind {
					case "example":
						r.example(t, root, dir, b, mk)
					case "save":
						writeFile(t, filepath.Join(dir, mk.path), []byte(strings.Join(b.lines, "\n")+"\n"))
					}
				}
			})
		}
	})
	t.Run("outputs", func(t *testing.T) {
		for _, p := range all {
			for i, b := range p.blocks {
				if mk := p.marks[i]; mk.kind == "output" || mk.kind == "file" {
					r.output(t, b, mk)
				}
			}
		}
	})
}

// example runs the commands of an example block in dir, after putting
// there the inputs it is given.
func (r *docRunner) example(t *testing.T, root, dir string, b docBlock, mk docMark) {
	t.Helper()
	cmds, err := docCommands(b)
	if err != nil {
		t.Fatal(err)
	}
	if testing.Short() && slices.ContainsFunc(cmds, func(c docCmd) bool { return docTrains(c.words) }) {
		return
	}
	for _, name := range mk.given {
		docGiven[name](t, root, dir)
	}
	for _, c := range cmds {
		res := r.run(t, dir, c.words)
		what := fmt.Sprintf("%s:%d: %s", b.page, c.line, strings.Join(c.words, " "))
		if res.code != 0 {
			t.Fatalf("%s: exit %d, want 0:\n%s", what, res.code, strings.Join(res.out, "\n"))
		}
		if c.shown {
			if err := matchShape(c.out, res.out); err != nil {
				t.Errorf("%s: %v", what, err)
			}
		}
	}
}

// output compares a block that quotes a command's output, or a file it
// writes, with the command's run.
func (r *docRunner) output(t *testing.T, b docBlock, mk docMark) {
	t.Helper()
	words, _ := shellWords(mk.cmd)
	if testing.Short() && docTrains(words) {
		return
	}
	res := r.quoted(t, mk.cmd)
	got := res.out
	if mk.kind == "file" {
		s, ok := res.files[mk.path]
		if !ok {
			t.Errorf("%s: %s wrote no %s", b.where(), mk.cmd, mk.path)
			return
		}
		got = strings.Split(strings.TrimRight(s, "\n"), "\n")
	} else if res.code != 0 {
		t.Errorf("%s: %s exited %d:\n%s", b.where(), mk.cmd, res.code, strings.Join(res.out, "\n"))
		return
	}
	if err := matchShape(b.lines, got); err != nil {
		t.Errorf("%s: the output of %s: %v", b.where(), mk.cmd, err)
	}
}

var docNumRE = regexp.MustCompile(`\d+(?:\.\d+)?(?:e[-+]?\d+)?`)

// shapeRE is the pattern of the lines that a quoted line stands for: its
// numbers any number, of either sign (a quoted 646.1% deviation stands for
// a printed -2.9%), "..." and "…" any text.
func shapeRE(line string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString("^")
	for i, part := range regexp.MustCompile(`\.\.\.|…`).Split(strings.TrimRight(line, " "), -1) {
		if i > 0 {
			b.WriteString(".*")
		}
		last := 0
		for _, m := range docNumRE.FindAllStringIndex(part, -1) {
			b.WriteString(regexp.QuoteMeta(part[last:m[0]]))
			if !strings.HasSuffix(part[:m[0]], "-") {
				b.WriteString(`-?`)
			}
			b.WriteString(`\d+(?:\.\d+)?(?:e[-+]?\d+)?`)
			last = m[1]
		}
		b.WriteString(regexp.QuoteMeta(part[last:]))
	}
	b.WriteString(" *$")
	return regexp.MustCompile(b.String())
}

// matchShape checks the quoted lines doc against the printed lines got:
// each run of quoted lines between "..." lines matches consecutive
// printed lines, the runs in order.
func matchShape(doc, got []string) error {
	var runs [][]string
	cur := []string{}
	for _, l := range doc {
		if s := strings.TrimSpace(l); s == "..." || s == "…" {
			runs = append(runs, cur)
			cur = []string{}
			continue
		}
		cur = append(cur, l)
	}
	runs = append(runs, cur)
	at := 0
	for _, run := range runs {
		if len(run) == 0 {
			continue
		}
		res := make([]*regexp.Regexp, len(run))
		for i, l := range run {
			res[i] = shapeRE(l)
		}
		found := -1
	search:
		for s := at; s+len(run) <= len(got); s++ {
			for i, re := range res {
				if !re.MatchString(got[s+i]) {
					continue search
				}
			}
			found = s
			break
		}
		if found < 0 {
			// Say which line is the first that no printed line has.
			for i, re := range res {
				if !slices.ContainsFunc(got[at:], re.MatchString) {
					return fmt.Errorf("no line printed after the lines matched before has the shape of\n\t%s\nprinted:\n%s", run[i], strings.Join(got, "\n"))
				}
			}
			return fmt.Errorf("these lines were not printed one after the other (after the lines matched before):\n\t%s\nprinted:\n%s", strings.Join(run, "\n\t"), strings.Join(got, "\n"))
		}
		at = found + len(run)
	}
	return nil
}

// TestDocShape: the shape comparison itself, on lines that pass and fail.
func TestDocShape(t *testing.T) {
	got := []string{
		"[model] layers: 2 hidden: 64",
		"[train] epoch: 0 step: 0 lr: 1.000000e-03 loss: 10.819618 mfu: 1.0%",
		"[train] epoch: 0 step: 1 lr: 5.500000e-04 loss: 10.785176 mfu: 12.0%",
		"[done] steps: 2",
		"[plan] measured: step 0.094 s (predicted 0.097 s, -2.9%)",
	}
	for _, tc := range []struct {
		doc []string
		ok  bool
	}{
		{[]string{"[model] layers: 12 hidden: 768"}, true},
		{[]string{"[train] epoch: 1 step: 120 lr: 9.876543e-04 loss: 5.123456 mfu: 4.9%"}, true},
		{[]string{"[train] epoch: 0 step: 0 ... mfu: 1.0%", "...", "[done] steps: 200"}, true},
		{[]string{"[model] layers: 2 hidden: 64", "[done] steps: 2"}, false},          // not one after the other
		{[]string{"[done] steps: 2", "[model] layers: 2 hidden: 64"}, false},          // out of order
		{[]string{"[train] epoch: 0 step: 0 lr: 1.0e-03 loss: 10.8"}, false},          // a line cut short
		{[]string{"[done] steps: 2 median ips: 2391 tokens/s"}, false},                // words that are not printed
		{[]string{"[plan] measured: step 0.482 s (predicted 0.065 s, 646.1%)"}, true}, // a number of either sign
		{[]string{"[plan] measured: step 0.482 s (predicted 0.065 s, 646.1)"}, false}, // not the % printed
	} {
		if err := matchShape(tc.doc, got); (err == nil) != tc.ok {
			t.Errorf("matchShape(%q): %v, want ok %v", tc.doc, err, tc.ok)
		}
	}
}
