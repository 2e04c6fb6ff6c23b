// tests/cpp/test_shm_transport.cc — the shm transport between real forked
// processes: rings (wrap-around, FIFO order, every size class), single-copy
// CMA and the ring fallback, tag/length mismatch, abort notices, peer death
// (kill -9) and the no-leak guarantee for /dev/shm.
//
// Each test forks N children; a child builds a ShmTransport, publishes its
// address in a temp directory, reads everyone else's, connects and runs the
// scenario. A child reports failure with its exit status and a line on stderr.
// Single-threaded per process.
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "transport/shm/shm_transport.h"

using namespace harp::transport;
using harp::transport::shm::ShmTransport;

namespace {

#define CHECK(cond, ...)                                                  \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "[rank %d] CHECK failed at line %d: %s: ", g_rank, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                       \
      fprintf(stderr, "\n");                                              \
      _exit(1);                                                           \
    }                                                                     \
  } while (0)

int g_rank = -1;

std::string g_dir;

std::set<std::string> devShmFiles() {
  std::set<std::string> s;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) s.insert(e->d_name);
    closedir(d);
  }
  return s;
}

// Build and connect a transport for `rank` of `n` (every rank on one host).
std::unique_ptr<ShmTransport> connectRank(int rank, int n, const std::string& dir) {
  CommInfo ci;
  ci.rank = rank;
  ci.size = n;
  ci.comm_id = 0x1234abcdULL;
  ci.token = "0123456789abcdef";
  ci.timeout_s = 20;
  std::vector<PeerInfo> peers(n);
  for (int r = 0; r < n; ++r) {
    peers[r].rank = r;
    peers[r].host_id = "test-host";
    peers[r].hostname = "localhost";
  }
  auto t = std::make_unique<ShmTransport>(ci, peers);
  std::string me = t->localAddress(0);
  {
    std::ofstream f(dir + "/tmp." + std::to_string(rank));
    f << me;
  }
  rename((dir + "/tmp." + std::to_string(rank)).c_str(), (dir + "/addr." + std::to_string(rank)).c_str());
  std::vector<int> others;
  std::vector<std::string> remote;
  for (int r = 0; r < n; ++r) {
    if (r == rank) continue;
    std::string path = dir + "/addr." + std::to_string(r), blob;
    for (int i = 0; i < 20000; ++i) {
      std::ifstream f(path);
      if (f && std::getline(f, blob) && !blob.empty()) break;
      usleep(1000);
    }
    CHECK(!blob.empty(), "no address from rank %d", r);
    others.push_back(r);
    remote.push_back(blob);
  }
  t->connect(others, remote);
  return t;
}

// Drive until every request is done (or the deadline: then fail the test).
void waitAll(Transport& t, std::vector<Request*> rs, double timeout_s = 30) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    bool all = true;
    for (Request* r : rs) all &= r->done();
    if (all) return;
    if (!t.progress()) t.wait(10);
    CHECK(std::chrono::steady_clock::now() < end, "timed out waiting for requests");
  }
}

struct Scenario {
  int n;
  std::function<void(int, ShmTransport&)> body;
  std::map<std::string, std::string> env;
  std::function<void(int)> setup;  // per-rank extra setup in the child (before connecting)
};

// Fork n ranks, run `body` in each, return their exit statuses.
std::vector<int> runRanks(const Scenario& sc, double timeout_s = 60) {
  char tmpl[] = "/tmp/harp-shm-test-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::vector<pid_t> pids;
  for (int r = 0; r < sc.n; ++r) {
    pid_t p = fork();
    if (p == 0) {
      g_rank = r;
      for (auto& kv : sc.env) setenv(kv.first.c_str(), kv.second.c_str(), 1);
      if (sc.setup) sc.setup(r);
      alarm(static_cast<unsigned>(timeout_s) + 5);
      try {
        auto t = connectRank(r, sc.n, dir);
        sc.body(r, *t);
      } catch (const std::exception& e) {
        fprintf(stderr, "[rank %d] exception: %s\n", r, e.what());
        _exit(2);
      }
      _exit(0);
    }
    pids.push_back(p);
  }
  std::vector<int> status(sc.n, -1);
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int left = sc.n;
  while (left > 0) {
    for (int r = 0; r < sc.n; ++r) {
      if (status[r] != -1) continue;
      int st;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        --left;
      }
    }
    if (std::chrono::steady_clock::now() > end) {
      for (int r = 0; r < sc.n; ++r)
        if (status[r] == -1) kill(pids[r], SIGKILL);
    }
    usleep(2000);
  }
  std::string cmd = "rm -rf " + dir;
  if (system(cmd.c_str()) != 0) perror("rm");
  return status;
}

void expectOk(const std::vector<int>& st) {
  for (size_t r = 0; r < st.size(); ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

uint8_t pattern(int from, int to, size_t msg, size_t i) {
  return static_cast<uint8_t>((from * 131 + to * 31 + msg * 7 + i * 13 + (i >> 8)) & 0xff);
}

// Every pair exchanges messages of every size class, both directions at once.
void exchangeAll(int rank, ShmTransport& t, int n, const std::vector<size_t>& sizes, int rounds) {
  for (int round = 0; round < rounds; ++round)
    for (size_t si = 0; si < sizes.size(); ++si) {
      size_t len = sizes[si];
      std::vector<std::vector<uint8_t>> sb(n), rb(n);
      std::vector<Request> sr(n), rr(n);
      std::vector<Request*> all;
      for (int p = 0; p < n; ++p) {
        if (p == rank) continue;
        rb[p].assign(len, 0xEE);
        rr[p].buf = rb[p].data();
        rr[p].len = len;
        rr[p].tag = (uint64_t(round) << 40) | (si << 8) | 0x11;
        rr[p].peer = p;
        t.pair(p)->irecv(&rr[p]);
        all.push_back(&rr[p]);
      }
      for (int p = 0; p < n; ++p) {
        if (p == rank) continue;
        sb[p].resize(len);
        for (size_t i = 0; i < len; ++i) sb[p][i] = pattern(rank, p, si + round, i);
        sr[p].buf = sb[p].data();
        sr[p].len = len;
        sr[p].tag = (uint64_t(round) << 40) | (si << 8) | 0x11;
        sr[p].peer = p;
        t.pair(p)->isend(&sr[p]);
        all.push_back(&sr[p]);
      }
      waitAll(t, all);
      for (int p = 0; p < n; ++p) {
        if (p == rank) continue;
        CHECK(sr[p].state == Request::kDone, "send to %d failed: %s", p, sr[p].error.c_str());
        CHECK(rr[p].state == Request::kDone, "recv from %d (len %zu) failed: %s", p, len, rr[p].error.c_str());
        for (size_t i = 0; i < len; ++i)
          CHECK(rb[p][i] == pattern(p, rank, si + round, i), "byte %zu of %zu from %d wrong", i, len, p);
      }
    }
}

const std::vector<size_t> kSizes = {0, 1, 8, 4096, 16384 - 32, 16384 - 31, 65536, 65537, 300000, 4 << 20};

TEST(ShmTransport, ExchangeTwoRanksCma) {
  expectOk(runRanks({2, [](int r, ShmTransport& t) { exchangeAll(r, t, 2, kSizes, 3); }, {}}));
}

TEST(ShmTransport, ExchangeTwoRanksRingOnly) {
  expectOk(runRanks({2, [](int r, ShmTransport& t) { exchangeAll(r, t, 2, kSizes, 2); },
                     {{"HARP_SHM_CMA", "0"}, {"HARP_SHM_SLOTS", "4"}, {"HARP_SHM_SLOT_BYTES", "1024"}}, {}}));
}

TEST(ShmTransport, ExchangeEightRanksOversubscribed) {
  expectOk(runRanks({8, [](int r, ShmTransport& t) { exchangeAll(r, t, 8, {8, 20000, 200000}, 3); }, {}}));
}

// Many messages in flight without waiting: FIFO order through many ring laps.
TEST(ShmTransport, FifoManyInFlight) {
  expectOk(runRanks({2, [](int r, ShmTransport& t) {
    const int kMsgs = 500;
    std::vector<uint64_t> vals(kMsgs), got(kMsgs, 0);
    std::vector<Request> reqs(kMsgs);
    std::vector<Request*> all;
    for (int i = 0; i < kMsgs; ++i) {
      vals[i] = 1000 + i;
      Request& q = reqs[i];
      q.buf = r == 0 ? static_cast<void*>(&vals[i]) : static_cast<void*>(&got[i]);
      q.len = 8;
      q.tag = 77 + i;
      q.peer = 1 - r;
      if (r == 0) t.pair(1)->isend(&q); else t.pair(0)->irecv(&q);
      all.push_back(&q);
    }
    waitAll(t, all);
    for (int i = 0; i < kMsgs; ++i) {
      CHECK(reqs[i].state == Request::kDone, "message %d: %s", i, reqs[i].error.c_str());
      if (r == 1) CHECK(got[i] == 1000u + i, "message %d carried %llu", i, (unsigned long long)got[i]);
    }
  }, {{"HARP_SHM_SLOTS", "8"}}, {}}));
}

// A wrong tag or length fails the receive with kMismatch and what arrived;
// the next message is still delivered intact (the bad one was skipped).
void mismatchBody(int r, ShmTransport& t) {
  std::vector<uint8_t> big(100000, 7), rbig(100000), small(8, 9), rsmall(8);
  if (r == 0) {
    Request a{}, b{}, c{};
    a.buf = big.data(); a.len = big.size(); a.tag = 5;
    b.buf = small.data(); b.len = 8; b.tag = 6;
    c.buf = small.data(); c.len = 8; c.tag = 7;
    t.pair(1)->isend(&a);
    t.pair(1)->isend(&b);
    t.pair(1)->isend(&c);
    waitAll(t, {&a, &b, &c});
  } else {
    Request a{}, b{}, c{};
    a.buf = rbig.data(); a.len = rbig.size(); a.tag = 99;  // wrong tag
    b.buf = rbig.data(); b.len = 16; b.tag = 6;            // wrong length
    c.buf = rsmall.data(); c.len = 8; c.tag = 7;           // right
    t.pair(0)->irecv(&a);
    t.pair(0)->irecv(&b);
    t.pair(0)->irecv(&c);
    waitAll(t, {&a, &b, &c});
    CHECK(a.state == Request::kFailed && a.failure == Request::kMismatch, "a: state %d", a.state);
    CHECK(a.peer_tag == 5 && a.peer_len == 100000, "a: peer_tag %llu len %llu", (unsigned long long)a.peer_tag,
          (unsigned long long)a.peer_len);
    CHECK(a.error.find("rank 0") != std::string::npos, "error does not name the peer: %s", a.error.c_str());
    CHECK(b.failure == Request::kMismatch && b.peer_len == 8 && b.peer_tag == 6, "b: %s", b.error.c_str());
    CHECK(c.state == Request::kDone && rsmall[0] == 9, "c: %s", c.error.c_str());
    for (size_t i = 16; i < rbig.size(); ++i) CHECK(rbig[i] == 0, "mismatched receive wrote byte %zu", i);
  }
}
TEST(ShmTransport, MismatchCma) { expectOk(runRanks({2, mismatchBody, {}})); }
TEST(ShmTransport, MismatchRing) { expectOk(runRanks({2, mismatchBody, {{"HARP_SHM_CMA", "0"}}, {}})); }

// abort() on one rank fails the other's pending receive with the reason.
TEST(ShmTransport, AbortNotice) {
  expectOk(runRanks({3, [](int r, ShmTransport& t) {
    uint64_t v = 0;
    if (r == 2) {
      usleep(200000);
      t.abort("test abort from rank 2");
      // Our own later posts fail at once.
      Request q{};
      q.buf = &v; q.len = 8; q.tag = 1;
      t.pair(0)->isend(&q);
      waitAll(t, {&q});
      CHECK(q.state == Request::kFailed, "post after abort did not fail");
      return;
    }
    Request q{};
    q.buf = &v; q.len = 8; q.tag = 1;
    t.pair(2)->irecv(&q);
    auto t0 = std::chrono::steady_clock::now();
    waitAll(t, {&q});
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(q.state == Request::kFailed && q.failure == Request::kPeerFailure, "state %d", q.state);
    CHECK(q.error.find("test abort from rank 2") != std::string::npos, "reason missing: %s", q.error.c_str());
    CHECK(q.error.find("rank 2") != std::string::npos, "peer not named: %s", q.error.c_str());
    CHECK(s < 5, "abort took %.2f s to arrive", s);
  }, {}}));
}

// kill -9 of a rank: the others' pending operations fail promptly naming it,
// and nothing is left in /dev/shm (with memfd and with the shm_open fallback).
void deathBody(int r, ShmTransport& t) {
  if (r == 1) {
    std::ofstream(std::string(getenv("HARP_TEST_DIR")) + "/ready") << "x";
    pause();  // the parent kills us
    _exit(3);
  }
  std::vector<uint8_t> buf(1 << 20);
  Request q{}, s{};
  q.buf = buf.data(); q.len = 8; q.tag = 1;
  s.buf = buf.data(); s.len = buf.size(); s.tag = 2;  // fills the ring, then waits for space
  t.pair(1)->irecv(&q);
  t.pair(1)->isend(&s);
  auto t0 = std::chrono::steady_clock::now();
  waitAll(t, {&q, &s});
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(q.state == Request::kFailed && q.failure == Request::kPeerFailure, "recv state %d", q.state);
  CHECK(s.state == Request::kFailed && s.failure == Request::kPeerFailure, "send state %d", s.state);
  CHECK(q.error.find("rank 1") != std::string::npos, "peer not named: %s", q.error.c_str());
  CHECK(sec < 10, "death noticed after %.2f s", sec);
  // Later posts fail at once.
  Request z{};
  z.buf = buf.data(); z.len = 1; z.tag = 3;
  t.pair(1)->isend(&z);
  CHECK(z.state == Request::kFailed, "post to a dead peer did not fail at once");
}

}  // namespace

// Death test with explicit fork so the parent can kill -9 a chosen child.
static std::vector<int> runWithKill(int n, int victim, std::map<std::string, std::string> env) {
  char tmpl[] = "/tmp/harp-shm-kill-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  char tmpl2[] = "/tmp/harp-shm-sig-XXXXXX";
  std::string sig = mkdtemp(tmpl2);
  env["HARP_TEST_DIR"] = sig;
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t p = fork();
    if (p == 0) {
      g_rank = r;
      for (auto& kv : env) setenv(kv.first.c_str(), kv.second.c_str(), 1);
      alarm(60);
      try {
        auto t = connectRank(r, n, dir);
        deathBody(r, *t);
      } catch (const std::exception& e) {
        fprintf(stderr, "[rank %d] exception: %s\n", r, e.what());
        _exit(2);
      }
      _exit(0);
    }
    pids.push_back(p);
  }
  for (int i = 0; i < 30000 && access((sig + "/ready").c_str(), F_OK) != 0; ++i) usleep(1000);
  usleep(100000);  // let the others block on the victim
  kill(pids[victim], SIGKILL);
  std::vector<int> st(n);
  for (int r = 0; r < n; ++r) {
    int s;
    waitpid(pids[r], &s, 0);
    st[r] = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
  }
  std::string cmd = "rm -rf " + dir + " " + sig;
  if (system(cmd.c_str()) != 0) perror("rm");
  return st;
}

TEST(ShmTransport, KillNineDetectedAndNoLeak) {
  auto before = devShmFiles();
  auto st = runWithKill(3, 1, {{"HARP_SHM_CMA", "0"}});
  EXPECT_EQ(st[0], 0);
  EXPECT_EQ(st[1], 128 + SIGKILL);
  EXPECT_EQ(st[2], 0);
  EXPECT_EQ(devShmFiles(), before) << "files left in /dev/shm";
}

TEST(ShmTransport, KillNineNoLeakShmOpenFallback) {
  auto before = devShmFiles();
  auto st = runWithKill(3, 1, {{"HARP_SHM_NO_MEMFD", "1"}});
  EXPECT_EQ(st[0], 0);
  EXPECT_EQ(st[2], 0);
  EXPECT_EQ(devShmFiles(), before) << "files left in /dev/shm";
}

// Ranks configured with different ring geometry get an error naming the
// settings instead of corrupting each other's memory.
TEST(ShmTransport, GeometryMismatchIsAnError) {
  Scenario sc{2, [](int, ShmTransport&) {}, {}, [](int r) {
    setenv("HARP_SHM_SLOTS", r == 0 ? "8" : "16", 1);
  }};
  auto st = runRanks(sc);
  EXPECT_EQ(st[0], 2);
  EXPECT_EQ(st[1], 2);
}

// ---- A hostile peer: slot headers, ring indices and acks it writes into the
// shared segments are never trusted. Rank 0 is the attacker: it finds the
// victim's segment among its own mappings (memfd "harp-shm", header rank 1),
// writes a slot (or a ring index) the protocol does not allow, and waits. Rank
// 1 must fail the pair with a protocol error naming rank 0 and what was wrong,
// never write past its buffer, hang, or crash.
namespace {

using harp::transport::shm::Geometry;
using harp::transport::shm::RingCtl;
using harp::transport::shm::SegHeader;
using harp::transport::shm::SlotHdr;

constexpr uint32_t kHostileSlots = 8, kHostileSlotBytes = 1024;
constexpr size_t kCap = kHostileSlotBytes - sizeof(SlotHdr);

// The segment of `rank` as mapped in this process.
uint8_t* mappedSegmentOf(int rank) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("harp-shm") == std::string::npos) continue;
    uint8_t* base = reinterpret_cast<uint8_t*>(std::stoull(line.substr(0, line.find('-')), nullptr, 16));
    auto* h = reinterpret_cast<SegHeader*>(base);
    if (h->magic == harp::transport::shm::kSegMagic && h->rank == rank) return base;
  }
  return nullptr;
}

Geometry hostileGeometry() {
  Geometry g;
  g.nlocal = 2;
  g.nslots = kHostileSlots;
  g.slot_bytes = kHostileSlotBytes;
  return g;
}

// Slot k of the ring that carries messages from local rank `from` into `seg`.
SlotHdr* ringSlot(uint8_t* seg, int from, uint64_t k) {
  Geometry g = hostileGeometry();
  return reinterpret_cast<SlotHdr*>(seg + g.ringOffset(from) + sizeof(RingCtl) + (k % g.nslots) * g.slot_bytes);
}
RingCtl* ringCtl(uint8_t* seg, int from) { return reinterpret_cast<RingCtl*>(seg + hostileGeometry().ringOffset(from)); }

void writeSlot(uint8_t* seg, uint64_t k, uint64_t tag, uint64_t len, uint32_t kind, uint32_t nbytes, uint8_t fill) {
  SlotHdr* h = ringSlot(seg, 0, k);
  h->tag = tag;
  h->len = len;
  h->kind = kind;
  h->nbytes = nbytes;
  memset(harp::transport::shm::payload(h), fill, kCap);
  h->seq.store(k + 1, std::memory_order_release);
}

struct Hostile {
  const char* name;
  // Attacker: what to write (victim's segment, attacker's own segment).
  std::function<void(uint8_t* victim, uint8_t* own)> attack;
  // Victim: what to post (receives of `len` bytes with `tag` 5, or one send).
  size_t recv_len;
  bool send;  // post a send of 64 KB (CMA) instead of receives
  const char* expect;  // words the error must contain
  int no_cma = -1;     // this rank runs with HARP_SHM_CMA=0 (refuses single-copy reads of its peer)
};

const std::vector<Hostile>& hostileCases() {
  static const std::vector<Hostile> cases = {
      {"payload longer than the posted receive", [](uint8_t* v, uint8_t*) { writeSlot(v, 0, 5, 64, 1, 512, 0xAB); },
       64, false, "512"},
      {"payload longer than a slot", [](uint8_t* v, uint8_t*) { writeSlot(v, 0, 5, 64, 1, 0xFFFFFFF0u, 0xAB); },
       64, false, "4294967280"},
      {"payload longer than its own message (mismatch path)",
       [](uint8_t* v, uint8_t*) { writeSlot(v, 0, 6, 8, 1, 512, 0xAB); }, 64, false, "512"},
      {"unknown slot kind", [](uint8_t* v, uint8_t*) { writeSlot(v, 0, 5, 64, 7, 64, 0xAB); }, 64, false, "kind 7"},
      {"continuation without a start", [](uint8_t* v, uint8_t*) { writeSlot(v, 0, 5, 64, 2, 64, 0xAB); }, 64, false,
       "continuation"},
      {"a new message in the middle of one",
       [](uint8_t* v, uint8_t*) {
         writeSlot(v, 0, 5, 2000, 1, kCap, 0x11);
         writeSlot(v, 1, 5, 2000, 1, 2000 - kCap, 0x22);
       },
       2000, false, "middle"},
      {"continuation longer than the rest of the message",
       [](uint8_t* v, uint8_t*) {
         writeSlot(v, 0, 5, 1200, 1, kCap, 0x11);
         writeSlot(v, 1, 5, 1200, 2, 500, 0x22);  // 208 bytes remain
       },
       1200, false, "remain"},
      {"single-copy descriptor though single-copy reads are off",
       [](uint8_t* v, uint8_t*) { writeSlot(v, 0, 5, 64, 3, 8, 0); }, 64, false, "single-copy", 1},
      {"ring consumed count beyond what was written",
       [](uint8_t*, uint8_t* own) { ringCtl(own, 1)->tail.store(1000, std::memory_order_release); }, 0, true,
       "1000", 0},  // no single-copy: the send goes through the ring and fills it
      {"single-copy acks beyond what was posted",
       [](uint8_t* v, uint8_t*) { ringCtl(v, 0)->acks.store(5, std::memory_order_release); }, 0, true, "5"},
  };
  return cases;
}

void hostileBody(int r, ShmTransport& t, const Hostile& c) {
  const std::string done = std::string(getenv("HARP_TEST_DIR")) + "/done";
  if (r == 0) {
    uint8_t* victim = mappedSegmentOf(1);
    uint8_t* own = mappedSegmentOf(0);
    CHECK(victim && own, "segments not found in /proc/self/maps");
    usleep(50000);  // the victim has posted
    c.attack(victim, own);
    for (int i = 0; i < 30000 && access(done.c_str(), F_OK) != 0; ++i) usleep(1000);
    return;  // never reads its ring: a stuck victim fails on its own deadline
  }
  const size_t guard = 4096;
  std::vector<uint8_t> buf(std::max<size_t>(c.recv_len, 65536) + guard, 0xEE);
  Request q{};
  q.buf = buf.data();
  q.tag = 5;
  q.peer = 0;
  if (c.send) {
    q.len = 65536;  // above HARP_SHM_CMA_BYTES: a single-copy send, or a full ring
    t.pair(0)->isend(&q);
    if (!q.done()) waitAll(t, {&q}, 10);
  } else {
    q.len = c.recv_len;
    t.pair(0)->irecv(&q);
    waitAll(t, {&q}, 10);
  }
  std::ofstream(done) << "x";
  CHECK(q.state == Request::kFailed && q.failure == Request::kPeerFailure, "%s: state %d failure %d (%s)", c.name,
        q.state, q.failure, q.error.c_str());
  CHECK(q.error.find("protocol error") != std::string::npos && q.error.find("rank 0") != std::string::npos &&
            q.error.find(c.expect) != std::string::npos,
        "%s: the error does not name the peer, the fault and '%s': %s", c.name, c.expect, q.error.c_str());
  if (!c.send)
    for (size_t i = q.len; i < buf.size(); ++i) CHECK(buf[i] == 0xEE, "%s: byte %zu past the buffer written", c.name, i);
  // The pair stays failed: a later post fails at once, naming the same fault.
  Request z{};
  z.buf = buf.data();
  z.len = 8;
  z.tag = 9;
  t.pair(0)->irecv(&z);
  CHECK(z.state == Request::kFailed && z.error == q.error, "%s: a later post: %s", c.name, z.error.c_str());
}

}  // namespace

TEST(ShmTransport, HostilePeerSlotsAndIndicesAreRejected) {
  for (size_t i = 0; i < hostileCases().size(); ++i) {
    const Hostile& c = hostileCases()[i];
    char tmpl[] = "/tmp/harp-shm-hostile-XXXXXX";
    std::string dir = mkdtemp(tmpl);
    std::map<std::string, std::string> env = {{"HARP_SHM_SLOTS", std::to_string(kHostileSlots)},
                                              {"HARP_SHM_SLOT_BYTES", std::to_string(kHostileSlotBytes)},
                                              {"HARP_SHM_CMA_BYTES", "4096"},
                                              {"HARP_TEST_DIR", dir}};
    Scenario sc{2, [&c](int r, ShmTransport& t) { hostileBody(r, t, c); }, env, [&c](int r) {
      if (r == c.no_cma) setenv("HARP_SHM_CMA", "0", 1);
    }};
    auto st = runRanks(sc, 30);
    EXPECT_EQ(st[0], 0) << c.name;
    EXPECT_EQ(st[1], 0) << c.name << " (the victim's exit status: 1 a failed check, 128+n a signal)";
    std::string cmd = "rm -rf " + dir;
    if (system(cmd.c_str()) != 0) perror("rm");
  }
}

// checkSlot on generated headers (edge values: 0, 1, the slot capacity, the
// message's remainder, all ones, each +-1): whatever it accepts is within
// the slot, the message and the posted receive; and every slot sequence the
// sender (progressSends) writes for any length and slot size is accepted.
TEST(ShmTransport, CheckSlotBoundsGeneratedHeaders) {
  using harp::transport::shm::checkSlot;
  using harp::transport::shm::SlotExpect;
  using harp::transport::shm::SlotView;
  std::mt19937_64 rng(20261203);
  auto pick = [&](std::vector<uint64_t> edges) {
    uint64_t v = rng() % 4 == 0 ? rng() : edges[rng() % edges.size()];
    return v + (rng() % 3) - 1;  // the edge, one below or one above
  };
  size_t accepted = 0;
  for (int i = 0; i < 200000; ++i) {
    const size_t cap = 224 + 64 * (rng() % 16);
    SlotExpect e;
    e.start = rng() % 2;
    e.cma = rng() % 2;
    e.tag = rng() % 4;
    e.len = pick({0, 1, cap, 2 * cap, 1u << 20, UINT32_MAX, UINT64_MAX});
    e.done = e.len ? rng() % e.len : 0;
    SlotView h;
    h.kind = static_cast<uint32_t>(rng() % 5);
    h.tag = rng() % 3 ? e.tag : rng() % 4;
    h.len = rng() % 3 ? e.len : pick({0, 1, cap, e.len, UINT64_MAX});
    h.nbytes = static_cast<uint32_t>(pick({0, 1, 8, cap, e.len - e.done, h.len, UINT32_MAX}));
    if (!checkSlot(h, e, cap).empty()) continue;
    ++accepted;
    ASSERT_TRUE(h.kind >= 1 && h.kind <= 3) << h.kind;
    ASSERT_LE(h.nbytes, cap);
    if (e.start) {
      ASSERT_NE(h.kind, 2u);
      if (h.kind == 1) ASSERT_LE(h.nbytes, h.len);
      if (h.kind == 3) ASSERT_TRUE(e.cma && h.nbytes == 8 && h.len > 0);
    } else {
      ASSERT_EQ(h.kind, 2u);
      ASSERT_TRUE(h.tag == e.tag && h.len == e.len);
      ASSERT_TRUE(h.nbytes > 0 && h.nbytes <= e.len - e.done) << h.nbytes << " of " << e.len - e.done;
    }
  }
  EXPECT_GT(accepted, 1000u);  // the generator reaches the accepting side too
  for (int i = 0; i < 20000; ++i) {  // what an honest sender writes
    const size_t cap = 224 + 64 * (rng() % 16);
    const uint64_t len = rng() % 3 == 0 ? rng() % 4 : rng() % (20 * cap);
    SlotExpect e;
    e.tag = rng();
    e.len = len;
    for (uint64_t off = 0;;) {
      SlotView h{e.tag, len, off == 0 ? 1u : 2u, static_cast<uint32_t>(std::min<uint64_t>(cap, len - off))};
      e.start = off == 0;
      e.done = off;
      ASSERT_EQ(checkSlot(h, e, cap), "") << "len " << len << " cap " << cap << " offset " << off;
      off += h.nbytes;
      if (off >= len) break;
    }
  }
}
