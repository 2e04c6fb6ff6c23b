// harp-delayline — the arena's switch when its links need round-trip time,
// jitter or loss: an Ethernet switch in user space that holds every frame
// until its due time (harp-cluster up --delay/--jitter/--loss/--host-delay/
// --zones; python/harp_dev/cluster/net.py starts one per NIC in the switch
// namespace). This machine's kernel has no netem; tbf on the veths still
// shapes the rate, this process adds the time a frame spends on the wire.
//
// Usage:
//   harp-delayline [--delay NS] [--jitter NS] [--loss PPM] [--zone-delay NS]
//                  [--queue-bytes N] [--seed N] [--stats FILE] [--no-rt]
//                  --port IFNAME,MAC,ZONE,EXTRA_NS ...
//
// Each --port is one switch port: a veth end in this namespace (not on a
// bridge) whose peer is host i's NIC with address MAC. A frame from port a to
// port b is sent at
//   arrival + delay + extra[a] + extra[b] + (zone[a] != zone[b] ? zone_delay : 0)
//   + jitter drawn uniformly in [-jitter, +jitter] (never before arrival),
// and never before the previous frame of the same (a, b) pair: a pair's
// frames keep their order, as on a real path (jitter without reordering).
// One wire packet in 1e6/PPM is dropped (uniform): a frame, or one segment of
// a TCP/IPv4 GSO frame (below). Unicast frames go to
// the port of their destination MAC; broadcast, multicast and unknown ones to
// every other port. Frames queued beyond --queue-bytes (default 64 MiB) are
// dropped, like a switch's full buffer.
//
// Frames are read and written with their virtio-net header (PACKET_VNET_HDR),
// so TCP's 64 KB GSO frames cross as one frame each. With --loss, each wire
// segment of a TCP/IPv4 GSO frame (gso_size payload bytes) is lost on its own
// draw, as on a real wire: the segments kept go on as GSO frames of
// consecutive segments (IP length, id and header checksum, TCP sequence
// number, flags and pseudo-header seed rewritten per piece, as the kernel's
// own segmentation would), so loss costs the hosts no offload: a 1 Gbit/s
// line needs ~2k frames/s, not ~80k. Other frames are lost whole.
//
// Waiting: ppoll on the ports until the earliest due frame, timer slack 1 ns;
// no busy polling (ranks share the cores); SCHED_FIFO priority 10 (unless
// --no-rt), so that ranks spinning on the same cores do not delay the wire. Prints "READY" on stdout once every
// port is open. On SIGTERM/SIGINT it writes its counters to --stats (if
// given) and exits. Linux only; needs CAP_NET_RAW in the switch namespace.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_PORTS 64
#define FRAME_MAX (128 * 1024)  // a GSO frame (64 KB, or larger with BIG TCP) plus headers
#define BATCH 64

struct port {
  int fd;
  unsigned char mac[6];
  int zone;
  int64_t extra_ns;
  char name[IFNAMSIZ];
};

struct frame {
  int64_t due;
  uint64_t seq;  // arrival order: ties keep it
  int out;       // destination port
  size_t len;
  unsigned char* data;  // virtio-net header + Ethernet frame
};

static struct port ports[MAX_PORTS];
static int nports;
static int64_t delay_ns, jitter_ns, zone_delay_ns;
static uint32_t loss_ppm;
static size_t queue_cap = 64u << 20, queued_bytes;
static int64_t last_due[MAX_PORTS][MAX_PORTS];
static uint64_t rng = 0x9e3779b97f4a7c15ull, seq;
static volatile sig_atomic_t stop;
static int no_rt;
static uint64_t n_in, n_out, n_lost, n_full, n_trunc, n_send_err, n_flood;
static uint64_t n_segments, n_seg_lost, n_split;  // GSO frames: wire segments seen, lost; frames cut around a loss

// Binary min-heap of queued frames by (due, seq).
static struct frame* heap;
static size_t heap_n, heap_cap;
// Free buffers.
static unsigned char** pool;
static size_t pool_n, pool_cap;

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static uint64_t next_rand(void) {  // xorshift64*
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return rng * 2685821657736338717ull;
}

static int before(const struct frame* a, const struct frame* b) {
  return a->due < b->due || (a->due == b->due && a->seq < b->seq);
}

static void heap_push(struct frame f) {
  if (heap_n == heap_cap) {
    heap_cap = heap_cap ? heap_cap * 2 : 1024;
    heap = realloc(heap, heap_cap * sizeof *heap);
    if (!heap) { perror("harp-delayline: realloc"); exit(1); }
  }
  size_t i = heap_n++;
  heap[i] = f;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!before(&heap[i], &heap[p])) break;
    struct frame t = heap[i]; heap[i] = heap[p]; heap[p] = t;
    i = p;
  }
}

static struct frame heap_pop(void) {
  struct frame top = heap[0];
  heap[0] = heap[--heap_n];
  size_t i = 0;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < heap_n && before(&heap[l], &heap[m])) m = l;
    if (r < heap_n && before(&heap[r], &heap[m])) m = r;
    if (m == i) break;
    struct frame t = heap[i]; heap[i] = heap[m]; heap[m] = t;
    i = m;
  }
  return top;
}

static unsigned char* buf_get(void) {
  if (pool_n) return pool[--pool_n];
  unsigned char* b = malloc(FRAME_MAX);
  if (!b) { perror("harp-delayline: malloc"); exit(1); }
  return b;
}

static void buf_put(unsigned char* b) {
  if (pool_n == pool_cap) {
    pool_cap = pool_cap ? pool_cap * 2 : 256;
    pool = realloc(pool, pool_cap * sizeof *pool);
    if (!pool) { perror("harp-delayline: realloc"); exit(1); }
  }
  pool[pool_n++] = b;
}

static int64_t one_way(int a, int b) {
  int64_t d = delay_ns + ports[a].extra_ns + ports[b].extra_ns;
  if (ports[a].zone != ports[b].zone) d += zone_delay_ns;
  if (jitter_ns > 0) d += (int64_t)(next_rand() % (uint64_t)(2 * jitter_ns + 1)) - jitter_ns;
  return d > 0 ? d : 0;
}

static void enqueue(int in, int out, const unsigned char* data, size_t len, int64_t arrived) {
  if (queued_bytes + len > queue_cap) { ++n_full; return; }
  int64_t due = arrived + one_way(in, out);
  if (due < last_due[in][out]) due = last_due[in][out];  // the pair's frames keep their order
  last_due[in][out] = due;
  unsigned char* b = buf_get();
  memcpy(b, data, len);
  queued_bytes += len;
  struct frame f = {due, seq++, out, len, b};
  heap_push(f);
}

static void route(int in, const unsigned char* data, size_t len, int64_t arrived) {
  const size_t vh = sizeof(struct virtio_net_hdr);
  const unsigned char* dst = data + vh;
  if (!(dst[0] & 1)) {  // unicast: the port whose host has this MAC
    for (int p = 0; p < nports; ++p)
      if (p != in && memcmp(ports[p].mac, dst, 6) == 0) { enqueue(in, p, data, len, arrived); return; }
  }
  ++n_flood;  // broadcast, multicast, unknown: every other port
  for (int p = 0; p < nports; ++p)
    if (p != in) enqueue(in, p, data, len, arrived);
}

// One's complement sum of big-endian 16-bit words (RFC 1071), not folded.
static uint32_t sum16(uint32_t s, const unsigned char* p, size_t n) {
  for (size_t i = 0; i + 1 < n; i += 2) s += (uint32_t)p[i] << 8 | p[i + 1];
  if (n & 1) s += (uint32_t)p[n - 1] << 8;
  return s;
}
static uint16_t fold16(uint32_t s) {
  while (s >> 16) s = (s & 0xffff) + (s >> 16);
  return (uint16_t)s;
}
static uint16_t get16(const unsigned char* p) { return (uint16_t)(p[0] << 8 | p[1]); }
static void put16(unsigned char* p, uint16_t v) { p[0] = (unsigned char)(v >> 8); p[1] = (unsigned char)v; }
static uint32_t get32(const unsigned char* p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }
static void put32(unsigned char* p, uint32_t v) { put16(p, (uint16_t)(v >> 16)); put16(p + 2, (uint16_t)v); }
// The TCP pseudo-header sum (addresses, protocol, TCP length), folded: the
// seed a CHECKSUM_PARTIAL frame carries in its checksum field.
static uint16_t pseudo_seed(const unsigned char* ip, uint32_t tcp_len) {
  return fold16(sum16(0, ip + 12, 8) + 6 + tcp_len);
}

// Segments [a, b) of the GSO frame `data` (header bytes hl after the virtio-net
// header, payload of `payload` bytes cut into `mss`-byte segments, n of them)
// as one frame in `out`; returns its length.
static size_t gso_piece(const unsigned char* data, size_t hl, size_t payload, size_t mss, size_t n, size_t a,
                        size_t b, unsigned char* out) {
  const size_t vh = sizeof(struct virtio_net_hdr);
  const size_t from = a * mss, to = b * mss < payload ? b * mss : payload;
  memcpy(out, data, vh + hl);
  memcpy(out + vh + hl, data + vh + hl + from, to - from);
  struct virtio_net_hdr h;
  memcpy(&h, out, vh);
  if (b - a == 1) {  // one segment: an ordinary frame
    h.gso_type = VIRTIO_NET_HDR_GSO_NONE;
    h.gso_size = 0;
  }
  memcpy(out, &h, vh);
  unsigned char* ip = out + vh + 14;
  const size_t ihl = (size_t)(ip[0] & 15) * 4;
  unsigned char* tcp = ip + ihl;
  const size_t thl = hl - 14 - ihl;
  const uint32_t tcp_len_old = (uint32_t)(thl + payload), tcp_len = (uint32_t)(thl + to - from);
  put16(ip + 2, (uint16_t)(ihl + tcp_len));
  put16(ip + 4, (uint16_t)(get16(ip + 4) + a));  // the kernel numbers a GSO frame's segments from its id
  put16(ip + 10, 0);
  put16(ip + 10, (uint16_t)~fold16(sum16(0, ip, ihl)));
  put32(tcp + 4, get32(tcp + 4) + (uint32_t)from);
  if (a > 0) tcp[13] &= (unsigned char)~0x80;  // CWR: first segment only
  if (b < n) tcp[13] &= (unsigned char)~0x09;  // FIN, PSH: last segment only
  // The checksum field holds the pseudo-header seed (NEEDS_CSUM): with the
  // length when the sender put it there, which the new length replaces.
  if ((h.flags & VIRTIO_NET_HDR_F_NEEDS_CSUM) && get16(tcp + 16) == pseudo_seed(ip, tcp_len_old))
    put16(tcp + 16, pseudo_seed(ip, tcp_len));
  return vh + hl + (to - from);
}

static void on_frame(int in, const unsigned char* data, size_t len, int64_t arrived) {
  static unsigned char piece[FRAME_MAX];
  ++n_in;
  const size_t vh = sizeof(struct virtio_net_hdr);
  if (len < vh + 14) return;
  if (!loss_ppm) {
    route(in, data, len, arrived);
    return;
  }
  struct virtio_net_hdr h;
  memcpy(&h, data, vh);
  const unsigned char* eth = data + vh;
  const unsigned char* ip = eth + 14;
  size_t hl = 0;
  if ((h.gso_type & ~VIRTIO_NET_HDR_GSO_ECN) == VIRTIO_NET_HDR_GSO_TCPV4 && h.gso_size > 0 && len >= vh + 14 + 20 &&
      get16(eth + 12) == 0x0800 && (ip[0] >> 4) == 4 && ip[9] == 6 && (ip[0] & 15) >= 5) {
    const size_t ihl = (size_t)(ip[0] & 15) * 4;
    if (len >= vh + 14 + ihl + 20) {
      const size_t thl = (size_t)(ip[ihl + 12] >> 4) * 4;
      if (thl >= 20 && len >= vh + 14 + ihl + thl) hl = 14 + ihl + thl;
    }
  }
  if (!hl) {  // not a TCP/IPv4 GSO frame: lost whole
    if (next_rand() % 1000000u < loss_ppm) ++n_lost;
    else route(in, data, len, arrived);
    return;
  }
  const size_t payload = len - vh - hl, mss = h.gso_size, n = (payload + mss - 1) / mss;
  n_segments += n;
  size_t a = 0, lost = 0;
  for (size_t k = 0; k < n; ++k) {
    if (next_rand() % 1000000u >= loss_ppm) continue;
    ++lost;
    if (k > a) route(in, piece, gso_piece(data, hl, payload, mss, n, a, k, piece), arrived);
    a = k + 1;
  }
  n_lost += lost;
  n_seg_lost += lost;
  if (!lost) {
    route(in, data, len, arrived);
    return;
  }
  ++n_split;
  if (a < n) route(in, piece, gso_piece(data, hl, payload, mss, n, a, n, piece), arrived);
}

static void drain_port(int in, unsigned char* scratch) {
  for (int k = 0; k < BATCH; ++k) {
    struct sockaddr_ll from;
    struct iovec iov = {scratch, FRAME_MAX};
    struct msghdr m = {0};
    m.msg_name = &from;
    m.msg_namelen = sizeof from;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    ssize_t n = recvmsg(ports[in].fd, &m, MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0) {  // EAGAIN: nothing more now; ENETDOWN (the host's link was set down): taken, go on
      if (errno == ENETDOWN) {
        int e;
        socklen_t l = sizeof e;
        getsockopt(ports[in].fd, SOL_SOCKET, SO_ERROR, &e, &l);
      }
      return;
    }
    if (from.sll_pkttype == PACKET_OUTGOING) continue;  // our own transmissions
    if ((size_t)n > FRAME_MAX) { ++n_trunc; continue; }
    on_frame(in, scratch, (size_t)n, now_ns());
  }
}

static void send_due(int64_t now) {
  while (heap_n && heap[0].due <= now) {
    struct frame f = heap_pop();
    ssize_t n = send(ports[f.out].fd, f.data, f.len, MSG_DONTWAIT);
    if (n < 0) ++n_send_err; else ++n_out;  // a full qdisc drops, as a switch port would
    queued_bytes -= f.len;
    buf_put(f.data);
  }
}

static int open_port(struct port* p) {
  int fd = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
  if (fd < 0) { perror("harp-delayline: socket(AF_PACKET)"); return -1; }
  int one = 1;
  if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) < 0) {
    perror("harp-delayline: PACKET_VNET_HDR");
    return -1;
  }
#ifdef PACKET_IGNORE_OUTGOING
  setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one);  // best effort: sll_pkttype filters too
#endif
  int sz = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof sz);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof sz);
  struct sockaddr_ll a = {0};
  a.sll_family = AF_PACKET;
  a.sll_protocol = htons(ETH_P_ALL);
  a.sll_ifindex = (int)if_nametoindex(p->name);
  if (!a.sll_ifindex) { fprintf(stderr, "harp-delayline: no interface %s\n", p->name); return -1; }
  if (bind(fd, (struct sockaddr*)&a, sizeof a) < 0) { perror("harp-delayline: bind"); return -1; }
  struct packet_mreq mr = {0};
  mr.mr_ifindex = a.sll_ifindex;
  mr.mr_type = PACKET_MR_PROMISC;
  setsockopt(fd, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mr, sizeof mr);
  p->fd = fd;
  return 0;
}

static int parse_port(const char* s, struct port* p) {
  char name[64];
  unsigned m[6];
  long long extra = 0;
  int zone = 0;
  if (sscanf(s, "%63[^,],%x:%x:%x:%x:%x:%x,%d,%lld", name, &m[0], &m[1], &m[2], &m[3], &m[4], &m[5], &zone,
             &extra) != 9 || strlen(name) >= IFNAMSIZ || extra < 0 || zone < 0)
    return -1;
  snprintf(p->name, sizeof p->name, "%s", name);
  for (int i = 0; i < 6; ++i) p->mac[i] = (unsigned char)m[i];
  p->zone = zone;
  p->extra_ns = extra;
  return 0;
}

static void on_signal(int s) { (void)s; stop = 1; }

static int64_t arg_ns(const char* v, const char* what) {
  char* end;
  long long x = strtoll(v, &end, 10);
  if (*end || x < 0 || x > 10000000000ll) { fprintf(stderr, "harp-delayline: %s '%s': nanoseconds 0..1e10\n", what, v); exit(2); }
  return x;
}

int main(int argc, char** argv) {
  const char* stats = NULL;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (!strcmp(a, "--no-rt")) { no_rt = 1; continue; }
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) { fprintf(stderr, "harp-delayline: %s needs a value\n", a); return 2; }
    ++i;
    if (!strcmp(a, "--delay")) delay_ns = arg_ns(v, a);
    else if (!strcmp(a, "--jitter")) jitter_ns = arg_ns(v, a);
    else if (!strcmp(a, "--zone-delay")) zone_delay_ns = arg_ns(v, a);
    else if (!strcmp(a, "--loss")) loss_ppm = (uint32_t)arg_ns(v, a);
    else if (!strcmp(a, "--queue-bytes")) queue_cap = (size_t)arg_ns(v, a);
    else if (!strcmp(a, "--seed")) rng = (uint64_t)arg_ns(v, a) * 0x9e3779b97f4a7c15ull + 1;
    else if (!strcmp(a, "--stats")) stats = v;
    else if (!strcmp(a, "--port")) {
      if (nports == MAX_PORTS || parse_port(v, &ports[nports])) {
        fprintf(stderr, "harp-delayline: --port '%s': IFNAME,MAC,ZONE,EXTRA_NS (at most %d ports)\n", v, MAX_PORTS);
        return 2;
      }
      ++nports;
    } else {
      fprintf(stderr, "harp-delayline: unknown option %s\n", a);
      return 2;
    }
  }
  if (loss_ppm > 1000000) { fprintf(stderr, "harp-delayline: --loss is in parts per million (0..1000000)\n"); return 2; }
  if (nports < 2) { fprintf(stderr, "harp-delayline: needs at least two --port\n"); return 2; }
  for (int p = 0; p < nports; ++p)
    if (open_port(&ports[p])) return 1;
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  // The wire does not share the hosts' CPUs: run ahead of the ranks (real-time priority, best
  // effort; it never spins longer than kSpinNs, so it cannot starve them). --no-rt keeps it normal.
  if (!no_rt) {
    struct sched_param sp = {.sched_priority = 10};
    if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0) perror("harp-delayline: SCHED_FIFO (continuing without)");
  }
  struct sigaction sa = {0};
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  printf("READY %d ports\n", nports);
  fflush(stdout);

  unsigned char* scratch = malloc(FRAME_MAX);
  struct pollfd pfd[MAX_PORTS];
  for (int p = 0; p < nports; ++p) pfd[p] = (struct pollfd){ports[p].fd, POLLIN, 0};
  // A timed sleep wakes late (tens of microseconds on a VM): est is a running
  // mean of that lateness, and each sleep ends that much before the due time;
  // the last stretch (at most kSpinNs) is polled without sleeping.
  const int64_t kSpinNs = 20000;
  int64_t est = 30000;
  while (!stop) {
    int64_t now = now_ns();
    send_due(now);
    struct timespec ts, *tp = NULL;
    int64_t wait = -1, slept_from = 0;
    if (heap_n) {
      now = now_ns();
      int64_t left = heap[0].due - now;
      wait = left - est;
      if (wait < 0) wait = left <= kSpinNs ? 0 : left / 2;  // near: poll; else sleep part of the way
      ts.tv_sec = wait / 1000000000;
      ts.tv_nsec = wait % 1000000000;
      tp = &ts;
      slept_from = now;
    }
    int r = ppoll(pfd, (nfds_t)nports, tp, NULL);
    if (r < 0 && errno != EINTR) { perror("harp-delayline: ppoll"); return 1; }
    if (r == 0 && wait > 0) {  // woke by the timer: learn how late
      int64_t late = now_ns() - slept_from - wait;
      if (late < 0) late = 0;
      if (late > 1000000) late = 1000000;
      est += (late - est) / 8;
    }
    if (r > 0)
      for (int p = 0; p < nports; ++p)
        if (pfd[p].revents) drain_port(p, scratch);  // POLLERR too: the read takes the error (a port went down)
  }
  if (stats) {
    FILE* f = fopen(stats, "w");
    if (f) {
      fprintf(f, "{\"in\": %llu, \"out\": %llu, \"lost\": %llu, \"queue_full\": %llu, \"truncated\": %llu, "
                 "\"send_errors\": %llu, \"flooded\": %llu, \"gso_segments\": %llu, \"gso_lost\": %llu, \"gso_split\": %llu}\n",
              (unsigned long long)n_in, (unsigned long long)n_out, (unsigned long long)n_lost,
              (unsigned long long)n_full, (unsigned long long)n_trunc, (unsigned long long)n_send_err,
              (unsigned long long)n_flood, (unsigned long long)n_segments, (unsigned long long)n_seg_lost,
              (unsigned long long)n_split);
      fclose(f);
    }
  }
  return 0;
}
