// transport/verbs/selftest.cc — standalone multi-process test of the verbs
// transport, below the communicator: N forked ranks exchange their addresses
// through files in a temporary directory, connect, and run scenarios over the
// real libibverbs device (Soft-RoCE in the test guest):
//
//   data      every rank sends to every other rank messages of many sizes
//             (0 B .. 8 MiB, several in flight per pair), contents checked
//   mismatch[-rdv]  rank 1 posts a receive 8 bytes shorter than rank 0's eager
//             (1 KiB) or rendezvous (100 KB) send: rank 1's receive fails with
//             kMismatch and the sent length/tag; rank 0's pair breaks naming it
//   kill      rank 1 dies (SIGKILL) while rank 0 waits for its data: rank 0's
//             receive fails with kPeerFailure naming rank 1, within seconds
//   abort     rank 0 aborts; rank 1's pending receive fails naming the abort
//   cache     HARP_IB_MR_CACHE=lazy: 20 rounds on the same buffers register
//             each buffer once (the stats are checked), safe mode deregisters
//
// Usage: harp_verbs_selftest SCENARIO [NRANKS]; exit 0 = passed. Built with
// HARP_BUILD_TESTS; run in the guest by tests/test_verbs.py.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/types.h"
#include "transport/transport.h"
#include "transport/verbs/verbs.h"

using namespace harp;
using namespace harp::transport;
using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void die(int rank, const std::string& msg) {
  std::fprintf(stderr, "selftest rank %d: FAIL: %s\n", rank, msg.c_str());
  std::fflush(stderr);
  _exit(1);
}

std::string readFile(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Exchange: rank r writes its blob for peer p to dir/a.r.p (atomically).
std::vector<std::string> exchange(const std::string& dir, int rank, int n, Transport& t) {
  for (int p = 0; p < n; ++p) {
    if (p == rank) continue;
    std::string blob = t.localAddress(p);
    std::string tmp = dir + "/tmp." + std::to_string(rank) + "." + std::to_string(p);
    std::ofstream(tmp, std::ios::binary) << blob;
    rename(tmp.c_str(), (dir + "/a." + std::to_string(rank) + "." + std::to_string(p)).c_str());
  }
  std::vector<std::string> out;
  auto until = Clock::now() + std::chrono::seconds(60);
  for (int p = 0; p < n; ++p) {
    if (p == rank) continue;
    std::string path = dir + "/a." + std::to_string(p) + "." + std::to_string(rank);
    while (access(path.c_str(), F_OK) != 0) {
      if (Clock::now() > until) die(rank, "timed out waiting for " + path);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    out.push_back(readFile(path));
  }
  return out;
}

// Drive until every request is done or `secs` pass. Returns false on timeout.
bool waitAll(Transport& t, std::vector<Request*> rs, double secs) {
  auto until = Clock::now() + std::chrono::milliseconds(static_cast<long long>(secs * 1000));
  for (;;) {
    bool all = true;
    for (Request* r : rs) all &= r->done();
    if (all) return true;
    if (Clock::now() > until) return false;
    if (!t.progress()) t.wait(50);
  }
}

uint8_t pattern(int from, int to, int msg, size_t i) { return static_cast<uint8_t>((from * 131 + to * 31 + msg * 7 + i) & 0xff); }

int runRank(const std::string& scenario, const std::string& dir, int rank, int n) {
  std::vector<PeerInfo> peers(n);
  char host[64] = {0};
  gethostname(host, sizeof host - 1);
  for (int r = 0; r < n; ++r) {
    peers[r].rank = r;
    peers[r].hostname = host;
  }
  CommInfo info;
  info.rank = rank;
  info.size = n;
  info.comm_id = 0x5e1f7e57;
  info.timeout_s = 60;
  const TransportSpec* spec = findTransport("verbs");
  if (!spec) die(rank, "the verbs transport is not registered");
  std::string why = spec->unavailable();
  if (!why.empty()) die(rank, "verbs unavailable: " + why);
  auto t = spec->create(info, peers);
  std::vector<int> ids;
  for (int p = 0; p < n; ++p)
    if (p != rank) ids.push_back(p);
  auto remote = exchange(dir, rank, n, *t);
  t->connect(ids, remote);

  if (scenario == "data" || scenario == "cache") {
    const std::vector<size_t> sizes = scenario == "cache"
                                          ? std::vector<size_t>{0, 1, 4096, 65536, 300000}
                                          : std::vector<size_t>{0, 1, 7, 64, 4095, 4096, 65536, 1 << 20, (4 << 20) + 3};
    int rounds = scenario == "cache" ? 20 : 2;
    // Buffers allocated once: in lazy mode the cache must serve later rounds.
    std::vector<std::vector<std::vector<uint8_t>>> sbuf(n), rbuf(n);
    for (int p : ids) {
      for (size_t k = 0; k < sizes.size(); ++k) {
        sbuf[p].emplace_back(sizes[k]);
        rbuf[p].emplace_back(sizes[k]);
        for (size_t i = 0; i < sizes[k]; ++i) sbuf[p][k][i] = pattern(rank, p, static_cast<int>(k), i);
      }
    }
    for (int round = 0; round < rounds; ++round) {
      std::vector<Request> reqs(2 * ids.size() * sizes.size());
      std::vector<Request*> all;
      size_t q = 0;
      for (int p : ids) {
        for (size_t k = 0; k < sizes.size(); ++k) {
          Request& rr = reqs[q++];
          std::fill(rbuf[p][k].begin(), rbuf[p][k].end(), 0xee);
          rr.buf = rbuf[p][k].data();
          rr.len = sizes[k];
          rr.tag = 1000 + k + round;
          t->pair(p)->irecv(&rr);
          all.push_back(&rr);
        }
      }
      for (int p : ids) {
        for (size_t k = 0; k < sizes.size(); ++k) {
          Request& sr = reqs[q++];
          sr.buf = sbuf[p][k].data();
          sr.len = sizes[k];
          sr.tag = 1000 + k + round;
          t->pair(p)->isend(&sr);
          all.push_back(&sr);
        }
      }
      if (!waitAll(*t, all, 120)) die(rank, "round " + std::to_string(round) + ": requests still pending after 120 s");
      for (Request* r : all)
        if (r->state != Request::kDone) die(rank, "request failed: " + r->error);
      for (int p : ids)
        for (size_t k = 0; k < sizes.size(); ++k)
          for (size_t i = 0; i < sizes[k]; ++i)
            if (rbuf[p][k][i] != pattern(p, rank, static_cast<int>(k), i))
              die(rank, "byte " + std::to_string(i) + " of message " + std::to_string(k) + " from rank " +
                            std::to_string(p) + " is wrong");
    }
    auto* vt = dynamic_cast<verbs::VerbsTransport*>(t.get());
    const auto& st = vt->mrs_->stats();
    std::printf("rank %d: %s ok; MR cache registrations=%llu hits=%llu deregistrations=%llu live=%zu\n", rank,
                scenario.c_str(), (unsigned long long)st.registrations, (unsigned long long)st.hits,
                (unsigned long long)st.deregistrations, vt->mrs_->size());
    if (scenario == "cache") {
      // Messages above the eager limit register their buffers: (send + receive)
      // x those sizes x peers, each registered once in lazy mode.
      size_t big = 0;
      for (size_t sz : sizes) big += sz > vt->eager_max_;
      unsigned long long expect = 2ull * big * ids.size();
      if (vt->mrs_->lazy()) {
        if (st.registrations > expect)
          die(rank, "lazy cache registered " + std::to_string(st.registrations) + " regions for " +
                        std::to_string(expect) + " buffers");
        if (st.hits < expect * (rounds - 1)) die(rank, "lazy cache: too few hits " + std::to_string(st.hits));
      } else if (st.registrations < expect * rounds / 2) {
        die(rank, "safe cache kept registrations across rounds (" + std::to_string(st.registrations) + ")");
      }
    }
  } else if (scenario == "mismatch" || scenario == "mismatch-rdv") {
    // Eager (1 KiB) or rendezvous (100 KB) message; rank 1 expects 8 bytes less.
    size_t big = scenario == "mismatch" ? 1024 : 100000;
    std::vector<uint8_t> buf(big, 1);
    Request r;
    r.buf = buf.data();
    r.tag = 77;
    r.len = rank == 0 ? big : big - 8;
    if (rank == 0) t->pair(1)->isend(&r);
    else if (rank == 1) t->pair(0)->irecv(&r);
    else return 0;
    if (!waitAll(*t, {&r}, 30)) die(rank, "mismatch not reported within 30 s");
    if (rank == 1) {
      if (r.failure != Request::kMismatch || r.peer_len != big || r.peer_tag != 77)
        die(rank, "expected kMismatch with peer_len " + std::to_string(big) + ", got failure " +
                      std::to_string(r.failure) + " (" + r.error + ") peer_len " + std::to_string(r.peer_len));
      std::printf("rank 1: %s ok: %s\n", scenario.c_str(), r.error.c_str());
    } else {
      // An eager send may complete before the receiver looks at it (as over
      // TCP); either way the pair must then be broken with a mismatch reason.
      if (r.state == Request::kFailed && r.error.find("mismatch") == std::string::npos)
        die(rank, "sender failed without naming the mismatch: " + r.error);
      Request after;
      after.buf = buf.data();
      after.len = 8;
      after.tag = 78;
      t->pair(1)->irecv(&after);
      if (!waitAll(*t, {&after}, 30)) die(rank, "pair not broken 30 s after the mismatch");
      if (after.state != Request::kFailed || after.error.find("mismatch") == std::string::npos)
        die(rank, "expected the pair to fail naming the mismatch, got: " + after.error);
      std::printf("rank 0: %s ok (send %s): %s\n", scenario.c_str(),
                  r.state == Request::kDone ? "completed" : "failed", after.error.c_str());
    }
  } else if (scenario == "kill" || scenario == "abort") {
    // Rank 1 starts a big transfer to rank 0 in pieces, then dies/aborts.
    std::vector<uint8_t> buf(4 << 20, 3);
    Request r;
    r.buf = buf.data();
    r.len = buf.size();
    r.tag = 5;
    if (rank == 0) {
      Request first;
      first.buf = buf.data();
      first.len = 4096;
      first.tag = 4;
      t->pair(1)->irecv(&first);
      t->pair(1)->irecv(&r);
      if (!waitAll(*t, {&first}, 30) || first.state != Request::kDone) die(rank, "first message did not arrive");
      auto t0 = Clock::now();
      if (!waitAll(*t, {&r}, 30)) die(rank, "no error 30 s after rank 1 went away: the receive hangs");
      double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      if (r.state != Request::kFailed || r.failure != Request::kPeerFailure || r.error.find("rank 1") == std::string::npos)
        die(rank, "expected kPeerFailure naming rank 1, got state " + std::to_string(r.state) + ": " + r.error);
      std::printf("rank 0: %s ok after %.2f s: %s\n", scenario.c_str(), secs, r.error.c_str());
    } else if (rank == 1) {
      Request first;
      first.buf = buf.data();
      first.len = 4096;
      first.tag = 4;
      t->pair(0)->isend(&first);
      if (!waitAll(*t, {&first}, 30) || first.state != Request::kDone) die(rank, "first send failed");
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      if (scenario == "kill") {
        std::fflush(stdout);
        kill(getpid(), SIGKILL);
      }
      t->abort("selftest abort on purpose");
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    return 0;
  } else {
    die(rank, "unknown scenario " + scenario);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s data|mismatch|kill|abort|cache [NRANKS]\n", argv[0]);
    return 2;
  }
  std::string scenario = argv[1];
  int n = argc > 2 ? std::atoi(argv[2]) : (scenario == "data" || scenario == "cache" ? 4 : 2);
  char tmpl[] = "/tmp/harp-verbs-selftest-XXXXXX";
  if (!mkdtemp(tmpl)) return 2;
  std::string dir = tmpl;
  std::vector<pid_t> kids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int rc = 1;
      try {
        rc = runRank(scenario, dir, r, n);
      } catch (const std::exception& e) {
        die(r, std::string("exception: ") + e.what());
      }
      std::fflush(stdout);
      _exit(rc);
    }
    kids.push_back(pid);
  }
  int failed = 0;
  for (int r = 0; r < n; ++r) {
    int st = 0;
    waitpid(kids[r], &st, 0);
    bool expected_kill = scenario == "kill" && r == 1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
    if (!expected_kill && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
      std::fprintf(stderr, "selftest: rank %d exited with status %d\n", r, st);
      ++failed;
    }
  }
  std::string cmd = "rm -rf " + dir;
  if (system(cmd.c_str())) {
  }
  std::printf("selftest %s with %d ranks: %s\n", scenario.c_str(), n, failed ? "FAILED" : "passed");
  return failed ? 1 : 0;
}
