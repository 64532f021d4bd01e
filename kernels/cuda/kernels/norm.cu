// norm.cu: sums reduced on the device into one double — the step's loss,
// the global gradient norm's sum of squares — and the non-finite check of
// fp16 loss scaling.

// sum_partial: partials[b] = Σ x (Σ x² when square) over block b's
// grid-stride share of x (n elements), in double. The grid size is fixed
// by n (launch.go), so with sum_finish the result is the same on every run.
// Launched with 512 threads (kernels.go normThreads).
extern "C" __global__ void __launch_bounds__(512)
    sum_partial(double* __restrict__ partials, const float* __restrict__ x, long long n, int square) {
	double s = 0.0;
	GRID_STRIDE(i, n) {
		double v = x[i];
		s += square ? v * v : v;
	}
	s = block_sum_d(s);
	if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// sum_finish: one block adds the np partials in a fixed order and adds w
// times the total to *out.
extern "C" __global__ void sum_finish(double* __restrict__ out, const double* __restrict__ partials, int np, double w) {
	double s = 0.0;
	for (int i = threadIdx.x; i < np; i += blockDim.x) s += partials[i];
	s = block_sum_d(s);
	if (threadIdx.x == 0) *out += w * s;
}

// non_finite sets *flag to 1 when any of the n elements of x is an
// infinity or NaN (it never clears it). The test is on the exponent bits,
// so fast-math flags cannot optimise it away.
extern "C" __global__ void non_finite(int* flag, const float* __restrict__ x, long long n) {
	bool bad = false;
	GRID_STRIDE(i, n) bad |= (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u;
	if (bad) atomicExch(flag, 1);
}
