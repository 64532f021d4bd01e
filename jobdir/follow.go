package jobdir

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gptui/gptui/event"
)

// Polling: how often a followed file is read for new lines, and how often
// the supervisor's liveness is checked while its log is quiet.
const (
	followEvery   = 100 * time.Millisecond
	livenessEvery = 500 * time.Millisecond
)

// maxLine bounds one line of the logs a follower keeps; a longer one is
// skipped.
const maxLine = 4 << 20

// Follow sends on the returned channel the events of the job in the folder
// dir: its event log from offset from (0: the start, a replay of the whole
// job) on, and the samples written from now on, as they come. It follows
// until the job has ended — an end event (done, failed, stopped) read last,
// with the supervisor gone — or ctx ends, then closes the channel. A
// supervisor that is gone without having written the end (killed, its
// machine rebooted) ends the stream with a job event failed that says so.
// A line that is not an event is skipped; one of another version ends the
// stream with a job event failed naming both versions.
func Follow(ctx context.Context, dir string, from int64) <-chan event.Event {
	return follow(ctx, dir, from, nil)
}

// follow is Follow; read, if not nil, is kept at the offset in the event
// log just past the last event sent.
func follow(ctx context.Context, dir string, from int64, read *atomic.Int64) <-chan event.Event {
	ch := make(chan event.Event, 1024)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	start := int64(-1) // the samples written from now on
	if fi, err := os.Stat(filepath.Join(dir, SamplesFile)); err == nil {
		start = fi.Size()
	}
	wg.Go(func() {
		tailFile(ctx, filepath.Join(dir, SamplesFile), max(start, 0), func(e event.Event, _ int64) bool {
			select {
			case ch <- e:
				return true
			case <-ctx.Done():
				return false
			}
		}, nil)
	})
	go func() {
		followEvents(ctx, dir, from, ch, read)
		cancel()
		wg.Wait()
		close(ch)
	}()
	return ch
}

// followEvents follows the event log until the job's end (see Follow).
func followEvents(ctx context.Context, dir string, from int64, ch chan<- event.Event, read *atomic.Int64) {
	send := func(e event.Event) bool {
		select {
		case ch <- e:
			return true
		case <-ctx.Done():
			return false
		}
	}
	ended := false     // the last event read ends the job
	var last time.Time // the time of the last event read
	var checked time.Time
	deadOnce := false
	tailFile(ctx, filepath.Join(dir, EventsFile), from, func(e event.Event, end int64) bool {
		ended, last = e.Ends(), e.Time
		if !send(e) {
			return false
		}
		if read != nil {
			read.Store(end)
		}
		return true
	}, func(err error) bool {
		// At the end of what is written: go on while the supervisor runs.
		if err != nil {
			e := event.New(event.KindJob)
			e.State, e.Message = event.JobFailed, err.Error()
			send(e)
			return false
		}
		if time.Since(checked) < livenessEvery {
			return true
		}
		checked = time.Now()
		var s Supervisor
		rerr := readJSON(filepath.Join(dir, SupervisorFile), &s)
		if rerr == nil && s.Alive() {
			deadOnce = false
			return true
		}
		if ended {
			return false
		}
		if !deadOnce {
			// Read once more: it may have written its end as it exited.
			deadOnce = true
			return true
		}
		e := event.New(event.KindJob)
		e.State = event.JobFailed
		if !last.IsZero() {
			e.Time = last // it ended after its last word, not when a view noticed
		}
		switch {
		case errors.Is(rerr, os.ErrNotExist):
			e.Message = "the job has no supervisor (" + SupervisorFile + " is missing)"
		case rerr != nil:
			e.Message = rerr.Error()
		default:
			e.Message = fmt.Sprintf("the job's supervisor (pid %d) is gone without saying how the job ended: it was killed, or the machine restarted", s.PID)
		}
		send(e)
		return false
	})
}

// tailFile reads the events of the file at path from offset off on,
// passing each to emit, with the offset just past its line, until emit
// returns false or ctx ends. At the end
// of what is written it calls idle (nil: go on) with nil, or with the
// error that stops the reading, and stops when idle returns false;
// otherwise it waits followEvery and reads on. A file that shrinks below
// what was read (emptied, as samples.jsonl is when full) is read again
// from its start; one that does not exist yet is waited for.
func tailFile(ctx context.Context, path string, off int64, emit func(event.Event, int64) bool, idle func(error) bool) {
	var (
		f    *os.File
		part []byte
		buf  = make([]byte, 256<<10)
		skip bool // the rest of an over-long line
	)
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	t := time.NewTicker(followEvery)
	defer t.Stop()
	for {
		var ferr error
		if f == nil {
			var err error
			if f, err = os.Open(path); err != nil {
				f = nil
				if !errors.Is(err, os.ErrNotExist) {
					ferr = err
				}
			}
		}
		if f != nil {
			if fi, err := f.Stat(); err == nil && fi.Size() < off {
				off, part, skip = 0, nil, false
			}
			for {
				n, err := f.ReadAt(buf, off)
				off += int64(n)
				part = append(part, buf[:n]...)
				for {
					i := bytes.IndexByte(part, '\n')
					if i < 0 {
						break
					}
					line := part[:i]
					part = part[i+1:]
					if skip {
						skip = false
						continue
					}
					e, derr := event.Decode(line)
					var ve *event.VersionError
					switch {
					case errors.As(derr, &ve):
						ferr = fmt.Errorf("%s holds events of format v%d, this gptui reads v%d: open it with the gptui that wrote it", path, ve.Got, event.Version)
					case derr != nil:
						continue
					default:
						if !emit(e, off-int64(len(part))) {
							return
						}
					}
					if ferr != nil {
						break
					}
				}
				if len(part) > maxLine {
					part, skip = nil, true
				}
				if ferr != nil || n == 0 || err == io.EOF {
					break
				}
				if err != nil {
					ferr = err
					break
				}
			}
		}
		if idle != nil && !idle(ferr) || ferr != nil && idle == nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
