package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/comm/nccl"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/engine/gpucheck"
	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/kernels/cuda"
	"github.com/gptui/gptui/kernels/cuda/cudacheck"
	"github.com/gptui/gptui/presets"
)

// newBackend returns the compute backend of cfg's Global.device and a
// function that releases it. A GPU that cannot be used is a one-line
// usage error (exit 2) saying why; one with less free memory than the
// engine will allocate on it (gpuNeed) is refused so before anything is
// compiled or allocated.
func newBackend(cfg *presets.Config, world *comm.World, stderr io.Writer) (kernels.Backend, func(), error) {
	if cfg.Global.Device != "gpu" {
		be, err := cpuBackend(cpu.Options{BF16: cfg.Engine.MixPrecision.Dtype == "bf16"}, stderr)
		if err != nil {
			return nil, nil, err
		}
		return be, func() {}, nil
	}
	if world != nil && world.Size() > 1 {
		// Its gradients and activations go over NCCL (newFabric).
		if _, err := cuda.LoadNCCL(); err != nil {
			return nil, nil, usagef("Global.device=gpu: a job of %d processes needs NCCL: %s; use Global.device=cpu", world.Size(), oneLine(err))
		}
	}
	prec, err := cuda.ParsePrecision(cfg.Engine.MixPrecision.Dtype)
	if err != nil {
		return nil, nil, usagef("Engine.mix_precision.dtype: %v", err)
	}
	need, refuse, err := gpuNeed(cfg, worldSize(world))
	if err != nil {
		return nil, nil, err
	}
	be, err := cuda.New(cuda.Options{Ordinal: gpuOrdinal(), Precision: prec, Log: stderr, Need: need})
	if me := (*cuda.MemoryError)(nil); errors.As(err, &me) {
		return nil, nil, refuse(me)
	}
	if err != nil {
		return nil, nil, usagef("Global.device=gpu: %s; use Global.device=cpu", oneLine(err))
	}
	// A device without bf16 multiplies in fp16 (cuda.PrecisionOn): the
	// engine then scales the loss, as for a config that asks for fp16.
	cfg.Engine.MixPrecision.Dtype = be.Precision().String()
	return be, func() { be.Close() }, nil
}

// fabricEnv names the environment variable that puts the data path of a
// multi-process job on Global.device=cpu on NCCL: GPTUI_FABRIC=nccl. It is
// for tests and diagnosis: the CPU computes, and every operation of the
// engine's communicators goes through NCCL, its buffers staged through
// the memory of a CUDA device (the one a GPU job's rank would use), as a
// GPU job's are, so the same binding, fabric, watchdog and aborts run.
// The tests point GPTUI_CUDA_LIBDIR at a stand-in libcuda.so.1 and
// libnccl.so.2 (package internal/standin) that run it between processes
// on a machine without GPUs; on a GPU machine it runs over NVIDIA's. Unset,
// such a job uses the World's TCP ring; a GPU job always uses NCCL.
const fabricEnv = "GPTUI_FABRIC"

// newFabric returns the data path of a multi-process job over NCCL: NCCL's
// communicators bootstrapped over world, with the World's timeouts (the
// steady one, and the one for making the communicators and their first
// operations), on be's GPU and stream for a GPU job, or, with
// GPTUI_FABRIC=nccl on the CPU, on a stream of its own of this rank's
// device (cuda.Open, gpuOrdinal); release frees that device after the
// fabric is closed. It returns nil for a job of one process, and on the
// CPU without GPTUI_FABRIC=nccl: the engine then uses the World's TCP
// ring. Every rank calls it before making any other group of world.
// Libraries that do not load are a one-line usage error (exit 2).
func newFabric(ctx context.Context, world *comm.World, be kernels.Backend, timeout, initTimeout time.Duration, stdout io.Writer) (f *nccl.Fabric, release func(), err error) {
	release = func() {}
	choice := os.Getenv(fabricEnv)
	if choice != "" && choice != "nccl" {
		return nil, release, usagef("%s=%q: want nccl (a CPU job's data path over NCCL, for tests) or nothing", fabricEnv, choice)
	}
	if world == nil || world.Size() == 1 {
		return nil, release, nil
	}
	gb, gpu := be.(*cuda.Backend)
	if !gpu && choice != "nccl" {
		return nil, release, nil
	}
	what := "Global.device=gpu"
	undo := "use Global.device=cpu"
	if !gpu {
		what, undo = fabricEnv+"=nccl", "unset "+fabricEnv
	}
	lib, err := cuda.LoadNCCL()
	if err != nil {
		return nil, release, usagef("%s: a job of %d processes needs NCCL: %s; %s", what, world.Size(), oneLine(err), undo)
	}
	var d *cuda.Device
	var s cuda.Stream
	if gpu {
		d, s = gb.Device(), gb.Stream()
	} else {
		if d, err = cuda.Open(gpuOrdinal()); err != nil {
			return nil, release, usagef("%s: NCCL stages the CPU's buffers through a CUDA device: %s; %s", what, oneLine(err), undo)
		}
		if s, err = d.NewStream(); err != nil {
			d.Close()
			return nil, release, fmt.Errorf("rank %d: %s: %w", world.Rank(), what, err)
		}
		release = func() {
			d.DestroyStream(s)
			d.Close()
		}
		v := lib.Version()
		fmt.Fprintf(stdout, "[comm] data path: NCCL %d.%d.%d (%s) with CPU compute, staged through device %d (%s) of %s (%s)\n",
			v/10000, v/100%100, v%100, lib.Path(), d.Ordinal(), d.Name(), d.LibraryPath(), what)
	}
	f, err = nccl.New(ctx, world, nccl.Options{Lib: nccl.Real(d, lib), Stream: s, Timeout: timeout, InitTimeout: initTimeout})
	if err != nil {
		release()
		return nil, func() {}, fmt.Errorf("rank %d: joining the job's NCCL communicator: %w", world.Rank(), err)
	}
	return f, release, nil
}

// cpuBackend opens the CPU backend (cpu.Open) and prints its note, if it
// has one, to stderr. A GEMM library that GPTUI_BLAS names but that cannot
// be loaded, and bf16 on a CPU without AVX512_BF16, are one-line usage
// errors (exit 2).
func cpuBackend(opts cpu.Options, stderr io.Writer) (*cpu.Backend, error) {
	be, err := cpu.Open(opts)
	var fe *cpu.FeatureError
	switch {
	case errors.As(err, &fe):
		return nil, usagef("Engine.mix_precision.dtype: bf16 on Global.device=cpu needs a CPU with %s, which this one lacks; use dtype fp32", fe.Feature)
	case err != nil:
		return nil, usagef("%s", oneLine(err))
	}
	if r := be.FallbackReason(); r != "" {
		fmt.Fprintln(stderr, "gptui: "+r)
	}
	return be, nil
}

// gpuOrdinal is the GPU a worker uses: GPTUI_DEVICE (set by the cluster
// runner from the rank table), else LOCAL_RANK, else 0.
func gpuOrdinal() int {
	for _, k := range []string{"GPTUI_DEVICE", "LOCAL_RANK"} {
		if n, err := strconv.Atoi(os.Getenv(k)); err == nil && n >= 0 {
			return n
		}
	}
	return 0
}

func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }

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

// gpuTable collects one row per check.
type gpuTable struct {
	rows   [][3]string // name, result, verdict
	failed int
}

func (t *gpuTable) add(name, result string, ok bool) {
	v := "PASS"
	if !ok {
		v = "FAIL"
		t.failed++
	}
	t.rows = append(t.rows, [3]string{name, result, v})
}

func (t *gpuTable) print(w io.Writer) {
	fmt.Fprintln(w, "\n== summary ==")
	for _, r := range t.rows {
		fmt.Fprintf(w, "%-4s  %-40s %s\n", r[2], r[0], r[1])
	}
}

// gpuCheckPart is one part of 'gpu check', run alone with --only.
type gpuCheckPart struct {
	name string
	run  func(ctx context.Context, w io.Writer, t *gpuTable, steps int)
}

// gpuCheckParts lists the parts of 'gpu check' in the order they run.
func gpuCheckParts() []string {
	var names []string
	for _, p := range checkParts {
		names = append(names, p.name)
	}
	return names
}

// checkParts are the parts of 'gpu check', in order: the device
// self-test, the kernels in fp32 and bf16, the model parity runs, and a
// one-rank job's NCCL data path ('gpu nccl').
var checkParts = []gpuCheckPart{
	{"selftest", checkSelfTest},
	{"kernels-fp32", func(ctx context.Context, w io.Writer, t *gpuTable, _ int) { checkKernels(w, t, cuda.PrecisionFP32) }},
	{"kernels-bf16", func(ctx context.Context, w io.Writer, t *gpuTable, _ int) { checkKernels(w, t, cuda.PrecisionBF16) }},
	{"tiny-fp32", checkTinyFP32},
	{"124m-bf16", check124MBF16},
	{"nccl", func(ctx context.Context, w io.Writer, t *gpuTable, _ int) { gpuNCCL(ctx, w, t) }},
}

// parseParts parses --only: names of checkParts, comma-separated; ""
// is all of them.
func parseParts(only string) ([]string, error) {
	if only == "" {
		return gpuCheckParts(), nil
	}
	var parts []string
	for _, p := range strings.Split(only, ",") {
		p = strings.TrimSpace(p)
		if !slices.Contains(gpuCheckParts(), p) {
			return nil, usagef("gpu check: --only: no part %q; want some of %s", p, strings.Join(gpuCheckParts(), ", "))
		}
		parts = append(parts, p)
	}
	return parts, nil
}

// gpuCheck runs the parts of 'gpu check' named in parts, in their order.
func gpuCheck(ctx context.Context, w io.Writer, t *gpuTable, steps int, parts []string) {
	for _, p := range checkParts {
		if slices.Contains(parts, p.name) {
			p.run(ctx, w, t, steps)
		}
	}
}

func checkSelfTest(ctx context.Context, w io.Writer, t *gpuTable, _ int) {
	fmt.Fprintln(w, "== device self-test ==")
	err := cudacheck.SelfTest(ctx, w)
	t.add("self-test (driver, NVRTC, cuBLAS, NCCL)", errText(err), err == nil)
}

func checkKernels(w io.Writer, t *gpuTable, p cuda.Precision) {
	fmt.Fprintf(w, "== kernels, GEMMs in %s ==\n", p)
	be, err := cuda.New(cuda.Options{Precision: p, Log: w})
	if err != nil {
		t.add("kernels "+p.String(), oneLine(err), false)
		return
	}
	err = gpucheck.CheckBackend(be, w)
	t.add("kernels "+p.String()+" vs CPU", errText(err), err == nil)
	be.Close()
}

func checkTinyFP32(ctx context.Context, w io.Writer, t *gpuTable, steps int) {
	fmt.Fprintln(w, "== model parity: tiny, fp32, vs the CPU backend ==")
	tiny := []string{"Engine.eval_freq=0", "Engine.logging_freq=1", "Model.hidden_dropout_prob=0.1", "Model.attention_probs_dropout_prob=0.1"}
	cpuL, gpuL, err := parityRun(ctx, "tiny", steps, cuda.PrecisionFP32, tiny)
	if err != nil {
		t.add("fp32 loss parity", oneLine(err), false)
		return
	}
	worst := 0.0
	for i := range cpuL {
		worst = max(worst, math.Abs(float64(gpuL[i]-cpuL[i]))/math.Abs(float64(cpuL[i])))
	}
	t.add(fmt.Sprintf("fp32 loss, %d steps (tol 1e-5 rel)", len(cpuL)), fmt.Sprintf("worst %.2e; final %.6f vs %.6f", worst, gpuL[len(gpuL)-1], cpuL[len(cpuL)-1]), worst <= 1e-5)
}

func check124MBF16(ctx context.Context, w io.Writer, t *gpuTable, steps int) {
	fmt.Fprintln(w, "== model parity: gpt2-124m B=4 T=64, bf16, vs fp32 CPU ==")
	small := []string{"Global.global_batch_size=4", "Global.local_batch_size=4", "Global.micro_batch_size=4", "Data.Train.dataset.max_seq_len=64",
		"Engine.eval_freq=0", "Engine.logging_freq=1", "Model.hidden_dropout_prob=0", "Model.attention_probs_dropout_prob=0"}
	cpuL, gpuL, err := parityRun(ctx, "gpt2-124m", steps, cuda.PrecisionBF16, small)
	if err == nil {
		worst := 0.0
		for i := range cpuL {
			worst = max(worst, math.Abs(float64(gpuL[i]-cpuL[i])))
		}
		t.add(fmt.Sprintf("bf16 loss, %d steps (tol 0.05 abs)", len(cpuL)), fmt.Sprintf("worst %.4f; final %.4f vs %.4f", worst, gpuL[len(gpuL)-1], cpuL[len(cpuL)-1]), worst <= 0.05)
	} else {
		t.add("bf16 loss parity", oneLine(err), false)
	}
	fmt.Fprintln(w, "== gradients: gpt2-124m B=4 T=64, bf16, vs fp32 CPU ==")
	err = gradParity(ctx, w, "gpt2-124m", small)
	t.add("bf16 gradients (thr + |ref|·0.079)", errText(err), err == nil)
}

// gpuNCCL runs a one-rank job's NCCL data path on this machine's GPU: the
// fabric of a multi-process GPU job (package comm/nccl) on a World of
// one, its communicators split off the world communicator as the
// engine's are, every operation on each (nccl.Check: device and host
// buffers, the asynchronous all-reduce on the communication stream),
// each result equal to what the CPU computes.
func gpuNCCL(ctx context.Context, w io.Writer, t *gpuTable) {
	fmt.Fprintln(w, "== NCCL fabric, one rank: every operation vs the CPU ==")
	fail := func(what string, err error) { t.add("NCCL fabric "+what, oneLine(err), false) }
	lib, err := cuda.LoadNCCL()
	if err != nil {
		fail("load", err)
		return
	}
	be, err := cuda.New(cuda.Options{Ordinal: gpuOrdinal(), Precision: cuda.PrecisionFP32, Log: w})
	if err != nil {
		fail("backend", err)
		return
	}
	defer be.Close()
	world, err := comm.Connect(ctx, comm.Config{Rank: 0, WorldSize: 1})
	if err != nil {
		fail("world", err)
		return
	}
	defer world.Close()
	f, err := nccl.New(ctx, world, nccl.Options{Lib: nccl.Real(be.Device(), lib), Stream: be.Stream()})
	if err != nil {
		fail("ncclCommInitRank", err)
		return
	}
	defer f.Close()
	names := []string{"dp", "mp", "pp", "tied"}
	cs := make([]comm.Communicator, len(names))
	for i, name := range names {
		if cs[i], err = f.Communicator(name, []int{0}); err != nil {
			fail("declare "+name, err)
			return
		}
	}
	t0 := time.Now()
	if err := f.Ready(ctx); err != nil {
		fail("ncclCommSplit", err)
		return
	}
	t.add(fmt.Sprintf("NCCL fabric: %d splits", len(names)), fmt.Sprintf("%.2f s", time.Since(t0).Seconds()), true)
	for i, c := range cs {
		t0 := time.Now()
		err := nccl.Check(ctx, c, be)
		t.add("NCCL fabric "+names[i]+": every operation", fmt.Sprintf("%s (%.2f s)", errText(err), time.Since(t0).Seconds()), err == nil)
	}
	p := f.Progress()
	t.add("NCCL fabric record", fmt.Sprintf("%d operations done, %d in flight", p.Done, len(p.InFlight)), p.Done > 0 && len(p.InFlight) == 0)
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return oneLine(err)
}

// parityRun trains preset for steps steps on the CPU backend (fp32) and on
// the GPU (GEMMs in prec), on the built-in corpus, and returns both loss
// curves.
func parityRun(ctx context.Context, preset string, steps int, prec cuda.Precision, o []string) (cpuL, gpuL []float32, err error) {
	o = append(o, fmt.Sprintf("Engine.max_steps=%d", steps), "Engine.save_load.save_steps=0", "Data.Train.dataset.input_dir=", "Engine.log_dir="+os.TempDir()+"/gptui-gpu-check")
	load := func() (*presets.Config, error) { return presets.Load(preset, o) }
	return gpucheck.LossParity(ctx, load, engine.Options{Builtin: builtinCorpus}, prec)
}

// gradParity compares one pass's gradients on the GPU in bf16 with the
// CPU's (gpucheck.GradParity) on the built-in corpus.
func gradParity(ctx context.Context, w io.Writer, preset string, o []string) error {
	cfg, err := presets.Load(preset, o)
	if err != nil {
		return err
	}
	toks, err := builtinCorpus()
	if err != nil {
		return err
	}
	return gpucheck.GradParity(ctx, w, cfg, toks)
}

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
