package main

import (
	"context"
	"fmt"
	"io"

	"github.com/gptui/gptui/engine/data"
	"github.com/gptui/gptui/units"
)

func cmdData(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "prepare" {
		return usagef("usage: gptui data prepare --input FILE|DIR ... --output DIR [--tokenizer tokenizer.json|DIR]")
	}
	fs := newFlagSet("data prepare", stderr)
	var inputs listFlag
	fs.Var(&inputs, "input", "a .txt or .jsonl file, or a directory of them (repeatable)")
	out := fs.String("output", "", "directory for the token shards")
	shard := fs.Int("shard-tokens", 100_000_000, "tokens per shard")
	quiet := fs.Bool("quiet", false, "no progress bar")
	tokFile := fs.String("tokenizer", "", "a Hugging Face tokenizer.json to tokenize with, or its folder with its tokenizer_config.json (default: GPT-2's built-in tokenizer)")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	if len(inputs) == 0 || *out == "" {
		return usagef("data prepare needs --input and --output")
	}
	tok, err := loadTokenizer(*tokFile)
	if err != nil {
		return err
	}
	opts := data.PrepareOptions{ShardTokens: *shard, Tokenizer: tok}
	if !*quiet {
		opts.Progress = stderr
	}
	st, err := data.Prepare(ctx, inputs, *out, opts)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "prepared %d %s from %d %s: %d tokens in %d %s under %s\n", st.Documents, units.Plural(st.Documents, "document"),
		st.Files, units.Plural(st.Files, "file"), st.Tokens, st.Shards, units.Plural(st.Shards, "shard"), *out)
	return nil
}
