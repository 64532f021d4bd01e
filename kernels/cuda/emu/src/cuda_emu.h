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
// Dynamic shared memory is filled with 0xff bytes (NaN as floats) at the
// start of every block, so a kernel reading it before writing shows up.
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
#include <type_traits>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
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
struct Fiber {
	Context ctx;
	int tid = 0;
	uint3 idx{};
	bool ready = false, done = false;
	char* stack = nullptr;  // lowest usable byte
#ifdef EMU_ASAN
	void* fake = nullptr;   // AddressSanitizer's fake stack while switched out
#endif
};

struct Warp {
	Barrier bar;
	int size = 0;
	unsigned long long slot[32];
};

inline constexpr size_t kStack = 256 << 10;

// Launch is the state of the launch in progress (one at a time).
struct Launch {
	int nthreads = 0;
	size_t shared = 0;
	std::unique_ptr<unsigned char[]> dyn;
	Barrier sync;
	std::vector<std::unique_ptr<Warp>> warps;
	std::vector<Fiber> fibers;
	const std::function<void()>* kernel = nullptr;
	Context sched;          // the scheduler's context
	Fiber* cur = nullptr;   // the fiber running
	char* stacks = nullptr; // one mapping: per fiber a guard page, then its stack
	size_t mapped = 0;
#ifdef EMU_ASAN
	const void* main_bottom = nullptr;
	size_t main_size = 0;
#endif

	void arm() {
		sync.reset(nthreads);
		for (auto& w : warps) w->bar.reset(w->size);
		if (shared) std::memset(dyn.get(), 0xff, shared);
	}
};

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
	if (shared) l.dyn.reset(new unsigned char[shared]);
	for (int w = 0; w * 32 < n; w++) {
		l.warps.push_back(std::make_unique<Warp>());
		l.warps.back()->size = std::min<int>(32, (int)n - w * 32);
	}
	size_t page = (size_t)sysconf(_SC_PAGESIZE), per = page + kStack;
	l.mapped = per * (size_t)n;
	void* m = mmap(nullptr, l.mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED) {
		std::fprintf(stderr, "emu: cannot map %lld fiber stacks\n", n);
		std::_Exit(3);
	}
	l.stacks = (char*)m;
	l.fibers.resize(n);
	for (int t = 0; t < n; t++) {
		char* guard = l.stacks + per * (size_t)t;
		mprotect(guard, page, PROT_NONE);
		Fiber& f = l.fibers[t];
		f.tid = t;
		f.idx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
		f.stack = guard + page;
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
	munmap(l.stacks, l.mapped);
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
