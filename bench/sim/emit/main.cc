// bench/sim/emit/main.cc — harp_sched: the schedule HARP's own collective
// code issues for p ranks, one rank at a time, written as a Schedule file
// (schedule.h) for the SimGrid replayers (bench/sim/replay/harp_replay.cc,
// bench/sim/replay.py); or, with --pick, what HARP's selector picks.
//
//   harp_sched [--coll allreduce] --algo ring --p 1024 --bytes 268435456 [--hosts 128]
//              [--dtype float32] [--segment 524288] [--compress fp16|bf16]
//              [--leaders ALGO] [--intra-reduce ALGO] [--intra-broadcast ALGO]
//              [--calibration FILE] [--tuning FILE] [--max-msgs N]
//              [--out FILE]   (default: stdout)   [--totals] [--pick]
//
// --coll: allreduce (in place, as DDP's buckets), allgather, reduce_scatter,
// alltoall (out of place). --bytes is the tuning table's unit: count x
// element size, count as the collective takes it (allgather: each rank's
// block; reduce_scatter: each rank's result block; alltoall: each pair's
// block). --algo names a registered algorithm of the collective, or "auto"
// for the selector's pick; --compress runs the compressed ring
// (core/algorithms/compressed/compress_ring.cc) instead. A hierarchical
// algorithm's legs run what the selector picks for each sub-communicator
// (frames.h), unless --leaders / --intra-* name one. The selector is HARP's
// own (core/select/select.cc, linked): the built-in tuning table or
// --tuning, the built-in calibration with --calibration's lines over it
// (HARP_CALIBRATION_FILE's format), the host map of --hosts blocks of p /
// hosts ranks, transport "mixed" where both shm and tcp peers exist.
// --pick prints "pick NAME SOURCE" and one "candidate NAME SECONDS [why it
// cannot run]" line per registered algorithm (the model's predictions)
// instead of a schedule. Buffers are reserved address space that is never
// touched (trace_memory.cc). --max-msgs N: more than N messages in all is
// an error (exit 3) before the schedule is written. --totals prints "rank
// sent received" per rank instead of the schedule (tests).

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
#include "core/select/select.h"

using namespace harp;

namespace {
struct Options {
  std::string coll = "allreduce", algo, dtype = "float32", compress, out, calibration, tuning;
  int p = 0, hosts = 1;
  uint64_t bytes = 0, max_msgs = 0;
  bool totals = false, pick = false;
  sim::LegPolicy legs;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "harp_sched: %s\nusage: harp_sched [--coll C] --algo NAME|auto --p P --bytes B [--hosts H] "
                       "[--dtype T] [--segment B] [--compress fp16|bf16] [--leaders A] [--intra-reduce A] "
                       "[--intra-broadcast A] [--calibration F] [--tuning F] [--max-msgs N] [--out FILE] "
                       "[--totals] [--pick]\n", why.c_str());
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
    if (f == "--pick") { o.pick = true; continue; }
    if (i + 1 >= argc) usage(f + " needs a value");
    const char* v = argv[++i];
    if (f == "--algo") o.algo = v;
    else if (f == "--coll") o.coll = v;
    else if (f == "--calibration") o.calibration = v;
    else if (f == "--tuning") o.tuning = v;
    else if (f == "--max-msgs") o.max_msgs = number("--max-msgs", v);
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
  if (o.algo.empty() && o.compress.empty() && !o.pick) usage("--algo or --compress is required");
  if (o.coll != "allreduce" && o.coll != "allgather" && o.coll != "reduce_scatter" && o.coll != "alltoall")
    usage("--coll must be allreduce, allgather, reduce_scatter or alltoall (got '" + o.coll + "')");
  if (!o.compress.empty() && o.coll != "allreduce") usage("--compress is for allreduce only");
  if (o.hosts < 1 || o.p % o.hosts) usage("--hosts must divide --p");
  if (o.legs.segment_bytes < 4096) usage("--segment must be at least 4096 (HARP_SEGMENT_BYTES)");
  return o;
}

std::string readFile(const std::string& path, const char* flag) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (!f) usage(std::string(flag) + " " + path + ": " + std::strerror(errno));
  std::string text;
  char b[4096];
  for (size_t n; (n = std::fread(b, 1, sizeof b, f)) > 0;) text.append(b, n);
  std::fclose(f);
  return text;
}

// The query a communicator of p ranks on `hosts` equal blocks would make.
SelectQuery queryOf(const Options& o, const CollArgs& a) {
  SelectQuery q;
  q.coll = a.coll;
  q.count = a.count;
  q.bytes = a.count * dtypeSize(a.dtype);
  q.ranks = o.p;
  const int local = o.p / o.hosts;
  q.transport = o.hosts == 1 ? "shm" : local == 1 ? "tcp" : "mixed";
  q.in_place = a.sendbuf && a.sendbuf == a.recvbuf;
  q.op = a.op;
  q.hosts = o.hosts;
  q.min_local = q.max_local = local;
  q.blocked = true;
  return q;
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
  if (o.algo == "auto") return selectAlgorithm(queryOf(o, a), *o.legs.table, *o.legs.cal, false).pick;
  const Algorithm* algo = findAlgorithm(a.coll, o.algo);
  if (!algo) usage("no " + o.coll + " '" + o.algo + "' in harp_sched (have: " + algorithmList(a.coll) + ")");
  return algo;
}
}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  try {
    Calibration cal = Calibration::builtin();
    if (!o.calibration.empty()) cal.parse(readFile(o.calibration, "--calibration"), o.calibration);
    TuningTable table;
    table.rows = o.tuning.empty() ? TuningTable::fromEnvironment().rows
                                  : parseTuning(readFile(o.tuning, "--tuning"), o.tuning);
    o.legs.cal = &cal;
    o.legs.table = &table;
    CollArgs a;
    a.coll = parseColl(o.coll);
    a.dtype = parseDtype(o.dtype);
    a.op = ReduceOp::kSum;
    const size_t es = dtypeSize(a.dtype);
    if (o.bytes % es) usage("--bytes must be a multiple of the element size");
    a.count = o.bytes / es;
    // Buffers: reserved, never touched (trace_memory.cc). allreduce in place.
    const uint64_t p = static_cast<uint64_t>(o.p);
    const uint64_t in_bytes = a.coll == CollType::kAllreduce || a.coll == CollType::kAllgather ? o.bytes : p * o.bytes;
    const uint64_t out_bytes = a.coll == CollType::kReduceScatter || a.coll == CollType::kAllreduce ? o.bytes : p * o.bytes;
    void* out = sim::reserveRegion(out_bytes);
    a.recvbuf = out;
    a.sendbuf = a.coll == CollType::kAllreduce ? out : sim::reserveRegion(in_bytes);
    a.opts.timeout_s = 60;
    sim::setLayout(o.p, o.hosts, o.legs);
    if (o.pick) {
      const SelectQuery q = queryOf(o, a);
      const Selection sel = selectAlgorithm(q, table, cal, true);
      std::printf("pick %s %s %s\n", sel.pick->name, pickSourceName(sel.source), sel.reason().c_str());
      for (const Candidate& c : sel.candidates)
        std::printf("candidate %s %.6g %s\n", c.algo->name, c.seconds, c.failed.c_str());
      return 0;
    }
    CompressEngine engine(0, false);
    const Algorithm* algo = pick(o, a, engine);
    sim::Schedule sched(o.p);
    sched.setLimit(o.max_msgs);
    sim::setCurrent(&sched);
    std::vector<int> all(o.p);
    for (int r = 0; r < o.p; ++r) all[r] = r;
    sim::setRecording(true);
    for (int r = 0; r < o.p; ++r) {
      sched.begin(r);
      CommResources res;
      res.segment_bytes = o.legs.segment_bytes;
      sim::setNextFrame({all, 0});
      Context ctx(res, r, o.p, a, 0, a.opts.timeout_s);
      algo->fn(ctx);
    }
    sim::setRecording(false);
    std::FILE* f = o.out.empty() ? stdout : std::fopen(o.out.c_str(), "w");
    if (!f) throw std::runtime_error("cannot write " + o.out + ": " + std::strerror(errno));
    if (o.totals) {
      for (int r = 0; r < o.p; ++r)
        std::fprintf(f, "%d %llu %llu\n", r, static_cast<unsigned long long>(sched.sent(r)),
                     static_cast<unsigned long long>(sched.received(r)));
    } else {
      char head[512];
      const std::string name = o.compress.empty() ? algo->name : "ring_" + o.compress;
      std::snprintf(head, sizeof head, "coll=%s algo=%s p=%d hosts=%d bytes=%llu dtype=%s segment=%zu", o.coll.c_str(),
                    name.c_str(), o.p, o.hosts, static_cast<unsigned long long>(o.bytes), o.dtype.c_str(),
                    o.legs.segment_bytes);
      sched.write(f, head);
    }
    if (f != stdout && std::fclose(f) != 0) throw std::runtime_error("cannot finish " + o.out);
  } catch (const sim::Schedule::TooMany& e) {
    std::fprintf(stderr, "harp_sched: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "harp_sched: %s\n", e.what());
    return 1;
  }
  return 0;
}
