// bench/sim/replay/harp_replay.cc — harp_replay: replays a HARP schedule
// (bench/sim/emit/schedule.h's text, as harp_sched writes it) in SimGrid's C++
// S4U API. The same model as bench/sim/replay.py (the Python reference), so
// the arena calibration carries over:
//
//   * one actor per rank runs its operations in order; S: spend the send
//     overhead (sleep), then an asynchronous put of <bytes> (at least 1) on the
//     mailbox "<src>><dst>:<comm>" (one mailbox per directed pair and
//     connection set: HARP's per-pair FIFO matching); V: an asynchronous get on
//     that mailbox; W: wait for the listed requests; X: execute <bytes> /
//     reduce_Bps seconds of local work on the rank's core;
//   * every mailbox a rank receives on has that rank as its permanent receiver,
//     so a send moves bytes as soon as it is posted (TCP's eager socket
//     buffers), not when the receive is posted;
//   * the platform (bench/sim/platforms.py's build()): hosts x ranks per host,
//     full zones; a rank's memory link (shm rate and latency) that its shm
//     receives cross (the receiver copies), and a port to its host's router; the host's split-duplex NIC (rtt / 4 latency
//     each way) and, where set, a FATPIPE per-flow cap; network/model CM02,
//     network/TCP-gamma = the TCP window;
//   * the arena's tbf bucket (burst_B > 0): the NICs run at burst_Bps, and each
//     inter-host message is charged to the sender host's up bucket and the
//     receiver host's down bucket (refill link_Bps, depth burst_B); a message
//     the buckets do not cover is held by a helper actor until they have
//     refilled the debt, then put (the rank goes on at once);
//   * one TCP stream per connection (directed pair and connection set) between
//     hosts, where a per-flow cap is set: a connection's messages share its
//     cap, back to back. A message may start moving once the connection's
//     earlier messages have had their bytes at the cap's rate (its "free"
//     time); the rank's pump actor starts it then (and holds it for the
//     bucket too, where both apply). Messages
//     in flight together on one pair (the ring's segments of a chunk) so
//     take the cap once, not once each; latencies still overlap, as a stream's
//     do. Where the NIC's share, not the cap, limits a flow, the next message
//     may start while the previous still moves: they then share the NIC.
//     --per-message-cap: each message its own flow at the cap (comparison);
//   * cores > 0 (the arena: every emulated host on one machine's cores): each
//     message's CPU and every X runs on one shared host of that many cores, so
//     ranks busy at once queue for them; cores = 0: each rank its own core;
//   * rendezvous_B > 0: a message of more bytes moves only once its receive
//     is posted (its own mailbox, with no permanent receiver), as a TCP
//     sender stalls once the socket buffers hold what the receiver has not
//     asked for; without it a rank a step ahead (the next iteration's
//     exchange) pushes a whole large message into a link another message
//     needs. Matching stays per pair and FIFO within each class (a send and
//     its receive have the same bytes in harp_sched's output);
//   * sndbuf_B > 0: a send between hosts of at most sndbuf_B bytes is done
//     once posted, as a TCP send is once the kernel's socket buffer took it
//     (HARP's tcp isend completes when its bytes are written): a W on it
//     returns at once, while its bytes still move and arrive as before. 0
//     (the default): a send is done when its bytes have arrived. Not with a
//     per-flow cap (a connection's stream keeps its messages' order);
//   * wake_s > 0 with cores > 0 and more ranks than cores: a W that blocks
//     (a request still incomplete when it starts) returns wake_s x (ranks -
//     cores) / cores after its last request completes: the woken rank waits
//     for a core behind the others (calibrate.py fits it on the arena);
//   * runq > 0 with cores > 0: the shared cores are instead a run queue. A
//     rank runs on a core (one of `cores` tokens) from its start until a W
//     blocks; then it gives the core up, and when its requests complete it
//     waits in line for a core (first come first served) and spends wake_s
//     on it (the wake-up, the receive) before it goes on. While it holds a
//     core its send overheads and X lines run at the core's full rate. Ranks
//     whose wake-ups do not meet pay no queue (the arena at RTT 1 ms, where
//     the ranks of a ring fall out of step); ranks that all wake at once
//     leave in turn, not all late together as on shared cores. A rank's lane
//     (A/E/J) does not take a core of its own;
//   * spin_s > 0 with runq: a W first polls on its core for up to spin_s, as
//     HARP's wait polls before it blocks; what arrives meanwhile costs no
//     wake-up, and the core stays taken (on oversubscribed cores a spinner
//     may hold the core its sender needs). spin_bytes > 0: a W on more pending
//     bytes than that does not spin (HARP_SPIN_BYTES);
//   * A/E/J lines (a rank's lane: rail's asynchronous legs): a second actor per
//     such rank runs the jobs in the order posted; J waits for one;
//   * iterations > 1: the schedule runs that many times back to back (no
//     barrier); the result is the mean of the iterations after the first
//     `warmup` (default 1), as a benchmark times its loop after its warm-up
//     calls: a token bucket that the warm-up left half full is in the timed
//     mean as it is in the measured one.
//
// Usage:
//   harp_replay --spec hosts=8,local=8,link_Bps=3.125e9,rtt_s=1e-3,...
//               [--iterations N] [--warmup W] [--factory raw|ucontext|thread]
//               [--fatpipe-cap] [--per-message-cap] [--shared-mem-link] [SCHEDULE|-]
// Prints "sim-seconds S", "messages M", "wall-seconds W" (the replay's own
// run time). Spec keys are platforms.Spec's fields; unknown keys, malformed
// numbers and schedules that do not parse are errors naming the culprit.
//
// Threading: SimGrid runs the actors one at a time (cooperative contexts).
#include <simgrid/s4u.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace sg4 = simgrid::s4u;

namespace {
int g_payload;  // SimGrid refuses a null payload; every message carries this address, never read

struct Spec {
  int hosts = 0, local = 1;
  double link_Bps = 119.6e6, rtt_s = 42e-6, flow_cap_Bps = 0, shm_Bps = 8e9, shm_lat_s = 1e-6, reduce_Bps = 3e9,
         send_overhead_s = 5e-6, tcp_window_B = 4 * 1024 * 1024, burst_B = 0, burst_Bps = 0, wake_s = 0,
         sndbuf_B = 0, spin_s = 0, spin_bytes = 0, rendezvous_B = 0;
  int cores = 0;  // > 0: every rank's CPU work runs on one shared host of this many cores
  int runq = 0;   // > 0 with cores: a rank holds a core while it runs, queues for one when it wakes
  // A wait that blocks ends this much after its last request: wake_s per rank beyond the
  // cores (more ranks than cores: a woken rank queues behind the running ones).
  double wakeSeconds() const {
    return cores > 0 && !runq && ranks() > cores ? wake_s * (ranks() - cores) / cores : 0;
  }
  double nic_Bps() const { return burst_B > 0 ? burst_Bps : link_Bps; }
  int ranks() const { return hosts * local; }
};

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "harp_replay: %s\n", why.c_str());
  std::exit(2);
}

double number(const std::string& key, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end || errno || !std::isfinite(x) || x < 0)
    fail("--spec " + key + "=" + v + ": not a finite number >= 0");
  return x;
}

Spec parseSpec(const std::string& s) {
  Spec sp;
  std::map<std::string, double*> dbl = {
      {"link_Bps", &sp.link_Bps},         {"rtt_s", &sp.rtt_s},       {"flow_cap_Bps", &sp.flow_cap_Bps},
      {"shm_Bps", &sp.shm_Bps},           {"shm_lat_s", &sp.shm_lat_s}, {"reduce_Bps", &sp.reduce_Bps},
      {"send_overhead_s", &sp.send_overhead_s}, {"tcp_window_B", &sp.tcp_window_B},
      {"burst_B", &sp.burst_B},           {"burst_Bps", &sp.burst_Bps}, {"wake_s", &sp.wake_s},
      {"sndbuf_B", &sp.sndbuf_B},         {"spin_s", &sp.spin_s},
      {"spin_bytes", &sp.spin_bytes},     {"rendezvous_B", &sp.rendezvous_B}};
  std::stringstream in(s);
  std::string kv;
  while (std::getline(in, kv, ',')) {
    if (kv.empty()) continue;
    auto eq = kv.find('=');
    if (eq == std::string::npos) fail("--spec: '" + kv + "' is not key=value");
    std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    if (k == "hosts" || k == "local" || k == "cores" || k == "runq") {
      double x = number(k, v);
      const double least = k == "cores" || k == "runq" ? 0 : 1;
      if (x < least || x > 1 << 20 || x != std::floor(x))
        fail("--spec " + k + "=" + v + ": not a count >= " + std::to_string(static_cast<int>(least)));
      (k == "hosts" ? sp.hosts : k == "local" ? sp.local : k == "cores" ? sp.cores : sp.runq) = static_cast<int>(x);
    } else if (auto it = dbl.find(k); it != dbl.end()) {
      *it->second = number(k, v);
    } else {
      fail("--spec: unknown key '" + k + "'");
    }
  }
  if (sp.hosts < 1) fail("--spec needs hosts=N");
  if (sp.link_Bps <= 0 || sp.shm_Bps <= 0 || sp.reduce_Bps <= 0) fail("--spec: rates must be > 0");
  if (sp.burst_B > 0 && sp.burst_Bps <= 0) fail("--spec: burst_B needs burst_Bps > 0");
  if (sp.runq > 0 && sp.cores < 1) fail("--spec: runq needs cores >= 1 (the cores it queues for)");
  if (sp.spin_s > 0 && sp.runq < 1) fail("--spec: spin_s needs runq (a spin holds one of its cores)");
  if (sp.rendezvous_B > 0 && sp.flow_cap_Bps > 0)
    fail("--spec: rendezvous_B with flow_cap_Bps is not modelled (a connection's stream keeps its messages' order)");
  return sp;
}

// One operation of a rank, compact: S/V carry the request id and the mailbox;
// W the range [first, first + n) of Rank::waits; X the seconds of work.
struct Op {
  char kind;
  int peer = -1;
  uint32_t id = 0;     // S, V: request id; W: offset into waits
  uint32_t n = 0;      // W: how many ids
  uint64_t bytes = 0;  // S, V
  int comm = 0;
  double seconds = 0;  // X
  sg4::Mailbox* mb = nullptr;
};

struct Rank {
  std::vector<Op> ops;
  std::vector<std::vector<Op>> jobs;  // the lane's jobs (A ... E), by number
  std::vector<uint32_t> waits;
  uint32_t max_id = 0;
};

struct Schedule {
  std::string header;
  int p = 0;
  std::vector<Rank> ranks;
  uint64_t messages = 0;
};

Schedule parseSchedule(std::istream& in, double reduce_Bps) {
  Schedule s;
  std::string line;
  if (!std::getline(in, line) || line.rfind("# harp-schedule 1 ", 0) != 0)
    fail("not a harp-schedule 1 file (first line: '" + line.substr(0, 80) + "')");
  s.header = line.substr(18);
  {
    std::stringstream h(s.header);
    std::string kv;
    while (h >> kv)
      if (kv.rfind("p=", 0) == 0) s.p = std::atoi(kv.c_str() + 2);
  }
  if (s.p < 1) fail("schedule header names no p: " + s.header);
  s.ranks.resize(s.p);
  Rank* cur = nullptr;
  std::vector<Op>* target = nullptr;  // cur->ops, or the job being read
  long n = 1;
  auto bad = [&](const std::string& why) { fail("schedule line " + std::to_string(n) + ": " + why + ": '" + line + "'"); };
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    const char* c = line.c_str();
    char* e = nullptr;
    if (c[0] == 'R') {
      long r = std::strtol(c + 1, &e, 10);
      if (e == c + 1 || r < 0 || r >= s.p) bad("rank out of range");
      cur = &s.ranks[r];
      target = &cur->ops;
      continue;
    }
    if (!cur) bad("an operation before the first R line");
    if (c[0] == 'A' || c[0] == 'J') {
      long job = std::strtol(c + 1, &e, 10);
      if (e == c + 1 || job < 0 || job > 1 << 20) bad("a job number");
      if (c[0] == 'A') {
        if (target != &cur->ops) bad("a job inside a job");
        if (static_cast<size_t>(job) != cur->jobs.size()) bad("jobs must be numbered 0, 1, ... in order");
        cur->jobs.emplace_back();
      } else if (static_cast<size_t>(job) >= cur->jobs.size()) {
        bad("a join of a job not started");
      }
      Op o;
      o.kind = c[0];
      o.peer = static_cast<int>(job);
      cur->ops.push_back(o);
      if (c[0] == 'A') target = &cur->jobs.back();
      continue;
    }
    if (c[0] == 'E') {
      if (target == &cur->ops) bad("E outside a job");
      target = &cur->ops;
      continue;
    }
    Op o;
    o.kind = c[0];
    if (o.kind == 'S' || o.kind == 'V') {
      unsigned long long id, peer, bytes, comm;
      if (std::sscanf(c + 1, "%llu %llu %llu %llu", &id, &peer, &bytes, &comm) != 4) bad("want S|V id peer bytes comm");
      if (peer >= static_cast<unsigned long long>(s.p) || comm > 64 || id > (1u << 31)) bad("peer, comm or id out of range");
      o.id = static_cast<uint32_t>(id);
      o.peer = static_cast<int>(peer);
      o.bytes = bytes;
      o.comm = static_cast<int>(comm);
      cur->max_id = std::max(cur->max_id, o.id + 1);
      if (o.kind == 'S') ++s.messages;
    } else if (o.kind == 'W') {
      o.id = static_cast<uint32_t>(cur->waits.size());
      const char* q = c + 1;
      while (true) {
        while (*q == ' ') ++q;
        if (!*q) break;
        unsigned long long id = std::strtoull(q, &e, 10);
        if (e == q || id > (1u << 31)) bad("a wait's request id");
        cur->waits.push_back(static_cast<uint32_t>(id));
        q = e;
      }
      o.n = static_cast<uint32_t>(cur->waits.size() - o.id);
    } else if (o.kind == 'X') {
      char what[32];
      unsigned long long bytes;
      if (std::sscanf(c + 1, "%31s %llu", what, &bytes) != 2) bad("want X kind bytes");
      o.seconds = static_cast<double>(bytes) / reduce_Bps;  // every kind at the reduction rate (replay.py's X_RATE)
    } else {
      bad("unknown operation");
    }
    target->push_back(o);
  }
  if (cur && target != &cur->ops) fail("schedule ends inside a job");
  return s;
}

// The per-flow cap as a bound on each flow (CM02's TCP window: a flow's rate
// <= window / (2 x its route's latency)) instead of platforms.py's FATPIPE
// link. The same limit (every flow between hosts at most flow_cap_Bps; flows
// do not share it), but a FATPIPE link is a constraint every flow between
// hosts crosses, which ties them all into one max-min system solved again at
// every flow's start and end; a bound on the flow's own variable ties nothing.
// The window is flow_cap x (rtt + 2 x shm latency), the round trip of a route
// between hosts; flows inside a host (latency shm_lat) get a bound far above
// their memory link. 0 when the window would bind less than tcp_window_B does
// not matter: then min(tcp_window_B, that) is used, as both limits hold.
bool g_window_cap = true;  // --fatpipe-cap: platforms.py's link instead (comparison)
bool g_conn_serial = true;  // --per-message-cap: off
bool g_port_links = true;   // --shared-mem-link: off
constexpr double kPortBps = 1e13;  // a rank's port to its host's router: no limit of its own
bool windowCap(const Spec& sp) { return g_window_cap && sp.flow_cap_Bps > 0; }
double tcpWindow(const Spec& sp) {
  if (!windowCap(sp)) return sp.tcp_window_B;
  return std::min(sp.tcp_window_B, sp.flow_cap_Bps * (sp.rtt_s + 2 * sp.shm_lat_s));
}

// platforms.py's build(): returns the rank hosts, by rank.
std::vector<sg4::Host*> buildPlatform(const Spec& sp) {
  using LR = sg4::LinkInRoute;
  auto* root = sg4::create_star_zone("arena");
  sg4::Link* cap = nullptr;
  if (sp.flow_cap_Bps > 0 && !windowCap(sp)) {
    cap = root->create_link("flowcap", sp.flow_cap_Bps)->set_sharing_policy(sg4::Link::SharingPolicy::FATPIPE);
    cap->seal();
  }
  std::vector<sg4::Host*> ranks;
  ranks.reserve(sp.ranks());
  // Each rank: a memory link for the host's shm traffic and a port to the host's router for
  // its network traffic, so that the two do not share a link (CM02 shares a link in inverse
  // proportion to each flow's latency: a 50 us network flow beside 1 us shm flows got a
  // fiftieth of a rank's memory link); a full zone then routes each pair of the host's ranks.
  // A shm message crosses its receiver's memory link only: the receiver copies it (out of
  // the ring, or from the sender's memory with process_vm_readv above HARP_SHM_CMA_BYTES,
  // where the sender copies nothing), so a rank's concurrent sends (a binomial broadcast's
  // root) do not share a rate of the sender's; what one rank receives at once does.
  // --shared-mem-link: a star, where a rank's network flows cross its memory link too (and
  // a shm message both ranks' memory links, as before the receiver-copies model).
  for (int h = 0; h < sp.hosts; ++h) {
    auto* zone = g_port_links ? sg4::create_full_zone("host" + std::to_string(h))
                              : sg4::create_star_zone("host" + std::to_string(h));
    zone->set_parent(root);
    auto* gw = zone->create_router("gw" + std::to_string(h));
    std::vector<sg4::Host*> mine;
    std::vector<sg4::Link*> mems;
    for (int i = 0; i < sp.local; ++i) {
      const int r = h * sp.local + i;
      mine.push_back(zone->create_host("r" + std::to_string(r), 1.0)->seal());
      auto* np = mine.back()->get_netpoint();
      if (!g_port_links) {
        mems.push_back(zone->create_split_duplex_link("mem" + std::to_string(r), sp.shm_Bps)->set_latency(sp.shm_lat_s / 2));
        mems.back()->seal();
        zone->add_route(np, nullptr, nullptr, nullptr, {LR(mems.back(), LR::Direction::UP)}, false);
        zone->add_route(nullptr, np, nullptr, nullptr, {LR(mems.back(), LR::Direction::DOWN)}, false);
        continue;
      }
      mems.push_back(zone->create_link("memin" + std::to_string(r), sp.shm_Bps)->set_latency(sp.shm_lat_s));
      mems.back()->seal();
      auto* port = zone->create_split_duplex_link("port" + std::to_string(r), kPortBps)->set_latency(sp.shm_lat_s / 2);
      port->seal();
      zone->add_route(np, gw, nullptr, nullptr, {LR(port, LR::Direction::UP)}, false);
      zone->add_route(gw, np, nullptr, nullptr, {LR(port, LR::Direction::DOWN)}, false);
    }
    for (int i = 0; g_port_links && i < sp.local; ++i)
      for (int j = 0; j < sp.local; ++j)
        if (i != j)
          zone->add_route(mine[i]->get_netpoint(), mine[j]->get_netpoint(), nullptr, nullptr,
                          {LR(mems[j])}, false);
    zone->seal();
    ranks.insert(ranks.end(), mine.begin(), mine.end());
    // The host's NIC between its zone and the root (split duplex, RTT/4 each way).
    auto* nic = root->create_split_duplex_link("nic" + std::to_string(h), sp.nic_Bps())->set_latency(sp.rtt_s / 4);
    nic->seal();
    std::vector<LR> up = {LR(nic, LR::Direction::UP)};
    if (cap) up.emplace_back(cap);
    root->add_route(zone->get_netpoint(), nullptr, gw, nullptr, up, false);
    root->add_route(nullptr, zone->get_netpoint(), nullptr, gw, {LR(nic, LR::Direction::DOWN)}, false);
  }
  if (sp.cores > 0) root->create_host("cpu", 1.0)->set_core_count(sp.cores)->seal();
  root->seal();
  return ranks;
}

struct Sim {
  Spec sp;
  Schedule* s = nullptr;
  std::vector<sg4::Host*> hosts;
  sg4::Host* cpu = nullptr;  // Spec::cores > 0: the shared cores
  int iterations = 1;

  // `seconds` of one core's work for the calling rank: on its own core, or on
  // the shared cores, where ranks busy at once share them.
  void work(double seconds) const {
    if (cpu) sg4::this_actor::exec_init(seconds)->set_host(cpu)->start()->wait();
    else sg4::this_actor::execute(seconds);
  }
  sg4::SemaphorePtr runq;  // Spec::runq > 0: one token per shared core, taken in arrival order
  // The run queue: a rank that blocks gives its core up, and when it wakes waits in line
  // for one and spends wake_s on it.
  void offCore() const { runq->release(); }
  void onCore(bool woken) const {
    runq->acquire();
    if (woken && sp.wake_s > 0) sg4::this_actor::sleep_for(sp.wake_s);
  }
  std::vector<std::vector<double>> finish;           // [rank][iteration]
  std::vector<int> finished;                         // [rank]: iterations done
  std::vector<std::pair<double, double>> buckets;    // [tokens, last refill]: up h, then down h
  std::unordered_map<const sg4::Mailbox*, double> conn_free;  // a connection's bytes all sent at the cap by then
  // Spec::rendezvous_B with the tbf bucket: per rendezvous mailbox, one release per receive
  // posted; a large message is charged to the buckets when its receive is there, not before.
  std::unordered_map<const sg4::Mailbox*, sg4::SemaphorePtr> posted_recvs;

  // The seconds a message that the buckets hold `hold` s must also wait for
  // its connection's earlier messages (see the header: one stream per pair).
  double serialised(const sg4::Mailbox* mb, uint64_t bytes, double hold) {
    const double now = sg4::Engine::get_clock();
    double& free = conn_free[mb];
    const double start = std::max(now + hold, free);
    free = start + static_cast<double>(bytes) / sp.flow_cap_Bps;
    return start - now;
  }

  // Charges an inter-host message to both buckets; the seconds it must be held.
  double shaped(int src, int dst, uint64_t bytes) {
    const double now = sg4::Engine::get_clock();
    double hold = 0;
    for (auto* b : {&buckets[src / sp.local], &buckets[sp.hosts + dst / sp.local]}) {
      b->first = std::min(sp.burst_B, b->first + (now - b->second) * sp.link_Bps);
      b->second = now;
      b->first -= static_cast<double>(bytes);  // may go negative: the debt refills at link rate
      hold = std::max(hold, -b->first / sp.link_Bps);
    }
    return hold;
  }
};

struct RankState;

// A request: a comm (S, V), a helper actor holding a shaped send, or a send
// deferred to the rank's pump (its comm set when the pump starts it).
struct Req {
  sg4::CommPtr comm;
  sg4::ActorPtr held;
  void* payload = nullptr;
  bool live = false;
  bool deferred = false;
  uint64_t bytes = 0;  // the message's (a spin's limit, spin_bytes)
  void done(RankState& st);
};

// A send held until `due` (its connection's earlier bytes, the buckets), for
// the rank's pump actor: one actor per rank starts them all at their times
// (one helper actor per held message ran out of memory maps at 256 ranks).
struct Deferred {
  double due;
  uint64_t seq;  // posting order: equal dues start in it
  uint32_t id;
  sg4::Mailbox* mb;
  uint64_t bytes;
};
struct LaterFirst {
  bool operator()(const Deferred& a, const Deferred& b) const { return a.due != b.due ? a.due > b.due : a.seq > b.seq; }
};

// The state one rank's actors share: its requests, its deferred sends, and its lane (the worker
// thread of a hierarchical algorithm's asynchronous legs: jobs run in order).
struct RankState {
  std::vector<Req> reqs;
  std::deque<int> queue;                   // jobs posted, not yet started
  sg4::SemaphorePtr posted;                // one release per posted job
  std::vector<sg4::SemaphorePtr> done;     // one release per finished job (per iteration)
  std::priority_queue<Deferred, std::vector<Deferred>, LaterFirst> deferred;
  uint64_t seq = 0;
  sg4::ActorPtr pump;                      // created with the first deferred send
  sg4::SemaphorePtr wake;                  // one release per deferred send posted
  sg4::MutexPtr mu;
  sg4::ConditionVariablePtr started;       // the pump has started a deferred send
};

void Req::done(RankState& st) {
  if (deferred && !comm) {
    std::unique_lock<sg4::Mutex> lock(*st.mu);
    while (!comm) st.started->wait(lock);
  }
  if (comm) comm->wait();
  else if (held) held->join();
  comm = nullptr;
  held = nullptr;
  live = false;
  deferred = false;
}

// The rank's pump: starts each deferred send at its due time, in due order.
void pumpActor(RankState* st) {
  for (;;) {
    if (st->deferred.empty()) {
      st->wake->acquire();
      continue;
    }
    const double wait = st->deferred.top().due - sg4::Engine::get_clock();
    if (wait > 1e-12) {
      st->wake->acquire_timeout(wait);  // a new send may be due sooner: look again either way
      continue;
    }
    const Deferred d = st->deferred.top();
    st->deferred.pop();
    st->reqs[d.id].comm = d.mb->put_async(&g_payload, d.bytes);
    std::unique_lock<sg4::Mutex> lock(*st->mu);
    st->started->notify_all();
  }
}

// Spec::spin_s on the run queue: the W `o` polls on the rank's core until its plain comms
// have all completed or spin_s has passed; the completed ones are reaped (a later blocked
// wait, and its wake-up, is then only for what is still missing).
void spinWait(const Sim* sim, const Rank& rk, const Op& o, std::vector<Req>& reqs) {
  std::vector<sg4::CommPtr> pending;
  std::vector<uint32_t> ids;
  auto gather = [&]() {
    pending.clear();
    ids.clear();
    for (uint32_t i = 0; i < o.n; ++i) {
      const uint32_t id = rk.waits[o.id + i];
      if (id >= reqs.size() || !reqs[id].live) continue;
      Req& q = reqs[id];
      if (!q.comm || q.deferred) return false;  // a held or deferred send: no spin, block as before
      if (q.comm->test()) {
        q.comm = nullptr;
        q.live = false;
        continue;
      }
      pending.push_back(q.comm);
      ids.push_back(id);
    }
    return true;
  };
  if (!gather() || pending.empty()) return;
  if (sim->sp.spin_bytes > 0) {  // HARP_SPIN_BYTES: a wait on more bytes than this does not spin
    uint64_t sum = 0;
    for (uint32_t id : ids) sum += reqs[id].bytes;
    if (static_cast<double>(sum) > sim->sp.spin_bytes) return;
  }
  const double until = sg4::Engine::get_clock() + sim->sp.spin_s;  // on the rank's own core
  while (gather() && !pending.empty()) {
    const double left = until - sg4::Engine::get_clock();
    if (left <= 0 || sg4::Comm::wait_any_for(pending, left) < 0) break;
  }
}

void defer(Sim* sim, int r, RankState& st, const Op& o, uint64_t bytes, double hold) {
  if (!st.pump) {
    st.wake = sg4::Semaphore::create(0);
    st.mu = sg4::Mutex::create();
    st.started = sg4::ConditionVariable::create();
    st.pump = sg4::Actor::create("pump" + std::to_string(r), sim->hosts[r], pumpActor, &st);
    st.pump->daemonize();
  }
  st.reqs[o.id].deferred = true;
  st.deferred.push({sg4::Engine::get_clock() + hold, st.seq++, o.id, o.mb, bytes});
  st.wake->release();
}

// core: the calling actor holds a run-queue core (the rank's actor with Spec::runq; not its lane).
void runOps(Sim* sim, int r, const std::vector<Op>& ops, RankState& st, bool core) {
  Rank& rk = sim->s->ranks[r];
  const Spec& sp = sim->sp;
  auto& reqs = st.reqs;
  // Sends still in flight, oldest first. SimGrid's cost of finishing a comm
  // grows with the comms its issuer has not waited for (a list scan), and
  // algorithms wait for their sends late (the ring: all at the end), so each
  // new send first reaps the finished ones at the front with test(), which
  // takes no simulated time: a later W on them returns at once, as it would.
  std::deque<uint32_t> in_flight;
  const double wake = sp.wakeSeconds();
  auto reap = [&]() {
    while (!in_flight.empty()) {
      Req& q = reqs[in_flight.front()];
      if (q.live && q.comm && !q.comm->test()) break;
      if (q.live && q.comm) {
        q.comm = nullptr;
        q.live = false;
      }
      in_flight.pop_front();
    }
  };
  for (const Op& o : ops) {
    switch (o.kind) {
      case 'S': {
        reap();
        if (sp.send_overhead_s > 0) {
          if (sim->cpu && !core) sim->work(sp.send_overhead_s);
          else sg4::this_actor::sleep_for(sp.send_overhead_s);
        }
        const uint64_t bytes = std::max<uint64_t>(o.bytes, 1);
        const bool inter = r / sp.local != o.peer / sp.local;
        const bool serial = g_conn_serial && sp.flow_cap_Bps > 0 && inter;  // one stream per connection
        // A rendezvous message through the buckets: charged when its receive is posted (below).
        auto rdv = sim->posted_recvs.find(o.mb);
        const bool late_charge = inter && sp.burst_B > 0 && rdv != sim->posted_recvs.end();
        double hold = sp.burst_B > 0 && inter && !late_charge ? sim->shaped(r, o.peer, o.bytes) : 0;
        if (serial) hold = sim->serialised(o.mb, bytes, hold);
        Req& q = reqs[o.id];
        if (q.live) q.done(st);  // a request id reused before its wait (never in harp_sched's output)
        q.bytes = o.bytes;
        // Done once the socket buffer took it (sndbuf_B): nothing for a W to wait on.
        const bool buffered = sp.sndbuf_B > 0 && !serial && inter && o.bytes <= sp.sndbuf_B;
        q.live = !buffered;
        if (hold > 0 && serial) {
          defer(sim, r, st, o, bytes, hold);
        } else if (hold > 0 || late_charge) {
          // A helper actor holds it (the rank goes on) until the buckets have refilled its debt,
          // then sends; a rendezvous message is charged only once its receive is posted.
          sg4::Mailbox* mb = o.mb;
          sg4::SemaphorePtr ready = late_charge ? rdv->second : nullptr;
          const int peer = o.peer;
          const uint64_t raw = o.bytes;
          sg4::ActorPtr held = sg4::Actor::create("held" + std::to_string(r), sim->hosts[r],
                                                  [sim, r, peer, raw, mb, bytes, hold, ready]() {
            double wait = hold;
            if (ready) {
              ready->acquire();  // the receive is posted: the bytes start now
              wait = sim->shaped(r, peer, raw);
            }
            sg4::this_actor::sleep_for(wait);
            mb->put(&g_payload, bytes);
          });
          if (!buffered) q.held = held;
        } else if (buffered) {
          o.mb->put_init(&g_payload, bytes)->detach();
        } else {
          q.comm = o.mb->put_async(&g_payload, bytes);
          in_flight.push_back(o.id);
        }
        break;
      }
      case 'V': {
        Req& q = reqs[o.id];
        if (q.live) q.done(st);
        q.live = true;
        q.bytes = o.bytes;
        if (auto rdv = sim->posted_recvs.find(o.mb); rdv != sim->posted_recvs.end()) rdv->second->release();
        q.comm = o.mb->get_async(&q.payload);
        break;
      }
      case 'W': {
        // The run queue's spin (spin_s): poll on a core for up to spin_s; what arrives meanwhile
        // needs no wake-up, and the core is taken from the ranks queued for one.
        if (core && sp.spin_s > 0) spinWait(sim, rk, o, reqs);
        // Blocked: a request not yet complete when the wait starts (test() takes no time).
        bool blocked = false;
        for (uint32_t i = 0; i < o.n; ++i) {
          const uint32_t id = rk.waits[o.id + i];
          if (id >= reqs.size() || !reqs[id].live) continue;
          Req& q = reqs[id];
          if (!blocked && q.comm && !q.deferred && q.comm->test()) {
            q.comm = nullptr;
            q.live = false;
            continue;
          }
          if (!blocked && core) sim->offCore();
          blocked = true;
          q.done(st);
        }
        if (blocked && wake > 0) sg4::this_actor::sleep_for(wake);
        if (blocked && core) sim->onCore(true);
        break;
      }
      case 'A':
        st.queue.push_back(o.peer);
        st.posted->release();
        break;
      case 'J':
        if (core) sim->offCore();
        st.done[o.peer]->acquire();
        if (core) sim->onCore(true);
        break;
      default:
        if (core) sg4::this_actor::execute(o.seconds);  // on the core the rank holds
        else sim->work(o.seconds);  // hosts run 1 flop/s: flops = seconds
    }
  }
}

void laneActor(Sim* sim, int r, RankState* st) {
  for (;;) {
    st->posted->acquire();
    const int job = st->queue.front();
    st->queue.pop_front();
    runOps(sim, r, sim->s->ranks[r].jobs[job], *st, false);
    st->done[job]->release();
  }
}

void rankActor(Sim* sim, int r) {
  Rank& rk = sim->s->ranks[r];
  // Never freed: the lane (a daemon) still waits on its semaphore when the rank ends.
  RankState& st = *new RankState;
  st.reqs.resize(rk.max_id);
  if (!rk.jobs.empty()) {
    st.posted = sg4::Semaphore::create(0);
    for (size_t j = 0; j < rk.jobs.size(); ++j) st.done.push_back(sg4::Semaphore::create(0));
    sg4::Actor::create("lane" + std::to_string(r), sim->hosts[r], laneActor, sim, r, &st)->daemonize();
  }
  const bool core = sim->runq != nullptr;  // the run queue: the rank starts on a core (in line)
  if (core) sim->onCore(false);
  for (int it = 0; it < sim->iterations; ++it) {
    runOps(sim, r, rk.ops, st, core);
    bool blocked = false;
    for (Req& q : st.reqs)
      if (q.live) {
        if (core && !blocked) sim->offCore();
        blocked = true;
        q.done(st);
      }
    if (core && blocked) sim->onCore(true);
    sim->finish[r][it] = sg4::Engine::get_clock();
    sim->finished[r] = it + 1;
  }
  if (core) sim->offCore();
}

}  // namespace

int main(int argc, char** argv) {
  std::string spec_text, path = "-", factory = "raw";
  int iterations = 1, warmup = -1;  // -1: 1 where iterations > 1, else 0
  std::vector<std::string> extra_cfg;  // --cfg key:value, passed to SimGrid (experiments)
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(a + " needs a value");
      return argv[++i];
    };
    if (a == "--spec") spec_text = value();
    else if (a == "--iterations") iterations = std::atoi(value().c_str());
    else if (a == "--warmup") warmup = std::atoi(value().c_str());
    else if (a == "--factory") factory = value();
    else if (a == "--cfg") extra_cfg.push_back("--cfg=" + value());
    else if (a == "--fatpipe-cap") g_window_cap = false;
    else if (a == "--per-message-cap") g_conn_serial = false;
    else if (a == "--shared-mem-link") g_port_links = false;
    else if (a == "-h" || a == "--help") {
      std::printf("usage: harp_replay --spec k=v,... [--iterations N] [--warmup W] [--factory raw|ucontext|thread] [--fatpipe-cap] [--per-message-cap] [--shared-mem-link] [SCHEDULE|-]\n");
      return 0;
    } else if (!a.empty() && a[0] == '-' && a != "-") fail("unknown option " + a);
    else path = a;
  }
  if (iterations < 1 || iterations > 1000) fail("--iterations must be 1..1000");
  if (warmup < 0) warmup = iterations > 1 ? 1 : 0;
  if (warmup >= iterations) fail("--warmup must be below --iterations (the timed iterations follow it)");
  if (factory != "raw" && factory != "ucontext" && factory != "thread" && factory != "boost")
    fail("--factory must be raw, ucontext, boost or thread");
  Sim sim;
  sim.sp = parseSpec(spec_text);
  const auto t0 = std::chrono::steady_clock::now();
  Schedule sched;
  if (path == "-") {
    std::ios::sync_with_stdio(false);
    sched = parseSchedule(std::cin, sim.sp.reduce_Bps);
  } else {
    std::ifstream f(path);
    if (!f) fail("cannot read " + path);
    sched = parseSchedule(f, sim.sp.reduce_Bps);
  }
  if (sched.p != sim.sp.ranks())
    fail("the schedule has " + std::to_string(sched.p) + " ranks, the platform " + std::to_string(sim.sp.hosts) + " x " +
         std::to_string(sim.sp.local));
  sim.s = &sched;
  sim.iterations = iterations;

  std::vector<std::string> args = {"harp_replay", "--log=root.thres:critical", "--cfg=contexts/factory:" + factory,
                                   "--cfg=contexts/stack-size:256", "--cfg=network/model:CM02"};
  args.insert(args.end(), extra_cfg.begin(), extra_cfg.end());
  std::vector<char*> cargs;
  for (auto& x : args) cargs.push_back(x.data());
  int cargc = static_cast<int>(cargs.size());
  sg4::Engine e(&cargc, cargs.data());
  sg4::Engine::set_config("network/TCP-gamma", tcpWindow(sim.sp));
  sim.hosts = buildPlatform(sim.sp);
  if (sim.sp.cores > 0) sim.cpu = sg4::Host::by_name("cpu");
  if (sim.sp.runq > 0) sim.runq = sg4::Semaphore::create(sim.sp.cores);

  // Mailboxes: one per (src, dst, comm) that carries a message; its receiver set (eager).
  std::unordered_map<uint64_t, sg4::Mailbox*> boxes;
  // A message over rendezvous_B goes through a second mailbox of the pair, which has no
  // permanent receiver: it moves once its receive is posted.
  auto large = [&](uint64_t bytes) { return sim.sp.rendezvous_B > 0 && static_cast<double>(bytes) > sim.sp.rendezvous_B; };
  auto box = [&](int src, int dst, int comm, bool rdv) {
    const uint64_t key = (static_cast<uint64_t>(src) << 32) | (static_cast<uint64_t>(dst) << 8) |
                         (static_cast<uint64_t>(comm) << 1) | static_cast<uint64_t>(rdv);
    auto [it, fresh] = boxes.try_emplace(key, nullptr);
    if (fresh)
      it->second = sg4::Mailbox::by_name(std::to_string(src) + ">" + std::to_string(dst) + ":" + std::to_string(comm) +
                                         (rdv ? ":r" : ""));
    return it->second;
  };
  auto boxes_of = [&](int r, std::vector<Op>& ops) {
    for (Op& o : ops) {
      if (o.kind == 'S') o.mb = box(r, o.peer, o.comm, large(o.bytes));
      if (o.kind != 'V') continue;
      o.mb = box(o.peer, r, o.comm, large(o.bytes));
      // Through the buckets a large message is charged when it can move: its receive posted.
      if (large(o.bytes) && sim.sp.burst_B > 0)
        if (auto [it, fresh] = sim.posted_recvs.try_emplace(o.mb); fresh) it->second = sg4::Semaphore::create(0);
    }
  };
  for (int r = 0; r < sched.p; ++r) {
    boxes_of(r, sched.ranks[r].ops);
    for (auto& job : sched.ranks[r].jobs) boxes_of(r, job);
  }
  sim.finish.assign(sched.p, std::vector<double>(iterations, 0.0));
  sim.finished.assign(sched.p, 0);
  sim.buckets.assign(2 * sim.sp.hosts, {sim.sp.burst_B, 0.0});
  for (int r = 0; r < sched.p; ++r) {
    auto a = sg4::Actor::create("rank" + std::to_string(r), sim.hosts[r], rankActor, &sim, r);
    for (Op& o : sched.ranks[r].ops)
      if (o.kind == 'V' && !large(o.bytes)) o.mb->set_receiver(a);
    for (auto& job : sched.ranks[r].jobs)
      for (Op& o : job)
        if (o.kind == 'V' && !large(o.bytes)) o.mb->set_receiver(a);
  }
  e.run();
  {  // SimGrid ends a deadlocked run quietly (a wait nothing completes): name the ranks stuck
    std::string stuck;
    int n = 0;
    for (int r = 0; r < sched.p; ++r)
      if (sim.finished[r] != iterations && ++n <= 8)
        stuck += (n > 1 ? ", " : "") + std::to_string(r) + " in iteration " + std::to_string(sim.finished[r] + 1);
    if (n > 0)
      fail(std::to_string(n) + " rank(s) never finished: " + stuck + (n > 8 ? ", ..." : "") +
           " (a receive with no matching send, or a send no one receives)");
  }
  for (auto& kv : boxes) kv.second->set_receiver(nullptr);
  std::vector<double> ends(iterations, 0.0);
  for (int it = 0; it < iterations; ++it)
    for (int r = 0; r < sched.p; ++r) ends[it] = std::max(ends[it], sim.finish[r][it]);
  const double t = (ends.back() - (warmup ? ends[warmup - 1] : 0.0)) / (iterations - warmup);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("sim-seconds %.9f\nmessages %llu\nwall-seconds %.3f\n", t, static_cast<unsigned long long>(sched.messages),
              wall);
  return 0;
}
