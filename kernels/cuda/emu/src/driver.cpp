// driver.cpp replays a script of kernel launches over host buffers through
// cuda_emu.h. emu.Build compiles it together with the kernel sources
// (kernels.cu) and a generated registry of their names (registry.inc); the
// Go side (emu.Machine) writes the script and reads the buffers back.
//
// Script (little endian):
//
//	"EMU1"  u32 nbuf  { u64 size, size bytes }…
//	u32 nlaunch  { u32 fn, u32 grid[3], u32 block[3], u64 shared,
//	               u32 nargs { u8 kind, u64 bits }… }…
//
// Argument kinds: 0 pointer (the fake device address: (buffer+1)<<32 |
// offset; 0 is null), 1 int, 2 unsigned int, 3 long long, 4 unsigned long
// long, 5 float, 6 double; bits hold the value (floats as their bits). Each
// argument's kind must match the kernel parameter's C type exactly, so a Go
// launch passing int32 where the kernel takes long long fails here rather
// than reading garbage on a GPU.
//
// Output: u32 nbuf { u64 size, size bytes }… — every buffer after the last
// launch.
#include "cuda_emu.h"
#include "kernels.cu"

#include <string>
#include <utility>

namespace emu {

struct Arg {
	unsigned char kind;
	unsigned long long bits;
};

struct Buffer {
	unsigned char* p = nullptr;
	unsigned long long size = 0;
};

inline std::vector<Buffer> buffers;
inline std::string where;  // the launch being checked, for messages

[[noreturn]] inline void fail(const std::string& msg) {
	std::fprintf(stderr, "emu: %s%s\n", where.c_str(), msg.c_str());
	std::fflush(stderr);
	std::_Exit(3);
}

inline void* resolve(unsigned long long addr) {
	if (addr == 0) return nullptr;
	unsigned long long b = (addr >> 32) - 1, off = addr & 0xffffffffull;
	if (b >= buffers.size()) fail("pointer " + std::to_string(addr) + " names no buffer");
	if (off > buffers[b].size) fail("pointer offset " + std::to_string(off) + " past buffer " + std::to_string(b));
	return buffers[b].p + off;
}

template <class T>
T convert(const Arg& a, int i) {
	auto want = [&](unsigned char k, const char* name) {
		if (a.kind != k) fail("argument "  + std::to_string(i) + " has kind " + std::to_string(a.kind) + ", the kernel takes " + name);
	};
	if constexpr (std::is_pointer_v<T>) {
		want(0, "a pointer");
		return reinterpret_cast<T>(resolve(a.bits));
	} else if constexpr (std::is_same_v<T, int>) {
		want(1, "int");
		return (int)(unsigned)a.bits;
	} else if constexpr (std::is_same_v<T, unsigned int>) {
		want(2, "unsigned int");
		return (unsigned)a.bits;
	} else if constexpr (std::is_same_v<T, long long>) {
		want(3, "long long");
		return (long long)a.bits;
	} else if constexpr (std::is_same_v<T, unsigned long long>) {
		want(4, "unsigned long long");
		return a.bits;
	} else if constexpr (std::is_same_v<T, float>) {
		want(5, "float");
		unsigned u = (unsigned)a.bits;
		float f;
		std::memcpy(&f, &u, 4);
		return f;
	} else if constexpr (std::is_same_v<T, double>) {
		want(6, "double");
		double d;
		std::memcpy(&d, &a.bits, 8);
		return d;
	} else {
		static_assert(!sizeof(T), "kernel parameter of a type the launcher cannot pass");
	}
}

using Caller = std::function<void(const std::vector<Arg>&)>;

template <class... P, std::size_t... I>
void invoke(void (*f)(P...), const std::vector<Arg>& a, std::index_sequence<I...>) {
	f(convert<P>(a[I], (int)I)...);
}

template <class... P, std::size_t... I>
void check(const std::vector<Arg>& a, std::index_sequence<I...>) {
	(convert<P>(a[I], (int)I), ...);
}

struct Entry {
	const char* name;
	Caller check;  // validates the arguments once, before the launch
	Caller call;
};

template <class... P>
Entry entry(const char* name, void (*f)(P...)) {
	return Entry{
		name,
		[name](const std::vector<Arg>& a) {
			if (a.size() != sizeof...(P))
				fail(std::string(name) + " takes " + std::to_string(sizeof...(P)) + " arguments, the launch passed " + std::to_string(a.size()));
			check<P...>(a, std::index_sequence_for<P...>{});
		},
		[f](const std::vector<Arg>& a) { invoke(f, a, std::index_sequence_for<P...>{}); },
	};
}

}  // namespace emu

#define EMU_ENTRY(n) emu::entry(#n, &n),
static std::vector<emu::Entry> registry = {
#include "registry.inc"
};
#undef EMU_ENTRY

template <class T>
static T get(std::FILE* f) {
	T v;
	if (std::fread(&v, sizeof v, 1, f) != 1) emu::fail("script truncated");
	return v;
}

int main(int argc, char** argv) {
	if (argc != 3) emu::fail("usage: driver SCRIPT OUTPUT");
	std::FILE* in = std::fopen(argv[1], "rb");
	if (!in) emu::fail(std::string("cannot open ") + argv[1]);
	char magic[4];
	if (std::fread(magic, 1, 4, in) != 4 || std::memcmp(magic, "EMU1", 4) != 0) emu::fail("not an EMU1 script");
	unsigned nbuf = get<unsigned>(in);
	for (unsigned i = 0; i < nbuf; i++) {
		emu::Buffer b;
		b.size = get<unsigned long long>(in);
		// 256-byte aligned as cuMemAlloc's, and exactly size bytes, so
		// AddressSanitizer sees an overrun.
		void* p = nullptr;
		if (posix_memalign(&p, 256, b.size ? b.size : 1) != 0) emu::fail("out of memory");
		b.p = static_cast<unsigned char*>(p);
		if (b.size && std::fread(b.p, 1, b.size, in) != b.size) emu::fail("script truncated");
		emu::buffers.push_back(b);
	}
	unsigned nl = get<unsigned>(in);
	for (unsigned i = 0; i < nl; i++) {
		unsigned fn = get<unsigned>(in);
		dim3 g, b;
		g.x = get<unsigned>(in), g.y = get<unsigned>(in), g.z = get<unsigned>(in);
		b.x = get<unsigned>(in), b.y = get<unsigned>(in), b.z = get<unsigned>(in);
		unsigned long long shared = get<unsigned long long>(in);
		unsigned na = get<unsigned>(in);
		std::vector<emu::Arg> args(na);
		for (auto& a : args) {
			a.kind = get<unsigned char>(in);
			a.bits = get<unsigned long long>(in);
		}
		if (fn >= registry.size()) emu::fail("no kernel " + std::to_string(fn));
		emu::Entry& e = registry[fn];
		emu::where = "launch " + std::to_string(i) + " (" + e.name + "): ";
		e.check(args);
		emu::where.clear();
		emu::launch(g, b, shared, [&] { e.call(args); });
	}
	std::fclose(in);
	std::FILE* out = std::fopen(argv[2], "wb");
	if (!out) emu::fail(std::string("cannot create ") + argv[2]);
	std::fwrite(&nbuf, 4, 1, out);
	for (auto& b : emu::buffers) {
		std::fwrite(&b.size, 8, 1, out);
		std::fwrite(b.p, 1, b.size, out);
	}
	if (std::fclose(out) != 0) emu::fail("writing output");
	for (auto& b : emu::buffers) std::free(b.p);
	return 0;
}
