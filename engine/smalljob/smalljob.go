// Package smalljob writes "small", the config of the tests' multi-process
// jobs: the tiny preset's layers with a vocabulary of 256, trained on
// gptui's documentation as bytes (each byte one token, in llm.c's shard
// format).
//
// tiny's 50257-token embedding and classifier are 96% of its parameters
// and most of its step, its gradient all-reduce and its checkpoints;
// without them a 4-rank job costs a third of the CPU, and a test of the
// runner spends its time on what it tests: processes, the network, stops,
// saves and restarts. Tests of the product as a user runs it (the
// quickstart, the README's commands, the terminal UI) keep tiny on the
// built-in corpus.
package smalljob

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gptui/gptui"
	"github.com/gptui/gptui/engine/data"
)

// Write writes the corpus, dir/bytes/data_000000.bin, and the config,
// dir/small.yaml, whose data paths are absolute, and returns the config's
// path: the tests' sshd nodes are this machine, so every node reads the
// same files.
func Write(dir string) (string, error) {
	var text []byte
	err := fs.WalkDir(gptui.Docs, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(gptui.Docs, p)
		text = append(text, b...)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("smalljob: %w", err)
	}
	toks := make([]uint16, len(text))
	for i, b := range text {
		toks[i] = uint16(b)
	}
	shards := filepath.Join(dir, "bytes")
	if err := os.MkdirAll(shards, 0o755); err != nil {
		return "", fmt.Errorf("smalljob: %w", err)
	}
	if err := data.WriteShard(filepath.Join(shards, "data_000000.bin"), toks); err != nil {
		return "", fmt.Errorf("smalljob: %w", err)
	}
	yaml := "_base_: tiny\nModel:\n  vocab_size: 256\nData:\n" +
		"  Train:\n    dataset:\n      input_dir: " + shards + "\n" +
		"  Eval:\n    dataset:\n      input_dir: " + shards + "\n"
	cfg := filepath.Join(dir, "small.yaml")
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		return "", fmt.Errorf("smalljob: %w", err)
	}
	return cfg, nil
}
