// transport/dpdk/port.h — the DPDK side of HARP's DPDK transport: EAL set-up
// (once per process), mbuf pools, and Links (one ethdev port + queue 0).
//
// Two port models (HARP_DPDK_PORT, see README.md):
//   * L2 port (af_packet / af_xdp / a NIC): ONE port per process, shared by
//     every communicator of that process; peers are addressed by MAC.
//   * memif (default): memif is a point-to-point link, so there is one memif
//     port per peer *process* (a cable per peer), shared by every communicator
//     between those two processes. The lower pid is the memif server; its
//     socket lives in a folder only this user can enter (Runtime::memifDir).
//   A peer in this same process is reached through a software loopback link.
//
// Frames for a (communicator, rank) other than the caller's are handed to that
// receiver's Inbox, so several communicators (split) can share a port.
//
// Threading: Runtime::get() and the link factories are thread-safe (one
// mutex). A Link's rx side is guarded by rx_mu (try_lock: whoever holds it
// polls for everyone), its tx side by tx_mu; Inbox has its own lock.
//
// A dying memif peer (DPDK 22.11's PMD, port.cc "memif burst guard"): the PMD
// unmaps the link's shared memory on DPDK's interrupt thread while one of our
// bursts may be copying through it. memif bursts run under a guard that turns
// the resulting fault into a lost link (`lost` set, a warning naming the
// peer's pid) instead of a crash; the transport then fails that peer with a
// PeerError. The guard is a SIGSEGV/SIGBUS handler installed with the first
// memif link; faults outside a guarded burst on a link the PMD has marked down
// go to the handler that was there before (Python's faulthandler, or the
// default action). A SIGSEGV handler installed after it (by the application)
// replaces it, and the old crash comes back.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/dpdk/wire.h"

struct rte_mbuf;
struct rte_mempool;

namespace harp::dpdk {

// Frames waiting for one (communicator, rank) receiver.
struct Inbox {
  std::mutex mu;
  std::vector<rte_mbuf*> frames;
  void push(rte_mbuf* m);
};

class Link {
 public:
  std::string name;         // for messages: "af_packet:vA (port 0)", "memif to pid 1234"
  uint16_t port = 0xffff;   // ethdev port id; 0xffff = software loopback
  MacAddr mac;
  uint32_t max_payload = 0; // HARP payload bytes per frame this link can carry
  unsigned min_room = 0;    // smallest mbuf data room the PMD needs (af_packet frame size)
  rte_mempool* pool = nullptr;
  bool is_memif = false, memif_server = false;
  bool trust_mtu = false;   // the PMD under-reports its frame limit: use the MTU asked for
  std::string memif_socket;
  std::atomic<bool> socket_removed{false};  // memif server: path unlinked once connected
  int peer_pid = 0;                         // memif: the process at the other end
  std::atomic<bool> lost{false};            // memif: the PMD unmapped the link under a burst
  int guard_slot = -1;                      // memif: its burst-guard slots (port.cc), -1: none

  bool loopback() const { return port == 0xffff; }
  bool up();                // link state (loopback: always)
  void restart();           // stop + start (memif client: retry the connection)
  // Receive up to n frames (caller holds rx_mu). Loopback links never receive here.
  int rx(rte_mbuf** pkts, int n);
  // The PMD's own view (no callbacks): has it marked the link down? Safe in a signal handler.
  bool markedDown() const;
  // Transmit frames (takes tx_mu). Frames addressed to this link's own MAC, or
  // on a loopback link, are delivered locally. Returns frames dropped.
  int tx(rte_mbuf** pkts, int n);

  // Dispatch table: (comm_id, dst rank) -> inbox.
  void attach(uint64_t comm, uint32_t rank, Inbox* in);
  void detach(uint64_t comm, uint32_t rank);
  // Hand a frame to its receiver's inbox; frees it when nobody is listening.
  void deliver(rte_mbuf* m);

  std::mutex rx_mu, tx_mu;
  std::atomic<uint64_t> tx_drops{0}, rx_foreign{0};

 private:
  std::mutex disp_mu_;
  std::map<std::pair<uint64_t, uint32_t>, Inbox*> dispatch_;
};

// Parse a frame: returns the HARP header (nullptr when not a HARP frame).
const WireHdr* parseFrame(rte_mbuf* m);

struct HugeStatus {
  bool mounted = false;
  std::string mount_point;
  uint64_t page_kb = 0, total = 0, free = 0;
};
HugeStatus hugepageStatus();

class Runtime {
 public:
  // Initialize DPDK's EAL for this process on first use (throws harp::Error
  // kUnavailable naming what is missing: hugepages, the EAL, the port...).
  static Runtime& get();

  bool memifMode() const { return memif_mode_; }
  std::string portSpec() const { return port_spec_; }
  bool hugepages() const { return huge_; }
  std::string ealArgs() const { return eal_args_; }

  // L2 mode: the configured port, opened on first use.
  Link* l2Link();
  // memif mode: the link to the process `peer_pid` (created on first use).
  Link* memifLink(int peer_pid, double timeout_s);
  // memif mode: the private folder of this user's memif sockets,
  // <HARP_DPDK_MEMIF_DIR>/harp-memif-<euid> (mode 0700), created or checked on
  // first use (throws kUnavailable naming what is wrong with it).
  std::string memifDir();
  // Same-process peers.
  Link* loopbackLink();

 private:
  Runtime();
  void initEal();
  rte_mempool* makePool(const std::string& name, unsigned n, unsigned frame_len);
  void setupPort(Link* l, uint16_t port, unsigned want_mtu);

  std::mutex mu_;
  bool memif_mode_ = true, huge_ = true;
  std::string port_spec_, eal_args_;
  std::unique_ptr<Link> l2_, loop_;
  std::map<int, std::unique_ptr<Link>> memif_;
  rte_mempool* memif_pool_ = nullptr;
  std::string memif_dir_;
  int vdev_seq_ = 0;
};

}  // namespace harp::dpdk
