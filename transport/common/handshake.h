// transport/common/handshake.h — the authenticated hello that opens every stream
// data-plane connection (tcp sockets, shm's unix sockets), and the driver that
// runs all of a rank's hellos — outgoing and incoming — at once.
//
// Wire format (all integers little-endian, as on every supported host):
//
//   connector A -> acceptor B   HELLO     56 B: u32 magic "HPH1" (0x31485048)
//                                               u32 A's rank, u64 comm_id,
//                                               u32 socket index, u32 0,
//                                               32 B nonce na
//   B -> A                      CHALLENGE 64 B: 32 B nonce nb,
//                                               crypto::proof(key, 'B', na, nb, ctx)
//   A -> B                      RESPONSE  32 B: crypto::proof(key, 'A', nb, na, ctx)
//
//   key = CommInfo::token (any length), ctx = "<transport>|<comm_id hex>|<A>|<B>|<index>".
//
// A checks B's proof before sending its own, B checks A's before the
// connection counts: both ends prove they know the communicator token over a
// nonce the other chose, so a recorded hello cannot be replayed, and the
// context binds each proof to one transport, communicator, rank pair and
// socket. Nothing secret travels. What follows the hello is the transport's
// own traffic, in clear and unauthenticated per message (see SECURITY.md).
//
// Listener rules (denial of service): hellos are read concurrently, each
// unauthenticated connection gets HARP_HANDSHAKE_TIMEOUT seconds (default 5)
// to complete, at most HARP_HANDSHAKE_MAX_PENDING (default 64) may be pending
// (the oldest not yet challenged is dropped for a new one; when all are
// challenged, the new one is closed and its connector retries: a challenged
// connection may count as made at the other end), accept() failing with
// EMFILE/ENFILE drops such a pending connection or pauses accepting for 100 ms
// instead of spinning, and refusals are logged (WARN, at most a few lines per second).
//
// Connector rules: a refused connect to a published listener means the peer
// is gone (PeerError after HARP_HANDSHAKE_REFUSED_S, default 2 s, of refusals);
// a connection closed before the challenge is retried (the listener may have
// shed it under load); an authenticated connection that closes while set-up
// is still running raises PeerError naming the peer.
//
// Threading: one Handshake per transport connect(), used by that thread only
// (lazy set-up: by whoever holds the transport's drive lock).
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/socket.h"

namespace harp::transport {

class Handshake {
 public:
  struct Config {
    std::string transport;  // "tcp", "shm": part of the proof context
    std::string key;        // CommInfo::token
    uint64_t comm_id = 0;
    int rank = 0;           // this process
    std::function<std::string(int)> rank_name;  // "rank 3 (host pid 12)" for messages
    // Optional check of a freshly accepted / connected socket before any byte
    // is exchanged (shm: SO_PEERCRED). Return "" to go on, or why it is refused.
    std::function<std::string(int fd)> vet;
    // Lazy set-up (a transport that connects on first use, tcp's
    // HARP_SOCKET_CONNECT=lazy): the Handshake lives as long as the transport
    // and is driven by step() from its progress and wait. A dial that fails for
    // good (a peer not listening, one that fails to prove itself) is reported by
    // takeFailures() instead of thrown; take() forgets the key, so a second hello
    // for it is refused; authenticated sockets are not watched for EOF (the
    // transport takes them at once).
    bool keep_going = false;
  };

  explicit Handshake(Config cfg);
  ~Handshake();  // closes every socket not taken()
  Handshake(const Handshake&) = delete;
  Handshake& operator=(const Handshake&) = delete;

  // Connect to `peer` (its socket number `index`) at addr and authenticate.
  void dial(int peer, int index, const sockaddr_storage& addr, socklen_t len, std::string addr_text);
  // Wait for `peer` to connect its socket number `index` to listen_fd.
  void expect(int peer, int index);
  // Drive everything until every dial and expect is authenticated. Throws
  // harp::Error: kTimeout (naming the peers missing), kPeerFailure (a peer
  // that closed or stopped listening), kSystem (a listener that failed to
  // authenticate itself). listen_fd may be -1 when nothing is expected.
  void run(int listen_fd, Deadline dl);
  // The authenticated socket (non-blocking, CLOEXEC); ownership passes to the caller.
  int take(int peer, int index);

  // Lazy set-up (Config::keep_going): one round of the driver without blocking;
  // the fds to poll(2) beside the transport's own (listen_fd: -1 for none);
  // whether a dial waits to be retried (the caller then polls briefly); the
  // (peer, index) pairs authenticated and not yet taken; the dials that failed
  // for good since the last call, as (peer, why).
  void step(int listen_fd);
  void addPollFds(int listen_fd, std::vector<pollfd>& out) const;
  bool retryDue() const;
  bool busy() const;  // dials or incoming hellos in flight, or sockets not yet taken
  std::vector<std::pair<int, int>> ready() const;
  std::vector<std::pair<int, std::string>> takeFailures();

  // Wire sizes (tests and PROTOCOL.md).
  static constexpr uint32_t kMagic = 0x31485048;  // "HPH1"
  static constexpr size_t kHelloBytes = 56, kChallengeBytes = 64, kResponseBytes = 32;

 private:
  struct Conn;
  using Key = std::pair<int, int>;  // (peer, index)

  std::string context(int connector, int acceptor, int index) const;
  void startDial(Conn& c);
  void connected(Conn& c, int err);
  void acceptNew(int listen_fd);
  bool stepIncoming(Conn& c);
  bool stepOutgoing(Conn& c);
  bool readInto(Conn& c, size_t want, bool* eof);
  void redial(Conn& c, const char* why);
  void refuse(Conn& c, const std::string& why);
  bool shedOldestPending(const char* why);
  void logRefusal(const std::string& text);
  [[noreturn]] void timeout(Deadline dl);
  void turn(int listen_fd, int timeout_ms, bool awaiting);
  void failed(Conn*& c, const std::string& why);

  Config cfg_;
  std::vector<Conn*> out_;                   // dials
  std::vector<Conn*> pending_;               // accepted, not yet authenticated
  std::map<Key, int> expected_;              // -> fd once authenticated, -1 before
  std::map<Key, int> done_out_;              // dial results
  std::vector<std::pair<int, int>> watch_;   // (fd, peer): authenticated, watched for EOF
  std::vector<std::pair<int, std::string>> failures_;  // keep_going: (peer, why) of dials given up
  size_t untaken_ = 0;                       // authenticated sockets not yet take()n
  double conn_timeout_s_, refused_s_;
  size_t max_pending_;
  long long refusals_ = 0, logged_ = 0;
  double log_window_start_ = 0;
  int log_in_window_ = 0;
  Clock::time_point accept_paused_until_{};
};

}  // namespace harp::transport
