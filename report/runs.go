package report

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gptui/gptui/event"
)

// Run is one run of a picture: the metrics of its ranks, the log
// directories they were read from and the name the legends give it where
// the picture shows several runs.
type Run struct {
	Name  string
	Dirs  []string
	Ranks Runs
}

// LoadRuns reads the metrics files of the log directories dirs as the
// runs they hold, in the order given. A multi-node run has a directory
// on each node, each with the files of its own ranks: a directory whose
// ranks are all new to a run read so far joins the first such run; one
// that holds a rank the runs read so far all have starts another run. So
// `--log-dir a --log-dir b` of two runs of the same ranks gives two runs,
// and the directories of two nodes of one run give one. A directory given
// twice is read once; one without a metrics record is an error wrapping
// ErrNoMetrics.
//
// Each run is named by its folder: the log directory's name (of the
// directory its directories share, for several), with as many of the
// folders above it as tell the runs apart ("a/log" and "b/log").
func LoadRuns(dirs ...string) ([]Run, error) {
	var runs []Run
	var seen []string
	for _, dir := range dirs {
		key := absDir(dir)
		if slices.Contains(seen, key) {
			continue
		}
		seen = append(seen, key)
		ranks, err := loadDir(dir)
		if err != nil {
			return nil, err
		}
		if len(ranks) == 0 {
			return nil, fmt.Errorf("%w in %s (metrics.<rank>.jsonl files: is it the log directory, Engine.log_dir?)", ErrNoMetrics, dir)
		}
		i := slices.IndexFunc(runs, func(r Run) bool {
			for rank := range ranks {
				if _, ok := r.Ranks[rank]; ok {
					return false
				}
			}
			return true
		})
		if i < 0 {
			runs = append(runs, Run{Ranks: Runs{}})
			i = len(runs) - 1
		}
		runs[i].Dirs = append(runs[i].Dirs, dir)
		maps.Copy(runs[i].Ranks, ranks)
	}
	if len(runs) == 0 {
		return nil, fmt.Errorf("%w: no log directory given", ErrNoMetrics)
	}
	nameRuns(runs)
	return runs, nil
}

// loadDir reads the metrics files of the log directory dir: the records
// of each rank that has any.
func loadDir(dir string) (Runs, error) {
	files, err := event.MetricsFiles(dir)
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	runs := Runs{}
	for r, path := range files {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("report: %w", err)
		}
		ms, err := event.ReadMetrics(path, f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("report: %w", err)
		}
		if len(ms) > 0 {
			runs[r] = ms
		}
	}
	return runs, nil
}

// absDir returns the absolute form of dir, or its clean form if it has
// none.
func absDir(dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		return abs
	}
	return filepath.Clean(dir)
}

// nameRuns names each run by the fewest trailing folders of its directory
// (the one its directories share, for several) that tell the runs apart;
// runs still alike after every folder get their number after it.
func nameRuns(runs []Run) {
	paths := make([][]string, len(runs))
	longest := 1
	for i, r := range runs {
		dir := absDir(r.Dirs[0])
		if len(r.Dirs) > 1 {
			dir = sharedDir(r.Dirs)
		}
		for _, p := range strings.Split(filepath.ToSlash(dir), "/") {
			if p != "" {
				paths[i] = append(paths[i], p)
			}
		}
		if len(paths[i]) == 0 {
			paths[i] = []string{"/"}
		}
		longest = max(longest, len(paths[i]))
	}
	names := make([]string, len(runs))
	for n := 1; ; n++ {
		for i, p := range paths {
			names[i] = strings.Join(p[max(len(p)-n, 0):], "/")
		}
		if distinct(names) || n >= longest {
			break
		}
	}
	for i := range runs {
		runs[i].Name = names[i]
		if slices.Index(names, names[i]) != i {
			runs[i].Name += " #" + strconv.Itoa(i+1)
		}
	}
}

// sharedDir returns the deepest directory that holds every one of dirs.
func sharedDir(dirs []string) string {
	d := absDir(dirs[0])
	for _, o := range dirs[1:] {
		o = absDir(o)
		for d != filepath.Dir(d) && o != d && !strings.HasPrefix(o, d+string(filepath.Separator)) {
			d = filepath.Dir(d)
		}
	}
	return d
}

// distinct reports whether no two of names are the same.
func distinct(names []string) bool {
	s := slices.Clone(names)
	slices.Sort(s)
	return len(slices.Compact(s)) == len(names)
}
