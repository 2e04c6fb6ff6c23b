#include "core/algorithms/registry.h"

#include <cstring>

namespace harp {
namespace {
// The registration table: one line per algorithm.
const Algorithm kAlgorithms[] = {
    {CollType::kAllreduce, "ring", allreduceRing, 0},
    {CollType::kAllreduce, "halving_doubling", allreduceHalvingDoubling, 1},
    {CollType::kAllreduce, "recursive_doubling", allreduceRecursiveDoubling, 2},
    {CollType::kAllreduce, "shm", allreduceShm, 3},
    {CollType::kBroadcast, "binomial", broadcastBinomial, 0},
    {CollType::kBroadcast, "pipeline", broadcastPipeline, 1},
    {CollType::kReduce, "binomial", reduceBinomial, 0},
    {CollType::kReduce, "pipeline", reducePipeline, 1},
    {CollType::kAllgather, "ring", allgatherRing, 0},
    {CollType::kAllgather, "direct", allgatherDirect, 1},
    {CollType::kReduceScatter, "ring", reduceScatterRing, 0},
    {CollType::kAlltoall, "pairwise", alltoallPairwise, 0},
    {CollType::kAlltoallv, "pairwise", alltoallvPairwise, 0},
    {CollType::kGather, "linear", gatherLinear, 0},
    {CollType::kScatter, "linear", scatterLinear, 0},
    {CollType::kBarrier, "dissemination", barrierDissemination, 0},
    {CollType::kSend, "direct", sendDirect, 0},
    {CollType::kRecv, "direct", recvDirect, 0},
    {CollType::kP2pBatch, "batch", p2pBatch, 0},
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
