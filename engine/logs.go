package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/units"
)

// LogWriteError is a failed write to a log file (workerlog.<rank> or
// metrics.<rank>.jsonl). Training goes on without the file; Run returns
// this error at the end, with its result.
type LogWriteError struct {
	File string
	Err  error // the first write's error
	Lost int   // the writes dropped, the first included
}

func (e *LogWriteError) Error() string {
	return fmt.Sprintf("log file %s: %v (%d %s lost)", e.File, e.Err, e.Lost, units.Plural(e.Lost, "write"))
}

func (e *LogWriteError) Unwrap() error { return e.Err }

// logFile is an open log file. A failed write is reported once on the
// run's stderr; later writes are dropped and counted, and the writer keeps
// saying it succeeded, so that the lines still reach stdout and training
// goes on.
type logFile struct {
	f      *os.File
	stderr io.Writer
	fence  func() error   // asked before each write (Options.Fence); nil: none
	err    *LogWriteError // the first loss, with the count of them all
	broken bool           // a write failed: later ones are dropped
}

func (l *logFile) Write(p []byte) (int, error) {
	if l.broken {
		l.err.Lost++
		return len(p), nil
	}
	if l.fence != nil {
		if err := l.fence(); err != nil {
			l.broken = true
			l.lose(err, "nothing more is written to it")
			return len(p), nil
		}
	}
	if _, err := l.f.Write(p); err != nil {
		l.broken = true
		l.lose(err, "training goes on without it")
	}
	return len(p), nil
}

// lose counts a write that was lost, and reports the first on stderr with
// what happens next.
func (l *logFile) lose(err error, next string) {
	if l.err != nil {
		l.err.Lost++
		return
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err // the file is named already
	}
	l.err = &LogWriteError{File: l.f.Name(), Err: err, Lost: 1}
	fmt.Fprintf(l.stderr, "gptui: log file %s: %v; %s, and gptui will exit with status 1\n", l.f.Name(), err, next)
}

// openLog opens a log file of the run: anew, or, resuming at step start > 0,
// keeping what keep says of its contents.
func openLog(name string, start int, keep func(b []byte, start int) []byte, stderr io.Writer) (*logFile, error) {
	flag := os.O_RDWR | os.O_CREATE
	if start == 0 {
		flag |= os.O_TRUNC
	}
	f, err := os.OpenFile(name, flag, 0o644)
	if err != nil {
		return nil, logOpenError(err)
	}
	if start > 0 {
		if err := resumeLog(f, start, keep); err != nil {
			f.Close()
			return nil, logOpenError(err)
		}
	}
	return &logFile{f: f, stderr: stderr}, nil
}

// runLog is where a run's record goes: its log lines to stdout and
// workerlog.<rank>, its metrics to metrics.<rank>.jsonl, both in log_dir.
type runLog struct {
	out     io.Writer // stdout and the worker log
	metrics *logFile
	files   []*logFile // the worker log and the metrics file
}

// openRunLog opens rank's files in dir: anew for a fresh run; for one that
// resumes at step start, the metrics file keeps its records of the steps
// before it, so that it reads as one run, and the worker log keeps all it
// holds — the lines of the attempt that stopped after its checkpoint too,
// its last words among them — and goes on after them (the [resume] line
// says where). Lines also go to stdout; a file's first lost write is
// reported on stderr. fence, if not nil, is asked before every write.
func openRunLog(dir string, rank, start int, stdout, stderr io.Writer, fence func() error) (*runLog, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, logOpenError(err)
	}
	wl, err := openLog(filepath.Join(dir, fmt.Sprintf("workerlog.%d", rank)), start, keepAll, stderr)
	if err != nil {
		return nil, err
	}
	mf, err := openLog(event.MetricsFile(dir, rank), start, keepMetrics, stderr)
	if err != nil {
		wl.f.Close()
		return nil, err
	}
	wl.fence, mf.fence = fence, fence
	return &runLog{out: io.MultiWriter(stdout, wl), metrics: mf, files: []*logFile{wl, mf}}, nil
}

// logf writes one line to stdout and the worker log.
func (l *runLog) logf(format string, args ...any) {
	fmt.Fprintf(l.out, format+"\n", args...)
}

// writeMetrics appends one record to the metrics file.
func (l *runLog) writeMetrics(m Metrics) {
	b, err := m.AppendLine(nil)
	if err != nil {
		l.metrics.lose(fmt.Errorf("step %d's record: %w", m.Step, err), "the record is left out")
		return
	}
	l.metrics.Write(b)
}

// Close closes the files and returns the first error of closing one.
func (l *runLog) Close() error {
	var first error
	for _, f := range l.files {
		if err := f.f.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// lost joins the write errors of the files (*LogWriteError each).
func (l *runLog) lost() error {
	var errs []error
	for _, f := range l.files {
		if f.err != nil {
			errs = append(errs, f.err)
		}
	}
	return errors.Join(errs...)
}

// resumeLog cuts f to what keep leaves of it and moves to its end.
func resumeLog(f *os.File, start int, keep func([]byte, int) []byte) error {
	b, err := io.ReadAll(f)
	if err != nil {
		return err
	}
	k := keep(b, start)
	if len(k) == len(b) {
		return nil // at the end already
	}
	if err := f.Truncate(int64(len(k))); err != nil {
		return err
	}
	if !bytes.HasPrefix(b, k) {
		if _, err := f.WriteAt(k, 0); err != nil {
			return err
		}
	}
	_, err = f.Seek(int64(len(k)), io.SeekStart)
	return err
}

// logOpenError makes a log file that cannot be opened for a reason of the
// user's path (permissions, a file where a directory should be, a read-only
// file system) a ConfigError naming Engine.log_dir.
func logOpenError(err error) error {
	if errors.Is(err, fs.ErrPermission) || errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrExist) ||
		errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.EISDIR) || errors.Is(err, syscall.EROFS) {
		return &ConfigError{Err: err, Msg: fmt.Sprintf("Engine.log_dir: %v; set Engine.log_dir to a directory gptui can write", err)}
	}
	return fmt.Errorf("Engine.log_dir: %w", err)
}

// keepAll keeps a log file whole.
func keepAll(b []byte, _ int) []byte { return b }

// keepMetrics keeps the records of metrics.<rank>.jsonl before step start,
// so that a resumed run's file reads as one run. Lines that are not
// records (a write torn by a crash) go too.
func keepMetrics(b []byte, start int) []byte {
	var out []byte
	for line := range bytes.Lines(b) {
		var m struct {
			Step *int `json:"step"`
		}
		if !bytes.HasSuffix(line, []byte("\n")) || json.Unmarshal(line, &m) != nil || m.Step == nil || *m.Step >= start {
			continue
		}
		out = append(out, line...)
	}
	return out
}
