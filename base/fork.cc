// base/fork.cc — the fork generation (base/fork.h): a pthread_atfork child
// handler, registered when the library loads, counts the forks.
#include "base/fork.h"

#include <pthread.h>

namespace harp::detail {

std::atomic<uint64_t> g_fork_generation{0};

namespace {
void onForkChild() { g_fork_generation.fetch_add(1, std::memory_order_relaxed); }

[[maybe_unused]] const int g_registered = pthread_atfork(nullptr, nullptr, onForkChild);
}  // namespace

}  // namespace harp::detail
