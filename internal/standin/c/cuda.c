/*
 * cuda.c: a stand-in libcuda.so.1 for the tests of gptui's NCCL path on a
 * machine without a GPU. It exports every function package kernels/cuda
 * binds (driver.go, event.go, staging.go), so that cuda.Open loads it through the
 * same purego path as the NVIDIA driver, and implements the part of the
 * driver API that the NCCL fabric (package comm/nccl) uses:
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
 * Where it differs from the driver, it fails rather than pretends:
 * there is no managed memory (cuMemAllocManaged, cuMemPrefetchAsync and
 * cuMemAdvise fail with CUDA_ERROR_NOT_SUPPORTED), and no kernel runs
 * (cuModuleLoadData, cuModuleGetFunction, cuFuncSetAttribute and
 * cuLaunchKernel fail with CUDA_ERROR_NOT_SUPPORTED): the GPU backend
 * cannot run on it, only what the fabric needs.
 *
 * The stand-in libnccl.so.2 (nccl.c) queues its operations on these
 * streams through gptuiStandinEnqueue (standin.h).
 */
#define _GNU_SOURCE
#include <pthread.h>
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
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_HANDLE = 400,
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

/* alloc is one cuMemAlloc, or one cuMemAllocHost: [base, base+size). */
struct alloc {
	char *base;
	size_t size;
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
	{CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
	{CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
	{CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
	{CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported (the stand-in libcuda.so.1 runs no kernels and has no managed memory)"},
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
	case ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 227 << 10; break;
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

/* find returns the device allocation holding [p, p+n), or NULL (under mu). */
static struct alloc *find(const void *p, size_t n) { return findIn(allocs, p, n); }

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
		if ((uintptr_t)a->base == p) {
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

EXPORT CUresult cuModuleLoadData(void **m, const void *image) {
	(void)m, (void)image;
	return CUDA_ERROR_NOT_SUPPORTED;
}

EXPORT CUresult cuModuleUnload(void *m) {
	(void)m;
	return CUDA_ERROR_INVALID_HANDLE;
}

EXPORT CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
	(void)f, (void)m, (void)name;
	return CUDA_ERROR_NOT_SUPPORTED;
}

EXPORT CUresult cuFuncSetAttribute(void *f, int attr, int v) {
	(void)f, (void)attr, (void)v;
	return CUDA_ERROR_NOT_SUPPORTED;
}

EXPORT CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned shared, CUstream s, void **params, void **extra) {
	(void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)s, (void)params, (void)extra;
	return CUDA_ERROR_NOT_SUPPORTED;
}
