/*
 * cuda.c: a stand-in libcuda.so.1 for the tests of gptui's GPU path on a
 * machine without a GPU. It exports every function package kernels/cuda
 * binds (driver.go, event.go, staging.go), so that cuda.Open loads it through the
 * same purego path as the NVIDIA driver, and implements what the NCCL
 * fabric (package comm/nccl) and the GPU backend (kernels/cuda's Backend)
 * use:
 *
 *   - 8 devices, "gptui stand-in (CPU)", compute capability 9.0; the
 *     primary context of each; cuCtxSetCurrent is per thread, and the
 *     calls that need a context fail with CUDA_ERROR_INVALID_CONTEXT on a
 *     thread that has none current, as the driver's do;
 *   - "device memory" (cuMemAlloc) is host memory of the process that
 *     the stand-in keeps a list of: cuPointerGetAttribute says
 *     CU_MEMORYTYPE_DEVICE for it and fails with
 *     CUDA_ERROR_INVALID_VALUE for anything else (Go's heap), as the
 *     driver does for memory it does not know;
 *   - streams run their work asynchronously and in order, one thread per
 *     stream; events mark places in streams (cuEventQuery answers
 *     CUDA_ERROR_NOT_READY until the work before the record has run);
 *     cuStreamWaitEvent makes a stream wait for the record the event had
 *     when it was called;
 *   - page-locked host memory (cuMemAllocHost) is host memory it keeps a
 *     list of (CU_MEMORYTYPE_HOST); cuMemcpyHtoDAsync queues a copy from
 *     it on a stream, and refuses other host memory
 *     (CUDA_ERROR_INVALID_VALUE) rather than copy it synchronously as the
 *     driver would;
 *   - the synchronous copies (cuMemcpyHtoD, cuMemcpyDtoH) run on the
 *     legacy default stream: after every stream's work queued before
 *     them, as the streams are blocking ones (CU_STREAM_DEFAULT). Work
 *     queued on stream 0 likewise runs on the calling thread after every
 *     stream's (the host waits, which the driver's legacy stream does
 *     not make it do).
 *
 *   - address ranges (cuMemAddressReserve) with memory mapped into them
 *     (cuMemCreate, cuMemMap, cuMemSetAccess): the new memory is 0xff
 *     bytes, the rest of a range faults (see "Virtual memory
 *     management" below);
 *   - kernels run on the CPU, from libgptuiemu.so (package
 *     kernels/cuda/emu's BuildLibrary: the very kernel sources, compiled
 *     with its emulator), which GPTUI_STANDIN_EMU_LIB names. An image
 *     (cuModuleLoadData) is the stand-in libnvrtc's: "GPTUIEMU1 HASH",
 *     HASH the FNV-1a of the source it was given, which must be the
 *     library's (else CUDA_ERROR_INVALID_IMAGE, as for a CUBIN of
 *     another GPU); a real CUBIN or PTX is refused alike.
 *     cuLaunchKernel copies the arguments at the call, as the driver
 *     does, checks the grid, the block and the dynamic shared memory
 *     against the function's limit (48 KiB until cuFuncSetAttribute
 *     raises it, at most 227 KiB), and queues the kernel on the stream.
 *     Launches run one at a time in the process.
 *
 * Where it differs from the driver, it fails rather than pretends:
 * there is no managed memory (cuMemAllocManaged, cuMemPrefetchAsync and
 * cuMemAdvise fail with CUDA_ERROR_NOT_SUPPORTED); without
 * GPTUI_STANDIN_EMU_LIB no module loads (CUDA_ERROR_NOT_SUPPORTED). A
 * kernel that reads or writes outside its buffers is not caught (the
 * emulator's sanitized builds of package cuda's tests do that).
 *
 * The stand-in libnccl.so.2 (nccl.c) queues its operations on these
 * streams through gptuiStandinEnqueue (standin.h).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sys/mman.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "standin.h"

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct ctx *CUcontext;
typedef struct stream *CUstream;
typedef struct event *CUevent;

/* CUresult values (cuda.h). */
enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_IMAGE = 200,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_FILE_NOT_FOUND = 301,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_NOT_SUPPORTED = 801,
};

/* Device attributes (cuda.h, CUdevice_attribute). */
enum {
	ATTR_MAX_THREADS_PER_BLOCK = 1,
	ATTR_MAX_SHARED_MEMORY_PER_BLOCK = 8,
	ATTR_WARP_SIZE = 10,
	ATTR_MAX_REGISTERS_PER_BLOCK = 12,
	ATTR_MULTIPROCESSOR_COUNT = 16,
	ATTR_COMPUTE_CAPABILITY_MAJOR = 75,
	ATTR_COMPUTE_CAPABILITY_MINOR = 76,
	ATTR_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81,
	ATTR_MANAGED_MEMORY = 83,
	ATTR_CONCURRENT_MANAGED_ACCESS = 89,
	ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
};

/* Pointer attributes and memory types (cuda.h). */
enum {
	POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
	POINTER_ATTRIBUTE_IS_MANAGED = 8,
	MEMORYTYPE_HOST = 1,
	MEMORYTYPE_DEVICE = 2,
};

enum { CU_EVENT_DISABLE_TIMING = 0x2 };

/* Function attributes (cuda.h, CUfunction_attribute). */
enum { FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8 };

/* The opt-in shared memory per block: H100's. */
#define SHARED_OPTIN (227 << 10)

#define NDEV 8
#define DRIVER_VERSION 12080 /* CUDA 12.8 */
/* Each device's memory: 16 GiB, or GPTUI_STANDIN_CUDA_MEMORY bytes (set
 * by cuInit), for tests of a device too small for a job. */
static size_t total_memory = 16ULL << 30;
#define TOTAL_MEMORY total_memory

struct ctx {
	int dev;
	int refs;
};

/* task is one item of work queued on a stream. */
struct task {
	void (*run)(void *);
	void *arg;
	struct task *next;
};

struct stream {
	struct task *head, *tail;
	uint64_t queued, ran;
	int dead;
	struct stream *next; /* in the list of all streams */
};

struct event {
	uint64_t rec;  /* records made */
	uint64_t done; /* the last record the stream has passed */
	int timing;
	int pending; /* marks queued and not run */
	int dead;
	struct timespec at;
};

/* alloc is one cuMemAlloc, one cuMemAllocHost, or one cuMemMap (vmm):
 * [base, base+size). */
struct alloc {
	char *base;
	size_t size;
	int vmm;
	void *handle; /* vmm: the struct handle mapped here */
	struct alloc *next;
};

/* One lock for all of the stand-in's state; cv is broadcast on every
 * change a waiter may wait for. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int initialized;
static struct ctx ctxs[NDEV];
static struct stream *streams;
static struct alloc *allocs; /* device memory */
static struct alloc *pinned; /* page-locked host memory */
static size_t allocated;
static __thread struct ctx *current;

#define NEED_INIT()                                    \
	do {                                               \
		if (!initialized)                              \
			return CUDA_ERROR_NOT_INITIALIZED;         \
	} while (0)
#define NEED_CTX()                                     \
	do {                                               \
		NEED_INIT();                                   \
		if (current == NULL)                           \
			return CUDA_ERROR_INVALID_CONTEXT;         \
	} while (0)

/* Errors. */

static const struct {
	int code;
	const char *name, *msg;
} errors[] = {
	{CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
	{CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	{CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
	{CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	{CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
	{CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid (the stand-in loads only its libnvrtc's images, with a kernels library built from the same source)"},
	{CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
	{CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found (the stand-in's kernels library, GPTUI_STANDIN_EMU_LIB)"},
	{CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
	{CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
	{CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
	{CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported (the stand-in libcuda.so.1 has no managed memory, and runs kernels only from GPTUI_STANDIN_EMU_LIB)"},
};

EXPORT CUresult cuGetErrorName(CUresult r, const char **s) {
	for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++) {
		if (errors[i].code == r) {
			*s = errors[i].name;
			return CUDA_SUCCESS;
		}
	}
	*s = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorString(CUresult r, const char **s) {
	for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++) {
		if (errors[i].code == r) {
			*s = errors[i].msg;
			return CUDA_SUCCESS;
		}
	}
	*s = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

/* Initialisation, devices, contexts. */

EXPORT CUresult cuInit(unsigned flags) {
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	if (!initialized) {
		for (int i = 0; i < NDEV; i++)
			ctxs[i].dev = i;
		const char *m = getenv("GPTUI_STANDIN_CUDA_MEMORY");
		if (m != NULL && *m != '\0')
			total_memory = strtoull(m, NULL, 10);
		initialized = 1;
	}
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *v) {
	if (v == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*v = DRIVER_VERSION;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *n) {
	NEED_INIT();
	*n = NDEV;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
	NEED_INIT();
	if (ordinal < 0 || ordinal >= NDEV)
		return CUDA_ERROR_INVALID_DEVICE;
	*d = ordinal;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= NDEV)
		return CUDA_ERROR_INVALID_DEVICE;
	if (len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(name, (size_t)len, "gptui stand-in (CPU)");
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= NDEV)
		return CUDA_ERROR_INVALID_DEVICE;
	switch (attr) {
	case ATTR_MAX_THREADS_PER_BLOCK: *v = 1024; break;
	case ATTR_MAX_SHARED_MEMORY_PER_BLOCK: *v = 48 << 10; break;
	case ATTR_WARP_SIZE: *v = 32; break;
	case ATTR_MAX_REGISTERS_PER_BLOCK: *v = 65536; break;
	case ATTR_MULTIPROCESSOR_COUNT: *v = 1; break;
	case ATTR_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
	case ATTR_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
	case ATTR_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *v = 228 << 10; break;
	case ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = SHARED_OPTIN; break;
	case ATTR_MANAGED_MEMORY: *v = 0; break;
	case ATTR_CONCURRENT_MANAGED_ACCESS: *v = 0; break;
	default: *v = 0; break;
	}
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *n, CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= NDEV)
		return CUDA_ERROR_INVALID_DEVICE;
	*n = TOTAL_MEMORY;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= NDEV)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	ctxs[d].refs++;
	pthread_mutex_unlock(&mu);
	*c = &ctxs[d];
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= NDEV)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	if (ctxs[d].refs > 0)
		ctxs[d].refs--;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
	NEED_INIT();
	if (c != NULL && (c < &ctxs[0] || c >= &ctxs[NDEV]))
		return CUDA_ERROR_INVALID_CONTEXT;
	current = c;
	return CUDA_SUCCESS;
}

/* Streams. */

/* runner is a stream's thread: it runs the stream's tasks in order, and
 * ends once the stream is destroyed and its work done. */
static void *runner(void *arg) {
	struct stream *s = arg;
	pthread_mutex_lock(&mu);
	for (;;) {
		while (s->head == NULL && !s->dead)
			pthread_cond_wait(&cv, &mu);
		if (s->head == NULL)
			break;
		struct task *t = s->head;
		pthread_mutex_unlock(&mu);
		t->run(t->arg);
		pthread_mutex_lock(&mu);
		s->head = t->next;
		if (s->head == NULL)
			s->tail = NULL;
		s->ran++;
		free(t);
		pthread_cond_broadcast(&cv);
	}
	for (struct stream **p = &streams; *p != NULL; p = &(*p)->next) {
		if (*p == s) {
			*p = s->next;
			break;
		}
	}
	pthread_mutex_unlock(&mu);
	free(s);
	return NULL;
}

/* live reports whether s is a stream not destroyed (under mu). */
static int live(struct stream *s) {
	for (struct stream *p = streams; p != NULL; p = p->next)
		if (p == s)
			return !p->dead;
	return 0;
}

/* drain waits until every stream has run the work queued on it so far
 * (under mu). */
static void drain(void) {
	for (struct stream *s = streams; s != NULL; s = s->next) {
		uint64_t n = s->queued;
		while (s->ran < n)
			pthread_cond_wait(&cv, &mu);
	}
}

/* enqueue queues run(arg) on s (under mu); on stream 0 it runs it on the
 * calling thread after every stream's work so far (dropping mu meanwhile). */
static CUresult enqueue(struct stream *s, void (*run)(void *), void *arg) {
	if (s == NULL) {
		drain();
		pthread_mutex_unlock(&mu);
		run(arg);
		pthread_mutex_lock(&mu);
		pthread_cond_broadcast(&cv);
		return CUDA_SUCCESS;
	}
	if (!live(s))
		return CUDA_ERROR_INVALID_HANDLE;
	struct task *t = calloc(1, sizeof *t);
	if (t == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	t->run = run;
	t->arg = arg;
	if (s->tail != NULL)
		s->tail->next = t;
	else
		s->head = t;
	s->tail = t;
	s->queued++;
	pthread_cond_broadcast(&cv);
	return CUDA_SUCCESS;
}

EXPORT int gptuiStandinEnqueue(void *s, void (*run)(void *), void *arg) {
	pthread_mutex_lock(&mu);
	CUresult r = enqueue(s, run, arg);
	pthread_mutex_unlock(&mu);
	return r;
}

EXPORT int gptuiStandinCurrentDevice(void) { return current == NULL ? -1 : current->dev; }

EXPORT CUresult cuStreamCreate(CUstream *out, unsigned flags) {
	(void)flags;
	NEED_CTX();
	struct stream *s = calloc(1, sizeof *s);
	if (s == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_attr_t a;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	pthread_mutex_lock(&mu);
	pthread_t th;
	if (pthread_create(&th, &a, runner, s) != 0) {
		pthread_mutex_unlock(&mu);
		pthread_attr_destroy(&a);
		free(s);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	s->next = streams;
	streams = s;
	pthread_mutex_unlock(&mu);
	pthread_attr_destroy(&a);
	*out = s;
	return CUDA_SUCCESS;
}

/* cuStreamDestroy returns at once; the stream's thread finishes its work
 * and then frees it, as the driver releases a stream's resources once its
 * work is done. */
EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
	NEED_INIT();
	pthread_mutex_lock(&mu);
	if (s == NULL || !live(s)) {
		pthread_mutex_unlock(&mu);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	s->dead = 1;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream s) {
	NEED_INIT();
	pthread_mutex_lock(&mu);
	if (s == NULL) {
		drain();
	} else if (!live(s)) {
		pthread_mutex_unlock(&mu);
		return CUDA_ERROR_INVALID_HANDLE;
	} else {
		uint64_t n = s->queued;
		while (s->ran < n)
			pthread_cond_wait(&cv, &mu);
	}
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	drain();
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

/* Events. */

EXPORT CUresult cuEventCreate(CUevent *out, unsigned flags) {
	NEED_CTX();
	struct event *e = calloc(1, sizeof *e);
	if (e == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	e->timing = !(flags & CU_EVENT_DISABLE_TIMING);
	*out = e;
	return CUDA_SUCCESS;
}

/* cuEventDestroy returns at once; a record still queued frees the event
 * when it runs. */
EXPORT CUresult cuEventDestroy_v2(CUevent e) {
	NEED_INIT();
	if (e == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	e->dead = 1;
	int idle = e->pending == 0;
	pthread_mutex_unlock(&mu);
	if (idle)
		free(e);
	return CUDA_SUCCESS;
}

struct mark {
	struct event *e;
	uint64_t gen;
};

static void run_mark(void *arg) {
	struct mark *m = arg;
	struct event *e = m->e;
	pthread_mutex_lock(&mu);
	if (m->gen > e->done) {
		e->done = m->gen;
		clock_gettime(CLOCK_MONOTONIC, &e->at);
	}
	int last = --e->pending == 0 && e->dead;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	if (last)
		free(e);
	free(m);
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
	NEED_INIT();
	if (e == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	struct mark *m = malloc(sizeof *m);
	if (m == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&mu);
	if (e->dead) {
		pthread_mutex_unlock(&mu);
		free(m);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	m->e = e;
	m->gen = ++e->rec;
	e->pending++;
	CUresult r = enqueue(s, run_mark, m);
	if (r != CUDA_SUCCESS) {
		e->pending--;
		e->rec--;
		free(m);
	}
	pthread_mutex_unlock(&mu);
	return r;
}

EXPORT CUresult cuEventQuery(CUevent e) {
	NEED_INIT();
	if (e == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	CUresult r = e->dead ? CUDA_ERROR_INVALID_HANDLE : e->done >= e->rec ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
	pthread_mutex_unlock(&mu);
	return r;
}

EXPORT CUresult cuEventSynchronize(CUevent e) {
	NEED_INIT();
	if (e == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	uint64_t g = e->rec;
	while (e->done < g)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) {
	NEED_INIT();
	if (a == NULL || b == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	CUresult r = CUDA_SUCCESS;
	if (!a->timing || !b->timing)
		r = CUDA_ERROR_INVALID_HANDLE;
	else if (a->done < a->rec || b->done < b->rec)
		r = CUDA_ERROR_NOT_READY;
	else
		*ms = (float)((b->at.tv_sec - a->at.tv_sec) * 1e3 + (b->at.tv_nsec - a->at.tv_nsec) / 1e6);
	pthread_mutex_unlock(&mu);
	return r;
}

struct wait {
	struct event *e;
	uint64_t gen;
};

static void run_wait(void *arg) {
	struct wait *w = arg;
	pthread_mutex_lock(&mu);
	while (w->e->done < w->gen)
		pthread_cond_wait(&cv, &mu);
	int last = --w->e->pending == 0 && w->e->dead;
	pthread_mutex_unlock(&mu);
	if (last)
		free(w->e);
	free(w);
}

EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags) {
	(void)flags;
	NEED_INIT();
	if (e == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	struct wait *w = malloc(sizeof *w);
	if (w == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&mu);
	w->e = e;
	w->gen = e->rec;
	e->pending++;
	CUresult r = enqueue(s, run_wait, w);
	if (r != CUDA_SUCCESS) {
		e->pending--;
		free(w);
	}
	pthread_mutex_unlock(&mu);
	return r;
}

/* Memory. */

/* findIn returns the allocation of list holding [p, p+n), or NULL (under
 * mu). */
static struct alloc *findIn(struct alloc *list, const void *p, size_t n) {
	const char *c = p;
	for (struct alloc *a = list; a != NULL; a = a->next)
		if (c >= a->base && c + n <= a->base + a->size && c + n >= c)
			return a;
	return NULL;
}

/* find returns the device allocation holding [p, p+n), or NULL (under mu).
 * A range across mappings that cuMemMap placed end to end is device
 * memory too, as on the GPU: the first of them is returned. */
static struct alloc *find(const void *p, size_t n) {
	struct alloc *a = findIn(allocs, p, n);
	if (a != NULL || n == 0)
		return a;
	const char *c = p, *end = c + n;
	struct alloc *first = NULL;
	while (c < end) {
		struct alloc *m = NULL;
		for (struct alloc *b = allocs; b != NULL; b = b->next)
			if (b->vmm && c >= b->base && c < b->base + b->size)
				m = b;
		if (m == NULL)
			return NULL;
		if (first == NULL)
			first = m;
		c = m->base + m->size;
	}
	return first;
}

EXPORT int gptuiStandinIsDevice(const void *p, size_t n) {
	pthread_mutex_lock(&mu);
	int ok = find(p, n) != NULL;
	pthread_mutex_unlock(&mu);
	return ok;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_, size_t *total) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	*total = TOTAL_MEMORY;
	*free_ = allocated < TOTAL_MEMORY ? TOTAL_MEMORY - allocated : 0;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	NEED_CTX();
	if (getenv("GPTUI_STANDIN_CUDA_TRACE") != NULL)
		fprintf(stderr, "[standin] cuMemAlloc_v2 %zu\n", n);
	if (n == 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct alloc *a = calloc(1, sizeof *a);
	if (a == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&mu);
	if (n > TOTAL_MEMORY - allocated || posix_memalign((void **)&a->base, 256, n) != 0) {
		pthread_mutex_unlock(&mu);
		free(a);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	a->size = n;
	a->next = allocs;
	allocs = a;
	allocated += n;
	pthread_mutex_unlock(&mu);
	*p = (CUdeviceptr)(uintptr_t)a->base;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	for (struct alloc **q = &allocs; *q != NULL; q = &(*q)->next) {
		struct alloc *a = *q;
		if ((uintptr_t)a->base == p && !a->vmm) {
			*q = a->next;
			allocated -= a->size;
			pthread_mutex_unlock(&mu);
			free(a->base);
			free(a);
			return CUDA_SUCCESS;
		}
	}
	pthread_mutex_unlock(&mu);
	return CUDA_ERROR_INVALID_VALUE;
}

/* Virtual memory management: address ranges (cuMemAddressReserve) with
 * memory mapped into them (cuMemCreate, cuMemMap, cuMemSetAccess). A
 * reserved range is host address space with no access (PROT_NONE); mapped
 * memory becomes device memory (an alloc, vmm) at cuMemMap, readable and
 * writable only after cuMemSetAccess, and filled with 0xff bytes (NaN as
 * floats): cuMemCreate's memory is not zeroed. The granularity is 2 MiB,
 * and sizes and addresses that are not multiples of it are refused, as
 * the driver refuses them. */

#define GRANULARITY ((size_t)2 << 20)

struct reservation {
	char *base;
	size_t size;
	struct reservation *next;
};

static struct reservation *reservations;

/* CUmemAllocationProp's fields the stand-in reads. */
struct alloc_prop {
	int type, handle_types, loc_type, loc_id;
};

/* handle is a CUmemGenericAllocationHandle: the memory of one cuMemCreate. */
struct handle {
	size_t size;
	char *mapped; /* where cuMemMap put it, or NULL */
};

static int good_prop(const struct alloc_prop *p) {
	return p != NULL && p->type == 1 /* PINNED */ && p->loc_type == 1 /* DEVICE */ && p->loc_id >= 0 && p->loc_id < NDEV;
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const struct alloc_prop *prop, int option) {
	NEED_INIT();
	if (g == NULL || !good_prop(prop) || (option != 0 && option != 1))
		return CUDA_ERROR_INVALID_VALUE;
	*g = GRANULARITY;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
	NEED_INIT();
	if (p == NULL || size == 0 || size % GRANULARITY != 0 || flags != 0 || (align != 0 && align % GRANULARITY != 0))
		return CUDA_ERROR_INVALID_VALUE;
	(void)addr; /* a hint */
	if (align < GRANULARITY)
		align = GRANULARITY;
	struct reservation *r = calloc(1, sizeof *r);
	if (r == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	/* Aligned: map size+align and trim both ends. */
	char *m = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED) {
		free(r);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	char *base = (char *)(((uintptr_t)m + align - 1) / align * align);
	if (base > m)
		munmap(m, (size_t)(base - m));
	if (base + size < m + size + align)
		munmap(base + size, (size_t)(m + size + align - (base + size)));
	r->base = base;
	r->size = size;
	pthread_mutex_lock(&mu);
	r->next = reservations;
	reservations = r;
	pthread_mutex_unlock(&mu);
	*p = (CUdeviceptr)(uintptr_t)base;
	return CUDA_SUCCESS;
}

/* reservation_of returns the reservation holding [p, p+n), or NULL (under mu). */
static struct reservation *reservation_of(const char *p, size_t n) {
	for (struct reservation *r = reservations; r != NULL; r = r->next)
		if (p >= r->base && p + n <= r->base + r->size && p + n >= p)
			return r;
	return NULL;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
	NEED_INIT();
	char *c = (char *)(uintptr_t)p;
	pthread_mutex_lock(&mu);
	for (struct reservation **q = &reservations; *q != NULL; q = &(*q)->next) {
		struct reservation *r = *q;
		if (r->base != c || r->size != size)
			continue;
		for (struct alloc *a = allocs; a != NULL; a = a->next)
			if (a->vmm && a->base >= r->base && a->base < r->base + r->size) {
				pthread_mutex_unlock(&mu);
				return CUDA_ERROR_INVALID_VALUE; /* still mapped */
			}
		*q = r->next;
		pthread_mutex_unlock(&mu);
		munmap(r->base, r->size);
		free(r);
		return CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&mu);
	return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemCreate(unsigned long long *h, size_t size, const struct alloc_prop *prop, unsigned long long flags) {
	NEED_CTX();
	if (h == NULL || size == 0 || size % GRANULARITY != 0 || !good_prop(prop) || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct handle *m = calloc(1, sizeof *m);
	if (m == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&mu);
	if (size > TOTAL_MEMORY - allocated) {
		pthread_mutex_unlock(&mu);
		free(m);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	allocated += size;
	pthread_mutex_unlock(&mu);
	m->size = size;
	*h = (unsigned long long)(uintptr_t)m;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemRelease(unsigned long long h) {
	NEED_INIT();
	struct handle *m = (struct handle *)(uintptr_t)h;
	if (m == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (m->mapped != NULL)
		return CUDA_ERROR_INVALID_VALUE; /* the driver defers this; the stand-in asks for cuMemUnmap first */
	pthread_mutex_lock(&mu);
	allocated -= m->size;
	pthread_mutex_unlock(&mu);
	free(m);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, unsigned long long h, unsigned long long flags) {
	NEED_INIT();
	struct handle *m = (struct handle *)(uintptr_t)h;
	char *c = (char *)(uintptr_t)p;
	if (m == NULL || m->mapped != NULL || offset != 0 || size != m->size || flags != 0 || (uintptr_t)c % GRANULARITY != 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct alloc *a = calloc(1, sizeof *a);
	if (a == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&mu);
	int overlap = 0;
	for (struct alloc *b = allocs; b != NULL; b = b->next)
		if (b->vmm && c < b->base + b->size && b->base < c + size)
			overlap = 1;
	if (reservation_of(c, size) == NULL || overlap) {
		pthread_mutex_unlock(&mu);
		free(a);
		return CUDA_ERROR_INVALID_VALUE;
	}
	a->base = c;
	a->size = size;
	a->vmm = 1;
	a->handle = m;
	a->next = allocs;
	allocs = a;
	m->mapped = c;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

/* CUmemAccessDesc */
struct access_desc {
	int loc_type, loc_id, flags;
};

EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const struct access_desc *d, size_t count) {
	NEED_INIT();
	char *c = (char *)(uintptr_t)p;
	if (d == NULL || count != 1 || d->loc_type != 1 || d->loc_id < 0 || d->loc_id >= NDEV || (d->flags != 3 && d->flags != 0))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	/* Every byte must be mapped: one mapping here (the backend's case). */
	int ok = 0;
	for (struct alloc *a = allocs; a != NULL; a = a->next)
		if (a->vmm && c >= a->base && c + size <= a->base + a->size)
			ok = 1;
	pthread_mutex_unlock(&mu);
	if (!ok)
		return CUDA_ERROR_INVALID_VALUE;
	if (mprotect(c, size, d->flags == 3 ? PROT_READ | PROT_WRITE : PROT_NONE) != 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (d->flags == 3)
		memset(c, 0xff, size);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
	NEED_INIT();
	char *c = (char *)(uintptr_t)p;
	pthread_mutex_lock(&mu);
	for (struct alloc **q = &allocs; *q != NULL; q = &(*q)->next) {
		struct alloc *a = *q;
		if (!a->vmm || a->base != c || a->size != size)
			continue;
		*q = a->next;
		((struct handle *)a->handle)->mapped = NULL;
		pthread_mutex_unlock(&mu);
		/* Back to reserved addresses, the memory given back. */
		mmap(c, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
		free(a);
		return CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&mu);
	return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
	NEED_INIT();
	pthread_mutex_lock(&mu);
	int dev = find((const void *)(uintptr_t)p, 1) != NULL;
	int host = findIn(pinned, (const void *)(uintptr_t)p, 1) != NULL;
	pthread_mutex_unlock(&mu);
	if (!dev && !host)
		return CUDA_ERROR_INVALID_VALUE;
	switch (attr) {
	case POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned *)data = dev ? MEMORYTYPE_DEVICE : MEMORYTYPE_HOST;
		return CUDA_SUCCESS;
	case POINTER_ATTRIBUTE_IS_MANAGED:
		*(unsigned *)data = 0;
		return CUDA_SUCCESS;
	}
	return CUDA_ERROR_NOT_SUPPORTED;
}

/* cuMemAllocHost: page-locked host memory; the stand-in's is ordinary
 * memory it keeps a list of, so that copies from it can be queued. */
EXPORT CUresult cuMemAllocHost_v2(void **p, size_t n) {
	NEED_CTX();
	if (n == 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct alloc *a = calloc(1, sizeof *a);
	if (a == NULL || posix_memalign((void **)&a->base, 4096, n) != 0) {
		free(a);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	a->size = n;
	pthread_mutex_lock(&mu);
	a->next = pinned;
	pinned = a;
	pthread_mutex_unlock(&mu);
	*p = a->base;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFreeHost(void *p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	for (struct alloc **q = &pinned; *q != NULL; q = &(*q)->next) {
		struct alloc *a = *q;
		if (a->base == p) {
			*q = a->next;
			pthread_mutex_unlock(&mu);
			free(a->base);
			free(a);
			return CUDA_SUCCESS;
		}
	}
	pthread_mutex_unlock(&mu);
	return CUDA_ERROR_INVALID_VALUE;
}

/* copy is a synchronous copy: on the legacy stream, after every stream's
 * work so far. */
static CUresult copy(void *dst, const void *src, size_t n, const void *dev) {
	pthread_mutex_lock(&mu);
	if (find(dev, n) == NULL) {
		pthread_mutex_unlock(&mu);
		return CUDA_ERROR_INVALID_VALUE;
	}
	drain();
	pthread_mutex_unlock(&mu);
	memmove(dst, src, n);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
	NEED_CTX();
	if (n == 0)
		return CUDA_SUCCESS;
	return copy((void *)(uintptr_t)dst, src, n, (void *)(uintptr_t)dst);
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
	NEED_CTX();
	if (n == 0)
		return CUDA_SUCCESS;
	return copy(dst, (const void *)(uintptr_t)src, n, (const void *)(uintptr_t)src);
}

struct mem {
	char *dst;
	const char *src; /* NULL: set to 0 */
	size_t n;
};

static void run_mem(void *arg) {
	struct mem *m = arg;
	if (m->src != NULL)
		memmove(m->dst, m->src, m->n);
	else
		memset(m->dst, 0, m->n);
	free(m);
}

static CUresult queue_mem(CUstream s, char *dst, const char *src, size_t n) {
	if (n == 0)
		return CUDA_SUCCESS;
	struct mem *m = malloc(sizeof *m);
	if (m == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	m->dst = dst;
	m->src = src;
	m->n = n;
	pthread_mutex_lock(&mu);
	CUresult r = CUDA_ERROR_INVALID_VALUE;
	if (find(dst, n) != NULL && (src == NULL || find(src, n) != NULL || findIn(pinned, src, n) != NULL))
		r = enqueue(s, run_mem, m);
	pthread_mutex_unlock(&mu);
	if (r != CUDA_SUCCESS)
		free(m);
	return r;
}

/* cuMemcpyHtoDAsync queues the copy from pinned memory (from other host
 * memory the driver copies synchronously; the stand-in refuses it, so
 * that a caller who means to queue finds out). */
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
	NEED_CTX();
	if (n == 0)
		return CUDA_SUCCESS;
	pthread_mutex_lock(&mu);
	int ok = findIn(pinned, src, n) != NULL;
	pthread_mutex_unlock(&mu);
	if (!ok)
		return CUDA_ERROR_INVALID_VALUE;
	return queue_mem(s, (char *)(uintptr_t)dst, src, n);
}

EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
	NEED_CTX();
	return queue_mem(s, (char *)(uintptr_t)dst, (const char *)(uintptr_t)src, n);
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream s) {
	NEED_CTX();
	if (v != 0) /* the backend only zeroes */
		return CUDA_ERROR_NOT_SUPPORTED;
	return queue_mem(s, (char *)(uintptr_t)p, NULL, n);
}

/* What the stand-in does not have: managed memory and kernels. */

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned flags) {
	(void)p, (void)flags;
	if (getenv("GPTUI_STANDIN_CUDA_TRACE") != NULL)
		fprintf(stderr, "[standin] cuMemAllocManaged %zu\n", n);
	return CUDA_ERROR_NOT_SUPPORTED;
}

typedef struct {
	int type, id;
} CUmemLocation;

EXPORT CUresult cuMemPrefetchAsync_v2(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned flags, CUstream s) {
	(void)p, (void)n, (void)loc, (void)flags, (void)s;
	return CUDA_ERROR_NOT_SUPPORTED;
}

EXPORT CUresult cuMemAdvise_v2(CUdeviceptr p, size_t n, int advice, CUmemLocation loc) {
	(void)p, (void)n, (void)advice, (void)loc;
	return CUDA_ERROR_NOT_SUPPORTED;
}

/* Modules and launches: the kernels of libgptuiemu.so (see the top). */

/* image is the stand-in libnvrtc's: its first line "GPTUIEMU1 HASH ARCH". */
#define IMAGE_MAGIC "GPTUIEMU1 "

struct module {
	void *lib;
	int (*function)(const char *);
	void *(*pack)(int, void **);
	void (*launch)(int, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned long long, void *);
	struct function *fns;
};

struct function {
	struct module *m;
	int fn;
	int max_dynamic_shared; /* cuFuncSetAttribute's, 48 KiB until set */
	struct function *next;
};

EXPORT CUresult cuModuleLoadData(void **out, const void *image) {
	NEED_CTX();
	if (out == NULL || image == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	unsigned long long hash;
	if (strncmp(image, IMAGE_MAGIC, strlen(IMAGE_MAGIC)) != 0 ||
	    sscanf((const char *)image + strlen(IMAGE_MAGIC), "%llx", &hash) != 1)
		return CUDA_ERROR_INVALID_IMAGE; /* a real CUBIN or PTX: no kernels for the CPU */
	const char *path = getenv("GPTUI_STANDIN_EMU_LIB");
	if (path == NULL || *path == '\0')
		return CUDA_ERROR_NOT_SUPPORTED;
	void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		fprintf(stderr, "[standin] %s\n", dlerror());
		return CUDA_ERROR_FILE_NOT_FOUND;
	}
	unsigned long long (*source)(void) = (unsigned long long (*)(void))dlsym(lib, "gptuiEmuSourceHash");
	struct module *m = calloc(1, sizeof *m);
	if (m == NULL) {
		dlclose(lib);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	m->lib = lib;
	m->function = (int (*)(const char *))dlsym(lib, "gptuiEmuFunction");
	m->pack = (void *(*)(int, void **))dlsym(lib, "gptuiEmuPack");
	m->launch = (void (*)(int, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned long long, void *))dlsym(lib, "gptuiEmuLaunch");
	if (source == NULL || m->function == NULL || m->pack == NULL || m->launch == NULL || source() != hash) {
		/* Kernels built from other sources than the image's. */
		dlclose(lib);
		free(m);
		return CUDA_ERROR_INVALID_IMAGE;
	}
	*out = m;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleUnload(void *mod) {
	NEED_CTX();
	struct module *m = mod;
	if (m == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	drain(); /* no launch of its kernels is still queued */
	pthread_mutex_unlock(&mu);
	for (struct function *f = m->fns, *next; f != NULL; f = next) {
		next = f->next;
		free(f);
	}
	dlclose(m->lib);
	free(m);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleGetFunction(void **out, void *mod, const char *name) {
	NEED_CTX();
	struct module *m = mod;
	if (out == NULL || m == NULL || name == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	int fn = m->function(name);
	if (fn < 0)
		return CUDA_ERROR_NOT_FOUND;
	/* One handle per kernel of a module, as the driver's: an attribute
	 * set through one lookup holds for every other. */
	pthread_mutex_lock(&mu);
	for (struct function *g = m->fns; g != NULL; g = g->next)
		if (g->fn == fn) {
			pthread_mutex_unlock(&mu);
			*out = g;
			return CUDA_SUCCESS;
		}
	pthread_mutex_unlock(&mu);
	struct function *f = calloc(1, sizeof *f);
	if (f == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	f->m = m;
	f->fn = fn;
	f->max_dynamic_shared = 48 << 10;
	pthread_mutex_lock(&mu);
	f->next = m->fns;
	m->fns = f;
	pthread_mutex_unlock(&mu);
	*out = f;
	return CUDA_SUCCESS;
}

/* cuFuncSetAttribute takes CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
 * up to the device's opt-in limit, as the driver does. */
EXPORT CUresult cuFuncSetAttribute(void *fp, int attr, int v) {
	NEED_CTX();
	struct function *f = fp;
	if (f == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	if (attr != FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (v < 0 || v > SHARED_OPTIN)
		return CUDA_ERROR_INVALID_VALUE;
	f->max_dynamic_shared = v;
	return CUDA_SUCCESS;
}

struct launch {
	struct function *f;
	unsigned g[3], b[3];
	unsigned shared;
	void *args;
};

static void run_launch(void *arg) {
	struct launch *l = arg;
	l->f->m->launch(l->f->fn, l->g[0], l->g[1], l->g[2], l->b[0], l->b[1], l->b[2], l->shared, l->args);
	free(l);
}

/* cuLaunchKernel copies the arguments now, as the driver does, and queues
 * the kernel on s. It refuses what the driver refuses: an empty or
 * oversized grid or block, more dynamic shared memory than the function
 * was allowed (cuFuncSetAttribute; 48 KiB without), arguments by extra. */
EXPORT CUresult cuLaunchKernel(void *fp, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned shared, CUstream s, void **params, void **extra) {
	NEED_CTX();
	struct function *f = fp;
	if (f == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	unsigned long long nt = (unsigned long long)bx * by * bz;
	if (extra != NULL || nt == 0 || nt > 1024 || bx > 1024 || by > 1024 || bz > 64 || gx == 0 || gy == 0 || gz == 0 ||
	    gx > 0x7fffffffu || gy > 65535 || gz > 65535)
		return CUDA_ERROR_INVALID_VALUE;
	if ((int)shared > f->max_dynamic_shared)
		return CUDA_ERROR_INVALID_VALUE;
	struct launch *l = malloc(sizeof *l);
	if (l == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*l = (struct launch){f, {gx, gy, gz}, {bx, by, bz}, shared, f->m->pack(f->fn, params)};
	pthread_mutex_lock(&mu);
	CUresult r = enqueue(s, run_launch, l);
	pthread_mutex_unlock(&mu);
	if (r != CUDA_SUCCESS)
		free(l); /* leaks the packed arguments: a bad stream is a bug in the caller */
	return r;
}
