package cuda

import (
	"context"
	"strings"
	"unicode"
)

// gpuPeak is one GPU's data-sheet dense peaks, the denominators of MFU.
type gpuPeak struct {
	gpu          string   // the GPU, as the data sheet names it
	all          []string // words its device name has (upper case)
	none         []string // words it must not have: another product's
	major, minor int      // its compute capability
	// Dense (no sparsity) tensor rates with fp32 accumulation, the GEMMs
	// of PrecisionBF16 and PrecisionFP16, and the IEEE fp32 rate (no
	// TF32) of PrecisionFP32, in FLOP/s; 0 where the GPU has none.
	bf16, fp16, fp32 float64
}

// gpuPeaks are NVIDIA's data-sheet figures (and the architecture white
// papers' for the GeForce card), by the device names cuDeviceGetName
// gives: "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA
// GeForce RTX 4090", "Tesla V100-SXM2-16GB". A more specific entry comes
// before a less specific one. Left out, so measured: the H100 NVL and H200
// NVL (lower clocks), the A10G, the RTX 4090 D, laptop parts, and any MIG
// slice (a fraction of the GPU).
var gpuPeaks = []gpuPeak{
	{gpu: "H100 PCIe", all: []string{"H100", "PCIE"}, major: 9, bf16: 756e12, fp16: 756e12, fp32: 51.2e12},
	{gpu: "H100 SXM", all: []string{"H100"}, none: []string{"PCIE", "NVL"}, major: 9, bf16: 989.4e12, fp16: 989.4e12, fp32: 66.9e12},
	{gpu: "H200", all: []string{"H200"}, none: []string{"NVL"}, major: 9, bf16: 989.4e12, fp16: 989.4e12, fp32: 66.9e12},
	{gpu: "A100", all: []string{"A100"}, major: 8, bf16: 312e12, fp16: 312e12, fp32: 19.5e12},
	{gpu: "L40S", all: []string{"L40S"}, major: 8, minor: 9, bf16: 362.05e12, fp16: 362.05e12, fp32: 91.6e12},
	{gpu: "L4", all: []string{"L4"}, major: 8, minor: 9, bf16: 121e12, fp16: 121e12, fp32: 30.3e12},
	{gpu: "A10", all: []string{"A10"}, major: 8, minor: 6, bf16: 125e12, fp16: 125e12, fp32: 31.2e12},
	{gpu: "RTX 4090", all: []string{"RTX", "4090"}, none: []string{"D", "LAPTOP"}, major: 8, minor: 9, bf16: 165.2e12, fp16: 165.2e12, fp32: 82.6e12},
	{gpu: "V100S PCIe", all: []string{"V100S"}, major: 7, fp16: 130e12, fp32: 16.4e12},
	{gpu: "V100 PCIe", all: []string{"V100", "PCIE"}, major: 7, fp16: 112e12, fp32: 14e12},
	{gpu: "V100 SXM", all: []string{"V100"}, major: 7, fp16: 125e12, fp32: 15.7e12},
}

// nameWords splits a device name into its upper-case words, at anything
// not a letter or digit: "NVIDIA A100-SXM4-80GB" is NVIDIA, A100, SXM4,
// 80GB.
func nameWords(name string) []string {
	return strings.FieldsFunc(strings.ToUpper(name), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	})
}

// KnownPeak returns the data-sheet dense peak, in FLOP/s, of GEMMs in
// precision p on the GPU called name (as [Device.Name] gives it) with
// compute capability major.minor, and the GPU's name in the table; ok is
// false for a GPU the table does not hold, one whose compute capability
// is not the table's, a MIG slice, and a precision the GPU has no tensor
// rate for (bf16 on a V100).
func KnownPeak(name string, major, minor int, p Precision) (flops float64, gpu string, ok bool) {
	words := nameWords(name)
	has := func(w string) bool {
		for _, x := range words {
			if x == w {
				return true
			}
		}
		return false
	}
	if has("MIG") {
		return 0, "", false
	}
next:
	for _, e := range gpuPeaks {
		for _, w := range e.all {
			if !has(w) {
				continue next
			}
		}
		for _, w := range e.none {
			if has(w) {
				continue next
			}
		}
		if e.major != major || e.minor != minor {
			return 0, "", false
		}
		switch p {
		case PrecisionBF16:
			flops = e.bf16
		case PrecisionFP16:
			flops = e.fp16
		default:
			flops = e.fp32
		}
		return flops, e.gpu, flops > 0
	}
	return 0, "", false
}

// PeakFLOPS is what MFU is measured against: the data-sheet dense rate of
// GEMMs in the backend's precision on a GPU [KnownPeak] knows, else the
// measured rate of a large cuBLAS GEMM (once, on first call). The
// measurement is a side figure and never ends a run: with too little free
// memory, or on any failure, PeakFLOPS is 0 (the engine then shows the
// MFU as unknown) and the backend records no error.
func (b *Backend) PeakFLOPS() float64 {
	b.peakOnce.Do(func() {
		major, minor := b.dev.Arch()
		if f, _, ok := KnownPeak(b.dev.Name(), major, minor, b.prec); ok {
			b.peak = f
			return
		}
		b.peak = b.measurePeak()
	})
	return b.peak
}

// measurePeak times an n³ GEMM in the backend's precision (n = 8192, 4096
// in fp32) with [MeasureGemm], when the device has twice its three
// operands free, so that the training that follows keeps its memory. It
// returns 0 where it cannot, and records nothing in the backend.
func (b *Backend) measurePeak() float64 {
	if !b.ok() {
		return 0
	}
	n := 8192
	if b.prec == PrecisionFP32 {
		n = 4096
	}
	t := b.prec.dataType()
	free, _, err := b.dev.MemInfo()
	if err != nil || free < int64(2*3*n*n*t.Size()) {
		return 0
	}
	f, err := MeasureGemm(context.Background(), b.dev, b.blas, t, n)
	if err != nil || !(f > 0) {
		return 0
	}
	return f
}
