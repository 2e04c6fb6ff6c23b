// transport/dpdk/fault.h — fault injection on received frames, for tests of
// the reliable protocol: drop, duplicate, or hold back (reorder) a fraction of
// every HARP frame (data, acks and control alike) before the protocol sees it;
// and, for the handshake's lost-confirmation path, hold back a peer's proofs:
// every HELLO of a peer that could prove it (flag HEARD, PROTOCOL.md section 3)
// loses its proof until a DATA frame of that peer has arrived: it reaches the
// protocol as a first-contact HELLO carrying only the peer's nonce, so this
// rank can still prove itself. The peer, which has verified this rank, then
// surely sends data this rank must refuse and take again once a later HELLO
// proves the peer (drop= reaches that path only by chance).
//
//   HARP_DPDK_FAULT="drop=0.05,dup=0.02,reorder=0.03,seed=7"
//   HARP_DPDK_FAULT="hold_proofs=1"
//   HARP_DPDK_DROP=0.05          (shorthand for drop=)
//
// Threading: owned by one transport, used by its driving thread only.
#pragma once

#include <cstdint>
#include <string>

namespace harp::dpdk {

struct FaultConfig {
  double drop = 0, dup = 0, reorder = 0;
  uint64_t seed = 0;
  bool hold_proofs = false;  // a peer's proving HELLOs lose their proof until its first DATA frame
  bool any() const { return drop > 0 || dup > 0 || reorder > 0 || hold_proofs; }
  // From the environment; throws harp::Error(kInvalidArgument) on bad syntax.
  static FaultConfig fromEnv(int rank);
  std::string describe() const;
};

// xorshift64*: cheap, deterministic per seed.
class FaultRng {
 public:
  explicit FaultRng(uint64_t seed) : s_(seed ? seed : 0x9E3779B97F4A7C15ull) {}
  double next() {
    s_ ^= s_ >> 12;
    s_ ^= s_ << 25;
    s_ ^= s_ >> 27;
    return static_cast<double>((s_ * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
  }

 private:
  uint64_t s_;
};

}  // namespace harp::dpdk
