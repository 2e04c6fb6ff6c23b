// transport/dpdk/dpdk_transport.cc — the DPDK transport (see dpdk_transport.h
// for threading, PROTOCOL.md for the wire protocol, README.md for settings).
#include "transport/dpdk/dpdk_transport.h"

#include <sched.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <rte_ethdev.h>
#include <rte_mbuf.h>

#include <algorithm>
#include <thread>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "bootstrap/crypto.h"
#include "base/env.h"
#include "base/log.h"
#include "bootstrap/socket.h"
#include "base/types.h"

namespace harp::dpdk {

using transport::CommInfo;
using transport::PeerInfo;
using transport::Request;

namespace {

std::string readFirstLine(const std::string& path) {
  std::ifstream f(path);
  std::string l;
  std::getline(f, l);
  return l;
}

// Field 22 of /proc/<pid>/stat: start time in clock ticks since boot.
uint64_t processStart(int pid) {
  std::string s = readFirstLine("/proc/" + std::to_string(pid) + "/stat");
  auto p = s.rfind(')');
  if (p == std::string::npos) return 0;
  std::istringstream in(s.substr(p + 2));
  std::string f;
  for (int i = 3; i <= 22; i++)
    if (!(in >> f)) return 0;
  return std::strtoull(f.c_str(), nullptr, 10);
}

std::string macStr(const MacAddr& m) {
  char b[32];
  snprintf(b, sizeof b, "%02x:%02x:%02x:%02x:%02x:%02x", m.b[0], m.b[1], m.b[2], m.b[3], m.b[4], m.b[5]);
  return b;
}

bool parseMac(const std::string& s, MacAddr* m) {
  unsigned v[6];
  if (sscanf(s.c_str(), "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6) return false;
  for (int i = 0; i < 6; i++) m->b[i] = static_cast<uint8_t>(v[i]);
  return true;
}

std::map<std::string, std::string> parseBlob(const std::string& b) {
  std::map<std::string, std::string> kv;
  std::stringstream ss(b);
  std::string item;
  while (std::getline(ss, item, ';')) {
    auto eq = item.find('=');
    if (eq != std::string::npos) kv[item.substr(0, eq)] = item.substr(eq + 1);
    else kv[item] = "";
  }
  return kv;
}

void sleepNs(uint64_t ns) {
  timespec ts{static_cast<time_t>(ns / 1000000000ull), static_cast<long>(ns % 1000000000ull)};
  nanosleep(&ts, nullptr);
}

class DpdkPair : public transport::Pair {
 public:
  DpdkPair(DpdkTransport* t, int peer) : t_(t), peer_(peer) {}
  void isend(Request* r) override { t_->isend(peer_, r); }
  void irecv(Request* r) override { t_->irecv(peer_, r); }

 private:
  DpdkTransport* t_;
  int peer_;
};

}  // namespace

DpdkTransport::DpdkTransport(const CommInfo& info, const std::vector<PeerInfo>& peers)
    : info_(info), peer_info_(peers), rt_(&Runtime::get()), peers_(info.size) {
  fault_ = FaultConfig::fromEnv(info.rank);
  rng_ = FaultRng(fault_.seed);
  data_seen_.assign(static_cast<size_t>(info.size), false);
  if (fault_.any()) HARP_WARN("dpdk: fault injection on received frames: %s", fault_.describe().c_str());
  ProtocolConfig pc;
  pc.window = static_cast<int>(env::integer("HARP_DPDK_WINDOW"));
  pc.rto_min_ns = static_cast<uint64_t>(env::real("HARP_DPDK_RTO_MIN_MS") * 1e6);
  pc.peer_timeout_ns = timeoutNs(std::max(info.timeout_s, 1.0));  // saturates (HARP_TIMEOUT=inf)
  pc.stage_bytes = env::bytes("HARP_DPDK_STAGE_BYTES");
  pc.stage_msgs = static_cast<size_t>(std::max<long long>(1, env::integer("HARP_DPDK_STAGE_MSGS")));
  pc.eager_bytes = env::bytes("HARP_DPDK_EAGER_BYTES");
  proto_ = std::make_unique<Protocol>(info.comm_id, info.rank, info.size, this, pc);
  boot_id_ = readFirstLine("/proc/sys/kernel/random/boot_id");
  my_start_ = processStart(getpid());
  link_index_.assign(info.size, -1);
}

DpdkTransport::~DpdkTransport() {
  if (keeper_.joinable()) {
    {
      std::lock_guard<std::mutex> k(keeper_mu_);
      keeper_stop_ = true;
    }
    keeper_cv_.notify_all();
    keeper_.join();
  }
  std::lock_guard<std::mutex> g(mu_);
  const ProtocolStats& st = proto_->stats();
  HARP_INFO("dpdk: comm %016llx closing: data packets tx %llu rx %llu, retransmitted %llu (timeouts %llu), "
            "duplicates %llu, out of order %llu, acks tx %llu rx %llu, staged %llu (dropped %llu), "
            "dropped malformed %llu, dropped before the peer's proof %llu",
            (unsigned long long)info_.comm_id, (unsigned long long)st.data_tx, (unsigned long long)st.data_rx,
            (unsigned long long)st.retx, (unsigned long long)st.timeouts, (unsigned long long)st.dup_rx,
            (unsigned long long)st.ooo_rx, (unsigned long long)st.acks_tx, (unsigned long long)st.acks_rx,
            (unsigned long long)st.staged, (unsigned long long)st.stage_drops, (unsigned long long)st.malformed,
            (unsigned long long)st.unproven);
  for (Link* l : links_)
    HARP_INFO("dpdk: link %s: tx dropped (ring full) %llu, frames for no receiver %llu", l->name.c_str(),
              (unsigned long long)l->tx_drops.load(), (unsigned long long)l->rx_foreign.load());
  if (connected_ && !aborted_) {
    // A small send completes once its data is queued, not when the peer has
    // acknowledged it (Protocol::EagerSend): keep retransmitting until everything is acked (or
    // a bounded wait passes), so a lost frame is not lost for good when this
    // rank closes right after its last collective.
    const uint64_t until = Protocol::nowNs() + timeoutNs(std::min(info_.timeout_s, 10.0));
    while (proto_->hasPending() && Protocol::nowNs() < until) {
      if (!progressLocked()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    sendProofs();
    proto_->broadcastControl(PktType::kBye, "");
    flushTx();
  }
  for (Link* l : links_) l->detach(info_.comm_id, info_.rank);
  for (auto* m : held_) rte_pktmbuf_free(m);
  std::lock_guard<std::mutex> g2(inbox_.mu);
  for (auto* m : inbox_.frames) rte_pktmbuf_free(m);
  inbox_.frames.clear();
}

std::string DpdkTransport::localAddress(int peer) {
  std::string mode = rt_->memifMode() ? "memif" : "l2";
  MacAddr mac;
  uint32_t payload;
  if (rt_->memifMode()) {
    rt_->memifDir();  // every rank checks its socket folder now: a bad one fails all at once
    // memif: the lower pid serves the link; create it now, before the peer
    // (which learns our pid from this blob) connects as the client.
    int ppid = peer < static_cast<int>(peer_info_.size()) ? peer_info_[peer].pid : 0;
    if (ppid > getpid()) rt_->memifLink(ppid, info_.timeout_s);
    payload = static_cast<uint32_t>(env::integer("HARP_DPDK_MTU")) - kHdrLen;
  } else {
    Link* l = rt_->l2Link();
    mac = l->mac;
    payload = l->max_payload;
  }
  std::ostringstream o;
  o << "dpdk1;mode=" << mode << ";port=" << rt_->portSpec() << ";mac=" << macStr(mac) << ";payload=" << payload
    << ";boot=" << boot_id_ << ";pid=" << getpid() << ";start=" << my_start_;
  return o.str();
}

void DpdkTransport::connect(const std::vector<int>& peers, const std::vector<std::string>& remote) {
  std::lock_guard<std::mutex> g(mu_);
  for (size_t i = 0; i < peers.size(); i++) {
    int p = peers[i];
    auto kv = parseBlob(remote[i]);
    if (!kv.count("dpdk1"))
      throw Error(Error::kInvalidArgument, "HARP dpdk: rank " + std::to_string(p) +
                                               " published no dpdk address (is it running the dpdk transport?)");
    std::string mode = rt_->memifMode() ? "memif" : "l2";
    if (kv["mode"] != mode)
      throw Error(Error::kInvalidArgument,
                  "HARP dpdk: rank " + std::to_string(p) + " uses HARP_DPDK_PORT=" + kv["port"] +
                      " but this rank uses HARP_DPDK_PORT=" + rt_->portSpec() + "; all ranks need the same kind");
    PeerLink& pl = peers_[p];
    pl.pid = std::atoi(kv["pid"].c_str());
    pl.start = std::strtoull(kv["start"].c_str(), nullptr, 10);
    pl.same_boot = kv["boot"] == boot_id_;
    uint32_t their_payload = static_cast<uint32_t>(std::strtoul(kv["payload"].c_str(), nullptr, 10));
    if (pl.same_boot && pl.pid == getpid()) {
      pl.link = rt_->loopbackLink();
      std::memset(pl.mac.b, 0xff, 6);
    } else if (rt_->memifMode()) {
      if (!pl.same_boot)
        throw Error(Error::kInvalidArgument,
                    "HARP dpdk: rank " + std::to_string(p) +
                        " is on another host; memif (HARP_DPDK_PORT=memif, the default) only links processes of "
                        "one host: set HARP_DPDK_PORT to a NIC or af_xdp:IFACE / af_packet:IFACE");
      pl.link = rt_->memifLink(pl.pid, info_.timeout_s);
      std::memset(pl.mac.b, 0xff, 6);  // point-to-point: broadcast address
    } else {
      pl.link = rt_->l2Link();
      if (!parseMac(kv["mac"], &pl.mac))
        throw Error(Error::kInvalidArgument, "HARP dpdk: bad MAC '" + kv["mac"] + "' from rank " + std::to_string(p));
      if (pl.mac == pl.link->mac && !(pl.same_boot && pl.pid == getpid()))
        throw Error(Error::kInvalidArgument, "HARP dpdk: rank " + std::to_string(p) +
                                                 " has the same MAC " + kv["mac"] +
                                                 " as this rank: two processes cannot share one port");
    }
    auto it = std::find(links_.begin(), links_.end(), pl.link);
    if (it == links_.end()) {
      links_.push_back(pl.link);
      txbatch_.emplace_back();
      pl.link->attach(info_.comm_id, info_.rank, &inbox_);
      link_index_[p] = static_cast<int>(links_.size() - 1);
    } else {
      link_index_[p] = static_cast<int>(it - links_.begin());
    }
    pl.payload = std::min(pl.link->max_payload, their_payload);
    proto_->setPeer(p, pl.payload);
    pl.pair = std::make_unique<DpdkPair>(this, p);
  }
  connected_ = true;

  // Links up (memif: both ends attached), then a HELLO handshake with each peer.
  for (int p : peers) peers_[p].my_nonce = crypto::nonce();
  uint64_t t0 = Protocol::nowNs();
  uint64_t deadline = t0 + timeoutNs(info_.timeout_s);
  uint64_t last_hello = 0, last_restart = t0;
  for (;;) {
    uint64_t now = Protocol::nowNs();
    bool all = true;
    for (int p : peers) {
      PeerLink& pl = peers_[p];
      if (pl.acked) continue;
      all = false;
      if (pl.link->is_memif && pl.link->memif_server && pl.link->up() && !pl.link->socket_removed.exchange(true)) {
        // Connected: nobody else will use this path (one link per process
        // pair), so remove it now rather than at exit (forked ranks _exit).
        unlink(pl.link->memif_socket.c_str());
      }
      if (!pl.link->up()) {
        if (pl.link->is_memif && !pl.link->memif_server && now - last_restart > 500'000'000ull) {
          pl.link->restart();  // memif clients connect at start: retry
          last_restart = now;
        }
        continue;
      }
      if (now - last_hello > 10'000'000ull) proto_->sendHello(p, helloBody(p), pl.heard ? kFlagHeard : 0);
    }
    if (now - last_hello > 10'000'000ull) last_hello = now;
    if (all) break;
    if (now > deadline) {
      std::string who;
      for (int p : peers)
        if (!peers_[p].acked)
          who += (who.empty() ? "" : ", ") + std::string("rank ") + std::to_string(p) + " via " +
                 peers_[p].link->name + (peers_[p].link->up() ? "" : " (link down)") +
                 (peers_[p].heard ? " (its frames arrive but our " +
                                        std::to_string(peers_[p].payload + kWireOverhead) +
                                        "-byte ones do not reach it: check the path's MTU or lower HARP_DPDK_MTU)"
                                  : "");
      throw Error(Error::kTimeout, "HARP dpdk: no handshake within " + formatSeconds(info_.timeout_s) +
                                       " s from " + who +
                                       " (same L2 segment? does the path's MTU carry HARP's full-size frames? "
                                       "same HARP_DPDK_PORT kind? peer process alive?)");
    }
    progressLocked();
    mu_.unlock();
    sleepNs(200'000);
    mu_.lock();
  }
  for (int p : peers)
    HARP_INFO("dpdk: connected to rank %d via %s, %s", p, peers_[p].link->name.c_str(), describePeer(p).c_str());
  keeper_ = std::thread([this] { keeperLoop(); });
}

std::string DpdkTransport::describePeer(int p) const {
  char b[160];
  snprintf(b, sizeof b, "peer mac %s pid %d%s", macStr(peers_[p].mac).c_str(), peers_[p].pid,
           peers_[p].same_boot ? " (same host)" : "");
  return b;
}

transport::Pair* DpdkTransport::pair(int peer) {
  if (peer < 0 || peer >= info_.size || !peers_[peer].pair)
    throw Error(Error::kInternal, "HARP dpdk: no pair to rank " + std::to_string(peer));
  return peers_[peer].pair.get();
}

void DpdkTransport::isend(int peer, Request* r) {
  std::lock_guard<std::mutex> g(mu_);
  last_progress_ns_.store(Protocol::nowNs(), std::memory_order_relaxed);
  proto_->isend(peer, r);
  proto_->tick();  // start transmitting now: latency
  flushTx();
}

void DpdkTransport::irecv(int peer, Request* r) {
  std::lock_guard<std::mutex> g(mu_);
  proto_->irecv(peer, r);
  flushTx();
}

// ---------------------------------------------------------------- FrameIO
uint8_t* DpdkTransport::begin(int peer, size_t payload) {
  PeerLink& pl = peers_[peer];
  rte_mbuf* m = rte_pktmbuf_alloc(pl.link->pool);
  if (!m) return nullptr;
  if (kWireOverhead + payload > rte_pktmbuf_tailroom(m)) {
    rte_pktmbuf_free(m);
    return nullptr;
  }
  uint8_t* d = rte_pktmbuf_mtod(m, uint8_t*);
  std::memcpy(d, pl.mac.b, 6);
  std::memcpy(d + 6, pl.link->mac.b, 6);
  d[12] = kEtherType >> 8;
  d[13] = kEtherType & 0xff;
  cur_ = m;
  return d + kEthHdrLen;
}

void DpdkTransport::commit(int peer, size_t payload) {
  rte_mbuf* m = cur_;
  cur_ = nullptr;
  m->data_len = static_cast<uint16_t>(kWireOverhead + payload);
  m->pkt_len = m->data_len;
  int li = link_index_[peer];
  txbatch_[li].push_back(m);
  if (txbatch_[li].size() >= 32) {
    links_[li]->tx(txbatch_[li].data(), static_cast<int>(txbatch_[li].size()));
    txbatch_[li].clear();
  }
}

void DpdkTransport::flushTx() {
  for (size_t i = 0; i < links_.size(); i++) {
    if (txbatch_[i].empty()) continue;
    links_[i]->tx(txbatch_[i].data(), static_cast<int>(txbatch_[i].size()));
    txbatch_[i].clear();
  }
}

// ---------------------------------------------------------------- receive path
void DpdkTransport::processFrame(rte_mbuf* m) {
  const WireHdr* h = parseFrame(m);
  if (!h) return;
  PayloadView pv;
  uint32_t want = h->payload_len;
  uint32_t first = m->data_len - kWireOverhead;
  const uint8_t* d = rte_pktmbuf_mtod(m, const uint8_t*) + kWireOverhead;
  uint32_t c = std::min(first, want);
  if (c) {
    pv.p[pv.segs] = d;
    pv.n[pv.segs++] = c;
    pv.total += c;
  }
  for (rte_mbuf* s = m->next; s && pv.total < want && pv.segs < PayloadView::kMaxSegs; s = s->next) {
    c = std::min<uint32_t>(s->data_len, want - pv.total);
    pv.p[pv.segs] = rte_pktmbuf_mtod(s, const uint8_t*);
    pv.n[pv.segs++] = c;
    pv.total += c;
  }
  if (pv.total < want) return;  // truncated frame: drop
  proto_->onFrame(*h, pv);
}

void DpdkTransport::handleFrame(rte_mbuf* m) {
  if (fault_.hold_proofs) {
    const WireHdr* h = parseFrame(m);
    if (h && h->src_rank < data_seen_.size()) {
      if (h->type == static_cast<uint8_t>(PktType::kData)) data_seen_[h->src_rank] = true;
      if (h->type == static_cast<uint8_t>(PktType::kHello) && (h->flags & kFlagHeard) && !data_seen_[h->src_rank]) {
        // Held: the proof is taken out and the HELLO goes on as a first contact carrying only
        // the peer's nonce. Dropping it whole would also hide that nonce, and a peer that heard
        // us before it first wrote sends nothing else: neither side could prove itself (both
        // waited out the timeout, about 1 in 30 pairs on a loaded machine).
        const size_t n = crypto::kNonceBytes;
        if (m->data_len < kWireOverhead + 3 * n) {
          rte_pktmbuf_free(m);
          return;
        }
        auto* w = const_cast<WireHdr*>(h);
        w->flags = static_cast<uint8_t>(w->flags & ~kFlagHeard);
        std::memset(rte_pktmbuf_mtod(m, uint8_t*) + kWireOverhead + n, 0, 2 * n);
      }
    }
  }
  if (fault_.any()) {
    double r = rng_.next();
    if (r < fault_.drop) {
      rte_pktmbuf_free(m);
      return;
    }
    r -= fault_.drop;
    if (r < fault_.reorder) {
      held_.push_back(m);  // delivered after the frames that follow it
      return;
    }
    r -= fault_.reorder;
    if (r < fault_.dup) processFrame(m);
  }
  processFrame(m);
  rte_pktmbuf_free(m);
}

// HELLO body (PROTOCOL.md section 3): our nonce for this peer, the peer's
// nonce we heard (zeros if none yet), and our proof over it (zeros if none).
std::string DpdkTransport::helloBody(int p) const {
  const PeerLink& pl = peers_[p];
  std::string zeros(crypto::kNonceBytes, '\0');
  if (pl.their_nonce.empty()) return pl.my_nonce + zeros + zeros;
  char role = info_.rank < p ? 'A' : 'B';
  return pl.my_nonce + pl.their_nonce + crypto::proof(info_.token, role, pl.their_nonce, pl.my_nonce, helloContext(p));
}

std::string DpdkTransport::helloContext(int p) const {
  char id[17];
  snprintf(id, sizeof id, "%016llx", static_cast<unsigned long long>(info_.comm_id));
  return std::string("dpdk|") + id + "|" + std::to_string(std::min(p, info_.rank)) + "|" +
         std::to_string(std::max(p, info_.rank)) + "|0";
}

// A peer counts as connected once a HELLO from it proves, over the nonce we
// sent it, that it knows the communicator token (and that it heard us).
void DpdkTransport::onHello(const Protocol::Control& c) {
  PeerLink& pl = peers_[c.peer];
  const size_t n = crypto::kNonceBytes;
  if (c.tag != kHelloAuthVersion || c.text.size() < 3 * n || pl.my_nonce.empty()) {
    if (bad_hellos_++ < 5) HARP_WARN("dpdk: ignoring a malformed HELLO claiming rank %d of this communicator", c.peer);
    return;
  }
  pl.their_nonce = c.text.substr(0, n);
  pl.heard = true;
  char role = c.peer < info_.rank ? 'A' : 'B';
  bool proven = crypto::equal(c.text.substr(n, n), pl.my_nonce) &&
                crypto::equal(c.text.substr(2 * n, n),
                              crypto::proof(info_.token, role, pl.my_nonce, pl.their_nonce, helloContext(c.peer)));
  if ((c.flags & kFlagHeard) && !proven && bad_hellos_++ < 5)
    HARP_WARN("dpdk: ignoring a HELLO claiming rank %d with a wrong proof (wrong communicator token, or a replay)",
              c.peer);
  if (proven) proto_->setVerified(c.peer);  // from now on its other frames count
  if ((c.flags & kFlagHeard) && proven && !pl.acked) {
    pl.acked = true;
    // Confirm once, so the peer completes even if it sent no HEARD hello
    // yet and we leave at once (replies are otherwise never answered).
    if (c.flags & kFlagReply) proto_->sendHello(c.peer, helloBody(c.peer), kFlagHeard | kFlagReply);
  }
  if (!(c.flags & kFlagReply)) proto_->sendHello(c.peer, helloBody(c.peer), kFlagHeard | kFlagReply);
}

// Before an ABORT or BYE: our proof once more to every peer we completed the
// handshake with. A peer whose copy of our confirming HELLO was lost has not
// verified us yet and would drop the ABORT/BYE (Protocol::onFrame); this one
// lets it verify us first, so it learns that we left instead of timing out.
void DpdkTransport::sendProofs() {
  for (int p = 0; p < info_.size; p++)
    if (peers_[p].pair && peers_[p].acked && !peers_[p].their_nonce.empty())
      proto_->sendHello(p, helloBody(p), kFlagHeard | kFlagReply);
}

void DpdkTransport::handleControls() {
  auto& cs = proto_->controls();
  if (cs.empty()) return;
  std::vector<Protocol::Control> list;
  list.swap(cs);
  for (auto& c : list) {
    PeerLink& pl = peers_[c.peer];
    switch (c.type) {
      case PktType::kHello:
        onHello(c);
        break;
      case PktType::kAbort:
        pl.acked = true;  // it proved the token (frames of unverified peers never get here)
        proto_->failPeer(c.peer, "rank " + std::to_string(c.peer) + " aborted the communicator: " + c.text);
        break;
      case PktType::kBye:
        pl.acked = true;
        if (!proto_->peerFailed(c.peer))
          proto_->failPeer(c.peer, "rank " + std::to_string(c.peer) + " closed its communicator (connection closed)",
                           /*keep_arrived=*/true);
        break;
      default:
        break;
    }
  }
}

void DpdkTransport::checkLiveness() {
  uint64_t now = Protocol::nowNs();
  if (now - last_live_check_ns_ < 200'000'000ull) return;
  last_live_check_ns_ = now;
  for (int p = 0; p < info_.size; p++) {
    PeerLink& pl = peers_[p];
    if (!pl.pair || proto_->peerFailed(p) || !proto_->peerBusy(p)) continue;
    if (pl.link->lost) {  // the memif PMD closed the link under a burst (port.h)
      proto_->failPeer(p, "rank " + std::to_string(p) + " (pid " + std::to_string(pl.pid) +
                              ") is gone: its memif link closed (the process exited or was killed)");
      continue;
    }
    if (pl.same_boot && pl.pid > 0 && pl.pid != getpid()) {
      bool alive = kill(pl.pid, 0) == 0 || errno == EPERM;
      if (alive && pl.start && processStart(pl.pid) != pl.start) alive = false;
      if (!alive) {
        proto_->failPeer(p, "rank " + std::to_string(p) + " (pid " + std::to_string(pl.pid) +
                                ") has exited: connection over the dpdk transport lost");
        continue;
      }
    }
    uint64_t quiet = now - proto_->lastHeardNs(p);
    if (quiet > 1'000'000'000ull) proto_->sendPing(p);
    if (quiet > timeoutNs(info_.timeout_s))
      proto_->failPeer(p, "rank " + std::to_string(p) + " silent for " + formatSeconds(quiet / 1e9) +
                              " s on the dpdk transport (peer failed or unreachable)");
  }
}

bool DpdkTransport::progressLocked() {
  rte_mbuf* pkts[32];
  // Frames held back by fault injection go in after this round's frames.
  std::vector<rte_mbuf*> held;
  held.swap(held_);
  for (Link* l : links_) {
    if (l->loopback() || !l->rx_mu.try_lock()) continue;
    int n = l->rx(pkts, 32);
    l->rx_mu.unlock();
    for (int i = 0; i < n; i++) {
      const WireHdr* h = parseFrame(pkts[i]);
      if (h && h->comm_id == info_.comm_id && h->dst_rank == static_cast<uint32_t>(info_.rank))
        handleFrame(pkts[i]);
      else
        l->deliver(pkts[i]);  // another communicator of this process, or not ours
    }
  }
  {
    std::lock_guard<std::mutex> g(inbox_.mu);
    inbox_work_.swap(inbox_.frames);
  }
  for (auto* m : inbox_work_) handleFrame(m);
  inbox_work_.clear();
  for (auto* m : held) {
    processFrame(m);
    rte_pktmbuf_free(m);
  }
  handleControls();
  bool moved = proto_->tick();
  handleControls();
  flushTx();
  checkLiveness();
  return moved;
}

// Every 1 ms while data is unacknowledged or an application thread called in
// during the last 100 ms (it may leave unacknowledged data behind, whose acks
// should be taken promptly: they also time the retransmission clock); every
// 20 ms otherwise, so a long-idle communicator costs 50 wake-ups a second.
// It polls also with nothing of ours outstanding: a peer's HELLO still wants
// its reply (our confirmation may have been lost, and that peer waits in its
// handshake while we have left ours, maybe to wait for it in the store), and
// its data wants acknowledging while this rank is out of HARP.
void DpdkTransport::keeperLoop() {
  std::unique_lock<std::mutex> k(keeper_mu_);
  auto period = std::chrono::milliseconds(1);
  while (!keeper_cv_.wait_for(k, period, [&] { return keeper_stop_; })) {
    const uint64_t quiet = Protocol::nowNs() - last_progress_ns_.load(std::memory_order_relaxed);
    period = std::chrono::milliseconds(quiet < 100'000'000 ? 1 : 20);
    if (quiet < 1'000'000) continue;
    std::unique_lock<std::mutex> g(mu_, std::try_to_lock);
    if (!g.owns_lock() || aborted_) continue;
    if (proto_->hasUnackedSends()) period = std::chrono::milliseconds(1);
    progressLocked();
  }
}

bool DpdkTransport::progress() {
  std::lock_guard<std::mutex> g(mu_);
  last_progress_ns_.store(Protocol::nowNs(), std::memory_order_relaxed);
  bool moved = progressLocked();
  if (moved) idle_since_ns_ = 0;
  return moved;
}

// Poll, then back off: busy-poll for a few microseconds, then yield the CPU,
// then sleep in growing steps (bounded by HARP_DPDK_MAX_SLEEP_US), so ranks
// that outnumber cores do not starve each other.
void DpdkTransport::wait(int timeout_ms) {
  static const uint64_t spin_ns = static_cast<uint64_t>(env::integer("HARP_DPDK_SPIN_US")) * 1000;
  static const uint64_t yield_ns = static_cast<uint64_t>(env::integer("HARP_DPDK_YIELD_US")) * 1000;
  static const uint64_t max_sleep_ns = static_cast<uint64_t>(env::integer("HARP_DPDK_MAX_SLEEP_US")) * 1000;
  uint64_t now = Protocol::nowNs();
  if (idle_since_ns_ == 0) idle_since_ns_ = now;
  uint64_t idle = now - idle_since_ns_;
  if (idle < spin_ns) return;
  if (idle < yield_ns) {
    sched_yield();
    return;
  }
  uint64_t s = std::min<uint64_t>({idle / 8, max_sleep_ns, static_cast<uint64_t>(std::max(timeout_ms, 0)) * 1000000});
  if (s < 20'000) {
    sched_yield();
    return;
  }
  sleepNs(s);
}

void DpdkTransport::abort(const std::string& why) {
  std::lock_guard<std::mutex> g(mu_);
  if (aborted_.exchange(true)) return;
  if (connected_) {
    sendProofs();
    proto_->broadcastControl(PktType::kAbort, why);
    flushTx();
  }
  for (int p = 0; p < info_.size; p++)
    if (peers_[p].pair) proto_->failPeer(p, why);
}

// ---------------------------------------------------------------- registration
namespace {
transport::TransportSpec makeSpec() {
  transport::TransportSpec s;
  s.name = "dpdk";
  s.priority = 15;
  s.unavailable = [] { return std::string(); };
  // Chosen automatically only when configured (HARP_DPDK_PORT set); otherwise
  // only when forced with HARP_TRANSPORT=dpdk.
  // (CommOptions::transport is not visible here: forcing through the API alone
  // needs HARP_DPDK_PORT or HARP_TRANSPORT=dpdk in the environment.)
  s.reachable = [](const PeerInfo&, const PeerInfo&) {
    return env::has("HARP_DPDK_PORT") || env::str("HARP_TRANSPORT") == "dpdk";
  };
  s.create = [](const CommInfo& info, const std::vector<PeerInfo>& peers) -> std::unique_ptr<transport::Transport> {
    return std::make_unique<DpdkTransport>(info, peers);
  };
  return s;
}
}  // namespace

HARP_REGISTER_TRANSPORT(makeSpec());

}  // namespace harp::dpdk
