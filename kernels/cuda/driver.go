package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

// Error is a failed call into a CUDA library: the driver, NVRTC, cuBLAS
// or NCCL. Errors from this package wrap it; use errors.As to get it.
type Error struct {
	Op   string // the C function, such as "cuMemAlloc_v2"
	Code int    // its status (CUresult, nvrtcResult, cublasStatus_t, ncclResult_t)
	Name string // the status's name, such as "CUDA_ERROR_OUT_OF_MEMORY"
	Msg  string // the library's description of it, if it has one
}

// Error reads "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory".
func (e *Error) Error() string {
	name := e.Name
	if name == "" {
		name = "error"
	}
	s := fmt.Sprintf("%s: %s (%d)", e.Op, name, e.Code)
	if e.Msg != "" && e.Msg != e.Name {
		s += ": " + e.Msg
	}
	return s
}

// goString copies a NUL-terminated C string.
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

// CUresult values this package tests for (cuda.h, enum cudaError_enum).
const (
	cudaSuccess = 0 // CUDA_SUCCESS = 0
)

// Device attributes (cuda.h, enum CUdevice_attribute_enum; checked
// against CUDA 12.x/13.x cuda.h and the driver API documentation).
const (
	attrMaxRegistersPerBlock     = 12 // CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK = 12
	attrMultiprocessorCount      = 16 // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
	attrMaxSharedPerSM           = 81 // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81
	attrMaxSharedPerBlockOptin   = 97 // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
	attrComputeCapabilityMajor   = 75 // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
	attrComputeCapabilityMinor   = 76 // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
	attrManagedMemory            = 83 // CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 83
	attrConcurrentManagedAccess  = 89 // CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS = 89
	memAttachGlobal              = 1  // CU_MEM_ATTACH_GLOBAL = 0x1
	memAdviseSetPreferredLoc     = 3  // CU_MEM_ADVISE_SET_PREFERRED_LOCATION = 3
	memLocationTypeDevice        = 1  // CU_MEM_LOCATION_TYPE_DEVICE = 0x1
	funcAttrMaxDynamicSharedSize = 8  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
	streamDefault                = 0  // CU_STREAM_DEFAULT = 0x0
	eventDefault                 = 0  // CU_EVENT_DEFAULT = 0x0
)

// memLocation is CUmemLocation: typedef struct CUmemLocation_st
// { CUmemLocationType type; int id; } CUmemLocation; (8 bytes, by value).
type memLocation struct {
	Type int32
	ID   int32
}

// driverAPI is libcuda.so.1's functions. Each binding's C declaration
// (cuda.h, CUDA 12/13) is beside it; CUdevice is int, CUdeviceptr is
// unsigned long long, handles are pointers.
type driverAPI struct {
	path string

	eventAPI   // event.go: event queries, stream waits, pointer attributes
	stagingAPI // staging.go: pinned host memory, asynchronous uploads
	reserveAPI // reserve.go: address ranges with memory behind part of them

	// CUresult cuInit(unsigned int Flags);
	init func(flags uint32) int32
	// CUresult cuDriverGetVersion(int *driverVersion);
	driverGetVersion func(v *int32) int32
	// CUresult cuDeviceGetCount(int *count);
	deviceGetCount func(n *int32) int32
	// CUresult cuDeviceGet(CUdevice *device, int ordinal);
	deviceGet func(dev *int32, ordinal int32) int32
	// CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
	deviceGetName func(name *byte, n int32, dev int32) int32
	// CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);
	deviceGetAttribute func(v *int32, attr int32, dev int32) int32
	// CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
	deviceTotalMem func(n *uint64, dev int32) int32
	// CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
	primaryCtxRetain func(ctx *uintptr, dev int32) int32
	// CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
	primaryCtxRelease func(dev int32) int32
	// CUresult cuCtxSetCurrent(CUcontext ctx);
	ctxSetCurrent func(ctx uintptr) int32
	// CUresult cuCtxSynchronize(void);
	ctxSynchronize func() int32
	// CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
	memGetInfo func(free, total *uint64) int32
	// CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
	memAlloc func(p *uint64, n uint64) int32
	// CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
	memAllocManaged func(p *uint64, n uint64, flags uint32) int32
	// CUresult cuMemFree_v2(CUdeviceptr dptr);
	memFree func(p uint64) int32
	// CUresult cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location, unsigned int flags, CUstream hStream); (CUDA >= 12.2)
	memPrefetchV2 func(p, n uint64, loc memLocation, flags uint32, s uintptr) int32
	// CUresult cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream); (the form before CUDA 13)
	memPrefetch func(p, n uint64, dev int32, s uintptr) int32
	// CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUmemLocation location); (CUDA >= 12.2)
	memAdviseV2 func(p, n uint64, advice int32, loc memLocation) int32
	// CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUdevice device); (the form before CUDA 13)
	memAdvise func(p, n uint64, advice int32, dev int32) int32
	// CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
	memcpyHtoD func(dst uint64, src unsafe.Pointer, n uint64) int32
	// CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
	memcpyDtoH func(dst unsafe.Pointer, src uint64, n uint64) int32
	// CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
	memcpyDtoDAsync func(dst, src, n uint64, s uintptr) int32
	// CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
	memsetD8Async func(p uint64, v uint8, n uint64, s uintptr) int32
	// CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags);
	streamCreate func(s *uintptr, flags uint32) int32
	// CUresult cuStreamDestroy_v2(CUstream hStream);
	streamDestroy func(s uintptr) int32
	// CUresult cuStreamSynchronize(CUstream hStream);
	streamSynchronize func(s uintptr) int32
	// CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags);
	eventCreate func(e *uintptr, flags uint32) int32
	// CUresult cuEventDestroy_v2(CUevent hEvent);
	eventDestroy func(e uintptr) int32
	// CUresult cuEventRecord(CUevent hEvent, CUstream hStream);
	eventRecord func(e, s uintptr) int32
	// CUresult cuEventSynchronize(CUevent hEvent);
	eventSynchronize func(e uintptr) int32
	// CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd); (CUDA 13's name; cuEventElapsedTime before)
	eventElapsedTime func(ms *float32, start, end uintptr) int32
	// CUresult cuModuleLoadData(CUmodule *module, const void *image);
	moduleLoadData func(m *uintptr, image unsafe.Pointer) int32
	// CUresult cuModuleUnload(CUmodule hmod);
	moduleUnload func(m uintptr) int32
	// CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
	moduleGetFunction func(f *uintptr, m uintptr, name string) int32
	// CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value);
	funcSetAttribute func(f uintptr, attr int32, v int32) int32
	// CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
	//   unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes,
	//   CUstream hStream, void **kernelParams, void **extra);
	launchKernel func(f uintptr, gx, gy, gz, bx, by, bz, shared uint32, s uintptr, params, extra uintptr) int32
	// CUresult cuGetErrorName(CUresult error, const char **pStr);
	getErrorName func(r int32, s **byte) int32
	// CUresult cuGetErrorString(CUresult error, const char **pStr);
	getErrorString func(r int32, s **byte) int32
}

// check turns a CUresult into nil or an *Error naming op and the code.
func (a *driverAPI) check(op string, r int32) error {
	if r == cudaSuccess {
		return nil
	}
	e := &Error{Op: op, Code: int(r)}
	var p *byte
	if a.getErrorName != nil && a.getErrorName(r, &p) == cudaSuccess {
		e.Name = goString(p)
	}
	p = nil
	if a.getErrorString != nil && a.getErrorString(r, &p) == cudaSuccess {
		e.Msg = goString(p)
	}
	return e
}

var (
	driverMu sync.Mutex
	driver   *driverAPI // set once cuInit succeeded
)

// loadDriver loads libcuda.so.1 and runs cuInit(0), once per process.
func loadDriver() (*driverAPI, error) {
	driverMu.Lock()
	defer driverMu.Unlock()
	if driver != nil {
		return driver, nil
	}
	h, err := load(LibCUDA)
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	a := &driverAPI{path: h.path}
	for _, b := range []struct {
		fn    any
		names []string
	}{
		{&a.getErrorName, []string{"cuGetErrorName"}},
		{&a.getErrorString, []string{"cuGetErrorString"}},
		{&a.init, []string{"cuInit"}},
		{&a.driverGetVersion, []string{"cuDriverGetVersion"}},
		{&a.deviceGetCount, []string{"cuDeviceGetCount"}},
		{&a.deviceGet, []string{"cuDeviceGet"}},
		{&a.deviceGetName, []string{"cuDeviceGetName"}},
		{&a.deviceGetAttribute, []string{"cuDeviceGetAttribute"}},
		{&a.deviceTotalMem, []string{"cuDeviceTotalMem_v2"}},
		{&a.primaryCtxRetain, []string{"cuDevicePrimaryCtxRetain"}},
		{&a.primaryCtxRelease, []string{"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}},
		{&a.ctxSetCurrent, []string{"cuCtxSetCurrent"}},
		{&a.ctxSynchronize, []string{"cuCtxSynchronize"}},
		{&a.memGetInfo, []string{"cuMemGetInfo_v2"}},
		{&a.memAlloc, []string{"cuMemAlloc_v2"}},
		{&a.memAllocManaged, []string{"cuMemAllocManaged"}},
		{&a.memFree, []string{"cuMemFree_v2"}},
		{&a.memcpyHtoD, []string{"cuMemcpyHtoD_v2"}},
		{&a.memcpyDtoH, []string{"cuMemcpyDtoH_v2"}},
		{&a.memcpyDtoDAsync, []string{"cuMemcpyDtoDAsync_v2"}},
		{&a.memsetD8Async, []string{"cuMemsetD8Async"}},
		{&a.streamCreate, []string{"cuStreamCreate"}},
		{&a.streamDestroy, []string{"cuStreamDestroy_v2", "cuStreamDestroy"}},
		{&a.streamSynchronize, []string{"cuStreamSynchronize"}},
		{&a.eventCreate, []string{"cuEventCreate"}},
		{&a.eventDestroy, []string{"cuEventDestroy_v2", "cuEventDestroy"}},
		{&a.eventRecord, []string{"cuEventRecord"}},
		{&a.eventSynchronize, []string{"cuEventSynchronize"}},
		{&a.eventElapsedTime, []string{"cuEventElapsedTime_v2", "cuEventElapsedTime"}},
		{&a.moduleLoadData, []string{"cuModuleLoadData"}},
		{&a.moduleUnload, []string{"cuModuleUnload"}},
		{&a.moduleGetFunction, []string{"cuModuleGetFunction"}},
		{&a.funcSetAttribute, []string{"cuFuncSetAttribute"}},
		{&a.launchKernel, []string{"cuLaunchKernel"}},
	} {
		if err := h.sym(b.fn, b.names...); err != nil {
			return nil, fmt.Errorf("cuda: %w", err)
		}
	}
	if !h.optSym(&a.memPrefetchV2, "cuMemPrefetchAsync_v2") {
		a.memPrefetchV2 = nil
		if !h.optSym(&a.memPrefetch, "cuMemPrefetchAsync") {
			a.memPrefetch = nil
		}
	}
	if !h.optSym(&a.memAdviseV2, "cuMemAdvise_v2") {
		a.memAdviseV2 = nil
		if !h.optSym(&a.memAdvise, "cuMemAdvise") {
			a.memAdvise = nil
		}
	}
	if err := a.eventAPI.bind(h); err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	if err := a.stagingAPI.bind(h); err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	if err := a.reserveAPI.bind(h); err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	if err := a.check("cuInit", a.init(0)); err != nil {
		return nil, fmt.Errorf("cuda: %s: %w", h.path, err)
	}
	driver = a
	return a, nil
}

// Device is one GPU with its primary context retained. Its methods may
// be called from any goroutine: each locks the goroutine to its OS thread
// for the call and makes the primary context current there
// (cuCtxSetCurrent, a thread-local store), so callers need not manage
// contexts or threads.
//
// Streams from NewStream are blocking streams (CU_STREAM_DEFAULT): the
// synchronous copies, which run on the legacy default stream, wait for
// the work queued on them, and they for the copies.
type Device struct {
	api     *driverAPI
	ordinal int
	dev     int32
	ctx     uintptr

	name         string
	major, minor int
	sms          int
	sharedOptin  int // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, bytes
	sharedPerSM  int // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, bytes
	regsPerBlock int // MAX_REGISTERS_PER_BLOCK
	total        int64
	driverVer    int
	concurrent   bool // CONCURRENT_MANAGED_ACCESS: prefetch and advise work

	args *argArena

	mu     sync.Mutex
	closed bool
}

// DeviceCount returns the number of CUDA devices, loading the driver.
func DeviceCount() (int, error) {
	a, err := loadDriver()
	if err != nil {
		return 0, err
	}
	var n int32
	if err := a.check("cuDeviceGetCount", a.deviceGetCount(&n)); err != nil {
		return 0, fmt.Errorf("cuda: %w", err)
	}
	return int(n), nil
}

// Open loads the driver (libcuda.so.1), initialises it and retains the
// primary context of the device with the given ordinal. Close releases it.
// On a machine without a GPU or driver the error names the library and
// where it was looked for.
func Open(ordinal int) (*Device, error) {
	a, err := loadDriver()
	if err != nil {
		return nil, err
	}
	var n int32
	if err := a.check("cuDeviceGetCount", a.deviceGetCount(&n)); err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	if ordinal < 0 || ordinal >= int(n) {
		return nil, fmt.Errorf("cuda: no device %d: the driver (%s) sees %d", ordinal, a.path, n)
	}
	d := &Device{api: a, ordinal: ordinal}
	if err := a.check("cuDeviceGet", a.deviceGet(&d.dev, int32(ordinal))); err != nil {
		return nil, fmt.Errorf("cuda: device %d: %w", ordinal, err)
	}
	if err := a.check("cuDevicePrimaryCtxRetain", a.primaryCtxRetain(&d.ctx, d.dev)); err != nil {
		return nil, fmt.Errorf("cuda: device %d: %w", ordinal, err)
	}
	fail := func(err error) (*Device, error) {
		a.primaryCtxRelease(d.dev)
		return nil, fmt.Errorf("cuda: device %d: %w", ordinal, err)
	}
	var buf [256]byte
	if err := a.check("cuDeviceGetName", a.deviceGetName(&buf[0], int32(len(buf)), d.dev)); err != nil {
		return fail(err)
	}
	d.name = goString(&buf[0])
	attr := func(which int32) (int, error) {
		var v int32
		err := a.check("cuDeviceGetAttribute", a.deviceGetAttribute(&v, which, d.dev))
		return int(v), err
	}
	var managed, concurrent int
	for _, q := range []struct {
		which int32
		to    *int
	}{
		{attrComputeCapabilityMajor, &d.major},
		{attrComputeCapabilityMinor, &d.minor},
		{attrMultiprocessorCount, &d.sms},
		{attrMaxSharedPerBlockOptin, &d.sharedOptin},
		{attrMaxSharedPerSM, &d.sharedPerSM},
		{attrMaxRegistersPerBlock, &d.regsPerBlock},
		{attrManagedMemory, &managed},
		{attrConcurrentManagedAccess, &concurrent},
	} {
		v, err := attr(q.which)
		if err != nil {
			return fail(err)
		}
		*q.to = v
	}
	d.concurrent = managed != 0 && concurrent != 0
	var total uint64
	if err := a.check("cuDeviceTotalMem_v2", a.deviceTotalMem(&total, d.dev)); err != nil {
		return fail(err)
	}
	d.total = int64(total)
	var ver int32
	if err := a.check("cuDriverGetVersion", a.driverGetVersion(&ver)); err != nil {
		return fail(err)
	}
	d.driverVer = int(ver)
	if d.args, err = newArgArena(); err != nil {
		return fail(err)
	}
	return d, nil
}

// enter locks the calling goroutine to its OS thread and makes the
// device's primary context current there; the caller must call
// runtime.UnlockOSThread when done (also when enter fails).
func (d *Device) enter() error {
	runtime.LockOSThread()
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return fmt.Errorf("cuda: device %d is closed", d.ordinal)
	}
	if err := d.api.check("cuCtxSetCurrent", d.api.ctxSetCurrent(d.ctx)); err != nil {
		return fmt.Errorf("cuda: device %d: %w", d.ordinal, err)
	}
	return nil
}

// wrap adds the device to an error from a driver call.
func (d *Device) wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("cuda: device %d: %s: %w", d.ordinal, what, err)
}

// Close releases the primary context (cuDevicePrimaryCtxRelease_v2). The
// context, and what was allocated in it, goes when its last user releases
// it. Close is idempotent.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	err := d.api.check("cuDevicePrimaryCtxRelease_v2", d.api.primaryCtxRelease(d.dev))
	return errors.Join(d.wrap("close", err), d.args.close())
}

// Ordinal returns the device's ordinal, as given to Open.
func (d *Device) Ordinal() int { return d.ordinal }

// Name returns the device's name, such as "NVIDIA H100 80GB HBM3".
func (d *Device) Name() string { return d.name }

// Arch returns the compute capability, such as 9, 0 for sm_90.
func (d *Device) Arch() (major, minor int) { return d.major, d.minor }

// SMs returns the number of streaming multiprocessors.
func (d *Device) SMs() int { return d.sms }

// Attrs are the device's attributes that the kernels' variants are chosen
// by ([SelectVariants]).
func (d *Device) Attrs() DeviceAttrs {
	return DeviceAttrs{Major: d.major, Minor: d.minor, SharedOptin: d.sharedOptin, SharedPerSM: d.sharedPerSM,
		RegsPerBlock: d.regsPerBlock, SMs: d.sms}
}

// ConcurrentManaged reports whether the device has concurrent managed
// access (CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS), without which
// Prefetch does nothing.
func (d *Device) ConcurrentManaged() bool { return d.concurrent }

// TotalMemory returns the device memory in bytes.
func (d *Device) TotalMemory() int64 { return d.total }

// DriverVersion returns the CUDA version the driver supports, as
// 1000*major + 10*minor (13000 for CUDA 13.0).
func (d *Device) DriverVersion() int { return d.driverVer }

// LibraryPath returns where the driver library was loaded from.
func (d *Device) LibraryPath() string { return d.api.path }

// MemInfo returns the free and total device memory in bytes.
func (d *Device) MemInfo() (free, total int64, err error) {
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return 0, 0, err
	}
	var f, t uint64
	if err := d.api.check("cuMemGetInfo_v2", d.api.memGetInfo(&f, &t)); err != nil {
		return 0, 0, d.wrap("memory info", err)
	}
	return int64(f), int64(t), nil
}

// Alloc allocates bytes of device memory (cuMemAlloc_v2).
func (d *Device) Alloc(bytes int) (Ptr, error) {
	if bytes <= 0 {
		return 0, fmt.Errorf("cuda: allocating %d bytes", bytes)
	}
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return 0, err
	}
	var p uint64
	if err := d.api.check("cuMemAlloc_v2", d.api.memAlloc(&p, uint64(bytes))); err != nil {
		return 0, d.wrap(fmt.Sprintf("allocating %d bytes", bytes), err)
	}
	return Ptr(p), nil
}

// AllocManaged allocates bytes of managed (unified) memory, accessible
// from every device and the host (cuMemAllocManaged, CU_MEM_ATTACH_GLOBAL).
func (d *Device) AllocManaged(bytes int) (Ptr, error) {
	if bytes <= 0 {
		return 0, fmt.Errorf("cuda: allocating %d managed bytes", bytes)
	}
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return 0, err
	}
	var p uint64
	if err := d.api.check("cuMemAllocManaged", d.api.memAllocManaged(&p, uint64(bytes), memAttachGlobal)); err != nil {
		return 0, d.wrap(fmt.Sprintf("allocating %d managed bytes", bytes), err)
	}
	return Ptr(p), nil
}

// Free frees memory from Alloc or AllocManaged (cuMemFree_v2).
func (d *Device) Free(p Ptr) error {
	if p == 0 {
		return nil
	}
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return err
	}
	return d.wrap("free", d.api.check("cuMemFree_v2", d.api.memFree(uint64(p))))
}

// Prefetch advises the driver that managed memory [p, p+bytes) prefers to
// live on this device (cuMemAdvise, CU_MEM_ADVISE_SET_PREFERRED_LOCATION)
// and migrates it there on stream s (cuMemPrefetchAsync_v2 with a
// CUmemLocation when the driver exports it, the older form otherwise).
// On a device without concurrent managed access (where prefetching is not
// supported) it does nothing: the pages migrate on first touch.
func (d *Device) Prefetch(p Ptr, bytes int, s Stream) error {
	if !d.concurrent || bytes <= 0 {
		return nil
	}
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return err
	}
	loc := memLocation{Type: memLocationTypeDevice, ID: d.dev}
	a := d.api
	switch {
	case a.memAdviseV2 != nil:
		if err := a.check("cuMemAdvise_v2", a.memAdviseV2(uint64(p), uint64(bytes), memAdviseSetPreferredLoc, loc)); err != nil {
			return d.wrap("advising preferred location", err)
		}
	case a.memAdvise != nil:
		if err := a.check("cuMemAdvise", a.memAdvise(uint64(p), uint64(bytes), memAdviseSetPreferredLoc, d.dev)); err != nil {
			return d.wrap("advising preferred location", err)
		}
	}
	switch {
	case a.memPrefetchV2 != nil:
		return d.wrap("prefetch", a.check("cuMemPrefetchAsync_v2", a.memPrefetchV2(uint64(p), uint64(bytes), loc, 0, uintptr(s))))
	case a.memPrefetch != nil:
		return d.wrap("prefetch", a.check("cuMemPrefetchAsync", a.memPrefetch(uint64(p), uint64(bytes), d.dev, uintptr(s))))
	}
	return nil
}

// CopyHtoD copies bytes from host memory at src to the device,
// synchronously (cuMemcpyHtoD_v2). src must not hold Go pointers.
func (d *Device) CopyHtoD(dst Ptr, src unsafe.Pointer, bytes int) error {
	if bytes == 0 {
		return nil
	}
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return err
	}
	return d.wrap(fmt.Sprintf("copying %d bytes to the device", bytes),
		d.api.check("cuMemcpyHtoD_v2", d.api.memcpyHtoD(uint64(dst), src, uint64(bytes))))
}

// CopyDtoH copies bytes from the device to host memory at dst,
// synchronously (cuMemcpyDtoH_v2).
func (d *Device) CopyDtoH(dst unsafe.Pointer, src Ptr, bytes int) error {
	if bytes == 0 {
		return nil
	}
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return err
	}
	return d.wrap(fmt.Sprintf("copying %d bytes from the device", bytes),
		d.api.check("cuMemcpyDtoH_v2", d.api.memcpyDtoH(dst, uint64(src), uint64(bytes))))
}

// CopyDtoD queues a device-to-device copy on stream s (cuMemcpyDtoDAsync_v2).
func (d *Device) CopyDtoD(dst, src Ptr, bytes int, s Stream) error {
	if bytes == 0 {
		return nil
	}
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return err
	}
	return d.wrap("device copy", d.api.check("cuMemcpyDtoDAsync_v2", d.api.memcpyDtoDAsync(uint64(dst), uint64(src), uint64(bytes), uintptr(s))))
}

// Memset queues zeroing bytes at p on stream s (cuMemsetD8Async).
func (d *Device) Memset(p Ptr, bytes int, s Stream) error {
	if bytes == 0 {
		return nil
	}
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return err
	}
	return d.wrap("memset", d.api.check("cuMemsetD8Async", d.api.memsetD8Async(uint64(p), 0, uint64(bytes), uintptr(s))))
}

// NewStream creates a stream (cuStreamCreate, CU_STREAM_DEFAULT).
func (d *Device) NewStream() (Stream, error) {
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return 0, err
	}
	var s uintptr
	if err := d.api.check("cuStreamCreate", d.api.streamCreate(&s, streamDefault)); err != nil {
		return 0, d.wrap("new stream", err)
	}
	return Stream(s), nil
}

// DestroyStream destroys a stream from NewStream once its work is done.
func (d *Device) DestroyStream(s Stream) error {
	if s == 0 {
		return nil
	}
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return err
	}
	return d.wrap("destroy stream", d.api.check("cuStreamDestroy_v2", d.api.streamDestroy(uintptr(s))))
}

// Sync waits for the work queued on s (cuStreamSynchronize). An error of
// an earlier asynchronous call (a kernel's bad address) shows here.
func (d *Device) Sync(s Stream) error {
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return err
	}
	return d.wrap("stream sync", d.api.check("cuStreamSynchronize", d.api.streamSynchronize(uintptr(s))))
}

// SyncAll waits for all the device's work in this context (cuCtxSynchronize).
func (d *Device) SyncAll() error {
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return err
	}
	return d.wrap("sync", d.api.check("cuCtxSynchronize", d.api.ctxSynchronize()))
}

// Event is a CUDA event (CUevent), a mark in a stream for timing.
type Event uintptr

// NewEvent creates an event that records time (cuEventCreate, CU_EVENT_DEFAULT).
func (d *Device) NewEvent() (Event, error) {
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return 0, err
	}
	var e uintptr
	if err := d.api.check("cuEventCreate", d.api.eventCreate(&e, eventDefault)); err != nil {
		return 0, d.wrap("new event", err)
	}
	return Event(e), nil
}

// DestroyEvent destroys an event from NewEvent.
func (d *Device) DestroyEvent(e Event) error {
	if e == 0 {
		return nil
	}
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return err
	}
	return d.wrap("destroy event", d.api.check("cuEventDestroy_v2", d.api.eventDestroy(uintptr(e))))
}

// Record queues e on stream s (cuEventRecord).
func (d *Device) Record(e Event, s Stream) error {
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return err
	}
	return d.wrap("record event", d.api.check("cuEventRecord", d.api.eventRecord(uintptr(e), uintptr(s))))
}

// Elapsed waits for end (cuEventSynchronize) and returns the time between
// start and end (cuEventElapsedTime_v2, about half a microsecond resolution).
func (d *Device) Elapsed(start, end Event) (time.Duration, error) {
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return 0, err
	}
	if err := d.api.check("cuEventSynchronize", d.api.eventSynchronize(uintptr(end))); err != nil {
		return 0, d.wrap("event sync", err)
	}
	var ms float32
	if err := d.api.check("cuEventElapsedTime_v2", d.api.eventElapsedTime(&ms, uintptr(start), uintptr(end))); err != nil {
		return 0, d.wrap("elapsed time", err)
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// Module is a loaded CUBIN or PTX image (CUmodule).
type Module struct {
	d *Device
	m uintptr
}

// Load loads a compiled image, CUBIN or PTX, into the device's context
// (cuModuleLoadData). PTX gets the NUL terminator the driver needs.
func (d *Device) Load(image []byte) (*Module, error) {
	if len(image) == 0 {
		return nil, fmt.Errorf("cuda: loading an empty module image")
	}
	if !isELF(image) && image[len(image)-1] != 0 {
		image = append(image[:len(image):len(image)], 0)
	}
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return nil, err
	}
	var m uintptr
	err := d.api.check("cuModuleLoadData", d.api.moduleLoadData(&m, unsafe.Pointer(&image[0])))
	runtime.KeepAlive(image)
	if err != nil {
		return nil, d.wrap(fmt.Sprintf("loading a %d-byte module", len(image)), err)
	}
	return &Module{d: d, m: m}, nil
}

// isELF reports whether image is an ELF file (a CUBIN) rather than PTX text.
func isELF(image []byte) bool {
	return len(image) >= 4 && string(image[:4]) == "\x7fELF"
}

// Function returns the kernel named name (its extern "C" name).
func (m *Module) Function(name string) (Function, error) {
	defer runtime.UnlockOSThread()
	if err := m.d.enter(); err != nil {
		return 0, err
	}
	var f uintptr
	if err := m.d.api.check("cuModuleGetFunction", m.d.api.moduleGetFunction(&f, m.m, name)); err != nil {
		return 0, m.d.wrap("kernel "+name, err)
	}
	return Function(f), nil
}

// Close unloads the module (cuModuleUnload); its functions become invalid.
func (m *Module) Close() error {
	if m.m == 0 {
		return nil
	}
	defer runtime.UnlockOSThread()
	if err := m.d.enter(); err != nil {
		return err
	}
	err := m.d.api.check("cuModuleUnload", m.d.api.moduleUnload(m.m))
	m.m = 0
	return m.d.wrap("unload module", err)
}

// SetMaxShared lets f use up to bytes of dynamic shared memory
// (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), needed above 48 KiB.
func (d *Device) SetMaxShared(f Function, bytes int) error {
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return err
	}
	return d.wrap(fmt.Sprintf("setting %d bytes of dynamic shared memory", bytes),
		d.api.check("cuFuncSetAttribute", d.api.funcSetAttribute(uintptr(f), funcAttrMaxDynamicSharedSize, int32(bytes))))
}

// Launch queues kernel f on stream s (cuLaunchKernel) with the given
// grid, block and dynamic shared memory. Each argument is a Ptr, int32,
// uint32, int64, uint64, float32 or float64, passed by value in order;
// they are copied into memory outside the Go heap for the call.
func (d *Device) Launch(f Function, grid, block Dim3, shared int, s Stream, args ...any) error {
	p, err := packArgs(args)
	if err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return err
	}
	d.args.mu.Lock()
	params := d.args.fill(p)
	r := d.api.launchKernel(uintptr(f), grid.X, grid.Y, grid.Z, block.X, block.Y, block.Z, uint32(shared), uintptr(s), params, 0)
	d.args.mu.Unlock()
	if err := d.api.check("cuLaunchKernel", r); err != nil {
		return d.wrap(fmt.Sprintf("launching a kernel (grid %d×%d×%d, block %d×%d×%d, %d bytes shared, %d args)",
			grid.X, grid.Y, grid.Z, block.X, block.Y, block.Z, shared, len(args)), err)
	}
	return nil
}

var _ Launcher = (*Device)(nil)
