// cuda_emu.h makes CUDA C kernel sources compile as ordinary C++20 (g++ 12)
// and run on the CPU, so gptui's kernels can be tested where no GPU is.
//
// A launch runs the grid's blocks one after another and each block's threads
// concurrently, one OS thread per CUDA thread (the threads are created once
// per launch and walk the blocks together). __syncthreads is a std::barrier
// over the block; warp shuffles exchange values through a per-warp slot
// array between two barriers of the warp; atomics are std::atomic_ref.
// Threads that return early leave the barriers (arrive_and_drop), as exited
// threads stop counting on a GPU.
//
// The sources need nothing special: emu.Build rewrites the one construct a
// macro cannot, `extern __shared__ T name[];`, into a pointer to the
// launch's dynamic shared memory (emu::dynamic_shared()). `__shared__`
// becomes `static`: a block-shared variable is one object for
// the whole launch, which is correct because blocks run one at a time.
// Dynamic shared memory is filled with 0xff bytes (NaN as floats) at the
// start of every block, so a kernel reading it before writing shows up.
//
// Limits: warp shuffles ignore the mask and assume every lane of the warp
// takes part (as the kernels must on a GPU); block size at most 1024.
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

struct uint3 {
	unsigned int x, y, z;
};

struct dim3 {
	unsigned int x = 1, y = 1, z = 1;
};

struct alignas(16) float4 {
	float x, y, z, w;
};

struct alignas(8) float2 {
	float x, y;
};

struct alignas(8) uint2 {
	unsigned int x, y;
};

struct alignas(16) uint4 {
	unsigned int x, y, z, w;
};

struct alignas(8) ushort4 {
	unsigned short x, y, z, w;
};

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;
inline constexpr int warpSize = 32;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __constant__ static
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

namespace emu {

// Completion re-arms a block's barriers once all of its threads are done.
struct Launch;
struct Completion {
	Launch* l;
	void operator()() noexcept;
};

struct Warp {
	std::optional<std::barrier<>> bar;
	int size = 0;
	unsigned long long slot[32];
};

// Launch is the state of the launch in progress (one at a time).
struct Launch {
	int nthreads = 0;
	size_t shared = 0;
	std::unique_ptr<unsigned char[]> dyn;
	std::optional<std::barrier<>> sync;
	std::vector<std::unique_ptr<Warp>> warps;
	std::optional<std::barrier<Completion>> end;

	void arm() {
		sync.emplace(nthreads);
		for (auto& w : warps) w->bar.emplace(w->size);
		if (shared) std::memset(dyn.get(), 0xff, shared);
	}
};

inline void Completion::operator()() noexcept { l->arm(); }

inline Launch* current;
inline thread_local int tl_tid;

inline int lane() { return tl_tid & 31; }
inline Warp& warp() { return *current->warps[tl_tid >> 5]; }

// launch runs kernel over grid × block with shared bytes of dynamic shared
// memory and returns when every block has finished.
inline void launch(dim3 grid, dim3 block, size_t shared, const std::function<void()>& kernel) {
	long long n = (long long)block.x * block.y * block.z;
	if (n < 1 || n > 1024) {
		std::fprintf(stderr, "emu: block of %lld threads (1 to 1024)\n", n);
		std::_Exit(3);
	}
	if (grid.x < 1 || grid.y < 1 || grid.z < 1) {
		std::fprintf(stderr, "emu: empty grid %u×%u×%u\n", grid.x, grid.y, grid.z);
		std::_Exit(3);
	}
	Launch l;
	l.nthreads = (int)n;
	l.shared = shared;
	// Exactly `shared` bytes, so AddressSanitizer sees an overrun.
	if (shared) l.dyn.reset(new unsigned char[shared]);
	for (int w = 0; w * 32 < n; w++) {
		l.warps.push_back(std::make_unique<Warp>());
		l.warps.back()->size = std::min<int>(32, (int)n - w * 32);
	}
	l.arm();
	l.end.emplace((std::ptrdiff_t)n, Completion{&l});
	current = &l;
	blockDim = block;
	gridDim = grid;
	std::vector<std::thread> threads;
	threads.reserve(n);
	for (int t = 0; t < n; t++) {
		threads.emplace_back([&l, &kernel, t, block, grid] {
			tl_tid = t;
			threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
			for (unsigned z = 0; z < grid.z; z++)
				for (unsigned y = 0; y < grid.y; y++)
					for (unsigned x = 0; x < grid.x; x++) {
						blockIdx = {x, y, z};
						kernel();
						l.warps[t >> 5]->bar->arrive_and_drop();
						l.sync->arrive_and_drop();
						l.end->arrive_and_wait();
					}
		});
	}
	for (auto& th : threads) th.join();
	current = nullptr;
}

inline void* dynamic_shared() { return current->dyn.get(); }

// exchange publishes v in this lane's slot and returns the value lane src
// published (v itself when src is outside the warp).
template <class T>
T exchange(T v, int src) {
	static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
	Warp& w = warp();
	unsigned long long bits = 0;
	std::memcpy(&bits, &v, sizeof(T));
	w.slot[lane()] = bits;
	w.bar->arrive_and_wait();
	T r = v;
	if (src >= 0 && src < w.size) std::memcpy(&r, &w.slot[src], sizeof(T));
	w.bar->arrive_and_wait();
	return r;
}

}  // namespace emu

inline void __syncthreads() { emu::current->sync->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp().bar->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }

template <class T>
T __shfl_xor_sync(unsigned, T v, int laneMask, int width = 32) {
	int l = emu::lane();
	int src = l ^ laneMask;
	if ((src & ~(width - 1)) != (l & ~(width - 1))) src = l;
	return emu::exchange(v, src);
}

template <class T>
T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
	int l = emu::lane();
	int src = l + (int)delta;
	if ((src & ~(width - 1)) != (l & ~(width - 1))) src = l;
	return emu::exchange(v, src);
}

template <class T>
T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
	int l = emu::lane();
	int src = l - (int)delta;
	if (src < 0 || (src & ~(width - 1)) != (l & ~(width - 1))) src = l;
	return emu::exchange(v, src);
}

template <class T>
T __shfl_sync(unsigned, T v, int srcLane, int width = 32) {
	int l = emu::lane();
	return emu::exchange(v, (l & ~(width - 1)) + (srcLane & (width - 1)));
}

// Atomics return the old value, as CUDA's do.
template <class T>
T atomicAdd(T* p, T v) {
	return std::atomic_ref<T>(*p).fetch_add(v);
}
inline int atomicOr(int* p, int v) { return std::atomic_ref<int>(*p).fetch_or(v); }
inline unsigned atomicOr(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_or(v); }
template <class T>
T atomicExch(T* p, T v) {
	return std::atomic_ref<T>(*p).exchange(v);
}
template <class T>
T atomicCAS(T* p, T cmp, T v) {
	std::atomic_ref<T>(*p).compare_exchange_strong(cmp, v);
	return cmp;
}
template <class T>
T atomicMax(T* p, T v) {
	std::atomic_ref<T> a(*p);
	T old = a.load();
	while (old < v && !a.compare_exchange_weak(old, v)) {
	}
	return old;
}

template <class T>
T __ldg(const T* p) {
	return *p;
}
template <class T>
T __ldcs(const T* p) {
	return *p;
}
template <class T>
void __stcs(T* p, T v) {
	*p = v;
}

template <class T>
T min(T a, T b) {
	return b < a ? b : a;
}
template <class T>
T max(T a, T b) {
	return a < b ? b : a;
}

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }

template <class To, class From>
To emu_bitcast(From f) {
	static_assert(sizeof(To) == sizeof(From));
	To t;
	std::memcpy(&t, &f, sizeof(To));
	return t;
}
inline unsigned int __float_as_uint(float f) { return emu_bitcast<unsigned int>(f); }
inline int __float_as_int(float f) { return emu_bitcast<int>(f); }
inline float __uint_as_float(unsigned int u) { return emu_bitcast<float>(u); }
inline float __int_as_float(int i) { return emu_bitcast<float>(i); }
inline long long __double_as_longlong(double d) { return emu_bitcast<long long>(d); }
inline double __longlong_as_double(long long l) { return emu_bitcast<double>(l); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
	return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
