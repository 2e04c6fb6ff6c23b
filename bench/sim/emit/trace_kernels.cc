// bench/sim/emit/trace_kernels.cc — the local work of HARP's algorithms,
// recorded instead of done: harp_sched links these in place of base/reduce.cc
// and core/compress/compress_kernels.cc, so a reduction or a conversion is an
// X line of the Schedule (schedule.h) and touches no memory (a 1024-rank
// emission of a 256 MB allreduce needs no 256 GB of arithmetic).
// Bytes recorded: the elements' size on the wide side (reduce: n x element
// size; narrow, widen, addwide: n x 4, the float32 side).
#include "base/reduce.h"
#include "bench/sim/emit/schedule.h"
#include "core/compress/compress.h"

namespace harp {

void reduce(void*, const void*, const void*, size_t n, DataType dt, ReduceOp) {
  sim::current().work("reduce", n * dtypeSize(dt));
}

namespace {
void narrowRec(uint16_t*, const float*, size_t n) { sim::current().work("narrow", 4 * n); }
void widenRec(float*, const uint16_t*, size_t n) { sim::current().work("widen", 4 * n); }
void addRec(float*, const float*, const uint16_t*, size_t n) { sim::current().work("addwide", 4 * n); }
}  // namespace

const NarrowKernels& narrowKernels(CompressKind, const std::string&) {
  static const NarrowKernels k{narrowRec, widenRec, addRec, "trace"};
  return k;
}

}  // namespace harp
