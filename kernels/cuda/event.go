package cuda

import (
	"runtime"
	"unsafe"
)

// The driver calls that order work across streams and tell device memory
// from host memory: what the NCCL fabric (package comm/nccl) needs beyond
// the launches and copies of driver.go. An event recorded on one stream
// marks the work queued before it; another stream waits for it
// (cuStreamWaitEvent), and the host asks whether it has passed
// (cuEventQuery) without blocking, so that a wait can time out.

// The constants (cuda.h).
const (
	eventDisableTiming    = 0x2 // CU_EVENT_DISABLE_TIMING = 0x2
	cudaErrorNotReady     = 600 // CUDA_ERROR_NOT_READY = 600
	pointerAttrMemoryType = 2   // CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
	pointerAttrIsManaged  = 8   // CU_POINTER_ATTRIBUTE_IS_MANAGED = 8
	memoryTypeDevice      = 2   // CU_MEMORYTYPE_DEVICE = 0x02
)

// eventAPI is the part of libcuda.so.1 this file binds (driverAPI embeds
// it); each binding's C declaration (cuda.h) is beside it.
type eventAPI struct {
	// CUresult cuEventQuery(CUevent hEvent);
	eventQuery func(e uintptr) int32
	// CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags);
	streamWaitEvent func(s, e uintptr, flags uint32) int32
	// CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr);
	pointerGetAttribute func(data unsafe.Pointer, attr int32, p uint64) int32
}

// bind binds the functions from the loaded driver.
func (a *eventAPI) bind(h *handle) error {
	for _, b := range []struct {
		fn   any
		name string
	}{
		{&a.eventQuery, "cuEventQuery"},
		{&a.streamWaitEvent, "cuStreamWaitEvent"},
		{&a.pointerGetAttribute, "cuPointerGetAttribute"},
	} {
		if err := h.sym(b.fn, b.name); err != nil {
			return err
		}
	}
	return nil
}

// NewMarker creates an event that only marks a place in a stream, for
// ordering and completion (cuEventCreate, CU_EVENT_DISABLE_TIMING: lighter
// than NewEvent's). Destroy it with DestroyEvent.
func (d *Device) NewMarker() (Event, error) {
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return 0, err
	}
	var e uintptr
	if err := d.api.check("cuEventCreate", d.api.eventCreate(&e, eventDisableTiming)); err != nil {
		return 0, d.wrap("new marker event", err)
	}
	return Event(e), nil
}

// Done reports whether the work queued before e's last Record has
// finished (cuEventQuery), without waiting. An event never recorded is
// done. A failure of that work (a kernel's bad address) is the error.
func (d *Device) Done(e Event) (bool, error) {
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return false, err
	}
	switch r := d.api.eventQuery(uintptr(e)); r {
	case cudaSuccess:
		return true, nil
	case cudaErrorNotReady:
		return false, nil
	default:
		return false, d.wrap("event query", d.api.check("cuEventQuery", r))
	}
}

// WaitEvent makes the work queued on s from now on wait until the work
// before e's last Record has finished (cuStreamWaitEvent). The host does
// not wait.
func (d *Device) WaitEvent(s Stream, e Event) error {
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return err
	}
	return d.wrap("stream wait", d.api.check("cuStreamWaitEvent", d.api.streamWaitEvent(uintptr(s), uintptr(e), 0)))
}

// Reachable reports whether the device can read and write memory at p:
// device memory (Alloc) or managed memory (AllocManaged), as the
// driver's pointer attributes say (cuPointerGetAttribute). Memory of the
// Go heap or mmap is not (the driver does not know it).
func (d *Device) Reachable(p unsafe.Pointer) bool {
	if p == nil {
		return false
	}
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return false
	}
	addr := uint64(uintptr(p))
	var managed uint32
	if d.api.pointerGetAttribute(unsafe.Pointer(&managed), pointerAttrIsManaged, addr) == cudaSuccess && managed != 0 {
		return true
	}
	var kind uint32
	return d.api.pointerGetAttribute(unsafe.Pointer(&kind), pointerAttrMemoryType, addr) == cudaSuccess && kind == memoryTypeDevice
}
