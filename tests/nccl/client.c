/* tests/nccl/client.c — an ordinary NCCL program, used to prove the drop-in.
 *
 * tests/test_nccl_client.py compiles it against NVIDIA's own nccl.h (from the
 * nvidia-nccl-cu12 wheel, with CUDA's headers from the cuda runtime/nvcc/cccl
 * wheels) and links it to NVIDIA's libnccl.so.2, then runs several ranks with
 * LD_PRELOAD=libharp-nccl.so on host buffers. Nothing here knows about HARP
 * except the optional dlsym of harpNcclCallsServed at the end, which lets the
 * test check that HARP served every NCCL call this program made.
 *
 * usage: client RANK NRANKS IDFILE
 * Rank 0 writes the unique id to IDFILE (atomically); the others wait for it.
 * Prints "PASS rank R calls=N served=M" or "FAIL ..." and exits non-zero.
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
  cudaStream_t stream = 0; /* host buffers: any stream value is accepted */

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
  for (int i = 0; i < N; ++i) fs[i] = (float)(rank + 1) * (float)(i % 7);

  /* allreduce, out of place and in place */
  CHECK(ncclAllReduce(fs, fr, N, ncclFloat, ncclSum, comm, stream));
  float tri = (float)n * (n + 1) / 2;
  for (int i = 0; i < N; ++i) EXPECT(fr[i] == tri * (i % 7), "allreduce[%d] = %g", i, fr[i]);
  CHECK(ncclAllReduce(fs, fs, N, ncclFloat, ncclMax, comm, stream));
  for (int i = 0; i < N; ++i) EXPECT(fs[i] == (float)n * (i % 7), "allreduce max[%d] = %g", i, fs[i]);

  int64_t* is = malloc(N * sizeof(int64_t));
  int64_t* ir = malloc(N * n * sizeof(int64_t));
  for (int i = 0; i < N; ++i) is[i] = rank * 1000 + i;
  /* allgather, out of place */
  CHECK(ncclAllGather(is, ir, N, ncclInt64, comm, stream));
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < N; ++i) EXPECT(ir[r * N + i] == r * 1000 + i, "allgather[%d][%d] = %ld", r, i, (long)ir[r * N + i]);
  /* allgather in place: sendbuff = recvbuff + rank * count */
  for (int i = 0; i < N * n; ++i) ir[i] = -1;
  for (int i = 0; i < N; ++i) ir[rank * N + i] = rank * 7 + i;
  CHECK(ncclAllGather(ir + rank * N, ir, N, ncclInt64, comm, stream));
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < N; ++i) EXPECT(ir[r * N + i] == r * 7 + i, "allgather in place[%d][%d]", r, i);

  /* reduce scatter, in place: recvbuff = sendbuff + rank * recvcount */
  int32_t* rs = malloc(N * n * sizeof(int32_t));
  for (int i = 0; i < N * n; ++i) rs[i] = i + rank;
  CHECK(ncclReduceScatter(rs, rs + rank * N, N, ncclInt32, ncclSum, comm, stream));
  for (int i = 0; i < N; ++i) {
    int g = rank * N + i;
    EXPECT(rs[g] == n * g + n * (n - 1) / 2, "reduce_scatter[%d] = %d", i, rs[g]);
  }

  /* broadcast (out of place) and bcast (in place), root n-1 */
  double* ds = malloc(N * sizeof(double));
  double* dr = malloc(N * sizeof(double));
  for (int i = 0; i < N; ++i) ds[i] = rank == n - 1 ? 0.5 * i : -1.0;
  CHECK(ncclBroadcast(ds, dr, N, ncclDouble, n - 1, comm, stream));
  for (int i = 0; i < N; ++i) EXPECT(dr[i] == 0.5 * i, "broadcast[%d] = %g", i, dr[i]);
  for (int i = 0; i < N; ++i) ds[i] = rank == 0 ? 3.0 + i : 0.0;
  CHECK(ncclBcast(ds, N, ncclDouble, 0, comm, stream));
  for (int i = 0; i < N; ++i) EXPECT(ds[i] == 3.0 + i, "bcast[%d] = %g", i, ds[i]);

  /* reduce prod to root 0 (uint8 wraps) */
  uint8_t us[64], ur[64];
  for (int i = 0; i < 64; ++i) us[i] = (uint8_t)(2 + (i % 3));
  CHECK(ncclReduce(us, ur, 64, ncclUint8, ncclProd, 0, comm, stream));
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
  CHECK(ncclAllReduce(fs, fr, N, ncclFloat, pm, comm, stream));
  for (int i = 0; i < N; ++i) EXPECT(fr[i] == 0.5f * tri, "premulsum[%d] = %g", i, fr[i]);
  CHECK(ncclRedOpDestroy(pm, comm));

  /* alltoall through grouped send/recv, including the send to self */
  int32_t* a2s = malloc(n * 16 * sizeof(int32_t));
  int32_t* a2r = malloc(n * 16 * sizeof(int32_t));
  for (int p = 0; p < n; ++p)
    for (int i = 0; i < 16; ++i) a2s[p * 16 + i] = rank * 10000 + p * 100 + i;
  CHECK(ncclGroupStart());
  for (int p = 0; p < n; ++p) {
    CHECK(ncclSend(a2s + p * 16, 16, ncclInt32, p, comm, stream));
    CHECK(ncclRecv(a2r + p * 16, 16, ncclInt32, p, comm, stream));
  }
  CHECK(ncclGroupEnd());
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
  CHECK(ncclAllReduce(&v, &vs, 1, ncclInt32, ncclSum, sub, stream));
  int want = 0;
  for (int r = rank % 2; r < n; r += 2) want += r;
  EXPECT(vs == want, "split allreduce %d want %d", vs, want);
  CHECK(ncclCommDestroy(sub));

  /* errors come back as codes, with text */
  ncclResult_t bad = CALL(ncclAllReduce(fs, fr, N, (ncclDataType_t)42, ncclSum, comm, stream));
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
  printf("PASS rank %d calls=%ld served=%lld version=%d\n", rank, g_calls, s, version);
  return 0;
}
