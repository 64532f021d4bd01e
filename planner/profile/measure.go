// Package profile measures what the planner's cost model takes as given:
// this machine's compute rates ([MeasureCompute], through a backend) and
// the all-reduce bandwidth of a link between two processes
// ([MeasureLink], [MeasureLocalLink], [LinkPeer]), by running kernels and
// collectives for real. The cost model (package planner) stays a pure
// function of its inputs; 'gptui plan --profile' saves what this package
// measures (planner.SaveProfile), and the launcher measures the link
// between two nodes with LinkPeer on each.
package profile

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/planner"
)

// CPUComputeFraction is the share of a CPU training step's forward and
// backward spent in the matrix multiplies (the rest: GELU, LayerNorm,
// attention's softmax, dropout, residuals), from the engine's per-kernel
// breakdown of a GPT-2 124M step in BENCHMARKS.md: matmuls 1.044 s of
// 1.358 s without the optimizer, the gradient norm and the cross-entropy,
// which the model counts apart. A measured CPU profile's GEMMFLOPS is the
// sgemm rate times this, so that the model's GEMM FLOPs at that rate give
// the time of everything but the classifier's softmax.
const CPUComputeFraction = 0.77

// Rows of the two products MeasureCompute times (with 1024 columns and
// inner dimension), to fit Device.GEMMHalfRows.
const (
	bigRows   = 2048
	smallRows = 64
)

// MeasureCompute measures this machine's CPU profile through be: the
// sgemm rate of a 2048×1024×1024 product and of a 64-row one (to fit how
// the rate falls for small micro-batches), the softmax cross-entropy's rate
// over the logits, and the AdamW update rate over buffers larger than the
// caches. It starts from the built-in CPU profile, so the link bandwidths
// are those until MeasureLink's result is set.
func MeasureCompute(be kernels.Backend, cores int, memBytes int64) planner.Device {
	d, _ := planner.LookupDevice("CPU")
	big := sgemmRate(be, bigRows)
	small := sgemmRate(be, smallRows)
	q := small / big
	half := 0.0
	if q < 1 && q*bigRows > smallRows {
		half = smallRows * bigRows * (1 - q) / (q*bigRows - smallRows)
	}
	d.PeakFLOPS = big * (bigRows + half) / bigRows
	d.GEMMFLOPS = d.PeakFLOPS * CPUComputeFraction
	d.GEMMHalfRows = half
	d.OptimizerParamsPerS = adamRate(be)
	d.ClassifierPerS = classifierRate(be)
	if cores > 0 {
		d.Cores = cores
	}
	if memBytes > 0 {
		d.MemBytes = memBytes
	}
	d.Measured = fmt.Sprintf("%s on %s", time.Now().UTC().Format(time.RFC3339), be.Name())
	return d
}

// sgemmRate is the median rate of rows×1024×1024 products, in FLOP/s: six
// rounds after a warm-up, each round 8.6 GFLOP (two products of 2048
// rows, or 64 of 64 rows), 25-50 ms on two cores.
func sgemmRate(be kernels.Backend, rows int) float64 {
	const n = 1024
	a := make([]float32, rows*n)
	b := make([]float32, n*n)
	c := make([]float32, rows*n)
	for i := range a {
		a[i] = float32(i%13)*0.01 - 0.06
	}
	for i := range b {
		b[i] = float32(i%7)*0.01 - 0.03
	}
	reps := max(1, 4096/rows) // the same work for both sizes
	var rates []float64
	for r := range 7 {
		start := time.Now()
		for range reps {
			be.Sgemm(false, false, rows, n, n, 1, a, n, b, n, 0, c, n)
		}
		if r > 0 { // the first is a warm-up
			rates = append(rates, 2*float64(rows)*n*n*float64(reps)/time.Since(start).Seconds())
		}
	}
	return median(rates)
}

// adamRate is the median rate of AdamW updates over 8 M parameters, in
// parameters per second.
func adamRate(be kernels.Backend) float64 {
	const n = 8 << 20
	p, g, m, v := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range g {
		g[i] = float32(i%11)*1e-3 - 5e-3
	}
	var rates []float64
	for step := 1; step <= 6; step++ {
		start := time.Now()
		be.AdamW(p, g, m, v, 1e-4, 0.9, 0.999, 1e-8, 0.01, 1, step)
		if step > 1 {
			rates = append(rates, n/time.Since(start).Seconds())
		}
	}
	return median(rates)
}

// classifierRate is the median rate of the fused softmax cross-entropy
// with its gradient over 64 rows of GPT-2's vocabulary, in logits per
// second.
func classifierRate(be kernels.Backend) float64 {
	const n, v = 64, 50304
	src := make([]float32, n*v)
	for i := range src {
		src[i] = float32(i%101)*0.05 - 2.5
	}
	logits := make([]float32, n*v)
	losses := make([]float32, n)
	targets := make([]int32, n)
	for i := range targets {
		targets[i] = int32(i * 787 % v)
	}
	var rates []float64
	for r := range 7 {
		copy(logits, src)
		start := time.Now()
		be.CrossEntropy(losses, logits, targets, n, v, v, 1.0/n, true)
		if r > 0 { // the first is a warm-up
			rates = append(rates, n*v/time.Since(start).Seconds())
		}
	}
	return median(rates)
}

func median(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	return s[len(s)/2]
}

// LinkBytes is the all-reduce buffer MeasureLink times.
const LinkBytes = 32 << 20

// MeasureLink measures the all-reduce bus bandwidth of g in bytes/s,
// 2(n−1)/n · bytes / time, as the median of 5 all-reduces of 32 MiB after
// one warm-up. Every member of g calls it; they get the same figure.
func MeasureLink(ctx context.Context, g *comm.Group) (float64, error) {
	buf := make([]float32, LinkBytes/4)
	n := float64(g.Size())
	var rates []float64
	for i := range 6 {
		start := time.Now()
		if err := g.AllReduce(ctx, buf); err != nil {
			return 0, fmt.Errorf("profile: measuring the link: %w", err)
		}
		if i > 0 {
			rates = append(rates, 2*(n-1)/n*LinkBytes/time.Since(start).Seconds())
		}
	}
	// Everyone reports rank 0's figure, so that both ends agree.
	r := []float64{median(rates)}
	if g.Rank() != 0 {
		r[0] = 0
	}
	if err := g.AllReduce64(ctx, r); err != nil {
		return 0, fmt.Errorf("profile: measuring the link: %w", err)
	}
	return r[0], nil
}
