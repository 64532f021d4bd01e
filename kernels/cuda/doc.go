// Package cuda is gptui's GPU backend: the CUDA driver API, NVRTC, cuBLAS,
// cuBLASLt and NCCL bound at run time through purego (so `go build` needs no
// CUDA headers or libraries), the engine's kernels in CUDA C embedded in the
// binary and compiled by NVRTC for the device at first use (cached on disk by
// content hash), and a [kernels.Backend] built on them.
//
// A node without a GPU or without the libraries gets an error saying which
// library was looked for where; the CLI turns it into one line and exit 2.
//
// Files, by concept:
//
//	lib.go        finding libcuda, libnvrtc, libcublas(Lt), libnccl
//	driver.go     the driver API: primary context, memory, streams, launches
//	event.go      ordering streams by events, polling them, device pointers
//	args.go       kernel arguments, packed outside the Go heap
//	nvrtc.go      compiling kernel sources, the on-disk cache
//	cublas.go     GEMMs (cuBLAS, cuBLASLt)
//	gemmrate.go   the measured GEMM rate, the peak of MFU figures
//	nccl.go       the NCCL communicator (comm/nccl builds the fabric on it)
//	kernels/*.cu  the kernel sources, one file per kernel family
//	source.go     the sources as one NVRTC program
//	kernels*.go   Kernels: each kernel's launch geometry and arguments
//	emu/          a CPU emulator of CUDA that runs the sources in tests
//	backend.go    kernels.Backend on the GPU, mixed precision
//	matmul.go     its linear layers: GEMMs, cuBLASLt's epilogues, the
//	              weights' bfloat16 copy
//	activations.go bfloat16 activations behind float32 addresses
//	reserve.go    address ranges with memory mapped behind them
//	cudacheck/    the device self-test (gptui gpu check), apart from the
//	              backend; the checks against the CPU backend and the
//	              engine are package engine/gpucheck
package cuda
