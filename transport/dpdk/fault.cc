// transport/dpdk/fault.cc — parsing of the fault-injection settings (fault.h).
#include "transport/dpdk/fault.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "base/env.h"
#include "base/types.h"

namespace harp::dpdk {

FaultConfig FaultConfig::fromEnv(int rank) {
  FaultConfig c;
  c.drop = env::real("HARP_DPDK_DROP");
  std::string spec = env::str("HARP_DPDK_FAULT");
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    std::string k = item.substr(0, eq);
    std::string v = eq == std::string::npos ? "" : item.substr(eq + 1);
    char* end = nullptr;
    double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || x < 0)
      throw InvalidArgument("HARP_DPDK_FAULT='" + spec + "': '" + item + "' is not key=number");
    if (k == "drop") c.drop = x;
    else if (k == "dup") c.dup = x;
    else if (k == "reorder") c.reorder = x;
    else if (k == "seed") c.seed = static_cast<uint64_t>(x);
    else if (k == "hold_proofs" && (x == 0 || x == 1)) c.hold_proofs = x == 1;
    else if (k == "hold_proofs")
      throw InvalidArgument("HARP_DPDK_FAULT='" + spec + "': hold_proofs is 0 or 1");
    else
      throw InvalidArgument("HARP_DPDK_FAULT='" + spec + "': unknown key '" + k +
                            "' (use drop=, dup=, reorder=, seed=, hold_proofs=)");
  }
  if (c.drop >= 1 || c.dup >= 1 || c.reorder >= 1)
    throw InvalidArgument("HARP_DPDK_FAULT / HARP_DPDK_DROP: rates must be below 1");
  c.seed = c.seed * 1000003ull + static_cast<uint64_t>(rank) + 1;
  return c;
}

std::string FaultConfig::describe() const {
  char b[128];
  snprintf(b, sizeof b, "drop=%.3f dup=%.3f reorder=%.3f hold_proofs=%d", drop, dup, reorder, hold_proofs ? 1 : 0);
  return b;
}

}  // namespace harp::dpdk
