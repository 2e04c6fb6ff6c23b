// bootstrap/rendezvous.h — the first step of Communicator creation: every rank
// checks in at the store, and start-up mistakes are reported within seconds
// on every rank instead of as a timeout.
//
// Keys (under the communicator's store prefix):
//   claim/<r>    ADD counter: 1 for the first process claiming rank r; a second
//                claimant is a duplicate rank (or a second communicator on a
//                unique id that already formed one: refused, see below).
//   arrive/<r>   "<size> <description>" of rank r.
//   arrived      ADD counter of ranks that agree with rank 0's world size.
//   complete     set by the rank that brought `arrived` to size.
//   error        u8 Error::Kind | message: the first problem anybody saw. Set
//                by a rank that finds one (duplicate rank, world size
//                mismatch, rank out of range, its own failure while creating
//                the communicator) and, through ONCLOSE, by the server when a
//                rank's store connection closes before the communicator formed.
// Every wait watches `error` (Store::waitAny), so the others raise the same
// error within seconds. While ranks are missing, the lowest rank present logs
// "harp: rendezvous: waiting for ranks 3, 5 (2 of 6 missing) for 10 s" every
// kProgressEveryS at the default log level.
//
// A unique id (a store prefix) serves one communicator: a second one on it
// raises InvalidArgument instead of reading the first one's stale keys.
//
// Stores without the optional methods (the torch adapter) get the same keys
// but wait with plain get(): mistakes then surface as the get() timeout.
//
// Threading: called by the creating thread; no shared state.
#pragma once

#include <string>

#include "bootstrap/store.h"
#include "base/types.h"

namespace harp {

constexpr double kProgressEveryS = 5.0;

// "rank 3 (pid 123 on host h)".
std::string describeRank(int rank);

// Check in and wait until all `size` ranks have (or throw the error that
// stops them). rank/size may be invalid: the error is posted first.
void rendezvous(Store& store, int rank, int size, double timeout_s);

// get() that also fails fast with the rendezvous error (see above).
std::string rendezvousGet(Store& store, const std::string& key, double timeout_s);

// Best effort: tell the other ranks why this one fails (first error wins).
void postRendezvousError(Store& store, Error::Kind kind, const std::string& message);

// The communicator formed: stop reporting this rank's disconnect as a failure.
void rendezvousDone(Store& store);

}  // namespace harp
