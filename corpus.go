// Package gptui holds what the gptui binary embeds from the repository root:
// the project's documentation, which is also the built-in training corpus.
//
// The command itself lives in cmd/gptui and the engine under engine/.
package gptui

import "embed"

// Docs is the Markdown documentation in docs/, embedded in the binary. It
// doubles as the built-in training corpus: when a configuration names no
// input_dir, gptui trains on these files, tokenized by
// data.BuiltinCorpus(Docs) in sorted order of their paths ("docs/*.md").
//
//go:embed docs/*.md
var Docs embed.FS
