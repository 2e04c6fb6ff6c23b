// core/observe/fr_dump.cc — flight-recorder dumps in the format torch's analyser reads.
//
// torch/distributed/flight_recorder (fr_trace <dir>, components/loader.py)
// loads one pickle per rank, named <prefix><rank>, holding a dict with
// "version" ("2.10"), "pg_config" {pg name: {name, desc, ranks: "[0, 1]"}},
// "pg_status" and "entries": one dict per operation with the keys
// ProcessGroupNCCL's recorder writes (record_id, process_group, profiling_name
// "nccl:all_reduce", collective_seq_id, p2p_seq_id, input/output sizes and
// dtypes, state scheduled/started/completed, time_created_ns, ...). HARP
// writes the same, naming itself "nccl" (the analyser accepts only a fixed
// list of backends) and adding "harp_*" keys the analyser ignores:
// harp_state (failed is its own state here; torch's "started" is written for
// it), harp_algorithm, harp_transport, harp_count. A process's communicators
// share one file, like a process's process groups in torch.
//
// Where: HARP_FR_DUMP_PREFIX when set (the user's choice of folder), else the
// private folder <$TMPDIR or /tmp>/harp-trace-<uid> (0700, checked: owner, mode,
// not a symlink; a name someone else took first gives a fresh mkdtemp folder
// beside it, named in a warning). Files are made with O_EXCL and renamed in.
//
// The pickle is written by hand (protocol 2: dicts, lists, tuples, str, int,
// float, None, bool): no Python is needed where a timeout dumps it.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/algorithms/algorithm.h"
#include "base/env.h"
#include "base/folder.h"
#include "base/log.h"
#include "core/observe/recorder.h"

namespace harp::obs {
namespace {

class Pickle {
 public:
  Pickle() { out_ += "\x80\x02"; }
  std::string finish() { return out_ + "."; }
  void dict() { out_ += "}("; }
  void endDict() { out_ += 'u'; }
  void list() { out_ += "]("; }
  void endList() { out_ += 'e'; }
  void tuple() { out_ += '('; }
  void endTuple() { out_ += 't'; }
  void none() { out_ += 'N'; }
  void boolean(bool b) { out_ += b ? '\x88' : '\x89'; }
  void str(const std::string& s) {
    out_ += 'X';
    u32(static_cast<uint32_t>(s.size()));
    out_ += s;
  }
  void integer(int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      u32(static_cast<uint32_t>(static_cast<int32_t>(v)));
      return;
    }
    out_ += "\x8a\x08";
    for (int i = 0; i < 8; ++i) out_ += static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
  }
  void real(double d) {
    out_ += 'G';
    uint64_t b;
    std::memcpy(&b, &d, 8);
    for (int i = 7; i >= 0; --i) out_ += static_cast<char>((b >> (8 * i)) & 0xff);
  }
  // key helpers (inside a dict)
  void kstr(const char* k, const std::string& v) { str(k), str(v); }
  void kint(const char* k, int64_t v) { str(k), integer(v); }

 private:
  void u32(uint32_t n) {
    for (int i = 0; i < 4; ++i) out_ += static_cast<char>((n >> (8 * i)) & 0xff);
  }
  std::string out_;
};

// torch's names: profiling_name "nccl:<op>" and dtypes as c10 ScalarType names, both from
// vocab.def's torch columns (collTorchName, dtypeTorchName).
const char* torchDtype(uint8_t d) {
  const char* name = dtypeTorchName(static_cast<DataType>(d));  // vocab.def's torch column
  return *name ? name : "Byte";
}

std::string pgName(const Recorder& r) {
  char b[24];
  snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(r.identity().comm_id));
  return b;
}

void sizes(Pickle& p, uint64_t n) {
  p.list();
  p.list();
  p.integer(static_cast<int64_t>(n));
  p.endList();
  p.endList();
}

void dtypes(Pickle& p, uint8_t d) {
  p.list();
  p.str(torchDtype(d));
  p.endList();
}

void entry(Pickle& p, const Recorder& r, int pg_index, uint64_t id_base, const OpSnapshot& s) {
  const auto c = static_cast<CollType>(s.coll);
  const int me = r.identity().rank, n = r.identity().size;
  const std::string name = pgName(r);
  std::string prof = std::string("nccl:") + collTorchName(c);
  if (c == CollType::kSend) prof += " " + std::to_string(me) + "->" + std::to_string(s.peer);
  if (c == CollType::kRecv) prof += " " + std::to_string(me) + "<-" + std::to_string(s.peer);
  // Input and output sizes as torch records them: the byte rule (vocab.def) at the root's view
  // (torch lists a rooted call's shapes alike on every rank), and the call's one tensor on the
  // side that has no buffer or a listed one (send, recv, barrier, alltoallv, the coalesced ones).
  auto elems = [&](Extent x) {
    const size_t k = bufferBlocks(x, static_cast<size_t>(n), true);
    return k ? s.count * k : s.count;
  };
  const uint64_t in = elems(collSend(c)), out = elems(collRecv(c));
  p.dict();
  p.kint("record_id", static_cast<int64_t>(id_base + s.id));
  p.kint("pg_id", pg_index);
  p.str("process_group"), p.tuple(), p.str(name), p.str("harp"), p.endTuple();
  p.kint("collective_seq_id", s.seq);
  p.kint("p2p_seq_id", s.p2p_seq);
  p.kint("op_id", static_cast<int64_t>(s.id + 1));
  p.kstr("profiling_name", prof);
  p.kint("time_created_ns", static_cast<int64_t>(ticksToEpochNs(s.t_start)));
  p.kint("time_discovered_started_ns", static_cast<int64_t>(ticksToEpochNs(s.t_start)));
  p.str("time_discovered_completed_ns");
  if (s.t_end) p.integer(static_cast<int64_t>(ticksToEpochNs(s.t_end))); else p.none();
  p.str("duration_ms");
  if (s.t_end && s.timed) p.real((s.t_end - s.t_start) * nsPerTick() / 1e6); else p.none();
  p.str("input_sizes"), sizes(p, in);
  p.str("input_dtypes"), dtypes(p, s.dtype);
  p.str("output_sizes"), sizes(p, out);
  p.str("output_dtypes"), dtypes(p, s.dtype);
  p.kstr("state", s.state == kCompleted ? "completed" : "started");
  p.str("retired"), p.boolean(s.state != kStarted);
  p.kint("timeout_ms", static_cast<int64_t>(r.identity().timeout_s * 1000));
  p.str("is_p2p"), p.boolean(c == CollType::kSend || c == CollType::kRecv);
  p.str("frames"), p.list(), p.endList();
  p.kstr("harp_state", stateName(s.state));
  p.kstr("harp_algorithm", s.algo);
  p.kstr("harp_transport", r.identity().transport);
  p.kint("harp_count", static_cast<int64_t>(s.count));
  p.endDict();
}

std::string ranksText(const std::vector<int>& g) {
  std::string s = "[";
  for (size_t i = 0; i < g.size(); ++i) s += (i ? ", " : "") + std::to_string(g[i]);
  return s + "]";
}

}  // namespace

int processGlobalRank() {
  for (const char* k : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    const char* v = getenv(k);
    if (v && *v) return atoi(v);
  }
  if (env::has("HARP_RANK")) return static_cast<int>(env::integer("HARP_RANK"));
  auto live = liveRecorders();
  return live.empty() ? 0 : live.front()->globalRanks()[live.front()->identity().rank];
}

std::string flightRecordPickle(const std::string& reason) {
  auto live = liveRecorders();
  Pickle p;
  p.dict();
  p.kstr("version", "2.10");
  p.kstr("comm_lib_version", "harp");
  p.str("pg_config"), p.dict();
  for (auto& r : live) {
    p.str(pgName(*r)), p.dict();
    p.kstr("name", pgName(*r));
    p.kstr("desc", "harp");
    p.kstr("ranks", ranksText(r->globalRanks()));
    p.endDict();
  }
  p.endDict();
  p.str("pg_status"), p.dict();
  for (auto& r : live) {
    p.str(pgName(*r)), p.dict();
    p.kint("last_enqueued_collective", r->started());
    p.kint("last_started_collective", r->started());
    p.kint("last_completed_collective", r->completed());
    p.endDict();
  }
  p.endDict();
  p.str("entries"), p.list();
  for (size_t i = 0; i < live.size(); ++i)
    for (const auto& s : live[i]->snapshot()) entry(p, *live[i], static_cast<int>(i), uint64_t(i) << 40, s);
  p.endList();
  p.str("harp"), p.dict();
  p.kstr("reason", reason);
  p.kint("pid", getpid());
  p.kint("global_rank", processGlobalRank());
  p.endDict();
  p.endDict();
  return p.finish();
}

namespace {

const char* tmpBase() {
  const char* t = getenv("TMPDIR");
  return t && *t == '/' ? t : "/tmp";
}

// The default folder of this process's dumps, chosen once and checked again at every dump.
std::string defaultDumpFolder(std::string* err) {
  static std::mutex mu;
  static std::string chosen;
  std::lock_guard<std::mutex> g(mu);
  if (!chosen.empty() && isPrivateFolder(chosen, nullptr)) return chosen;
  std::string note;
  chosen = privateFolder(tmpBase(), "harp-trace-" + std::to_string(getuid()), &note);
  if (chosen.empty()) {
    if (err) *err = "no private folder for the flight record: " + note;
  } else if (!note.empty()) {
    HARP_WARN("flight record: %s (HARP_FR_DUMP_PREFIX names another place)", note.c_str());
  }
  return chosen;
}

// A prefix the user named: its folder is theirs to choose, but one that other users may write is
// worth a warning (they can add files there that fr_trace would unpickle).
void warnIfShared(const std::string& path) {
  static std::atomic<bool> warned{false};
  std::string dir = path.substr(0, path.find_last_of('/') + 1);
  struct stat st;
  if (::stat(dir.empty() ? "." : dir.c_str(), &st) == 0 && (st.st_mode & S_IWOTH) && !warned.exchange(true))
    HARP_WARN("flight record: HARP_FR_DUMP_PREFIX is in %s, which every user may write: files there can be "
              "added or replaced by others (fr_trace unpickles them); prefer a private folder", dir.c_str());
}

}  // namespace

std::string dumpFlightRecord(const std::string& reason, std::string* err) {
  std::string prefix = env::str("HARP_FR_DUMP_PREFIX");
  if (prefix.empty()) {
    std::string dir = defaultDumpFolder(err);
    if (dir.empty()) return "";
    prefix = dir + "/harp_trace_rank_";
  } else {
    warnIfShared(prefix);
  }
  std::string path = prefix + std::to_string(processGlobalRank());
  std::string bytes = flightRecordPickle(reason);
  // A fresh file beside the target (mkostemp: O_CREAT|O_EXCL, 0600, never an existing file or
  // symlink), renamed into place: a reader never sees half a file, and whatever stood at the name
  // (a planted symlink, another user's file) is replaced, never written through or truncated.
  std::string tmpl = path + ".tmpXXXXXX";
  std::vector<char> tmp(tmpl.begin(), tmpl.end());
  tmp.push_back('\0');
  int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) {
    if (err) *err = tmpl + ": " + std::strerror(errno);
    return "";
  }
  size_t off = 0;
  int werr = 0;
  while (off < bytes.size()) {
    ssize_t w = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      werr = w < 0 ? errno : ENOSPC;
      break;
    }
    off += static_cast<size_t>(w);
  }
  if (::close(fd) != 0 && !werr) werr = errno;
  if (!werr && ::rename(tmp.data(), path.c_str()) != 0) werr = errno;
  if (werr) {
    if (err) *err = path + ": " + std::strerror(werr);
    ::unlink(tmp.data());
    return "";
  }
  return path;
}

}  // namespace harp::obs
