package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"github.com/gptui/gptui/kernels/cuda"
)

// cmdGPU is 'gptui gpu libs|check|bench|nccl': where the GPU backend's
// libraries are found, the checks and measurements of the backend on this
// machine's GPU (nccl: a one-rank job's NCCL data path), each printed as it
// runs and in a table at the end.
func cmdGPU(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "libs" && args[0] != "check" && args[0] != "bench" && args[0] != "nccl") {
		return usagef("gpu: want 'gptui gpu libs', 'gptui gpu check', 'gptui gpu bench' or 'gptui gpu nccl'")
	}
	fs := newFlagSet("gpu "+args[0], stderr)
	var steps *int
	var only *string
	if args[0] == "check" {
		steps = fs.Int("steps", 10, "training steps compared by the parity checks")
		only = fs.String("only", "", "comma-separated parts to run, of "+strings.Join(gpuCheckParts(), ", ")+" (default all)")
	}
	var wd *time.Duration
	if args[0] != "libs" {
		wd = fs.Duration("watchdog", 0, "end the process, with the goroutines' stacks and the last line printed, when it prints nothing for this long (a GPU call that hangs); 0 for none")
	}
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	if args[0] == "libs" {
		return gpuLibs(stdout)
	}
	var parts []string
	if args[0] == "check" {
		var err error
		if parts, err = parseParts(*only); err != nil {
			return err
		}
	}
	// Without a driver or a device nothing below can run: say so at once
	// rather than after the CPU references of the parity checks.
	switch n, err := cuda.DeviceCount(); {
	case err != nil:
		return usagef("gpu %s: %s", args[0], oneLine(err))
	case n == 0:
		return usagef("gpu %s: the CUDA driver sees no GPU on this machine", args[0])
	}
	if *wd > 0 {
		dog := newWatchdog(stdout, stderr, *wd, "gpu "+args[0], os.Exit)
		defer dog.stop()
		stdout = dog
	}
	var t gpuTable
	switch args[0] {
	case "check":
		gpuCheck(ctx, stdout, &t, *steps, parts)
	case "bench":
		gpuBench(ctx, stdout, &t)
	case "nccl":
		gpuNCCL(ctx, stdout, &t)
	}
	t.print(stdout)
	if t.failed > 0 {
		return fmt.Errorf("gpu %s: %d of %d checks failed", args[0], t.failed, len(t.rows))
	}
	return nil
}

// gpuLibs is 'gptui gpu libs': each library the GPU backend loads, in the
// order it loads them, found and loaded as the backend does, in a table:
// the file it came from, its version (the driver's CUDA version for the
// driver) and why that file (NVRTC, cuBLAS and cuBLASLt are matched to
// the driver's CUDA version; each candidate passed over follows on a
// line of its own, saying why), or NOT FOUND and why, or INCOMPATIBLE
// when only builds for a newer CUDA than the driver's were found; the
// driver's line names the GPUs it sees. Anything missing is a one-line
// usage error naming it and what to install or set (exit 2).
func gpuLibs(w io.Writer) error {
	type row struct {
		lib                        cuda.Library
		file, version, why, failed string
		skipped                    []string
	}
	var rows []row
	var missing []string
	driver := true
	for _, lib := range []cuda.Library{cuda.LibCUDA, cuda.LibNVRTC, cuda.LibCUBLAS, cuda.LibCUBLASLt, cuda.LibNCCL} {
		ch, err := cuda.LoadChoice(lib)
		if err != nil {
			what := "NOT FOUND"
			if errors.Is(err, cuda.ErrMismatch) {
				what = "INCOMPATIBLE"
			}
			rows = append(rows, row{lib: lib, failed: what + ": " + oneLine(err)})
			missing = append(missing, oneLine(err))
			driver = driver && lib != cuda.LibCUDA
			continue
		}
		r := row{lib: lib, file: ch.Path, version: "?", why: ch.Reason, skipped: ch.Skipped}
		if ch.CUDA > 0 {
			r.version = fmt.Sprintf("CUDA %d", ch.CUDA)
		}
		switch lib {
		case cuda.LibCUDA:
			if v, err := cuda.DriverVersion(); err == nil {
				r.version = fmt.Sprintf("driver CUDA %d.%d", v/1000, v%1000/10)
			}
			r.why = gpuDevices()
		case cuda.LibNVRTC:
			if c, err := cuda.LoadNVRTC(); err == nil {
				major, minor := c.Version()
				r.version = fmt.Sprintf("NVRTC %d.%d", major, minor)
			} else {
				r.why = oneLine(err)
			}
		case cuda.LibNCCL:
			if n, err := cuda.LoadNCCL(); err == nil {
				v := n.Version() // NCCL_VERSION_CODE: major·10000 + minor·100 + patch (2.9 on)
				r.version = fmt.Sprintf("NCCL %d.%d.%d", v/10000, v/100%100, v%100)
			} else {
				r.why = oneLine(err)
			}
		}
		rows = append(rows, r)
	}
	fileW, verW := len("file"), len("version")
	for _, r := range rows {
		fileW, verW = max(fileW, len(r.file)), max(verW, len(r.version))
	}
	fmt.Fprintf(w, "%-15s %-*s  %-*s  %s\n", "library", fileW, "file", verW, "version", "why")
	for _, r := range rows {
		if r.failed != "" {
			fmt.Fprintf(w, "%-15s %s\n", r.lib, r.failed)
			continue
		}
		fmt.Fprintf(w, "%-15s %-*s  %-*s  %s\n", r.lib, fileW, r.file, verW, r.version, r.why)
		for _, s := range r.skipped {
			fmt.Fprintf(w, "%-15s   %s\n", "", s)
		}
	}
	switch {
	case len(missing) == 0:
	case len(missing) == 1 || !driver: // without the driver nothing else matters
		return usagef("gpu libs: %s", missing[0])
	default:
		return usagef("gpu libs: %s (and %d more missing, above)", missing[0], len(missing)-1)
	}
	switch n, err := cuda.DeviceCount(); {
	case err != nil:
		return usagef("gpu libs: %s", oneLine(err))
	case n == 0:
		return usagef("gpu libs: the CUDA driver sees no GPU on this machine")
	}
	return nil
}

// gpuDevices describes the GPUs the driver sees and GPU 0, or why it
// cannot.
func gpuDevices() string {
	n, err := cuda.DeviceCount()
	if err != nil {
		return oneLine(err)
	}
	if n == 0 {
		return "no GPU"
	}
	d, err := cuda.Open(0)
	if err != nil {
		return oneLine(err)
	}
	defer d.Close()
	major, minor := d.Arch()
	return fmt.Sprintf("%d GPU(s), 0: %s sm_%d%d %.0f GiB", n, d.Name(), major, minor, float64(d.TotalMemory())/(1<<30))
}

// watchdog passes output through to w and, when nothing is written for
// d, prints every goroutine's stack and one line naming the last line
// written to stderr, and calls exit(1): a GPU call that hangs (a kernel
// that never ends, a driver that waits) cannot be cancelled from Go, and
// the process would otherwise sit silent until something outside killed
// it, its minutes on the GPU lost without a word of where.
type watchdog struct {
	mu      sync.Mutex
	w       io.Writer
	partial []byte // the line being written
	last    string // the last whole line
	d       time.Duration
	timer   *time.Timer
}

func newWatchdog(w, stderr io.Writer, d time.Duration, what string, exit func(int)) *watchdog {
	dog := &watchdog{w: w, d: d}
	dog.timer = time.AfterFunc(d, func() {
		dog.mu.Lock() // held until exit: nothing more is written
		defer dog.mu.Unlock()
		_ = pprof.Lookup("goroutine").WriteTo(stderr, 2)
		last := dog.last
		if len(dog.partial) > 0 {
			last = string(dog.partial)
		}
		if last == "" {
			last = "(nothing printed yet)"
		}
		fmt.Fprintf(stderr, "gptui: %s: watchdog: nothing printed for %v after %q: a GPU call hangs (the goroutines above show which; CUDA_LAUNCH_BLOCKING=1 makes a hanging kernel's launch show itself); run this part alone, or raise --watchdog if the work is only slow\n",
			what, d, strings.TrimSpace(last))
		exit(1)
	})
	return dog
}

// Write writes p through and restarts the watchdog's wait.
func (dog *watchdog) Write(p []byte) (int, error) {
	dog.mu.Lock()
	defer dog.mu.Unlock()
	dog.timer.Reset(dog.d)
	dog.partial = append(dog.partial, p...)
	if i := bytes.LastIndexByte(dog.partial, '\n'); i >= 0 {
		lines := strings.Split(strings.TrimRight(string(dog.partial[:i]), "\n"), "\n")
		dog.last = lines[len(lines)-1]
		dog.partial = append(dog.partial[:0], dog.partial[i+1:]...)
	}
	return dog.w.Write(p)
}

// stop ends the watch.
func (dog *watchdog) stop() { dog.timer.Stop() }

// gpuBench measures the device's GEMM rates with the binary's own cuBLAS
// calls (the peak MFU is reported against).
func gpuBench(ctx context.Context, w io.Writer, t *gpuTable) {
	d, err := cuda.Open(gpuOrdinal())
	if err != nil {
		t.add("open", oneLine(err), false)
		return
	}
	defer d.Close()
	s, err := d.NewStream()
	if err != nil {
		t.add("stream", oneLine(err), false)
		return
	}
	b, err := d.NewBLAS(s)
	if err != nil {
		t.add("cuBLAS", oneLine(err), false)
		return
	}
	defer b.Close()
	fmt.Fprintf(w, "device: %s\n", d.Name())
	for _, c := range []struct {
		name string
		t    cuda.DataType
		n    int
	}{{"bf16", cuda.BF16, 8192}, {"fp16", cuda.F16, 8192}, {"fp32 (IEEE)", cuda.F32, 4096}} {
		t0 := time.Now()
		f, err := cuda.MeasureGemm(ctx, d, b, c.t, c.n)
		if err != nil {
			t.add("GEMM "+c.name, oneLine(err), false)
			continue
		}
		fmt.Fprintf(w, "GEMM %s %d³: %.1f TFLOP/s (%.1f s)\n", c.name, c.n, f/1e12, time.Since(t0).Seconds())
		t.add(fmt.Sprintf("GEMM %s %d³", c.name, c.n), fmt.Sprintf("%.1f TFLOP/s", f/1e12), true)
	}
}
