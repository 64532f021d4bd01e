// classifier.cu: softmax, cross-entropy and its gradient over the vocabulary
// (kernels/cpu/classifier.go), one block per row of logits. Row sums of
// exponentials are double, as on the CPU; exponentials are exp32's.
//
// Logits are (N,ld) with row stride ld ≥ V: the first V columns of each row
// are the real vocabulary, the other ld − V padding (llm.c's Vp). The
// padding enters no maximum and no sum; with the gradient it is written 0,
// so that the head's GEMM backward adds nothing through it.

// cross_entropy is the fused classifier: losses[r] = −log softmax(row)[t]
// and, when grad, the row overwritten with dscale·(softmax − onehot(t)).
// Three passes over the row: max, Σ exp, and the gradient. A target
// outside [0, V) (padding included) is read nowhere: as in kernels/cpu's vocabulary-parallel
// classifier (ClassifierExp, ClassifierFinish) for a target no rank's
// columns hold, its logit counts as 0 and the gradient has no one-hot.
// Launched with 512 threads (kernels.go clsThreads), as are the three
// kernels of the vocabulary-parallel classifier below. In all four, bf
// says whether the logits are bfloat16 (bit 0).
extern "C" __global__ void __launch_bounds__(512)
    cross_entropy(float* __restrict__ losses, void* __restrict__ logits, const int* __restrict__ targets, int N, int V,
                  int ld, float dscale, int grad, int bf) {
	int r = blockIdx.x;
	long long x = (long long)r * ld; // the row's first element
	int t = targets[r], lb = bf & 1;
	float xt = (t >= 0 && t < V) ? ldx(logits, x + t, lb) : 0.0f; // before any thread overwrites it
	// bf16 rows that start 16-byte aligned are read and written eight
	// columns at a time up to V8; the columns from V8 on one at a time.
	const bf16_t* row = (const bf16_t*)logits + x;
	const int V8 = lb && ((unsigned long long)row & 15) == 0 ? V & ~7 : 0;
	float mx = -__int_as_float(0x7f800000);
	for (int i = 8 * threadIdx.x; i < V8; i += 8 * blockDim.x) {
		float v[8];
		ld8(v, row + i);
#pragma unroll
		for (int k = 0; k < 8; k++) mx = fmaxf(mx, v[k]);
	}
	for (int i = V8 + threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, ldx(logits, x + i, lb));
	mx = block_max(mx);
	double s = 0.0;
	for (int i = 8 * threadIdx.x; i < V8; i += 8 * blockDim.x) {
		float v[8];
		ld8(v, row + i);
#pragma unroll
		for (int k = 0; k < 8; k++) s += (double)exp32(v[k] - mx);
	}
	for (int i = V8 + threadIdx.x; i < V; i += blockDim.x) s += (double)exp32(ldx(logits, x + i, lb) - mx);
	s = block_sum_d(s);
	if (threadIdx.x == 0) losses[r] = (float)((double)mx + log(s) - (double)xt);
	if (!grad) return;
	float sc = dscale * (float)(1.0 / s);
	for (int i = 8 * threadIdx.x; i < V8; i += 8 * blockDim.x) {
		float v[8];
		ld8(v, row + i);
#pragma unroll
		for (int k = 0; k < 8; k++) {
			v[k] = exp32(v[k] - mx) * sc;
			if (i + k == t) v[k] -= dscale;
		}
		st8((bf16_t*)logits + x + i, v);
	}
	for (int i = V8 + threadIdx.x; i < V; i += blockDim.x) {
		float g = exp32(ldx(logits, x + i, lb) - mx) * sc;
		if (i == t) g -= dscale;
		stx(logits, x + i, g, lb);
	}
	for (int i = V + threadIdx.x; i < ld; i += blockDim.x) stx(logits, x + i, 0.0f, lb);
}

// The vocabulary-parallel classifier in three kernels; each rank holds ld
// columns, the first V real (global ids vlo … vlo+V−1, V may be 0) and the
// rest padding, and the caller reduces maxes and stats over the ranks
// between them.

// classifier_max: maxes[r] = max of row r's real columns (−∞ for V = 0).
extern "C" __global__ void __launch_bounds__(512)
    classifier_max(float* __restrict__ maxes, const void* __restrict__ logits, int N, int V, int ld, int bf) {
	int r = blockIdx.x;
	long long x = (long long)r * ld;
	float mx = -__int_as_float(0x7f800000);
	for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, ldx(logits, x + i, bf & 1));
	mx = block_max(mx);
	if (threadIdx.x == 0) maxes[r] = mx;
}

// classifier_global_max: maxes[r] = the largest of the MP ranks' row
// maxima gmax[k·n + r] (gmax (MP,n), all-gathered), the earliest rank's on
// ties. Elementwise over the n rows; vec is unused.
extern "C" __global__ void classifier_global_max(float* __restrict__ maxes, const float* __restrict__ gmax, long long n,
                                                 int mp, int vec) {
	GRID_STRIDE(r, n) {
		float m = gmax[r];
		for (int k = 1; k < mp; k++) {
			float x = gmax[k * n + r];
			if (x > m) m = x;
		}
		maxes[r] = m;
	}
}

// classifier_exp: stats[2r] = Σ e^(row − maxes[r]) over the real columns
// (double), stats[2r+1] = the target's logit if this rank holds it, else 0.
// The logits are only read: classifier_finish exponentiates them again.
extern "C" __global__ void __launch_bounds__(512)
    classifier_exp(double* __restrict__ stats, const void* __restrict__ logits, const int* __restrict__ targets,
                   const float* __restrict__ maxes, int N, int V, int ld, int vlo, int bf) {
	int r = blockIdx.x;
	long long x = (long long)r * ld;
	int t = targets[r] - vlo, lb = bf & 1;
	double xt = (t >= 0 && t < V) ? (double)ldx(logits, x + t, lb) : 0.0;
	float mx = maxes[r];
	double s = 0.0;
	for (int i = threadIdx.x; i < V; i += blockDim.x) s += (double)exp32(ldx(logits, x + i, lb) - mx);
	s = block_sum_d(s);
	if (threadIdx.x == 0) {
		stats[2 * (long long)r] = s;
		stats[2 * (long long)r + 1] = xt;
	}
}

// classifier_finish: losses[r] = max + log Σ − target logit from the summed
// stats and, when grad, real columns ← dscale·(e^(x−max)/Σ − onehot(target))
// and the padding ← 0.
extern "C" __global__ void __launch_bounds__(512)
    classifier_finish(float* __restrict__ losses, void* __restrict__ logits, const int* __restrict__ targets,
                      const float* __restrict__ maxes, const double* __restrict__ stats, int N, int V, int ld, int vlo,
                      float dscale, int grad, int bf) {
	int r = blockIdx.x;
	double s = stats[2 * (long long)r];
	if (threadIdx.x == 0) losses[r] = (float)((double)maxes[r] + log(s) - stats[2 * (long long)r + 1]);
	if (!grad) return;
	long long x = (long long)r * ld;
	int t = targets[r] - vlo, lb = bf & 1;
	float sc = dscale * (float)(1.0 / s), mx = maxes[r];
	for (int i = threadIdx.x; i < V; i += blockDim.x) {
		float g = exp32(ldx(logits, x + i, lb) - mx) * sc;
		if (i == t) g -= dscale;
		stx(logits, x + i, g, lb);
	}
	for (int i = V + threadIdx.x; i < ld; i += blockDim.x) stx(logits, x + i, 0.0f, lb);
}
