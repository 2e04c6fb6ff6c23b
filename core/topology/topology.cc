#include "core/topology/topology.h"

#include <algorithm>
#include <map>

#include "bootstrap/socket.h"

namespace harp {

Topology Topology::fromPeers(const std::vector<transport::PeerInfo>& peers, const std::vector<std::string>& nics) {
  Topology t;
  t.size = static_cast<int>(peers.size());
  t.host_of.assign(t.size, 0);
  t.local_rank_of.assign(t.size, 0);
  std::map<std::string, int> index;  // host key -> host index (first seen = lowest rank)
  for (int r = 0; r < t.size; ++r) {
    auto [it, fresh] = index.emplace(peers[r].host_id, static_cast<int>(t.ranks_of.size()));
    if (fresh) {
      t.ranks_of.emplace_back();
      t.host_ids.push_back(peers[r].host_id);
      t.hostnames.push_back(peers[r].hostname);
    }
    t.host_of[r] = it->second;
    t.local_rank_of[r] = static_cast<int>(t.ranks_of[it->second].size());
    t.ranks_of[it->second].push_back(r);
  }
  t.hosts = std::max<int>(1, static_cast<int>(t.ranks_of.size()));
  t.min_local = t.max_local = t.ranks_of.empty() ? 1 : static_cast<int>(t.ranks_of[0].size());
  for (const auto& h : t.ranks_of) {
    t.min_local = std::min(t.min_local, static_cast<int>(h.size()));
    t.max_local = std::max(t.max_local, static_cast<int>(h.size()));
    for (size_t i = 1; i < h.size(); ++i) t.blocked = t.blocked && h[i] == h[i - 1] + 1;
  }
  t.nics = nics;
  t.nics.resize(t.size);
  return t;
}

std::vector<int> Topology::rail(int i) const {
  std::vector<int> out;
  for (const auto& h : ranks_of)
    if (i >= 0 && i < static_cast<int>(h.size())) out.push_back(h[i]);
  return out;
}

std::string Topology::describe() const {
  std::string s = std::to_string(size) + " ranks on " + std::to_string(hosts) + " host(s), " +
                  std::to_string(min_local) + (uniform() ? "" : "-" + std::to_string(max_local)) + " per host";
  for (size_t h = 0; h < ranks_of.size(); ++h) {
    s += "\n  host " + std::to_string(h) + " (" + hostnames[h] + "): ranks";
    for (int r : ranks_of[h]) s += " " + std::to_string(r);
    s += "; nics of rank " + std::to_string(ranks_of[h][0]) + ": " + nics[ranks_of[h][0]];
  }
  for (int i = 0; i < max_local; ++i) {
    s += "\n  rail " + std::to_string(i) + (i == 0 ? " (leaders):" : ":");
    for (int r : rail(i)) s += " " + std::to_string(r);
  }
  return s;
}

std::string localNics() {
  std::string s;
  for (const Interface& itf : findInterfaces("")) s += (s.empty() ? "" : ",") + itf.name + "=" + itf.addr.host();
  return s;
}

}  // namespace harp
