package cuda

import (
	"bytes"
	"fmt"
	"testing"
	"unsafe"
)

// lagDevice is a stagingDevice whose stream runs its queued copies only
// when told (run) or when the host waits for an event: a device that lags
// behind the host as far as a test likes. A copy reads its pinned source
// when it runs, as the device's does, so a buffer reused too early gives
// the wrong bytes.
type lagDevice struct {
	pinned  map[unsafe.Pointer][]byte // live pinned buffers
	mem     map[Ptr][]byte            // device memory, by address
	queue   []func()                  // copies and event records not yet run
	events  map[Event]int             // the queue position each event was last recorded at (ran: ≤ done)
	queued  int                       // operations queued so far
	done    int                       // operations run so far
	nextEv  Event
	pinnedN int // pinned buffers allocated so far
}

func newLagDevice() *lagDevice {
	return &lagDevice{pinned: map[unsafe.Pointer][]byte{}, mem: map[Ptr][]byte{}, events: map[Event]int{}}
}

// run runs the queued operations up to position upto.
func (d *lagDevice) run(upto int) {
	for d.done < upto && d.done < d.queued {
		d.queue[d.done]()
		d.done++
	}
}

func (d *lagDevice) AllocHost(n int) (unsafe.Pointer, error) {
	b := make([]byte, n)
	p := unsafe.Pointer(&b[0])
	d.pinned[p] = b
	d.pinnedN++
	return p, nil
}

func (d *lagDevice) FreeHost(p unsafe.Pointer) error {
	if p == nil {
		return nil
	}
	if _, ok := d.pinned[p]; !ok {
		return fmt.Errorf("FreeHost of %p, not pinned", p)
	}
	delete(d.pinned, p)
	return nil
}

func (d *lagDevice) NewMarker() (Event, error) { d.nextEv++; return d.nextEv, nil }
func (d *lagDevice) DestroyEvent(Event) error  { return nil }

func (d *lagDevice) Record(e Event, _ Stream) error {
	d.queue = append(d.queue, func() {})
	d.queued++
	d.events[e] = d.queued
	return nil
}

func (d *lagDevice) Done(e Event) (bool, error) { return d.events[e] <= d.done, nil }

func (d *lagDevice) WaitFor(e Event) error {
	d.run(d.events[e])
	return nil
}

func (d *lagDevice) CopyHtoDAsync(dst Ptr, src unsafe.Pointer, n int, _ Stream) error {
	if _, ok := d.pinned[src]; !ok {
		return fmt.Errorf("an asynchronous copy from %p, which is not pinned", src)
	}
	d.queue = append(d.queue, func() {
		if _, ok := d.pinned[src]; !ok {
			panic("a copy ran from a pinned buffer already freed")
		}
		d.mem[dst] = bytes.Clone(unsafe.Slice((*byte)(src), n))
	})
	d.queued++
	return nil
}

// TestStager: uploads through the pinned buffers land on the device with
// their own bytes however far the device lags, the source reusable at
// once; the host waits only when every buffer is in flight, for the
// oldest; a device that keeps up needs one buffer and no wait; a larger
// upload grows a buffer that is not in flight.
func TestStager(t *testing.T) {
	payload := func(i, n int) []byte {
		b := make([]byte, n)
		for k := range b {
			b[k] = byte(i*31 + k)
		}
		return b
	}
	cases := []struct {
		name       string
		uploads    int
		size       func(i int) int
		keepUp     bool // the device runs each copy before the next upload
		wantWaits  int
		wantPinned int // pinned buffers allocated in all
	}{
		{"device lags", 10, func(int) int { return 1000 }, false, 10 - stagingBuffers, stagingBuffers},
		{"device keeps up", 10, func(int) int { return 1000 }, true, 0, 1},
		{"growing uploads, device keeps up", 5, func(i int) int { return stagingMin << i }, true, 0, 5},
		{"growing uploads, device lags", 6, func(i int) int { return stagingMin << i }, false, 2, 6},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dev := newLagDevice()
			st := &stager{dev: dev}
			src := make([]byte, 0)
			for i := range tc.uploads {
				src = append(src[:0], payload(i, tc.size(i))...)
				if err := st.upload(Ptr(0x1000*(i+1)), unsafe.Pointer(&src[0]), len(src), 0); err != nil {
					t.Fatal(err)
				}
				clear(src) // reused at once
				if tc.keepUp {
					dev.run(dev.queued)
				}
			}
			dev.run(dev.queued)
			for i := range tc.uploads {
				if got := dev.mem[Ptr(0x1000*(i+1))]; !bytes.Equal(got, payload(i, tc.size(i))) {
					t.Errorf("upload %d landed with the wrong bytes (%d of them)", i, len(got))
				}
			}
			if st.waits != tc.wantWaits || dev.pinnedN != tc.wantPinned {
				t.Errorf("%d host waits, %d pinned buffers allocated; want %d, %d", st.waits, dev.pinnedN, tc.wantWaits, tc.wantPinned)
			}
			if len(st.bufs) > stagingBuffers {
				t.Errorf("%d buffers, more than %d", len(st.bufs), stagingBuffers)
			}
			if err := st.close(); err != nil || len(dev.pinned) != 0 {
				t.Errorf("close: %v, %d pinned buffers left", err, len(dev.pinned))
			}
		})
	}
}
