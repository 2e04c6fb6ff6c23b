/* An unmodified NCCL program (host buffers) run on HARP through LD_PRELOAD.
 *
 *   cc examples/nccl_allreduce.c -I$(harp-config --nccl-include) -o nccl_allreduce \
 *      -L$(harp-config --libdir) -l:libharp-nccl.so -Wl,-rpath,$(harp-config --libdir)
 *   harp-run -n 2 ./nccl_allreduce                       # links HARP directly, or:
 *   LD_PRELOAD=$(harp-config --nccl-lib) harp-run -n 2 ./prog_linked_against_libnccl
 *
 * Rank r contributes r+1 in every element; every rank checks the sum. Where an
 * NCCL program would call ncclGetUniqueId on rank 0 and MPI_Bcast the id, this one
 * decodes the id harp-run made (HARP_UNIQUE_ID, the hex of the 128-byte
 * ncclUniqueId) and takes HARP_RANK / HARP_WORLD_SIZE.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl.h"

int main(void) {
  const char* r = getenv("HARP_RANK");
  const char* n = getenv("HARP_WORLD_SIZE");
  const char* hex = getenv("HARP_UNIQUE_ID");
  if (!r || !n || !hex || strlen(hex) != 2 * sizeof(ncclUniqueId)) {
    fprintf(stderr, "run me under harp-run (HARP_RANK, HARP_WORLD_SIZE, HARP_UNIQUE_ID)\n");
    return 2;
  }
  int rank = atoi(r), size = atoi(n);
  ncclUniqueId id;
  for (size_t i = 0; i < sizeof id.internal; i++) {
    unsigned byte;
    if (sscanf(hex + 2 * i, "%2x", &byte) != 1) return 2;
    id.internal[i] = (char)byte;
  }
  ncclComm_t comm;
  if (ncclCommInitRank(&comm, size, id, rank) != ncclSuccess) return 1;
  enum { N = 1024 };
  static float buf[N];
  for (int i = 0; i < N; i++) buf[i] = (float)(rank + 1);
  if (ncclAllReduce(buf, buf, N, ncclFloat, ncclSum, comm, NULL) != ncclSuccess) return 1;
  float expect = size * (size + 1) / 2.0f;
  for (int i = 0; i < N; i++)
    if (buf[i] != expect) {
      fprintf(stderr, "rank %d: buf[%d] = %g, expected %g\n", rank, i, buf[i], expect);
      return 1;
    }
  if (rank == 0) printf("nccl allreduce on HARP: %d ranks, sum %g everywhere\n", size, expect);
  ncclCommDestroy(comm);
  return 0;
}
