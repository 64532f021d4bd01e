package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/engine/data"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/planner"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/units"
)

func cmdGenerate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("generate", stderr)
	ckpt := fs.String("ckpt", "", "checkpoint directory (step_N, or an output_dir with `latest`)")
	prompt := fs.String("prompt", "", "text to continue")
	promptFile := fs.String("prompt-file", "", "file with one prompt per line, generated as one batch")
	n := fs.Int("max-new-tokens", 64, "tokens to generate per prompt")
	temp := fs.Float64("temperature", 1, "sampling temperature; 0 is greedy")
	topK := fs.Int("top-k", 0, "sample from the K most likely tokens (0: all)")
	topP := fs.Float64("top-p", 1, "sample from the smallest set with this total probability (1: all)")
	seed := fs.Uint64("seed", 1234, "sampling seed")
	tokFile := fs.String("tokenizer", "", "a Hugging Face tokenizer.json (default: the checkpoint config's Data.tokenizer, else GPT-2's built-in tokenizer)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *ckpt == "" || (*prompt == "") == (*promptFile == "") {
		return usagef("usage: gptui generate --ckpt DIR (--prompt TEXT | --prompt-file FILE) [--max-new-tokens N] [--tokenizer tokenizer.json]")
	}
	if *n < 1 || *temp < 0 || *topK < 0 || *topP <= 0 || *topP > 1 {
		return usagef("generate: need --max-new-tokens ≥ 1, --temperature ≥ 0, --top-k ≥ 0, 0 < --top-p ≤ 1")
	}
	texts := []string{*prompt}
	if *promptFile != "" {
		var err error
		if texts, err = readPrompts(*promptFile); err != nil {
			return err
		}
	}
	// The whole model in one process: its parameters and the gradient
	// buffer the engine allocates beside them.
	be, err := cpuBackend(cpu.Options{}, stderr)
	if err != nil {
		return err
	}
	m, _, err := engine.LoadModelChecked(be, *ckpt, func(cfg *presets.Config) error {
		if *tokFile == "" {
			*tokFile = cfg.Data.Tokenizer
		}
		c := *cfg
		c.Global.Device = "cpu" // generate runs on the CPU whatever the config trained on
		return checkMemory(&c, wholeModel, 1, "the model", func(m planner.Memory) int64 { return m.Params + m.Grads })
	})
	if err != nil {
		return err
	}
	tok, err := loadTokenizer(*tokFile)
	if err != nil {
		return err
	}
	if tok.VocabSize() > m.Cfg.V {
		return usagef("generate: the tokenizer %s has %d tokens, more than the model's vocabulary of %d; give the tokenizer the model was trained with (--tokenizer)", *tokFile, tok.VocabSize(), m.Cfg.V)
	}
	prompts := make([][]int, len(texts))
	for i, t := range texts {
		prompts[i] = tok.Encode(t)
	}
	opt := engine.SampleOptions{MaxNewTokens: *n, Temperature: *temp, TopK: *topK, TopP: *topP, Seed: *seed}
	// One prompt streams its tokens as they come; a batch prints each
	// completion when all are done.
	var emit func(int, int) error
	var st streamer
	if len(prompts) == 1 {
		fmt.Fprint(stdout, texts[0])
		emit = func(_, t int) error { return st.add(stdout, tok, t) }
	}
	t0 := time.Now()
	out, err := m.Generate(ctx, prompts, opt, emit)
	if err != nil {
		return err
	}
	dt := time.Since(t0).Seconds()
	defer func() {
		n := 0
		for _, o := range out {
			n += len(o)
		}
		fmt.Fprintf(stderr, "[generate] %d %s, %d new %s in %.2f s: %.1f tokens/s\n", len(out), units.Plural(len(out), "sequence"), n, units.Plural(n, "token"), dt, float64(n)/dt)
	}()
	if len(prompts) == 1 {
		st.flush(stdout, tok)
		fmt.Fprintln(stdout)
		return nil
	}
	for i, o := range out {
		fmt.Fprintf(stdout, "=== %d ===\n%s%s\n", i, texts[i], tok.Decode(o))
	}
	return nil
}

func readPrompts(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("prompt file: %w", err)
	}
	defer f.Close()
	var ps []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			ps = append(ps, l)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("prompt file %s: %w", path, err)
	}
	if len(ps) == 0 {
		return nil, usagef("prompt file %s holds no prompt", path)
	}
	return ps, nil
}

// streamer prints generated text as tokens arrive, holding back bytes that
// do not yet form whole UTF-8 characters (a BPE token can end mid-rune).
type streamer struct {
	toks    []int
	printed int // bytes of the decoded text already written
}

func (s *streamer) add(w io.Writer, tok *data.Tokenizer, t int) error {
	s.toks = append(s.toks, t)
	text := tok.Decode(s.toks)
	end := len(text)
	for end > s.printed && !utf8.ValidString(text[s.printed:end]) {
		end--
	}
	_, err := io.WriteString(w, text[s.printed:end])
	s.printed = end
	return err
}

func (s *streamer) flush(w io.Writer, tok *data.Tokenizer) {
	text := tok.Decode(s.toks)
	io.WriteString(w, text[s.printed:])
}
