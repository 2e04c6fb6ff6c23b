// core/algorithms/fold.h — non-power-of-two handling shared by the recursive
// algorithms (MPICH's scheme). With p = 2^k + rem, the first 2·rem ranks pair
// up before the power-of-two phase: each even rank r < 2·rem hands its whole
// vector to r+1 and sits out; the odd rank reduces both and takes part as
// newrank r/2. Ranks >= 2·rem take part as newrank r - rem. Afterwards the odd
// ranks hand the result back. Extra cost for p != 2^k: 2·alpha + 2·n·beta + n·gamma.
#pragma once

#include "core/algorithms/registry.h"
#include "base/reduce.h"

namespace harp::fold {

struct Fold {
  int pof2, rem, newrank;  // newrank -1: this rank sits out
  int real(int nr) const { return nr < rem ? nr * 2 + 1 : nr + rem; }
};

// `out` holds this rank's input; `tmp` has room for `bytes`.
inline Fold in(Context& ctx, char* out, char* tmp, size_t count) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t bytes = count * ctx.elemSize();
  Fold f{floorPow2(p), 0, 0};
  f.rem = p - f.pof2;
  if (r < 2 * f.rem) {
    if (r % 2 == 0) {
      ctx.wait(ctx.isend(r + 1, out, bytes));
      f.newrank = -1;
    } else {
      ctx.wait(ctx.irecv(r - 1, tmp, bytes));
      reduce(out, tmp, out, count, a.dtype, a.op);
      f.newrank = r / 2;
    }
  } else {
    f.newrank = r - f.rem;
  }
  return f;
}

inline void out(Context& ctx, const Fold& f, char* out, size_t count) {
  const int r = ctx.rank();
  const size_t bytes = count * ctx.elemSize();
  if (r < 2 * f.rem) {
    if (r % 2 == 0) ctx.wait(ctx.irecv(r + 1, out, bytes));
    else ctx.wait(ctx.isend(r - 1, out, bytes));
  }
}

// The fold's extra cost for p != 2^k (0 otherwise).
inline double cost(double n, int p, const TransportParams& t) {
  return p == floorPow2(p) ? 0 : 2 * t.alpha + 2 * n * t.beta + n * t.gamma;
}

}  // namespace harp::fold
