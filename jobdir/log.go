package jobdir

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gptui/gptui/event"
)

// SamplesCap is the size at which samples.jsonl is emptied and written
// again from its start: samples matter as they come, and a view that
// attaches reads them from then on. At about 350 bytes a sample, 4 MiB
// is a few minutes of a 64-rank job.
const SamplesCap = 4 << 20

// SummaryEvery is how often a job's summary is rewritten for its metrics
// alone; a change of state is written at once.
const SummaryEvery = 2 * time.Second

// Sample reports whether events of kind are samples: the figures sent
// every second of which only the newest matter (memory, health,
// progress). They go to samples.jsonl, everything else to the event log.
func Sample(kind string) bool {
	return kind == event.KindMemory || kind == event.KindHealth || kind == event.KindProgress || kind == event.KindHeartbeat
}

// Log writes a job's events into its folder: samples to samples.jsonl,
// every other event to the append-only events.jsonl, and the summary they
// make to summary.json. It is safe for concurrent use.
type Log struct {
	dir string

	mu        sync.Mutex
	events    *os.File
	samples   *os.File
	ew        *event.Writer
	sampleBuf []byte
	sampleN   int64 // bytes in samples.jsonl
	sum       Summary
	sumAt     time.Time // when summary.json was last written
	err       error
}

// OpenLog opens the event log of the job in the folder dir for appending
// (a restarted job's log goes on after its earlier supervisor's), with
// sum as the summary so far.
func OpenLog(dir string, sum Summary) (*Log, error) {
	ef, err := os.OpenFile(filepath.Join(dir, EventsFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("jobdir: %w", err)
	}
	sf, err := os.OpenFile(filepath.Join(dir, SamplesFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND|os.O_TRUNC, 0o600)
	if err != nil {
		ef.Close()
		return nil, fmt.Errorf("jobdir: %w", err)
	}
	l := &Log{dir: dir, events: ef, samples: sf, ew: event.NewWriter(ef), sum: sum}
	if err := l.writeSummary(); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// Write writes e where it belongs and folds it into the summary. After
// the first error every Write returns it.
func (l *Log) Write(e event.Event) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	if Sample(e.Kind) {
		l.err = l.writeSample(e)
		return l.err
	}
	if err := l.ew.Write(e); err != nil {
		l.err = fmt.Errorf("jobdir: the event log: %w", err)
		return l.err
	}
	first := !l.sum.Logged() // an attempt's first metrics are news
	l.sum.Add(e)
	if e.Kind != event.KindMetrics && e.Kind != event.KindLog || first || time.Since(l.sumAt) >= SummaryEvery {
		l.err = l.writeSummary()
	}
	return l.err
}

// writeSample appends a sample, emptying the file first when it is full.
func (l *Log) writeSample(e event.Event) error {
	e.V = event.Version
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("jobdir: %w", err)
	}
	if l.sampleN+int64(len(b))+1 > SamplesCap {
		if err := l.samples.Truncate(0); err != nil {
			return fmt.Errorf("jobdir: the samples: %w", err)
		}
		l.sampleN = 0
	}
	l.sampleBuf = append(append(l.sampleBuf[:0], b...), '\n')
	n, err := l.samples.Write(l.sampleBuf)
	l.sampleN += int64(n)
	if err != nil {
		return fmt.Errorf("jobdir: the samples: %w", err)
	}
	return nil
}

// Summary returns the summary so far.
func (l *Log) Summary() Summary {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sum
}

func (l *Log) writeSummary() error {
	l.sumAt = time.Now()
	return writeJSON(filepath.Join(l.dir, SummaryFile), l.sum)
}

// Close writes the summary and closes the files.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	err := l.writeSummary()
	l.samples.Close()
	if cerr := l.events.Close(); err == nil {
		err = cerr
	}
	if l.err == nil {
		l.err = fmt.Errorf("jobdir: the log is closed")
	}
	return err
}
