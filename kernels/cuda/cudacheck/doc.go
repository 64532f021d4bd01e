// Package cudacheck checks gptui's GPU backend (package cuda) on this
// machine's GPU, for 'gptui gpu check'.
//
//	selftest.go  SelfTest: the bindings one by one: the device and driver,
//	             memory, NVRTC and the compile cache, a kernel launch with
//	             every argument type, event timing, cuBLAS and cuBLASLt
//	             GEMMs against a host reference, NCCL on one rank, the
//	             measured GEMM rate
//	check.go     CheckBackend: every kernels.Backend method on the GPU
//	             against the CPU backend, with the same inputs
//	parity.go    LossParity and GradParity: the whole model, trained on the
//	             GPU and on the CPU from the same start, losses and
//	             gradients compared
//
// Each prints one line per check, go on after a failure, and return an
// error naming the checks that failed. They live apart from the backend,
// which carries none of them (nor the CPU backend they compare against).
// Without a GPU, as in CI, package cuda's tests run the same kernel
// sources under its emulator (cuda/emu).
package cudacheck
