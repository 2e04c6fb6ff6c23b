/* tests/nccl/emu_cudart.c — a CPU emulation of the slice of the CUDA runtime
 * that libharp-nccl.so and tests/nccl/device_check.py use, so the device-
 * pointer path (staging, stream order, events, host functions) runs on a
 * machine without a GPU. It is a test of HARP's logic, not a GPU test: the
 * real thing is scripts/gpu-check-nccl.sh on a GPU.
 *
 * "Device memory" is a memfd mapped twice: the address handed out is mapped
 * PROT_NONE, so any host code (HARP's core included) that touches a device
 * pointer directly crashes; the emulated copy engine uses the second, writable
 * alias. Streams are FIFO queues served by one thread each (ops: copy, host
 * function, event record, event wait); stream 0 is one shared stream. Events
 * count records: a record enqueued as the n-th completes when the stream
 * reaches it; waits wait for the count seen when they were enqueued.
 *
 * Build: cc -shared -fPIC -O1 -o libemucudart.so emu_cudart.c -lpthread
 * Use:   HARP_CUDART=/path/libemucudart.so (libharp-nccl.so and device_check.py)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef void (*HostFn)(void*);

/* ---- device allocations ---- */
typedef struct Alloc {
  char* dev;   /* PROT_NONE address handed out */
  char* alias; /* writable mapping of the same pages */
  size_t size;
  struct Alloc* next;
} Alloc;
static Alloc* g_allocs;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
typedef struct HostA {
  void* p;
  struct HostA* next;
} HostA;
static HostA* g_host;

static char* translate(const void* p) { /* device address -> alias, else itself */
  pthread_mutex_lock(&g_mu);
  for (Alloc* a = g_allocs; a; a = a->next)
    if ((const char*)p >= a->dev && (const char*)p < a->dev + a->size) {
      char* r = a->alias + ((const char*)p - a->dev);
      pthread_mutex_unlock(&g_mu);
      return r;
    }
  pthread_mutex_unlock(&g_mu);
  return (char*)p;
}

int cudaMalloc(void** p, size_t n) {
  size_t sz = (n + 4095) & ~(size_t)4095;
  if (sz == 0) sz = 4096;
  int fd = memfd_create("emu-cuda", 0);
  if (fd < 0 || ftruncate(fd, sz) != 0) return 2;
  char* alias = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  char* dev = mmap(NULL, sz, PROT_NONE, MAP_SHARED, fd, 0);
  close(fd);
  if (alias == MAP_FAILED || dev == MAP_FAILED) return 2;
  Alloc* a = calloc(1, sizeof *a);
  a->dev = dev, a->alias = alias, a->size = sz;
  pthread_mutex_lock(&g_mu);
  a->next = g_allocs, g_allocs = a;
  pthread_mutex_unlock(&g_mu);
  *p = dev;
  return 0;
}

int cudaFree(void* p) {
  pthread_mutex_lock(&g_mu);
  for (Alloc** pp = &g_allocs; *pp; pp = &(*pp)->next)
    if ((*pp)->dev == p) {
      Alloc* a = *pp;
      *pp = a->next;
      munmap(a->dev, a->size);
      munmap(a->alias, a->size);
      free(a);
      pthread_mutex_unlock(&g_mu);
      return 0;
    }
  pthread_mutex_unlock(&g_mu);
  return 1;
}

int cudaHostAlloc(void** p, size_t n, unsigned flags) {
  (void)flags;
  if (posix_memalign(p, 4096, n ? n : 1)) return 2;
  HostA* h = calloc(1, sizeof *h);
  h->p = *p;
  pthread_mutex_lock(&g_mu);
  h->next = g_host, g_host = h;
  pthread_mutex_unlock(&g_mu);
  return 0;
}

int cudaFreeHost(void* p) {
  pthread_mutex_lock(&g_mu);
  for (HostA** pp = &g_host; *pp; pp = &(*pp)->next)
    if ((*pp)->p == p) {
      HostA* h = *pp;
      *pp = h->next;
      free(h->p);
      free(h);
      break;
    }
  pthread_mutex_unlock(&g_mu);
  return 0;
}

typedef struct {
  int type, device;
  void *devicePointer, *hostPointer;
} Attr;

int cudaPointerGetAttributes(void* out, const void* p) {
  Attr* a = out;
  memset(a, 0, sizeof *a);
  pthread_mutex_lock(&g_mu);
  for (Alloc* x = g_allocs; x; x = x->next)
    if ((const char*)p >= x->dev && (const char*)p < x->dev + x->size) a->type = 2;
  for (HostA* h = g_host; h; h = h->next)
    if (h->p == p) a->type = 1;
  pthread_mutex_unlock(&g_mu);
  a->devicePointer = a->type == 2 ? (void*)p : NULL;
  return 0;
}

int cudaMemcpy(void* d, const void* s, size_t n, int kind) {
  (void)kind;
  memmove(translate(d), translate(s), n);
  return 0;
}

int cudaMemset(void* d, int v, size_t n) {
  memset(translate(d), v, n);
  return 0;
}

/* ---- events ---- */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  long recorded, completed;
} Event;

int cudaEventCreateWithFlags(void** e, unsigned flags) {
  (void)flags;
  Event* ev = calloc(1, sizeof *ev);
  pthread_mutex_init(&ev->mu, NULL);
  pthread_cond_init(&ev->cv, NULL);
  *e = ev;
  return 0;
}
int cudaEventDestroy(void* e) {
  free(e);
  return 0;
}
static void eventWait(Event* ev, long upto) {
  pthread_mutex_lock(&ev->mu);
  while (ev->completed < upto) pthread_cond_wait(&ev->cv, &ev->mu);
  pthread_mutex_unlock(&ev->mu);
}
int cudaEventSynchronize(void* e) {
  Event* ev = e;
  pthread_mutex_lock(&ev->mu);
  long upto = ev->recorded;
  pthread_mutex_unlock(&ev->mu);
  eventWait(ev, upto);
  return 0;
}

/* ---- streams ---- */
enum { OP_COPY, OP_HOST, OP_RECORD, OP_WAIT };
typedef struct Op {
  int kind;
  void *dst, *arg;
  const void* src;
  size_t n;
  HostFn fn;
  Event* ev;
  long val;
  struct Op* next;
} Op;
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  Op *head, *tail;
  int busy;
  pthread_t th;
} Stream;

static void* streamLoop(void* p) {
  Stream* s = p;
  for (;;) {
    pthread_mutex_lock(&s->mu);
    while (!s->head) pthread_cond_wait(&s->cv, &s->mu);
    Op* op = s->head;
    s->busy = 1;
    pthread_mutex_unlock(&s->mu);
    switch (op->kind) {
      case OP_COPY: memmove(translate(op->dst), translate(op->src), op->n); break;
      case OP_HOST: op->fn(op->arg); break;
      case OP_RECORD:
        pthread_mutex_lock(&op->ev->mu);
        if (op->val > op->ev->completed) op->ev->completed = op->val;
        pthread_cond_broadcast(&op->ev->cv);
        pthread_mutex_unlock(&op->ev->mu);
        break;
      case OP_WAIT: eventWait(op->ev, op->val); break;
    }
    pthread_mutex_lock(&s->mu);
    s->head = op->next;
    if (!s->head) s->tail = NULL;
    s->busy = 0;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    free(op);
  }
  return NULL;
}

static Stream* newStream(void) {
  Stream* s = calloc(1, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  pthread_create(&s->th, NULL, streamLoop, s);
  pthread_detach(s->th);
  return s;
}
static Stream* g_default;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void makeDefault(void) { g_default = newStream(); }
static Stream* S(void* s) {
  if (s) return s;
  pthread_once(&g_once, makeDefault);
  return g_default;
}
static void push(Stream* s, Op* op) {
  pthread_mutex_lock(&s->mu);
  if (s->tail) s->tail->next = op;
  else s->head = op;
  s->tail = op;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

int cudaStreamCreate(void** s) {
  *s = newStream();
  return 0;
}
int cudaStreamDestroy(void* s) {
  (void)s; /* its thread idles forever; fine for tests */
  return 0;
}
int cudaStreamSynchronize(void* s_) {
  Stream* s = S(s_);
  pthread_mutex_lock(&s->mu);
  while (s->head) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  return 0;
}
int cudaDeviceSynchronize(void) { return cudaStreamSynchronize(NULL); }
int cudaMemcpyAsync(void* d, const void* src, size_t n, int kind, void* s) {
  (void)kind;
  Op* op = calloc(1, sizeof *op);
  op->kind = OP_COPY, op->dst = d, op->src = src, op->n = n;
  push(S(s), op);
  return 0;
}
int cudaLaunchHostFunc(void* s, HostFn fn, void* arg) {
  Op* op = calloc(1, sizeof *op);
  op->kind = OP_HOST, op->fn = fn, op->arg = arg;
  push(S(s), op);
  return 0;
}
int cudaEventRecord(void* e, void* s) {
  Event* ev = e;
  Op* op = calloc(1, sizeof *op);
  pthread_mutex_lock(&ev->mu);
  op->val = ++ev->recorded;
  pthread_mutex_unlock(&ev->mu);
  op->kind = OP_RECORD, op->ev = ev;
  push(S(s), op);
  return 0;
}
int cudaStreamWaitEvent(void* s, void* e, unsigned flags) {
  (void)flags;
  Event* ev = e;
  Op* op = calloc(1, sizeof *op);
  pthread_mutex_lock(&ev->mu);
  op->val = ev->recorded;
  pthread_mutex_unlock(&ev->mu);
  op->kind = OP_WAIT, op->ev = ev;
  push(S(s), op);
  return 0;
}

/* ---- device management ---- */
static __thread int t_dev;
int cudaGetDeviceCount(int* n) {
  *n = 1;
  return 0;
}
int cudaGetDevice(int* d) {
  *d = t_dev;
  return 0;
}
int cudaSetDevice(int d) {
  if (d != 0) return 101; /* cudaErrorInvalidDevice */
  t_dev = d;
  return 0;
}
int cudaGetLastError(void) { return 0; }
const char* cudaGetErrorString(int e) { return e ? "emulated CUDA error" : "no error"; }
int cudaRuntimeGetVersion(int* v) {
  *v = 12040;
  return 0;
}
