// transport/dpdk/dpdk_transport.h — HARP's DPDK transport: the Transport /
// Pair glue between the communicator, the reliable Protocol (protocol.h) and
// DPDK Links (port.h).
//
// Threading: driven by one thread at a time (transport.h). An internal mutex
// makes abort() safe from any thread; progress/isend/irecv take it too (it is
// uncontended in normal operation). wait() sleeps without it.
#pragma once

#include <atomic>
#include <memory>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "transport/dpdk/fault.h"
#include "transport/dpdk/port.h"
#include "transport/dpdk/protocol.h"
#include "transport/transport.h"

namespace harp::dpdk {

class DpdkTransport : public transport::Transport, public FrameIO {
 public:
  DpdkTransport(const transport::CommInfo& info, const std::vector<transport::PeerInfo>& peers);
  ~DpdkTransport() override;

  const char* name() const override { return "dpdk"; }
  std::string localAddress(int peer) override;
  void connect(const std::vector<int>& peers, const std::vector<std::string>& remote) override;
  transport::Pair* pair(int peer) override;
  bool progress() override;
  void wait(int timeout_ms) override;
  void abort(const std::string& why) override;

  // FrameIO
  uint8_t* begin(int peer, size_t payload) override;
  void commit(int peer, size_t payload) override;

  void isend(int peer, transport::Request* r);
  void irecv(int peer, transport::Request* r);
  const ProtocolStats& stats() const { return proto_->stats(); }
  std::string describePeer(int peer) const;

 private:
  struct PeerLink {
    Link* link = nullptr;
    MacAddr mac;
    int pid = 0;
    uint64_t start = 0;
    bool same_boot = false;
    bool heard = false, acked = false;
    std::string my_nonce, their_nonce;  // HELLO challenge-response (PROTOCOL.md section 3)
    uint32_t payload = 0;  // HARP payload bytes per frame on this pair
    std::unique_ptr<transport::Pair> pair;
  };
  bool progressLocked();
  void keeperLoop();
  void handleFrame(rte_mbuf* m);
  void processFrame(rte_mbuf* m);
  void handleControls();
  void sendProofs();  // a proving HELLO to every connected peer (before ABORT/BYE)
  void onHello(const Protocol::Control& c);
  std::string helloBody(int peer) const;
  std::string helloContext(int peer) const;
  void flushTx();
  void checkLiveness();

  transport::CommInfo info_;
  std::vector<transport::PeerInfo> peer_info_;
  Runtime* rt_;
  std::unique_ptr<Protocol> proto_;
  std::vector<PeerLink> peers_;
  std::vector<Link*> links_;                       // distinct links in use
  std::vector<std::vector<rte_mbuf*>> txbatch_;    // per links_ index
  std::vector<int> link_index_;                    // peer -> links_ index
  Inbox inbox_;
  std::vector<rte_mbuf*> inbox_work_;
  std::vector<rte_mbuf*> held_;                    // fault injection: reordered frames
  FaultConfig fault_;
  std::vector<bool> data_seen_;                    // fault injection (hold_proofs): a DATA frame came from rank i
  FaultRng rng_{1};
  rte_mbuf* cur_ = nullptr;
  int bad_hellos_ = 0;  // rate limit of the warnings
  std::string boot_id_;
  uint64_t my_start_ = 0;
  uint64_t idle_since_ns_ = 0, last_live_check_ns_ = 0;
  std::mutex mu_;
  // Small sends complete before they are acknowledged (Protocol::EagerSend), so
  // their retransmission must not wait for the application to call in again:
  // while nobody drives progress, the keeper thread does (also with nothing
  // outstanding: a peer's handshake or data may want an answer; its periods:
  // keeperLoop()).
  std::thread keeper_;
  std::mutex keeper_mu_;
  std::condition_variable keeper_cv_;
  bool keeper_stop_ = false;
  std::atomic<uint64_t> last_progress_ns_{0};
  bool connected_ = false;
  std::atomic<bool> aborted_{false};
};

}  // namespace harp::dpdk
