package main

import (
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/engine/hf"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/planner"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/units"
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
