package cluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/units"
)

// Data staging. A data path of the config (a dataset's folder, the
// tokenizer, the model init_from names) that an SSH node lacks is copied
// there from this machine when this machine has it: every file of it,
// through Push — SHA-256 verified on the node, written to a temporary
// name and renamed, a file already there with the same content skipped;
// a file of 1 MiB or more relayed from a node that staged it before
// (distribute.go), verified and renamed in the same way —
// so a staging cut off (an interrupt, a lost connection) resumes at the
// next launch where it stopped, file by file. A relative path is taken
// from the node's workdir there and from the current directory here, as
// the config's other paths are. Options.NoStaging turns it off: a missing
// path then refuses the job, as it always does when this machine lacks
// it too.

// stagedFile is one file of a data path to copy: local, this machine's;
// remote, the node's (slash-separated, as Push takes it).
type stagedFile struct {
	local, remote string
	bytes         int64
}

// stageFiles lists the files of the data path p as this machine has them
// and where they go on node n; ok is false when this machine has no p.
func stageFiles(n *node, p string) (files []stagedFile, ok bool, err error) {
	remoteOf := func(rel string) string {
		r := filepath.ToSlash(rel)
		if path.IsAbs(r) {
			return r
		}
		return path.Join(n.dir, r)
	}
	fi, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	case fi.Mode().IsRegular():
		return []stagedFile{{p, remoteOf(p), fi.Size()}}, true, nil
	case !fi.IsDir():
		return nil, false, fmt.Errorf("%s is neither a file nor a folder", p)
	}
	err = filepath.WalkDir(p, func(f string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil // a socket or device file is no data
		}
		files = append(files, stagedFile{f, remoteOf(f), info.Size()})
		return nil
	})
	return files, true, err
}

// stageData copies to the SSH node n those of the data paths missing
// there that this machine has (see the comment at the top of this file),
// saying so in node events, and returns those it could not: this machine
// lacks them too. A dry run copies nothing and says what it would.
func (j *Job) stageData(ctx context.Context, n *node, missing []string) (left []string, err error) {
	for _, p := range missing {
		files, ok, err := stageFiles(n, p)
		if err != nil {
			return nil, fmt.Errorf("node %s: staging %s: %w", n.name, p, err)
		}
		if !ok {
			left = append(left, p)
			continue
		}
		var total int64
		for _, f := range files {
			total += f.bytes
		}
		what := fmt.Sprintf("%s: %d %s, %s", p, len(files), units.Plural(len(files), "file"), units.Bytes(total))
		if j.opts.DryRun {
			j.nodeEvent(n.name, event.NodePushing, "would stage "+what+" from this machine (it has none)")
			continue
		}
		j.nodeEvent(n.name, event.NodePushing, "staging "+what+" from this machine (it has none)")
		start := time.Now()
		var sent int64
		skipped := 0
		for i, f := range files {
			ps, notes, err := j.dist.push(ctx, n, f.local, f.remote, 0o644, "")
			if err != nil {
				return nil, fmt.Errorf("node %s: staging %s: %w", n.name, p, err)
			}
			ps.Bytes = f.bytes
			if ps.Skipped {
				skipped++
			} else {
				sent += f.bytes
			}
			j.nodeEvent(n.name, event.NodePushing, fmt.Sprintf("staging %s (%d/%d): %s", p, i+1, len(files), ps)+relayNotes(notes))
		}
		msg := fmt.Sprintf("staged %s in %v: %s sent", what, time.Since(start).Round(time.Millisecond), units.Bytes(sent))
		if skipped > 0 {
			msg += fmt.Sprintf(", %d %s already there", skipped, units.Plural(skipped, "file"))
		}
		j.nodeEvent(n.name, event.NodePushing, msg)
	}
	return left, nil
}

// missingData is the refusal of a job whose node n lacks the data paths
// left, with how to fix it.
func (j *Job) missingData(n *node, line int, left []string) error {
	o := j.opts
	how := "this machine has none to copy there either; copy them to the node, or put them on a filesystem every node shares"
	if o.NoStaging {
		how = "copy them to the node, or leave out --stage-data=never to have them copied from this machine"
	}
	return inputErrorf("%s:%d: node %s has no %s (a relative path is taken from the workdir %s there, from the current directory here); %s",
		o.Hosts, line, n.name, strings.Join(left, ", "), n.inv.Workdir, how)
}
