// bootstrap/rendezvous.cc — see rendezvous.h for the keys and the protocol.
#include "bootstrap/rendezvous.h"

#include <algorithm>
#include <cstdlib>

#include "bootstrap/bootstrap.h"
#include "base/log.h"

namespace harp {
namespace {

[[noreturn]] void raisePosted(const std::string& v) {
  int kind = v.empty() ? static_cast<int>(Error::kPeerFailure) : static_cast<unsigned char>(v[0]);
  if (kind > Error::kInternal) kind = Error::kPeerFailure;
  throw Error(static_cast<Error::Kind>(kind), v.empty() ? "rendezvous failed" : v.substr(1));
}

std::string encodeError(Error::Kind kind, const std::string& msg) {
  return std::string(1, static_cast<char>(kind)) + msg;
}

std::string rankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < 16; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 16) s += ", ...";
  return s;
}

// Which of ranks 0..size-1 have claimed their rank (empty when the store cannot tell).
std::vector<int> missingRanks(Store& store, int size) {
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("claim/" + std::to_string(r));
  std::vector<bool> have = store.check(keys);
  std::vector<int> out;
  for (int r = 0; r < size; ++r)
    if (!have[r]) out.push_back(r);
  return out;
}

// Waits for `key` (or the error key), logging progress while ranks are missing.
std::string waitFor(Store& store, const std::string& key, int rank, int size, double timeout_s, bool progress) {
  std::string v;
  if (!store.diagnostics()) return store.get(key, timeout_s);
  Deadline dl = Deadline::after(timeout_s);
  auto start = Clock::now();
  for (;;) {
    double slice = progress ? std::min(kProgressEveryS, dl.remainingMs() / 1000.0) : dl.remainingMs() / 1000.0;
    int got = store.waitAny({key, "error"}, slice, &v);
    if (got == 0) return v;
    if (got == 1) raisePosted(v);
    double waited = std::chrono::duration<double>(Clock::now() - start).count();
    std::vector<int> missing = missingRanks(store, size);
    if (dl.passed()) {
      std::string who = missing.empty() ? "" : ": rank(s) " + rankList(missing) + " never arrived";
      std::string msg = "rendezvous timed out after " + formatSeconds(timeout_s) + " s" + who +
                        " (did every rank start, with the same unique id / address and world size?)";
      postRendezvousError(store, Error::kTimeout, msg);
      throw Error(Error::kTimeout, msg);
    }
    int lowest = 0;
    while (lowest < size && std::find(missing.begin(), missing.end(), lowest) != missing.end()) ++lowest;
    if (!missing.empty() && lowest == rank)
      HARP_WARN("harp: rendezvous: waiting for ranks %s (%zu of %d missing) for %.0f s", rankList(missing).c_str(),
                missing.size(), size, waited);
  }
}

}  // namespace

std::string describeRank(int rank) {
  HostIdentity me = thisHost();
  return "rank " + std::to_string(rank) + " (pid " + std::to_string(me.pid) + " on " + me.hostname + ")";
}

void postRendezvousError(Store& store, Error::Kind kind, const std::string& message) {
  try {
    store.setIfAbsent("error", encodeError(kind, message));
  } catch (...) {
  }
}

std::string rendezvousGet(Store& store, const std::string& key, double timeout_s) {
  if (!store.diagnostics()) return store.get(key, timeout_s);
  std::string v;
  int got = store.waitAny({key, "error"}, timeout_s, &v);
  if (got == 0) return v;
  if (got == 1) raisePosted(v);
  throw Error(Error::kTimeout, "timed out after " + formatSeconds(timeout_s) + " s waiting for rendezvous key '" +
                                   key + "' (a rank stopped during communicator creation?)");
}

void rendezvous(Store& store, int rank, int size, double timeout_s) {
  std::string me = describeRank(rank);
  if (size < 1 || rank < 0 || rank >= size) {
    std::string msg = size < 1 ? "world size must be >= 1, got " + std::to_string(size) + " at " + me
                               : me + " is out of range for world size " + std::to_string(size);
    if (size >= 1) postRendezvousError(store, Error::kMismatch, msg);
    throw InvalidArgument(msg);
  }
  std::string r = std::to_string(rank);
  if (store.add("claim/" + r, 1) > 1) {
    if (store.check({"complete"}).at(0))
      throw InvalidArgument("this unique id (store prefix) already formed a communicator that rank " + r +
                            " joined: a unique id serves one communicator; create a new one "
                            "(harp.get_unique_id()) for each communicator, and call harp.init() once per process");
    std::string msg = "duplicate rank " + r + ": two processes claim rank " + r + " (one is pid " +
                      std::to_string(thisHost().pid) + " on " + thisHost().hostname + ")";
    postRendezvousError(store, Error::kMismatch, msg);
    throw InvalidArgument(msg);
  }
  store.setOnClose("error", encodeError(Error::kPeerFailure,
                                        me + " closed its connection to the bootstrap store before the communicator "
                                             "formed (it exited or crashed)"));
  store.set("arrive/" + r, std::to_string(size) + " " + me);
  if (rank != 0) {
    std::string zero = waitFor(store, "arrive/0", rank, size, timeout_s, true);
    long long size0 = std::atoll(zero.c_str());
    if (size0 != size) {
      std::string msg = "world size mismatch: world size " + std::to_string(size) + " here (" + me + ") vs " +
                        std::to_string(size0) + " at rank 0";
      postRendezvousError(store, Error::kMismatch, msg);
      throw Error(Error::kMismatch, msg);
    }
  }
  if (store.add("arrived", 1) == size) store.set("complete", "1");
  waitFor(store, "complete", rank, size, timeout_s, true);
}

void rendezvousDone(Store& store) {
  try {
    store.setOnClose("error", "");
    store.formed();
  } catch (...) {
  }
}

}  // namespace harp
