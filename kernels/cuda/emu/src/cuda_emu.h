// cuda_emu.h makes CUDA C kernel sources compile as ordinary C++20 (g++ 12)
// and run on the CPU, so gptui's kernels can be tested where no GPU is.
//
// A launch runs the grid's blocks one after another, and each block's
// threads as fibers on the one OS thread: a fiber runs until it waits at a
// barrier or ends, and then the next ready fiber runs. Switching fibers is a
// few instructions (emu_switch below) where waking OS threads at a
// std::barrier cost microseconds and a trip through the scheduler, which
// made a block of 1024 threads crawl on a 2-core machine. __syncthreads is
// a barrier over the block's fibers; warp shuffles exchange values through
// a per-warp slot array between two barriers of the warp; atomics are
// std::atomic_ref (one OS thread needs none, but they cost nothing). Threads
// that return early leave the barriers, as exited threads stop counting on
// a GPU. The fibers of a block are swept in descending thread order, then
// ascending, and so on, one barrier phase a sweep: a thread that reads what
// another writes without the barrier between them reads it before the
// write in one of the two orders (dynamic shared memory, NaN at the start,
// shows it). A block whose threads wait at barriers none can pass (some at
// __syncthreads, others at a warp's) ends the run with a message. A fiber's
// stack is 256 KiB with a guard page below it.
//
// The sources need nothing special: emu.Build rewrites the one construct a
// macro cannot, `extern __shared__ T name[];`, into a pointer to the
// launch's dynamic shared memory (emu::dynamic_shared()). `__shared__`
// becomes `static`: a block-shared variable is one object for
// the whole launch, which is correct because blocks run one at a time.
// Dynamic shared memory is 128-byte aligned and filled with 0xff bytes
// (NaN as floats) at the start of every block, so a kernel reading it
// before writing shows up.
//
// The __nv_bfloat16 and __half types, and the tensor-core and copy
// instructions the kernels use as PTX (mma.sync m16n8k16 with bf16
// operands, ldmatrix.x4, cp.async), are at the end of this file, each with
// its model.
//
// Limits: warp shuffles ignore the mask and assume every lane of the warp
// takes part (as the kernels must on a GPU); block size at most 1024.
#pragma once

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#endif

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

inline uint3 threadIdx;  // the running fiber's, set at each switch
inline uint3 blockIdx;
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

// A context is a fiber's saved stack pointer. On x86-64, emu_switch saves
// the callee-saved registers, MXCSR and the x87 control word on the stack
// it leaves and restores them from the one it resumes: what a function
// call must preserve, and nothing else (glibc's swapcontext also saves the
// signal mask, a system call at every switch). Elsewhere the fibers use
// ucontext.
#if defined(__x86_64__)
extern "C" void emu_switch(void** save, void* resume);
asm(R"(
	.text
	.globl emu_switch
	.type emu_switch, @function
emu_switch:
	pushq %rbp
	pushq %rbx
	pushq %r12
	pushq %r13
	pushq %r14
	pushq %r15
	subq $8, %rsp
	stmxcsr (%rsp)
	fnstcw 4(%rsp)
	movq %rsp, (%rdi)
	movq %rsi, %rsp
	ldmxcsr (%rsp)
	fldcw 4(%rsp)
	addq $8, %rsp
	popq %r15
	popq %r14
	popq %r13
	popq %r12
	popq %rbx
	popq %rbp
	ret
	.size emu_switch, .-emu_switch
)");

struct Context {
	void* sp = nullptr;
};

// context_init makes c start entry on the stack [lo, lo+size): the frame
// emu_switch pops, with entry as its return address.
inline void context_init(Context& c, char* lo, size_t size, void (*entry)()) {
	uintptr_t top = ((uintptr_t)lo + size) & ~(uintptr_t)15;
	void** sp = (void**)top;
	*--sp = nullptr;          // entry's return address: it never returns
	*--sp = (void*)entry;     // emu_switch's ret
	for (int r = 0; r < 6; r++) *--sp = nullptr;  // rbp rbx r12 r13 r14 r15
	uint32_t csr;
	uint16_t cw;
	asm volatile("stmxcsr %0" : "=m"(csr));
	asm volatile("fnstcw %0" : "=m"(cw));
	--sp;
	std::memcpy((char*)sp, &csr, 4);
	std::memcpy((char*)sp + 4, &cw, 2);
	c.sp = sp;
}

inline void context_switch(Context& save, Context& resume) { emu_switch(&save.sp, resume.sp); }
#else
struct Context {
	ucontext_t uc;
};

inline void context_init(Context& c, char* lo, size_t size, void (*entry)()) {
	getcontext(&c.uc);
	c.uc.uc_stack.ss_sp = lo;
	c.uc.uc_stack.ss_size = size;
	c.uc.uc_link = nullptr;
	makecontext(&c.uc, entry, 0);
}

inline void context_switch(Context& save, Context& resume) { swapcontext(&save.uc, &resume.uc); }
#endif

struct Fiber;
struct Launch;
inline Launch* current;

// Barrier is a barrier among some of a block's fibers: all of its threads
// (__syncthreads) or a warp's.
struct Barrier {
	int expected = 0;              // fibers that still take part
	int arrived = 0;               // in the phase under way
	std::vector<Fiber*> waiting;   // arrived and not yet released

	void reset(int n) {
		expected = n;
		arrived = 0;
		waiting.clear();
	}
	void arrive_and_wait();
	// arrive_and_drop leaves the barrier for good, as an exited thread.
	void arrive_and_drop() {
		expected--;
		if (arrived > 0 && arrived >= expected) release();
	}
	void release();
};

// Fiber is one CUDA thread of the block being run.
// CpCopy is a cp.async copy issued and not yet written (see cp.async below).
struct CpCopy {
	void* dst;
	int n;
	unsigned char bytes[16];
};

struct Fiber {
	Context ctx;
	int tid = 0;
	uint3 idx{};
	bool ready = false, done = false;
	char* stack = nullptr;  // lowest usable byte
	// cp.async: the copies of the group not yet committed, and the
	// committed groups not yet written, oldest first.
	std::vector<CpCopy> cp_open;
	std::vector<std::vector<CpCopy>> cp_groups;
#ifdef EMU_ASAN
	void* fake = nullptr;   // AddressSanitizer's fake stack while switched out
#endif
};

struct Warp {
	Barrier bar;
	int size = 0;
	unsigned long long slot[32];
	// The warp-collective instructions' (emu_mma_m16n8k16_bf16,
	// emu_ldmatrix_x4 below): each lane's count of calls since the block
	// started, and each lane's A and B registers of the mma.
	unsigned op_calls[32];
	unsigned mma_ab[32][6];
};

inline constexpr size_t kStack = 256 << 10;

// Launch is the state of the launch in progress (one at a time).
struct Launch {
	int nthreads = 0;
	size_t shared = 0;
	// 128-byte aligned, as a GPU's dynamic shared memory declared
	// __align__(128) is.
	struct DynFree {
		void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t(128)); }
	};
	std::unique_ptr<unsigned char[], DynFree> dyn;
	Barrier sync;
	std::vector<std::unique_ptr<Warp>> warps;
	std::vector<Fiber> fibers;
	const std::function<void()>* kernel = nullptr;
	Context sched;          // the scheduler's context
	Fiber* cur = nullptr;   // the fiber running
#ifdef EMU_ASAN
	const void* main_bottom = nullptr;
	size_t main_size = 0;
#endif

	void arm() {
		sync.reset(nthreads);
		for (auto& w : warps) {
			w->bar.reset(w->size);
			std::memset(w->op_calls, 0, sizeof w->op_calls);
		}
		if (shared) std::memset(dyn.get(), 0xff, shared);
	}
};

// Stacks are the fibers' stacks, one mapping of a guard page and a stack
// per fiber, kept from launch to launch and grown to the largest block
// launched: mapping, guarding, faulting in and unmapping them at every
// launch cost more time in the kernel than most kernels take to run.
// Like a GPU's locals, a fiber's stack starts with what the last launch
// left there.
struct Stacks {
	char* base = nullptr;
	size_t mapped = 0, per = 0;
	int n = 0;

	// reserve makes at least want stacks and returns the lowest usable
	// byte of the first; stack t's is per bytes above it.
	char* reserve(int want) {
		size_t page = (size_t)sysconf(_SC_PAGESIZE);
		if (want > n) {
			if (base) munmap(base, mapped);
			per = page + kStack;
			mapped = per * (size_t)want;
			void* m = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
			if (m == MAP_FAILED) {
				std::fprintf(stderr, "emu: cannot map %d fiber stacks\n", want);
				std::_Exit(3);
			}
			base = (char*)m;
			n = want;
			for (int t = 0; t < n; t++) mprotect(base + per * (size_t)t, page, PROT_NONE);
		}
#ifdef EMU_ASAN
		// The last launch's fibers ended without returning from their
		// first frames: their redzones are still poisoned.
		for (int t = 0; t < want; t++) __asan_unpoison_memory_region(base + per * (size_t)t + page, kStack);
#endif
		return base + page;
	}
};

inline Stacks stacks;  // launches run one at a time (current)

inline int tl_tid;  // the running fiber's thread index in the block

inline int lane() { return tl_tid & 31; }
inline Warp& warp() { return *current->warps[tl_tid >> 5]; }

// yield switches from the running fiber to the scheduler; it returns when
// the scheduler runs the fiber again.
inline void yield() {
	Launch* l = current;
	Fiber* f = l->cur;
#ifdef EMU_ASAN
	__sanitizer_start_switch_fiber(&f->fake, l->main_bottom, l->main_size);
#endif
	context_switch(f->ctx, l->sched);
#ifdef EMU_ASAN
	__sanitizer_finish_switch_fiber(f->fake, &l->main_bottom, &l->main_size);
#endif
}

inline void Barrier::arrive_and_wait() {
	if (++arrived >= expected) {  // the last to arrive goes on
		release();
		return;
	}
	Fiber* f = current->cur;
	f->ready = false;
	waiting.push_back(f);
	yield();
}

inline void Barrier::release() {
	arrived = 0;
	for (Fiber* f : waiting) f->ready = true;
	waiting.clear();
}

// fiber_main runs the kernel as the current fiber's thread, leaves its
// barriers and switches to the scheduler for good.
inline void fiber_main() {
	Launch* l = current;
	Fiber* f = l->cur;
#ifdef EMU_ASAN
	__sanitizer_finish_switch_fiber(nullptr, &l->main_bottom, &l->main_size);
#endif
	(*l->kernel)();
	l->warps[f->tid >> 5]->bar.arrive_and_drop();
	l->sync.arrive_and_drop();
	f->done = true;
#ifdef EMU_ASAN
	__sanitizer_start_switch_fiber(nullptr, l->main_bottom, l->main_size);
#endif
	context_switch(f->ctx, l->sched);
	std::abort();  // an ended fiber is never resumed
}

// run runs the fibers of the current block until every one has ended.
inline void run(Launch& l) {
	int n = l.nthreads, left = n;
	for (int t = 0; t < n; t++) {
		Fiber& f = l.fibers[t];
		f.ready = true;
		f.done = false;
		f.cp_open.clear();
		f.cp_groups.clear();
		context_init(f.ctx, f.stack, kStack, fiber_main);
	}
	for (bool down = true; left > 0; down = !down) {
		bool ran = false;
		for (int i = 0; i < n; i++) {
			Fiber& f = l.fibers[down ? n - 1 - i : i];
			if (!f.ready || f.done) continue;
			l.cur = &f;
			tl_tid = f.tid;
			threadIdx = f.idx;
#ifdef EMU_ASAN
			void* fake = nullptr;
			__sanitizer_start_switch_fiber(&fake, f.stack, kStack);
#endif
			context_switch(l.sched, f.ctx);
#ifdef EMU_ASAN
			__sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
			ran = true;
			if (f.done) left--;
		}
		if (!ran) {
			int at_sync = (int)l.sync.waiting.size();
			std::fprintf(stderr, "emu: block (%u,%u,%u): %d of %d threads wait at __syncthreads and %d at a warp's barrier: none can pass\n",
			             blockIdx.x, blockIdx.y, blockIdx.z, at_sync, n, left - at_sync);
			std::_Exit(3);
		}
	}
	l.cur = nullptr;
}

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
	l.kernel = &kernel;
	// Exactly `shared` bytes, so AddressSanitizer sees an overrun.
	if (shared) l.dyn.reset(new (std::align_val_t(128)) unsigned char[shared]);
	for (int w = 0; w * 32 < n; w++) {
		l.warps.push_back(std::make_unique<Warp>());
		l.warps.back()->size = std::min<int>(32, (int)n - w * 32);
	}
	char* stack = stacks.reserve((int)n);
	l.fibers.resize(n);
	for (int t = 0; t < n; t++) {
		Fiber& f = l.fibers[t];
		f.tid = t;
		f.idx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
		f.stack = stack + stacks.per * (size_t)t;
	}
	current = &l;
	blockDim = block;
	gridDim = grid;
	for (unsigned z = 0; z < grid.z; z++)
		for (unsigned y = 0; y < grid.y; y++)
			for (unsigned x = 0; x < grid.x; x++) {
				blockIdx = {x, y, z};
				l.arm();
				run(l);
			}
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
	w.bar.arrive_and_wait();
	T r = v;
	if (src >= 0 && src < w.size) std::memcpy(&r, &w.slot[src], sizeof(T));
	w.bar.arrive_and_wait();
	return r;
}

}  // namespace emu

inline void __syncthreads() { emu::current->sync.arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp().bar.arrive_and_wait(); }
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
// The _rn intrinsics are never fused into an FMA by NVRTC; the emulator is
// built with contraction on (as NVRTC's --fmad=true), so each result passes
// through an empty asm that the optimiser cannot see into: no later add
// can take a product of these into one rounding.
#if defined(__x86_64__)
#define EMU_ROUNDED(r) asm("" : "+x"(r))
#elif defined(__aarch64__)
#define EMU_ROUNDED(r) asm("" : "+w"(r))
#else
#define EMU_ROUNDED(r) asm volatile("" : : "g"(&r) : "memory")
#endif
inline float __fmul_rn(float a, float b) { float r = a * b; EMU_ROUNDED(r); return r; }
inline float __fadd_rn(float a, float b) { float r = a + b; EMU_ROUNDED(r); return r; }
inline float __fsub_rn(float a, float b) { float r = a - b; EMU_ROUNDED(r); return r; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dmul_rn(double a, double b) { double r = a * b; EMU_ROUNDED(r); return r; }
inline double __dadd_rn(double a, double b) { double r = a + b; EMU_ROUNDED(r); return r; }
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

// ---- 16-bit floating-point types (cuda_bf16.h, cuda_fp16.h) ----
//
// __nv_bfloat16 and __half hold their bits; the conversions from float
// round to nearest even (NaN stays a quiet NaN of the same sign), as the
// GPU's cvt.rn does. Only what the kernels use: conversions, no
// arithmetic.

namespace emu {
inline unsigned short f32_to_bf16_bits(float f) {
	unsigned int u = emu_bitcast<unsigned int>(f);
	if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (unsigned short)(u >> 16);
}
inline unsigned short f32_to_f16_bits(float f) {
	unsigned int u = emu_bitcast<unsigned int>(f);
	unsigned int sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
	if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);
	if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);
	if (a >= 0x38800000u) {
		unsigned int r = a - 0x38000000u;
		r += 0xfffu + ((r >> 13) & 1u);
		return (unsigned short)(sign | (r >> 13));
	}
	if (a <= 0x33000000u) return (unsigned short)sign;
	unsigned int e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
	unsigned int q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
	if (rem > half || (rem == half && (q & 1u))) q++;
	return (unsigned short)(sign | q);
}
inline float f16_bits_to_f32(unsigned short h) {
	unsigned int sign = ((unsigned int)h & 0x8000u) << 16, e = ((unsigned int)h >> 10) & 0x1fu, m = (unsigned int)h & 0x3ffu;
	if (e == 0x1fu) return emu_bitcast<float>(sign | 0x7f800000u | (m << 13));
	if (e != 0) return emu_bitcast<float>(sign | ((e + 112u) << 23) | (m << 13));
	float f = (float)m * (1.0f / 16777216.0f);  // m·2⁻²⁴, exact
	return sign ? -f : f;
}
}  // namespace emu

struct __nv_bfloat16 {
	unsigned short __x;
	__nv_bfloat16() = default;
	__nv_bfloat16(float f) : __x(emu::f32_to_bf16_bits(f)) {}
	operator float() const { return emu_bitcast<float>((unsigned int)__x << 16); }
};
struct __half {
	unsigned short __x;
	__half() = default;
	__half(float f) : __x(emu::f32_to_f16_bits(f)) {}
	operator float() const { return emu::f16_bits_to_f32(__x); }
};
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return (float)h; }
inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __half2float(__half h) { return (float)h; }

// ---- warp-collective instructions: their common checks ----

namespace emu {

enum { mma_m16n8k16 = 1, ldmatrix_x4 = 2 };

inline const char* op_name(int op) { return op == mma_m16n8k16 ? "mma.sync.m16n8k16" : "ldmatrix.sync.m8n8.x4"; }

[[noreturn]] inline void op_fail(int op, const char* what) {
	std::fprintf(stderr, "emu: block (%u,%u,%u) thread %d: %s: %s\n", blockIdx.x, blockIdx.y, blockIdx.z, tl_tid, op_name(op), what);
	std::fflush(stderr);
	std::_Exit(3);
}

// op_arrive is the first half of every warp-collective instruction: it
// checks that the whole warp takes part (a warp with exited lanes, or a
// block whose size is not a multiple of 32, ends the run), counts the
// lane's calls, waits for the warp (the barrier of __syncwarp) and checks
// that every lane is at the same call (lanes at different calls end the
// run).
inline void op_arrive(int op) {
	Warp& w = warp();
	int l = lane();
	if (w.size != 32 || w.bar.expected != 32) {
		char msg[128];
		std::snprintf(msg, sizeof msg, "called by %d of the warp's 32 lanes (all 32 must call it)", w.bar.expected);
		op_fail(op, msg);
	}
	w.op_calls[l]++;
	w.bar.arrive_and_wait();
	if (w.op_calls[l] != w.op_calls[0]) op_fail(op, "lanes at different calls (each lane must make the same calls)");
}

// op_leave is the second half: a warp barrier after which the lanes'
// slots may be written again.
inline void op_leave() { warp().bar.arrive_and_wait(); }

}  // namespace emu

// ---- mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 ----
//
// emu_mma_m16n8k16_bf16(d, a, b0, b1) is PTX's warp-level mma on a
// 16×8×16 block, D = A·B + D, with the PTX ISA's fragment layout
// ("Matrix Fragments for mma.m16n8k16 with floating point type"): lane
// l = 4g + t holds
//   a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]
//   a[2] = A[g][2t+8, 2t+9] a[3] = A[g+8][2t+8, 2t+9]
//   b0 = B[2t, 2t+1][g]     b1 = B[2t+8, 2t+9][g]
//   d[0], d[1] = D[g][2t, 2t+1]   d[2], d[3] = D[g+8][2t, 2t+1]
// each register two bf16s, the lower-indexed one in the lower 16 bits.
// These fragments are the hardware's own, so a kernel may compute on
// particular elements (a softmax on the accumulators, an accumulator pair
// reused as an A fragment) and this model means what the GPU does.
// Warp-collective (op_arrive's checks). Numerics: A and B hold bf16
// values already (a kernel rounds its fp32 data, to nearest even as the
// hardware converts); each product of two bf16s is exact in fp32, and the
// products are added to C in fp32, one at a time in k order with round to
// nearest even. Tensor cores add the 16 products in groups with their own
// alignment and truncation, so a GPU's result may differ from the
// emulator's in the last bits of fp32 — far below the rounding of the
// inputs to 16 bits, which is what a kernel's tolerance against an fp32 or
// fp64 reference must allow for.
inline void emu_mma_m16n8k16_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
	emu::Warp& w = emu::warp();
	const int l = emu::lane();
	// The last operation's readers are done (it ended at a warp barrier).
	for (int i = 0; i < 4; i++) w.mma_ab[l][i] = a[i];
	w.mma_ab[l][4] = b0, w.mma_ab[l][5] = b1;
	emu::op_arrive(emu::mma_m16n8k16);
	auto bf = [&](int lane, int reg, int half) {
		return emu_bitcast<float>((w.mma_ab[lane][reg] >> (16 * half) & 0xffffu) << 16);
	};
	const int g = l >> 2, t = l & 3;
	float r[4];
	for (int i = 0; i < 4; i++) {
		const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
		float s = d[i];
		for (int k = 0; k < 16; k++) {
			const float x = bf((row & 7) * 4 + ((k & 7) >> 1), (row >> 3) + 2 * (k >> 3), k & 1);
			const float y = bf(col * 4 + ((k & 7) >> 1), 4 + (k >> 3), k & 1);
			s += x * y;  // exact product, one rounding a sum
		}
		r[i] = s;
	}
	emu::op_leave();
	for (int i = 0; i < 4; i++) d[i] = r[i];
}

// ---- ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 ----
//
// emu_ldmatrix_x4(r, row, trans) is PTX's ldmatrix of four 8×8 matrices
// of 16-bit elements: lane 8m + i gives the address of row i of matrix m
// (16 bytes, 16-byte aligned: checked), and lane 4g + t receives in r[m]
// row g, columns 2t and 2t+1 of matrix m — or, with .trans, rows 2t and
// 2t+1 of column g — the lower-indexed element in the lower 16 bits: an
// mma fragment register. Warp-collective (all 32 lanes: checked).
inline void emu_ldmatrix_x4(unsigned (&r)[4], const void* row, bool trans) {
	emu::Warp& w = emu::warp();
	const int l = emu::lane();
	if ((uintptr_t)row % 16 != 0) emu::op_fail(emu::ldmatrix_x4, "a row address is not 16-byte aligned");
	w.slot[l] = (unsigned long long)(uintptr_t)row;
	emu::op_arrive(emu::ldmatrix_x4);
	const int g = l >> 2, t = l & 3;
	auto at = [&](int lane, int i) { return ((const unsigned short*)(uintptr_t)w.slot[lane])[i]; };
	unsigned out[4];
	for (int m = 0; m < 4; m++) {
		const unsigned lo = trans ? at(8 * m + 2 * t, g) : at(8 * m + g, 2 * t);
		const unsigned hi = trans ? at(8 * m + 2 * t + 1, g) : at(8 * m + g, 2 * t + 1);
		out[m] = lo | hi << 16;
	}
	emu::op_leave();
	for (int m = 0; m < 4; m++) r[m] = out[m];
}

// ---- cp.async (sm_80): cp.async.{ca,cg}.shared.global, commit_group, wait_group ----
//
// emu_cp_async(dst, src, n) copies n (4, 8 or 16: checked, with both
// addresses aligned to n) bytes from global to shared memory without the
// thread waiting; emu_cp_async_commit closes the thread's group of copies
// issued since the last commit; emu_cp_async_wait(k) returns once all but
// the newest k committed groups of the thread have landed (the other
// threads' copies need a barrier after their waits, as on a GPU).
// The model: a copy reads its source when issued (no kernel writes the
// global memory it copies from during a launch) and writes its
// destination either at once, in blocks whose index sum is odd, or only
// at the wait that covers its group, in the others — the two extremes of
// what a GPU may do. So a kernel that reads a destination before waiting
// reads what was there before (NaN in fresh dynamic shared memory) in the
// even blocks, and one that issues into a buffer other threads still read,
// without a barrier between, overwrites it under them in the odd ones.
inline void emu_cp_async(void* dst, const void* src, int n) {
	if ((n != 4 && n != 8 && n != 16) || (uintptr_t)dst % n != 0 || (uintptr_t)src % n != 0) {
		std::fprintf(stderr, "emu: block (%u,%u,%u) thread %d: cp.async of %d bytes from %p to %p: 4, 8 or 16 bytes, aligned to their size\n",
		             blockIdx.x, blockIdx.y, blockIdx.z, emu::tl_tid, n, src, dst);
		std::fflush(stderr);
		std::_Exit(3);
	}
	emu::CpCopy c{dst, n, {}};
	std::memcpy(c.bytes, src, n);
	if ((blockIdx.x + blockIdx.y + blockIdx.z) % 2 == 1)
		std::memcpy(dst, c.bytes, n);
	else
		emu::current->cur->cp_open.push_back(c);
}

inline void emu_cp_async_commit() {
	emu::Fiber* f = emu::current->cur;
	f->cp_groups.push_back(std::move(f->cp_open));
	f->cp_open.clear();
}

inline void emu_cp_async_wait(int k) {
	emu::Fiber* f = emu::current->cur;
	while ((int)f->cp_groups.size() > k) {
		for (const emu::CpCopy& c : f->cp_groups.front()) std::memcpy(c.dst, c.bytes, c.n);
		f->cp_groups.erase(f->cp_groups.begin());
	}
}
