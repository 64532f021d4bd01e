package cuda

import "testing"

// TestKnownPeak: the data-sheet dense peak of each GPU in the table, by
// the name cuDeviceGetName gives, for the training dtype; no figure for a
// GPU the table lacks, a compute capability that is not the GPU's, a MIG
// slice, or bf16 on a V100.
func TestKnownPeak(t *testing.T) {
	for _, tc := range []struct {
		name         string
		major, minor int
		prec         Precision
		want         float64 // 0: not known
		gpu          string
	}{
		{"NVIDIA H100 80GB HBM3", 9, 0, PrecisionBF16, 989.4e12, "H100 SXM"},
		{"NVIDIA H100 80GB HBM3", 9, 0, PrecisionFP16, 989.4e12, "H100 SXM"},
		{"NVIDIA H100 80GB HBM3", 9, 0, PrecisionFP32, 66.9e12, "H100 SXM"},
		{"NVIDIA H100 PCIe", 9, 0, PrecisionBF16, 756e12, "H100 PCIe"},
		{"NVIDIA H200", 9, 0, PrecisionBF16, 989.4e12, "H200"},
		{"NVIDIA A100-SXM4-80GB", 8, 0, PrecisionBF16, 312e12, "A100"},
		{"NVIDIA A100-PCIE-40GB", 8, 0, PrecisionFP16, 312e12, "A100"},
		{"NVIDIA A100 80GB PCIe", 8, 0, PrecisionFP32, 19.5e12, "A100"},
		{"NVIDIA L40S", 8, 9, PrecisionBF16, 362.05e12, "L40S"},
		{"NVIDIA L4", 8, 9, PrecisionBF16, 121e12, "L4"},
		{"NVIDIA A10", 8, 6, PrecisionBF16, 125e12, "A10"},
		{"NVIDIA GeForce RTX 4090", 8, 9, PrecisionBF16, 165.2e12, "RTX 4090"},
		{"NVIDIA GeForce RTX 4090", 8, 9, PrecisionFP16, 165.2e12, "RTX 4090"},
		{"Tesla V100-SXM2-16GB", 7, 0, PrecisionFP16, 125e12, "V100 SXM"},
		{"Tesla V100-SXM2-32GB", 7, 0, PrecisionFP32, 15.7e12, "V100 SXM"},
		{"Tesla V100-PCIE-32GB", 7, 0, PrecisionFP16, 112e12, "V100 PCIe"},
		{"Tesla V100S-PCIE-32GB", 7, 0, PrecisionFP16, 130e12, "V100S PCIe"},
		{"Tesla V100-SXM2-16GB", 7, 0, PrecisionBF16, 0, ""}, // no bf16 tensor cores
		{"NVIDIA H100 NVL", 9, 0, PrecisionBF16, 0, ""},      // not in the table: measured
		{"NVIDIA H200 NVL", 9, 0, PrecisionBF16, 0, ""},
		{"NVIDIA A10G", 8, 6, PrecisionBF16, 0, ""},
		{"NVIDIA L40", 8, 9, PrecisionBF16, 0, ""},
		{"NVIDIA GeForce RTX 4090 D", 8, 9, PrecisionBF16, 0, ""},
		{"NVIDIA GeForce RTX 4090 Laptop GPU", 8, 9, PrecisionBF16, 0, ""},
		{"NVIDIA A100-SXM4-40GB MIG 1g.5gb", 8, 0, PrecisionBF16, 0, ""},
		{"NVIDIA H100 80GB HBM3", 8, 0, PrecisionBF16, 0, ""}, // not an H100's compute capability
		{"NVIDIA B200", 10, 0, PrecisionBF16, 0, ""},
		{"", 0, 0, PrecisionBF16, 0, ""},
	} {
		got, gpu, ok := KnownPeak(tc.name, tc.major, tc.minor, tc.prec)
		if got != tc.want || gpu != tc.gpu && ok || ok != (tc.want > 0) {
			t.Errorf("KnownPeak(%q, sm_%d%d, %s) = %g, %q, %v; want %g, %q", tc.name, tc.major, tc.minor, tc.prec, got, gpu, ok, tc.want, tc.gpu)
		}
	}
}

// TestPeakFLOPSOnGPU, where there is a GPU: PeakFLOPS is the table's
// figure for a GPU it knows, and the measurement behind it, on a device
// whose memory is taken, gives 0 and leaves the backend without an error,
// so training goes on; with the memory back it measures a rate.
func TestPeakFLOPSOnGPU(t *testing.T) {
	if n, err := DeviceCount(); err != nil || n == 0 {
		t.Skip("no GPU here")
	}
	b, err := New(Options{Precision: PrecisionBF16})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	major, minor := b.dev.Arch()
	want, gpu, known := KnownPeak(b.dev.Name(), major, minor, PrecisionBF16)
	got := b.PeakFLOPS()
	t.Logf("%s (sm_%d%d): PeakFLOPS %.1f TFLOP/s (table: %q %.1f)", b.dev.Name(), major, minor, got/1e12, gpu, want/1e12)
	if known && got != want {
		t.Errorf("PeakFLOPS = %g, want the table's %g", got, want)
	}

	free, _, err := b.dev.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	hog, err := b.dev.Alloc(int(free - 256<<20)) // leaves less than a measurement needs
	if err != nil {
		t.Fatalf("taking the free memory: %v", err)
	}
	if f := b.measurePeak(); f != 0 {
		t.Errorf("measurePeak with 256 MiB free = %g, want 0", f)
	}
	if err := b.Err(); err != nil {
		t.Errorf("a measurement that could not run left the backend failed: %v", err)
	}
	if err := b.dev.Free(hog); err != nil {
		t.Fatal(err)
	}
	f := b.measurePeak()
	t.Logf("measured bf16 8192³: %.1f TFLOP/s", f/1e12)
	if f <= 0 || b.Err() != nil {
		t.Errorf("measurePeak = %g (%v), want a rate", f, b.Err())
	}
}
