// Package gpucheck checks gptui's GPU backend (package kernels/cuda)
// against the CPU backend and the engine, on this machine's GPU, for
// 'gptui gpu check':
//
//	check.go     CheckBackend: every kernels.Backend method on the GPU
//	             against the CPU backend, with the same inputs
//	parity.go    LossParity and GradParity: the whole model, trained on the
//	             GPU and on the CPU from the same start, losses and
//	             gradients compared
//
// Each prints one line per check, goes on after a failure, and returns an
// error naming the checks that failed. It lives above both backends and
// the engine, which carry none of it; the device's own self-test, which
// needs neither the CPU backend nor the engine, is kernels/cuda/cudacheck.
// Without a GPU, as in CI, package cuda's tests run the same kernel
// sources under its emulator (cuda/emu), and this package's tests run
// CheckBackend and LossParity on a stand-in GPU: cuda.New over the
// stand-in libraries of internal/standin, whose driver runs those
// sources, compiled by the emulator, for every launch the backend makes.
package gpucheck
