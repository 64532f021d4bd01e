// Package nvml reads what NVIDIA GPUs a machine has, and how much of their
// memory is in use, through the NVIDIA Management Library (NVML).
//
// The library, libnvidia-ml.so.1, comes with the NVIDIA driver. It is
// loaded when Open is called, with dlopen through
// github.com/ebitengine/purego, so gptui builds without cgo and runs on
// machines without the driver: there Open returns an error saying what it
// looked for. (github.com/NVIDIA/go-nvml needs cgo: it does not compile
// with CGO_ENABLED=0.)
//
// Only the calls gptui needs are bound: nvmlInit_v2, nvmlShutdown,
// nvmlErrorString, nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2,
// nvmlDeviceGetName, nvmlDeviceGetUUID and nvmlDeviceGetMemoryInfo, and
// where the driver has them nvmlDeviceGetUtilizationRates,
// nvmlDeviceGetPowerUsage and nvmlDeviceGetTemperature.
package nvml

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/ebitengine/purego"
)

// LibraryName is the soname of NVML.
const LibraryName = "libnvidia-ml.so.1"

// searchPaths are where Open looks for NVML, in order: the dynamic
// loader's search path first, then where distributions, containers
// (the NVIDIA container toolkit) and WSL put the driver's libraries.
var searchPaths = []string{
	LibraryName,
	"/usr/lib/x86_64-linux-gnu/" + LibraryName,
	"/usr/lib/aarch64-linux-gnu/" + LibraryName,
	"/usr/lib64/" + LibraryName,
	"/usr/lib/" + LibraryName,
	"/usr/local/nvidia/lib64/" + LibraryName,
	"/usr/local/nvidia/lib/" + LibraryName,
	"/usr/lib/wsl/lib/" + LibraryName,
}

// nvmlReturn_t values.
const (
	nvmlSuccess = 0
)

// Buffer sizes from nvml.h.
const (
	deviceNameBufferSize = 96 // NVML_DEVICE_NAME_V2_BUFFER_SIZE
	deviceUUIDBufferSize = 96 // NVML_DEVICE_UUID_V2_BUFFER_SIZE
)

// Device is one GPU.
type Device struct {
	Index    int    // NVML's index, as nvidia-smi numbers the GPUs
	Name     string // such as "NVIDIA H100 80GB HBM3"
	UUID     string // such as "GPU-5e3b..."
	MemTotal int64  // bytes
	MemFree  int64  // bytes
	MemUsed  int64  // bytes
}

// memory is nvmlMemory_t.
type memory struct {
	Total, Free, Used uint64
}

// Lib is an initialised NVML. It is safe for concurrent use.
type Lib struct {
	path string
	h    uintptr

	mu     sync.Mutex // guards closed
	closed bool

	shutdown      func() int32
	errorString   func(ret int32) string
	getCount      func(count *uint32) int32
	handleByIndex func(index uint32, device *uintptr) int32
	getName       func(device uintptr, name *byte, length uint32) int32
	getUUID       func(device uintptr, uuid *byte, length uint32) int32
	getMemoryInfo func(device uintptr, mem *memory) int32

	// Optional (nil where the driver lacks them): for Health.
	getUtilization func(device uintptr, util *[2]uint32) int32    // nvmlUtilization_t: gpu, memory (%)
	getPower       func(device uintptr, milliwatts *uint32) int32 // nvmlDeviceGetPowerUsage
	getTemperature func(device uintptr, sensor int32, c *uint32) int32
}

// Open loads NVML from the first of the standard places that has it and
// initialises it. Close it when done.
func Open() (*Lib, error) {
	for _, p := range searchPaths {
		l, err := openAt(p)
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, errNotLoaded) {
			// The library is there but does not work (no driver loaded,
			// say): looking further would only hide why.
			return nil, err
		}
	}
	return nil, fmt.Errorf("nvml: %s not found (no NVIDIA driver?): tried %s", LibraryName, strings.Join(searchPaths, ", "))
}

// errNotLoaded marks a library that dlopen could not load.
var errNotLoaded = errors.New("not loaded")

// openAt loads and initialises NVML from path.
func openAt(path string) (*Lib, error) {
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("nvml: %s: %w (%v)", path, errNotLoaded, err)
	}
	l := &Lib{path: path, h: h}
	bind := func(fn any, names ...string) error {
		var last error
		for _, name := range names {
			sym, err := purego.Dlsym(h, name)
			if err == nil {
				purego.RegisterFunc(fn, sym)
				return nil
			}
			last = err
		}
		return fmt.Errorf("nvml: %s has no %s: %w", path, names[0], last)
	}
	var init func() int32
	for _, b := range []struct {
		fn    any
		names []string
	}{
		{&init, []string{"nvmlInit_v2", "nvmlInit"}},
		{&l.shutdown, []string{"nvmlShutdown"}},
		{&l.errorString, []string{"nvmlErrorString"}},
		{&l.getCount, []string{"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"}},
		{&l.handleByIndex, []string{"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"}},
		{&l.getName, []string{"nvmlDeviceGetName"}},
		{&l.getUUID, []string{"nvmlDeviceGetUUID"}},
		{&l.getMemoryInfo, []string{"nvmlDeviceGetMemoryInfo"}},
	} {
		if err := bind(b.fn, b.names...); err != nil {
			_ = purego.Dlclose(h)
			return nil, err
		}
	}
	for _, b := range []struct {
		fn   any
		name string
	}{
		{&l.getUtilization, "nvmlDeviceGetUtilizationRates"},
		{&l.getPower, "nvmlDeviceGetPowerUsage"},
		{&l.getTemperature, "nvmlDeviceGetTemperature"},
	} {
		_ = bind(b.fn, b.name) // optional: Health leaves out what is missing
	}
	if ret := init(); ret != nvmlSuccess {
		err := fmt.Errorf("nvml: nvmlInit_v2 (%s): %s", path, l.errorString(ret))
		_ = purego.Dlclose(h)
		return nil, err
	}
	return l, nil
}

// Path returns the file NVML was loaded from, or its soname when the
// dynamic loader found it.
func (l *Lib) Path() string { return l.path }

// Close shuts NVML down. The Lib must not be used afterwards.
func (l *Lib) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if ret := l.shutdown(); ret != nvmlSuccess {
		return l.err("nvmlShutdown", ret)
	}
	return nil
}

func (l *Lib) err(call string, ret int32) error {
	return fmt.Errorf("nvml: %s: %s (%d)", call, l.errorString(ret), ret)
}

// Count returns the number of GPUs NVML sees.
func (l *Lib) Count() (int, error) {
	var n uint32
	if ret := l.getCount(&n); ret != nvmlSuccess {
		return 0, l.err("nvmlDeviceGetCount_v2", ret)
	}
	return int(n), nil
}

func (l *Lib) handle(index int) (uintptr, error) {
	var h uintptr
	if index < 0 || index > 1<<16 {
		return 0, fmt.Errorf("nvml: no device %d", index)
	}
	if ret := l.handleByIndex(uint32(index), &h); ret != nvmlSuccess {
		return 0, l.err(fmt.Sprintf("nvmlDeviceGetHandleByIndex_v2(%d)", index), ret)
	}
	return h, nil
}

// Memory returns the used and total memory of GPU index, in bytes.
func (l *Lib) Memory(index int) (used, total int64, err error) {
	h, err := l.handle(index)
	if err != nil {
		return 0, 0, err
	}
	var m memory
	if ret := l.getMemoryInfo(h, &m); ret != nvmlSuccess {
		return 0, 0, l.err(fmt.Sprintf("nvmlDeviceGetMemoryInfo(%d)", index), ret)
	}
	return int64(m.Used), int64(m.Total), nil
}

// Health is a GPU's load: what NVML reports of it. A figure NVML cannot
// give (an old driver, a GPU without the sensor) is -1.
type Health struct {
	UtilPercent int     // the share of the last sample period a kernel ran
	PowerW      float64 // power draw, watts
	TempC       int     // GPU temperature, °C
}

// Health returns GPU index's load.
func (l *Lib) Health(index int) (Health, error) {
	h, err := l.handle(index)
	if err != nil {
		return Health{}, err
	}
	out := Health{UtilPercent: -1, PowerW: -1, TempC: -1}
	if l.getUtilization != nil {
		var u [2]uint32
		if l.getUtilization(h, &u) == nvmlSuccess {
			out.UtilPercent = int(u[0])
		}
	}
	if l.getPower != nil {
		var mw uint32
		if l.getPower(h, &mw) == nvmlSuccess {
			out.PowerW = float64(mw) / 1000
		}
	}
	if l.getTemperature != nil {
		var c uint32
		if l.getTemperature(h, nvmlTemperatureGPU, &c) == nvmlSuccess {
			out.TempC = int(c)
		}
	}
	return out, nil
}

// nvmlTemperatureGPU is NVML_TEMPERATURE_GPU, the GPU die's sensor.
const nvmlTemperatureGPU = 0

// Device describes GPU index.
func (l *Lib) Device(index int) (Device, error) {
	h, err := l.handle(index)
	if err != nil {
		return Device{}, err
	}
	d := Device{Index: index}
	name := make([]byte, deviceNameBufferSize)
	if ret := l.getName(h, &name[0], uint32(len(name))); ret != nvmlSuccess {
		return Device{}, l.err(fmt.Sprintf("nvmlDeviceGetName(%d)", index), ret)
	}
	d.Name = cString(name)
	uuid := make([]byte, deviceUUIDBufferSize)
	if ret := l.getUUID(h, &uuid[0], uint32(len(uuid))); ret == nvmlSuccess {
		d.UUID = cString(uuid)
	}
	var m memory
	if ret := l.getMemoryInfo(h, &m); ret != nvmlSuccess {
		return Device{}, l.err(fmt.Sprintf("nvmlDeviceGetMemoryInfo(%d)", index), ret)
	}
	d.MemTotal, d.MemFree, d.MemUsed = int64(m.Total), int64(m.Free), int64(m.Used)
	return d, nil
}

// Devices describes every GPU.
func (l *Lib) Devices() ([]Device, error) {
	n, err := l.Count()
	if err != nil {
		return nil, err
	}
	ds := make([]Device, 0, n)
	for i := range n {
		d, err := l.Device(i)
		if err != nil {
			return ds, err
		}
		ds = append(ds, d)
	}
	return ds, nil
}

// cString returns the NUL-terminated string at the start of b.
func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
