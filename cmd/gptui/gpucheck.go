package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/comm/nccl"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/engine/gpucheck"
	"github.com/gptui/gptui/kernels/cuda"
	"github.com/gptui/gptui/kernels/cuda/cudacheck"
	"github.com/gptui/gptui/presets"
)

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
