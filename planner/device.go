package planner

import (
	"fmt"
	"slices"
	"strings"
)

// Accounting names how a device's memory is counted. Both are gptui's
// engine, as it allocates on the backend that trains on the device.
const (
	// AccountingEngine is gptui's engine on the CPU backend: fp32
	// everywhere, 4 bytes per parameter, 4 per gradient, 8 of AdamW
	// moments, and the activations as the engine allocates them
	// (engine.Memory), its attention keeping the probabilities.
	AccountingEngine = "engine"
	// AccountingEngineGPU is gptui's engine on the CUDA backend: the same
	// fp32 model states and activations, but for the attention, which is
	// flash-style (one log-sum-exp per row and head kept, not the
	// probabilities); beside them the backend's workspaces (cuBLAS, the
	// GEMMs' 16-bit operand buffers) and a reserve for the runtime (the
	// CUDA context, NCCL). Its step time is a roofline of the data
	// sheet's peaks and memory bandwidth.
	AccountingEngineGPU = "engine-gpu"
)

// Device is the profile of one kind of device: what it holds and how fast
// it computes and communicates. Rates are what training achieves, not data
// sheet peaks (except PeakFLOPS, the MFU denominator).
type Device struct {
	Name       string `json:"name"`
	Accounting string `json:"accounting"` // AccountingEngine or AccountingEngineGPU
	// MemBytes is the memory of one device; with SharedNode, of the whole
	// node, divided among its workers.
	MemBytes int64 `json:"mem_bytes"`
	// ReservedBytes is memory a device cannot give to training (runtime
	// context, communication buffers, allocator slack).
	ReservedBytes int64 `json:"reserved_bytes"`
	// PeakFLOPS is the data-sheet dense rate of the 16-bit tensor cores
	// on accelerators (bf16, or fp16 on a V100), the denominator of MFU
	// and the roofline's rate for 16-bit GEMMs; on a CPU it is the node's
	// measured sgemm rate, as the engine's MFU uses.
	PeakFLOPS float64 `json:"peak_flops"`
	// FP32FLOPS is the data-sheet fp32 rate of an accelerator's CUDA cores
	// (no tensor cores, no TF32): the roofline's rate for fp32 GEMMs and
	// for the CUDA backend's attention, which computes in fp32 on them.
	// Zero on a CPU.
	FP32FLOPS float64 `json:"fp32_flops,omitempty"`
	// MemBW is the data-sheet memory bandwidth of an accelerator (bytes/s):
	// the roofline's rate for the bytes each kernel moves. Zero on a CPU.
	MemBW float64 `json:"mem_bw,omitempty"`
	// GEMMFLOPS is the rate large matrix multiplies achieve in training
	// (per device; per node with SharedNode): on a CPU measured; on an
	// accelerator the peak, the roofline's bound.
	GEMMFLOPS float64 `json:"gemm_flops"`
	// GEMMHalfRows is the row count M at which a multiply of M rows runs
	// at half of GEMMFLOPS: a product of M rows runs at
	// GEMMFLOPS·M/(M+GEMMHalfRows). Not used by the roofline.
	GEMMHalfRows float64 `json:"gemm_half_rows"`
	// OptimizerParamsPerS is how many parameters AdamW updates per second
	// (a memory-bound pass; per node with SharedNode): on an accelerator
	// MemBW over the 28 bytes the engine's fp32 AdamW moves a parameter
	// (it reads the parameter, gradient and two moments, writes three).
	OptimizerParamsPerS float64 `json:"optimizer_params_per_s"`
	// ClassifierPerS is how many logits per second the fused softmax
	// cross-entropy (row maxima, exponentials and their sum, the loss and
	// the gradient's rescale) gets through: a pass over B·T·V elements that
	// no GEMM rate accounts for, and the larger part of a step when the
	// vocabulary dwarfs the hidden size (per node with SharedNode). Zero:
	// not counted apart from the GEMMs (CPU profiles measured before it
	// was). Not used on accelerators, whose roofline prices the
	// classifier's kernels by the bytes they move.
	ClassifierPerS float64 `json:"classifier_per_s,omitempty"`
	// IntraBW and InterBW are the all-reduce bus bandwidths in bytes/s
	// inside a node and between nodes.
	IntraBW float64 `json:"intra_bw"`
	InterBW float64 `json:"inter_bw"`
	// InterMeasured describes where a measured InterBW came from (the
	// two nodes and the time); empty when InterBW is the built-in figure,
	// as in every built-in profile and in a CPU profile measured without
	// an inventory (or saved before the link between nodes was measured).
	InterMeasured string `json:"inter_measured,omitempty"`
	// Overlap is the fraction of the data-parallel all-reduce that can
	// hide behind the backward pass (1 on accelerators with their own
	// copy engines; less on CPUs, where communication takes the cores
	// that compute).
	Overlap float64 `json:"overlap"`
	// SharedNode says that the workers of a node share its memory, cores
	// and links: MemBytes, GEMMFLOPS, OptimizerParamsPerS and the
	// bandwidths are the node's, divided among its workers (CPU workers).
	SharedNode bool `json:"shared_node"`
	// Cores is the number of cores of a SharedNode node.
	Cores int `json:"cores,omitempty"`
	// Measured describes where a measured profile came from; empty for a
	// built-in one.
	Measured string `json:"measured,omitempty"`
}

const gib = 1 << 30

// Devices returns the built-in profiles. The accelerator figures are the
// vendors' data sheets (SXM parts): memory, the dense 16-bit tensor-core
// peak, the fp32 rate of the CUDA cores and the memory bandwidth, which
// the roofline of the step time takes as they are:
//
//   - V100-32G: NVIDIA Tesla V100 data sheet (SXM2): 125 TFLOP/s fp16
//     tensor (no bf16), 15.7 TFLOP/s fp32, 900 GB/s HBM2, 32 GB.
//   - A100-40G, A100-80G: NVIDIA A100 Tensor Core GPU data sheet (SXM):
//     312 TFLOP/s bf16 dense (624 with sparsity), 19.5 TFLOP/s fp32,
//     1,555 GB/s (40 GB HBM2) and 2,039 GB/s (80 GB HBM2e).
//   - H100-80G: NVIDIA H100 Tensor Core GPU data sheet (SXM): 989 TFLOP/s
//     bf16 dense (1,979 with sparsity), 67 TFLOP/s fp32, 3.35 TB/s HBM3,
//     80 GB.
//   - H200-141G: NVIDIA H200 Tensor Core GPU data sheet (SXM): 989
//     TFLOP/s bf16 dense (1,979 with sparsity), 67 TFLOP/s fp32, 4.8 TB/s
//     HBM3e, 141 GB.
//
// The bandwidths between devices and the runtime's reserve are typical
// training values (Megatron-LM and NCCL reports). The CPU profile is the
// 2-core CI machine of BENCHMARKS.md; 'gptui plan --profile' measures
// this machine's instead.
func Devices() []Device {
	acc := func(name string, mem int64, peak, fp32, memBW, intra, inter float64) Device {
		return Device{Name: name, Accounting: AccountingEngineGPU, MemBytes: mem, ReservedBytes: gib / 2,
			PeakFLOPS: peak, FP32FLOPS: fp32, MemBW: memBW, GEMMFLOPS: peak, OptimizerParamsPerS: memBW / 28,
			IntraBW: intra, InterBW: inter, Overlap: 1}
	}
	return []Device{
		acc("V100-32G", 32*gib, 125e12, 15.7e12, 900e9, 100e9, 10e9),
		acc("A100-40G", 40*gib, 312e12, 19.5e12, 1555e9, 200e9, 20e9),
		acc("A100-80G", 80*gib, 312e12, 19.5e12, 2039e9, 200e9, 20e9),
		acc("H100-80G", 80*gib, 989e12, 67e12, 3350e9, 350e9, 40e9),
		acc("H200-141G", 141e9, 989e12, 67e12, 4800e9, 350e9, 40e9),
		{Name: "CPU", Accounting: AccountingEngine, MemBytes: 24 * gib, PeakFLOPS: 200e9, GEMMFLOPS: 200e9,
			GEMMHalfRows: 48, ClassifierPerS: 0.8e9, OptimizerParamsPerS: 15.5e9 / 28, IntraBW: 1.5e9, InterBW: 0.1e9, Overlap: 0,
			SharedNode: true, Cores: 2},
	}
}

// LookupDevice returns the built-in profile called name, or the only one
// whose name starts with it, ignoring case: "v100" names V100-32G, "cpu"
// the CPU, while "a100" is ambiguous.
func LookupDevice(name string) (Device, error) {
	want := strings.ToLower(strings.TrimSpace(name))
	var names []string
	var found []Device
	for _, d := range Devices() {
		n := strings.ToLower(d.Name)
		if n == want {
			return d, nil
		}
		if want != "" && strings.HasPrefix(n, want) {
			found = append(found, d)
		}
		names = append(names, d.Name)
	}
	if len(found) == 1 {
		return found[0], nil
	}
	return Device{}, fmt.Errorf("unknown device %q; use one of %s", name, strings.Join(names, ", "))
}

// DefaultProfile is the device profile a plan assumes when nothing names
// one: "cpu" for a config that trains on the CPU; for one on GPUs,
// V100-32G, the seeds' device, unless the config's precision is bf16,
// which a V100 lacks (its GPU backend would fall back to fp16): then
// A100-80G.
func DefaultProfile(device, dtype string) string {
	switch {
	case device == "cpu":
		return "cpu"
	case dtype == "bf16" || dtype == "bfloat16":
		return "A100-80G"
	}
	return "V100-32G"
}

// ProfileForGPU returns the name of the built-in profile for a GPU as
// NVML names it, with its memory: "H100-80G" for an "NVIDIA H100 80GB
// HBM3"; "" for a GPU it does not know.
func ProfileForGPU(name string, memBytes int64) string {
	n := strings.ToUpper(name)
	switch {
	case strings.Contains(n, "H200"):
		return "H200-141G"
	case strings.Contains(n, "H100"):
		return "H100-80G"
	case strings.Contains(n, "A100") && memBytes > 60*gib:
		return "A100-80G"
	case strings.Contains(n, "A100"):
		return "A100-40G"
	case strings.Contains(n, "V100"):
		return "V100-32G"
	}
	return ""
}

// Cluster is the hardware a plan runs on: Nodes nodes of DevicesPerNode
// devices of one kind.
type Cluster struct {
	Nodes          int
	DevicesPerNode int
	Device         Device
}

// Size is the number of devices.
func (c Cluster) Size() int { return c.Nodes * c.DevicesPerNode }

// String describes the cluster, "2 × 8 V100-32G".
func (c Cluster) String() string {
	return fmt.Sprintf("%d node(s) × %d %s", c.Nodes, c.DevicesPerNode, c.Device.Name)
}

// Links describes the bandwidths the plans use and where they come from,
// in one line: "links: 1.14 GB/s inside a node (measured), 0.10 GB/s
// between nodes (built-in, not measured: ...)". A cluster of several nodes
// whose CPU profile has no measured inter-node link says how to measure it.
func (c Cluster) Links() string {
	d := c.Device
	intra, inter := "built-in", "built-in"
	if d.Measured != "" {
		intra = "measured"
	}
	if d.InterMeasured != "" {
		inter = "measured " + d.InterMeasured
	} else if d.Accounting == AccountingEngine && c.Nodes > 1 {
		inter = "built-in, not measured: 'gptui plan --profile --hosts FILE' measures it"
	}
	return fmt.Sprintf("links: %.2f GB/s inside a node (%s), %.2f GB/s between nodes (%s)", d.IntraBW/1e9, intra, d.InterBW/1e9, inter)
}

// Validate reports an impossible cluster or profile.
func (c Cluster) Validate() error {
	d := c.Device
	switch {
	case c.Nodes < 1 || c.DevicesPerNode < 1:
		return fmt.Errorf("cluster of %d node(s) × %d device(s): need at least one of each", c.Nodes, c.DevicesPerNode)
	case !slices.Contains([]string{AccountingEngine, AccountingEngineGPU}, d.Accounting):
		return fmt.Errorf("device %s: accounting %q, want %q or %q", d.Name, d.Accounting, AccountingEngine, AccountingEngineGPU)
	case d.MemBytes <= 0 || d.GEMMFLOPS <= 0 || d.PeakFLOPS <= 0 || d.OptimizerParamsPerS <= 0 || d.IntraBW <= 0 || d.InterBW <= 0:
		return fmt.Errorf("device %s: memory, rates and bandwidths must be positive", d.Name)
	case d.Accounting == AccountingEngineGPU && (d.FP32FLOPS <= 0 || d.MemBW <= 0):
		return fmt.Errorf("device %s: an accelerator's roofline needs fp32_flops and mem_bw", d.Name)
	case d.GEMMHalfRows < 0 || d.ClassifierPerS < 0 || d.Overlap < 0 || d.Overlap > 1:
		return fmt.Errorf("device %s: gemm_half_rows and classifier_per_s must be ≥ 0 and overlap in [0, 1]", d.Name)
	}
	return nil
}

// share is the fraction of a node's resources one worker gets: 1 for a
// device of its own, 1/DevicesPerNode on a SharedNode.
func (c Cluster) share() float64 {
	if c.Device.SharedNode {
		return 1 / float64(c.DevicesPerNode)
	}
	return 1
}

// memPerDevice is the memory of one device (its share of a SharedNode).
func (c Cluster) memPerDevice() int64 {
	return int64(float64(c.Device.MemBytes) * c.share())
}

// bandwidth is the bus bandwidth of a group whose members span span
// consecutive ranks: inside a node when they fit in one.
func (c Cluster) bandwidth(span int) float64 {
	bw := c.Device.IntraBW
	if span > c.DevicesPerNode {
		bw = c.Device.InterBW
	}
	if c.Device.SharedNode {
		// The workers' links share the node's cores: with more workers
		// than cores each link gets a share.
		if c.Device.Cores > 0 && c.DevicesPerNode > c.Device.Cores {
			bw *= float64(c.Device.Cores) / float64(c.DevicesPerNode)
		}
	}
	return bw
}
