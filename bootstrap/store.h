// bootstrap/store.h — the key-value store used for rendezvous (gloo's "store").
//
// A Store is how ranks that know nothing about each other but one address find
// each other: each rank publishes its transport addresses under a key and reads
// everyone else's. HARP ships TcpStore (a server thread on the root, clients on
// every rank, mutually authenticated by a challenge-response keyed by the job
// secret in which the client proves first, so an outsider learns nothing it
// could test guesses of the secret against; see store.cc); the torch backend
// adapts torch's own c10d Store to this interface instead.
//
// Limits (TcpStore; a client that exceeds one is disconnected and logged):
//   keys  <= kMaxKeyBytes (4 KiB), values <= kMaxValueBytes (64 MiB),
//   keys + values held by one server <= kMaxStoreBytes (256 MiB),
//   unparsed input buffered for one client <= one maximal request,
//   unparsed input buffered for all clients <= kMaxStoreBytes,
//   unauthenticated connections: kHelloDeadlineS (5 s) to finish the hello,
//   at most kMaxPendingHellos at once; for a new one, the source address
//   holding the most loses one, silent or partial hellos before complete
//   ones, the oldest first (store.cc). A client whose connection is shed
//   before the server's verdict dials again (until its timeout), so a flood
//   delays honest ranks instead of failing them.
//
// The optional methods (waitAny, check, setOnClose, setIfAbsent) let the
// rendezvous report problems within seconds (bootstrap/rendezvous.h); a Store that
// does not implement them (the torch adapter) still works, with the plain
// get() timeout as the only diagnosis.
//
// Threading: a Store object may be used from one thread at a time; TcpStore
// serializes its requests (a blocking get holds the others back), so threads
// may share one. The server
// runs its own thread and is safe to destroy from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/socket.h"

namespace harp {

constexpr size_t kMaxKeyBytes = 4096;
constexpr size_t kMaxValueBytes = 64u << 20;
constexpr size_t kMaxStoreBytes = 256u << 20;
constexpr double kHelloDeadlineS = 5.0;
constexpr size_t kMaxPendingHellos = 256;

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until `key` exists; throws Error(kTimeout) naming the key after timeout_s.
  virtual std::string get(const std::string& key, double timeout_s) = 0;
  // Atomically add `delta` to the integer at key (0 if absent); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // --- optional (see the file comment); defaults degrade gracefully ---
  // True when waitAny/check/setOnClose are real (not the fallbacks below).
  virtual bool diagnostics() const { return false; }
  // Waits up to timeout_s for the first of `keys` to exist; returns its index
  // and value, or -1 on timeout (never throws for a timeout). Fallback: get(keys[0]).
  virtual int waitAny(const std::vector<std::string>& keys, double timeout_s, std::string* value) {
    *value = get(keys.at(0), timeout_s);
    return 0;
  }
  // Which of `keys` exist now. Fallback: none known (all false).
  virtual std::vector<bool> check(const std::vector<std::string>& keys) {
    return std::vector<bool>(keys.size(), false);
  }
  // When this client's connection closes (exit, crash, destroy), the server
  // sets key = value unless key exists. Empty value cancels. Fallback: no-op.
  virtual void setOnClose(const std::string& key, const std::string& value) { (void)key, (void)value; }
  // Sets key only if absent; returns true if this call set it. Fallback: set().
  virtual bool setIfAbsent(const std::string& key, const std::string& value) {
    set(key, value);
    return true;
  }
  // A communicator formed over this store (TcpStore: lets the server retire
  // once every client is gone). Fallback: no-op.
  virtual void formed() {}
};

// Keys are prefixed, so several communicators can share one store.
class PrefixStore : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> base, std::string prefix)
      : base_(std::move(base)), prefix_(std::move(prefix)) {}
  void set(const std::string& k, const std::string& v) override { base_->set(prefix_ + k, v); }
  std::string get(const std::string& k, double t) override { return base_->get(prefix_ + k, t); }
  int64_t add(const std::string& k, int64_t d) override { return base_->add(prefix_ + k, d); }
  bool diagnostics() const override { return base_->diagnostics(); }
  int waitAny(const std::vector<std::string>& keys, double t, std::string* v) override {
    return base_->waitAny(prefixed(keys), t, v);
  }
  std::vector<bool> check(const std::vector<std::string>& keys) override { return base_->check(prefixed(keys)); }
  void setOnClose(const std::string& k, const std::string& v) override { base_->setOnClose(prefix_ + k, v); }
  bool setIfAbsent(const std::string& k, const std::string& v) override { return base_->setIfAbsent(prefix_ + k, v); }
  void formed() override { base_->formed(); }
  const std::shared_ptr<Store>& base() const { return base_; }
  const std::string& prefix() const { return prefix_; }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& k : keys) out.push_back(prefix_ + k);
    return out;
  }
  std::shared_ptr<Store> base_;
  std::string prefix_;
};

constexpr size_t kSecretBytes = 32;

// The server side, run by whoever created the unique id (or rank 0).
// Connections that fail the challenge-response are refused and logged.
//
// Lifetime: the server thread ends by itself, closing its port and every
// descriptor, once nothing can use it any more:
//   * a communicator it served has formed (a client sent FORMED) and every
//     client has disconnected — a unique id serves one communicator
//     (bootstrap/rendezvous.h), and split/shrink/grow/agree run over the
//     clients still connected; or
//   * retireWhenIdle() was called (its unique id was dropped) and no
//     authenticated client is connected (at once when none is).
// The object itself is freed by the destructor (which stops the thread now)
// or reaped by bootstrap.cc.
class TcpStoreServer {
 public:
  TcpStoreServer(SockAddr bind_addr, std::string secret);
  ~TcpStoreServer();
  const SockAddr& address() const { return addr_; }
  int refusedConnections() const { return refused_; }
  int droppedConnections() const { return dropped_; }
  bool finished() const { return finished_; }  // the thread has exited and released its fds
  // Retire once no authenticated client is connected. Waits up to wait_s for
  // the thread to act on it; true if it has already finished (it was idle).
  bool retireWhenIdle(double wait_s = 2.0);

 private:
  struct State;
  void loop();
  void wake();
  SockAddr addr_;
  std::string key_;  // crypto::deriveKey(secret, "store")
  int listen_fd_ = -1;
  std::mutex wake_mu_;  // guards wake_fd_, which the thread closes when it ends
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<int> refused_{0};
  std::atomic<int> dropped_{0};
  std::atomic<bool> finished_{false};
  std::atomic<bool> stop_{false}, retire_{false}, retire_seen_{false};
};

class TcpStore : public Store {
 public:
  // Connects and runs the challenge-response with `secret`, dialing again
  // (until timeout_s) when the server sheds the connection before its
  // verdict. Throws kPeerFailure when the server refuses this client's proof
  // (wrong secret) or cannot prove the secret itself, kTimeout at timeout_s.
  // refused_s >= 0: a server that listened already; stop retrying once it has
  // refused for that long (connectTo).
  TcpStore(const SockAddr& server, std::string secret, double timeout_s, double refused_s = -1);
  ~TcpStore() override;
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, double timeout_s) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool diagnostics() const override { return true; }
  int waitAny(const std::vector<std::string>& keys, double timeout_s, std::string* value) override;
  std::vector<bool> check(const std::vector<std::string>& keys) override;
  void setOnClose(const std::string& key, const std::string& value) override;
  bool setIfAbsent(const std::string& key, const std::string& value) override;
  // Tells the server a communicator formed (see TcpStoreServer's lifetime).
  void formed() override;
  // Closes the connection now; later calls throw.
  void close();
  // Local address of the connection to the server: a route that reaches the root.
  SockAddr localAddress() const;
  const SockAddr& server() const { return server_; }

 private:
  std::string request(uint8_t cmd, const std::string& key, const std::string& value, double timeout_s);
  std::string readReply(uint8_t cmd, Deadline dl, const std::string& what);
  // One hello on fd_: "" once both sides are authenticated, else why the
  // server shed the connection (dial again). Throws on a verdict (see above).
  std::string hello(const std::string& key, Deadline dl, const std::string& what);
  void closeFd();
  // One request at a time, so the op-counter publisher thread
  // (core/observe/recorder.h) may share the connection with the communicator.
  std::mutex mu_;
  SockAddr server_;
  SockAddr local_;
  int fd_ = -1;
};

// Request framing, shared by client and server (and the tests): an encoded
// request, and the parser's verdict on a buffer.
namespace store_wire {
enum Cmd : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kOnClose = 5, kSetNx = 6, kFormed = 7 };
constexpr char kHello[8] = {'H', 'A', 'R', 'P', 'S', 'T', 'R', '3'};
std::string encode(uint8_t cmd, const std::string& key, const std::string& value);
// Key lists (GET's extra keys, CHECK): u32 n | n x (u32 len | bytes).
std::string encodeKeys(const std::vector<std::string>& keys);
bool decodeKeys(const std::string& s, size_t off, std::vector<std::string>* out);
// 0 = need more bytes; > 0 = a complete request of that many bytes (cmd, key,
// value filled); < 0 = malformed (bad command or a length over its limit).
long parse(const std::string& in, uint8_t* cmd, std::string* key, std::string* value);
}  // namespace store_wire

}  // namespace harp
