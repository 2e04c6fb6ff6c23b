// core/store.h — the key-value store used for rendezvous (gloo's "store").
//
// A Store is how ranks that know nothing about each other but one address find
// each other: each rank publishes its transport addresses under a key and reads
// everyone else's. HARP ships TcpStore (a server thread on the root, clients on
// every rank, authenticated by the job secret); the torch backend adapts torch's
// own c10d Store to this interface instead.
//
// Threading: a Store object may be used from one thread at a time. The server
// runs its own thread and is safe to destroy from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/socket.h"

namespace harp {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until `key` exists; throws Error(kTimeout) naming the key after timeout_s.
  virtual std::string get(const std::string& key, double timeout_s) = 0;
  // Atomically add `delta` to the integer at key (0 if absent); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
};

// Keys are prefixed, so several communicators can share one store.
class PrefixStore : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> base, std::string prefix)
      : base_(std::move(base)), prefix_(std::move(prefix)) {}
  void set(const std::string& k, const std::string& v) override { base_->set(prefix_ + k, v); }
  std::string get(const std::string& k, double t) override { return base_->get(prefix_ + k, t); }
  int64_t add(const std::string& k, int64_t d) override { return base_->add(prefix_ + k, d); }
  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::shared_ptr<Store> base_;
  std::string prefix_;
};

constexpr size_t kSecretBytes = 32;

// The server side, run by whoever created the unique id (or rank 0).
// Connections that do not present the secret are refused and logged.
class TcpStoreServer {
 public:
  TcpStoreServer(SockAddr bind_addr, std::string secret);
  ~TcpStoreServer();
  const SockAddr& address() const { return addr_; }
  int refusedConnections() const { return refused_; }

 private:
  void loop();
  SockAddr addr_;
  std::string secret_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<int> refused_{0};
};

class TcpStore : public Store {
 public:
  // Connects (retrying until timeout_s) and authenticates with `secret`.
  TcpStore(const SockAddr& server, std::string secret, double timeout_s);
  ~TcpStore() override;
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, double timeout_s) override;
  int64_t add(const std::string& key, int64_t delta) override;
  // Local address of the connection to the server: a route that reaches the root.
  SockAddr localAddress() const;
  const SockAddr& server() const { return server_; }

 private:
  std::string request(uint8_t cmd, const std::string& key, const std::string& value, double timeout_s);
  SockAddr server_;
  int fd_ = -1;
};

}  // namespace harp
