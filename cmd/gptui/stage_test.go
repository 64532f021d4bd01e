package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestStageData: the small job's corpus in a folder named by a relative
// path, which this machine (the launcher's current directory) and the
// first node's workdir have and the second node's lacks. The launcher
// copies it there, saying so, and the job gives the same losses, step by
// step, as with the corpus at an absolute path both nodes read; the next
// launch finds it there and copies nothing; with --stage-data=never a
// node without it refuses the job (exit 2) naming the node and the path.
func TestStageData(t *testing.T) {
	long(t)
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	c := newSSHCluster(t, "cpu:2")
	base := append(small(t), "-o", "Engine.max_steps=4", "-o", "Engine.eval_freq=0", "-o", "Engine.logging_freq=1",
		"-o", "Distributed.dp_degree=4", "-o", "Global.local_batch_size=2", "-o", "Global.micro_batch_size=2",
		"-o", "Engine.save_load.force=true") // each run beside the one before in the workdirs' output
	want, _ := jobLosses(t, c, "127.0.0.2", base)

	// The relative folder: here, and in the first node's workdir only.
	shard, err := os.ReadFile(filepath.Join(smallFiles.dir, "bytes", "data_000000.bin"))
	if err != nil {
		t.Fatal(err)
	}
	rel := filepath.Join(fmt.Sprintf("stage-%d-%s", os.Getpid(), filepath.Base(t.TempDir())), "bytes")
	t.Cleanup(func() { os.RemoveAll(filepath.Dir(rel)) })
	for _, root := range []string{".", c.workdirs[0]} {
		if err := os.MkdirAll(filepath.Join(root, rel), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, rel, "data_000000.bin"), shard, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := append(slices.Clone(base), "-o", "Data.Train.dataset.input_dir="+rel, "-o", "Data.Eval.dataset.input_dir="+rel)

	got, out := jobLosses(t, c, "127.0.0.2", args)
	if !slices.Equal(got, want) {
		t.Errorf("with the corpus staged: losses\n%s\nwant, as with it at an absolute path\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	staged := fmt.Sprintf("[127.0.0.3] pushing: staged %s: 1 file, ", rel)
	if !strings.Contains(out, staged) || strings.Contains(out, "[127.0.0.2] pushing: staging") {
		t.Errorf("no line %q (and none for 127.0.0.2, which has it):\n%s", staged, out)
	}
	if b, err := os.ReadFile(filepath.Join(c.workdirs[1], rel, "data_000000.bin")); err != nil || !bytes.Equal(b, shard) {
		t.Errorf("the second node's copy of the shard: %d bytes, %v; want the %d of this machine's", len(b), err, len(shard))
	}

	// Next launch: the node has it; nothing is copied.
	if got, out := jobLosses(t, c, "127.0.0.2", args); !slices.Equal(got, want) || strings.Contains(out, "staging") {
		t.Errorf("the second launch staged again, or trained otherwise:\n%s", out)
	}

	// --stage-data=never: refused, naming the node and the path.
	if err := os.RemoveAll(filepath.Join(c.workdirs[1], filepath.Dir(rel))); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr syncBuffer
	err = c.command(t, &stdout, &stderr, append([]string{"--stage-data=never"}, args...)...).Run()
	msg := stderr.String()
	if code := exitStatus(err); code != 2 || !strings.Contains(msg, "node 127.0.0.3 has no "+rel) || !strings.Contains(msg, "--stage-data=never") {
		t.Errorf("--stage-data=never with the corpus missing on 127.0.0.3: exit %d:\n%s%s", code, stdout.String(), msg)
	}
}
