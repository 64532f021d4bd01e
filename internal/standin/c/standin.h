/*
 * standin.h: what the stand-in libnccl.so.2 (nccl.c) takes from the
 * stand-in libcuda.so.1 (cuda.c). The real NCCL runs its kernels on the
 * caller's CUDA stream; the stand-in runs its operations as tasks of the
 * stand-in driver's streams, which the driver exports for it under these
 * names (no real driver has them: the stand-in libnccl refuses to work
 * beside a real libcuda).
 */
#ifndef GPTUI_STANDIN_H
#define GPTUI_STANDIN_H

#include <stddef.h>

/*
 * gptuiStandinEnqueue queues run(arg) on stream s, after the work queued
 * there before it; the stream's thread runs it. Stream 0 (the legacy
 * default stream) runs it on the calling thread, after every stream's
 * work queued so far. It returns a CUresult: 0, or 400
 * (CUDA_ERROR_INVALID_HANDLE) for a stream that is not one.
 */
typedef int (*gptuiStandinEnqueueFn)(void *s, void (*run)(void *), void *arg);

/*
 * gptuiStandinCurrentDevice returns the ordinal of the device whose
 * context is current on the calling thread (cuCtxSetCurrent), or -1.
 */
typedef int (*gptuiStandinCurrentDeviceFn)(void);

/*
 * gptuiStandinIsDevice reports whether [p, p+n) lies in one allocation of
 * cuMemAlloc: device memory.
 */
typedef int (*gptuiStandinIsDeviceFn)(const void *p, size_t n);

#endif
