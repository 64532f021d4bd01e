package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"
)

// Address ranges with memory mapped behind part of them (CUDA's virtual
// memory management: cuMemAddressReserve, cuMemCreate, cuMemMap). The
// backend stores bfloat16 activations this way (activations.go): the
// engine indexes a buffer of n activations as n float32s, so the buffers
// need the addresses of 4n bytes each, distinct from every other
// buffer's, but only 2n bytes of memory, at half their offset in the
// range. The memory is mapped as it is needed, from the start of the
// range; the rest stays unmapped, and a kernel that reads there faults
// instead of reading another buffer.

// reserveAPI is the part of libcuda.so.1 this file binds (driverAPI
// embeds it); each binding's C declaration (cuda.h, CUDA 10.2 and later)
// is beside it. CUmemGenericAllocationHandle is unsigned long long.
type reserveAPI struct {
	// CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option);
	granularity func(g *uint64, prop *memAllocationProp, option int32) int32
	// CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags);
	addressReserve func(p *uint64, size, align, addr, flags uint64) int32
	// CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
	addressFree func(p, size uint64) int32
	// CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags);
	create func(h *uint64, size uint64, prop *memAllocationProp, flags uint64) int32
	// CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
	release func(h uint64) int32
	// CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags);
	mapMem func(p, size, offset, h, flags uint64) int32
	// CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
	unmap func(p, size uint64) int32
	// CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
	setAccess func(p, size uint64, desc *memAccessDesc, count uint64) int32
}

// memAllocationProp is CUmemAllocationProp (32 bytes): { CUmemAllocationType
// type; CUmemAllocationHandleType requestedHandleTypes; CUmemLocation
// location; void *win32HandleMetaData; struct { unsigned char
// compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned
// char reserved[4]; } allocFlags; }.
type memAllocationProp struct {
	Type        int32 // CU_MEM_ALLOCATION_TYPE_PINNED = 0x1
	HandleTypes int32 // CU_MEM_HANDLE_TYPE_NONE = 0x0
	Location    memLocation
	Win32       uintptr
	Flags       [8]byte
}

// memAccessDesc is CUmemAccessDesc (12 bytes): { CUmemLocation location;
// CUmemAccess_flags flags; }.
type memAccessDesc struct {
	Location memLocation
	Flags    int32 // CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3
}

const (
	memAllocationTypePinned  = 1 // CU_MEM_ALLOCATION_TYPE_PINNED = 0x1
	memAllocGranularityMin   = 0 // CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0
	memAccessFlagsReadWrite  = 3 // CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3
	memAllocationPropBytes   = 32
	memAccessDescBytes       = 12
	memAllocationPropWin32At = 16
)

// The layouts above are the C structs'; a change of Go's layout rules
// would show here at compile time.
var (
	_ [memAllocationPropBytes - unsafe.Sizeof(memAllocationProp{})]byte
	_ [unsafe.Sizeof(memAllocationProp{}) - memAllocationPropBytes]byte
	_ [memAllocationPropWin32At - unsafe.Offsetof(memAllocationProp{}.Win32)]byte
	_ [memAccessDescBytes - unsafe.Sizeof(memAccessDesc{})]byte
	_ [unsafe.Sizeof(memAccessDesc{}) - memAccessDescBytes]byte
)

// bind binds the functions from the loaded driver.
func (a *reserveAPI) bind(h *handle) error {
	for _, b := range []struct {
		fn   any
		name string
	}{
		{&a.granularity, "cuMemGetAllocationGranularity"},
		{&a.addressReserve, "cuMemAddressReserve"},
		{&a.addressFree, "cuMemAddressFree"},
		{&a.create, "cuMemCreate"},
		{&a.release, "cuMemRelease"},
		{&a.mapMem, "cuMemMap"},
		{&a.unmap, "cuMemUnmap"},
		{&a.setAccess, "cuMemSetAccess"},
	} {
		if err := h.sym(b.fn, b.name); err != nil {
			return err
		}
	}
	return nil
}

// Reservation is a range of device addresses whose first Backed bytes
// are device memory (Device.Reserve, Device.Back).
type Reservation struct {
	Base   Ptr
	Span   int // bytes of addresses, a multiple of the granularity
	Backed int // bytes mapped from Base on, a multiple of the granularity
	gran   uint64
	chunks []memChunk
}

// memChunk is one cuMemCreate mapped into a reservation at addr.
type memChunk struct {
	addr, size uint64
	handle     uint64
	mapped     bool
}

// allocProp is the allocation this device's reservations are backed by:
// device memory of this GPU.
func (d *Device) allocProp() memAllocationProp {
	return memAllocationProp{Type: memAllocationTypePinned, Location: memLocation{Type: memLocationTypeDevice, ID: int32(d.ordinal)}}
}

// Reserve reserves span bytes of device addresses (cuMemAddressReserve),
// rounded up to the allocation granularity (2 MiB on current GPUs), with
// no memory behind them yet (Back maps it). Give them back with
// Unreserve.
func (d *Device) Reserve(span int) (*Reservation, error) {
	if span <= 0 {
		return nil, fmt.Errorf("cuda: reserving %d bytes of addresses", span)
	}
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return nil, err
	}
	a := d.api
	prop := d.allocProp()
	var g uint64
	if err := a.check("cuMemGetAllocationGranularity", a.granularity(&g, &prop, memAllocGranularityMin)); err != nil {
		return nil, d.wrap("allocation granularity", err)
	}
	if g == 0 {
		g = 2 << 20
	}
	r := &Reservation{Span: int(roundUp(uint64(span), g)), gran: g}
	var base uint64
	if err := a.check("cuMemAddressReserve", a.addressReserve(&base, uint64(r.Span), g, 0, 0)); err != nil {
		return nil, d.wrap(fmt.Sprintf("reserving %d bytes of addresses", r.Span), err)
	}
	r.Base = Ptr(base)
	return r, nil
}

func roundUp(n, g uint64) uint64 { return (n + g - 1) / g * g }

// Back maps new device memory after r's backed bytes (cuMemCreate,
// cuMemMap, cuMemSetAccess read-write for this device) until at least
// upto bytes from Base are backed, in one chunk of at least min bytes
// (both rounded up to the granularity). The new memory is not zeroed.
func (d *Device) Back(r *Reservation, upto, min int) error {
	if uint64(upto) <= uint64(r.Backed) {
		return nil
	}
	off := uint64(r.Backed)
	size := roundUp(max(uint64(upto)-off, uint64(min)), r.gran)
	if off+size > uint64(r.Span) {
		size = roundUp(uint64(upto)-off, r.gran)
		if off+size > uint64(r.Span) {
			return fmt.Errorf("cuda: backing %d bytes of a reservation of %d", upto, r.Span)
		}
	}
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return err
	}
	a := d.api
	prop := d.allocProp()
	p := uint64(r.Base) + off
	c := memChunk{addr: p, size: size}
	fail := func(op string, err error) error {
		return errors.Join(d.wrap(fmt.Sprintf("%s %d bytes of device memory", op, size), err), d.release(c))
	}
	if err := a.check("cuMemCreate", a.create(&c.handle, size, &prop, 0)); err != nil {
		return d.wrap(fmt.Sprintf("allocating %d bytes of device memory", size), err)
	}
	if err := a.check("cuMemMap", a.mapMem(p, size, 0, c.handle, 0)); err != nil {
		return fail("mapping", err)
	}
	c.mapped = true
	desc := memAccessDesc{Location: prop.Location, Flags: memAccessFlagsReadWrite}
	if err := a.check("cuMemSetAccess", a.setAccess(p, size, &desc, 1)); err != nil {
		return fail("giving access to", err)
	}
	r.chunks = append(r.chunks, c)
	r.Backed = int(off + size)
	return nil
}

// Unreserve unmaps and frees r's memory and gives back its addresses.
// Work queued on streams that may still use it must have finished.
func (d *Device) Unreserve(r *Reservation) error {
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return err
	}
	var errs []error
	for _, c := range r.chunks {
		errs = append(errs, d.release(c))
	}
	r.chunks, r.Backed = nil, 0
	if r.Base != 0 {
		errs = append(errs, d.api.check("cuMemAddressFree", d.api.addressFree(uint64(r.Base), uint64(r.Span))))
		r.Base = 0
	}
	return d.wrap("giving back a reservation", errors.Join(errs...))
}

// release unmaps (if mapped) and frees chunk c, with the context current:
// one chunk at a time, as the driver unmaps what one cuMemMap mapped.
func (d *Device) release(c memChunk) error {
	var errs []error
	if c.mapped {
		errs = append(errs, d.api.check("cuMemUnmap", d.api.unmap(c.addr, c.size)))
	}
	if c.handle != 0 {
		errs = append(errs, d.api.check("cuMemRelease", d.api.release(c.handle)))
	}
	return errors.Join(errs...)
}
