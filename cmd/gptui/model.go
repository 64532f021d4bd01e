package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/engine/data"
	"github.com/gptui/gptui/engine/hf"
	"github.com/gptui/gptui/internal/units"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/planner"
	"github.com/gptui/gptui/presets"
)

func cmdExport(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("export", stderr)
	ckpt := fs.String("ckpt", "", "checkpoint directory (step_N, or an output_dir with `latest`)")
	to := fs.String("to", "", "format: hf or llmc")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if *ckpt == "" || len(pos) != 1 || (*to != "hf" && *to != "llmc") {
		return usagef("usage: gptui export --ckpt DIR --to hf OUT_DIR | --to llmc FILE.bin")
	}
	out := pos[0]
	// Streamed tensor by tensor from the checkpoint's files, whatever the
	// layout that wrote them: the process holds a tensor (and its
	// transpose) at a time, not the model.
	src, err := engine.OpenModelSource(*ckpt, nil)
	if err != nil {
		return err
	}
	if *to == "hf" {
		err = hf.ExportFrom(out, src.Shape, src.Read, hf.MaxShardBytes)
	} else {
		err = engine.WriteLLMC(out, src.Shape, src.Read)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "exported %s to %s (%s)\n", *ckpt, out, *to)
	return nil
}

func cmdImport(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("import", stderr)
	from := fs.String("from", "", "format: hf or llmc")
	out := fs.String("out", "", "output directory for the checkpoint")
	force := fs.Bool("force", false, "import into an --out that holds checkpoints: the import becomes the latest, and a later --resume overwrites the steps above it")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if *out == "" || len(pos) != 1 || (*from != "hf" && *from != "llmc") {
		return usagef("usage: gptui import --from hf DIR | --from llmc FILE.bin --out DIR [--force]")
	}
	src := pos[0]
	// The import is a checkpoint of step 0: in a training output folder
	// it would become the latest, and a --resume from it would overwrite
	// the run's checkpoints one by one.
	steps, latest, err := checkpoint.Contents(*out)
	if err != nil {
		return fmt.Errorf("import: --out %s: %w", *out, err)
	}
	held := importHeld(steps, latest)
	if held != "" && !*force {
		return usagef("import: --out %s holds %s: the import (step 0) would become the latest there and a --resume would overwrite them; choose an empty folder, or pass --force", *out, held)
	}
	be := cpu.New()
	var m *engine.Model
	// The model's shape is checked against the memory the process may
	// hold once the files are seen to hold it, before it is allocated: an
	// hf import holds the parameters it read, then the model's parameters
	// and gradients; an llm.c import the model's alone.
	if *from == "hf" {
		// The defaults the import applied are said once it has read the
		// model: a refused import says only why.
		var notes []string
		cfg, params, err := hf.ImportWith(src, hf.ImportOptions{
			Check: func(c engine.ModelConfig) error { return checkFileMemory(src, c, 3, "import") },
			Note:  func(s string) { notes = append(notes, s) },
		})
		if err != nil {
			return err
		}
		for _, n := range notes {
			fmt.Fprintln(stdout, "[import] "+n)
		}
		if m, err = engine.NewModel(be, cfg, 0, 0); err != nil {
			return err
		}
		copy(m.Params, params)
	} else {
		var err error
		if m, err = engine.LoadLLMCChecked(be, src, engine.ModelConfig{}, 0, func(c engine.ModelConfig) error { return checkFileMemory(src, c, 2, "import") }); err != nil {
			return err
		}
	}
	cfg, err := configFor(m.Cfg)
	if err != nil {
		return err
	}
	dir, err := engine.SaveModel(m, cfg, *out)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "imported %s as %s\n", src, dir)
	if held != "" {
		replaced := ""
		if slices.Contains(steps, filepath.Base(dir)) {
			replaced = ", the " + filepath.Base(dir) + " it held replaced"
		}
		fmt.Fprintf(stdout, "--force: %s held %s; now latest → %s%s\n", *out, held, filepath.Base(dir), replaced)
	}
	return nil
}

// wholeModel is the layout of a process that holds the whole model.
var wholeModel = planner.Strategy{DP: 1, ShardingDegree: 1, ShardingStage: 1, MP: 1, PP: 1, VPP: 1, MicroBatch: 1, Recompute: planner.RecomputeNone}

// importHeld describes the checkpoints of an import's output folder
// (steps, highest first, and the one latest names), or returns "" for
// none.
func importHeld(steps []string, latest string) string {
	if len(steps) == 0 && latest == "" {
		return ""
	}
	var what string
	switch {
	case len(steps) == 0:
	case len(steps) <= 3:
		what = units.Plural(len(steps), "checkpoint") + " " + strings.Join(steps, ", ")
	default:
		what = fmt.Sprintf("%d checkpoints, %s to %s", len(steps), steps[len(steps)-1], steps[0])
	}
	if latest != "" {
		if what != "" {
			what += ", "
		}
		what += "latest → " + latest
	}
	return what
}

// configFor is the config an imported checkpoint carries: the gpt2-124m
// preset reshaped to a GPT-2's shape, or llama-tiny's to a Llama's, with
// its key/value heads, RMSNorm epsilon, rotary frequencies and tying.
func configFor(c engine.ModelConfig) (*presets.Config, error) {
	preset := "gpt2-124m"
	o := []string{
		fmt.Sprintf("Model.vocab_size=%d", c.V), fmt.Sprintf("Model.hidden_size=%d", c.C),
		fmt.Sprintf("Model.num_layers=%d", c.L), fmt.Sprintf("Model.num_attention_heads=%d", c.NH),
		fmt.Sprintf("Model.ffn_hidden_size=%d", c.F), fmt.Sprintf("Model.max_position_embeddings=%d", c.MaxT),
		fmt.Sprintf("Model.hidden_dropout_prob=%g", c.HiddenDropout), fmt.Sprintf("Model.attention_probs_dropout_prob=%g", c.AttnDropout),
		fmt.Sprintf("Data.Train.dataset.max_seq_len=%d", min(c.MaxT, 1024)),
	}
	if c.Family == arch.Llama {
		preset = "llama-tiny"
		o = append(o, fmt.Sprintf("Model.num_key_value_heads=%d", c.KVHeads()),
			"Model.rms_norm_eps="+strconv.FormatFloat(float64(c.NormEps), 'g', -1, 32),
			"Model.rope_theta="+strconv.FormatFloat(c.RoPE.Theta, 'g', -1, 64), fmt.Sprintf("Model.tie_word_embeddings=%t", c.Tied()))
		if s := c.RoPE.Scaling; s != nil {
			o = append(o, "Model.rope_scaling.rope_type=llama3", fmt.Sprintf("Model.rope_scaling.factor=%g", s.Factor),
				fmt.Sprintf("Model.rope_scaling.low_freq_factor=%g", s.LowFreqFactor), fmt.Sprintf("Model.rope_scaling.high_freq_factor=%g", s.HighFreqFactor),
				fmt.Sprintf("Model.rope_scaling.original_max_position_embeddings=%d", s.OriginalMaxPositions))
		}
	}
	cfg, err := presets.Load(preset, o)
	if err != nil {
		return nil, fmt.Errorf("making a config for the imported shape: %w", err)
	}
	if cfg.PaddedVocab() != c.Vp {
		return nil, usagef("the model pads its vocabulary of %d to %d rows; gptui pads to multiples of 128 (%d)", c.V, c.Vp, cfg.PaddedVocab())
	}
	return cfg, nil
}

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
