package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/sshexec"
)

// syncCheckpoints makes every node hold the checkpoint a resuming job
// (Engine.save_load.ckpt_dir: auto) starts from, before any worker starts.
// It asks each node for its newest complete checkpoint and the list of its
// checkpoints; the job resumes from the newest of all. A node whose newest
// is older, and which the newest's node also holds (the same step and
// manifest: one run, the node is only behind), or which has none, gets a
// copy, streamed through the launcher. A node holding a checkpoint of
// another run (its newest is unknown to the newest's node, or a step with
// another manifest) is refused, before anything starts, with an
// *InputError naming the nodes and steps. A job that does not resume is
// left alone.
func (j *Job) syncCheckpoints(ctx context.Context, nodes []*node) error {
	sl := j.opts.Config.Engine.SaveLoad
	if sl.CkptDir != "auto" {
		return nil
	}
	sums, err := j.summaries(ctx, nodes, sl.OutputDir)
	if err != nil {
		return err
	}
	src := newestOf(sums)
	if src < 0 {
		return nil // nothing to resume from anywhere: every rank starts at step 0
	}
	if err := agreeCheckpoints(nodes, sums, src, sl.OutputDir); err != nil {
		return err
	}
	want := sums[src]
	errs := sshexec.ForEach(ctx, len(nodes), j.opts.Parallel, func(ctx context.Context, i int) error {
		if sums[i].Step == want.Step {
			return nil
		}
		j.nodeEvent(nodes[i].name, event.NodePushing, fmt.Sprintf("copying checkpoint %s/%s from %s", sl.OutputDir, want.Name, nodes[src].name))
		if err := copyCheckpoint(ctx, nodes[src], nodes[i], sl.OutputDir, want, sl.KeepLast); err != nil {
			return fmt.Errorf("copying checkpoint %s/%s from %s to %s: %w", sl.OutputDir, want.Name, nodes[src].name, nodes[i].name, err)
		}
		return nil
	})
	return errorsFirst(errs)
}

// summaries asks every node for the checkpoint.Summary of outputDir.
func (j *Job) summaries(ctx context.Context, nodes []*node, outputDir string) ([]checkpoint.Summary, error) {
	sums := make([]checkpoint.Summary, len(nodes))
	errs := sshexec.ForEach(ctx, len(nodes), j.opts.Parallel, func(ctx context.Context, i int) error {
		out, err := nodes[i].gptui(ctx, "agent", "--checkpoint-summary", outputDir)
		if err == nil {
			err = json.Unmarshal(out, &sums[i])
		}
		if err == nil {
			// The names become paths on the nodes: trust none of them.
			err = sums[i].Check()
		}
		if err != nil {
			return fmt.Errorf("node %s: listing the checkpoints of %s: %w", nodes[i].name, outputDir, err)
		}
		return nil
	})
	return sums, errorsFirst(errs)
}

// newestOf returns the index of the summary with the highest step, the
// first of equals; -1 if none has a checkpoint.
func newestOf(sums []checkpoint.Summary) int {
	src := -1
	for i, s := range sums {
		if s.Step >= 0 && (src < 0 || s.Step > sums[src].Step) {
			src = i
		}
	}
	return src
}

// agreeCheckpoints returns an *InputError if a node holds a checkpoint
// that sums[src], the newest, does not also hold: a checkpoint of another
// run.
func agreeCheckpoints(nodes []*node, sums []checkpoint.Summary, src int, outputDir string) error {
	var parts []string // "node1 would start from step 20"
	differ := false
	for i, s := range sums {
		if s.Step < 0 {
			continue
		}
		what := "step " + strconv.Itoa(s.Step)
		if !sums[src].Holds(s) {
			differ = true
			if _, ok := sums[src].History[s.Step]; ok || s.Step == sums[src].Step {
				what += " (another checkpoint: manifest " + s.Manifest[:min(12, len(s.Manifest))] + ")"
			} else {
				what += " (not of this run: " + nodes[src].name + " has no such checkpoint)"
			}
		}
		parts = append(parts, nodes[i].name+" would start from "+what)
	}
	if !differ {
		return nil
	}
	return inputErrorf("resume: %s in %s: remove the stale checkpoint or pass -o Engine.save_load.ckpt_dir=DIR", strings.Join(parts, ", "), outputDir)
}

// copyCheckpoint copies the checkpoint s of outputDir from node src to
// node dst: each file is streamed through the launcher into a temporary
// directory on dst, which `gptui agent --checkpoint-install` then verifies
// against the manifest's hashes and renames into place. An interrupted
// copy leaves only a temporary directory, which checkpoint.Latest ignores
// and the next save removes.
func copyCheckpoint(ctx context.Context, src, dst *node, outputDir string, s checkpoint.Summary, keepLast int) error {
	tmp := path.Join(outputDir, checkpoint.TempCopyName(s.Name))
	for _, f := range s.Files {
		if err := copyFile(ctx, src, path.Join(outputDir, s.Name, f), dst, path.Join(tmp, f)); err != nil {
			dst.removeAll(ctx, tmp)
			return err
		}
	}
	_, err := dst.gptui(ctx, "agent", "--checkpoint-install", tmp, "--manifest", s.Manifest, "--keep-last", strconv.Itoa(keepLast))
	return err
}

// copyFile streams the file from (relative to src's workdir) to the file
// to on dst, creating its directory.
func copyFile(ctx context.Context, src *node, from string, dst *node, to string) error {
	r, wait, err := src.open(ctx, from)
	if err != nil {
		return err
	}
	werr := dst.write(ctx, to, r)
	rerr := wait(werr == nil)
	if werr != nil {
		return werr
	}
	if rerr != nil {
		return fmt.Errorf("reading %s on %s: %w", from, src.name, rerr)
	}
	return nil
}

// localPath is the path of rel (relative to the workdir unless absolute)
// on a local node.
func (n *node) localPath(rel string) string {
	if filepath.IsAbs(rel) {
		return rel
	}
	return filepath.Join(n.dir, filepath.FromSlash(rel))
}

// open opens the file p of the node for reading; wait(true) reports how
// the read ended once the reader is drained, wait(false) abandons it.
func (n *node) open(ctx context.Context, p string) (r io.Reader, wait func(drained bool) error, err error) {
	if n.local() {
		f, err := os.Open(n.localPath(p))
		if err != nil {
			return nil, nil, err
		}
		return f, func(bool) error { return f.Close() }, nil
	}
	s, err := n.client.Start(ctx, "cd "+n.shellDir()+" && exec cat -- "+shellQuote(p))
	if err != nil {
		return nil, nil, err
	}
	s.Stdin.Close()
	return s.Stdout, func(drained bool) error {
		if !drained {
			s.Close()
		}
		errText, _ := io.ReadAll(io.LimitReader(s.Stderr, 4096))
		code, err := s.Wait()
		if err == nil && code != 0 {
			err = fmt.Errorf("exit status %d: %s", code, strings.TrimSpace(string(errText)))
		}
		return err
	}, nil
}

// write creates the file p on the node with the content of r, creating its
// directory.
func (n *node) write(ctx context.Context, p string, r io.Reader) error {
	if n.local() {
		lp := n.localPath(p)
		if err := os.MkdirAll(filepath.Dir(lp), 0o777); err != nil {
			return err
		}
		f, err := os.Create(lp)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, r); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	s, err := n.client.Start(ctx, "cd "+n.shellDir()+" && mkdir -p -- "+shellQuote(path.Dir(p))+" && exec cat > "+shellQuote(p))
	if err != nil {
		return err
	}
	go io.Copy(io.Discard, s.Stdout)
	_, cerr := io.Copy(s.Stdin, r)
	s.Stdin.Close()
	errText, _ := io.ReadAll(io.LimitReader(s.Stderr, 4096))
	code, err := s.Wait()
	if err == nil && code != 0 {
		err = fmt.Errorf("exit status %d: %s", code, strings.TrimSpace(string(errText)))
	}
	if err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s on %s: %w", p, n.name, err)
	}
	return nil
}

// removeAll removes p on the node, best effort.
func (n *node) removeAll(ctx context.Context, p string) {
	if n.local() {
		os.RemoveAll(n.localPath(p))
		return
	}
	n.client.Run(ctx, "cd "+n.shellDir()+" && rm -rf -- "+shellQuote(p), io.Discard, io.Discard)
}
