// bench/sim/emit/main.cc — harp_sched: the schedule HARP's own allreduce code
// issues for p ranks, one rank at a time, written as a Schedule file
// (schedule.h) for the SimGrid replayer (bench/sim/replay.py).
//
//   harp_sched --algo ring --p 1024 --bytes 268435456 [--hosts 128]
//              [--dtype float32] [--segment 524288] [--compress fp16|bf16]
//              [--leaders ALGO] [--intra-reduce ALGO] [--intra-broadcast ALGO]
//              [--out FILE]   (default: stdout)   [--totals]
//
// --algo names a registered allreduce (ring, recursive_doubling,
// halving_doubling, tree, leader); --compress runs the compressed ring
// (core/algorithms/compressed/compress_ring.cc) instead. The call is in place
// (sendbuf == recvbuf: no input copy, as DDP's buckets); buffers are
// reserved address space that is never touched. --totals prints
// "rank sent received" per rank instead of the schedule (tests).
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "bench/sim/emit/frames.h"
#include "bench/sim/emit/schedule.h"
#include "core/algorithms/registry.h"
#include "core/compress/compress.h"
#include "core/engine/resources.h"

using namespace harp;

namespace {
struct Options {
  std::string algo, dtype = "float32", compress, out;
  int p = 0, hosts = 1;
  uint64_t bytes = 0;
  bool totals = false;
  sim::LegPolicy legs;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "harp_sched: %s\nusage: harp_sched --algo NAME --p P --bytes B [--hosts H] [--dtype T] "
                       "[--segment B] [--compress fp16|bf16] [--leaders A] [--intra-reduce A] "
                       "[--intra-broadcast A] [--out FILE] [--totals]\n", why.c_str());
  std::exit(2);
}

uint64_t number(const char* flag, const char* v) {
  char* end = nullptr;
  unsigned long long x = std::strtoull(v, &end, 10);
  if (!*v || *end) usage(std::string(flag) + " wants a number, got '" + v + "'");
  return x;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    if (f == "--totals") { o.totals = true; continue; }
    if (i + 1 >= argc) usage(f + " needs a value");
    const char* v = argv[++i];
    if (f == "--algo") o.algo = v;
    else if (f == "--p") o.p = static_cast<int>(number("--p", v));
    else if (f == "--bytes") o.bytes = number("--bytes", v);
    else if (f == "--hosts") o.hosts = static_cast<int>(number("--hosts", v));
    else if (f == "--dtype") o.dtype = v;
    else if (f == "--segment") o.legs.segment_bytes = number("--segment", v);
    else if (f == "--compress") o.compress = v;
    else if (f == "--leaders") o.legs.leaders_allreduce = v;
    else if (f == "--intra-reduce") o.legs.intra_reduce = v;
    else if (f == "--intra-broadcast") o.legs.intra_broadcast = v;
    else if (f == "--out") o.out = v;
    else usage("unknown option " + f);
  }
  if (o.p < 1 || o.p > 65536) usage("--p must be 1..65536");
  if (o.algo.empty() && o.compress.empty()) usage("--algo or --compress is required");
  if (o.legs.segment_bytes < 4096) usage("--segment must be at least 4096 (HARP_SEGMENT_BYTES)");
  return o;
}

const Algorithm* pick(const Options& o, CollArgs& a, CompressEngine& engine) {
  if (!o.compress.empty()) {
    a.compress = parseCompressSpec(o.compress, "--compress");
    if (a.compress.kind != CompressKind::kFp16 && a.compress.kind != CompressKind::kBf16)
      usage("--compress: only fp16 and bf16 are traced (top-k's messages depend on the data)");
    if (a.dtype != DataType::kFloat32) usage("--compress needs --dtype float32");
    a.compress.engine = &engine;
    return CompressEngine::algorithm(a.compress.kind);
  }
  const Algorithm* algo = findAlgorithm(CollType::kAllreduce, o.algo);
  if (!algo) usage("no allreduce '" + o.algo + "' in harp_sched (have: " + algorithmList(CollType::kAllreduce) + ")");
  return algo;
}
}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    CollArgs a;
    a.coll = CollType::kAllreduce;
    a.dtype = parseDtype(o.dtype);
    a.op = ReduceOp::kSum;
    const size_t es = dtypeSize(a.dtype);
    if (o.bytes % es) usage("--bytes must be a multiple of the element size");
    a.count = o.bytes / es;
    CompressEngine engine(0, false);
    const Algorithm* algo = pick(o, a, engine);
    void* buf = mmap(nullptr, std::max<uint64_t>(o.bytes, 1), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (buf == MAP_FAILED) throw std::runtime_error("cannot reserve " + std::to_string(o.bytes) + " bytes");
    a.sendbuf = a.recvbuf = buf;
    a.opts.timeout_s = 60;
    sim::setLayout(o.p, o.hosts, o.legs);
    sim::Schedule sched(o.p);
    sim::setCurrent(&sched);
    std::vector<int> all(o.p);
    for (int r = 0; r < o.p; ++r) all[r] = r;
    for (int r = 0; r < o.p; ++r) {
      sched.begin(r);
      CommResources res;
      res.segment_bytes = o.legs.segment_bytes;
      sim::setNextFrame({all, 0});
      Context ctx(res, r, o.p, a, 0, a.opts.timeout_s);
      algo->fn(ctx);
    }
    std::FILE* f = o.out.empty() ? stdout : std::fopen(o.out.c_str(), "w");
    if (!f) throw std::runtime_error("cannot write " + o.out + ": " + std::strerror(errno));
    if (o.totals) {
      for (int r = 0; r < o.p; ++r)
        std::fprintf(f, "%d %llu %llu\n", r, static_cast<unsigned long long>(sched.sent(r)),
                     static_cast<unsigned long long>(sched.received(r)));
    } else {
      char head[512];
      std::snprintf(head, sizeof head, "coll=allreduce algo=%s p=%d hosts=%d bytes=%llu dtype=%s segment=%zu",
                    o.compress.empty() ? o.algo.c_str() : ("ring_" + o.compress).c_str(), o.p, o.hosts,
                    static_cast<unsigned long long>(o.bytes), o.dtype.c_str(), o.legs.segment_bytes);
      sched.write(f, head);
    }
    if (f != stdout && std::fclose(f) != 0) throw std::runtime_error("cannot finish " + o.out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "harp_sched: %s\n", e.what());
    return 1;
  }
  return 0;
}
