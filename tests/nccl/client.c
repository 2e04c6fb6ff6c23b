/* tests/nccl/client.c — an ordinary NCCL program, used to prove the drop-in.
 *
 * tests/test_nccl_client.py compiles it against NVIDIA's own nccl.h (from the
 * nvidia-nccl-cu12 wheel, with CUDA's headers from the cuda runtime/nvcc/cccl
 * wheels) and links it to NVIDIA's libnccl.so.2, then runs several ranks with
 * LD_PRELOAD=libharp-nccl.so on host buffers. Nothing here knows about HARP
 * except the optional dlsym of harpNcclCallsServed at the end, which lets the
 * test check that HARP served every NCCL call this program made.
 *
 * Built with -DCLIENT_DEVICE (scripts/gpu-check.sh, on a GPU machine) every
 * buffer handed to NCCL is cudaMalloc'ed device memory on a stream of its own
 * (cudaStreamCreate), filled and read back with cudaMemcpyAsync on that stream:
 * the same checks, through the device-pointer path. Link it to libcudart
 * (-lcudart). Against HARP's nccl.h without CUDA's headers it declares the few
 * runtime calls itself (for tests/nccl/emu_cudart.c on a machine without a GPU).
 *
 * usage: client RANK NRANKS IDFILE
 * Rank 0 writes the unique id to IDFILE (atomically); the others wait for it.
 * Prints "PASS rank R calls=N served=M" or "FAIL ..." and exits non-zero
 * (device builds print "PASS ... device=1").
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nccl.h>

static long g_calls = 0; /* NCCL calls made by this program */
static int g_rank = -1;

#define CALL(expr) (++g_calls, (expr))
#define CHECK(expr)                                                                                 \
  do {                                                                                              \
    ncclResult_t r_ = CALL(expr);                                                                   \
    if (r_ != ncclSuccess) {                                                                        \
      ++g_calls;                                                                                    \
      printf("FAIL rank %d: %s -> %d (%s) at line %d\n", g_rank, #expr, (int)r_, ncclGetErrorString(r_), \
             __LINE__);                                                                             \
      exit(2);                                                                                      \
    }                                                                                               \
  } while (0)
#define EXPECT(cond, ...)                          \
  do {                                             \
    if (!(cond)) {                                 \
      printf("FAIL rank %d line %d: ", g_rank, __LINE__); \
      printf(__VA_ARGS__);                         \
      printf("\n");                                \
      exit(3);                                     \
    }                                              \
  } while (0)

/* Buffers handed to NCCL: the host buffer itself, or (CLIENT_DEVICE) a device
 * mirror filled by up() and read back by down(), both in stream order. */
#ifdef CLIENT_DEVICE
#if !defined(__CUDA_RUNTIME_H__) && !defined(__CUDA_RUNTIME_API_H__)
/* No CUDA headers (HARP's nccl.h, emulated runtime): the calls used, CUDA 11+ ABI. */
int cudaMalloc(void** p, size_t n);
int cudaFree(void* p);
int cudaMemcpyAsync(void* dst, const void* src, size_t n, int kind, cudaStream_t s);
int cudaStreamCreate(cudaStream_t* s);
int cudaStreamSynchronize(cudaStream_t s);
int cudaStreamDestroy(cudaStream_t s);
int cudaGetDeviceCount(int* n);
int cudaSetDevice(int d);
#define cudaMemcpyHostToDevice 1
#define cudaMemcpyDeviceToHost 2
#endif
#define DEVICE_BUILD 1
static cudaStream_t g_stream;
static void cuda_ok(int rc, const char* what, int line) {
  if (rc != 0) {
    printf("FAIL rank %d line %d: %s -> CUDA error %d\n", g_rank, line, what, rc);
    exit(4);
  }
}
#define CU(expr) cuda_ok((int)(expr), #expr, __LINE__)
static void* mirror(void* h, size_t bytes) {
  (void)h;
  void* d = NULL;
  CU(cudaMalloc(&d, bytes));
  return d;
}
static void up(void* d, const void* h, size_t n) { CU(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, g_stream)); }
static void down(void* h, const void* d, size_t n) {
  CU(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, g_stream));
  CU(cudaStreamSynchronize(g_stream));
}
static void device_setup(int rank) {
  int n = 0;
  CU(cudaGetDeviceCount(&n));
  EXPECT(n > 0, "no CUDA device");
  CU(cudaSetDevice(rank % n));
  CU(cudaStreamCreate(&g_stream));
}
#else
#define DEVICE_BUILD 0
static cudaStream_t g_stream = 0; /* host buffers: any stream value is accepted */
static void* mirror(void* h, size_t bytes) {
  (void)bytes;
  return h;
}
static void up(void* d, const void* h, size_t n) { (void)d, (void)h, (void)n; }
static void down(void* h, const void* d, size_t n) { (void)d, (void)h, (void)n; }
static void device_setup(int rank) { (void)rank; }
#endif

static void shareId(ncclUniqueId* id, int rank, const char* path) {
  if (rank == 0) {
    CHECK(ncclGetUniqueId(id));
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE* f = fopen(tmp, "wb");
    EXPECT(f && fwrite(id, sizeof *id, 1, f) == 1, "cannot write %s", tmp);
    fclose(f);
    EXPECT(rename(tmp, path) == 0, "rename to %s", path);
    return;
  }
  for (int i = 0; i < 6000; ++i) {
    FILE* f = fopen(path, "rb");
    if (f) {
      size_t n = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (n == 1) return;
    }
    usleep(10000);
  }
  EXPECT(0, "no unique id appeared in %s within 60 s", path);
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s RANK NRANKS IDFILE\n", argv[0]);
    return 1;
  }
  int rank = atoi(argv[1]), n = atoi(argv[2]);
  g_rank = rank;
  device_setup(rank);
  cudaStream_t stream = g_stream;

  int version = 0;
  CHECK(ncclGetVersion(&version));
  EXPECT(version >= 22100, "version %d", version);

  ncclUniqueId id;
  shareId(&id, rank, argv[3]);
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, n, id, rank));
  int cnt = -1, me = -1, dev = -1;
  CHECK(ncclCommCount(comm, &cnt));
  CHECK(ncclCommUserRank(comm, &me));
  CHECK(ncclCommCuDevice(comm, &dev));
  EXPECT(cnt == n && me == rank, "count %d rank %d", cnt, me);

  enum { N = 1000 };
  float* fs = malloc(N * sizeof(float));
  float* fr = malloc(N * sizeof(float));
  float* dfs = mirror(fs, N * sizeof(float));
  float* dfr = mirror(fr, N * sizeof(float));
  for (int i = 0; i < N; ++i) fs[i] = (float)(rank + 1) * (float)(i % 7);

  /* allreduce, out of place and in place */
  up(dfs, fs, N * sizeof(float));
  CHECK(ncclAllReduce(dfs, dfr, N, ncclFloat, ncclSum, comm, stream));
  down(fr, dfr, N * sizeof(float));
  float tri = (float)n * (n + 1) / 2;
  for (int i = 0; i < N; ++i) EXPECT(fr[i] == tri * (i % 7), "allreduce[%d] = %g", i, fr[i]);
  CHECK(ncclAllReduce(dfs, dfs, N, ncclFloat, ncclMax, comm, stream));
  down(fs, dfs, N * sizeof(float));
  for (int i = 0; i < N; ++i) EXPECT(fs[i] == (float)n * (i % 7), "allreduce max[%d] = %g", i, fs[i]);

  int64_t* is = malloc(N * sizeof(int64_t));
  int64_t* ir = malloc(N * n * sizeof(int64_t));
  int64_t* dis = mirror(is, N * sizeof(int64_t));
  int64_t* dir = mirror(ir, N * n * sizeof(int64_t));
  for (int i = 0; i < N; ++i) is[i] = rank * 1000 + i;
  /* allgather, out of place */
  up(dis, is, N * sizeof(int64_t));
  CHECK(ncclAllGather(dis, dir, N, ncclInt64, comm, stream));
  down(ir, dir, N * n * sizeof(int64_t));
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < N; ++i) EXPECT(ir[r * N + i] == r * 1000 + i, "allgather[%d][%d] = %ld", r, i, (long)ir[r * N + i]);
  /* allgather in place: sendbuff = recvbuff + rank * count */
  for (int i = 0; i < N * n; ++i) ir[i] = -1;
  for (int i = 0; i < N; ++i) ir[rank * N + i] = rank * 7 + i;
  up(dir, ir, N * n * sizeof(int64_t));
  CHECK(ncclAllGather(dir + rank * N, dir, N, ncclInt64, comm, stream));
  down(ir, dir, N * n * sizeof(int64_t));
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < N; ++i) EXPECT(ir[r * N + i] == r * 7 + i, "allgather in place[%d][%d]", r, i);

  /* reduce scatter, in place: recvbuff = sendbuff + rank * recvcount */
  int32_t* rs = malloc(N * n * sizeof(int32_t));
  int32_t* drs = mirror(rs, N * n * sizeof(int32_t));
  for (int i = 0; i < N * n; ++i) rs[i] = i + rank;
  up(drs, rs, N * n * sizeof(int32_t));
  CHECK(ncclReduceScatter(drs, drs + rank * N, N, ncclInt32, ncclSum, comm, stream));
  down(rs, drs, N * n * sizeof(int32_t));
  for (int i = 0; i < N; ++i) {
    int g = rank * N + i;
    EXPECT(rs[g] == n * g + n * (n - 1) / 2, "reduce_scatter[%d] = %d", i, rs[g]);
  }

  /* broadcast (out of place) and bcast (in place), root n-1 */
  double* ds = malloc(N * sizeof(double));
  double* dr = malloc(N * sizeof(double));
  double* dds = mirror(ds, N * sizeof(double));
  double* ddr = mirror(dr, N * sizeof(double));
  for (int i = 0; i < N; ++i) ds[i] = rank == n - 1 ? 0.5 * i : -1.0;
  up(dds, ds, N * sizeof(double));
  CHECK(ncclBroadcast(dds, ddr, N, ncclDouble, n - 1, comm, stream));
  down(dr, ddr, N * sizeof(double));
  for (int i = 0; i < N; ++i) EXPECT(dr[i] == 0.5 * i, "broadcast[%d] = %g", i, dr[i]);
  for (int i = 0; i < N; ++i) ds[i] = rank == 0 ? 3.0 + i : 0.0;
  up(dds, ds, N * sizeof(double));
  CHECK(ncclBcast(dds, N, ncclDouble, 0, comm, stream));
  down(ds, dds, N * sizeof(double));
  for (int i = 0; i < N; ++i) EXPECT(ds[i] == 3.0 + i, "bcast[%d] = %g", i, ds[i]);

  /* reduce prod to root 0 (uint8 wraps) */
  uint8_t us[64], ur[64];
  uint8_t* dus = mirror(us, sizeof us);
  uint8_t* dur = mirror(ur, sizeof ur);
  for (int i = 0; i < 64; ++i) us[i] = (uint8_t)(2 + (i % 3));
  up(dus, us, sizeof us);
  CHECK(ncclReduce(dus, dur, 64, ncclUint8, ncclProd, 0, comm, stream));
  down(ur, dur, sizeof ur);
  if (rank == 0)
    for (int i = 0; i < 64; ++i) {
      unsigned v = 1;
      for (int r = 0; r < n; ++r) v = (v * (2 + (i % 3))) & 0xff;
      EXPECT(ur[i] == v, "reduce prod[%d] = %u, want %u", i, ur[i], v);
    }

  /* PreMulSum: sum(0.5 * x) */
  float half = 0.5f;
  ncclRedOp_t pm;
  CHECK(ncclRedOpCreatePreMulSum(&pm, &half, ncclFloat, ncclScalarHostImmediate, comm));
  for (int i = 0; i < N; ++i) fs[i] = (float)(rank + 1);
  up(dfs, fs, N * sizeof(float));
  CHECK(ncclAllReduce(dfs, dfr, N, ncclFloat, pm, comm, stream));
  down(fr, dfr, N * sizeof(float));
  for (int i = 0; i < N; ++i) EXPECT(fr[i] == 0.5f * tri, "premulsum[%d] = %g", i, fr[i]);
  CHECK(ncclRedOpDestroy(pm, comm));

  /* alltoall through grouped send/recv, including the send to self */
  int32_t* a2s = malloc(n * 16 * sizeof(int32_t));
  int32_t* a2r = malloc(n * 16 * sizeof(int32_t));
  int32_t* da2s = mirror(a2s, n * 16 * sizeof(int32_t));
  int32_t* da2r = mirror(a2r, n * 16 * sizeof(int32_t));
  for (int p = 0; p < n; ++p)
    for (int i = 0; i < 16; ++i) a2s[p * 16 + i] = rank * 10000 + p * 100 + i;
  up(da2s, a2s, n * 16 * sizeof(int32_t));
  CHECK(ncclGroupStart());
  for (int p = 0; p < n; ++p) {
    CHECK(ncclSend(da2s + p * 16, 16, ncclInt32, p, comm, stream));
    CHECK(ncclRecv(da2r + p * 16, 16, ncclInt32, p, comm, stream));
  }
  CHECK(ncclGroupEnd());
  down(a2r, da2r, n * 16 * sizeof(int32_t));
  for (int p = 0; p < n; ++p)
    for (int i = 0; i < 16; ++i)
      EXPECT(a2r[p * 16 + i] == p * 10000 + rank * 100 + i, "alltoall from %d [%d] = %d", p, i, a2r[p * 16 + i]);

  /* split into even and odd ranks, allreduce inside */
  ncclComm_t sub;
  CHECK(ncclCommSplit(comm, rank % 2, rank, &sub, NULL));
  int subn = 0;
  CHECK(ncclCommCount(sub, &subn));
  EXPECT(subn == (n + 1 - rank % 2) / 2, "split size %d", subn);
  int32_t v = rank, vs = 0;
  int32_t* dv = mirror(&v, sizeof v);
  int32_t* dvs = mirror(&vs, sizeof vs);
  up(dv, &v, sizeof v);
  CHECK(ncclAllReduce(dv, dvs, 1, ncclInt32, ncclSum, sub, stream));
  down(&vs, dvs, sizeof vs);
  int want = 0;
  for (int r = rank % 2; r < n; r += 2) want += r;
  EXPECT(vs == want, "split allreduce %d want %d", vs, want);
  CHECK(ncclCommDestroy(sub));

  /* errors come back as codes, with text */
  ncclResult_t bad = CALL(ncclAllReduce(dfs, dfr, N, (ncclDataType_t)42, ncclSum, comm, stream));
  EXPECT(bad == ncclInvalidArgument, "bad datatype gave %d", (int)bad);
  const char* text = CALL(ncclGetLastError(comm));
  EXPECT(text && strstr(text, "42"), "last error text '%s'", text ? text : "(null)");
  const char* es = CALL(ncclGetErrorString(ncclInvalidArgument));
  EXPECT(es && *es, "error string");
  ncclResult_t async = ncclInProgress;
  CHECK(ncclCommGetAsyncError(comm, &async));
  EXPECT(async == ncclSuccess, "async error %d", (int)async);

  CHECK(ncclCommFinalize(comm));
  CHECK(ncclCommDestroy(comm));

  unsigned long long (*served)(void) = (unsigned long long (*)(void))dlsym(RTLD_DEFAULT, "harpNcclCallsServed");
  long long s = served ? (long long)served() : -1;
  if (DEVICE_BUILD)
    printf("PASS rank %d calls=%ld served=%lld version=%d device=1\n", rank, g_calls, s, version);
  else
    printf("PASS rank %d calls=%ld served=%lld version=%d\n", rank, g_calls, s, version);
  return 0;
}
