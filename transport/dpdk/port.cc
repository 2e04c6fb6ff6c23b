// transport/dpdk/port.cc — EAL initialization, hugepage checks, mbuf pools,
// ethdev port set-up and Link rx/tx (see port.h for the model and threading).
#include "transport/dpdk/port.h"

#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_log.h>
#include <rte_mbuf.h>
#include <rte_version.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/env.h"
#include "base/folder.h"
#include "base/log.h"
#include "base/types.h"

namespace harp::dpdk {
namespace {

Error unavailable(const std::string& m) { return Error(Error::kUnavailable, "HARP dpdk: " + m); }

std::string rteErr(int e) { return std::string(rte_strerror(e < 0 ? -e : e)); }

std::vector<std::string> splitWords(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> v;
  std::string w;
  while (in >> w) v.push_back(w);
  return v;
}

std::string cpuList() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return "0";
  std::string out;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &set)) out += (out.empty() ? "" : ",") + std::to_string(c);
  return out.empty() ? "0" : out;
}

bool looksLikePci(const std::string& s) {
  // 0000:03:00.0 or 03:00.0
  return s.find(':') != std::string::npos && s.find('.') != std::string::npos &&
         s.find('=') == std::string::npos && s.rfind("net_", 0) != 0;
}

}  // namespace

void Inbox::push(rte_mbuf* m) {
  std::lock_guard<std::mutex> g(mu);
  frames.push_back(m);
}

HugeStatus hugepageStatus() {
  HugeStatus s;
  std::ifstream mi("/proc/meminfo");
  std::string key;
  uint64_t val;
  std::string line;
  while (std::getline(mi, line)) {
    std::istringstream ls(line);
    if (!(ls >> key >> val)) continue;
    if (key == "HugePages_Total:") s.total = val;
    else if (key == "HugePages_Free:") s.free = val;
    else if (key == "Hugepagesize:") s.page_kb = val;
  }
  std::ifstream mounts("/proc/mounts");
  while (std::getline(mounts, line)) {
    std::istringstream ls(line);
    std::string dev, dir, type;
    ls >> dev >> dir >> type;
    if (type == "hugetlbfs") {
      s.mounted = true;
      s.mount_point = dir;
      break;
    }
  }
  return s;
}

// ---------------------------------------------------------------- Link
bool Link::up() {
  if (loopback()) return true;
  rte_eth_link link;
  std::memset(&link, 0, sizeof link);
  if (rte_eth_link_get_nowait(port, &link) != 0) return false;
  return link.link_status == RTE_ETH_LINK_UP;
}

void Link::restart() {
  if (loopback()) return;
  std::lock_guard<std::mutex> g1(rx_mu);
  std::lock_guard<std::mutex> g2(tx_mu);
  rte_eth_dev_stop(port);
  rte_eth_dev_start(port);
}

bool Link::markedDown() const {
  // For memif (a primary process) link_update only reports success and the
  // status is a plain read of what memif_disconnect wrote first: no lock, no
  // allocation, so this is safe inside the fault handler below.
  rte_eth_link link;
  std::memset(&link, 0, sizeof link);
  return !loopback() && (rte_eth_link_get_nowait(port, &link) != 0 || link.link_status != RTE_ETH_LINK_UP);
}

// ---------------------------------------------------------------- memif burst guard
// DPDK 22.11's memif PMD disconnects a link when the peer's control socket
// closes (the peer died or exited), on DPDK's interrupt thread: it marks the
// link down, then munmaps the shared regions and frees their descriptors
// (memif_disconnect -> memif_free_regions). A burst of ours that checked the
// link before that, and is copying through the rings when the unmap lands,
// faults (SIGSEGV in librte_net_memif: it took 2-3 of 10 killed-peer runs
// here). Nothing outside the PMD can order the two, so memif bursts run under
// a guard: the fault handler sees that the faulting thread is inside a burst
// on a link the PMD has marked down, and jumps back to the burst's caller,
// which marks the link lost. The interrupted burst's mbufs are leaked, never
// freed twice (the PMD may have freed some). Cost per burst: one sigsetjmp
// without a signal mask (no system call) and two atomic stores.
namespace {
struct BurstGuard {
  sigjmp_buf env;
  const Link* link;
  pthread_t owner;
};
// The guards of bursts in progress: slot 2i for the rx side of the i-th memif
// link, 2i+1 for its tx side (each side bursts under its own mutex, so a slot
// holds at most one). Plain atomics, no thread-local storage: the handler
// runs on any thread, and a dlopen-ed module's TLS may allocate on first use.
constexpr int kGuardSlots = 2048;
std::atomic<BurstGuard*> g_active[kGuardSlots];
std::atomic<int> g_slots_used{0};
struct sigaction g_prev_segv, g_prev_bus;

void onFault(int sig, siginfo_t* si, void*) {
  const pthread_t me = pthread_self();
  const int used = g_slots_used.load(std::memory_order_acquire);
  for (int i = 0; i < used; i++) {
    BurstGuard* g = g_active[i].load(std::memory_order_acquire);
    if (g && pthread_equal(g->owner, me) && g->link->markedDown()) {
      g_active[i].store(nullptr, std::memory_order_release);
      siglongjmp(g->env, 1);
    }
  }
  // Not ours: restore the previous disposition; the faulting instruction runs
  // again and faults into it (a signal sent with kill/raise is re-sent).
  sigaction(sig, sig == SIGSEGV ? &g_prev_segv : &g_prev_bus, nullptr);
  if (si->si_code <= 0) raise(sig);
}

// Installs the handler (once) and returns the link's first guard slot, or -1
// when every slot is taken (that link's bursts then run unguarded).
int installBurstGuard() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = onFault;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;  // NODEFER: nothing stays blocked after the jump
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_prev_segv);
    sigaction(SIGBUS, &sa, &g_prev_bus);
  });
  int slot = g_slots_used.fetch_add(2);
  if (slot + 2 <= kGuardSlots) return slot;
  g_slots_used.fetch_sub(2);
  HARP_WARN("dpdk: more than %d memif links: the new link's bursts run without the peer-death guard",
            kGuardSlots / 2);
  return -1;
}

// rx (tx=false) or tx burst on a memif link; -1 when the PMD unmapped the link under it.
int guardedBurst(Link* l, bool tx, rte_mbuf** pkts, int n) {
  auto burst = [&] {
    return tx ? rte_eth_tx_burst(l->port, 0, pkts, static_cast<uint16_t>(n))
              : rte_eth_rx_burst(l->port, 0, pkts, static_cast<uint16_t>(n));
  };
  if (l->guard_slot < 0) return burst();
  std::atomic<BurstGuard*>& slot = g_active[l->guard_slot + (tx ? 1 : 0)];
  BurstGuard g;
  g.link = l;
  g.owner = pthread_self();
  if (sigsetjmp(g.env, 0) != 0) {
    if (!l->lost.exchange(true))
      HARP_WARN("dpdk: %s: the memif PMD unmapped the link during a %s burst (peer pid %d exited, "
                "or the port stopped); the link is closed", l->name.c_str(), tx ? "tx" : "rx", l->peer_pid);
    return -1;
  }
  slot.store(&g, std::memory_order_release);
  int k = burst();
  slot.store(nullptr, std::memory_order_release);
  return k;
}
}  // namespace

// memif: never burst on a link already marked down or lost (see the guard).
int Link::rx(rte_mbuf** pkts, int n) {
  if (loopback()) return 0;
  if (!is_memif) return rte_eth_rx_burst(port, 0, pkts, n);
  if (lost || !up()) return 0;
  return std::max(guardedBurst(this, false, pkts, n), 0);
}

int Link::tx(rte_mbuf** pkts, int n) {
  rte_mbuf* wire[64];
  int nw = 0, dropped = 0;
  for (int i = 0; i < n; i++) {
    const uint8_t* d = rte_pktmbuf_mtod(pkts[i], const uint8_t*);
    if (loopback() || std::memcmp(d, mac.b, 6) == 0) {
      deliver(pkts[i]);
      continue;
    }
    wire[nw++] = pkts[i];
    if (nw == 64 || i == n - 1) {
      std::lock_guard<std::mutex> g(tx_mu);
      int sent = 0;
      bool cut = false;
      for (int attempt = 0; attempt < 4 && sent < nw && !(is_memif && (lost || !up())); attempt++) {
        int k = is_memif ? guardedBurst(this, true, wire + sent, nw - sent)
                         : rte_eth_tx_burst(port, 0, wire + sent, nw - sent);
        if (k < 0) {
          cut = true;  // the PMD may have freed some of them: leak the rest
          break;
        }
        sent += k;
        if (sent < nw) sched_yield();
      }
      if (!cut)
        for (int k = sent; k < nw; k++) rte_pktmbuf_free(wire[k]);  // the protocol retransmits
      dropped += nw - sent;
      nw = 0;
    }
  }
  if (nw) {  // loopback tail (cannot happen: flushed above), kept for safety
    for (int k = 0; k < nw; k++) rte_pktmbuf_free(wire[k]);
    dropped += nw;
  }
  if (dropped) tx_drops += dropped;
  return dropped;
}

void Link::attach(uint64_t comm, uint32_t rank, Inbox* in) {
  std::lock_guard<std::mutex> g(disp_mu_);
  dispatch_[{comm, rank}] = in;
}

void Link::detach(uint64_t comm, uint32_t rank) {
  std::lock_guard<std::mutex> g(disp_mu_);
  dispatch_.erase({comm, rank});
}

void Link::deliver(rte_mbuf* m) {
  const WireHdr* h = parseFrame(m);
  if (h) {
    std::lock_guard<std::mutex> g(disp_mu_);
    auto it = dispatch_.find({h->comm_id, h->dst_rank});
    if (it != dispatch_.end()) {
      it->second->push(m);
      return;
    }
  }
  rx_foreign++;
  rte_pktmbuf_free(m);
}

const WireHdr* parseFrame(rte_mbuf* m) {
  if (m->data_len < kWireOverhead) return nullptr;
  const uint8_t* d = rte_pktmbuf_mtod(m, const uint8_t*);
  uint16_t et = static_cast<uint16_t>(d[12] << 8 | d[13]);
  if (et != kEtherType) return nullptr;
  const WireHdr* h = reinterpret_cast<const WireHdr*>(d + kEthHdrLen);
  if (h->magic != kMagic || h->version != kVersion) return nullptr;
  return h;
}

// ---------------------------------------------------------------- Runtime
Runtime& Runtime::get() {
  static std::mutex mu;
  static Runtime* rt = nullptr;
  static std::string failed;
  std::lock_guard<std::mutex> g(mu);
  if (rt) return *rt;
  if (!failed.empty()) throw unavailable(failed + " (DPDK's EAL can be initialized once per process)");
  try {
    rt = new Runtime();  // lives until exit: DPDK state is process-wide
  } catch (const Error& e) {
    std::string w = e.what();
    failed = w.rfind("HARP dpdk: ", 0) == 0 ? w.substr(11) : w;
    throw;
  }
  return *rt;
}

namespace {
std::mutex g_sock_mu;
std::vector<std::string> g_memif_sockets;  // server sockets to remove at exit
void removeMemifSockets() {
  std::lock_guard<std::mutex> g(g_sock_mu);
  for (auto& s : g_memif_sockets) unlink(s.c_str());
}
}  // namespace

Runtime::Runtime() {
  initEal();
  std::atexit(removeMemifSockets);
}

void Runtime::initEal() {
  port_spec_ = env::str("HARP_DPDK_PORT");
  memif_mode_ = port_spec_ == "memif";
  std::string huge = env::str("HARP_DPDK_HUGE");
  long long mem_mb = env::integer("HARP_DPDK_MEM_MB");
  HugeStatus hs = hugepageStatus();
  uint64_t free_mb = hs.free * hs.page_kb / 1024;
  if (huge == "1" || huge == "yes" || huge == "on") {
    if (!hs.mounted)
      throw unavailable("hugepages requested (HARP_DPDK_HUGE=" + huge +
                        ") but no hugetlbfs is mounted: mount -t hugetlbfs nodev /dev/hugepages, "
                        "or set HARP_DPDK_HUGE=0 to run with --no-huge");
    if (free_mb < static_cast<uint64_t>(mem_mb))
      throw unavailable("hugepages requested (HARP_DPDK_HUGE=" + huge + ") but only " +
                        std::to_string(hs.free) + " of " + std::to_string(hs.total) + " hugepages of " +
                        std::to_string(hs.page_kb) + " kB are free (" + std::to_string(free_mb) +
                        " MB; HARP needs HARP_DPDK_MEM_MB=" + std::to_string(mem_mb) +
                        " MB per process): reserve more with echo N > /proc/sys/vm/nr_hugepages, "
                        "or set HARP_DPDK_HUGE=0 to run with --no-huge");
    huge_ = true;
  } else if (huge == "0" || huge == "no" || huge == "off") {
    huge_ = false;
  } else if (huge == "auto") {
    huge_ = hs.mounted && free_mb >= static_cast<uint64_t>(mem_mb);
    if (!huge_)
      HARP_INFO("dpdk: %s; running DPDK with --no-huge (HARP_DPDK_HUGE=1 makes hugepages mandatory)",
                hs.mounted ? "not enough free hugepages" : "no hugetlbfs mounted");
  } else {
    throw InvalidArgument("HARP_DPDK_HUGE='" + huge + "' must be auto, 1 or 0");
  }

  std::vector<std::string> args = {"harp"};
  char prefix[64];
  snprintf(prefix, sizeof prefix, "harp-%d-%lx", (int)getpid(), (unsigned long)(uintptr_t)this & 0xfffff);
  args.insert(args.end(), {"--file-prefix", prefix, "--no-telemetry", "--lcores", "0@(" + cpuList() + ")"});
  LogLevel lv = logLevel();
  args.push_back("--log-level=" + std::to_string(lv >= LogLevel::kTrace ? RTE_LOG_DEBUG
                                                 : lv >= LogLevel::kInfo ? RTE_LOG_NOTICE
                                                                         : RTE_LOG_ERR));
  if (huge_) {
    args.push_back("--in-memory");
  } else {
    args.insert(args.end(), {"--no-huge", "-m", std::to_string(mem_mb), "--no-shconf"});
  }
  std::string extra = env::str("HARP_DPDK_EAL_ARGS");
  bool wants_pci = looksLikePci(port_spec_) || extra.find("-a ") != std::string::npos ||
                   extra.find("--allow") != std::string::npos;
  if (!wants_pci) args.push_back("--no-pci");
  for (auto& w : splitWords(extra)) args.push_back(w);

  std::ostringstream joined;
  for (size_t i = 1; i < args.size(); i++) joined << (i > 1 ? " " : "") << args[i];
  eal_args_ = joined.str();
  HARP_INFO("dpdk: %s, rte_eal_init %s", rte_version(), eal_args_.c_str());

  static std::vector<std::string> keep;  // the EAL keeps pointers into argv
  keep = args;
  std::vector<char*> argv;
  for (auto& s : keep) argv.push_back(s.data());
  argv.push_back(nullptr);

  // The EAL pins the calling thread to lcore 0's cpuset; keep the caller's.
  cpu_set_t saved;
  bool have_saved = pthread_getaffinity_np(pthread_self(), sizeof saved, &saved) == 0;
  int rc = rte_eal_init(static_cast<int>(keep.size()), argv.data());
  int err = rte_errno;
  if (have_saved) pthread_setaffinity_np(pthread_self(), sizeof saved, &saved);
  if (rc < 0 && err == EALREADY) {
    // Someone in this process (harp.dpdk, the application) brought the EAL up.
    HARP_INFO("dpdk: the EAL was already initialized in this process; using it");
    eal_args_ = "(initialized by the application)";
    huge_ = rte_eal_has_hugepages();
    return;
  }
  if (rc < 0)
    throw unavailable("rte_eal_init failed (" + rteErr(err) + ") with EAL arguments: " + eal_args_ +
                      (huge_ ? " (hugepage mode; HARP_DPDK_HUGE=0 runs without hugepages)" : ""));
}

rte_mempool* Runtime::makePool(const std::string& name, unsigned n, unsigned frame_len) {
  unsigned room = RTE_PKTMBUF_HEADROOM + std::max(frame_len, 2048u);
  rte_mempool* p = rte_pktmbuf_pool_create(name.c_str(), n, 256, 0, room, rte_socket_id());
  if (!p)
    throw unavailable("cannot create mbuf pool '" + name + "' (" + std::to_string(n) + " x " +
                      std::to_string(room) + " B): " + rteErr(rte_errno) +
                      (huge_ ? "; hugepage memory exhausted? reserve more pages, lower HARP_DPDK_MBUFS, "
                               "or set HARP_DPDK_HUGE=0"
                             : "; raise HARP_DPDK_MEM_MB or lower HARP_DPDK_MBUFS"));
  return p;
}

void Runtime::setupPort(Link* l, uint16_t port, unsigned want_mtu) {
  rte_eth_dev_info info;
  int rc = rte_eth_dev_info_get(port, &info);
  if (rc != 0) throw unavailable("rte_eth_dev_info_get(" + l->name + "): " + rteErr(rc));
  unsigned mtu = want_mtu;
  if (info.max_mtu) mtu = std::min<unsigned>(mtu, info.max_mtu);
  if (info.max_rx_pktlen > kEthHdrLen) mtu = std::min<unsigned>(mtu, info.max_rx_pktlen - kEthHdrLen);
  mtu = std::max<unsigned>(mtu, 256);
  unsigned mbufs = static_cast<unsigned>(env::integer("HARP_DPDK_MBUFS"));
  if (!l->pool) l->pool = makePool("harp_l2_" + std::to_string(port), mbufs, std::max<unsigned>(mtu + kEthHdrLen, l->min_room));

  rte_eth_conf conf;
  std::memset(&conf, 0, sizeof conf);
  conf.rxmode.mtu = mtu;
  rc = rte_eth_dev_configure(port, 1, 1, &conf);
  if (rc != 0 && mtu > 1500) {
    mtu = 1500;
    conf.rxmode.mtu = mtu;
    rc = rte_eth_dev_configure(port, 1, 1, &conf);
  }
  if (rc != 0) throw unavailable("rte_eth_dev_configure(" + l->name + "): " + rteErr(rc));
  uint16_t nrx = 1024, ntx = 1024;
  rte_eth_dev_adjust_nb_rx_tx_desc(port, &nrx, &ntx);
  int sock = rte_eth_dev_socket_id(port);
  if (sock < 0) sock = 0;
  rc = rte_eth_rx_queue_setup(port, 0, nrx, sock, nullptr, l->pool);
  if (rc != 0) throw unavailable("rx queue set-up on " + l->name + ": " + rteErr(rc));
  rc = rte_eth_tx_queue_setup(port, 0, ntx, sock, nullptr);
  if (rc != 0) throw unavailable("tx queue set-up on " + l->name + ": " + rteErr(rc));
  // Jumbo frames where the port allows: ask for the MTU; keep what it accepts.
  // Not on a port whose reported limit is known to be wrong (trust_mtu): af_packet
  // would push the clamped value down to the kernel interface's MTU.
  if (!l->trust_mtu && rte_eth_dev_set_mtu(port, mtu) != 0) {
    uint16_t cur = 0;
    if (rte_eth_dev_get_mtu(port, &cur) == 0 && cur >= 256) mtu = std::min<unsigned>(mtu, cur);
    else mtu = std::min<unsigned>(mtu, 1500);
  }
  rc = rte_eth_dev_start(port);
  // A memif client cannot start before its server listens; connect() retries.
  if (rc != 0 && !(l->is_memif && !l->memif_server))
    throw unavailable("rte_eth_dev_start(" + l->name + "): " + rteErr(rc));
  rte_ether_addr a;
  rte_eth_macaddr_get(port, &a);
  std::memcpy(l->mac.b, a.addr_bytes, 6);
  l->port = port;
  // memif carries frames of any length (it chains descriptors of bsize bytes)
  // although it reports a 1518-byte maximum: use the configured MTU there.
  if (l->is_memif || l->trust_mtu) mtu = want_mtu;
  l->max_payload = mtu - kHdrLen;
  HARP_INFO("dpdk: port %u (%s) up: mtu %u, %u payload bytes per frame, driver %s", port, l->name.c_str(), mtu,
            l->max_payload, info.driver_name);
}

static uint16_t probePort(const std::string& devargs, const std::string& what) {
  std::string name = devargs.substr(0, devargs.find(','));
  int rc = rte_dev_probe(devargs.c_str());
  if (rc != 0)
    throw unavailable("could not open port " + what + ": rte_dev_probe(\"" + devargs + "\") failed: " + rteErr(rc));
  uint16_t port;
  if (rte_eth_dev_get_port_by_name(name.c_str(), &port) != 0)
    throw unavailable("port " + what + " probed but no ethdev named " + name + " appeared");
  return port;
}

Link* Runtime::l2Link() {
  std::lock_guard<std::mutex> g(mu_);
  if (l2_) return l2_.get();
  auto l = std::make_unique<Link>();
  const std::string& s = port_spec_;
  unsigned mtu = static_cast<unsigned>(env::integer("HARP_DPDK_MTU"));
  uint16_t port;
  auto needIface = [&](const std::string& iface) {
    if (iface.empty() || if_nametoindex(iface.c_str()) == 0)
      throw unavailable("HARP_DPDK_PORT=" + s + ": there is no network interface '" + iface +
                        "' in this network namespace (see ip link)");
    // A kernel interface's MTU is the administrator's (and its link partner's)
    // setting: use at most that, never raise it.
    std::ifstream f("/sys/class/net/" + iface + "/mtu");
    unsigned kmtu = 0;
    if (f >> kmtu && kmtu >= 256) mtu = std::min(mtu, kmtu);
  };
  if (s.rfind("af_packet:", 0) == 0) {
    std::string iface = s.substr(10);
    needIface(iface);
    l->name = s;
    // af_packet's ring frames must fit in one mbuf: size them to the MTU.
    unsigned framesz = 2048;
    while (framesz < mtu + kEthHdrLen + 64) framesz *= 2;
    l->min_room = framesz;
    // DPDK 22.11's af_packet reports a 1518-byte frame limit to ethdev, but its
    // rx/tx paths carry whole ring frames (framesz, sized above): jumbo frames
    // up to the interface's MTU work, so use that MTU.
    l->trust_mtu = true;
    port = probePort("net_af_packet_harp,iface=" + iface + ",qpairs=1,blocksz=" + std::to_string(std::max(framesz, 4096u)) +
                         ",framesz=" + std::to_string(framesz) + ",framecnt=1024",
                     s);
  } else if (s.rfind("af_xdp:", 0) == 0) {
    std::string iface = s.substr(7);
    needIface(iface);
    l->name = s;
    // DPDK 22.11's af_xdp receives into 2 KB umem chunks: frames above a
    // 1500-byte MTU are dropped whatever the interface's MTU says.
    mtu = std::min(mtu, 1500u);
    port = probePort("net_af_xdp_harp,iface=" + iface + ",start_queue=0,queue_count=1", s);
  } else if (s.rfind("net_", 0) == 0) {
    l->name = s;
    port = probePort(s, s);
  } else if (!s.empty() && s.find_first_not_of("0123456789") == std::string::npos) {
    port = static_cast<uint16_t>(std::stoi(s));
    if (!rte_eth_dev_is_valid_port(port))
      throw unavailable("HARP_DPDK_PORT=" + s + ": no DPDK port " + s + " (" +
                        std::to_string(rte_eth_dev_count_avail()) +
                        " ports available; add devices with HARP_DPDK_EAL_ARGS)");
    l->name = "port " + s;
  } else {
    if (rte_eth_dev_get_port_by_name(s.c_str(), &port) != 0)
      throw unavailable("HARP_DPDK_PORT=" + s + ": no DPDK port of that name (use memif, af_packet:IFACE, "
                        "af_xdp:IFACE, a vdev string net_...,k=v, a port number or a PCI address)");
    l->name = s;
  }
  setupPort(l.get(), port, mtu);
  l2_ = std::move(l);
  return l2_.get();
}

// <HARP_DPDK_MEMIF_DIR>/harp-memif-<euid>, mode 0700: only this user can enter
// it, so nobody else can take a socket's name first or connect to it. An
// existing one is used only when it is a real folder of this user, closed to
// others (whoever prepared it otherwise could reach the sockets inside).
std::string Runtime::memifDir() {
  std::lock_guard<std::mutex> g(mu_);
  if (!memif_dir_.empty()) return memif_dir_;
  const unsigned uid = geteuid();
  std::string dir = env::str("HARP_DPDK_MEMIF_DIR") + "/harp-memif-" + std::to_string(uid);
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw unavailable("cannot create the memif socket folder " + dir + ": " + strerror(errno) +
                      " (HARP_DPDK_MEMIF_DIR names its parent)");
  const FolderState st = inspectFolder(dir, uid);
  const std::string fix = ": remove it, or set HARP_DPDK_MEMIF_DIR to another parent folder";
  switch (st.kind) {
    case FolderState::kPrivate: break;
    case FolderState::kMissing: throw unavailable("cannot stat " + dir + ": " + strerror(st.err));
    case FolderState::kSymlink:
    case FolderState::kNotFolder:
      throw unavailable("the memif socket folder " + dir + " is not a folder (a symlink or file someone put there?)" +
                        fix);
    case FolderState::kOtherOwner:
      throw unavailable("the memif socket folder " + dir + " belongs to uid " + std::to_string(st.uid) +
                        ", not to this user (uid " + std::to_string(uid) + "): whoever made it can reach its sockets" +
                        fix);
    case FolderState::kOpen: {
      char mode[8];
      snprintf(mode, sizeof mode, "%04o", st.mode);
      throw unavailable("the memif socket folder " + dir + " is open to other users (mode " + mode +
                        "): chmod 700 it, or remove it" + fix.substr(fix.find(',')));
    }
  }
  memif_dir_ = dir;
  return dir;
}

Link* Runtime::memifLink(int peer_pid, double timeout_s) {
  std::string dir = memifDir();
  std::lock_guard<std::mutex> g(mu_);
  auto it = memif_.find(peer_pid);
  if (it != memif_.end()) return it->second.get();
  unsigned mtu = static_cast<unsigned>(env::integer("HARP_DPDK_MTU"));
  if (!memif_pool_)
    memif_pool_ = makePool("harp_memif", static_cast<unsigned>(env::integer("HARP_DPDK_MBUFS")),
                           mtu + kEthHdrLen);
  int me = getpid();
  bool server = me < peer_pid;
  std::string sock = dir + "/harp-memif-" + std::to_string(std::min(me, peer_pid)) + "-" +
                     std::to_string(std::max(me, peer_pid)) + ".sock";
  if (server) {
    unlink(sock.c_str());
    std::lock_guard<std::mutex> g2(g_sock_mu);
    g_memif_sockets.push_back(sock);
  }
  auto l = std::make_unique<Link>();
  l->name = "memif to pid " + std::to_string(peer_pid) + " (" + sock + ")";
  l->pool = memif_pool_;
  l->is_memif = true;
  l->memif_server = server;
  l->memif_socket = sock;
  l->peer_pid = peer_pid;
  l->guard_slot = installBurstGuard();
  std::string dev = "net_memif_h" + std::to_string(vdev_seq_++);
  std::string devargs = dev + ",role=" + (server ? "server" : "client") + ",id=0,socket=" + sock +
                        ",socket-abstract=no,bsize=" + std::to_string(std::max(2048u, mtu + 128)) + ",rsize=9";
  uint16_t port = probePort(devargs, l->name);
  setupPort(l.get(), port, mtu);
  Link* raw = l.get();
  memif_[peer_pid] = std::move(l);
  (void)timeout_s;
  return raw;
}

Link* Runtime::loopbackLink() {
  std::lock_guard<std::mutex> g(mu_);
  if (!loop_) {
    loop_ = std::make_unique<Link>();
    loop_->name = "loopback (same process)";
    unsigned mtu = static_cast<unsigned>(env::integer("HARP_DPDK_MTU"));
    if (!memif_pool_ && !l2_)
      memif_pool_ = makePool("harp_loop", static_cast<unsigned>(env::integer("HARP_DPDK_MBUFS")),
                             mtu + kEthHdrLen);
    loop_->pool = l2_ ? l2_->pool : memif_pool_;
    loop_->max_payload = (l2_ ? l2_->max_payload + kHdrLen : mtu) - kHdrLen;
  }
  return loop_.get();
}

}  // namespace harp::dpdk
