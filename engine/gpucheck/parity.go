package gpucheck

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/kernels/cuda"
	"github.com/gptui/gptui/presets"
)

// LossParity trains the config that load returns (a fresh one per run,
// Engine.max_steps steps) on the CPU backend in fp32 and on the GPU with
// GEMMs in prec, from the same initialisation and data (opts, the
// built-in corpus among them), and returns both loss curves, one value per
// step.
func LossParity(ctx context.Context, load func() (*presets.Config, error), opts engine.Options, prec cuda.Precision) (cpuL, gpuL []float32, err error) {
	run := func(be kernels.Backend) ([]float32, error) {
		cfg, err := load()
		if err != nil {
			return nil, err
		}
		tr, err := engine.NewTrainer(cfg, be, opts)
		if err != nil {
			return nil, err
		}
		res, err := tr.Run(ctx)
		if err != nil {
			return nil, err
		}
		return res.Losses, nil
	}
	if cpuL, err = run(cpu.New()); err != nil {
		return nil, nil, fmt.Errorf("cpu: %w", err)
	}
	g, err := cuda.New(cuda.Options{Precision: prec})
	if err != nil {
		return nil, nil, err
	}
	defer g.Close()
	if gpuL, err = run(g); err != nil {
		return nil, nil, fmt.Errorf("gpu: %w", err)
	}
	if len(gpuL) != len(cpuL) {
		return nil, nil, fmt.Errorf("%d GPU steps, %d CPU steps", len(gpuL), len(cpuL))
	}
	return cpuL, gpuL, nil
}

// GradParity compares the gradients of one forward and backward pass of
// cfg's model on the GPU in bf16 with the CPU's fp32 ones, on the first
// micro-batch of toks, tensor by tensor, as llm.c's test_gpt2.cu does:
// every element within thr + |ref|·0.079 (bf16's epsilon bound), thr being
// 5% of the tensor's largest reference gradient. It writes a line per
// tensor to w and returns an error naming the tensors out of tolerance.
func GradParity(ctx context.Context, w io.Writer, cfg *presets.Config, toks []uint16) error {
	mc := engine.ShapeOf(cfg)
	B, T := cfg.Global.MicroBatchSize, cfg.Data.Train.Dataset.MaxSeqLen
	if len(toks) < B*T+1 {
		return fmt.Errorf("%d tokens: a (%d,%d) batch needs %d", len(toks), B, T, B*T+1)
	}
	inputs, targets := make([]int32, B*T), make([]int32, B*T)
	for i := range inputs {
		inputs[i], targets[i] = int32(toks[i]), int32(toks[i+1])
	}
	grads := func(be kernels.Backend) ([]float32, []engine.Tensor, float32, error) {
		m, err := engine.NewModel(be, mc, cfg.Model.InitializerRange, uint64(cfg.Global.Seed))
		if err != nil {
			return nil, nil, 0, err
		}
		m.ZeroGrad()
		loss, err := m.Forward(ctx, inputs, targets, B, T, engine.DropoutKey{}, 1/float32(B*T))
		if err != nil {
			return nil, nil, 0, err
		}
		if err := m.Backward(ctx, engine.DropoutKey{}, nil); err != nil {
			return nil, nil, 0, err
		}
		g := make([]float32, len(m.Grads)) // the host reads a GPU's buffer only through Download
		if err := kernels.Download(be, g, m.Grads); err != nil {
			return nil, nil, 0, err
		}
		return g, m.Tensors, loss, nil
	}
	ref, ts, lref, err := grads(cpu.New())
	if err != nil {
		return err
	}
	g, err := cuda.New(cuda.Options{Precision: cuda.PrecisionBF16})
	if err != nil {
		return err
	}
	defer g.Close()
	got, _, lgot, err := grads(g)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "loss: gpu %.6f cpu %.6f\n", lgot, lref)
	epilogues(w, g)
	var bad []string
	for _, t := range ts {
		r, x := ref[t.Offset:t.Offset+t.Size], got[t.Offset:t.Offset+t.Size]
		var mx float64
		for _, v := range r {
			mx = max(mx, math.Abs(float64(v)))
		}
		thr := 0.05 * mx
		worst, faults := 0.0, 0
		for i := range r {
			d := math.Abs(float64(x[i] - r[i]))
			eff := thr + math.Abs(float64(r[i]))*0.079
			worst = max(worst, d/eff)
			if !(d <= eff) {
				faults++
			}
		}
		v := "ok"
		if faults > 0 {
			v = "NOT OK"
			bad = append(bad, t.Name)
		}
		fmt.Fprintf(w, "  %-10s %s: thr %.2e, max diff/allowed %.3f, faults %d of %d\n", t.Name, v, thr, worst, faults, len(r))
	}
	if len(bad) > 0 {
		return fmt.Errorf("gradients out of tolerance: %s", strings.Join(bad, ", "))
	}
	return nil
}

// epilogues says which of cuBLASLt's epilogues the GEMMs into bfloat16
// activations ran, and which the backend's own kernels stood in for.
func epilogues(w io.Writer, g *cuda.Backend) {
	for _, e := range []struct {
		ep        cuda.Epilogue
		what, own string
	}{
		{cuda.EpilogueBias, "the bias of qkv and fc", "bias_store"},
		{cuda.EpilogueGeluAuxBias, "fc's GELU", "bias_gelu_store"},
		{cuda.EpilogueDGelu, "GELU's backward in fcproj's input gradient", "gelu_backward"},
	} {
		if err := g.EpilogueRefused(e.ep); err != nil {
			fmt.Fprintf(w, "%s: the backend's own kernel (float32 product, %s); cuBLASLt's %s epilogue refused: %v\n", e.what, e.own, e.ep, err)
		} else {
			fmt.Fprintf(w, "%s: cuBLASLt's %s epilogue\n", e.what, e.ep)
		}
	}
}
