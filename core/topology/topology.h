// core/topology/topology.h — which ranks share a host, and the sub-communicators of the
// two legs of a hierarchical collective.
//
// Topology is the host map of one communicator, computed once at creation from
// the confirmed host keys (bootstrap/bootstrap.h: thisHost, confirmHostIds):
//
//   Topology t = Topology::fromPeers(peers, nics);
//   t.hosts                 // 2 hosts, ordered by their lowest rank
//   t.host_of[r]            // host index of rank r
//   t.local_rank_of[r]      // r's position among its host's ranks (ascending rank)
//   t.ranks_of[h]           // the ranks of host h, ascending; sizes may differ
//   t.rail(i)               // the i-th rank of every host that has more than i ranks
//   t.leaders()             // == t.rail(0): the lowest rank of every host
//
// Uneven hosts (3 + 1 ranks) are normal: min_local / max_local say so, rails
// beyond the smallest host have fewer members, and algorithms that need equal
// hosts declare it (Restrictions::uniform_hosts, core/algorithms/algorithm.h).
// `nics` is display only (harp.topology, HARP_DEBUG=INFO): each rank's
// interfaces as "name=address,..." (bootstrap/socket.h findInterfaces).
//
// SubComms are the communicators a hierarchical algorithm runs on: `intra`
// (this host's ranks; shm where it reaches) and `rail` (this rank's rail,
// tcp between hosts; rail 0 is the leaders' communicator). Either is nullptr
// where it would have one member. The owning Communicator creates them the
// first time an algorithm asks (Context::subComms), collectively over a
// PrefixStore of its own store, and destroys them with itself
// (core/engine/communicator_topology.cc). Algorithms call the sub-communicators'
// ordinary collectives (runOn below), never copies of them.
//
// Threading: a Topology is immutable after creation; SubComms are touched
// only by the thread executing a collective of the owner.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/types.h"
#include "transport/transport.h"

namespace harp {

class Group;  // core/algorithms/group.h

struct Topology {
  int size = 1;
  int hosts = 1;
  int min_local = 1, max_local = 1;  // ranks on the smallest / largest host
  bool blocked = true;                // every host's ranks are consecutive (block placement)
  std::vector<int> host_of, local_rank_of;       // by rank
  std::vector<std::vector<int>> ranks_of;        // by host
  std::vector<std::string> host_ids, hostnames;  // by host
  std::vector<std::string> nics;                 // by rank (display)

  static Topology fromPeers(const std::vector<transport::PeerInfo>& peers, const std::vector<std::string>& nics);
  bool uniform() const { return min_local == max_local; }
  std::vector<int> rail(int i) const;
  std::vector<int> leaders() const { return rail(0); }
  // One line per host: "host 0 (name, key): ranks 0 1 | nics: ...", then rails.
  std::string describe() const;
};

// This process's interfaces, "eth0=10.0.0.1,lo=127.0.0.1" (Topology::nics).
std::string localNics();

struct SubComms {
  std::shared_ptr<Group> intra;     // this host's ranks (nullptr: alone on the host)
  std::shared_ptr<Group> rail;      // this rank's rail (nullptr: no other host has a rank at its position)
  int local_rank = 0;                   // position on this host (0: the host's leader)
  int host = 0;                         // this rank's host index
  const Topology* topo = nullptr;       // the owner's host map (rail 0 holds host h at position h)
};

}  // namespace harp
