// core/engine/split.cc — Communicator::split: ranks of one color form a new
// communicator, rendezvousing under a store prefix unique to the split.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/engine/communicator.h"
#include "core/observe/recorder.h"

namespace harp {

std::shared_ptr<Communicator> Communicator::split(int color, int key) {
  // Everyone shares (color, key); same-color ranks form a communicator whose
  // rendezvous keys live under a prefix unique to this split.
  std::vector<int64_t> mine{color, key}, all(2 * size_);
  CollArgs a;
  a.coll = CollType::kAllgather;
  a.sendbuf = mine.data();
  a.recvbuf = all.data();
  a.count = 2;
  a.dtype = DataType::kInt64;
  submit(std::move(a), false);
  int seq = ++split_seq_;
  // The new communicators rendezvous through the store, which may live in
  // another rank's process (rank 0 hosts the unique id's server): a barrier
  // on this communicator keeps every rank here until all are done with it.
  std::shared_ptr<Communicator> made;
  std::exception_ptr err;
  if (color >= 0) {
    try {
      made = splitCreate(all, color, seq);
    } catch (...) {
      err = std::current_exception();
    }
  }
  barrier(false);
  if (err) std::rethrow_exception(err);
  return made;
}

std::shared_ptr<Communicator> Communicator::splitCreate(const std::vector<int64_t>& all, int color, int seq) {
  std::vector<std::pair<int64_t, int>> members;
  for (int r = 0; r < size_; ++r)
    if (all[2 * r] == color) members.push_back({all[2 * r + 1], r});
  std::sort(members.begin(), members.end());
  int new_rank = 0;
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i].second == rank_) new_rank = static_cast<int>(i);
  std::string prefix = "split" + std::to_string(comm_id_) + "." + std::to_string(seq) + "." + std::to_string(color) + "/";
  CommOptions o = opts_;
  o.timeout_s = timeout_s_;
  auto made = create(std::make_shared<PrefixStore>(store_, prefix), new_rank, static_cast<int>(members.size()), o);
  // The flight record names the parent's global ranks.
  if (made->recorder_ && recorder_) {
    std::vector<int> parent = recorder_->globalRanks(), g;
    for (auto& m : members) g.push_back(parent.at(m.second));
    made->recorder_->setGlobalRanks(std::move(g));
  }
  return made;
}

}  // namespace harp
