// core/observe/jobview.h — the job view: every rank of a communicator answers
// `harp-status --job` (python/harp/status.py) from any host, also while
// collectives hang, over an authenticated TCP channel.
//
// Addresses: every process with a communicator (HARP_JOBVIEW=1, the default)
// listens on one TCP port (HARP_JOBVIEW_PORT, 0: any) at the address that
// reaches the bootstrap (the communicator's bind host). join() exchanges the
// "host:port" of every rank through the communicator's store once, at
// creation (one store allgather, like the keep-alive addresses), so a later
// view needs no store: it works while the store's host is frozen.
//
// Authentication (bootstrap/crypto.h's mutual challenge-response), keyed by
// K = deriveKey(communicator secret token, "jobview"), context
// "jobview|<comm id hex>":
//   client -> "HJV1" | comm id (8, LE) | nonce na (32)
//   server <- nonce nb (32) | proof(K, 'B', na, nb, ctx) (32)
//   client -> proof(K, 'A', nb, na, ctx) (32) | body length (4, LE, <= 256) | body
//   server <- answer length (4, LE) | answer
// A server without that communicator answers 64 random bytes, so a client
// without the key learns nothing, not even whether the id exists; a wrong
// proof closes the connection before any answer. Every read has a bound and
// a deadline (the handshake HARP_JOBVIEW_HOP_S, the answer the request's budget).
//
// Requests (ASCII, one space between fields, decimal integers):
//   STATUS <root> <lo> <hi> <budget_ms>  the entries of virtual ranks [lo, hi),
//       virtual rank v = (rank - root) mod size; the server is virtual rank lo
//       (root -1: the server's own rank is the root, lo 0). The server answers
//       its own entry and asks HARP_JOBVIEW_FANOUT children for equal parts of
//       [lo + 1, hi) in parallel (a tree: O(log size) hops); a child that
//       refuses the connection is named "dead", one that does not finish the
//       handshake in time "unreachable", and the rest of its part goes to the
//       next rank of it. Answer: JSON entries separated by commas (no
//       brackets), each under kEntryCap bytes, so a hop answers at most
//       (hi - lo) x kEntryCap bytes.
//   ADDRS   {"comm", "rank", "size", "addrs": [...], "hosts": [...]}
//   DUMP    this process's flight record (fr_dump.cc's pickle bytes)
// A malformed request from an authenticated client gets {"error": "..."}.
//
// Threading: the handshakes run on the process's observer thread (observer.cc),
// never on a thread that runs collectives, and never block it: each
// connection's socket is stepped when poll(2) says it is ready (non-blocking
// reads and writes), dropped at its deadline, and at most kMaxPending (64)
// wait at once: a new connection then drops the oldest, so clients that
// connect and send nothing cannot hold back an honest one (whose handshake is
// one round trip). A request whose client proved the key runs on a session
// thread of its own ("harp-jobview", detached, ends by the request's budget +
// 5 s), at most kMaxSessions (8) at once (one more is answered
// {"error":"busy..."}; a parent names such a child "busy"), so two tools, or a
// fan-out hop that arrives while the process serves another request, are
// answered side by side. A session holds its request's answer: at most
// (hi - lo) x kEntryCap bytes (STATUS) or one flight record (DUMP).
// Children are asked from short-lived threads a session starts and joins
// within the request's budget. join() runs on the creating thread of each
// communicator. Cost when idle: none (no timer, no traffic; the listener is
// polled by the observer thread's existing poll(2), with no timeout while no
// handshake is pending).
//
// Links: each entry's "links" groups the rank's peers by class (same host,
// other hosts) and transport, and where the transport reports its connections
// (transport::LinkStatus, tcp) how many are up with how many lanes, not
// connected yet (lazy set-up, HARP_SOCKET_CONNECT) or failed.
#pragma once

#include <poll.h>

#include <cstddef>
#include <string>
#include <vector>

#include "core/observe/recorder.h"

namespace harp::obs {

namespace jobview {

constexpr size_t kEntryCap = 2048;  // bytes of one rank's entry in a STATUS answer
constexpr size_t kBodyCap = 256;    // bytes of a request body

// Creating thread: opens the process's listener (first time) and exchanges
// every rank's address through r's store. Logs and leaves the view off for
// this communicator on failure; never throws.
void join(Recorder& r);

// The listener's fd (-1: none yet or off). The observer thread polls it.
int listenFd();

// fork(): observer.cc's pthread_atfork handlers call these (prepare before it
// takes the list of recorders' lock: the observer thread takes the job view's
// lock, then that one); the child starts without a listener, connections or
// sessions (its first communicator opens its own listener).
void atforkPrepare();
void atforkParent();
void atforkChild();

// Observer thread, around its poll(2): pollSet appends the connections in
// their handshake to *p and returns the timeout their deadlines need (ms; -1:
// none, so an idle process sleeps); serve then steps the ones ready (ready[i]
// is what pollSet appended, after poll), drops those past their deadline and,
// when readable, accepts new ones. Never blocks.
int pollSet(std::vector<pollfd>* p);
void serve(int listen_fd, bool readable, const pollfd* ready, size_t n);

// For the local status socket's JOBVIEW request (same user only):
// {"endpoints": [{"comm", "rank", "size", "addr", "key"}]}, key = K in hex.
std::string endpointsJson();

// The request grammar above, parsed (tests drive it with arbitrary bytes).
struct Request {
  enum Kind { kStatus, kAddrs, kDump } kind = kStatus;
  int root = -1, lo = 0, hi = 0, budget_ms = 0;
};
bool parseRequest(const std::string& body, int size, Request* out, std::string* err);

}  // namespace jobview

// observer.cc: wakes the observer thread's poll (a new listener to poll).
void wakeObserver();

// JSON helpers shared by statusJson (observer.cc) and the job view.
std::string jsonString(const std::string& v);
std::string jsonNumber(double d);
std::string opJson(const Recorder& r, const OpSnapshot& s, uint64_t now);

}  // namespace harp::obs
