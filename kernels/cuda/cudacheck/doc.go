// Package cudacheck is the self-test of gptui's GPU backend (package cuda)
// on this machine's GPU, for 'gptui gpu check': SelfTest exercises the
// bindings one by one — the device and driver, memory, NVRTC and the
// compile cache, a kernel launch with every argument type, event timing,
// cuBLAS and cuBLASLt GEMMs against a host reference, NCCL on one rank,
// the measured GEMM rate — printing one line per check and going on after
// a failure. It depends on package cuda (and half, for the 16-bit GEMMs'
// operands) alone: the checks against the CPU backend and the engine are
// package engine/gpucheck.
package cudacheck
