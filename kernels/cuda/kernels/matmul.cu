// matmul.cu: what the GEMMs (cuBLAS) leave to kernels: the bias add (and
// store into bfloat16 activations) and the bias gradient (kernels/cpu/matmul.go), and the dtype casts of mixed
// precision.

// bias_add: out (N,OC) += bias (OC) on every row. vec: OC % 4 == 0 and both
// pointers 16-byte aligned.
extern "C" __global__ void bias_add(float* __restrict__ out, const float* __restrict__ bias, int N, int OC, int vec) {
	if (vec) {
		int O4 = OC / 4;
		GRID_STRIDE(i, (long long)N * O4) {
			float4 o = ((float4*)out)[i];
			float4 b = ((const float4*)bias)[i % O4];
			o.x += b.x;
			o.y += b.y;
			o.z += b.z;
			o.w += b.w;
			((float4*)out)[i] = o;
		}
		return;
	}
	GRID_STRIDE(i, (long long)N * OC) out[i] += bias[i % OC];
}

// bias_store: out (N,OC) = in (N,OC) + bias (OC), in the float32 product
// of a GEMM whose output is bfloat16 activations when cuBLASLt's bias
// epilogue is not to be had: as the epilogue and kernels/cpu do, the bias
// is read as a bfloat16 (rounded), added in float32, and the sum rounded
// once. bf: out. out may alias in when both are float32 (the bias then
// added as it is).
extern "C" __global__ void bias_store(void* out, const float* in, const float* __restrict__ bias, int N, int OC, int bf) {
	GRID_STRIDE(i, (long long)N * OC) stx(out, i, in[i] + stored(bias[i % OC], bf & 1), bf & 1);
}

#define BB_ROWS 256 // rows per block of bias_backward

// bias_backward: dbias (OC) += Σ_rows dout (N,OC). Block (32, 16): 32
// columns, 16 threads down each, BB_ROWS rows per block; the 16 partial
// sums meet in shared memory and one atomic per column and block adds them.
// bf: dout.
extern "C" __global__ void __launch_bounds__(32 * 16)
    bias_backward(float* __restrict__ dbias, const void* __restrict__ dout, int N, int OC, int bf) {
	__shared__ float part[16][33];
	int c = blockIdx.x * 32 + threadIdx.x;
	int r0 = blockIdx.y * BB_ROWS;
	int r1 = min(N, r0 + BB_ROWS);
	float s = 0.0f;
	if (c < OC)
		for (int r = r0 + (int)threadIdx.y; r < r1; r += 16) s += ldx(dout, (long long)r * OC + c, bf & 1);
	part[threadIdx.y][threadIdx.x] = s;
	__syncthreads();
	if (threadIdx.y == 0 && c < OC) {
		float t = 0.0f;
		for (int y = 0; y < 16; y++) t += part[y][threadIdx.x];
		atomicAdd(&dbias[c], t);
	}
}

// Casts, n elements, round to nearest even. vec: float data 16-byte and
// 16-bit data 8-byte aligned.

extern "C" __global__ void cast_f32_bf16(bf16_t* __restrict__ out, const float* __restrict__ in, long long n, int vec) {
	long long n4 = vec ? n / 4 : 0;
	GRID_STRIDE(i, n4) {
		float4 v = ((const float4*)in)[i];
		ushort4 h;
		h.x = f32_to_bf16(v.x);
		h.y = f32_to_bf16(v.y);
		h.z = f32_to_bf16(v.z);
		h.w = f32_to_bf16(v.w);
		((ushort4*)out)[i] = h;
	}
	GRID_STRIDE(j, n - 4 * n4) out[4 * n4 + j] = f32_to_bf16(in[4 * n4 + j]);
}

extern "C" __global__ void cast_f32_f16(f16_t* __restrict__ out, const float* __restrict__ in, long long n, int vec) {
	long long n4 = vec ? n / 4 : 0;
	GRID_STRIDE(i, n4) {
		float4 v = ((const float4*)in)[i];
		ushort4 h;
		h.x = f32_to_f16(v.x);
		h.y = f32_to_f16(v.y);
		h.z = f32_to_f16(v.z);
		h.w = f32_to_f16(v.w);
		((ushort4*)out)[i] = h;
	}
	GRID_STRIDE(j, n - 4 * n4) out[4 * n4 + j] = f32_to_f16(in[4 * n4 + j]);
}

extern "C" __global__ void cast_bf16_f32(float* __restrict__ out, const bf16_t* __restrict__ in, long long n, int vec) {
	long long n4 = vec ? n / 4 : 0;
	GRID_STRIDE(i, n4) {
		ushort4 h = ((const ushort4*)in)[i];
		float4 v;
		v.x = bf16_to_f32(h.x);
		v.y = bf16_to_f32(h.y);
		v.z = bf16_to_f32(h.z);
		v.w = bf16_to_f32(h.w);
		((float4*)out)[i] = v;
	}
	GRID_STRIDE(j, n - 4 * n4) out[4 * n4 + j] = bf16_to_f32(in[4 * n4 + j]);
}

extern "C" __global__ void cast_f16_f32(float* __restrict__ out, const f16_t* __restrict__ in, long long n, int vec) {
	long long n4 = vec ? n / 4 : 0;
	GRID_STRIDE(i, n4) {
		ushort4 h = ((const ushort4*)in)[i];
		float4 v;
		v.x = f16_to_f32(h.x);
		v.y = f16_to_f32(h.y);
		v.z = f16_to_f32(h.z);
		v.w = f16_to_f32(h.w);
		((float4*)out)[i] = v;
	}
	GRID_STRIDE(j, n - 4 * n4) out[4 * n4 + j] = f16_to_f32(in[4 * n4 + j]);
}
