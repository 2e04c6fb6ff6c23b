// transport/verbs/device.h — picking the RDMA device, port and GID.
//
// HARP_IB_HCA     "dev" or "dev:port" (e.g. "mlx5_0:1", "rxe0"); default: the
//                 first device (libibverbs order) with an ACTIVE port.
// HARP_IB_GID_INDEX  GID table index (RoCE). Default: the first RoCE v2 GID
//                 holding an IPv4-mapped address, else the first RoCE v2 GID,
//                 else index 0. InfiniBand ports address peers by LID and use
//                 GID index 0 unless told otherwise.
//
// probeDevice() only reads; it opens and closes the device. Thread-safe (no
// shared state).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>

namespace harp::transport::verbs {

struct DeviceChoice {
  std::string name;        // ibv device name
  int port = 1;
  int gid_index = 0;
  ibv_gid gid{};
  uint8_t link_layer = IBV_LINK_LAYER_UNSPECIFIED;  // IBV_LINK_LAYER_*
  uint16_t lid = 0;
  ibv_mtu active_mtu = IBV_MTU_1024;
  uint32_t max_msg_sz = 0;
  std::string gid_type;    // "RoCE v2", "RoCE v1", "IB"
};

// Chooses per the environment. On failure returns false and sets *why to a
// sentence naming what is missing (no device, named device absent, no active
// port, bad GID index).
bool probeDevice(DeviceChoice* out, std::string* why);

// Same, on an already opened context (used by the transport itself).
bool choosePort(ibv_context* ctx, const std::string& name, int want_port, DeviceChoice* out, std::string* why);

const char* linkLayerName(uint8_t ll);
std::string gidString(const ibv_gid& g);

}  // namespace harp::transport::verbs
