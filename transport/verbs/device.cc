// transport/verbs/device.cc — RDMA device, port and GID selection (see device.h).
#include "transport/verbs/device.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "base/env.h"

namespace harp::transport::verbs {

const char* linkLayerName(uint8_t ll) {
  switch (ll) {
    case IBV_LINK_LAYER_INFINIBAND: return "InfiniBand";
    case IBV_LINK_LAYER_ETHERNET: return "Ethernet";
    default: return "unspecified";
  }
}

std::string gidString(const ibv_gid& g) {
  char buf[INET6_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET6, g.raw, buf, sizeof buf);
  return buf;
}

static bool isZero(const ibv_gid& g) {
  for (uint8_t b : g.raw)
    if (b) return false;
  return true;
}

static bool isV4Mapped(const ibv_gid& g) {
  static const uint8_t pre[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, pre, 12) == 0;
}

static bool parseHca(std::string* dev, int* port, std::string* why) {
  std::string v = env::str("HARP_IB_HCA");
  *port = 0;
  dev->clear();
  if (v.empty()) return true;
  auto colon = v.find(':');
  *dev = v.substr(0, colon);
  if (colon != std::string::npos) {
    try {
      *port = std::stoi(v.substr(colon + 1));
    } catch (...) {
      *why = "HARP_IB_HCA='" + v + "': the port after ':' is not a number";
      return false;
    }
    if (*port < 1) {
      *why = "HARP_IB_HCA='" + v + "': ports are numbered from 1";
      return false;
    }
  }
  return true;
}

bool choosePort(ibv_context* ctx, const std::string& name, int want_port, DeviceChoice* out, std::string* why) {
  ibv_device_attr da{};
  if (ibv_query_device(ctx, &da)) {
    *why = "ibv_query_device(" + name + ") failed: " + std::strerror(errno);
    return false;
  }
  int first = want_port ? want_port : 1, last = want_port ? want_port : da.phys_port_cnt;
  if (want_port > da.phys_port_cnt) {
    *why = "HARP_IB_HCA: device " + name + " has " + std::to_string(da.phys_port_cnt) + " port(s), not " +
           std::to_string(want_port);
    return false;
  }
  std::string states;
  for (int p = first; p <= last; ++p) {
    ibv_port_attr pa{};
    if (ibv_query_port(ctx, p, &pa)) {
      *why = "ibv_query_port(" + name + ", " + std::to_string(p) + ") failed: " + std::strerror(errno);
      return false;
    }
    if (pa.state != IBV_PORT_ACTIVE) {
      states += (states.empty() ? "" : ", ") + std::string("port ") + std::to_string(p) + " is " +
                ibv_port_state_str(pa.state);
      continue;
    }
    out->name = name;
    out->port = p;
    out->link_layer = pa.link_layer == IBV_LINK_LAYER_UNSPECIFIED ? static_cast<uint8_t>(IBV_LINK_LAYER_INFINIBAND) : pa.link_layer;
    out->lid = pa.lid;
    out->active_mtu = pa.active_mtu;
    out->max_msg_sz = pa.max_msg_sz;
    // GID: explicit index, or the best RoCE v2 entry.
    long long want_gid = env::integer("HARP_IB_GID_INDEX");
    if (want_gid >= 0) {
      if (want_gid >= pa.gid_tbl_len) {
        *why = "HARP_IB_GID_INDEX=" + std::to_string(want_gid) + " is outside " + name + " port " +
               std::to_string(p) + "'s GID table (" + std::to_string(pa.gid_tbl_len) + " entries)";
        return false;
      }
      ibv_gid_entry e{};
      if (ibv_query_gid_ex(ctx, p, static_cast<uint32_t>(want_gid), &e, 0) || isZero(e.gid)) {
        *why = "HARP_IB_GID_INDEX=" + std::to_string(want_gid) + ": GID entry " + std::to_string(want_gid) +
               " of " + name + " port " + std::to_string(p) + " is empty";
        return false;
      }
      out->gid_index = static_cast<int>(want_gid);
      out->gid = e.gid;
      out->gid_type = e.gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" : e.gid_type == IBV_GID_TYPE_ROCE_V1 ? "RoCE v1" : "IB";
      return true;
    }
    int best = -1, best_score = -1;
    ibv_gid_entry best_e{};
    for (int i = 0; i < pa.gid_tbl_len; ++i) {
      ibv_gid_entry e{};
      if (ibv_query_gid_ex(ctx, p, i, &e, 0)) continue;  // empty entries report ENODATA
      if (isZero(e.gid)) continue;
      int score = 0;
      if (out->link_layer == IBV_LINK_LAYER_ETHERNET) {
        if (e.gid_type == IBV_GID_TYPE_ROCE_V2) score += 2;
        if (isV4Mapped(e.gid)) score += 1;
      }
      if (score > best_score) {
        best = i;
        best_score = score;
        best_e = e;
      }
    }
    if (best < 0) {
      if (out->link_layer == IBV_LINK_LAYER_ETHERNET) {
        *why = name + " port " + std::to_string(p) + " has no GID (is its netdev up with an address?)";
        return false;
      }
      best = 0;  // InfiniBand: LID routing; GID 0 may legitimately be the subnet prefix only
      ibv_query_gid(ctx, p, 0, &best_e.gid);
      best_e.gid_type = IBV_GID_TYPE_IB;
    }
    out->gid_index = best;
    out->gid = best_e.gid;
    out->gid_type = best_e.gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" : best_e.gid_type == IBV_GID_TYPE_ROCE_V1 ? "RoCE v1" : "IB";
    return true;
  }
  *why = "RDMA device " + name + " has no ACTIVE port (" + states + ")";
  return false;
}

bool probeDevice(DeviceChoice* out, std::string* why) {
  std::string want;
  int want_port = 0;
  if (!parseHca(&want, &want_port, why)) return false;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) {
    *why = std::string("no RDMA device: ibv_get_device_list failed: ") + std::strerror(errno) +
           " (is the ib_uverbs kernel module loaded and /dev/infiniband present?)";
    return false;
  }
  if (n == 0) {
    ibv_free_device_list(list);
    *why = "no RDMA device found (libibverbs lists none; load the NIC's driver, or create a Soft-RoCE device: "
           "rdma link add rxe0 type rxe netdev <interface>)";
    return false;
  }
  std::string names, reasons;
  bool ok = false;
  for (int i = 0; i < n && !ok; ++i) {
    std::string name = ibv_get_device_name(list[i]);
    names += (names.empty() ? "" : ", ") + name;
    if (!want.empty() && name != want) continue;
    ibv_context* ctx = ibv_open_device(list[i]);
    if (!ctx) {
      reasons += (reasons.empty() ? "" : "; ") + std::string("cannot open ") + name + ": " + std::strerror(errno);
      continue;
    }
    std::string w;
    ok = choosePort(ctx, name, want_port, out, &w);
    if (!ok) reasons += (reasons.empty() ? "" : "; ") + w;
    ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  if (ok) return true;
  if (!want.empty() && reasons.empty())
    *why = "HARP_IB_HCA=" + want + ": no such RDMA device (found: " + names + ")";
  else
    *why = "no usable RDMA device: " + reasons;
  return false;
}

}  // namespace harp::transport::verbs
