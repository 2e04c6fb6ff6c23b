// core/engine/communicator_obs.cc — the communicator's side of observability: making,
// retiring and dumping its flight recorder (core/observe/recorder.h).
#include <algorithm>

#include "base/env.h"
#include "base/log.h"
#include "base/stall.h"
#include "core/engine/communicator.h"
#include "core/observe/recorder.h"

namespace harp {

// After creation succeeded: HARP_FR_ENTRIES slots (0: no recorder, and no
// stall warning, counters or metrics either), registered process-wide.
void Communicator::attachRecorder() {
  const long long n = env::integer("HARP_FR_ENTRIES");
  res_.stall_warning_s = env::timeout("HARP_STALL_WARNING_S");
  if (n <= 0) return;
  if (n > (1 << 24)) throw InvalidArgument("HARP_FR_ENTRIES=" + std::to_string(n) + ": at most 16777216");
  obs::Identity id;
  id.comm_id = comm_id_;
  id.rank = rank_;
  id.size = size_;
  for (const auto& p : peers_) {
    id.hosts.push_back(p.hostname);
    id.pids.push_back(p.pid);
  }
  id.transport = transport_kind_;
  id.timeout_s = timeout_s_;
  id.secret = token_, id.bind_host = commInfo().bind_hint;  // the job view (core/observe/jobview.h)
  recorder_ = std::make_shared<obs::Recorder>(std::move(id), static_cast<size_t>(n), store_);
  std::vector<char> same_host(size_);  // the job view's links, by peer class
  for (int p = 0; p < size_; ++p) same_host[p] = peers_[p].host_id == peers_[rank_].host_id;
  recorder_->setLinks(res_.transport_of, std::move(same_host));
  res_.recorder = recorder_.get();
  obs::registerRecorder(recorder_);
  // Waits below core/ (transport/shm's own allreduce loop) warn through this.
  std::weak_ptr<obs::Recorder> weak = recorder_;
  stall::set(comm_id_, rank_, res_.stall_warning_s, [weak](double waited_s, const std::string& who) {
    if (auto r = weak.lock()) obs::stallCheck(r.get(), waited_s, who);
  });
}

void Communicator::retireRecorder() {
  if (!recorder_) return;
  stall::set(comm_id_, rank_, 0, nullptr);
  recorder_->setLinks({}, {});  // before the transports go (a job-view request may be reading them)
  obs::retireRecorder(recorder_.get());
  recorder_->detachStore();
}

// A broken communicator writes the process's flight record once
// (HARP_FR_DUMP_ON_FAILURE), naming the file in the log, and asks every rank
// to dump too (core/observe/recorder.h, requestDumps).
void Communicator::recordFailure(const std::string& why) {
  if (!recorder_ || !env::flag("HARP_FR_DUMP_ON_FAILURE") || !recorder_->claimDump()) return;
  std::string err, path = obs::dumpFlightRecord(why, &err);
  if (path.empty()) HARP_WARN("flight record not written: %s", err.c_str());
  else HARP_WARN("flight record written to %s (read it with: python -m torch.distributed.flight_recorder.fr_trace <folder>)",
                 path.c_str());
  recorder_->requestDumps(why);
}

}  // namespace harp
