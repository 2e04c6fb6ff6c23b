#include "core/algorithms/registry.h"

#include <cstring>

namespace harp {
namespace {
// The registration table: one line per algorithm.
const Algorithm kAlgorithms[] = {
    {CollType::kAllreduce, "ring", allreduceRing},
    {CollType::kAllreduce, "halving_doubling", allreduceHalvingDoubling},
    {CollType::kAllreduce, "recursive_doubling", allreduceRecursiveDoubling},
    {CollType::kAllreduce, "shm", allreduceShm},
    {CollType::kBroadcast, "binomial", broadcastBinomial},
    {CollType::kBroadcast, "pipeline", broadcastPipeline},
    {CollType::kReduce, "binomial", reduceBinomial},
    {CollType::kReduce, "pipeline", reducePipeline},
    {CollType::kAllgather, "ring", allgatherRing},
    {CollType::kAllgather, "direct", allgatherDirect},
    {CollType::kReduceScatter, "ring", reduceScatterRing},
    {CollType::kAlltoall, "pairwise", alltoallPairwise},
    {CollType::kAlltoallv, "pairwise", alltoallvPairwise},
    {CollType::kGather, "linear", gatherLinear},
    {CollType::kScatter, "linear", scatterLinear},
    {CollType::kBarrier, "dissemination", barrierDissemination},
    {CollType::kSend, "direct", sendDirect},
    {CollType::kRecv, "direct", recvDirect},
    {CollType::kP2pBatch, "batch", p2pBatch},
};
}  // namespace

const Algorithm* findAlgorithm(CollType c, const std::string& name) {
  for (const auto& a : kAlgorithms)
    if (a.coll == c && name == a.name) return &a;
  return nullptr;
}

std::string algorithmList(CollType c) {
  std::string out;
  for (const auto& a : kAlgorithms)
    if (a.coll == c) out += (out.empty() ? "" : ", ") + std::string(a.name);
  return out;
}

void copyBytes(void* dst, const void* src, size_t n) {
  if (n && dst != src) std::memmove(dst, src, n);
}

bool aliasesOtherBlock(const char* in, const char* out, int r, int p, size_t blk) {
  return in != out + r * blk && in < out + p * blk && out < in + blk;
}

int floorPow2(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

}  // namespace harp
