/*
 * nvrtc.c: a stand-in libnvrtc.so.12 for the tests of gptui's GPU backend
 * on a machine without a GPU. It compiles nothing: the kernels run on the
 * CPU from the library package kernels/cuda/emu builds of the same source
 * (see cuda.c). What it makes of a program is an image the stand-in
 * libcuda.so.1 loads and no driver does:
 *
 *	GPTUIEMU1 HASH ARCH
 *
 * HASH is the FNV-1a (64 bits, hex) of the source, ARCH the option's
 * architecture. The stand-in driver loads it only beside a kernels library
 * built from a source of the same hash, so that a test whose library is
 * stale fails at cuModuleLoadData rather than running other kernels.
 *
 * Like NVRTC it is version 12.8; nvrtcCompileProgram needs one
 * --gpu-architecture (-arch) option, sm_XY (the image is then a CUBIN:
 * nvrtcGetCUBIN) or compute_XY (PTX: nvrtcGetPTX), and fails with
 * NVRTC_ERROR_INVALID_OPTION without one; asking for the other kind of
 * image fails with NVRTC_ERROR_INVALID_INPUT, as NVRTC's does.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

enum {
	NVRTC_SUCCESS = 0,
	NVRTC_ERROR_OUT_OF_MEMORY = 1,
	NVRTC_ERROR_INVALID_INPUT = 3,
	NVRTC_ERROR_INVALID_PROGRAM = 4,
	NVRTC_ERROR_INVALID_OPTION = 5,
};

struct program {
	char *src;
	char image[96]; /* "" until compiled */
	int cubin;      /* the image is a CUBIN (sm_XY), not PTX */
};

EXPORT int nvrtcVersion(int *major, int *minor) {
	if (major == NULL || minor == NULL)
		return NVRTC_ERROR_INVALID_INPUT;
	*major = 12, *minor = 8;
	return NVRTC_SUCCESS;
}

EXPORT const char *nvrtcGetErrorString(int r) {
	switch (r) {
	case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
	case NVRTC_ERROR_OUT_OF_MEMORY: return "NVRTC_ERROR_OUT_OF_MEMORY";
	case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
	case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
	case NVRTC_ERROR_INVALID_OPTION: return "NVRTC_ERROR_INVALID_OPTION";
	}
	return "NVRTC_ERROR unknown";
}

EXPORT int nvrtcCreateProgram(struct program **out, const char *src, const char *name, int nh, const char *const *h,
                              const char *const *inc) {
	(void)name, (void)h, (void)inc;
	if (out == NULL || src == NULL || nh != 0)
		return NVRTC_ERROR_INVALID_INPUT;
	struct program *p = calloc(1, sizeof *p);
	if (p == NULL || (p->src = strdup(src)) == NULL) {
		free(p);
		return NVRTC_ERROR_OUT_OF_MEMORY;
	}
	*out = p;
	return NVRTC_SUCCESS;
}

EXPORT int nvrtcDestroyProgram(struct program **p) {
	if (p == NULL || *p == NULL)
		return NVRTC_ERROR_INVALID_PROGRAM;
	free((*p)->src);
	free(*p);
	*p = NULL;
	return NVRTC_SUCCESS;
}

static unsigned long long fnv1a(const char *s) {
	unsigned long long h = 0xcbf29ce484222325ULL;
	for (; *s; s++) {
		h ^= (unsigned char)*s;
		h *= 0x100000001b3ULL;
	}
	return h;
}

EXPORT int nvrtcCompileProgram(struct program *p, int n, const char *const *opts) {
	if (p == NULL)
		return NVRTC_ERROR_INVALID_PROGRAM;
	const char *arch = NULL;
	for (int i = 0; i < n; i++) {
		const char *o = opts[i];
		if (strncmp(o, "--gpu-architecture=", 19) == 0)
			arch = o + 19;
		else if (strncmp(o, "-arch=", 6) == 0)
			arch = o + 6;
	}
	if (arch == NULL || (strncmp(arch, "sm_", 3) != 0 && strncmp(arch, "compute_", 8) != 0) || strlen(arch) > 16)
		return NVRTC_ERROR_INVALID_OPTION;
	p->cubin = strncmp(arch, "sm_", 3) == 0;
	snprintf(p->image, sizeof p->image, "GPTUIEMU1 %016llx %s\n", fnv1a(p->src), arch);
	return NVRTC_SUCCESS;
}

EXPORT int nvrtcGetProgramLogSize(struct program *p, size_t *n) {
	if (p == NULL || n == NULL)
		return NVRTC_ERROR_INVALID_INPUT;
	*n = 1;
	return NVRTC_SUCCESS;
}

EXPORT int nvrtcGetProgramLog(struct program *p, char *log) {
	if (p == NULL || log == NULL)
		return NVRTC_ERROR_INVALID_INPUT;
	*log = '\0';
	return NVRTC_SUCCESS;
}

static int size(struct program *p, int cubin, size_t *n) {
	if (p == NULL || n == NULL || p->image[0] == '\0' || p->cubin != cubin)
		return NVRTC_ERROR_INVALID_INPUT;
	*n = strlen(p->image) + 1;
	return NVRTC_SUCCESS;
}

static int get(struct program *p, int cubin, char *out) {
	size_t n;
	int r = size(p, cubin, &n);
	if (r == NVRTC_SUCCESS && out == NULL)
		r = NVRTC_ERROR_INVALID_INPUT;
	if (r == NVRTC_SUCCESS)
		memcpy(out, p->image, n);
	return r;
}

EXPORT int nvrtcGetCUBINSize(struct program *p, size_t *n) { return size(p, 1, n); }
EXPORT int nvrtcGetCUBIN(struct program *p, char *out) { return get(p, 1, out); }
EXPORT int nvrtcGetPTXSize(struct program *p, size_t *n) { return size(p, 0, n); }
EXPORT int nvrtcGetPTX(struct program *p, char *out) { return get(p, 0, out); }
