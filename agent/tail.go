package agent

import (
	"bytes"
	"io"
	"os"
	"time"

	"github.com/gptui/gptui/event"
)

// tailEvery is how often a metrics file is read for new lines.
const tailEvery = 200 * time.Millisecond

// tailMetrics reads the JSON lines that a worker appends to the file at
// path, from offset from on, and calls emit with each one, until done is
// closed; it then reads what is left and returns. A file that does not
// exist yet is waited for; one that shrinks below what was read (emptied
// by a new run, or cut back by a resumed one) is read again from the
// start.
// Lines that are not metrics objects are skipped. A path that is not a
// regular file (a device such as /dev/full, which reads as endless zeros)
// is not read.
func tailMetrics(path string, from int64, done <-chan struct{}, emit func(event.Metrics)) {
	var (
		f    *os.File
		off  = from
		part []byte // an unfinished last line
		buf  = make([]byte, 64<<10)
	)
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	read := func() {
		if f == nil {
			var err error
			if f, err = os.Open(path); err != nil {
				f = nil
				return
			}
		}
		fi, err := f.Stat()
		if err == nil && !fi.Mode().IsRegular() {
			return
		}
		if err == nil && fi.Size() < off {
			off, part = 0, nil
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
				if m, ok := event.DecodeMetrics(part[:i]); ok {
					emit(m)
				}
				part = part[i+1:]
			}
			if err == io.EOF || n == 0 || err != nil {
				return
			}
		}
	}
	t := time.NewTicker(tailEvery)
	defer t.Stop()
	for {
		select {
		case <-done:
			read()
			return
		case <-t.C:
			read()
		}
	}
}
