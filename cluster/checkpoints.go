package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/sshexec"
)

// syncCheckpoints makes every node hold the checkpoint a resuming job
// (Engine.save_load.ckpt_dir: auto) starts from, before any worker starts,
// and returns its directory, which every rank then loads, and its step
// ("" and 0 when no node holds a checkpoint: every rank starts at step 0).
// A job that does not resume is left alone.
//
// It asks each node for its newest checkpoint that loads (every file
// verified) and for the step, manifest hash and run of every checkpoint
// directory it holds. The checkpoints of this run are those of the run of
// the newest of all; where the newest's node holds a step, only that very
// checkpoint (see ofRun). A node whose newest checkpoint is of another
// run is refused, before anything starts, with an *InputError naming the
// nodes and steps.
//
// The job resumes from the newest step of this run that is verified on
// every node or can be copied to it: the nodes whose copy of the step
// loads are its sources (a node that holds the step but did not report it
// as its newest verifies it first), and every other node gets a copy from
// one of them, streamed through the launcher, which replaces a damaged or
// incomplete directory of the step there (checkpoint.Install). If a node
// cannot take the step (its disk is full, say), the next older step of
// this run is tried.
func (j *Job) syncCheckpoints(ctx context.Context, nodes []*node) (dir string, step int, err error) {
	sl := j.opts.Config.Engine.SaveLoad
	if sl.CkptDir != "auto" {
		return "", 0, nil
	}
	sums, err := j.summaries(ctx, nodes, sl.OutputDir)
	if err != nil {
		return "", 0, err
	}
	src := newestOf(sums)
	if src < 0 {
		return "", 0, nil // nothing to resume from anywhere: every rank starts at step 0
	}
	if err := agreeCheckpoints(nodes, sums, src, sl.OutputDir); err != nil {
		return "", 0, err
	}
	cands := resumeCandidates(sums, src)
	var last error
	for k, c := range cands {
		failed, err := j.complete(ctx, nodes, sums, c, sl.OutputDir, sl.KeepLast, -1)
		if err == nil {
			return path.Join(sl.OutputDir, checkpoint.DirName(c.step)), c.step, nil
		}
		if ctx.Err() != nil {
			return "", 0, err
		}
		last = err
		next := "no older checkpoint of this run to try"
		if k+1 < len(cands) {
			next = fmt.Sprintf("trying step %d", cands[k+1].step)
		}
		for _, i := range failed {
			j.nodeEvent(nodes[i].name, event.NodePushing, fmt.Sprintf("step %d cannot be completed on every node; %s", c.step, next))
		}
	}
	return "", 0, fmt.Errorf("resume: no checkpoint of this run in %s can be held by every node: %w", sl.OutputDir, last)
}

// collectNewest gives the first node (rank 0's) the whole of the job's
// newest checkpoint, which each node keeps only its ranks' part of: a job
// that finished or stopped leaves a whole checkpoint on one machine, for
// an export, a generate or a resume there. The copies are events like a
// resume's; an error is reported, not the job's.
func (j *Job) collectNewest(ctx context.Context) error {
	sl := j.opts.Config.Engine.SaveLoad
	sums, err := j.summaries(ctx, j.nodes, sl.OutputDir)
	if err != nil {
		return err
	}
	src := newestOf(sums)
	if src < 0 || sums[0].Verified(sums[src]) {
		return nil
	}
	_, err = j.complete(ctx, j.nodes, sums, candidate{sums[src].Step, sums[src].Manifest}, sl.OutputDir, sl.KeepLast, 0)
	return err
}

// summaries asks every node for the checkpoint.Summary of outputDir.
func (j *Job) summaries(ctx context.Context, nodes []*node, outputDir string) ([]checkpoint.Summary, error) {
	sums := make([]checkpoint.Summary, len(nodes))
	errs := sshexec.ForEach(ctx, len(nodes), j.opts.Parallel, func(ctx context.Context, i int) error {
		var err error
		sums[i], err = summary(ctx, nodes[i], outputDir, -1, j.opts.Config.Engine.SaveLoad.Run)
		return err
	})
	return sums, errorsFirst(errs)
}

// summary asks node n for the checkpoint.DescribeRun of outputDir: of its
// newest checkpoint that loads, or with step >= 0 of that step's; with
// run set, of that training run's checkpoints alone (a restart's).
func summary(ctx context.Context, n *node, outputDir string, step int, run string) (checkpoint.Summary, error) {
	args := []string{"agent", "--checkpoint-summary", outputDir}
	if step >= 0 {
		args = append(args, "--step", strconv.Itoa(step))
	}
	if run != "" {
		args = append(args, "--run", run)
	}
	var s checkpoint.Summary
	out, err := n.gptui(ctx, args...)
	if err == nil {
		err = json.Unmarshal(out, &s)
	}
	if err == nil {
		// The names become paths on the nodes: trust none of them.
		err = s.Check()
	}
	if err == nil && step >= 0 && s.Step >= 0 && s.Step != step {
		err = fmt.Errorf("asked for step %d, answered step %d", step, s.Step)
	}
	if err != nil {
		return s, fmt.Errorf("node %s: listing the checkpoints of %s: %w", n.name, outputDir, err)
	}
	return s, nil
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

// ofRun reports whether the checkpoint of step with manifest manifest,
// written by run, is one of the run of newest, the newest checkpoint of
// all nodes: where newest's node holds a checkpoint of that step, it is
// that very checkpoint (the same manifest); where it holds none (keep_last
// removed it, or the node never had it), it was written by newest's run.
// A checkpoint without a run (older ones, imports) is of the run only
// where newest's node holds it.
func ofRun(newest checkpoint.Summary, step int, manifest, run string) bool {
	if r, ok := newest.History[step]; ok {
		return r.Manifest == manifest
	}
	return newest.Run != "" && run == newest.Run
}

// agreeCheckpoints returns an *InputError if a node's newest checkpoint
// is not one of the run of sums[src], the newest of all (ofRun).
func agreeCheckpoints(nodes []*node, sums []checkpoint.Summary, src int, outputDir string) error {
	var parts []string // "node1 would start from step 20"
	differ := false
	newest := sums[src]
	for i, s := range sums {
		if s.Step < 0 {
			continue
		}
		what := "step " + strconv.Itoa(s.Step)
		if !ofRun(newest, s.Step, s.Manifest, s.Run) {
			differ = true
			switch _, ok := newest.History[s.Step]; {
			case ok:
				what += " (another checkpoint: manifest " + s.Manifest[:min(12, len(s.Manifest))] + ")"
			case newest.Run != "" && s.Run != "":
				what += " (not of this run: written by run " + s.Run[:min(12, len(s.Run))] + ", step " + strconv.Itoa(newest.Step) + " by run " + newest.Run[:min(12, len(newest.Run))] + ")"
			default:
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

// A candidate is a checkpoint a resume may start from: a step, and the
// manifest of its copies.
type candidate struct {
	step     int
	manifest string
}

// resumeCandidates returns the checkpoints of the run of sums[src] (the
// newest of all; ofRun) that any node reports, newest first: each node's
// newest that loads, then the others of every node's history (whether
// they load is asked when they are tried).
func resumeCandidates(sums []checkpoint.Summary, src int) []candidate {
	seen := map[candidate]bool{}
	var cs []candidate
	add := func(c candidate, run string) {
		if !seen[c] && ofRun(sums[src], c.step, c.manifest, run) {
			seen[c] = true
			cs = append(cs, c)
		}
	}
	for _, s := range sums {
		if s.Step >= 0 {
			add(candidate{s.Step, s.Manifest}, s.Run)
		}
	}
	for _, s := range sums {
		for _, step := range slices.Sorted(maps.Keys(s.History)) {
			add(candidate{step, s.History[step].Manifest}, s.History[step].Run)
		}
	}
	slices.SortStableFunc(cs, func(a, b candidate) int { return cmp.Compare(b.step, a.step) })
	return cs
}

// complete makes every node hold the whole of checkpoint c verified. A
// checkpoint whose ranks were on several machines is kept as parts, each
// node's directory holding the manifest and its own ranks' files (and its
// buddies', with replicas); a node may also hold a file damaged. complete
// asks each node what it holds of c (a node whose newest it is not, but
// whose history lists it, is asked for that step), finds a verified
// holder of every data file, and gives each node the files it lacks,
// each from one of their holders, trying each in turn. It returns the
// nodes that could not be given c, and the first of their errors.
//
// With only >= 0, only that node is given what it lacks.
func (j *Job) complete(ctx context.Context, nodes []*node, sums []checkpoint.Summary, c candidate, outputDir string, keepLast, only int) ([]int, error) {
	run := j.opts.Config.Engine.SaveLoad.Run
	have := make([]*checkpoint.Summary, len(nodes)) // what the node holds of c
	sshexec.ForEach(ctx, len(nodes), j.opts.Parallel, func(ctx context.Context, i int) error {
		s := sums[i]
		if s.Step == c.step && s.Manifest == c.manifest {
			have[i] = &sums[i]
			return nil
		}
		if r, ok := s.History[c.step]; !ok || r.Manifest != c.manifest {
			return nil
		}
		// Listed, but not the node's newest: what of it does it hold?
		if v, err := summary(ctx, nodes[i], outputDir, c.step, run); err == nil && v.Step == c.step && v.Manifest == c.manifest {
			have[i] = &v
		}
		return nil
	})
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// Every data file of c and the nodes that hold it verified.
	holders := map[string][]int{}
	for i, h := range have {
		if h == nil {
			continue
		}
		for _, f := range h.Files[1:] {
			holders[f] = append(holders[f], i)
		}
		for _, f := range h.Missing {
			holders[f] = append(holders[f], []int(nil)...)
		}
	}
	var unheld []string
	for _, f := range slices.Sorted(maps.Keys(holders)) {
		if len(holders[f]) == 0 {
			unheld = append(unheld, f)
		}
	}
	if len(holders) == 0 || len(unheld) > 0 {
		// Listed (by the nodes returned) but held whole nowhere.
		var listed []int
		for i, s := range sums {
			if r, ok := s.History[c.step]; ok && r.Manifest == c.manifest {
				listed = append(listed, i)
				j.nodeEvent(nodes[i].name, event.NodePushing, fmt.Sprintf("checkpoint %s/%s: no node holds %s verified", outputDir, checkpoint.DirName(c.step), strings.Join(unheld, ", ")))
			}
		}
		if len(unheld) == 0 {
			return listed, fmt.Errorf("step %d: no node has a copy that loads", c.step)
		}
		return listed, fmt.Errorf("step %d: no node holds %s verified", c.step, strings.Join(unheld, ", "))
	}
	errs := sshexec.ForEach(ctx, len(nodes), j.opts.Parallel, func(ctx context.Context, i int) error {
		if only >= 0 && i != only {
			return nil
		}
		var need []string
		for _, f := range slices.Sorted(maps.Keys(holders)) {
			if have[i] == nil || !have[i].Holds(f) {
				need = append(need, f)
			}
		}
		if len(need) == 0 {
			return nil
		}
		// Each file from one of its holders: the first after this node
		// that holds it, then the others in turn.
		var err error
		for k := 1; k <= len(nodes) && len(need) > 0; k++ {
			from := (i + k) % len(nodes)
			if have[from] == nil || from == i {
				continue
			}
			var files []string
			for _, f := range need {
				if have[from].Holds(f) {
					files = append(files, f)
				}
			}
			if len(files) == 0 {
				continue
			}
			s := *have[from]
			what := fmt.Sprintf("copying checkpoint %s/%s from %s", outputDir, s.Name, nodes[from].name)
			if len(files) < len(s.Files)-1 || have[i] != nil {
				what = fmt.Sprintf("copying %s of checkpoint %s/%s from %s", strings.Join(files, ", "), outputDir, s.Name, nodes[from].name)
			}
			j.nodeEvent(nodes[i].name, event.NodePushing, what)
			if err = copyCheckpoint(ctx, nodes[from], nodes[i], outputDir, s, files, keepLast); err != nil {
				err = fmt.Errorf("%s to %s: %w", what, nodes[i].name, err)
				j.nodeEvent(nodes[i].name, event.NodePushing, err.Error())
				continue
			}
			need = slices.DeleteFunc(need, func(f string) bool { return slices.Contains(files, f) })
			ck := &event.Checkpoint{Step: c.step, Dir: path.Join(outputDir, s.Name), From: nodes[from].name, Run: s.Run}
			j.checkpointEvent(nodes[i].name, event.CheckpointCopied, ck, fmt.Sprintf("copied checkpoint %s from %s", ck.Dir, ck.From))
		}
		if len(need) > 0 && err == nil {
			err = fmt.Errorf("step %d: %s not copied to %s", c.step, strings.Join(need, ", "), nodes[i].name)
		}
		if len(need) == 0 {
			return nil
		}
		return err
	})
	var failed []int
	for i, err := range errs {
		if err != nil {
			failed = append(failed, i)
		}
	}
	return failed, errorsFirst(errs)
}

// copyCheckpoint copies the data files files (nil: all that s holds) of
// the checkpoint s of outputDir, and its manifest, from node src to node
// dst: each file is streamed through the launcher into a temporary
// directory on dst, which `gptui agent --checkpoint-install` then
// verifies against the manifest's hashes and installs: renamed into
// place, or its files merged into dst's part of the same checkpoint. An
// interrupted copy leaves only a temporary directory, which
// checkpoint.Latest ignores and the next save removes.
func copyCheckpoint(ctx context.Context, src, dst *node, outputDir string, s checkpoint.Summary, files []string, keepLast int) error {
	if files == nil {
		files = s.Files[1:]
	}
	tmp := path.Join(outputDir, checkpoint.TempCopyName(s.Name))
	for _, f := range append([]string{checkpoint.ManifestFile}, files...) {
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
