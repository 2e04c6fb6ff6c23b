// core/observe/observer.cc — the process-wide side of observability: the list of live
// recorders, the SIGUSR1 dump, the status socket and the counter publisher.
//
// Two threads start with the first communicator of a process (detached; they
// only touch heap state that is never freed, so process exit needs nothing
// from them):
//   observer:  waits on a self-pipe and the status socket. SIGUSR1's handler
//              only writes one byte to the pipe (async-signal-safe); the
//              thread then writes the flight-record dump (core/observe/fr_dump.cc).
//              The status socket answers "STATUS" with every communicator's
//              state as JSON (statusJson), "DUMP" with a dump's path and
//              "JOBVIEW" with the job-view endpoints and keys; it never
//              touches the store, so it answers during any hang. The same
//              poll serves the job view's TCP listener (core/observe/jobview.h).
//   publisher: every HARP_OBS_PUBLISH_S, stores each communicator's op
//              counters when they changed (core/observe/recorder.h), so a rank that
//              stopped calling collectives is still current in the stall view.
//              Only through a store with diagnostics() (HARP's TcpStore); the
//              torch adapter's store calls Python, and the executing thread
//              publishes in the stall check instead.
//
// Status socket: HARP_STATUS=1 (default, like NCCL RAS) makes
// <HARP_STATUS_DIR or $XDG_RUNTIME_DIR or /tmp>/harp-status-<uid>/<pid>.sock,
// the folder 0700 (checked: owner, mode, not a symlink; when another user made
// that name first, a fresh harp-status-<uid>.XXXXXX beside it, which harp-status
// also asks) and the socket 0600, and answers only peers of the same uid
// (or root; SO_PEERCRED). Requests are read up to 64 bytes within 1 s;
// answers are written within 2 s. harp-status (python/harp/status.py) asks
// every socket of the folder.
//
// fork(): the child starts with an empty list and no threads; its first
// communicator starts them again (pthread_atfork).
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/algorithms/registry.h"
#include "base/env.h"
#include "base/folder.h"
#include "base/log.h"
#include "bootstrap/socket.h"
#include "core/observe/jobview.h"
#include "core/observe/recorder.h"

namespace harp::obs {

std::string jsonString(const std::string& v) {
  std::string o = "\"";
  for (unsigned char c : v) {
    if (c == '"' || c == '\\') o += '\\', o += static_cast<char>(c);
    else if (c < 0x20) {
      char b[8];
      snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else o += static_cast<char>(c);
  }
  return o + "\"";
}

std::string jsonNumber(double d) {
  char b[32];
  snprintf(b, sizeof b, "%.9g", d);
  return b;
}

std::string opJson(const Recorder& r, const OpSnapshot& s, uint64_t now) {
  return "{\"collective\":" + jsonString(collName(static_cast<CollType>(s.coll))) + ",\"seq\":" +
         std::to_string(s.seq) + ",\"p2p_seq\":" + std::to_string(s.p2p_seq) + ",\"count\":" +
         std::to_string(s.count) + ",\"dtype\":" + jsonString(dtypeName(static_cast<DataType>(s.dtype))) +
         ",\"algorithm\":" + jsonString(s.algo) + ",\"peer\":" + std::to_string(s.peer) + ",\"running_s\":" +
         jsonNumber((now - s.t_start) * nsPerTick() * 1e-9) + ",\"transport\":" + jsonString(r.identity().transport) + "}";
}

namespace {

struct State {
  std::mutex mu;
  std::vector<std::weak_ptr<Recorder>> live;
  bool started = false;
  int listen_fd = -1;
  std::string sock_path;
  std::string own_dir;  // a fallback status folder this process made (removed at exit)
  pid_t owner = 0;
};

State& state() {
  static State* s = new State;  // never freed: detached threads use it until exit
  return *s;
}

std::atomic<int> g_sig_fd{-1};  // write end of the self-pipe (the signal handler's only state)

void onSigusr1(int) {
  int saved = errno;
  int fd = g_sig_fd.load(std::memory_order_relaxed);
  if (fd >= 0) {
    char c = 'd';
    ssize_t w = ::write(fd, &c, 1);
    (void)w;
  }
  errno = saved;
}

void atforkPrepare() {
  // The job view's locks first: its handshakes look up recorders (state().mu)
  // while holding its own, so this is the one order both ways take.
  jobview::atforkPrepare();
  state().mu.lock();
}
void atforkParent() {
  jobview::atforkParent();
  state().mu.unlock();
}
void atforkChild() {
  jobview::atforkChild();
  State& s = state();
  s.live.clear();
  s.started = false;
  if (s.listen_fd >= 0) ::close(s.listen_fd);  // the parent's socket stays the parent's
  s.listen_fd = -1;
  s.sock_path.clear();
  s.own_dir.clear();
  g_sig_fd.store(-1);
  s.mu.unlock();
}

void unlinkAtExit() {
  State& s = state();
  if (s.owner != getpid()) return;
  if (!s.sock_path.empty()) ::unlink(s.sock_path.c_str());
  if (!s.own_dir.empty()) ::rmdir(s.own_dir.c_str());
}

std::string algoName(int coll, int index) {
  auto v = algorithmsOf(static_cast<CollType>(coll));
  return index < static_cast<int>(v.size()) && v[index]->name ? v[index]->name : "?";
}

std::string metricsJson(const Recorder& r) {
  std::string o = "[";
  const double tick_s = nsPerTick() * 1e-9;
  for (int c = 0; c < 16 && c < kNumCollTypes; ++c)
    for (int a = 0; a < 16; ++a) {
      const MetricCell& m = r.cell(c, a);
      uint64_t n = m.count.load(std::memory_order_relaxed);
      if (!n) continue;
      o += (o.size() > 1 ? "," : "");
      o += "{\"collective\":" + jsonString(collName(static_cast<CollType>(c))) + ",\"algorithm\":" +
           jsonString(algoName(c, a)) + ",\"count\":" + std::to_string(n) +
           ",\"bytes\":" + std::to_string(m.bytes.load(std::memory_order_relaxed)) +
           ",\"timed\":" + std::to_string(m.timed.load(std::memory_order_relaxed)) +
           ",\"timed_bytes\":" + std::to_string(m.timed_bytes.load(std::memory_order_relaxed)) +
           ",\"seconds\":" + jsonNumber(m.ticks.load(std::memory_order_relaxed) * tick_s) + ",\"buckets\":[";
      for (int b = 0; b < kHistBuckets; ++b) {
        // Upper bound of bucket b: 2^(b+1) ticks.
        o += (b ? "," : "") + std::string("[") + jsonNumber(std::ldexp(1.0, b + 1) * tick_s) + "," +
             std::to_string(m.hist[b].load(std::memory_order_relaxed)) + "]";
      }
      o += "]}";
    }
  return o + "]";
}

std::string commJson(Recorder& r) {
  const Identity& id = r.identity();
  char hex[24];
  snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(id.comm_id));
  std::string hosts, pids, granks;
  for (size_t i = 0; i < id.hosts.size(); ++i) hosts += (i ? "," : "") + jsonString(id.hosts[i]);
  for (size_t i = 0; i < id.pids.size(); ++i) pids += (i ? "," : "") + std::to_string(id.pids[i]);
  auto g = r.globalRanks();
  for (size_t i = 0; i < g.size(); ++i) granks += (i ? "," : "") + std::to_string(g[i]);
  OpSnapshot op;
  std::string flight = r.inFlight(&op) ? opJson(r, op, ticks()) : "null";
  return "{\"comm\":\"" + std::string(hex) + "\",\"rank\":" + std::to_string(id.rank) + ",\"size\":" +
         std::to_string(id.size) + ",\"hosts\":[" + hosts + "],\"pids\":[" + pids + "],\"global_ranks\":[" +
         granks + "],\"transport\":" + jsonString(id.transport) + ",\"timeout_s\":" + jsonNumber(id.timeout_s) +
         ",\"started\":" + std::to_string(r.started()) + ",\"completed\":" + std::to_string(r.completed()) +
         ",\"ops\":" + std::to_string(r.ops()) + ",\"in_flight\":" + flight + ",\"stall_view\":" +
         jsonString(r.stallView()) + ",\"metrics\":" + metricsJson(r) + "}";
}

// HARP_STATUS_DIR when set (refused unless private), else <$XDG_RUNTIME_DIR or
// /tmp>/harp-status-<uid>, or a fresh <that>.XXXXXX when someone else made that
// name first (privateFolder; harp-status asks there too). *made: a folder this
// process made for itself, removed at exit.
std::string statusDir(std::string* made) {
  std::string d = env::str("HARP_STATUS_DIR"), why;
  if (!d.empty()) {
    ::mkdir(d.c_str(), 0700);  // EEXIST is fine: what is there is checked next
    if (isPrivateFolder(d, &why)) return d;
    HARP_WARN("status socket off: HARP_STATUS_DIR %s is %s, not a private folder of this user", d.c_str(),
              why.c_str());
    return "";
  }
  const char* x = getenv("XDG_RUNTIME_DIR");
  std::string base = x && *x == '/' ? x : "/tmp", name = "harp-status-" + std::to_string(getuid()), note;
  d = privateFolder(base, name, &note);
  if (d.empty()) HARP_WARN("status socket off: %s", note.c_str());
  else if (!note.empty()) {
    HARP_WARN("status socket: %s", note.c_str());
    *made = d;
  }
  return d;
}

// The folder must be ours and private (statusDir); the socket 0600 in it.
int openStatusSocket(std::string* path, std::string* made) {
  std::string dir = statusDir(made);
  if (dir.empty()) return -1;
  *path = dir + "/" + std::to_string(getpid()) + ".sock";
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path->size() >= sizeof a.sun_path) {
    HARP_WARN("status socket off: path %s too long", path->c_str());
    return -1;
  }
  std::memcpy(a.sun_path, path->c_str(), path->size() + 1);
  ::unlink(path->c_str());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  mode_t old = ::umask(077);
  int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::umask(old);
  if (rc != 0 || ::chmod(path->c_str(), 0600) != 0 || ::listen(fd, 16) != 0) {
    HARP_WARN("status socket off: %s: %s", path->c_str(), std::strerror(errno));
    ::close(fd);
    return -1;
  }
  return fd;
}

void answer(int cfd) {
  ucred cred{};
  socklen_t cl = sizeof cred;
  if (::getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || (cred.uid != getuid() && cred.uid != 0)) return;
  char req[64];
  size_t n = 0;
  Deadline dl = Deadline::after(1.0);
  while (n < sizeof req && !std::memchr(req, '\n', n)) {
    pollfd p{cfd, POLLIN, 0};
    if (::poll(&p, 1, std::max(dl.remainingMs(), 1)) <= 0 || dl.passed()) break;
    ssize_t r = ::read(cfd, req + n, sizeof req - n);
    if (r <= 0) break;
    n += static_cast<size_t>(r);
  }
  std::string cmd(req, n);
  cmd = cmd.substr(0, cmd.find_first_of("\r\n"));
  std::string out;
  if (cmd == "JOBVIEW") {
    out = jobview::endpointsJson() + "\n";  // the keys: this socket answers only this user (above)
  } else if (cmd == "DUMP") {
    std::string err, path = dumpFlightRecord("status socket DUMP", &err);
    out = "{\"dump\":" + jsonString(path) + ",\"error\":" + jsonString(err) + "}\n";
  } else if (cmd == "STATUS" || cmd.empty()) {
    out = statusJson() + "\n";
  } else {
    out = "{\"error\":\"unknown request; send STATUS, DUMP or JOBVIEW\"}\n";
  }
  Deadline wl = Deadline::after(2.0);
  size_t off = 0;
  while (off < out.size() && !wl.passed()) {
    ssize_t w = ::send(cfd, out.data() + off, out.size() - off, MSG_NOSIGNAL);
    if (w > 0) {
      off += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno != EAGAIN && errno != EINTR) break;
    pollfd p{cfd, POLLOUT, 0};
    ::poll(&p, 1, 100);
  }
}

void observerLoop(int sig_rd, int listen_fd) {
  env::nameThread("harp-observer");
  std::vector<pollfd> p;
  for (;;) {
    // The job-view listener opens with the first communicator that joins it
    // (jobview::join wakes this poll with a 'j' on the pipe).
    // After the three: the job view's connections in their handshake, and
    // their nearest deadline as the timeout (none: -1, asleep until a wake-up).
    const int jv_fd = jobview::listenFd();
    p.assign({{sig_rd, POLLIN, 0}, {jv_fd, POLLIN, 0}, {listen_fd, POLLIN, 0}});  // a negative fd is skipped
    const int timeout_ms = jobview::pollSet(&p);
    int rc = ::poll(p.data(), p.size(), timeout_ms);
    if (rc < 0 && errno != EINTR) return;
    if (p[0].revents & POLLIN) {
      char buf[64];
      bool dump = false;
      ssize_t n;
      while ((n = ::read(sig_rd, buf, sizeof buf)) > 0) dump = dump || std::memchr(buf, 'd', static_cast<size_t>(n));
      if (dump) {
        std::string err, path = dumpFlightRecord("SIGUSR1", &err);
        if (path.empty()) HARP_WARN("flight record not written: %s", err.c_str());
        else HARP_WARN("flight record (SIGUSR1) written to %s", path.c_str());
      }
    }
    if (rc >= 0) jobview::serve(jv_fd, jv_fd >= 0 && (p[1].revents & POLLIN), p.data() + 3, p.size() - 3);
    if (listen_fd >= 0 && (p[2].revents & POLLIN)) {
      int cfd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (cfd >= 0) {
        try {
          answer(cfd);
        } catch (const std::exception& e) {
          HARP_TRACE("status request failed: %s", e.what());
        }
        ::close(cfd);
      }
    }
  }
}

// Ticks the coarse clock every clock_ms and publishes every every_s.
void publisherLoop(double every_s, int clock_ms) {
  env::nameThread("harp-publisher");
  using Clock = std::chrono::steady_clock;
  auto next = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(every_s));
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(clock_ms));
    tickCoarseClock();
    if (Clock::now() < next) continue;
    next = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(every_s));
    for (auto& r : liveRecorders()) {
      r->publish(true);
      r->pollDumpRequest();
    }
  }
}

// Under state().mu: the threads, the signal handler, the socket.
void startLocked(State& s) {
  static bool atfork = [] { return pthread_atfork(atforkPrepare, atforkParent, atforkChild) == 0; }();
  (void)atfork;
  s.started = true;
  s.owner = getpid();
  int pfd[2];
  if (::pipe2(pfd, O_CLOEXEC | O_NONBLOCK) != 0) return;
  g_sig_fd.store(pfd[1]);
  if (env::flag("HARP_FR_SIGNAL")) {
    struct sigaction cur{};
    if (::sigaction(SIGUSR1, nullptr, &cur) == 0 && cur.sa_handler == SIG_DFL && !(cur.sa_flags & SA_SIGINFO)) {
      struct sigaction sa{};
      sa.sa_handler = onSigusr1;
      sa.sa_flags = SA_RESTART;
      sigemptyset(&sa.sa_mask);
      ::sigaction(SIGUSR1, &sa, nullptr);
    }
  }
  if (env::flag("HARP_STATUS")) {
    s.listen_fd = openStatusSocket(&s.sock_path, &s.own_dir);
    static bool once = [] { return std::atexit(unlinkAtExit) == 0; }();
    (void)once;
  }
  std::thread(observerLoop, pfd[0], s.listen_fd).detach();
  tickCoarseClock();
  const int clock_ms = static_cast<int>(std::clamp<long long>(env::integer("HARP_FR_CLOCK_MS"), 1, 1000));
  std::thread(publisherLoop, env::timeout("HARP_OBS_PUBLISH_S"), clock_ms).detach();
}

}  // namespace

void ensureService() {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  if (!s.started) startLocked(s);
}

void registerRecorder(const std::shared_ptr<Recorder>& r) {
  {
    State& s = state();
    std::lock_guard<std::mutex> g(s.mu);
    s.live.push_back(r);
    if (!s.started) startLocked(s);
  }
  jobview::join(*r);  // one store allgather of the job-view addresses (no lock held)
}

void wakeObserver() {
  int fd = g_sig_fd.load(std::memory_order_relaxed);
  if (fd < 0) return;
  char c = 'j';
  ssize_t w = ::write(fd, &c, 1);
  (void)w;
}

void retireRecorder(const Recorder* r) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  s.live.erase(std::remove_if(s.live.begin(), s.live.end(),
                              [&](const std::weak_ptr<Recorder>& w) {
                                auto p = w.lock();
                                return !p || p.get() == r;
                              }),
               s.live.end());
}

std::vector<std::shared_ptr<Recorder>> liveRecorders() {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  std::vector<std::shared_ptr<Recorder>> v;
  for (auto& w : s.live)
    if (auto p = w.lock()) v.push_back(std::move(p));
  return v;
}

std::string statusSocketPath() {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  return s.listen_fd >= 0 ? s.sock_path : "";
}

std::string statusJson() {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  std::string o = "{\"pid\":" + std::to_string(getpid()) + ",\"host\":" + jsonString(host) +
                  ",\"global_rank\":" + std::to_string(processGlobalRank()) + ",\"comms\":[";
  auto live = liveRecorders();
  for (size_t i = 0; i < live.size(); ++i) o += (i ? "," : "") + commJson(*live[i]);
  return o + "]}";
}

}  // namespace harp::obs
