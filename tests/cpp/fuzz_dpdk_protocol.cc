// tests/cpp/fuzz_dpdk_protocol.cc — a deterministic fuzzer of the DPDK
// transport's protocol state machine (transport/dpdk/protocol.cc), built with
// -fsanitize=address,undefined and run by tests/test_dpdk_fuzz.py.
//
//   fuzz_dpdk_protocol CASE [--iters N] [--seed S]
//
// Frames go straight into Protocol::onFrame (no DPDK), the way the receive
// path hands them over after checking magic, version, communicator and
// destination: everything else in the header is the sender's choice, and
// DATA frames are not authenticated. Every receive buffer is a heap block of
// exactly the posted length, so a write outside it is an AddressSanitizer
// report. Cases:
//   staged-offset  a staged chunk at an offset past the message, then its receive
//   posted-wrap    a chunk whose offset + length wraps at 2^64, into a posted receive
//   zero-flood     zero-byte messages nobody has posted a receive for (staging growth)
//   chunk-flood    one-byte chunks of one unposted message (per-chunk staging cost)
//   random         a real sender's frames, mutated or replaced by random ones
//   roundtrip      two protocols over a lossy, duplicating, reordering link: exact data
//   unproven       frames from a peer whose HELLO proof was not verified yet: none counts
// Prints "OK <case> ..." and exits 0; a violated property prints "FAIL ..." and
// exits 1; a sanitizer report aborts the process.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "transport/dpdk/protocol.h"

extern "C" size_t __sanitizer_get_current_allocated_bytes();  // libasan

using harp::dpdk::FrameIO;
using harp::dpdk::kHdrLen;
using harp::dpdk::PayloadView;
using harp::dpdk::PktType;
using harp::dpdk::Protocol;
using harp::dpdk::ProtocolConfig;
using harp::dpdk::WireHdr;
using harp::transport::Request;
namespace w = harp::dpdk;

namespace {

constexpr uint64_t kComm = 0x77;

struct Rng {
  uint64_t s;
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return n ? next() % n : 0; }
  bool chance(double p) { return (next() >> 11) * 0x1.0p-53 < p; }
};

[[noreturn]] void fail(const std::string& what) {
  printf("FAIL %s\n", what.c_str());
  fflush(stdout);
  exit(1);
}

// Frames a protocol sends, kept whole (header + payload).
struct Capture : FrameIO {
  std::vector<uint8_t> cur;
  std::deque<std::vector<uint8_t>> out;
  uint8_t* begin(int, size_t payload) override {
    cur.assign(kHdrLen + payload, 0);
    return cur.data();
  }
  void commit(int, size_t payload) override {
    cur.resize(kHdrLen + payload);
    out.push_back(std::move(cur));
    if (out.size() > 4096) out.pop_front();  // a victim's acks nobody reads
  }
};

WireHdr dataHdr(uint32_t src, uint32_t dst, uint32_t seq, uint32_t msg_seq, uint64_t offset, uint32_t n,
                uint64_t msg_len, uint64_t tag, uint8_t flags) {
  WireHdr h{};
  h.magic = w::kMagic;
  h.version = w::kVersion;
  h.type = static_cast<uint8_t>(PktType::kData);
  h.flags = flags;
  h.comm_id = kComm;
  h.src_rank = src;
  h.dst_rank = dst;
  h.seq = seq;
  h.msg_seq = msg_seq;
  h.offset = offset;
  h.payload_len = n;
  h.tag = tag;
  h.msg_len = msg_len;
  return h;
}

// A payload of `bytes`, cut into up to 3 segments as a chained mbuf would be.
PayloadView view(const uint8_t* bytes, uint32_t n, Rng* rng) {
  PayloadView v;
  int segs = rng ? 1 + static_cast<int>(rng->below(3)) : 1;
  uint32_t at = 0;
  for (int i = 0; i < segs && at < n; i++) {
    uint32_t c = i + 1 == segs ? n - at : static_cast<uint32_t>(rng->below(n - at + 1));
    v.p[v.segs] = bytes + at;
    v.n[v.segs++] = c;
    v.total += c;
    at += c;
  }
  return v;
}

void feed(Protocol& p, const WireHdr& h, const std::vector<uint8_t>& payload, Rng* rng = nullptr) {
  p.onFrame(h, view(payload.data(), static_cast<uint32_t>(payload.size()), rng));
}

// A receive into a heap block of exactly `len` bytes.
struct Recv {
  Request r;
  std::unique_ptr<uint8_t[]> buf;
  Recv(size_t len, uint64_t tag) : buf(new uint8_t[len ? len : 1]) {
    r.buf = buf.get();
    r.len = len;
    r.tag = tag;
  }
};

ProtocolConfig config(size_t stage_bytes) {
  ProtocolConfig c;
  c.stage_bytes = stage_bytes;
  c.rto_min_ns = 1'000'000;
  return c;
}

// ----------------------------------------------------------------- single cases
void stagedOffset() {
  Capture io;
  Protocol p(kComm, 1, 2, &io, config(1 << 20));
  p.setPeer(0, 1000);
  p.setVerified(0);
  std::vector<uint8_t> pl(100, 0xab);
  // 100 bytes at offset 64 of a 100-byte message: 64 past its end.
  feed(p, dataHdr(0, 1, 0, 0, 64, 100, 100, 5, w::kFlagLast), pl);
  Recv r(100, 5);
  p.irecv(0, &r.r);
  if (r.r.state == Request::kDone) fail("staged-offset: a chunk outside its message completed the receive");
  printf("OK staged-offset: the out-of-bounds chunk was not placed\n");
}

void postedWrap() {
  Capture io;
  Protocol p(kComm, 1, 2, &io, config(1 << 20));
  p.setPeer(0, 1000);
  p.setVerified(0);
  Recv r(100, 5);
  p.irecv(0, &r.r);
  std::vector<uint8_t> pl(100, 0xcd);
  // offset 2^64 - 50: offset + 100 wraps to 50, which is <= 100.
  feed(p, dataHdr(0, 1, 0, 0, ~0ull - 49, 100, 100, 5, 0), pl);
  if (r.r.state == Request::kDone) fail("posted-wrap: a wrapped chunk completed the receive");
  printf("OK posted-wrap: the wrapping chunk was not placed\n");
}

// Heap growth while `frames` frames from `make` arrive for unposted messages.
template <class F>
void flood(const char* name, size_t stage_bytes, int frames, size_t limit, F make) {
  Capture io;
  Protocol p(kComm, 1, 2, &io, config(stage_bytes));
  p.setPeer(0, 1000);
  p.setVerified(0);
  size_t base = __sanitizer_get_current_allocated_bytes(), peak = 0;
  std::vector<uint8_t> pl;
  for (int i = 0; i < frames; i++) {
    WireHdr h = make(i, &pl);
    feed(p, h, pl);
    if (i % 64 == 0) {
      p.tick();
      io.out.clear();
      size_t now = __sanitizer_get_current_allocated_bytes();
      peak = std::max(peak, now > base ? now - base : 0);
    }
  }
  printf("%s: heap grew by %zu bytes for %d frames (stage limit %zu bytes)\n", name, peak, frames, stage_bytes);
  if (peak > limit)
    fail(std::string(name) + ": staging for unposted receives grew the heap by " + std::to_string(peak) +
         " bytes, over " + std::to_string(limit));
  printf("OK %s\n", name);
}

void zeroFlood(int frames) {
  // In-order zero-byte messages 1, 2, 3, ...: each is a new staged entry.
  flood("zero-flood", 1 << 20, frames, 4u << 20, [](int i, std::vector<uint8_t>* pl) {
    pl->clear();
    return dataHdr(0, 1, i, i + 1, 0, 0, 0, 9, w::kFlagFirst | w::kFlagLast);
  });
}

void chunkFlood(int frames) {
  // One-byte chunks of one 16 MiB message at distinct offsets: a chunk each.
  flood("chunk-flood", 1 << 20, frames, 4u << 20, [](int i, std::vector<uint8_t>* pl) {
    pl->assign(1, static_cast<uint8_t>(i));
    return dataHdr(0, 1, i, 1, static_cast<uint64_t>(i) * 1000, 1, 16u << 20, 9, 0);
  });
}

// Everything but HELLO from a peer not yet verified is dropped: data, acks, pings,
// goodbyes and aborts alike. Once verified, the same data frame is taken.
void unproven() {
  Capture io;
  Protocol p(kComm, 1, 2, &io, config(1 << 20));
  p.setPeer(0, 1000);
  Recv r(100, 5);
  p.irecv(0, &r.r);
  std::vector<uint8_t> pl(100, 0xee);
  WireHdr d = dataHdr(0, 1, 0, 0, 0, 100, 100, 5, w::kFlagFirst | w::kFlagLast);
  feed(p, d, pl);
  if (r.r.done()) fail("unproven: a DATA frame from an unverified peer completed a receive");
  for (PktType t : {PktType::kAck, PktType::kPing, PktType::kBye, PktType::kAbort}) {
    WireHdr h = d;
    h.type = static_cast<uint8_t>(t);
    feed(p, h, pl);
  }
  if (!p.controls().empty() || p.peerFailed(0)) fail("unproven: a control frame from an unverified peer was taken");
  WireHdr hello = d;
  hello.type = static_cast<uint8_t>(PktType::kHello);
  hello.tag = w::kHelloAuthVersion;
  feed(p, hello, pl);
  if (p.controls().size() != 1) fail("unproven: a HELLO from an unverified peer was not handed up");
  if (p.stats().unproven != 5) fail("unproven: " + std::to_string(p.stats().unproven) + " frames counted, not 5");
  p.setVerified(0);
  feed(p, d, pl);
  if (r.r.state != Request::kDone || r.buf[99] != 0xee) fail("unproven: a verified peer's frame was not taken");
  printf("OK unproven: 5 frames of an unverified peer dropped, its HELLO handed up, data taken once verified\n");
}

// ----------------------------------------------------------------- random
uint64_t interesting(Rng& g, uint64_t real) {
  switch (g.below(9)) {
    case 0: return 0;
    case 1: return real + 1;
    case 2: return real - 1;
    case 3: return ~0ull - g.below(4096);
    case 4: return 1ull << g.below(64);
    case 5: return g.below(1 << 16);
    case 6: return g.next();
    case 7: return real + g.below(4096);
    default: return real ^ (1ull << g.below(64));
  }
}

void mutate(Rng& g, WireHdr& h, std::vector<uint8_t>& pl) {
  int k = 1 + static_cast<int>(g.below(3));
  for (int i = 0; i < k; i++) {
    switch (g.below(12)) {
      case 0: h.offset = interesting(g, h.offset); break;
      case 1: h.msg_len = interesting(g, h.msg_len); break;
      case 2: h.payload_len = static_cast<uint32_t>(interesting(g, h.payload_len)); break;
      case 3: h.msg_seq = static_cast<uint32_t>(h.msg_seq + static_cast<int>(g.below(9)) - 4); break;
      case 4: h.seq = static_cast<uint32_t>(interesting(g, h.seq)); break;
      case 5: h.flags = static_cast<uint8_t>(g.next()); break;
      case 6: h.type = static_cast<uint8_t>(g.below(8)); break;
      case 7: h.tag = interesting(g, h.tag); break;
      case 8: h.ack = static_cast<uint32_t>(interesting(g, h.ack)); break;
      case 9: h.src_rank = static_cast<uint32_t>(g.chance(0.5) ? g.below(4) : g.next()); break;
      case 10: pl.resize(g.below(g.chance(0.5) ? 64 : 3000)); break;
      default: h.channel = static_cast<uint8_t>(g.next()); break;
    }
  }
}

// What the generated frames reached, so a run that only ever hits the first
// check (and exercises nothing behind it) fails instead of passing.
struct Coverage {
  uint64_t data_rx = 0, staged = 0, malformed = 0, unproven = 0, completed = 0, mismatched = 0;
};

struct Episode {
  Rng& g;
  Coverage& cov;
  Capture vio, sio;  // victim's frames, sender's frames
  std::unique_ptr<Protocol> victim, sender;
  std::deque<std::unique_ptr<Recv>> recvs;
  std::deque<std::unique_ptr<Recv>> sends;  // victim's and sender's send buffers
  std::vector<uint64_t> lens;               // the sender's message k: lens[k] bytes, tag k
  size_t posted = 0;
  Episode(Rng& rng, Coverage& c) : g(rng), cov(c) {
    size_t stage = 1024u << g.below(8);
    victim = std::make_unique<Protocol>(kComm, 1, 3, &vio, config(stage));
    sender = std::make_unique<Protocol>(kComm, 0, 3, &sio, config(stage));
    uint32_t payload = static_cast<uint32_t>(64 + g.below(1500));
    victim->setPeer(0, payload);
    victim->setPeer(2, payload);
    sender->setPeer(1, payload);
    victim->setVerified(0);
    if (g.chance(0.5)) victim->setVerified(2);  // rank 2 is sometimes still unproven
    sender->setVerified(1);
  }
  ~Episode() {  // the protocols hold request pointers: they go first
    const auto& st = victim->stats();
    cov.data_rx += st.data_rx;
    cov.staged += st.staged;
    cov.malformed += st.malformed;
    cov.unproven += st.unproven;
    for (auto& r : recvs) {
      cov.completed += r->r.state == Request::kDone;
      cov.mismatched += r->r.failure == Request::kMismatch;
    }
    victim.reset();
    sender.reset();
  }
  void send(Protocol& p, int peer, uint64_t len, uint64_t tag) {
    auto s = std::make_unique<Recv>(len, tag);
    memset(s->buf.get(), static_cast<int>(tag), len);
    p.isend(peer, &s->r);
    sends.push_back(std::move(s));
  }
  void step() {
    uint64_t a = g.below(100);
    if (a < 8 && lens.size() < 400) {  // the sender posts a message
      uint64_t len = g.chance(0.2) ? 0 : g.below(g.chance(0.8) ? 3000 : 40000);
      lens.push_back(len);
      send(*sender, 1, len, lens.size() - 1);
    } else if (a < 14 && posted < lens.size() + 3) {  // the victim posts a receive (usually matching)
      uint64_t len = posted < lens.size() && g.chance(0.9) ? lens[posted] : g.below(5000);
      recvs.push_back(std::make_unique<Recv>(len, posted));
      victim->irecv(0, &recvs.back()->r);
      posted++;
    } else if (a < 16) {  // the victim sends (forged acks then touch its send state)
      send(*victim, g.chance(0.5) ? 0 : 2, g.below(5000), 77);
    } else if (a < 25) {
      sender->tick();
      victim->tick();
    } else if (a < 26 && g.chance(0.1)) {
      victim->failPeer(g.chance(0.5) ? 0 : 2, "fuzz", g.chance(0.5));
    } else if (a < 60 && !sio.out.empty()) {  // a real frame, maybe mutated, maybe twice
      std::vector<uint8_t> f = sio.out.front();
      if (g.chance(0.7)) sio.out.pop_front();
      WireHdr h;
      memcpy(&h, f.data(), kHdrLen);
      std::vector<uint8_t> pl(f.begin() + kHdrLen, f.end());
      if (g.chance(0.4)) mutate(g, h, pl);
      feed(*victim, h, pl, &g);
    } else if (a < 70) {  // the victim's acks reach the sender
      while (!vio.out.empty()) {
        std::vector<uint8_t> f = std::move(vio.out.front());
        vio.out.pop_front();
        WireHdr h;
        memcpy(&h, f.data(), kHdrLen);
        if (h.dst_rank != 0) continue;
        std::vector<uint8_t> pl(f.begin() + kHdrLen, f.end());
        feed(*sender, h, pl, &g);
      }
    } else {  // a frame made up from scratch
      std::vector<uint8_t> pl(g.below(g.chance(0.5) ? 40 : 2000), static_cast<uint8_t>(g.next()));
      WireHdr h = dataHdr(g.chance(0.8) ? 0 : static_cast<uint32_t>(g.below(4)), 1,
                          static_cast<uint32_t>(g.below(300)), static_cast<uint32_t>(g.below(8)),
                          g.below(50000), static_cast<uint32_t>(pl.size()), g.below(50000), g.below(8),
                          static_cast<uint8_t>(g.next()));
      h.type = static_cast<uint8_t>(1 + g.below(6));
      mutate(g, h, pl);
      feed(*victim, h, pl, &g);
    }
  }
};

void randomCase(uint64_t seed, int iters) {
  Rng g{seed};
  size_t base = __sanitizer_get_current_allocated_bytes();
  size_t peak = 0;
  long steps = 0;
  int episodes = 0;
  Coverage cov;
  while (steps < iters) {
    Episode e(g, cov);
    int n = 200 + static_cast<int>(g.below(3000));
    for (int i = 0; i < n && steps < iters; i++, steps++) {
      e.step();
      if (i % 256 == 0) {
        size_t now = __sanitizer_get_current_allocated_bytes();
        peak = std::max(peak, now > base ? now - base : 0);
      }
    }
    episodes++;
  }
  if (peak > (256u << 20)) fail("random: the heap grew by " + std::to_string(peak) + " bytes");
  printf("random: data frames taken %llu (staged %llu), malformed %llu, unproven %llu; receives completed %llu, "
         "mismatched %llu\n",
         (unsigned long long)cov.data_rx, (unsigned long long)cov.staged, (unsigned long long)cov.malformed,
         (unsigned long long)cov.unproven, (unsigned long long)cov.completed, (unsigned long long)cov.mismatched);
  if (iters >= 10000 && !(cov.data_rx && cov.staged && cov.malformed && cov.completed && cov.mismatched))
    fail("random: the generated frames did not reach every path (see the counts above)");
  printf("OK random: %ld steps in %d episodes, seed %llu, peak heap growth %zu bytes\n", steps, episodes,
         (unsigned long long)seed, peak);
}

// ----------------------------------------------------------------- roundtrip
void roundtrip(uint64_t seed, int iters) {
  Rng g{seed};
  long messages = 0, bytes = 0;
  for (int round = 0; messages < iters; round++) {
    Capture aio, bio;
    ProtocolConfig c = config(64u << 10);
    c.rto_min_ns = 0;  // no waiting on the clock: every tick may resend
    Protocol a(kComm, 0, 2, &aio, c), b(kComm, 1, 2, &bio, c);
    uint32_t payload = static_cast<uint32_t>(64 + g.below(1500));
    a.setPeer(1, payload);
    b.setPeer(0, payload);
    a.setVerified(1);
    b.setVerified(0);
    int n = 1 + static_cast<int>(g.below(40));
    std::vector<std::unique_ptr<Recv>> sends, recvs;
    for (int i = 0; i < n; i++) {
      uint64_t len = g.chance(0.2) ? 0 : g.below(g.chance(0.7) ? 2000 : 30000);
      sends.push_back(std::make_unique<Recv>(len, i));
      for (uint64_t k = 0; k < len; k++) sends.back()->buf[k] = static_cast<uint8_t>(k * 31 + i);
      a.isend(1, &sends.back()->r);
      recvs.push_back(std::make_unique<Recv>(len, i));
    }
    double drop = g.below(3) * 0.05, dup = g.below(3) * 0.05, hold = g.below(3) * 0.05;
    auto deliver = [&](Capture& from, Protocol& to) {
      std::vector<std::vector<uint8_t>> held;
      while (!from.out.empty()) {
        std::vector<uint8_t> f = std::move(from.out.front());
        from.out.pop_front();
        if (g.chance(drop)) continue;
        if (g.chance(hold)) {
          held.push_back(std::move(f));
          continue;
        }
        WireHdr h;
        memcpy(&h, f.data(), kHdrLen);
        std::vector<uint8_t> pl(f.begin() + kHdrLen, f.end());
        feed(to, h, pl, &g);
        if (g.chance(dup)) feed(to, h, pl, &g);
      }
      for (auto& f : held) from.out.push_back(std::move(f));
    };
    int posted = 0;
    uint64_t t0 = Protocol::nowNs();
    for (;;) {
      if (posted < n && g.chance(0.3)) b.irecv(0, &recvs[posted++]->r);
      a.tick();
      deliver(aio, b);
      b.tick();
      deliver(bio, a);
      bool all = posted == n;
      for (auto& r : recvs) all &= r->r.done();
      if (all) break;
      if (Protocol::nowNs() - t0 > 20'000'000'000ull)
        fail("roundtrip: round " + std::to_string(round) + " did not complete in 20 s");
    }
    for (int i = 0; i < n; i++) {
      const Request& r = recvs[i]->r;
      if (r.state != Request::kDone) fail("roundtrip: message " + std::to_string(i) + " failed: " + r.error);
      if (r.len && memcmp(recvs[i]->buf.get(), sends[i]->buf.get(), r.len) != 0)
        fail("roundtrip: message " + std::to_string(i) + " arrived with wrong bytes");
      bytes += static_cast<long>(r.len);
    }
    messages += n;
  }
  printf("OK roundtrip: %ld messages, %ld bytes exact, seed %llu\n", messages, bytes, (unsigned long long)seed);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: fuzz_dpdk_protocol CASE [--iters N] [--seed S]\n");
    return 2;
  }
  std::string c = argv[1];
  int iters = 100000;
  uint64_t seed = 1;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--iters") iters = atoi(argv[i + 1]);
    else if (a == "--seed") seed = strtoull(argv[i + 1], nullptr, 10);
    else {
      fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (c == "staged-offset") stagedOffset();
  else if (c == "posted-wrap") postedWrap();
  else if (c == "zero-flood") zeroFlood(iters);
  else if (c == "chunk-flood") chunkFlood(iters);
  else if (c == "random") randomCase(seed, iters);
  else if (c == "roundtrip") roundtrip(seed, iters);
  else if (c == "unproven") unproven();
  else {
    fprintf(stderr, "unknown case %s\n", c.c_str());
    return 2;
  }
  return 0;
}
