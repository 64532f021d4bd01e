package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gptui/gptui/report"
)

// cmdReport is 'gptui report': a PNG of the metrics of a run, or of several.
func cmdReport(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("report", stderr)
	var dirs listFlag
	fs.Var(&dirs, "log-dir", "a log `DIR` of the run (Engine.log_dir); repeat it for each node of a multi-node run, and for other runs to compare (a directory of ranks already read is another run, named by its folder)")
	var logs listFlag
	fs.Var(&logs, "events", "the run's event log `FILE` (JSON lines of events): its stops, failures, hangs, lost nodes, restarts, drops and re-plans are marked on every panel; repeat it for a log in parts")
	out := fs.String("o", "report.png", "the PNG `FILE` to write")
	title := fs.String("title", "", "a title above the panels (default: the log directories)")
	width := fs.Int("width", 1200, "the picture's width in `PIXELS`")
	height := fs.Int("height", 900, "the picture's height in `PIXELS`")
	if err := parse(fs, args); err != nil {
		return err
	}
	switch {
	case len(dirs) == 0:
		return usagef("report: no --log-dir DIR given")
	case *width < 640 || *height < 480 || *width > 10000 || *height > 10000:
		// Six panels, their legends and the marks' legend need 640×480.
		return usagef("report: --width %d --height %d: want 640–10000 × 480–10000 pixels", *width, *height)
	}
	runs, err := report.LoadRuns(dirs...)
	if err != nil {
		return usageError{err}
	}
	var marks []report.Mark
	for _, path := range logs {
		ms, err := report.LoadMarks(path)
		if err != nil {
			return usageError{err}
		}
		marks = append(marks, ms...)
	}
	if *title == "" {
		*title = "gptui report " + strings.Join(dirs, " ")
	}
	if err := report.WriteRunsFile(*out, runs, report.Options{Width: *width, Height: *height, Title: *title, Marks: marks}); err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission) {
			return usageError{err} // -o names no writable directory
		}
		return err
	}
	what := fmt.Sprintf("%d ranks", len(runs[0].Ranks))
	if len(runs) > 1 {
		var each []string
		for _, r := range runs {
			each = append(each, fmt.Sprintf("%s (%d ranks)", r.Name, len(r.Ranks)))
		}
		what = fmt.Sprintf("%d runs: %s", len(runs), strings.Join(each, ", "))
	}
	fmt.Fprintf(stdout, "wrote %s: %d×%d pixels, %s, %d marks\n", *out, *width, *height, what, len(marks))
	return nil
}
