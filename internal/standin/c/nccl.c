/*
 * nccl.c: a stand-in libnccl.so.2 for the tests of gptui's NCCL path on
 * machines without GPUs. It exports every function package kernels/cuda
 * binds (nccl.go), so that cuda.LoadNCCL loads it through the same
 * purego path as NVIDIA's library, and runs the operations between the
 * processes of a job over shared memory, with NCCL's semantics where the
 * NCCL fabric (package comm/nccl) depends on them:
 *
 *   - ncclGetUniqueId makes a shared-memory segment (shm_open, in
 *     /dev/shm) and puts its name and a nonce in the id; the ranks that
 *     join with ncclCommInitRank map it. ncclCommInitRank waits until
 *     every rank of the id has joined (it cannot be interrupted: a rank
 *     that never comes leaves the others waiting, as NCCL's bootstrap
 *     does, and the fabric gives up on its own), refuses a rank that
 *     joins twice or with another size, and, as NCCL does, two ranks on
 *     one device ("Duplicate GPU detected"). Once every rank has joined
 *     the segment's name is unlinked: the segment lives while mapped.
 *   - ncclCommSplit is collective over the parent: it waits until every
 *     member has made its split of the same number; members with the
 *     same colour form a communicator ordered by key (then by their
 *     place in the parent), NCCL_SPLIT_NOCOLOR gets none, another
 *     negative colour is ncclInvalidArgument.
 *   - every operation is queued on the caller's stream (the stand-in
 *     libcuda.so.1's, through gptuiStandinEnqueue), after the work queued
 *     before it, and runs asynchronously on the stream's thread; the host
 *     call returns at once. A collective waits there for every member's
 *     (the n-th collective of each member of a communicator meet); the
 *     n-th send from a to b meets b's n-th receive from a, and a send
 *     waits for its receive, so two members that each send before they
 *     receive hang, as on GPUs; ncclGroupStart/End posts the sends and
 *     receives of the group together and waits for all of them.
 *   - a peer that never arrives (stopped, killed, or aborted) leaves the
 *     operations that wait for it waiting until this rank aborts: no
 *     timeout and no error, as over NVLink or shared memory;
 *     ncclCommAbort ends the rank's operations that wait or are queued
 *     on the communicator (they end without doing their work) and frees
 *     it; a communicator used after ncclCommAbort or ncclCommDestroy is
 *     ncclInvalidArgument (NCCL's would be a use after free).
 *   - buffers must be device memory (cuMemAlloc of the stand-in driver):
 *     anything else is ncclInvalidArgument at the call, as NCCL's pointer
 *     checks (NCCL_CHECK_POINTERS=1) make it; on a GPU it would be an
 *     illegal address in the kernel.
 *   - operations whose members disagree (another kind, length or type)
 *     fail on every member with an asynchronous ncclInvalidUsage
 *     (ncclCommGetAsyncError); NCCL would hang or corrupt memory.
 *
 * Sums: the stand-in adds float32s as the TCP ring of package comm does
 * (element i of an all-reduce of n elements over s members lies in chunk
 * c = the c with c·n/s <= i < (c+1)·n/s, and is added in ring order
 * starting from member c+1: ((x[c+1] + x[c+2]) + …) + x[c]; the part of
 * member r of a reduce-scatter from member r+1), one of the orders
 * NCCL's ring algorithm uses, and float64s in rank order (as the ring's
 * AllReduce64), so that a job over the stand-in gives the TCP run's
 * losses bit for bit. Real NCCL's order depends on its algorithm,
 * protocol and sizes: on GPUs the losses agree to rounding only.
 *
 * An all-reduce of ncclBfloat16 adds in that order in float and rounds
 * each sum to bfloat16, to nearest even, as NCCL stores each partial sum
 * (and as the TCP ring's AllReduceBF16 does).
 *
 * What it does not do: reductions other than ncclSum, of types other
 * than ncclFloat32 and ncclFloat64 (and ncclBfloat16 all-reduces)
 * (ncclInvalidArgument); collectives
 * inside a group, and a group across the streams or the unique ids of
 * several communicators (ncclInvalidUsage); more than 64 ranks. It is
 * not fast: data moves through the segment in pieces of 32 KiB, with
 * two barriers per piece.
 *
 * For the tests of failures, two variables of the environment:
 *
 *   GPTUI_STANDIN_NCCL_RAISE=R:N:SIG  world rank R (its rank in the first
 *       ncclCommInitRank of the process) sends itself SIG (STOP, KILL or
 *       a number) when its N-th operation (1 for the first) starts on its
 *       stream, saying so on stderr first;
 *   GPTUI_STANDIN_NCCL_TRACE=1  every operation is logged on stderr.
 *   GPTUI_STANDIN_NCCL_TAG names the segments
 *       (/dev/shm/gptui-standin-nccl.TAG.PID.N), so that a test finds
 *       what a killed job left behind.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "standin.h"

#define EXPORT __attribute__((visibility("default")))

typedef enum {
	ncclSuccess = 0,
	ncclUnhandledCudaError = 1,
	ncclSystemError = 2,
	ncclInternalError = 3,
	ncclInvalidArgument = 4,
	ncclInvalidUsage = 5,
	ncclRemoteError = 6,
	ncclInProgress = 7,
} ncclResult_t;

typedef struct {
	char internal[128];
} ncclUniqueId;

typedef struct comm *ncclComm_t;

#define NCCL_SPLIT_NOCOLOR (-1)
#define NCCL_VERSION_CODE 21805 /* the API of NCCL 2.18 */

/* ncclDataType_t values and sizes. */
enum { ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 };
static const size_t typeSize[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
enum { ncclSum = 0 };

#define MAXRANKS 64
#define MAXCOMMS 256
#define SLOT (32 << 10)         /* bytes per member per piece of a collective */
#define CHAN (16 << 10)         /* bytes of a point-to-point channel's buffer */
#define SEGBYTES (64ULL << 20)  /* a segment's size; its pages are made on first touch */
#define WAIT_NS (20 * 1000000L) /* waits look at the abort flag this often */

enum { ALLREDUCE, REDUCESCATTER, ALLGATHER, BROADCAST };
static const char *collName[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclBroadcast"};

/* The shared segment: one per unique id, holding every communicator made
 * from it (the world and its splits). */

struct desc {
	int kind, type, op, root;
	uint64_t count;
};

/* chan is the channel of the messages from one member to another. */
struct chan {
	uint64_t cur;            /* the message in transfer: the number of those done */
	uint64_t failed;         /* 1 + the last message whose sizes disagreed */
	uint64_t sbytes, rbytes; /* its size, as the sender and the receiver say */
	uint64_t put, got;       /* bytes the sender has put, the receiver taken */
	uint64_t fill;           /* bytes in the buffer now */
	int sin, rin;            /* the sender, the receiver has come */
};

/* scomm is a communicator in the segment. */
struct scomm {
	int nranks;
	int world[MAXRANKS]; /* the members' ranks in the first communicator */
	uint64_t slots;      /* offset of nranks·SLOT bytes: the pieces posted */
	uint64_t chans;      /* offset of nranks² struct chan */
	uint64_t bufs;       /* offset of nranks²·CHAN bytes: the channels' buffers */

	uint64_t collSeq; /* collectives done */
	uint32_t arrive;  /* members in the barrier */
	uint64_t gen;     /* barriers passed */
	struct desc desc[MAXRANKS];

	uint64_t splitSeq; /* splits done */
	int splitIn, splitOut, splitDone, splitErr;
	int ck[MAXRANKS][2];  /* colour, key */
	int res[MAXRANKS][2]; /* the new communicator, the place in it */
};

#define MAGIC "gptui stand-in nccl id"

struct shdr {
	char magic[24];
	uint64_t nonce;
	pthread_mutex_t mu; /* robust, process-shared */
	uint32_t seq;       /* a futex: bumped, and its waiters woken, on every change */
	int nranks, joined, ready, initErr;
	char initMsg[200];
	int in[MAXRANKS], dev[MAXRANKS];
	uint64_t size, bump;
	int ncomms;
	struct scomm comms[MAXCOMMS];
};

/* seg is a segment as this process has it mapped. */
struct seg {
	char name[96];
	struct shdr *h;
	int refs; /* communicators not released, operations not ended */
	struct seg *next;
};

#define COMM_MAGIC 0x6e63636cU

/* comm is a member's communicator: ncclComm_t. It is never freed, so
 * that a call on one released is an error rather than a use after free. */
struct comm {
	uint32_t magic;
	struct seg *seg;
	int idx, rank, nranks;
	uint64_t nColl, nSplit; /* collectives and splits issued */
	uint64_t *nSend, *nRecv; /* sends to, receives from each member issued */
	int aborted;             /* atomic */
	int released;            /* under lmu */
	int pending;             /* operations queued and not ended (under lmu) */
	int async;               /* ncclResult_t (under lmu) */
	char last[256];          /* the asynchronous error's message */
};

/* The process's own state. */
static pthread_mutex_t lmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t lcv = PTHREAD_COND_INITIALIZER;
static struct seg *segs;
static __thread char tlast[256]; /* the calling thread's last failure */
static char glast[256];           /* the process's last failure (under lmu) */
static int worldRank = -1;
static uint64_t opCount;
static int raiseRank = -1, raiseSig;
static uint64_t raiseOp;
static int tracing;
static char tag[33] = "0";
static char created[16][96];
static int ncreated;

static gptuiStandinEnqueueFn enq;
static gptuiStandinCurrentDeviceFn curdev;
static gptuiStandinIsDeviceFn isdev;

/* fail records why a call fails and returns r. */
static ncclResult_t fail(ncclResult_t r, const char *format, ...) {
	va_list ap;
	va_start(ap, format);
	int n = snprintf(tlast, sizeof tlast, "stand-in libnccl: ");
	vsnprintf(tlast + n, sizeof tlast - (size_t)n, format, ap);
	va_end(ap);
	pthread_mutex_lock(&lmu);
	memcpy(glast, tlast, sizeof glast);
	pthread_mutex_unlock(&lmu);
	return r;
}

/* setAsync gives c an asynchronous error, unless it has one. */
static void setAsync(struct comm *c, ncclResult_t r, const char *format, ...) {
	pthread_mutex_lock(&lmu);
	if (c->async == ncclSuccess) {
		va_list ap;
		va_start(ap, format);
		int n = snprintf(c->last, sizeof c->last, "stand-in libnccl: ");
		vsnprintf(c->last + n, sizeof c->last - (size_t)n, format, ap);
		va_end(ap);
		c->async = r;
	}
	pthread_mutex_unlock(&lmu);
}

static int isAborted(struct comm *c) { return __atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE); }

static void unlinkCreated(void) {
	for (int i = 0; i < ncreated; i++)
		shm_unlink(created[i]);
}

static void readEnv(void) {
	const char *v = getenv("GPTUI_STANDIN_NCCL_RAISE");
	if (v != NULL && *v != 0) {
		int r;
		unsigned long long n;
		char sig[16];
		if (sscanf(v, "%d:%llu:%15s", &r, &n, sig) == 3) {
			raiseRank = r;
			raiseOp = n;
			if (strcmp(sig, "STOP") == 0)
				raiseSig = SIGSTOP;
			else if (strcmp(sig, "KILL") == 0)
				raiseSig = SIGKILL;
			else
				raiseSig = atoi(sig);
		}
		if (raiseSig <= 0)
			fprintf(stderr, "stand-in libnccl: GPTUI_STANDIN_NCCL_RAISE=%s is not RANK:OPERATION:SIGNAL (STOP, KILL or a number); ignored\n", v);
	}
	v = getenv("GPTUI_STANDIN_NCCL_TRACE");
	tracing = v != NULL && *v != 0 && strcmp(v, "0") != 0;
	v = getenv("GPTUI_STANDIN_NCCL_TAG");
	if (v != NULL && *v != 0) {
		size_t n = 0;
		for (; v[n] != 0 && n < sizeof tag - 1; n++) {
			char ch = v[n];
			int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_';
			tag[n] = ok ? ch : '_';
		}
		tag[n] = 0;
	}
	atexit(unlinkCreated);
}

static pthread_once_t envOnce = PTHREAD_ONCE_INIT;

/* bindCUDA finds the stand-in driver's exports (standin.h). */
static ncclResult_t bindCUDA(void) {
	pthread_once(&envOnce, readEnv);
	if (enq != NULL)
		return ncclSuccess;
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	void *e = NULL, *d = NULL, *m = NULL;
	if (h != NULL) {
		e = dlsym(h, "gptuiStandinEnqueue");
		d = dlsym(h, "gptuiStandinCurrentDevice");
		m = dlsym(h, "gptuiStandinIsDevice");
	}
	if (e == NULL || d == NULL || m == NULL)
		return fail(ncclUnhandledCudaError, "the stand-in libnccl.so.2 runs only on the stand-in libcuda.so.1 (%s); load that first",
		            h == NULL ? "no libcuda.so.1 is loaded" : "the libcuda.so.1 loaded is another");
	curdev = (gptuiStandinCurrentDeviceFn)d;
	isdev = (gptuiStandinIsDeviceFn)m;
	__atomic_store_n(&enq, (gptuiStandinEnqueueFn)e, __ATOMIC_RELEASE);
	return ncclSuccess;
}

/* The segment's lock and condition. */

static void deadline(struct timespec *ts, clockid_t clock) {
	clock_gettime(clock, ts);
	ts->tv_nsec += WAIT_NS;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

/* slock locks the segment; it gives up (-1) once c, if given, is aborted.
 * A process that died holding the lock leaves it to the next. */
static int slock(struct shdr *h, struct comm *c) {
	for (;;) {
		struct timespec ts;
		deadline(&ts, CLOCK_REALTIME);
		int r = pthread_mutex_timedlock(&h->mu, &ts);
		if (r == 0)
			return 0;
		if (r == EOWNERDEAD) {
			pthread_mutex_consistent(&h->mu);
			return 0;
		}
		if (r != ETIMEDOUT)
			return -1;
		if (c != NULL && isAborted(c))
			return -1;
	}
}

static void sunlock(struct shdr *h) { pthread_mutex_unlock(&h->mu); }

/* swait waits, holding the lock, for a change (sbcast) or a while, and
 * returns 0 holding it again; or -1, not holding it, once c (if given) is
 * aborted or the lock is lost. The waits are futex waits on h->seq, read
 * under the lock: unlike a process-shared pthread condition variable,
 * whose signallers wait for the waiters they woke, they leave nothing
 * behind for the others when a process is stopped or killed in them. */
static int swait(struct shdr *h, struct comm *c) {
	uint32_t seq = __atomic_load_n(&h->seq, __ATOMIC_ACQUIRE);
	sunlock(h);
	struct timespec rel = {0, WAIT_NS};
	syscall(SYS_futex, &h->seq, FUTEX_WAIT, seq, &rel, NULL, 0);
	if (slock(h, c) != 0)
		return -1;
	if (c != NULL && isAborted(c)) {
		sunlock(h);
		return -1;
	}
	return 0;
}

/* sbcast wakes every waiter of the segment, in any process; it needs no
 * lock (an abort calls it). */
static void sbcast(struct shdr *h) {
	__atomic_add_fetch(&h->seq, 1, __ATOMIC_RELEASE);
	syscall(SYS_futex, &h->seq, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Segments of this process. */

/* segOpen maps the segment name, or returns this process's mapping of
 * it, with a reference for the caller. */
static struct seg *segOpen(const char *name) {
	pthread_mutex_lock(&lmu);
	for (struct seg *s = segs; s != NULL; s = s->next) {
		if (strcmp(s->name, name) == 0) {
			s->refs++;
			pthread_mutex_unlock(&lmu);
			return s;
		}
	}
	pthread_mutex_unlock(&lmu);
	int fd = shm_open(name, O_RDWR, 0);
	if (fd < 0)
		return NULL;
	struct stat st;
	if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != SEGBYTES) {
		close(fd);
		errno = EINVAL;
		return NULL;
	}
	void *p = mmap(NULL, SEGBYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return NULL;
	struct seg *s = calloc(1, sizeof *s);
	if (s == NULL) {
		munmap(p, SEGBYTES);
		return NULL;
	}
	snprintf(s->name, sizeof s->name, "%s", name);
	s->h = p;
	s->refs = 1;
	pthread_mutex_lock(&lmu);
	s->next = segs;
	segs = s;
	pthread_mutex_unlock(&lmu);
	return s;
}

static void segRef(struct seg *s) {
	pthread_mutex_lock(&lmu);
	s->refs++;
	pthread_mutex_unlock(&lmu);
}

/* segUnref drops a reference; the last unlinks the segment's name (if
 * the job's ranks have not all joined, none will now) and unmaps it. */
static void segUnref(struct seg *s) {
	pthread_mutex_lock(&lmu);
	int last = --s->refs == 0;
	if (last) {
		for (struct seg **p = &segs; *p != NULL; p = &(*p)->next) {
			if (*p == s) {
				*p = s->next;
				break;
			}
		}
	}
	pthread_mutex_unlock(&lmu);
	if (last) {
		shm_unlink(s->name);
		munmap(s->h, SEGBYTES);
		free(s);
	}
}

/* Communicators. */

static struct scomm *SC(struct comm *c) { return &c->seg->h->comms[c->idx]; }

static char *at(struct shdr *h, uint64_t off) { return (char *)h + off; }

static struct chan *chanOf(struct comm *c, int from, int to) {
	struct scomm *sc = SC(c);
	return (struct chan *)at(c->seg->h, sc->chans) + (size_t)from * (size_t)sc->nranks + (size_t)to;
}

static char *bufOf(struct comm *c, int from, int to) {
	struct scomm *sc = SC(c);
	return at(c->seg->h, sc->bufs) + ((size_t)from * (size_t)sc->nranks + (size_t)to) * CHAN;
}

static char *slotOf(struct comm *c, int member) { return at(c->seg->h, SC(c)->slots) + (size_t)member * SLOT; }

static uint64_t roundUp(uint64_t n) { return (n + 4095) & ~(uint64_t)4095; }

/* newSComm makes a communicator of the world ranks world[0..n) in the
 * segment (under its lock); -1 when the segment is full. */
static int newSComm(struct shdr *h, int n, const int *world) {
	if (h->ncomms >= MAXCOMMS)
		return -1;
	uint64_t slots = roundUp((uint64_t)n * SLOT);
	uint64_t chans = roundUp((uint64_t)n * (uint64_t)n * sizeof(struct chan));
	uint64_t bufs = roundUp((uint64_t)n * (uint64_t)n * CHAN);
	if (h->bump + slots + chans + bufs > h->size)
		return -1;
	int idx = h->ncomms++;
	struct scomm *sc = &h->comms[idx];
	memset(sc, 0, sizeof *sc);
	sc->nranks = n;
	memcpy(sc->world, world, (size_t)n * sizeof(int));
	sc->slots = h->bump;
	sc->chans = sc->slots + slots;
	sc->bufs = sc->chans + chans;
	h->bump = sc->bufs + bufs;
	memset(at(h, sc->chans), 0, chans);
	return idx;
}

/* newComm is member rank of the segment's communicator idx in this
 * process; it takes a reference to the segment. */
static struct comm *newComm(struct seg *s, int idx, int rank) {
	struct comm *c = calloc(1, sizeof *c);
	if (c == NULL)
		return NULL;
	c->nranks = s->h->comms[idx].nranks;
	c->nSend = calloc((size_t)c->nranks, sizeof(uint64_t));
	c->nRecv = calloc((size_t)c->nranks, sizeof(uint64_t));
	if (c->nSend == NULL || c->nRecv == NULL) {
		free(c->nSend);
		free(c->nRecv);
		free(c);
		return NULL;
	}
	c->magic = COMM_MAGIC;
	c->seg = s;
	c->idx = idx;
	c->rank = rank;
	segRef(s);
	return c;
}

/* usable checks that c is a communicator not released. */
static ncclResult_t usable(struct comm *c, const char *call) {
	if (c == NULL || c->magic != COMM_MAGIC)
		return fail(ncclInvalidArgument, "%s: %p is not a communicator", call, (void *)c);
	pthread_mutex_lock(&lmu);
	int released = c->released;
	pthread_mutex_unlock(&lmu);
	if (released)
		return fail(ncclInvalidArgument, "%s: the communicator was aborted or destroyed", call);
	return ncclSuccess;
}

/* release ends the process's use of c. */
static void release(struct comm *c) {
	pthread_mutex_lock(&lmu);
	c->released = 1;
	pthread_mutex_unlock(&lmu);
	segUnref(c->seg);
}

/* taskBegin counts an operation queued on c; taskEnd its end. */
static void taskBegin(struct comm *c) {
	pthread_mutex_lock(&lmu);
	c->pending++;
	pthread_mutex_unlock(&lmu);
	segRef(c->seg);
}

static void taskEnd(struct comm *c) {
	pthread_mutex_lock(&lmu);
	c->pending--;
	pthread_cond_broadcast(&lcv);
	pthread_mutex_unlock(&lmu);
	segUnref(c->seg);
}

/* hook counts an operation starting on its stream, traces it, and raises
 * the signal GPTUI_STANDIN_NCCL_RAISE asks for. */
static void hook(const char *what, struct comm *c) {
	uint64_t n = __atomic_add_fetch(&opCount, 1, __ATOMIC_SEQ_CST);
	if (tracing)
		fprintf(stderr, "stand-in libnccl: rank %d: operation #%llu: %s, member %d of %d\n", worldRank, (unsigned long long)n, what, c->rank, c->nranks);
	if (raiseSig > 0 && worldRank == raiseRank && n == raiseOp) {
		fprintf(stderr, "stand-in libnccl: rank %d: raising signal %d (%s) in its operation #%llu, %s\n", worldRank, raiseSig,
		        raiseSig == SIGSTOP ? "SIGSTOP" : raiseSig == SIGKILL ? "SIGKILL" : "", (unsigned long long)n, what);
		fflush(stderr);
		raise(raiseSig); /* this thread stops (or dies) before it returns */
	}
}

/* Version, errors, ids. */

EXPORT ncclResult_t ncclGetVersion(int *v) {
	if (v == NULL)
		return fail(ncclInvalidArgument, "ncclGetVersion: NULL");
	*v = NCCL_VERSION_CODE;
	return ncclSuccess;
}

EXPORT const char *ncclGetErrorString(ncclResult_t r) {
	switch (r) {
	case ncclSuccess: return "no error";
	case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
	case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
	case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
	case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
	case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	case ncclRemoteError: return "remote process exited or there was a network error";
	case ncclInProgress: return "NCCL operation in progress";
	}
	return "unknown result code";
}

/* ncclGetLastError returns the message of c's asynchronous error, if it
 * has one, else that of the calling thread's last failed call, else the
 * process's. */
EXPORT const char *ncclGetLastError(ncclComm_t c) {
	if (c != NULL && c->magic == COMM_MAGIC) {
		pthread_mutex_lock(&lmu);
		int has = c->async != ncclSuccess;
		pthread_mutex_unlock(&lmu);
		if (has)
			return c->last;
	}
	if (tlast[0] != 0)
		return tlast;
	return glast;
}

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
	pthread_once(&envOnce, readEnv);
	if (id == NULL)
		return fail(ncclInvalidArgument, "ncclGetUniqueId: NULL");
	static int counter;
	char name[96];
	pthread_mutex_lock(&lmu);
	int n = ++counter;
	pthread_mutex_unlock(&lmu);
	snprintf(name, sizeof name, "/gptui-standin-nccl.%s.%d.%d", tag, (int)getpid(), n);
	int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
	if (fd < 0)
		return fail(ncclSystemError, "shm_open(%s): %s", name, strerror(errno));
	if (ftruncate(fd, (off_t)SEGBYTES) != 0) {
		int e = errno;
		close(fd);
		shm_unlink(name);
		return fail(ncclSystemError, "ftruncate(%s): %s", name, strerror(e));
	}
	struct shdr *h = mmap(NULL, SEGBYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (h == MAP_FAILED) {
		int e = errno;
		shm_unlink(name);
		return fail(ncclSystemError, "mmap(%s): %s", name, strerror(e));
	}
	pthread_mutexattr_t ma;
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(&h->mu, &ma);
	pthread_mutexattr_destroy(&ma);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t nonce = ((uint64_t)ts.tv_nsec << 32) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 16) ^ (uint64_t)n;
	h->nonce = nonce;
	h->size = SEGBYTES;
	h->bump = roundUp(sizeof *h);
	memcpy(h->magic, MAGIC, sizeof MAGIC);
	munmap(h, SEGBYTES);
	pthread_mutex_lock(&lmu);
	if (ncreated < (int)(sizeof created / sizeof created[0]))
		snprintf(created[ncreated++], sizeof created[0], "%s", name);
	pthread_mutex_unlock(&lmu);
	memset(id, 0, sizeof *id);
	memcpy(id->internal, MAGIC, sizeof MAGIC);
	memcpy(id->internal + 24, &nonce, sizeof nonce);
	snprintf(id->internal + 32, 96, "%s", name);
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
	ncclResult_t r = bindCUDA();
	if (r != ncclSuccess)
		return r;
	if (out == NULL)
		return fail(ncclInvalidArgument, "ncclCommInitRank: NULL");
	if (nranks < 1 || nranks > MAXRANKS || rank < 0 || rank >= nranks)
		return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d (the stand-in has room for %d)", rank, nranks, MAXRANKS);
	int dev = curdev();
	if (dev < 0)
		return fail(ncclUnhandledCudaError, "ncclCommInitRank: no CUDA context is current on the calling thread");
	char name[96];
	uint64_t nonce;
	memcpy(&nonce, id.internal + 24, sizeof nonce);
	memcpy(name, id.internal + 32, sizeof name);
	name[sizeof name - 1] = 0;
	if (memcmp(id.internal, MAGIC, sizeof MAGIC) != 0)
		return fail(ncclInvalidArgument, "ncclCommInitRank: not a unique id of the stand-in libnccl");
	struct seg *s = segOpen(name);
	if (s == NULL)
		return fail(ncclSystemError, "ncclCommInitRank: the unique id's segment %s: %s (its job is over, or the process that made the id exited)", name, strerror(errno));
	struct shdr *h = s->h;
	if (memcmp(h->magic, MAGIC, sizeof MAGIC) != 0 || h->nonce != nonce) {
		segUnref(s);
		return fail(ncclInvalidArgument, "ncclCommInitRank: the segment %s is not the unique id's", name);
	}
	if (slock(h, NULL) != 0) {
		segUnref(s);
		return fail(ncclSystemError, "ncclCommInitRank: locking %s failed", name);
	}
	r = ncclSuccess;
	if (h->ready)
		r = fail(ncclInvalidUsage, "ncclCommInitRank: rank %d comes after every rank of the unique id joined", rank);
	else if (h->nranks != 0 && h->nranks != nranks)
		r = fail(ncclInvalidArgument, "ncclCommInitRank: rank %d joins a communicator of %d ranks as one of %d", rank, h->nranks, nranks);
	else if (h->in[rank])
		r = fail(ncclInvalidUsage, "ncclCommInitRank: rank %d joined twice", rank);
	if (r != ncclSuccess) {
		sunlock(h);
		segUnref(s);
		return r;
	}
	h->nranks = nranks;
	h->in[rank] = 1;
	h->dev[rank] = dev;
	if (++h->joined == nranks) {
		for (int i = 0; i < nranks && !h->initErr; i++) {
			for (int j = i + 1; j < nranks; j++) {
				if (h->dev[i] == h->dev[j]) {
					h->initErr = ncclInvalidUsage;
					snprintf(h->initMsg, sizeof h->initMsg, "Duplicate GPU detected: rank %d and rank %d both on CUDA device %d", i, j, h->dev[i]);
					break;
				}
			}
		}
		if (!h->initErr) {
			int world[MAXRANKS];
			for (int i = 0; i < nranks; i++)
				world[i] = i;
			if (newSComm(h, nranks, world) != 0) {
				h->initErr = ncclSystemError;
				snprintf(h->initMsg, sizeof h->initMsg, "the shared segment has no room for %d ranks", nranks);
			}
		}
		h->ready = 1;
		shm_unlink(name); /* every rank has it mapped */
		sbcast(h);
	}
	while (!h->ready) {
		if (swait(h, NULL) != 0) {
			segUnref(s);
			return fail(ncclSystemError, "ncclCommInitRank: locking %s failed", name);
		}
	}
	int err = h->initErr;
	char msg[200];
	memcpy(msg, h->initMsg, sizeof msg);
	sunlock(h);
	struct comm *c = NULL;
	if (err == ncclSuccess && (c = newComm(s, 0, rank)) == NULL)
		err = fail(ncclSystemError, "ncclCommInitRank: out of memory");
	else if (err != ncclSuccess)
		fail(err, "ncclCommInitRank: %s", msg);
	segUnref(s);
	if (err != ncclSuccess)
		return err;
	pthread_mutex_lock(&lmu);
	if (worldRank < 0)
		worldRank = rank;
	pthread_mutex_unlock(&lmu);
	*out = c;
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommSplit(ncclComm_t c, int color, int key, ncclComm_t *out, void *config) {
	(void)config;
	ncclResult_t r = usable(c, "ncclCommSplit");
	if (r != ncclSuccess)
		return r;
	if (out == NULL)
		return fail(ncclInvalidArgument, "ncclCommSplit: NULL");
	if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
		return fail(ncclInvalidArgument, "ncclCommSplit: colour %d", color);
	struct shdr *h = c->seg->h;
	struct scomm *sc = SC(c);
	int n = c->nranks, me = c->rank;
	uint64_t k = c->nSplit++;
	if (slock(h, c) != 0)
		return fail(ncclInvalidUsage, "ncclCommSplit: the communicator was aborted");
	while (sc->splitSeq != k) {
		if (swait(h, c) != 0)
			return fail(ncclInvalidUsage, "ncclCommSplit: the communicator was aborted");
	}
	sc->ck[me][0] = color;
	sc->ck[me][1] = key;
	if (++sc->splitIn == n) {
		sc->splitErr = 0;
		for (int m = 0; m < n; m++)
			sc->res[m][0] = sc->res[m][1] = -1;
		for (int m = 0; m < n; m++) {
			if (sc->ck[m][0] == NCCL_SPLIT_NOCOLOR || sc->res[m][0] >= 0)
				continue;
			int members[MAXRANKS], cnt = 0;
			for (int q = 0; q < n; q++)
				if (sc->ck[q][0] == sc->ck[m][0])
					members[cnt++] = q;
			for (int i = 1; i < cnt; i++) { /* by key, then place in the parent */
				for (int j = i; j > 0 && sc->ck[members[j - 1]][1] > sc->ck[members[j]][1]; j--) {
					int t = members[j];
					members[j] = members[j - 1];
					members[j - 1] = t;
				}
			}
			int world[MAXRANKS];
			for (int i = 0; i < cnt; i++)
				world[i] = sc->world[members[i]];
			int idx = newSComm(h, cnt, world);
			sc = SC(c);
			if (idx < 0) {
				sc->splitErr = 1;
				break;
			}
			for (int i = 0; i < cnt; i++) {
				sc->res[members[i]][0] = idx;
				sc->res[members[i]][1] = i;
			}
		}
		sc->splitDone = 1;
		sbcast(h);
	} else {
		while (!sc->splitDone) {
			if (swait(h, c) != 0)
				return fail(ncclInvalidUsage, "ncclCommSplit: the communicator was aborted");
		}
	}
	int idx = sc->res[me][0], place = sc->res[me][1], err = sc->splitErr;
	if (++sc->splitOut == n) {
		sc->splitIn = sc->splitOut = sc->splitDone = 0;
		sc->splitSeq++;
		sbcast(h);
	}
	sunlock(h);
	if (err)
		return fail(ncclSystemError, "ncclCommSplit: the shared segment is full");
	if (idx < 0) {
		*out = NULL;
		return ncclSuccess;
	}
	struct comm *nc = newComm(c->seg, idx, place);
	if (nc == NULL)
		return fail(ncclSystemError, "ncclCommSplit: out of memory");
	*out = nc;
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommCount(const ncclComm_t c, int *count) {
	ncclResult_t r = usable(c, "ncclCommCount");
	if (r == ncclSuccess)
		*count = c->nranks;
	return r;
}

EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank) {
	ncclResult_t r = usable(c, "ncclCommUserRank");
	if (r == ncclSuccess)
		*rank = c->rank;
	return r;
}

EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *out) {
	ncclResult_t r = usable(c, "ncclCommGetAsyncError");
	if (r != ncclSuccess)
		return r;
	pthread_mutex_lock(&lmu);
	*out = (ncclResult_t)c->async;
	pthread_mutex_unlock(&lmu);
	return ncclSuccess;
}

/* ncclCommAbort ends the rank's operations on c, queued or waiting (they
 * end without their work), and frees c at once; the other members' are
 * left waiting. */
EXPORT ncclResult_t ncclCommAbort(ncclComm_t c) {
	ncclResult_t r = usable(c, "ncclCommAbort");
	if (r != ncclSuccess)
		return r;
	__atomic_store_n(&c->aborted, 1, __ATOMIC_RELEASE);
	sbcast(c->seg->h);
	release(c);
	return ncclSuccess;
}

/* ncclCommDestroy waits for the operations queued on c, then frees it. */
EXPORT ncclResult_t ncclCommDestroy(ncclComm_t c) {
	ncclResult_t r = usable(c, "ncclCommDestroy");
	if (r != ncclSuccess)
		return r;
	pthread_mutex_lock(&lmu);
	while (c->pending > 0)
		pthread_cond_wait(&lcv, &lmu);
	pthread_mutex_unlock(&lmu);
	release(c);
	return ncclSuccess;
}

/* Collectives. */

struct coll {
	struct comm *c;
	uint64_t seq;
	struct desc d;
	const char *send;
	char *recv;
};

/* barrier waits until every member of c has come (bump: the last one
 * ends the collective); -1 once c is aborted. */
static int barrier(struct comm *c, int bump) {
	struct shdr *h = c->seg->h;
	if (slock(h, c) != 0)
		return -1;
	struct scomm *sc = SC(c);
	uint64_t g = sc->gen;
	if (++sc->arrive == (uint32_t)c->nranks) {
		sc->arrive = 0;
		sc->gen++;
		if (bump)
			sc->collSeq++;
		sbcast(h);
	} else {
		while (sc->gen == g) {
			if (swait(h, c) != 0)
				return -1;
		}
	}
	sunlock(h);
	return 0;
}

/* chunkOf returns the chunk of the TCP ring that element i of n over s
 * members lies in: the last c with c·n/s <= i. */
static int chunkOf(uint64_t i, uint64_t n, int s) {
	int c = (int)(i * (uint64_t)s / n);
	if (c >= s)
		c = s - 1;
	while (c + 1 < s && (uint64_t)(c + 1) * n / (uint64_t)s <= i)
		c++;
	while (c > 0 && (uint64_t)c * n / (uint64_t)s > i)
		c--;
	return c;
}

/* post copies this member's part of the piece [lo, lo+len) to its slot. */
static void post(struct coll *t, uint64_t lo, uint64_t len, uint64_t per) {
	struct comm *c = t->c;
	size_t es = typeSize[t->d.type];
	char *slot = slotOf(c, c->rank);
	switch (t->d.kind) {
	case ALLREDUCE:
	case ALLGATHER:
		memcpy(slot, t->send + lo * es, len * es);
		break;
	case BROADCAST:
		if (c->rank == t->d.root)
			memcpy(slot, t->send + lo * es, len * es);
		break;
	case REDUCESCATTER:
		for (int q = 0; q < c->nranks; q++)
			memcpy(slot + (size_t)q * per * es, t->send + ((uint64_t)q * t->d.count + lo) * es, len * es);
		break;
	}
}

/* bf16Float widens bfloat16 bits; bf16Round rounds a float to bfloat16
 * bits, to nearest even (a NaN stays a NaN, made quiet). */
static float bf16Float(uint16_t h) {
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

static uint16_t bf16Round(float f) {
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)(u >> 16) | 0x40;
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* ringSum is element k of the members' slots added along the ring from
 * member first, ((x[first] + x[first+1]) + …), in float: each sum rounded
 * to bfloat16 for ncclBfloat16, whose slots hold bfloat16s. */
static float ringSum(struct comm *c, int first, uint64_t k, int type) {
	int s = c->nranks;
	float v = 0;
	for (int q = 0; q < s; q++) {
		void *slot = slotOf(c, (first + q) % s);
		float x = type == ncclBfloat16 ? bf16Float(((uint16_t *)slot)[k]) : ((float *)slot)[k];
		v = q == 0 ? x : v + x;
		if (type == ncclBfloat16)
			v = bf16Float(bf16Round(v));
	}
	return v;
}

/* compute writes this member's result for the piece [lo, lo+len) from
 * the members' slots. */
static void compute(struct coll *t, uint64_t lo, uint64_t len, uint64_t per) {
	struct comm *c = t->c;
	int s = c->nranks, me = c->rank;
	uint64_t n = t->d.count;
	size_t es = typeSize[t->d.type];
	switch (t->d.kind) {
	case ALLGATHER:
		for (int q = 0; q < s; q++)
			memcpy(t->recv + ((uint64_t)q * n + lo) * es, slotOf(c, q), len * es);
		return;
	case BROADCAST:
		memcpy(t->recv + lo * es, slotOf(c, t->d.root), len * es);
		return;
	case ALLREDUCE:
		if (t->d.type == ncclFloat64) {
			double *out = (double *)t->recv + lo;
			for (uint64_t k = 0; k < len; k++) {
				double v = ((double *)slotOf(c, 0))[k];
				for (int q = 1; q < s; q++)
					v += ((double *)slotOf(c, q))[k];
				out[k] = v;
			}
			return;
		}
		{
			uint64_t i = lo, end = lo + len;
			for (int ch = chunkOf(lo, n, s); i < end; ch++) {
				uint64_t hi = (uint64_t)(ch + 1) * n / (uint64_t)s;
				if (hi > end)
					hi = end;
				int first = (ch + 1) % s;
				for (; i < hi; i++) {
					float v = ringSum(c, first, i - lo, t->d.type);
					if (t->d.type == ncclBfloat16)
						((uint16_t *)t->recv)[i] = bf16Round(v);
					else
						((float *)t->recv)[i] = v;
				}
			}
		}
		return;
	case REDUCESCATTER: {
		size_t off = (size_t)me * per;
		if (t->d.type == ncclFloat64) {
			double *out = (double *)t->recv + lo;
			for (uint64_t k = 0; k < len; k++) {
				double v = ((double *)slotOf(c, 0))[off + k];
				for (int q = 1; q < s; q++)
					v += ((double *)slotOf(c, q))[off + k];
				out[k] = v;
			}
			return;
		}
		float *out = (float *)t->recv + lo;
		for (uint64_t k = 0; k < len; k++)
			out[k] = ringSum(c, (me + 1) % s, off + k, ncclFloat32);
		return;
	}
	}
}

static void runColl(struct coll *t) {
	struct comm *c = t->c;
	struct shdr *h = c->seg->h;
	int s = c->nranks;
	if (slock(h, c) != 0)
		return;
	struct scomm *sc = SC(c);
	while (sc->collSeq != t->seq) {
		if (swait(h, c) != 0)
			return;
	}
	sc->desc[c->rank] = t->d;
	sunlock(h);
	if (barrier(c, 0) != 0)
		return;
	/* Every member sees the same descriptions, so all agree on this. */
	for (int q = 1; q < s; q++) {
		struct desc *a = &sc->desc[0], *b = &sc->desc[q];
		if (a->kind != b->kind || a->type != b->type || a->count != b->count || a->op != b->op || a->root != b->root) {
			setAsync(c, ncclInvalidUsage, "collective #%llu: member 0 called %s of %llu elements of type %d, member %d %s of %llu of type %d",
			         (unsigned long long)t->seq + 1, collName[a->kind], (unsigned long long)a->count, a->type, q, collName[b->kind],
			         (unsigned long long)b->count, b->type);
			barrier(c, 1);
			return;
		}
	}
	size_t es = typeSize[t->d.type];
	uint64_t per = SLOT / es;
	if (t->d.kind == REDUCESCATTER)
		per = SLOT / (es * (size_t)s);
	uint64_t n = t->d.count, pieces = (n + per - 1) / per;
	if (pieces == 0) {
		barrier(c, 1);
		return;
	}
	for (uint64_t p = 0; p < pieces; p++) {
		uint64_t lo = p * per, len = n - lo < per ? n - lo : per;
		post(t, lo, len, per);
		if (barrier(c, 0) != 0)
			return;
		compute(t, lo, len, per);
		if (barrier(c, p == pieces - 1) != 0)
			return;
	}
}

static void collTask(void *arg) {
	struct coll *t = arg;
	struct comm *c = t->c;
	hook(collName[t->d.kind], c);
	if (!isAborted(c)) /* an aborted communicator's kernel exits at once */
		runColl(t);
	taskEnd(c);
	free(t);
}

static __thread int groupDepth;

static ncclResult_t coll(int kind, const void *send, void *recv, size_t count, int type, int op, int root, ncclComm_t c, void *stream) {
	const char *name = collName[kind];
	ncclResult_t r = usable(c, name);
	if (r != ncclSuccess)
		return r;
	if (groupDepth > 0)
		return fail(ncclInvalidUsage, "%s inside ncclGroupStart/End: the stand-in groups only sends and receives", name);
	if (type < 0 || type >= (int)(sizeof typeSize / sizeof typeSize[0]))
		return fail(ncclInvalidArgument, "%s: type %d", name, type);
	if ((kind == ALLREDUCE || kind == REDUCESCATTER) && ((type != ncclFloat32 && type != ncclFloat64 && !(kind == ALLREDUCE && type == ncclBfloat16)) || op != ncclSum))
		return fail(ncclInvalidArgument, "%s: the stand-in sums ncclFloat32 and ncclFloat64 (and all-reduces ncclBfloat16) only (type %d, op %d)", name, type, op);
	if (kind == BROADCAST && (root < 0 || root >= c->nranks))
		return fail(ncclInvalidArgument, "%s: root %d of %d", name, root, c->nranks);
	size_t es = typeSize[type], in = count * es, out = count * es;
	if (kind == REDUCESCATTER)
		in *= (size_t)c->nranks;
	if (kind == ALLGATHER)
		out *= (size_t)c->nranks;
	if (count > 0) {
		if ((kind != BROADCAST || c->rank == root) && !isdev(send, in))
			return fail(ncclInvalidArgument, "%s: the send buffer %p (%zu bytes) is not device memory", name, send, in);
		if (!isdev(recv, out))
			return fail(ncclInvalidArgument, "%s: the receive buffer %p (%zu bytes) is not device memory", name, recv, out);
	}
	struct coll *t = calloc(1, sizeof *t);
	if (t == NULL)
		return fail(ncclSystemError, "%s: out of memory", name);
	t->c = c;
	t->d = (struct desc){kind, type, op, root, count};
	t->send = send;
	t->recv = recv;
	t->seq = c->nColl++;
	taskBegin(c);
	int e = enq(stream, collTask, t);
	if (e != 0) {
		c->nColl--;
		taskEnd(c);
		free(t);
		return fail(ncclUnhandledCudaError, "%s: queueing on stream %p: CUresult %d", name, stream, e);
	}
	return ncclSuccess;
}

EXPORT ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int type, int op, ncclComm_t c, void *s) {
	return coll(ALLREDUCE, send, recv, count, type, op, 0, c, s);
}

EXPORT ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, int type, int op, ncclComm_t c, void *s) {
	return coll(REDUCESCATTER, send, recv, count, type, op, 0, c, s);
}

EXPORT ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, int type, ncclComm_t c, void *s) {
	return coll(ALLGATHER, send, recv, count, type, ncclSum, 0, c, s);
}

EXPORT ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, int type, int root, ncclComm_t c, void *s) {
	return coll(BROADCAST, send, recv, count, type, ncclSum, root, c, s);
}

/* Sends and receives. */

struct part {
	struct comm *c;
	int send, peer;
	uint64_t seq; /* the message's number between the two */
	char *buf;
	uint64_t bytes;
	int done;
};

struct group {
	int n, sends;
	struct part *parts;
};

static __thread struct group *grp;
static __thread void *grpStream;
static __thread ncclResult_t grpErr;

static void finish(struct chan *ch) {
	ch->cur++;
	ch->sin = ch->rin = 0;
	ch->sbytes = ch->rbytes = ch->put = ch->got = ch->fill = 0;
}

/* progress moves p's message as far as it can go now (under the
 * segment's lock) and reports whether anything changed. */
static int progress(struct part *p) {
	struct comm *c = p->c;
	int from = p->send ? c->rank : p->peer, to = p->send ? p->peer : c->rank;
	struct chan *ch = chanOf(c, from, to);
	if (ch->cur > p->seq) { /* the receiver ended it */
		if (ch->failed == p->seq + 1)
			setAsync(c, ncclInvalidUsage, "a send of %llu bytes to member %d met a receive of another size", (unsigned long long)p->bytes, p->peer);
		p->done = 1;
		return 1;
	}
	if (ch->cur < p->seq)
		return 0;
	int moved = 0;
	if (p->send && !ch->sin) {
		ch->sin = 1;
		ch->sbytes = p->bytes;
		moved = 1;
	}
	if (!p->send && !ch->rin) {
		ch->rin = 1;
		ch->rbytes = p->bytes;
		moved = 1;
	}
	if (!ch->sin || !ch->rin)
		return moved;
	if (ch->sbytes != ch->rbytes) {
		if (p->send)
			return moved;
		setAsync(c, ncclInvalidUsage, "a receive of %llu bytes from member %d met a send of %llu", (unsigned long long)ch->rbytes, p->peer,
		         (unsigned long long)ch->sbytes);
		ch->failed = p->seq + 1;
		finish(ch);
		p->done = 1;
		return 1;
	}
	char *buf = bufOf(c, from, to);
	if (p->send) {
		if (ch->fill == 0 && ch->put < ch->sbytes) {
			uint64_t k = ch->sbytes - ch->put < CHAN ? ch->sbytes - ch->put : CHAN;
			memcpy(buf, p->buf + ch->put, k);
			ch->put += k;
			ch->fill = k;
			moved = 1;
		}
		return moved;
	}
	if (ch->fill > 0) {
		memcpy(p->buf + ch->got, buf, ch->fill);
		ch->got += ch->fill;
		ch->fill = 0;
		moved = 1;
	}
	if (ch->got == ch->rbytes) {
		finish(ch);
		p->done = 1;
		moved = 1;
	}
	return moved;
}

static void groupTask(void *arg) {
	struct group *g = arg;
	char what[64];
	if (g->n == 1)
		snprintf(what, sizeof what, "%s", g->sends ? "ncclSend" : "ncclRecv");
	else
		snprintf(what, sizeof what, "ncclGroupEnd (%d sends, %d receives)", g->sends, g->n - g->sends);
	hook(what, g->parts[0].c);
	struct shdr *h = g->parts[0].c->seg->h;
	int locked = 0;
	for (;;) {
		int left = 0, moved = 0;
		for (int i = 0; i < g->n; i++) {
			struct part *p = &g->parts[i];
			if (p->done)
				continue;
			if (isAborted(p->c)) { /* its kernel exits */
				p->done = 1;
				continue;
			}
			if (!locked) {
				if (slock(h, p->c) != 0) {
					p->done = 1;
					continue;
				}
				locked = 1;
			}
			moved |= progress(p);
			left += !p->done;
		}
		if (locked && moved)
			sbcast(h);
		if (left == 0)
			break;
		if (!locked)
			continue;
		if (!moved && swait(h, NULL) != 0) /* the loop looks at the abort flags */
			locked = 0;
	}
	if (locked)
		sunlock(h);
	for (int i = 0; i < g->n; i++)
		taskEnd(g->parts[i].c);
	free(g->parts);
	free(g);
}

static ncclResult_t queueGroup(struct group *g, void *stream) {
	for (int i = 0; i < g->n; i++)
		taskBegin(g->parts[i].c);
	int e = enq(stream, groupTask, g);
	if (e != 0) {
		for (int i = 0; i < g->n; i++)
			taskEnd(g->parts[i].c);
		free(g->parts);
		free(g);
		return fail(ncclUnhandledCudaError, "queueing on stream %p: CUresult %d", stream, e);
	}
	return ncclSuccess;
}

static ncclResult_t p2p(int send, void *buf, size_t count, int type, int peer, ncclComm_t c, void *stream) {
	const char *name = send ? "ncclSend" : "ncclRecv";
	ncclResult_t r = usable(c, name);
	if (r != ncclSuccess)
		return r;
	if (type < 0 || type >= (int)(sizeof typeSize / sizeof typeSize[0]))
		return fail(ncclInvalidArgument, "%s: type %d", name, type);
	if (peer < 0 || peer >= c->nranks)
		return fail(ncclInvalidArgument, "%s: peer %d of %d", name, peer, c->nranks);
	uint64_t bytes = (uint64_t)count * typeSize[type];
	if (bytes > 0 && !isdev(buf, bytes))
		return fail(ncclInvalidArgument, "%s: the buffer %p (%llu bytes) is not device memory", name, buf, (unsigned long long)bytes);
	struct part p = {.c = c, .send = send, .peer = peer, .buf = buf, .bytes = bytes};
	if (groupDepth > 0) {
		if (grp == NULL) {
			if ((grp = calloc(1, sizeof *grp)) == NULL)
				return grpErr = fail(ncclSystemError, "%s: out of memory", name);
			grpStream = stream;
		}
		if (grp->n > 0 && (stream != grpStream || c->seg != grp->parts[0].c->seg))
			return grpErr = fail(ncclInvalidUsage, "%s: the stand-in groups the calls of one stream and one unique id only", name);
		struct part *ps = realloc(grp->parts, (size_t)(grp->n + 1) * sizeof *ps);
		if (ps == NULL)
			return grpErr = fail(ncclSystemError, "%s: out of memory", name);
		grp->parts = ps;
		p.seq = send ? c->nSend[peer]++ : c->nRecv[peer]++;
		grp->parts[grp->n++] = p;
		grp->sends += send;
		return ncclSuccess;
	}
	struct group *g = calloc(1, sizeof *g);
	struct part *ps = malloc(sizeof *ps);
	if (g == NULL || ps == NULL) {
		free(g);
		free(ps);
		return fail(ncclSystemError, "%s: out of memory", name);
	}
	p.seq = send ? c->nSend[peer]++ : c->nRecv[peer]++;
	*ps = p;
	g->n = 1;
	g->sends = send;
	g->parts = ps;
	r = queueGroup(g, stream);
	if (r != ncclSuccess) {
		if (send)
			c->nSend[peer]--;
		else
			c->nRecv[peer]--;
	}
	return r;
}

EXPORT ncclResult_t ncclSend(const void *buf, size_t count, int type, int peer, ncclComm_t c, void *s) {
	return p2p(1, (void *)buf, count, type, peer, c, s);
}

EXPORT ncclResult_t ncclRecv(void *buf, size_t count, int type, int peer, ncclComm_t c, void *s) {
	return p2p(0, buf, count, type, peer, c, s);
}

EXPORT ncclResult_t ncclGroupStart(void) {
	groupDepth++;
	return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupEnd(void) {
	if (groupDepth == 0)
		return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
	if (--groupDepth > 0)
		return ncclSuccess;
	struct group *g = grp;
	void *stream = grpStream;
	ncclResult_t err = grpErr;
	grp = NULL;
	grpStream = NULL;
	grpErr = ncclSuccess;
	if (g == NULL)
		return err;
	if (err != ncclSuccess || g->n == 0) {
		free(g->parts);
		free(g);
		return err;
	}
	return queueGroup(g, stream);
}
