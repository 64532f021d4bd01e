package main

import (
	"fmt"
	"io"
	"path/filepath"

	"github.com/gptui/gptui/engine/checkpoint"
)

// cmdCkpt implements 'gptui ckpt consolidate --ckpt DIR --out OUT': a
// checkpoint of any layout's files rewritten as one file, every tensor
// whole, for sharing — streamed tensor by tensor.
func cmdCkpt(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "consolidate" {
		return usagef("usage: gptui ckpt consolidate --ckpt DIR --out OUT_DIR")
	}
	fs := newFlagSet("ckpt consolidate", stderr)
	ckpt := fs.String("ckpt", "", "checkpoint directory (step_N, or an output_dir with `latest`)")
	out := fs.String("out", "", "output directory: the one-file checkpoint becomes its step_N and latest")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	if *ckpt == "" || *out == "" {
		return usagef("usage: gptui ckpt consolidate --ckpt DIR --out OUT_DIR")
	}
	c, err := openCheckpointDir(*ckpt, stderr)
	if err != nil {
		return err
	}
	if filepath.Clean(filepath.Dir(c.Dir)) == filepath.Clean(*out) {
		return usagef("ckpt consolidate: --out %s is the checkpoint's own output directory; name another", *out)
	}
	dir, err := checkpoint.Consolidate(c, *out)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "consolidated %s (%d files) into %s (one file)\n", c.Dir, len(c.Manifest.Files), dir)
	return nil
}

// openCheckpointDir loads the checkpoint dir names: a step_N directory,
// or an output directory whose latest (or newest loadable) one it takes.
// Checkpoints passed over are said on stderr.
func openCheckpointDir(dir string, stderr io.Writer) (*checkpoint.Checkpoint, error) {
	if c, err := checkpoint.Load(dir); err == nil {
		return c, nil
	}
	c, warn, err := checkpoint.Latest(dir)
	for _, w := range warn {
		fmt.Fprintln(stderr, "gptui: "+w)
	}
	return c, err
}
