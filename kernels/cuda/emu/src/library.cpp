// library.cpp makes the kernels a shared library (libgptuiemu.so) that the
// stand-in libcuda.so.1 of internal/standin loads in place of a CUBIN, so
// that package cuda's Backend runs its kernels on the CPU through the very
// launches it makes on a GPU (cuLaunchKernel, with the argument array the
// driver gets). emu.BuildLibrary compiles it with the kernel sources
// (kernels.cu) and the generated registry of their names (registry.inc).
//
// Exported (C):
//
//	unsigned long long gptuiEmuSourceHash(void)
//	    FNV-1a (64 bits) of the source NVRTC is given, before emu.Build's
//	    rewrite; the stand-in libnvrtc puts the same hash in its image, so
//	    a library built from other sources is refused at cuModuleLoadData.
//	int gptuiEmuFunction(const char *name)
//	    the kernel's number, or -1.
//	void *gptuiEmuPack(int fn, void **params)
//	    copies the kernel's arguments out of params, as cuLaunchKernel does
//	    before it returns: one pointer per parameter, each to a value of
//	    the parameter's C type (what a GPU reads, with the same mistakes).
//	void gptuiEmuLaunch(int fn, unsigned gx, unsigned gy, unsigned gz,
//	                    unsigned bx, unsigned by, unsigned bz,
//	                    unsigned long long shared, void *packed)
//	    runs the kernel (one launch at a time in the process: blocks share
//	    the emulator's state) and frees packed.
//
// Device pointers are host addresses (the stand-in's device memory is host
// memory). A kernel the emulator finds wrong (barriers no thread can pass,
// a block of more than 1024 threads) ends the process with a message, where
// a GPU would end the context.
#include "cuda_emu.h"
#include "kernels.cu"

#include <cstring>
#include <mutex>
#include <tuple>
#include <utility>

namespace emu {

template <auto F>
struct Thunk;

template <class... P, void (*F)(P...)>
struct Thunk<F> {
	using Args = std::tuple<std::decay_t<P>...>;
	template <std::size_t... I>
	static Args* make(void** params, std::index_sequence<I...>) {
		return new Args(*static_cast<std::decay_t<P>*>(params[I])...);
	}
	static void* pack(void** params) { return make(params, std::index_sequence_for<P...>{}); }
	static void call(void* a) { std::apply(F, *static_cast<Args*>(a)); }
	static void drop(void* a) { delete static_cast<Args*>(a); }
};

struct LibEntry {
	const char* name;
	void* (*pack)(void**);
	void (*call)(void*);
	void (*drop)(void*);
};

}  // namespace emu

#define EMU_ENTRY(n) emu::LibEntry{#n, &emu::Thunk<&n>::pack, &emu::Thunk<&n>::call, &emu::Thunk<&n>::drop},
static const emu::LibEntry registry[] = {
#include "registry.inc"
};
#undef EMU_ENTRY

static std::mutex launchMu;

extern "C" {

unsigned long long gptuiEmuSourceHash(void) { return GPTUI_EMU_SOURCE_HASH; }

int gptuiEmuFunction(const char* name) {
	for (int i = 0; i < (int)(sizeof registry / sizeof registry[0]); i++)
		if (std::strcmp(registry[i].name, name) == 0) return i;
	return -1;
}

void* gptuiEmuPack(int fn, void** params) { return registry[fn].pack(params); }

void gptuiEmuLaunch(int fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                    unsigned long long shared, void* packed) {
	std::lock_guard<std::mutex> hold(launchMu);
	const emu::LibEntry& e = registry[fn];
	dim3 g, b;
	g.x = gx, g.y = gy, g.z = gz;
	b.x = bx, b.y = by, b.z = bz;
	emu::launch(g, b, (size_t)shared, [&] { e.call(packed); });
	e.drop(packed);
}

}  // extern "C"
