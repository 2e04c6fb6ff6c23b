// tests/cpp/test_algorithm_sweep.cc — every registered algorithm of every
// data collective, run by name on the in-process harness (one thread per
// rank, real TCP over loopback) and compared byte for byte with a reference.
//
// Sweep: ranks 1..9 (one TEST per rank count, so a failure names it) x every
// algorithm registered for allreduce, reduce, broadcast, allgather,
// reduce_scatter, alltoall, gather, scatter, barrier, alltoallv,
// allreduce_coalesced, send, recv and p2p_batch (core/algorithms/, read from
// the registry: a new algorithm is swept by its registration line alone, and
// EveryRegisteredAlgorithmIsSwept fails for a collective that has algorithms
// but no place here) x counts {0, 1, p-1, p, large} x every datatype (the
// large count: float32, int64 and bfloat16) x in place and out of place
// (NCCL's in-place layouts, where the collective has one) x the ops sum, max
// and min (prod and avg on the types they are exact in) at count p. Rooted
// collectives use root p-1. The collectives that list their buffers:
// alltoallv sends n + (r + q) % 2 elements from rank r to rank q (uneven,
// packed); allreduce_coalesced reduces three pieces of n/3, n/3 and the rest;
// send/recv run from rank 0 to rank p-1 (p > 1), the named algorithm on the
// side it is registered for; p2p_batch sends to the next rank and receives
// from the previous one in one batch (a ring; p = 1: to itself).
//
// Reference: the inputs are small integers (1..4; 0/1 for bool), so every sum,
// in any order, is exact in every datatype, and the expected output is the
// base/reduce.h kernel folded in rank order; the kernels themselves are
// tested in test_reduce.cc, this file tests the algorithms' data movement.
// When the algorithm's restrictions hold (core/select/select.h
// failedRestriction on this communicator), the test also checks that the
// named algorithm is the one that ran, not its fallback; hierarchical ones
// (two hosts at least) run their flat fallback here and are covered by
// tests/test_hierarchy.py across emulated hosts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "base/reduce.h"
#include "core/engine/communicator.h"
#include "core/observe/recorder.h"
#include "core/select/select.h"

using namespace harp;

namespace {

constexpr size_t kLarge = 70001;  // int64: 560 KB, past the 512K pipeline segment

const CollType kColls[] = {CollType::kAllreduce, CollType::kReduce,  CollType::kBroadcast,
                           CollType::kAllgather, CollType::kReduceScatter, CollType::kAlltoall,
                           CollType::kGather,    CollType::kScatter, CollType::kBarrier,
                           CollType::kAlltoallv, CollType::kAllreduceCoalesced, CollType::kSend,
                           CollType::kRecv,      CollType::kP2pBatch};
// The ones the in-place layouts below do not apply to (out of place only): their buffers are
// listed per rank or per op, or there is one buffer.
bool outOfPlaceOnly(CollType c) {
  return c == CollType::kAlltoallv || c == CollType::kSend || c == CollType::kRecv || c == CollType::kP2pBatch;
}

// Every datatype vocab.def declares (put() below refuses one it cannot encode, so a new datatype
// fails the sweep until it is given an encoding).
const DataType kAllTypes[] = {
#define HARP_DTYPE(name, e, value, size, np, nccl, ncclv, integer, torch) DataType::e,
#include "base/vocab.def"
};
const DataType kLargeTypes[] = {DataType::kFloat32, DataType::kInt64, DataType::kBfloat16};

// Exact encodings of small non-negative integers (v < 2048).
uint16_t halfOf(unsigned v) {
  if (v == 0) return 0;
  int e = 31 - __builtin_clz(v);
  return static_cast<uint16_t>(((e + 15) << 10) | ((v << (10 - e)) & 0x3ff));
}
uint16_t bfloatOf(unsigned v) {
  float f = static_cast<float>(v);
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>(b >> 16);
}

void put(DataType dt, char* p, unsigned v) {
  switch (dt) {
    case DataType::kInt8: *reinterpret_cast<int8_t*>(p) = static_cast<int8_t>(v); break;
    case DataType::kUint8: *reinterpret_cast<uint8_t*>(p) = static_cast<uint8_t>(v); break;
    case DataType::kBool: *reinterpret_cast<uint8_t*>(p) = static_cast<uint8_t>(v & 1); break;
    case DataType::kInt32: *reinterpret_cast<int32_t*>(p) = static_cast<int32_t>(v); break;
    case DataType::kUint32: *reinterpret_cast<uint32_t*>(p) = v; break;
    case DataType::kInt64: *reinterpret_cast<int64_t*>(p) = v; break;
    case DataType::kUint64: *reinterpret_cast<uint64_t*>(p) = v; break;
    case DataType::kFloat16: { uint16_t h = halfOf(v); std::memcpy(p, &h, 2); break; }
    case DataType::kBfloat16: { uint16_t h = bfloatOf(v); std::memcpy(p, &h, 2); break; }
    case DataType::kFloat32: *reinterpret_cast<float*>(p) = static_cast<float>(v); break;
    case DataType::kFloat64: *reinterpret_cast<double*>(p) = v; break;
    default: throw std::logic_error(std::string("the sweep has no encoding for ") + dtypeName(dt));
  }
}

// Rank r's input of n elements (element i of the whole send buffer).
std::vector<char> input(DataType dt, size_t n, int r, unsigned salt) {
  const size_t es = dtypeSize(dt);
  std::vector<char> b(n * es);
  for (size_t i = 0; i < n; ++i) put(dt, b.data() + i * es, 1 + static_cast<unsigned>((r * 3 + i + salt) % 4));
  return b;
}

std::vector<char> fold(const std::vector<std::vector<char>>& ins, DataType dt, ReduceOp op, size_t n, int p) {
  std::vector<char> acc = ins[0];
  const ReduceOp k = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  for (int r = 1; r < p; ++r) reduce(acc.data(), acc.data(), ins[r].data(), n, dt, k);
  if (op == ReduceOp::kAvg) finalizeAvg(acc.data(), n, dt, p);
  return acc;
}

struct Case {
  CollType coll;
  const Algorithm* algo;
  size_t count;
  DataType dt;
  ReduceOp op;
  bool in_place;
};

std::string describe(const Case& c, int p) {
  std::ostringstream s;
  s << collName(c.coll) << " " << (c.algo ? c.algo->name : "-") << " p=" << p << " count=" << c.count << " "
    << dtypeName(c.dt) << " " << opName(c.op) << (c.in_place ? " in place" : " out of place");
  return s.str();
}

// "" when the named algorithm ran, or its restrictions do not hold on this communicator.
std::string checkRan(Communicator& comm, const Case& c, size_t bytes, bool same) {
  if (!c.algo) return "";
  const int p = comm.size();
  SelectQuery q;
  q.coll = c.coll;
  q.count = c.count;
  q.bytes = bytes;
  q.ranks = p;
  q.transport = "tcp";
  q.in_place = same;
  q.op = c.op;
  q.min_local = q.max_local = p;
  q.blocked = true;
  // What ran: the flight recorder's newest record names the algorithm after any fallback.
  const std::vector<obs::OpSnapshot> ops = comm.recorder() ? comm.recorder()->snapshot() : std::vector<obs::OpSnapshot>{};
  const std::string ran = ops.empty() ? "(no record)" : ops.back().algo;
  if (c.count > 0 && p > 1 && failedRestriction(*c.algo, q).empty() && ran != c.algo->name)
    return std::string("ran ") + ran + " though the restrictions of " + c.algo->name + " hold";
  return "";
}

std::string firstDiff(const char* got, const char* want, size_t n, size_t es) {
  if (std::memcmp(got, want, n * es) == 0) return "";
  size_t i = 0;
  while (std::memcmp(got + i * es, want + i * es, es) == 0) ++i;
  return "wrong result from element " + std::to_string(i) + " of " + std::to_string(n);
}

// The collectives whose buffers are listed (per rank, per piece, per op) and send/recv.
std::string runListed(Communicator& comm, const Case& c) {
  const int p = comm.size(), r = comm.rank();
  const size_t n = c.count, es = dtypeSize(c.dt);
  const unsigned salt = static_cast<unsigned>(n);
  CollArgs a;
  a.coll = c.coll;
  a.dtype = c.dt;
  a.op = c.op;
  a.opts.algo = c.algo ? c.algo->name : "";
  switch (c.coll) {
    case CollType::kAlltoallv: {
      // rank r sends n + (r + q) % 2 elements to rank q: what q sends r is as long as what r sends q
      auto len = [&](int x, int y) { return n + static_cast<size_t>((x + y) % 2); };
      size_t total = 0;
      for (int q = 0; q < p; ++q) {
        a.sendcounts.push_back(len(r, q));
        a.sdispls.push_back(total);
        total += len(r, q);
      }
      a.recvcounts = a.sendcounts, a.rdispls = a.sdispls;
      std::vector<char> send = input(c.dt, total, r, salt), recv(total * es, char(0x5a)), want(total * es);
      for (int q = 0; q < p; ++q) {  // block q: rank q's block for r, at q's displacement of it
        size_t off = 0;
        for (int k = 0; k < r; ++k) off += len(q, k);
        std::memcpy(want.data() + a.rdispls[q] * es, input(c.dt, off + len(q, r), q, salt).data() + off * es,
                    len(q, r) * es);
      }
      a.sendbuf = send.data(), a.recvbuf = recv.data();
      comm.run(std::move(a));
      std::string why = firstDiff(recv.data(), want.data(), total, es);
      return why.empty() ? checkRan(comm, c, n * es, false) : why;
    }
    case CollType::kAllreduceCoalesced: {
      std::vector<std::vector<char>> ins(p);
      for (int k = 0; k < p; ++k) ins[k] = input(c.dt, n, k, salt);
      const std::vector<char> want = fold(ins, c.dt, c.op, n, p);
      std::vector<char> send = ins[r], recv(n * es, char(0x5a));
      char* out = c.in_place ? send.data() : recv.data();
      const size_t cut[] = {0, n / 3, 2 * (n / 3), n};
      for (int i = 0; i < 3; ++i)
        a.pieces.push_back({send.data() + cut[i] * es, out + cut[i] * es, cut[i + 1] - cut[i]});
      a.count = n;
      comm.run(std::move(a));
      std::string why = firstDiff(out, want.data(), n, es);
      return why.empty() ? checkRan(comm, c, n * es, c.in_place) : why;
    }
    case CollType::kSend:
    case CollType::kRecv: {
      if (p == 1 || (r != 0 && r != p - 1)) return "";  // rank 0 sends to rank p-1
      const bool sends = r == 0;
      std::vector<char> buf = sends ? input(c.dt, n, 0, salt) : std::vector<char>(n * es, char(0x5a));
      a.coll = sends ? CollType::kSend : CollType::kRecv;
      if (a.coll != c.coll) a.opts.algo.clear();  // the other side runs its default
      a.peer = sends ? p - 1 : 0;
      a.count = n;
      a.tag = 7;
      if (sends) a.sendbuf = buf.data();
      else a.recvbuf = buf.data();
      comm.run(std::move(a));
      if (!sends) {
        std::string why = firstDiff(buf.data(), input(c.dt, n, 0, salt).data(), n, es);
        if (!why.empty()) return why;
      }
      return sends == (c.coll == CollType::kSend) ? checkRan(comm, c, n * es, false) : "";
    }
    case CollType::kP2pBatch: {  // a ring: send to r+1, receive from r-1, in one batch
      std::vector<char> send = input(c.dt, n, r, salt), recv(n * es, char(0x5a));
      a.p2p.push_back({true, (r + 1) % p, send.data(), n});
      a.p2p.push_back({false, (r + p - 1) % p, recv.data(), n});
      a.count = n;
      comm.run(std::move(a));
      std::string why = firstDiff(recv.data(), input(c.dt, n, (r + p - 1) % p, salt).data(), n, es);
      return why.empty() ? checkRan(comm, c, n * es, false) : why;
    }
    default:
      return std::string("no listed runner for ") + collName(c.coll);
  }
}

// Runs one case on rank `r` and returns "" or what was wrong.
std::string runCase(Communicator& comm, const Case& c) {
  if (collVcounts(c.coll) || c.coll == CollType::kAllreduceCoalesced || c.coll == CollType::kSend ||
      c.coll == CollType::kRecv || c.coll == CollType::kP2pBatch)
    return runListed(comm, c);
  const int p = comm.size(), r = comm.rank(), root = p - 1;
  const size_t n = c.count, es = dtypeSize(c.dt), all = n * static_cast<size_t>(p);
  const unsigned salt = static_cast<unsigned>(n);
  // Every rank's input, so each rank can compute the reference locally.
  const size_t in_n = (c.coll == CollType::kReduceScatter || c.coll == CollType::kAlltoall ||
                       c.coll == CollType::kScatter) ? all : n;
  std::vector<std::vector<char>> ins(p);
  for (int k = 0; k < p; ++k) ins[k] = input(c.dt, in_n, k, salt);

  const size_t out_n = (c.coll == CollType::kAllgather || c.coll == CollType::kAlltoall ||
                        c.coll == CollType::kGather) ? all : (c.coll == CollType::kBarrier ? 0 : n);
  std::vector<char> expect(out_n * es);
  bool check = true;
  switch (c.coll) {
    case CollType::kAllreduce: expect = fold(ins, c.dt, c.op, n, p); break;
    case CollType::kReduce: check = r == root; if (check) expect = fold(ins, c.dt, c.op, n, p); break;
    case CollType::kBroadcast: expect = ins[root]; break;
    case CollType::kAllgather:
    case CollType::kGather:
      check = c.coll == CollType::kAllgather || r == root;
      for (int k = 0; k < p; ++k) std::memcpy(expect.data() + k * n * es, ins[k].data(), n * es);
      break;
    case CollType::kReduceScatter: {
      std::vector<char> f = fold(ins, c.dt, c.op, all, p);
      std::memcpy(expect.data(), f.data() + r * n * es, n * es);
      break;
    }
    case CollType::kAlltoall:
      for (int k = 0; k < p; ++k) std::memcpy(expect.data() + k * n * es, ins[k].data() + r * n * es, n * es);
      break;
    case CollType::kScatter: std::memcpy(expect.data(), ins[root].data() + r * n * es, n * es); break;
    case CollType::kBarrier: check = false; break;
    default: return std::string("no reference for ") + collName(c.coll);  // a collective new to kColls
  }

  // Buffers, in NCCL's in-place layouts.
  std::vector<char> sendv = ins[r], recvv;
  CollArgs a;
  a.coll = c.coll;
  a.count = n;
  a.dtype = c.dt;
  a.op = c.op;
  a.root = root;
  a.opts.algo = c.algo ? c.algo->name : "";
  const char* got = nullptr;
  switch (c.coll) {
    case CollType::kBarrier: break;
    case CollType::kBroadcast:  // one buffer: the root's data, the others' filled with junk
      if (r != root) std::fill(sendv.begin(), sendv.end(), char(0x5a));
      a.sendbuf = a.recvbuf = sendv.data();
      got = sendv.data();
      break;
    case CollType::kAllgather:
    case CollType::kGather:
      recvv.assign(all * es, char(0x5a));
      if (c.in_place) {  // send = this rank's block of the receive buffer
        std::memcpy(recvv.data() + r * n * es, sendv.data(), n * es);
        a.sendbuf = recvv.data() + r * n * es;
      } else {
        a.sendbuf = sendv.data();
      }
      a.recvbuf = recvv.data();
      got = recvv.data();
      break;
    case CollType::kReduceScatter:
    case CollType::kScatter:
      if (c.in_place && (c.coll == CollType::kReduceScatter || r == root)) {  // receive = block r of the send buffer
        a.sendbuf = sendv.data();
        a.recvbuf = sendv.data() + r * n * es;
        got = sendv.data() + r * n * es;
      } else {
        recvv.assign(n * es, char(0x5a));
        a.sendbuf = sendv.data();
        a.recvbuf = recvv.data();
        got = recvv.data();
      }
      break;
    default:  // allreduce, reduce, alltoall: the same buffer in place
      if (c.in_place) {
        a.sendbuf = a.recvbuf = sendv.data();
        got = sendv.data();
      } else {
        recvv.assign(sendv.size(), char(0x5a));
        a.sendbuf = sendv.data();
        a.recvbuf = recvv.data();
        got = recvv.data();
      }
  }
  const bool same = a.sendbuf && a.sendbuf == a.recvbuf;  // what the selector sees as in place
  comm.run(std::move(a));
  if (check && out_n) {
    std::string why = firstDiff(got, expect.data(), out_n, es);
    if (!why.empty()) return why;
  }
  return checkRan(comm, c, n * es, same);
}

std::vector<Case> plan(int p) {
  std::vector<Case> out;
  const size_t pp = static_cast<size_t>(p);
  for (CollType coll : kColls) {
    std::vector<const Algorithm*> algos = algorithmsOf(coll);
    if (algos.empty()) algos.push_back(nullptr);
    for (const Algorithm* algo : algos) {
      if (coll == CollType::kBarrier) {
        out.push_back({coll, algo, 0, DataType::kUint8, ReduceOp::kSum, false});
        continue;
      }
      const bool reduces = collReduces(coll);
      std::vector<size_t> counts{0, 1, pp - 1, pp, kLarge};
      std::sort(counts.begin(), counts.end());
      counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
      for (size_t n : counts) {
        const bool large = n == kLarge;
        for (DataType dt : large ? std::vector<DataType>(std::begin(kLargeTypes), std::end(kLargeTypes))
                                 : std::vector<DataType>(std::begin(kAllTypes), std::end(kAllTypes))) {
          for (bool in_place : {false, true}) {
            if (coll == CollType::kBroadcast && in_place) continue;  // one buffer either way
            if (outOfPlaceOnly(coll) && in_place) continue;
            std::vector<ReduceOp> ops{ReduceOp::kSum};
            if (reduces && n == pp && !in_place) {
              ops.push_back(ReduceOp::kMax);
              ops.push_back(ReduceOp::kMin);
              if (dt == DataType::kFloat64 || dt == DataType::kInt64) ops.push_back(ReduceOp::kProd);
              if (dt == DataType::kFloat32 || dt == DataType::kFloat64) ops.push_back(ReduceOp::kAvg);
            }
            for (ReduceOp op : ops) out.push_back({coll, algo, n, dt, op, in_place});
          }
        }
      }
    }
  }
  return out;
}

void sweep(int p) {
  // A short flight record: each case reads its newest entry (snapshot copies the ring).
  const char* was = std::getenv("HARP_FR_ENTRIES");
  const std::string saved = was ? was : "";
  setenv("HARP_FR_ENTRIES", "8", 1);
  struct Restore {
    bool had;
    std::string v;
    ~Restore() { had ? setenv("HARP_FR_ENTRIES", v.c_str(), 1) : unsetenv("HARP_FR_ENTRIES"); }
  } restore{was != nullptr, saved};
  UniqueId id = createUniqueId("127.0.0.1:0");
  const std::vector<Case> cases = plan(p);
  std::vector<std::string> errors(p);
  std::vector<std::thread> ts;
  for (int r = 0; r < p; ++r)
    ts.emplace_back([&, r] {
      try {
        CommOptions o;
        o.timeout_s = 60;
        o.transport = p > 1 ? "tcp" : "";
        auto comm = Communicator::create(id, r, p, o);
        for (const Case& c : cases) {
          std::string why;
          try {
            why = runCase(*comm, c);
          } catch (const std::exception& e) {
            why = std::string("raised: ") + e.what();
          }
          if (!why.empty()) {
            errors[r] = describe(c, p) + ": " + why;
            comm->abort("sweep failed on rank " + std::to_string(r));  // the others raise instead of waiting
            break;
          }
        }
        comm->destroy();
      } catch (const std::exception& e) {
        if (errors[r].empty()) errors[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  // The first rank that found a problem names it; the others may only have seen the abort.
  for (int r = 0; r < p; ++r)
    if (!errors[r].empty() && errors[r].find("sweep failed on rank") == std::string::npos) {
      ADD_FAILURE() << "rank " << r << ": " << errors[r];
      return;
    }
  for (int r = 0; r < p; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  EXPECT_GT(cases.size(), 100u);
}

}  // namespace

// Every collective with a registered algorithm has a place in the sweep (kColls and a runner): a
// collective whose first algorithm is registered without one fails here, naming it.
TEST(AlgorithmSweep, EveryRegisteredAlgorithmIsSwept) {
  for (int i = 0; i < kNumCollTypes; ++i) {
    const auto coll = static_cast<CollType>(i);
    if (algorithmsOf(coll).empty()) continue;
    EXPECT_NE(std::find(std::begin(kColls), std::end(kColls), coll), std::end(kColls))
        << collName(coll) << " has algorithms (" << algorithmList(coll) << ") the sweep does not run";
  }
}

TEST(AlgorithmSweep, Ranks1) { sweep(1); }
TEST(AlgorithmSweep, Ranks2) { sweep(2); }
TEST(AlgorithmSweep, Ranks3) { sweep(3); }
TEST(AlgorithmSweep, Ranks4) { sweep(4); }
TEST(AlgorithmSweep, Ranks5) { sweep(5); }
TEST(AlgorithmSweep, Ranks6) { sweep(6); }
TEST(AlgorithmSweep, Ranks7) { sweep(7); }
TEST(AlgorithmSweep, Ranks8) { sweep(8); }
TEST(AlgorithmSweep, Ranks9) { sweep(9); }
