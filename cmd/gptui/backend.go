package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/comm/nccl"
	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/kernels/cuda"
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
	opts := nccl.Options{Lib: nccl.Real(d, lib), Stream: s, Timeout: timeout, InitTimeout: initTimeout}
	if gpu {
		opts.Halves = gb.Half
	}
	f, err = nccl.New(ctx, world, opts)
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
