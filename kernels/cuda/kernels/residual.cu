// residual.cu: elementwise sums and scaling (kernels/cpu/residual.go).

// residual_forward: out = a + b, n elements; out may alias a or b.
extern "C" __global__ void residual_forward(float* out, const float* a, const float* b, long long n, int vec) {
	long long n4 = vec ? n / 4 : 0;
	GRID_STRIDE(i, n4) {
		float4 x = ((const float4*)a)[i], y = ((const float4*)b)[i];
		x.x += y.x;
		x.y += y.y;
		x.z += y.z;
		x.w += y.w;
		((float4*)out)[i] = x;
	}
	GRID_STRIDE(j, n - 4 * n4) out[4 * n4 + j] = a[4 * n4 + j] + b[4 * n4 + j];
}

// scale: x *= s, n elements.
extern "C" __global__ void scale(float* x, long long n, float s, int vec) {
	long long n4 = vec ? n / 4 : 0;
	GRID_STRIDE(i, n4) {
		float4 v = ((float4*)x)[i];
		v.x *= s;
		v.y *= s;
		v.z *= s;
		v.w *= s;
		((float4*)x)[i] = v;
	}
	GRID_STRIDE(j, n - 4 * n4) x[4 * n4 + j] *= s;
}
