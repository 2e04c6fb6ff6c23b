// transport/registry.cc — the table of transports: the built-in ones (tcp,
// shm register themselves when libharp.so loads) and the optional runtime
// modules (verbs, dpdk), loaded with dlopen from the directory that holds
// libharp.so the first time the table is read.
//
// A module is libharp-<name>.so and exports one C symbol,
//   int harp_transport_register(int abi)   (see HARP_REGISTER_TRANSPORT),
// which registers its TransportSpec and returns 0. When the module was not
// built (its libraries were missing at build time), or dlopen fails (its system
// libraries are missing on this machine: libibverbs.so.1, librte_eal.so.23...),
// or it was built for another HARP_TRANSPORT_ABI, the transport is still listed,
// as unavailable, with the reason: the build-time reason or the dlerror text.
//
// Lifetime: modules stay loaded until the process exits (never dlclose-d:
// their code backs transports that may still be alive). Threading: loading
// happens once, under std::call_once; afterwards the table is read-only.
#include <dlfcn.h>
#include <unistd.h>

#include <mutex>

#include "build_reasons.h"  // generated: why an optional module was not built
#include "transport/transport.h"

namespace harp::transport {

const Transport::Capability LinkStatus::kCapability{"link status"};

namespace {
// The optional transports, in the order they are listed after the built-ins.
constexpr const char* kModules[] = {"verbs", "dpdk"};

std::vector<TransportSpec>& specs() {
  static std::vector<TransportSpec> v;
  return v;
}

std::vector<ModuleStatus>& modules() {
  static std::vector<ModuleStatus> v;
  return v;
}

bool registered(const std::string& name) {
  for (const auto& s : specs())
    if (s.name == name) return true;
  return false;
}

// Directory of the libharp.so this code runs in ("" if unknown).
std::string libraryDir() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&registerTransport), &info) || !info.dli_fname) return "";
  std::string path = info.dli_fname;
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string buildReason(const std::string& name) {
  for (const auto& r : kBuildReasons)
    if (r.name && name == r.name) return r.why;
  return "";
}

// dlopen the module and call its entry point; "" on success, else why not.
std::string loadModule(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    return "cannot load " + path + ": " + (e ? e : "dlopen failed");
  }
  using RegisterFn = int (*)(int);
  auto fn = reinterpret_cast<RegisterFn>(dlsym(h, "harp_transport_register"));
  if (!fn) return path + " does not export harp_transport_register (not a HARP transport module)";
  int rc = fn(HARP_TRANSPORT_ABI);
  if (rc != 0)
    return path + " was built for transport ABI " + std::to_string(rc) + ", this libharp.so has " +
           std::to_string(HARP_TRANSPORT_ABI) + " (reinstall harp)";
  return "";
}

void addPlaceholder(const std::string& name, const std::string& why) {
  TransportSpec s;
  s.name = name;
  s.priority = -1;
  s.unavailable = [why] { return why; };
  s.reachable = [](const PeerInfo&, const PeerInfo&) { return false; };
  specs().push_back(std::move(s));
}

void loadModules() {
  const std::string dir = libraryDir();
  for (const char* name : kModules) {
    ModuleStatus m;
    m.name = name;
    m.path = dir + "/libharp-" + m.name + ".so";
    if (registered(m.name)) {  // linked in statically (a selftest)
      m.loaded = true;
      modules().push_back(m);
      continue;
    }
    std::string built_without = buildReason(m.name);
    if (!built_without.empty() && access(m.path.c_str(), F_OK) != 0)
      m.error = "the " + m.name + " transport module was not built: " + built_without;
    else
      m.error = loadModule(m.path);
    m.loaded = m.error.empty();
    if (!m.loaded) addPlaceholder(m.name, m.error);
    modules().push_back(m);
  }
}

std::once_flag& loadOnce() {
  static std::once_flag once;
  return once;
}
}  // namespace

int registerTransport(TransportSpec spec) {
  specs().push_back(std::move(spec));
  return static_cast<int>(specs().size());
}

const std::vector<TransportSpec>& registeredTransports() {
  std::call_once(loadOnce(), loadModules);
  return specs();
}

const std::vector<ModuleStatus>& transportModules() {
  std::call_once(loadOnce(), loadModules);
  return modules();
}

const TransportSpec* findTransport(const std::string& name) {
  for (const auto& s : registeredTransports())
    if (s.name == name) return &s;
  return nullptr;
}

}  // namespace harp::transport
