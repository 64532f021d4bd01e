// Package cpu is the CPU compute backend of gptui.
//
// A [Backend] provides the single-precision matrix multiply ([Backend.Sgemm])
// that dominates GPT-2 training, a goroutine fork-join helper
// ([Backend.ParallelFor]) that the elementwise and per-layer kernels use, and
// the layer kernels themselves (forward and backward passes written by hand,
// in the style of llm.c).
//
// # Matrix multiply
//
// [New] looks for OpenBLAS at run time and, when it finds it, routes Sgemm to
// its cblas_sgemm through github.com/ebitengine/purego, so the binary needs
// no C toolchain to build and no BLAS to run. When no usable library is found,
// Sgemm falls back to a blocked, multi-threaded pure-Go implementation that
// gives the same results to float32 rounding but is more than an order of
// magnitude slower; [Backend.FallbackReason] says why the fallback was taken.
//
// Two environment variables steer New:
//
//	GPTUI_BLAS=go            use the pure-Go GEMM even when OpenBLAS is installed
//	GPTUI_BLAS=/path/lib.so  load this library (it must export cblas_sgemm)
//	GPTUI_THREADS=n          use n threads instead of runtime.GOMAXPROCS(0)
//
// # Memory layout
//
// All matrices are row-major float32 slices with an explicit row stride
// (leading dimension), as in the CBLAS row-major interface.
package cpu
