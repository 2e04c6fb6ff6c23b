// transport/tcp/tcp_probe.cc — HARP_SOCKET_NSTREAMS=auto: how many lanes a
// pair keeps, measured once at connect time.
//
// The pair has opened the most lanes auto tries (8). The lower rank sends
// rounds: a ProbeRound header on lane 0 {magic, k, bytes}, then
// HARP_SOCKET_PROBE_BYTES over lanes 0..k-1 together, each 64K piece on
// whichever lane is writable (as adaptive striping would spread a message, so
// a lane slowed by a shared flow cap counts for what it gives); the higher
// rank reads exactly that many bytes from the k lanes and answers one byte on
// lane 0. The sender times each round
// from its first byte to the answer, twice per k (keeping the faster: a rank
// descheduled on a busy host skews one burst), for k = 8, 4, 2, 1: most lanes
// first, so every k is measured on lanes whose congestion windows are open
// (in increasing order the k = 8 round was the first use of lanes 4-7, whose
// slow start made 8 lanes look no better than 4 with a 4 MB probe), and
// always at least k = 8 and k = 1; between them it stops once the probe has
// run 2 s. It keeps the smallest k whose rate is within 5% of the best and
// sends a final round {magic, 0, k}; both ends then close the other lanes.
// Bounded: at most 8 x HARP_SOCKET_PROBE_BYTES (4M) bytes, each step within
// the connect deadline. Logged at INFO with every rate.
//
// Called by TcpTransport::connect with the pairs in increasing peer order on
// every rank, which is one global order of pairs, so probes never wait in a
// cycle. Blocking (poll(2) on the lanes); the sockets are non-blocking.
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "base/env.h"
#include "base/log.h"
#include "transport/tcp/tcp.h"

namespace harp::transport::tcp {
namespace {

struct ProbeRound {
  uint32_t magic;
  uint32_t lanes;  // 0: final round, `bytes` is the decision
  uint64_t bytes;  // over all `lanes` together
};
static_assert(sizeof(ProbeRound) == 16);
constexpr uint32_t kProbeMagic = 0x31505448;  // "HTP1"
constexpr double kProbeBudgetS = 2.0;
constexpr int kProbeRepeats = 2;

// Move `total` bytes over fds together (send from / receive into buf, which
// holds at least kPiece bytes): each writable lane takes the next piece, as
// the transport's adaptive striping does, so the round measures the lanes'
// summed rate, not k x the slowest. Both ends stop at exactly `total` bytes.
constexpr size_t kPiece = 64 * 1024;
void pump(const std::vector<int>& fds, size_t total, bool sending, char* buf, Deadline dl, const std::string& who) {
  size_t done = 0;
  std::vector<pollfd> pfds;
  for (int fd : fds) pfds.push_back({fd, static_cast<short>(sending ? POLLOUT : POLLIN), 0});
  while (done < total) {
    if (dl.passed()) throw Error(Error::kTimeout, "TCP lane probe with " + who + " ran past the connect timeout");
    int r = ::poll(pfds.data(), pfds.size(), std::min(dl.remainingMs(), 1000));
    if (r < 0 && errno != EINTR) throw ErrnoError("poll during the TCP lane probe", errno);
    for (size_t j = 0; r > 0 && j < pfds.size() && done < total; ++j) {
      if (!pfds[j].revents) continue;
      size_t want = std::min(kPiece, total - done);
      ssize_t n = sending ? ::send(pfds[j].fd, buf, want, MSG_NOSIGNAL | MSG_DONTWAIT)
                          : ::recv(pfds[j].fd, buf, want, MSG_DONTWAIT);
      if (n > 0) done += n;
      else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        throw Error(Error::kPeerFailure, who + " broke its TCP connection during the lane probe" +
                                             (n == 0 ? std::string() : std::string(": ") + std::strerror(errno)));
    }
  }
}

void sendRound(TcpPair& p, ProbeRound r, Deadline dl) { sendAll(p.lanes_[0].fd, &r, sizeof r, dl, p.who()); }

ProbeRound recvRound(TcpPair& p, Deadline dl) {
  ProbeRound r{};
  if (!recvAll(p.lanes_[0].fd, &r, sizeof r, dl, p.who()))
    throw Error(Error::kPeerFailure, p.who() + " closed its TCP connection during the lane probe");
  if (r.magic != kProbeMagic) throw Error(Error::kPeerFailure, "bad lane probe round from " + p.who());
  return r;
}

std::vector<int> laneFds(TcpPair& p, size_t k) {
  std::vector<int> fds;
  for (size_t i = 0; i < k; ++i) fds.push_back(p.lanes_[i].fd);
  return fds;
}

}  // namespace

int TcpTransport::probe(TcpPair& p, Deadline dl) {
  const size_t most = p.lanes_.size();
  const size_t bytes = std::max<size_t>(env::bytes("HARP_SOCKET_PROBE_BYTES"), 64 * 1024);
  if (bytes > (256u << 20)) throw InvalidArgument("HARP_SOCKET_PROBE_BYTES must be at most 256M");
  std::vector<char> buf(kPiece);
  char ack = 1;
  if (info_.rank > p.peer_) {  // the higher rank follows the lower rank's rounds
    for (;;) {
      ProbeRound r = recvRound(p, dl);
      if (r.lanes == 0) {
        if (r.bytes < 1 || r.bytes > most) throw Error(Error::kPeerFailure, "bad lane probe decision from " + p.who());
        HARP_INFO("tcp: rank %d to %s: lane probe kept %d lane(s)", info_.rank, p.who().c_str(), (int)r.bytes);
        return static_cast<int>(r.bytes);
      }
      if (r.lanes > most || r.bytes > bytes) throw Error(Error::kPeerFailure, "bad lane probe round from " + p.who());
      pump(laneFds(p, r.lanes), r.bytes, false, buf.data(), dl, p.who());  // exactly r.bytes, any split
      sendAll(p.lanes_[0].fd, &ack, 1, dl, p.who());
    }
  }
  auto start = std::chrono::steady_clock::now();
  std::vector<size_t> ks;  // most lanes first (see above), 1 always
  for (size_t k = 1; k <= most; k *= 2) ks.insert(ks.begin(), k);
  if (ks.front() != most) ks.insert(ks.begin(), most);
  std::vector<std::pair<size_t, double>> rates;  // (lanes, bytes/s)
  for (size_t k : ks) {
    if (k != most && k != 1 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > kProbeBudgetS)
      continue;
    double best_s = 1e30;
    for (int rep = 0; rep < kProbeRepeats; ++rep) {  // best of a few: a descheduled rank skews one burst
      auto t0 = std::chrono::steady_clock::now();
      sendRound(p, {kProbeMagic, static_cast<uint32_t>(k), bytes}, dl);
      pump(laneFds(p, k), bytes, true, buf.data(), dl, p.who());
      if (!recvAll(p.lanes_[0].fd, &ack, 1, dl, p.who()))
        throw Error(Error::kPeerFailure, p.who() + " closed its TCP connection during the lane probe");
      best_s = std::min(best_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    rates.insert(rates.begin(), {k, bytes / std::max(best_s, 1e-9)});  // kept in increasing k
  }
  double best = 0;
  for (auto& [k, r] : rates) best = std::max(best, r);
  size_t keep = rates.back().first;
  for (auto& [k, r] : rates)
    if (r >= 0.95 * best) {
      keep = k;
      break;
    }
  std::string text;
  for (auto& [k, r] : rates) text += " " + std::to_string(k) + ":" + std::to_string((int)(r / 1e6)) + "MB/s";
  sendRound(p, {kProbeMagic, 0, keep}, dl);
  HARP_INFO("tcp: rank %d to %s: lane probe%s -> keep %zu lane(s)", info_.rank, p.who().c_str(), text.c_str(), keep);
  return static_cast<int>(keep);
}

}  // namespace harp::transport::tcp
