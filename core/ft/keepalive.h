// core/ft/keepalive.h — failure detection by heartbeat, independent of collectives.
//
// A dead (kill -9), frozen (SIGSTOP) or cut-off rank is found within about
// HARP_KEEPALIVE_TIMEOUT seconds, whatever the collective timeout, also while
// every rank is blocked in a collective: each communicator of more than one
// rank runs one KeepAlive, a thread with one UDP socket that sends a 40-byte
// heartbeat to its watched peers every HARP_KEEPALIVE_INTERVAL seconds and
// reports a watched peer silent for HARP_KEEPALIVE_TIMEOUT seconds (held back
// by at most one interval while another peer is about to time out too, so a
// lost host is one report naming all its ranks) to the owner's callback (Communicator: markBroken naming the rank, which tells every
// other peer through the transports' abort notices).
//
// Watched peers: every other rank up to kAllToAllRanks ranks; beyond that the
// two neighbours on each side of the rank ring (each failure is seen by up to
// four ranks, and agree() collects what every rank saw).
//
// Wire (48 bytes): magic "HKA2" | kind (1 beat, 2 bye, 3 dead, 4 probe,
// 5 answer) | 3 bytes: a rank (24-bit LE: kind 3 the rank found gone, 4 the
// rank probed, 5 the prober answered; else 0) | comm id (8) | rank (4) |
// sequence (4) | nonce (8: kinds 4 and 5, else 0) | HMAC-SHA256(key, the first
// 32 bytes) truncated to 16 bytes. The key derives from the communicator's
// secret token, so nobody outside the job can keep a dead rank alive or declare
// a live one gone by sending packets; a replayed packet (sequence not newer) is
// ignored. A bye (sent by stop(), on destroy) retires the sender: it is never
// reported. Beats go only to peers that neither said bye nor were found gone.
//
// A killed process is found faster than the timeout: the socket has IP_RECVERR
// (or IPV6_RECVERR) set, so a beat sent to a peer whose process is gone comes
// back at once as an ICMP "port unreachable" on the error queue, naming the
// address we sent to. ICMP is not authenticated (anyone who can reach the host
// can forge one quoting the two ports), so it is only a hint: the peer is sent
// up to 5 signed probes, HARP_KEEPALIVE_CONFIRM / 5 apart (10 ms), carrying a
// fresh random nonce, and a live peer answers each with a signed answer
// echoing it. An answer clears the suspicion (a forged ICMP costs nothing); no
// answer HARP_KEEPALIVE_CONFIRM (50 ms) after the first probe makes the peer
// gone, reported at once ("its keep-alive port is closed
// and it answers no signed probe"). The rank that found it tells its watched
// peers at once with a signed "dead" packet (the kernel rate-limits ICMP per
// host, so the others' beats may get no reply for a second); a receiver
// reports the rank as the sender did. probeNow() sends a beat to every watched
// peer now (the communicator calls it on a lost-peer error, so the dead rank is
// named within a round trip and the confirmation, not a timeout). A frozen or
// cut-off rank sends no ICMP: only the timeout finds it. Someone who can drop
// the job's packets can still make a live rank look dead (a denial of service,
// never data corruption), through the timeout.
//
// Cost: nothing on the collective path (no shared state is read there). The
// thread sleeps in poll(2) between beats; no busy loop.
//
// Lifetime and threading: create, start() once, stop() (or destroy) once; the
// callback runs on the keep-alive thread, at most once per failed rank, and
// must not call stop(). failed() may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace harp {

class KeepAlive {
 public:
  static constexpr int kAllToAllRanks = 32;
  // ranks newly found failed, and a sentence naming them
  using OnFailure = std::function<void(const std::vector<int>& ranks, const std::string& why)>;

  // Binds a UDP socket on bind_host (port 0). secret: the communicator's token.
  KeepAlive(int rank, int size, uint64_t comm_id, const std::string& secret, double interval_s, double timeout_s,
            const std::string& bind_host);
  ~KeepAlive();
  KeepAlive(const KeepAlive&) = delete;
  KeepAlive& operator=(const KeepAlive&) = delete;

  // "host:port" to publish to the peers.
  std::string localAddress() const;
  // addrs[r]: rank r's localAddress() (this rank's own entry is ignored).
  // describe(r) names a rank in messages ("rank 3 (host, pid 42)").
  void start(const std::vector<std::string>& addrs, std::function<std::string(int)> describe, OnFailure cb);
  // Called on the keep-alive thread at every beat (HARP_KEEPALIVE_INTERVAL);
  // set before start(). The communicator flushes lazy sends there
  // (Transport::flush), so none waits longer than an interval on an idle rank.
  void onBeat(std::function<void()> fn) { on_beat_ = std::move(fn); }
  // Sends a bye to the watched peers, ends the thread, closes the sockets. Idempotent.
  void stop();
  // Ranks found failed so far (sorted).
  std::vector<int> failed() const;
  // A beat to every watched peer now (any thread): a dead peer's ICMP reply
  // reports it within a round trip.
  void probeNow();
  double timeout() const { return timeout_s_; }

 private:
  struct Peer;
  void loop();
  void packet(char* p, uint8_t kind, int arg, uint64_t nonce);
  void sendTo(int peer, const char* p);
  void beat(uint8_t kind, int dead = -1);
  void probeSuspects(double now);
  void told(int from, int dead);
  void receive(double now);
  void receiveErrors(double now);
  void detect(double now);
  std::vector<int> watched() const;

  int rank_, size_;
  uint64_t comm_id_;
  std::string key_;
  double interval_s_, timeout_s_, confirm_s_;  // confirm_s_: HARP_KEEPALIVE_CONFIRM
  int fd_ = -1, wake_fd_ = -1;
  uint32_t seq_ = 0;
  std::vector<Peer> peers_;
  std::vector<int> watch_;
  std::function<std::string(int)> describe_;
  OnFailure cb_;
  std::function<void()> on_beat_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> probe_{false};
  double defer_until_ = 0;  // detect(): a report held back for a peer about to time out too
  std::mutex stop_mu_;  // stop() and probeNow()
  mutable std::mutex mu_;
  std::vector<int> failed_;
};

}  // namespace harp
