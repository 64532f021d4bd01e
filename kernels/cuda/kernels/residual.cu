// residual.cu: elementwise sums and scaling (kernels/cpu/residual.go).

// residual_forward: out = a + b, n elements; out may alias a or b. bf: out,
// a, b.
extern "C" __global__ void residual_forward(void* out, const void* a, const void* b, long long n, int bf, int vec) {
	long long n4 = vec ? n / 4 : 0;
	GRID_STRIDE(i, n4) {
		float4 x = ((const float4*)a)[i], y = ((const float4*)b)[i];
		x.x += y.x;
		x.y += y.y;
		x.z += y.z;
		x.w += y.w;
		((float4*)out)[i] = x;
	}
	GRID_STRIDE(j, n - 4 * n4) {
		long long i = 4 * n4 + j;
		stx(out, i, ldx(a, i, BF(bf, 1)) + ldx(b, i, BF(bf, 2)), BF(bf, 0));
	}
}

// scale: x *= s, n elements. bf: x.
extern "C" __global__ void scale(void* x, long long n, float s, int bf, int vec) {
	long long n4 = vec ? n / 4 : 0;
	GRID_STRIDE(i, n4) {
		float4 v = ((float4*)x)[i];
		v.x *= s;
		v.y *= s;
		v.z *= s;
		v.w *= s;
		((float4*)x)[i] = v;
	}
	GRID_STRIDE(j, n - 4 * n4) {
		long long i = 4 * n4 + j;
		stx(x, i, ldx(x, i, bf & 1) * s, bf & 1);
	}
}
