// fakecuda.c: a test double of the CUDA driver API (libcuda.so.1) for the
// handful of entry points tensor/cuda calls, so its purego call path, its
// VMM and legacy IPC code, its staging pipeline and its fd export/import run
// for real on machines without a GPU. "Device memory" is host memory:
// every cuMemCreate is its own memfd, mapped at addresses cuMemAddressReserve
// handed out, and cuMemSetAccess turns into mprotect, so a read-only import
// really cannot be written. Copies are memcpy, done when issued; events can
// be told to report CUDA_ERROR_NOT_READY a few times first, to exercise the
// caller's polling. Build: gcc -shared -fPIC -o libcuda.so.1 fakecuda.c
// It is nothing like a GPU; it only keeps the Go side honest.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;

typedef struct { int type; int id; } CUmemLocation;
typedef struct {
	int type;
	int requestedHandleTypes;
	CUmemLocation location;
	void *win32HandleMetaData;
	struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;
typedef struct { char reserved[64]; } CUipcMemHandle;

enum {
	OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, NO_DEVICE = 100,
	INVALID_DEVICE = 101, INVALID_CONTEXT = 201, INVALID_HANDLE = 400, NOT_READY = 600,
	PEER_ALREADY = 704, NOT_SUPPORTED = 801, UNKNOWN = 999,
};

#define MAXDEV 8
#define GRAN (2u << 20)

// Knobs, set by the Go tests through fakecuda_set (never by environment:
// Go's os.Setenv does not reach C's environ without cgo).
static int ndev = 2;
static long long devmem = 1ll << 30;
static int novmm, nofabric, notready, failcreate, noinit;
static volatile int release_all; // events report done at once
static int noreadonly;            // cuMemSetAccess refuses read-only
static int faildtoh, failhtod;    // device<->host copies fail once *_left ran out
static long long dtoh_left, dtoh_calls, htod_left, htod_calls;
static int inited;
static long long used[MAXDEV];
static long long live_allocs, live_host, live_events, live_streams, live_ctx, busy_replies;
static __thread int cur = -1;

int fakecuda_set(const char *key, long long v) {
	if (!strcmp(key, "devices")) ndev = (int)v;
	else if (!strcmp(key, "memory")) devmem = v;
	else if (!strcmp(key, "novmm")) novmm = (int)v;
	else if (!strcmp(key, "nofabric")) nofabric = (int)v;
	else if (!strcmp(key, "notready")) notready = (int)v;
	else if (!strcmp(key, "failcreate")) failcreate = (int)v;
	else if (!strcmp(key, "noinit")) noinit = (int)v;
	else if (!strcmp(key, "release")) release_all = (int)v;
	else if (!strcmp(key, "noreadonly")) noreadonly = (int)v;
	else if (!strcmp(key, "faildtoh")) { dtoh_left = v - 1; faildtoh = v > 0; }
	else if (!strcmp(key, "failhtod")) { htod_left = v - 1; failhtod = v > 0; }
	else return -1;
	return 0;
}

// fakecuda_live reports what is still allocated, for leak checks.
long long fakecuda_live(const char *what) {
	if (!strcmp(what, "allocs")) return live_allocs;
	if (!strcmp(what, "host")) return live_host;
	if (!strcmp(what, "events")) return live_events;
	if (!strcmp(what, "streams")) return live_streams;
	if (!strcmp(what, "ctx")) return live_ctx;
	if (!strcmp(what, "busy")) return busy_replies;
	if (!strcmp(what, "dtoh")) return dtoh_calls;
	if (!strcmp(what, "htod")) return htod_calls;
	if (!strcmp(what, "used0")) return used[0];
	if (!strcmp(what, "used1")) return used[1];
	return -1;
}

#define NEED_INIT() do { if (!inited) return NOT_INITIALIZED; } while (0)
#define NEED_CTX() do { NEED_INIT(); if (cur < 0) return INVALID_CONTEXT; } while (0)

CUresult cuInit(unsigned flags) {
	if (flags) return INVALID_VALUE;
	if (noinit) return NO_DEVICE;
	inited = 1;
	return OK;
}
CUresult cuDriverGetVersion(int *v) { *v = 12080; return OK; }

static const char *names[][2] = {
	{"CUDA_SUCCESS", "no error"}, {"CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	{"CUDA_ERROR_OUT_OF_MEMORY", "out of memory"}, {"CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	{"CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
	{"CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
};
static int nameidx(CUresult r) {
	switch (r) { case 0: return 0; case 1: return 1; case 2: return 2; case 3: return 3; case 100: return 4; case 801: return 5; }
	return -1;
}
CUresult cuGetErrorName(CUresult r, const char **s) { int i = nameidx(r); if (i < 0) return INVALID_VALUE; *s = names[i][0]; return OK; }
CUresult cuGetErrorString(CUresult r, const char **s) { int i = nameidx(r); if (i < 0) return INVALID_VALUE; *s = names[i][1]; return OK; }

CUresult cuDeviceGetCount(int *n) { NEED_INIT(); *n = ndev; return OK; }
CUresult cuDeviceGet(CUdevice *d, int ord) { NEED_INIT(); if (ord < 0 || ord >= ndev) return INVALID_DEVICE; *d = ord; return OK; }
CUresult cuDeviceGetName(char *s, int n, CUdevice d) {
	NEED_INIT(); if (d < 0 || d >= ndev) return INVALID_DEVICE;
	snprintf(s, n, "Fake H200 %d (tensorlane test double)", d); return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { NEED_INIT(); if (d < 0 || d >= ndev) return INVALID_DEVICE; *b = devmem; return OK; }
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
	NEED_INIT(); if (d < 0 || d >= ndev) return INVALID_DEVICE;
	switch (attr) {
	case 33: *v = 0x18 + d; break;           // PCI bus
	case 34: *v = 0; break;                   // PCI device
	case 50: *v = 0; break;                   // PCI domain
	case 41: *v = 1; break;                   // unified addressing
	case 75: *v = 9; break;                   // cc major
	case 76: *v = 0; break;                   // cc minor
	case 16: *v = 132; break;                 // SMs
	case 102: *v = !novmm; break;             // VMM
	case 103: *v = !novmm; break;             // POSIX fd handles
	case 116: *v = 1; break;                  // GPUDirect RDMA
	case 128: *v = !nofabric && !novmm; break; // fabric handles
	case 131: *v = d < 4 ? 0 : 1; break;      // NUMA id
	default: *v = 0;
	}
	return OK;
}
CUresult cuDeviceGetPCIBusId(char *s, int n, CUdevice d) {
	NEED_INIT(); if (d < 0 || d >= ndev) return INVALID_DEVICE;
	snprintf(s, n, "0000:%02X:00.0", 0x18 + d); return OK;
}
CUresult cuDeviceGetUuid_v2(unsigned char *u, CUdevice d) {
	NEED_INIT(); if (d < 0 || d >= ndev) return INVALID_DEVICE;
	for (int i = 0; i < 16; i++) u[i] = (unsigned char)(0xa0 + i + d);
	return OK;
}
CUresult cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice p) {
	NEED_INIT(); if (d < 0 || d >= ndev || p < 0 || p >= ndev) return INVALID_DEVICE;
	*can = d != p; return OK;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
	NEED_INIT(); if (d < 0 || d >= ndev) return INVALID_DEVICE;
	*c = (CUcontext)(uintptr_t)(d + 1); __sync_fetch_and_add(&live_ctx, 1); return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { NEED_INIT(); __sync_fetch_and_sub(&live_ctx, 1); return OK; }
CUresult cuCtxSetCurrent(CUcontext c) {
	NEED_INIT(); int d = (int)(uintptr_t)c - 1;
	if (c && (d < 0 || d >= ndev)) return INVALID_CONTEXT;
	cur = c ? d : -1; return OK;
}
CUresult cuCtxEnablePeerAccess(CUcontext p, unsigned flags) {
	NEED_CTX(); static int enabled[MAXDEV][MAXDEV]; int d = (int)(uintptr_t)p - 1;
	if (d < 0 || d >= ndev || flags) return INVALID_VALUE;
	if (__sync_lock_test_and_set(&enabled[cur][d], 1)) return PEER_ALREADY;
	return OK;
}
CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
	NEED_CTX(); *total = devmem; *free = devmem - used[cur]; return OK;
}

// Allocations: each is a memfd. Handles point at this.
struct alloc { int fd; size_t size; int dev; };

static CUresult charge(int dev, size_t n) {
	if (__sync_add_and_fetch(&used[dev], (long long)n) > devmem) { __sync_fetch_and_sub(&used[dev], (long long)n); return OUT_OF_MEMORY; }
	return OK;
}

CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *p, int opt) {
	NEED_INIT(); if (novmm) return NOT_SUPPORTED;
	if (p->type != 1 || p->location.type != 1) return INVALID_VALUE;
	*g = GRAN; return OK;
}
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *p, unsigned long long flags) {
	NEED_INIT(); if (novmm) return NOT_SUPPORTED;
	if (failcreate) return UNKNOWN;
	if (p->type != 1 || p->location.type != 1 || p->location.id < 0 || p->location.id >= ndev || flags || n == 0 || n % GRAN)
		return INVALID_VALUE;
	if ((p->requestedHandleTypes & 8) && nofabric) return NOT_SUPPORTED;
	if (p->requestedHandleTypes & ~9) return INVALID_VALUE;
	if (charge(p->location.id, n)) return OUT_OF_MEMORY;
	int fd = memfd_create("fakecuda", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, n) < 0) { if (fd >= 0) close(fd); __sync_fetch_and_sub(&used[p->location.id], (long long)n); return OUT_OF_MEMORY; }
	struct alloc *a = malloc(sizeof *a); a->fd = fd; a->size = n; a->dev = p->location.id;
	*h = (CUmemGenericAllocationHandle)(uintptr_t)a; __sync_fetch_and_add(&live_allocs, 1);
	return OK;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
	NEED_INIT(); struct alloc *a = (struct alloc *)(uintptr_t)h; if (!a) return INVALID_VALUE;
	if (a->dev >= 0) __sync_fetch_and_sub(&used[a->dev], (long long)a->size);
	close(a->fd); free(a); __sync_fetch_and_sub(&live_allocs, 1); return OK;
}
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t n, size_t align, CUdeviceptr addr, unsigned long long flags) {
	NEED_INIT(); if (n == 0 || n % GRAN || flags) return INVALID_VALUE;
	void *p = mmap(NULL, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED) return OUT_OF_MEMORY;
	*ptr = (CUdeviceptr)(uintptr_t)p; return OK;
}
CUresult cuMemAddressFree(CUdeviceptr p, size_t n) { NEED_INIT(); return munmap((void *)(uintptr_t)p, n) ? INVALID_VALUE : OK; }
CUresult cuMemMap(CUdeviceptr p, size_t n, size_t off, CUmemGenericAllocationHandle h, unsigned long long flags) {
	NEED_INIT(); struct alloc *a = (struct alloc *)(uintptr_t)h;
	if (!a || flags || off + n > a->size) return INVALID_VALUE;
	// Mapped without access until cuMemSetAccess, as on a GPU.
	void *r = mmap((void *)(uintptr_t)p, n, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, off);
	return r == MAP_FAILED ? INVALID_VALUE : OK;
}
CUresult cuMemUnmap(CUdeviceptr p, size_t n) {
	NEED_INIT();
	void *r = mmap((void *)(uintptr_t)p, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
	return r == MAP_FAILED ? INVALID_VALUE : OK;
}
CUresult cuMemSetAccess(CUdeviceptr p, size_t n, const CUmemAccessDesc *d, size_t count) {
	NEED_INIT(); if (!count) return INVALID_VALUE;
	int prot = PROT_NONE;
	for (size_t i = 0; i < count; i++) {
		if (d[i].location.type != 1 || d[i].location.id < 0 || d[i].location.id >= ndev) return INVALID_DEVICE;
		if (d[i].flags == 1 && noreadonly) return NOT_SUPPORTED;
		if (d[i].flags == 3) prot = PROT_READ | PROT_WRITE;
		else if (d[i].flags == 1 && prot == PROT_NONE) prot = PROT_READ;
		else if (d[i].flags != 1 && d[i].flags != 0) return INVALID_VALUE;
	}
	return mprotect((void *)(uintptr_t)p, n, prot) ? INVALID_VALUE : OK;
}

// Fabric handle: where the exporter's memfd can be opened (same user).
struct fabric { char magic[8]; int pid, fd; char pad[48]; };

CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, int type, unsigned long long flags) {
	NEED_INIT(); struct alloc *a = (struct alloc *)(uintptr_t)h; if (!a || flags) return INVALID_VALUE;
	if (type == 1) {
		int fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0); if (fd < 0) return UNKNOWN;
		*(int *)out = fd; return OK;
	}
	if (type == 8) {
		if (nofabric) return NOT_SUPPORTED;
		struct fabric f = {{'F','A','K','E','F','A','B',0}, getpid(), a->fd, {0}};
		memcpy(out, &f, sizeof f); return OK;
	}
	return NOT_SUPPORTED;
}
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os, int type) {
	NEED_INIT(); int fd;
	if (type == 1) {
		fd = fcntl((int)(intptr_t)os, F_DUPFD_CLOEXEC, 0); if (fd < 0) return INVALID_HANDLE;
	} else if (type == 8) {
		struct fabric *f = os; char path[64];
		if (memcmp(f->magic, "FAKEFAB", 8)) return INVALID_HANDLE;
		snprintf(path, sizeof path, "/proc/%d/fd/%d", f->pid, f->fd);
		fd = open(path, O_RDWR | O_CLOEXEC); if (fd < 0) return INVALID_HANDLE;
	} else return NOT_SUPPORTED;
	struct stat st;
	if (fstat(fd, &st) || st.st_size == 0) { close(fd); return INVALID_HANDLE; }
	struct alloc *a = malloc(sizeof *a); a->fd = fd; a->size = st.st_size; a->dev = -1;
	*h = (CUmemGenericAllocationHandle)(uintptr_t)a; __sync_fetch_and_add(&live_allocs, 1);
	return OK;
}

// Legacy allocations: a memfd mapped read-write; the IPC handle says where
// its fd lives. A small table maps pointers back to their allocation.
#define MAXLEG 1024
static struct { CUdeviceptr p; struct alloc a; int imported; } leg[MAXLEG];
struct ipc { char magic[8]; int pid, fd; long long size; char pad[40]; };

static int legput(CUdeviceptr p, int fd, size_t n, int dev, int imported) {
	for (int i = 0; i < MAXLEG; i++)
		if (__sync_bool_compare_and_swap(&leg[i].p, 0, p)) { leg[i].a.fd = fd; leg[i].a.size = n; leg[i].a.dev = dev; leg[i].imported = imported; return 0; }
	return -1;
}
static int legfind(CUdeviceptr p) { for (int i = 0; i < MAXLEG; i++) if (leg[i].p == p) return i; return -1; }

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	NEED_CTX(); if (!n) return INVALID_VALUE;
	if (charge(cur, n)) return OUT_OF_MEMORY;
	int fd = memfd_create("fakecuda-legacy", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, n) < 0) { if (fd >= 0) close(fd); __sync_fetch_and_sub(&used[cur], (long long)n); return OUT_OF_MEMORY; }
	void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) { close(fd); __sync_fetch_and_sub(&used[cur], (long long)n); return OUT_OF_MEMORY; }
	*p = (CUdeviceptr)(uintptr_t)m;
	if (legput(*p, fd, n, cur, 0)) { munmap(m, n); close(fd); return OUT_OF_MEMORY; }
	__sync_fetch_and_add(&live_allocs, 1); return OK;
}
static CUresult legfree(CUdeviceptr p, int imported) {
	int i = legfind(p); if (i < 0 || leg[i].imported != imported) return INVALID_VALUE;
	munmap((void *)(uintptr_t)p, leg[i].a.size); close(leg[i].a.fd);
	if (!imported) __sync_fetch_and_sub(&used[leg[i].a.dev], (long long)leg[i].a.size);
	leg[i].p = 0; __sync_fetch_and_sub(&live_allocs, 1); return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) { NEED_INIT(); return legfree(p, 0); }
CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
	NEED_INIT(); int i = legfind(p); if (i < 0 || leg[i].imported) return INVALID_VALUE;
	struct ipc x = {{'F','A','K','E','I','P','C',0}, getpid(), leg[i].a.fd, (long long)leg[i].a.size, {0}};
	memcpy(h, &x, sizeof x); return OK;
}
// The handle is passed by value (64 bytes, in memory on the stack), which
// is what exercises purego's struct arguments.
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned flags) {
	NEED_CTX(); struct ipc x; memcpy(&x, &h, sizeof x);
	if (memcmp(x.magic, "FAKEIPC", 8) || x.size <= 0) return INVALID_HANDLE;
	if (x.pid == getpid()) return INVALID_CONTEXT; // as CUDA: not within the exporting process
	char path[64]; snprintf(path, sizeof path, "/proc/%d/fd/%d", x.pid, x.fd);
	int fd = open(path, O_RDWR | O_CLOEXEC); if (fd < 0) return INVALID_HANDLE;
	void *m = mmap(NULL, x.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) { close(fd); return INVALID_HANDLE; }
	*p = (CUdeviceptr)(uintptr_t)m;
	if (legput(*p, fd, x.size, cur, 1)) { munmap(m, x.size); close(fd); return OUT_OF_MEMORY; }
	__sync_fetch_and_add(&live_allocs, 1); return OK;
}
CUresult cuIpcCloseMemHandle(CUdeviceptr p) { NEED_INIT(); return legfree(p, 1); }

CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) {
	NEED_CTX(); if (!n) return INVALID_VALUE;
	char *m = mmap(NULL, n + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) return OUT_OF_MEMORY;
	*(size_t *)m = n + 4096; *p = m + 4096; __sync_fetch_and_add(&live_host, 1); return OK;
}
CUresult cuMemFreeHost(void *p) {
	NEED_INIT(); char *m = (char *)p - 4096; munmap(m, *(size_t *)m); __sync_fetch_and_sub(&live_host, 1); return OK;
}

struct event { int pending; };
CUresult cuStreamCreate(CUstream *s, unsigned flags) { NEED_CTX(); *s = malloc(8); __sync_fetch_and_add(&live_streams, 1); return OK; }
CUresult cuStreamDestroy_v2(CUstream s) { NEED_INIT(); free(s); __sync_fetch_and_sub(&live_streams, 1); return OK; }
CUresult cuStreamSynchronize(CUstream s) { NEED_CTX(); return OK; }
CUresult cuEventCreate(CUevent *e, unsigned flags) {
	NEED_CTX(); struct event *x = calloc(1, sizeof *x); *e = x; __sync_fetch_and_add(&live_events, 1); return OK;
}
CUresult cuEventDestroy_v2(CUevent e) { NEED_INIT(); free(e); __sync_fetch_and_sub(&live_events, 1); return OK; }
CUresult cuEventRecord(CUevent e, CUstream s) { NEED_CTX(); ((struct event *)e)->pending = notready; return OK; }
CUresult cuEventQuery(CUevent e) {
	NEED_CTX(); struct event *x = e;
	if (x->pending > 0 && !release_all) { x->pending--; __sync_fetch_and_add(&busy_replies, 1); return NOT_READY; }
	return OK;
}
CUresult cuEventSynchronize(CUevent e) { NEED_CTX(); ((struct event *)e)->pending = 0; return OK; }

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream st) {
	NEED_CTX();
	__sync_fetch_and_add(&htod_calls, 1);
	if (failhtod && __sync_fetch_and_sub(&htod_left, 1) <= 0) return INVALID_VALUE;
	memcpy((void *)(uintptr_t)d, s, n); return OK;
}
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUstream st) {
	NEED_CTX();
	__sync_fetch_and_add(&dtoh_calls, 1);
	if (faildtoh && __sync_fetch_and_sub(&dtoh_left, 1) <= 0) return INVALID_VALUE;
	memcpy(d, (void *)(uintptr_t)s, n); return OK;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { NEED_CTX(); memmove((void *)(uintptr_t)d, (void *)(uintptr_t)s, n); return OK; }
CUresult cuMemcpyPeerAsync(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n, CUstream st) {
	NEED_CTX(); if (!dc || !sc) return INVALID_CONTEXT; memmove((void *)(uintptr_t)d, (void *)(uintptr_t)s, n); return OK;
}
CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { NEED_CTX(); memmove((void *)(uintptr_t)d, (void *)(uintptr_t)s, n); return OK; }
