package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gptui/gptui/report"
)

// cmdReport is 'gptui report': a PNG of a run's metrics.
func cmdReport(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("report", stderr)
	var dirs listFlag
	fs.Var(&dirs, "log-dir", "a log `DIR` of the run (Engine.log_dir); repeat it for each node of a multi-node run")
	var logs listFlag
	fs.Var(&logs, "events", "the run's event log `FILE` (JSON lines of events): its restarts, failures, hangs and lost nodes are marked on every panel; repeat it for a log in parts")
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
	case *width < 200 || *height < 150 || *width > 10000 || *height > 10000:
		return usagef("report: --width %d --height %d: want 200–10000 × 150–10000 pixels", *width, *height)
	}
	runs, err := report.Load(dirs...)
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
	if err := report.WriteFile(*out, runs, report.Options{Width: *width, Height: *height, Title: *title, Marks: marks}); err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission) {
			return usageError{err} // -o names no writable directory
		}
		return err
	}
	fmt.Fprintf(stdout, "wrote %s: %d×%d pixels, %d ranks, %d marks\n", *out, *width, *height, len(runs), len(marks))
	return nil
}
