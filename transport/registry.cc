#include <mutex>
#include <sstream>

#include "transport/transport.h"

namespace harp::transport {
namespace {
std::vector<TransportSpec>& specs() {
  static std::vector<TransportSpec> v;
  return v;
}

// Transports whose folder was present but whose system libraries were not
// found at build time are registered as placeholders that say why.
void registerMissing() {
  std::stringstream ss(HARP_MISSING_TRANSPORTS);
  std::string item;
  while (std::getline(ss, item, ';')) {
    auto eq = item.find('=');
    if (eq == std::string::npos) continue;
    std::string name = item.substr(0, eq);
    std::string why = "the " + name + " transport was not built: " + item.substr(eq + 1) +
                      " (install the library and reinstall harp)";
    TransportSpec s;
    s.name = name;
    s.priority = -1;
    s.unavailable = [why] { return why; };
    s.reachable = [](const PeerInfo&, const PeerInfo&) { return false; };
    specs().push_back(std::move(s));
  }
}
}  // namespace

int registerTransport(TransportSpec spec) {
  specs().push_back(std::move(spec));
  return static_cast<int>(specs().size());
}

const std::vector<TransportSpec>& registeredTransports() {
  static std::once_flag once;
  std::call_once(once, registerMissing);
  return specs();
}

const TransportSpec* findTransport(const std::string& name) {
  for (const auto& s : registeredTransports())
    if (s.name == name) return &s;
  return nullptr;
}

}  // namespace harp::transport
