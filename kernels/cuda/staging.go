package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"
)

// Uploads without a host wait. The engine's uploads (a micro-batch's
// tokens and targets, a pipeline stage's restores) copy host memory the
// caller may reuse as soon as Upload returns, and must land after the
// kernels queued before them. A synchronous cuMemcpyHtoD does both by
// waiting, on the host, for the device to reach it — for the compute
// stream and for anything the legacy stream waits on, such as NCCL's
// sends and receives that wait on neighbouring stages. Instead, Upload
// copies the source into a pinned host buffer of the stager's and queues
// the copy to the device on the compute stream (cuMemcpyHtoDAsync), with
// an event after it; the buffer is free again once the event has passed.
// The host waits only when every buffer is in flight, and then for the
// oldest upload's copy alone.

// stagingAPI is the part of libcuda.so.1 this file binds (driverAPI embeds
// it); each binding's C declaration (cuda.h) is beside it.
type stagingAPI struct {
	// CUresult cuMemAllocHost_v2(void **pp, size_t bytesize);
	memAllocHost func(p *unsafe.Pointer, n uint64) int32
	// CUresult cuMemFreeHost(void *p);
	memFreeHost func(p unsafe.Pointer) int32
	// CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream);
	memcpyHtoDAsync func(dst uint64, src unsafe.Pointer, n uint64, s uintptr) int32
}

// bind binds the functions from the loaded driver.
func (a *stagingAPI) bind(h *handle) error {
	for _, b := range []struct {
		fn    any
		names []string
	}{
		{&a.memAllocHost, []string{"cuMemAllocHost_v2", "cuMemAllocHost"}},
		{&a.memFreeHost, []string{"cuMemFreeHost"}},
		{&a.memcpyHtoDAsync, []string{"cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync"}},
	} {
		if err := h.sym(b.fn, b.names...); err != nil {
			return err
		}
	}
	return nil
}

// AllocHost returns bytes of page-locked host memory (cuMemAllocHost_v2),
// which the device reads directly, so that a copy from it is
// asynchronous. Give it back with FreeHost.
func (d *Device) AllocHost(bytes int) (unsafe.Pointer, error) {
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return nil, err
	}
	var p unsafe.Pointer
	if err := d.api.check("cuMemAllocHost_v2", d.api.memAllocHost(&p, uint64(bytes))); err != nil {
		return nil, d.wrap(fmt.Sprintf("allocating %d bytes of pinned host memory", bytes), err)
	}
	return p, nil
}

// FreeHost gives back memory from AllocHost (cuMemFreeHost).
func (d *Device) FreeHost(p unsafe.Pointer) error {
	if p == nil {
		return nil
	}
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return err
	}
	return d.wrap("free pinned host memory", d.api.check("cuMemFreeHost", d.api.memFreeHost(p)))
}

// CopyHtoDAsync queues a copy of bytes from pinned host memory at src
// (AllocHost) to the device on stream s (cuMemcpyHtoDAsync_v2); src must
// stay as it is until the copy has run.
func (d *Device) CopyHtoDAsync(dst Ptr, src unsafe.Pointer, bytes int, s Stream) error {
	if bytes == 0 {
		return nil
	}
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return err
	}
	return d.wrap(fmt.Sprintf("queueing a copy of %d bytes to the device", bytes),
		d.api.check("cuMemcpyHtoDAsync_v2", d.api.memcpyHtoDAsync(uint64(dst), src, uint64(bytes), uintptr(s))))
}

// WaitFor waits, on the host, until the work queued before e's last
// Record has finished (cuEventSynchronize).
func (d *Device) WaitFor(e Event) error {
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return err
	}
	return d.wrap("event sync", d.api.check("cuEventSynchronize", d.api.eventSynchronize(uintptr(e))))
}

// stagingDevice is what a stager needs of a device: *Device, or a test's
// double.
type stagingDevice interface {
	AllocHost(bytes int) (unsafe.Pointer, error)
	FreeHost(p unsafe.Pointer) error
	NewMarker() (Event, error)
	DestroyEvent(e Event) error
	Record(e Event, s Stream) error
	Done(e Event) (bool, error)
	WaitFor(e Event) error
	CopyHtoDAsync(dst Ptr, src unsafe.Pointer, bytes int, s Stream) error
}

// Sizes of the stager's buffers.
const (
	stagingBuffers = 4        // at most this many uploads in flight
	stagingMin     = 64 << 10 // the smallest buffer
)

// stager is the ring of pinned buffers Upload copies through (see the
// comment at the top of this file).
type stager struct {
	dev  stagingDevice
	bufs []*stagingBuf
	seq  uint64 // uploads queued so far
	// waits counts the uploads that waited on the host for an earlier
	// one's copy, for the tests.
	waits int
}

// stagingBuf is one pinned buffer and the event after its last copy.
type stagingBuf struct {
	p    unsafe.Pointer
	n    int
	ev   Event
	busy bool   // its last copy may not have run yet
	seq  uint64 // the upload that used it last
}

// upload queues a copy of the n bytes at src to dst on stream s; src may
// be reused as soon as it returns.
func (st *stager) upload(dst Ptr, src unsafe.Pointer, n int, s Stream) error {
	b, err := st.buffer(n)
	if err != nil {
		return err
	}
	copy(unsafe.Slice((*byte)(b.p), n), unsafe.Slice((*byte)(src), n))
	if err := st.dev.CopyHtoDAsync(dst, b.p, n, s); err != nil {
		return err
	}
	if err := st.dev.Record(b.ev, s); err != nil {
		return err
	}
	st.seq++
	b.busy, b.seq = true, st.seq
	return nil
}

// buffer returns a free buffer of at least n bytes: one whose copy has
// run, a new one while there are fewer than stagingBuffers, or else the
// oldest, once its copy has run (the host waits), grown if it is too
// small.
func (st *stager) buffer(n int) (*stagingBuf, error) {
	for _, b := range st.bufs {
		if b.busy {
			done, err := st.dev.Done(b.ev)
			if err != nil {
				return nil, err
			}
			b.busy = !done
		}
	}
	var fit, oldest *stagingBuf
	for _, b := range st.bufs {
		if !b.busy && b.n >= n && (fit == nil || b.n < fit.n) {
			fit = b
		}
		if oldest == nil || !b.busy && oldest.busy || b.busy == oldest.busy && b.seq < oldest.seq {
			oldest = b // a free one first, else the one in flight longest
		}
	}
	if fit != nil {
		return fit, nil
	}
	if len(st.bufs) < stagingBuffers {
		ev, err := st.dev.NewMarker()
		if err != nil {
			return nil, err
		}
		b := &stagingBuf{ev: ev}
		st.bufs = append(st.bufs, b)
		return b, st.grow(b, n)
	}
	if oldest.busy {
		st.waits++
		if err := st.dev.WaitFor(oldest.ev); err != nil {
			return nil, err
		}
		oldest.busy = false
	}
	if oldest.n < n {
		return oldest, st.grow(oldest, n)
	}
	return oldest, nil
}

// grow gives b, which is not in flight, room for n bytes: a power of two,
// at least stagingMin.
func (st *stager) grow(b *stagingBuf, n int) error {
	size := stagingMin
	for size < n {
		size *= 2
	}
	if err := st.dev.FreeHost(b.p); err != nil {
		return err
	}
	b.p, b.n = nil, 0
	p, err := st.dev.AllocHost(size)
	if err != nil {
		return err
	}
	b.p, b.n = p, size
	return nil
}

// close gives the buffers back; the caller has synchronised the streams
// their copies ran on.
func (st *stager) close() error {
	var errs []error
	for _, b := range st.bufs {
		errs = append(errs, st.dev.FreeHost(b.p), st.dev.DestroyEvent(b.ev))
	}
	st.bufs = nil
	return errors.Join(errs...)
}
