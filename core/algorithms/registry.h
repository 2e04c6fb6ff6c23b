// core/algorithms/registry.h — every collective algorithm HARP has, by name.
//
// One file per algorithm, named <collective>_<algorithm>.cc; each opens with
// the algorithm's steps, restrictions and alpha-beta-gamma cost (alpha: per
// message latency, beta: per byte transfer time, gamma: per byte reduction
// time; n bytes, p ranks). The tuning table (core/tuning.tsv) picks among
// them; docs/algorithms.md summarizes them.
//
// An algorithm is a function of a Context (core/context.h): it reads its
// arguments from ctx.args() and moves bytes with ctx.isend/irecv/wait. It must
// work for every rank count >= 1 and every count >= 0, in-place and not.
#pragma once

#include <string>

#include "core/context.h"

namespace harp {

using AlgorithmFn = void (*)(Context&);
struct Algorithm {
  CollType coll;
  const char* name;
  AlgorithmFn fn;
  unsigned index;  // position among its collective's algorithms (in the tag and descriptor check)
};

const Algorithm* findAlgorithm(CollType c, const std::string& name);
std::string algorithmList(CollType c);  // "ring, halving_doubling, ..."

// The algorithms (one file each).
void allreduceRing(Context&);
void allreduceHalvingDoubling(Context&);
void allreduceRecursiveDoubling(Context&);
void allreduceShm(Context&);  // shm transport only (allreduce_shm.cc)
void broadcastBinomial(Context&);
void broadcastPipeline(Context&);
void reduceBinomial(Context&);
void reducePipeline(Context&);
void allgatherRing(Context&);
void allgatherDirect(Context&);
void reduceScatterRing(Context&);
void alltoallPairwise(Context&);
void alltoallvPairwise(Context&);
void gatherLinear(Context&);
void scatterLinear(Context&);
void barrierDissemination(Context&);
void sendDirect(Context&);
void recvDirect(Context&);
void p2pBatch(Context&);

// Helpers shared by algorithms.
// Copy n bytes unless src == dst.
void copyBytes(void* dst, const void* src, size_t n);
// Allgather input `in` (blk bytes) lies inside the output `out` (p blocks)
// somewhere other than block r, NCCL's in-place position: the algorithm
// must move it out of the way before receiving over it.
bool aliasesOtherBlock(const char* in, const char* out, int r, int p, size_t blk);
// Largest power of two <= n.
int floorPow2(int n);

}  // namespace harp
