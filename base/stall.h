// base/stall.h — the stall-warning hook long waits call.
//
// A communicator registers, per (communicator id, rank), what to do when one
// of its waits has lasted HARP_STALL_WARNING_S (core/observe/recorder.h: publish and
// compare op counters, log the ranks that have not started the collective).
// Waits that live below core/ (a transport's own collective loop, e.g.
// transport/shm's waitFor) reach it through a Watch, which costs nothing
// until the wait has lasted kMinStallS: only then does it look the hook up.
//
//   stall::Watch watch(info_.comm_id, info_.rank, timeout_s);
//   ... in the blocking branch of the wait:
//   watch.tick(seconds_waited, [&] { return std::string("rank(s) 3"); });
//
// The hook fires at most once per Watch, at min(HARP_STALL_WARNING_S, half
// the wait's timeout). Threading: set() from any thread; the hook runs on the
// waiting thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace harp::stall {

using Fn = std::function<void(double waited_s, const std::string& waiting_for)>;

constexpr double kMinStallS = 0.1;  // a Watch looks nothing up before this

// Registers (fn non-empty) or removes (fn empty) the hook of (comm_id, rank).
void set(uint64_t comm_id, int rank, double after_s, Fn fn);
// The hook and its threshold; false when none.
bool find(uint64_t comm_id, int rank, double* after_s, Fn* fn);

class Watch {
 public:
  Watch(uint64_t comm_id, int rank, double timeout_s) : comm_(comm_id), rank_(rank), timeout_s_(timeout_s) {}
  template <class Who>
  void tick(double waited_s, Who&& who) {
    if (done_ || waited_s < kMinStallS) return;
    if (!looked_) {
      looked_ = true;
      if (!find(comm_, rank_, &after_s_, &fn_)) {
        done_ = true;
        return;
      }
      if (after_s_ > timeout_s_ / 2) after_s_ = timeout_s_ / 2;
    }
    if (waited_s < after_s_) return;
    done_ = true;
    fn_(waited_s, who());
  }

 private:
  uint64_t comm_;
  int rank_;
  double timeout_s_;
  double after_s_ = 0;
  bool looked_ = false, done_ = false;
  Fn fn_;
};

}  // namespace harp::stall
