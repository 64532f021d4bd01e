package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/gptui/gptui"
	"github.com/gptui/gptui/engine/data"
)

// The job tests train "small": tiny's layers with a vocabulary of 256, on a
// byte-level corpus (each byte of gptui's documentation one token, in
// llm.c's shard format). tiny's 50257-token embedding and classifier are
// 96% of its parameters and most of its step, its gradient all-reduce and
// its checkpoints; without them a 4-rank job costs a third of the CPU, and
// a test's time goes to what it tests: the processes, the network, stops,
// saves and restarts. The quickstart, README and terminal UI tests keep
// tiny on the built-in corpus, as a user runs it.
var smallFiles struct {
	once sync.Once
	dir  string // holds small.yaml and bytes/data_000000.bin
	err  error
}

// small returns the options that select the small config, "-c FILE",
// writing the config and its corpus the first time. The corpus's path in
// the config is absolute: the sshd nodes of the tests are this machine.
func small(t *testing.T) []string {
	t.Helper()
	f := &smallFiles
	f.once.Do(func() {
		f.dir, f.err = os.MkdirTemp("", "gptui-small-")
		if f.err != nil {
			return
		}
		var text []byte
		f.err = fs.WalkDir(gptui.Docs, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := fs.ReadFile(gptui.Docs, p)
			text = append(text, b...)
			return err
		})
		if f.err != nil {
			return
		}
		toks := make([]uint16, len(text))
		for i, b := range text {
			toks[i] = uint16(b)
		}
		shards := filepath.Join(f.dir, "bytes")
		if f.err = os.Mkdir(shards, 0o755); f.err != nil {
			return
		}
		if f.err = data.WriteShard(filepath.Join(shards, "data_000000.bin"), toks); f.err != nil {
			return
		}
		yaml := "_base_: tiny\nModel:\n  vocab_size: 256\nData:\n" +
			"  Train:\n    dataset:\n      input_dir: " + shards + "\n" +
			"  Eval:\n    dataset:\n      input_dir: " + shards + "\n"
		f.err = os.WriteFile(filepath.Join(f.dir, "small.yaml"), []byte(yaml), 0o644)
	})
	if f.err != nil {
		t.Fatalf("small config: %v", f.err)
	}
	return []string{"-c", filepath.Join(f.dir, "small.yaml")}
}
