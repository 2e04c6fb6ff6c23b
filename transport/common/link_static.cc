// transport/common/link_static.cc — registers a transport module's objects that are
// linked straight into an executable (the verbs and dpdk selftests use the
// transport classes directly, so they link the objects, not the dlopen-ed
// module). Runs once at start-up, before main; the registry then skips the
// module of the same name.
#include "transport/transport.h"

extern "C" int harp_transport_register(int abi);

namespace {
const int kRegistered = harp_transport_register(HARP_TRANSPORT_ABI);
}  // namespace
