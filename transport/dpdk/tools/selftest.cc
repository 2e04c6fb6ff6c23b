// transport/dpdk/tools/selftest.cc — harp_dpdk_selftest: a standalone
// multi-process check (and micro-benchmark) of the DPDK transport through the
// Transport interface alone, without the communicator.
//
//   harp_dpdk_selftest --rank R --size N --dir DIR [--iters K] [--max-bytes B]
//                      [--seed S] [--mismatch] [--bench SIZE] [--timeout T]
//   harp_dpdk_selftest --threads N --dir DIR [...]   (N ranks as threads of one process)
//   harp_dpdk_selftest --unmap-race [--timeout T]     (the memif burst guard, below)
//   harp_dpdk_selftest --rank 0|1 --size 2 --dir DIR --intruder [--timeout T]
//
// Ranks meet through files in DIR (pid.R, then blob.R). Each iteration every
// rank sends one message to every other rank (sizes drawn from a seeded RNG
// that all ranks share, including 0 and 1 byte and multi-packet ones), posts
// the matching receives, drives progress()/wait() and checks every byte.
// --mismatch: rank 1 expects a different length from rank 0 than rank 0 sends
// and must see Request::kMismatch. --bench SIZE (2 ranks): ping-pong latency
// and one-way streaming throughput at SIZE bytes, with packets per second.
// Prints "OK ..." and exits 0 on success; prints the failure and exits 1.
// One thread per rank (--threads N runs N ranks in one process).
// --unmap-race: a forked child drains a memif link while this process streams
// 8000-byte frames into it from one thread and stops the port from another:
// the PMD's memif_disconnect unmaps the shared regions under the running
// burst, as it does on DPDK's interrupt thread when a peer dies. The process
// must survive (the guard in port.cc) and the link must read lost or down.
// --intruder (2 ranks): rank 0 runs with a different token (a process on the
// link that knows everything but the communicator's secret) and sends rank 1
// a 1000-byte message without waiting for its handshake; rank 1 must never
// connect to it nor take its data: it prints "OK intruder rejected" when its
// handshake times out, "FAIL" when it connected or received the bytes.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <rte_ethdev.h>
#include <rte_mbuf.h>

#include <atomic>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/types.h"
#include "transport/dpdk/dpdk_transport.h"
#include "transport/transport.h"

using harp::transport::CommInfo;
using harp::transport::PeerInfo;
using harp::transport::Request;
using harp::transport::Transport;

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string waitFile(const std::string& path, double timeout) {
  double t0 = now();
  for (;;) {
    std::ifstream f(path);
    if (f) {
      std::stringstream ss;
      ss << f.rdbuf();
      std::string s = ss.str();
      if (!s.empty() && s.back() == '\n') return s.substr(0, s.size() - 1);
    }
    if (now() - t0 > timeout) throw std::runtime_error("timed out waiting for " + path);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void writeFile(const std::string& path, const std::string& s) {
  std::string tmp = path + ".tmp";
  std::ofstream(tmp) << s << "\n";
  rename(tmp.c_str(), path.c_str());
}

uint8_t pattern(int src, int dst, int iter, size_t i) {
  return static_cast<uint8_t>((i * 131 + src * 17 + dst * 29 + iter * 7) ^ (i >> 8));
}

void drive(Transport* t, std::vector<Request*>& reqs, double timeout) {
  double t0 = now();
  for (;;) {
    bool all = true;
    for (auto* r : reqs) all &= r->done();
    if (all) return;
    if (!t->progress()) t->wait(10);
    if (now() - t0 > timeout) throw std::runtime_error("requests did not complete within timeout");
  }
}
}  // namespace

// --intruder: rank 0 (wrong token) sends without a handshake; rank 1 must refuse it.
int intruder(Transport* t, int rank, const std::vector<int>& others, const std::vector<std::string>& remote,
             double timeout) {
  std::vector<uint8_t> buf(1000, 0x5a);
  Request r;
  r.buf = buf.data();
  r.len = buf.size();
  r.tag = 42;
  r.peer = 1 - rank;
  if (rank == 0) {
    std::thread c([&] {
      try {
        t->connect(others, remote);
      } catch (const std::exception& e) {
        printf("intruder: handshake failed as expected: %s\n", e.what());
      }
    });
    // connect() sets the peer up at once and then waits for the handshake;
    // meanwhile the data goes out (and is retransmitted by its progress loop).
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    dynamic_cast<harp::dpdk::DpdkTransport*>(t)->isend(1, &r);
    c.join();
    printf("OK intruder done\n");
    return 0;
  }
  try {
    t->connect(others, remote);
  } catch (const std::exception& e) {
    printf("OK intruder rejected: %s\n", e.what());
    return 0;
  }
  t->pair(0)->irecv(&r);
  std::vector<Request*> v{&r};
  try {
    drive(t, v, timeout);
  } catch (const std::exception&) {
  }
  if (r.state == Request::kDone)
    printf("FAIL rank 1: took %zu bytes from rank 0, which never proved the communicator token\n", r.len);
  else
    printf("FAIL rank 1: connected to rank 0, which never proved the communicator token\n");
  return 1;
}

struct Opts {
  int rank = -1, size = 2, iters = 50, threads = 0;
  size_t max_bytes = 1 << 20;
  uint64_t seed = 1;
  std::string dir;
  bool mismatch = false, unmap_race = false, intruder = false;
  size_t bench = 0;
  double timeout = 60;
};

// One rank: connect through files in o.dir, then run the selected check.
int runRank(Opts o, int rank) {
  int size = o.size, iters = o.iters;
  size_t max_bytes = o.max_bytes;
  uint64_t seed = o.seed;
  std::string dir = o.dir;
  bool mismatch = o.mismatch;
  size_t bench = o.bench;
  double timeout = o.timeout;
  try {
    const auto* spec = harp::transport::findTransport("dpdk");
    if (!spec) throw std::runtime_error("the dpdk transport is not registered in this build");
    std::string why = spec->unavailable ? spec->unavailable() : "";
    if (!why.empty()) throw std::runtime_error(why);

    writeFile(dir + "/pid." + std::to_string(rank), std::to_string(getpid()));
    std::vector<PeerInfo> peers(size);
    for (int r = 0; r < size; r++) {
      peers[r].rank = r;
      peers[r].pid = std::stoi(waitFile(dir + "/pid." + std::to_string(r), timeout));
    }
    CommInfo ci;
    ci.rank = rank;
    ci.size = size;
    ci.comm_id = std::hash<std::string>()(dir) | 1;
    ci.token = o.intruder && rank == 0 ? "not-the-token-16" : "selftest-token16";
    ci.timeout_s = timeout;
    std::unique_ptr<Transport> t = spec->create(ci, peers);
    // Everyone publishes one blob (this transport's blob is the same for all peers).
    // localAddress is called for every peer (as the communicator does); this
    // transport publishes the same blob to all of them.
    std::string blob;
    for (int r = 0; r < size; r++)
      if (r != rank) blob = t->localAddress(r);
    writeFile(dir + "/blob." + std::to_string(rank), blob);
    std::vector<int> others;
    std::vector<std::string> remote;
    for (int r = 0; r < size; r++) {
      if (r == rank) continue;
      others.push_back(r);
      remote.push_back(waitFile(dir + "/blob." + std::to_string(r), timeout));
    }
    double tc = now();
    if (o.intruder) return intruder(t.get(), rank, others, remote, timeout);
    t->connect(others, remote);
    fprintf(stderr, "rank %d connected in %.3f s\n", rank, now() - tc);

    if (mismatch) {
      std::vector<uint8_t> buf(1000);
      Request r;
      r.peer = rank == 0 ? 1 : 0;
      r.tag = 42;
      r.buf = buf.data();
      r.len = rank == 0 ? 1000 : 999;
      if (rank == 0) t->pair(1)->isend(&r);
      else if (rank == 1) t->pair(0)->irecv(&r);
      std::vector<Request*> v{&r};
      if (rank <= 1) drive(t.get(), v, timeout);
      if (rank == 1) {
        if (r.state != Request::kFailed || r.failure != Request::kMismatch || r.peer_len != 1000)
          throw std::runtime_error("expected a kMismatch failure with peer_len 1000");
        printf("OK mismatch detected: %s\n", r.error.c_str());
      } else {
        printf("OK sender\n");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      return 0;
    }

    if (bench) {
      if (size != 2) throw std::runtime_error("--bench needs --size 2");
      int peer = 1 - rank;
      std::vector<uint8_t> sb(bench, 1), rb(bench);
      auto pp = [&](int n) {
        for (int i = 0; i < n; i++) {
          Request s, r;
          s.buf = sb.data(); s.len = bench; s.tag = i; s.peer = peer;
          r.buf = rb.data(); r.len = bench; r.tag = i; r.peer = peer;
          std::vector<Request*> v{&s, &r};
          if (rank == 0) {
            t->pair(peer)->isend(&s);
            std::vector<Request*> vs{&s};
            t->pair(peer)->irecv(&r);
            drive(t.get(), v, timeout);
          } else {
            t->pair(peer)->irecv(&r);
            std::vector<Request*> vr{&r};
            drive(t.get(), vr, timeout);
            t->pair(peer)->isend(&s);
            std::vector<Request*> vs{&s};
            drive(t.get(), vs, timeout);
          }
          if (s.state != Request::kDone || r.state != Request::kDone) throw std::runtime_error("bench request failed");
        }
      };
      pp(20);
      int n = bench <= 65536 ? 2000 : 200;
      double t0 = now();
      pp(n);
      double lat = (now() - t0) / n / 2;
      // Streaming: rank 0 sends `window` messages at a time, rank 1 receives.
      int m = std::max<int>(20, static_cast<int>((256u << 20) / std::max<size_t>(bench, 1)));
      m = std::min(m, 20000);
      auto* dt = dynamic_cast<harp::dpdk::DpdkTransport*>(t.get());
      harp::dpdk::ProtocolStats s0 = dt ? dt->stats() : harp::dpdk::ProtocolStats{};
      double t1 = now();
      const int depth = 8;
      std::vector<Request> rq(depth);
      for (int done = 0; done < m;) {
        int k = std::min(depth, m - done);
        std::vector<Request*> v;
        for (int j = 0; j < k; j++) {
          rq[j] = Request{};
          rq[j].buf = rank == 0 ? sb.data() : rb.data();
          rq[j].len = bench;
          rq[j].tag = 1000 + done + j;
          rq[j].peer = peer;
          if (rank == 0) t->pair(peer)->isend(&rq[j]);
          else t->pair(peer)->irecv(&rq[j]);
          v.push_back(&rq[j]);
        }
        drive(t.get(), v, timeout);
        for (auto* r : v)
          if (r->state != Request::kDone) throw std::runtime_error("stream request failed: " + r->error);
        done += k;
      }
      // Final handshake so the sender's clock covers delivery.
      Request fin;
      uint8_t x = 0;
      fin.buf = &x; fin.len = 1; fin.tag = 7; fin.peer = peer;
      if (rank == 0) t->pair(peer)->irecv(&fin); else t->pair(peer)->isend(&fin);
      std::vector<Request*> vf{&fin};
      drive(t.get(), vf, timeout);
      double el = now() - t1;
      double gbps = static_cast<double>(bench) * m / el / 1e9;
      harp::dpdk::ProtocolStats s1 = dt ? dt->stats() : harp::dpdk::ProtocolStats{};
      uint64_t pk = rank == 0 ? (s1.data_tx - s0.data_tx) + (s1.retx - s0.retx) : s1.data_rx - s0.data_rx;
      printf("OK bench size=%zu latency_us=%.2f stream_GBps=%.3f msgs=%d data_pkts=%llu pps=%.0f retx=%llu\n", bench,
             lat * 1e6, gbps, m, (unsigned long long)pk, pk / el, (unsigned long long)(s1.retx - s0.retx));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      return 0;
    }

    std::mt19937_64 rng(seed);
    size_t total_bytes = 0;
    double t0 = now();
    for (int it = 0; it < iters; it++) {
      // sizes[src][dst], identical on all ranks
      std::vector<std::vector<size_t>> sz(size, std::vector<size_t>(size));
      for (int s = 0; s < size; s++)
        for (int d = 0; d < size; d++) {
          uint64_t x = rng();
          switch (x % 6) {
            case 0: sz[s][d] = 0; break;
            case 1: sz[s][d] = 1 + (x >> 8) % 64; break;
            case 2: sz[s][d] = 1 + (x >> 8) % 20000; break;
            default: sz[s][d] = 1 + (x >> 8) % max_bytes; break;
          }
        }
      std::vector<std::vector<uint8_t>> sbuf(size), rbuf(size);
      std::vector<Request> sreq(size), rreq(size);
      std::vector<Request*> all;
      for (int p : others) {
        sbuf[p].resize(sz[rank][p]);
        for (size_t i = 0; i < sbuf[p].size(); i++) sbuf[p][i] = pattern(rank, p, it, i);
        rbuf[p].assign(sz[p][rank], 0xEE);
        rreq[p].buf = rbuf[p].data(); rreq[p].len = rbuf[p].size(); rreq[p].peer = p;
        rreq[p].tag = (uint64_t(it) << 32) | (p << 16) | rank;
        sreq[p].buf = sbuf[p].data(); sreq[p].len = sbuf[p].size(); sreq[p].peer = p;
        sreq[p].tag = (uint64_t(it) << 32) | (rank << 16) | p;
        // Alternate the posting order so both "receive first" and "data first" happen.
        if (it % 2) {
          t->pair(p)->irecv(&rreq[p]);
          t->pair(p)->isend(&sreq[p]);
        } else {
          t->pair(p)->isend(&sreq[p]);
          t->pair(p)->irecv(&rreq[p]);
        }
        all.push_back(&rreq[p]);
        all.push_back(&sreq[p]);
      }
      drive(t.get(), all, timeout);
      for (int p : others) {
        if (sreq[p].state != Request::kDone) throw std::runtime_error("send to rank " + std::to_string(p) + " failed: " + sreq[p].error);
        if (rreq[p].state != Request::kDone) throw std::runtime_error("recv from rank " + std::to_string(p) + " failed: " + rreq[p].error);
        for (size_t i = 0; i < rbuf[p].size(); i++)
          if (rbuf[p][i] != pattern(p, rank, it, i)) {
            char b[200];
            snprintf(b, sizeof b, "iteration %d: byte %zu of %zu from rank %d is 0x%02x, expected 0x%02x", it, i,
                     rbuf[p].size(), p, rbuf[p][i], pattern(p, rank, it, i));
            throw std::runtime_error(b);
          }
        total_bytes += rbuf[p].size();
      }
    }
    double el = now() - t0;
    printf("OK rank %d: %d iterations, %zu bytes received and verified in %.2f s\n", rank, iters, total_bytes, el);
    fflush(stdout);
    // Let peers finish their last acknowledgements before we leave.
    double tend = now();
    while (now() - tend < 0.3) {
      if (!t->progress()) t->wait(1);
    }
    return 0;
  } catch (const std::exception& e) {
    printf("FAIL rank %d: %s\n", rank, e.what());
    fflush(stdout);
    return 1;
  }
}

namespace {
// The peer of --unmap-race: connect to `server` and drain frames until killed.
[[noreturn]] void drainForever(int server, double timeout) {
  harp::dpdk::Link* l = harp::dpdk::Runtime::get().memifLink(server, timeout);
  rte_mbuf* pkts[32];
  double last_restart = now();
  for (;;) {
    if (!l->up()) {
      // A memif client connects when it starts: retry until the server listens,
      // leaving each attempt time for its handshake (as DpdkTransport::connect does).
      if (now() - last_restart > 0.5) {
        l->restart();
        last_restart = now();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    std::lock_guard<std::mutex> g(l->rx_mu);
    int n = l->rx(pkts, 32);
    for (int i = 0; i < n; i++) rte_pktmbuf_free(pkts[i]);
  }
}

int unmapRace(double timeout) {
  int me = getpid();
  pid_t child = fork();
  if (child < 0) throw std::runtime_error("fork failed");
  if (child == 0) drainForever(me, timeout);  // lower pid (this process) serves the link
  auto kill_child = [&] {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  };
  try {
    harp::dpdk::Link* l = harp::dpdk::Runtime::get().memifLink(child, timeout);
    double t0 = now();
    while (!l->up())
      if (now() - t0 > timeout) throw std::runtime_error("memif link to the child never came up");
      else std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::atomic<bool> stop{false};
    std::atomic<long> frames{0};
    std::thread tx([&] {
      rte_mbuf* m[32];
      while (!stop && !l->lost && l->up()) {
        if (rte_pktmbuf_alloc_bulk(l->pool, m, 32) != 0) continue;
        for (auto* b : m) {
          std::memset(rte_pktmbuf_mtod(b, uint8_t*), 0xff, 14);  // broadcast: not delivered locally
          b->data_len = b->pkt_len = 8000;
        }
        l->tx(m, 32);
        frames += 32;
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    long before = frames;
    rte_eth_dev_stop(l->port);  // memif_disconnect: unmaps the regions now
    stop = true;
    tx.join();
    kill_child();
    printf("OK unmap-race: survived; %ld frames streamed before the stop; link %s\n", before,
           l->lost ? "lost (the guard caught the fault in a burst)" : "down (the stop fell between bursts)");
    return before > 0 && (l->lost || !l->up()) ? 0 : 1;
  } catch (const std::exception& e) {
    kill_child();
    printf("FAIL unmap-race: %s\n", e.what());
    return 1;
  }
}
}  // namespace

int main(int argc, char** argv) {
  Opts o;
  int& rank = o.rank; int& size = o.size; int& iters = o.iters; size_t& max_bytes = o.max_bytes;
  uint64_t& seed = o.seed; std::string& dir = o.dir; bool& mismatch = o.mismatch; size_t& bench = o.bench;
  double& timeout = o.timeout;
  (void)rank; (void)size; (void)iters; (void)max_bytes; (void)seed; (void)mismatch; (void)bench; (void)timeout;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("missing value for " + a);
      return argv[++i];
    };
    if (a == "--rank") rank = std::stoi(next());
    else if (a == "--size") size = std::stoi(next());
    else if (a == "--dir") dir = next();
    else if (a == "--iters") iters = std::stoi(next());
    else if (a == "--max-bytes") max_bytes = std::stoull(next());
    else if (a == "--seed") seed = std::stoull(next());
    else if (a == "--mismatch") mismatch = true;
    else if (a == "--bench") bench = std::stoull(next());
    else if (a == "--timeout") timeout = std::stod(next());
    else if (a == "--threads") o.threads = std::stoi(next());
    else if (a == "--unmap-race") o.unmap_race = true;
    else if (a == "--intruder") o.intruder = true;
    else {
      fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (o.unmap_race) return unmapRace(timeout);
  if ((rank < 0 && o.threads == 0) || dir.empty()) {
    fprintf(stderr, "usage: harp_dpdk_selftest --rank R --size N --dir DIR [...]\n");
    return 2;
  }
  if (o.threads > 0) {
    // Ranks as threads of this one process: one EAL, several transports,
    // peers reached through the software loopback link.
    size = o.threads;
    std::vector<int> rc(size, 1);
    std::vector<std::thread> ts;
    for (int r = 0; r < size; r++) ts.emplace_back([&, r] { rc[r] = runRank(o, r); });
    for (auto& t : ts) t.join();
    for (int r = 0; r < size; r++)
      if (rc[r]) return 1;
    return 0;
  }
  return runRank(o, rank);
}