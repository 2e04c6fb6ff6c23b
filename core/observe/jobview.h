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
// Threading: serve() runs on the process's observer thread (observer.cc),
// never on a thread that runs collectives; children are asked from short-lived
// threads it starts and joins within the request's budget. One request at a
// time per process. join() runs on the creating thread of each communicator.
// Cost when idle: none (no timer, no traffic; the listener is polled by the
// observer thread's existing poll(2)).
#pragma once

#include <cstddef>
#include <string>

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

// fork(): observer.cc's pthread_atfork handlers call these; the child starts
// without a listener (its first communicator opens its own).
void atforkPrepare();
void atforkParent();
void atforkChild();

// Observer thread: accept one connection and answer it (bounded, deadlines).
void serve(int listen_fd);

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
