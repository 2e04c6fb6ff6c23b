// An allreduce through HARP's public C++ API (include/harp/harp.h), nothing else.
//
//   c++ -std=c++17 examples/allreduce.cc -I<harp>/include -o allreduce
//       -L$(harp-config --libdir) -lharp -Wl,-rpath,$(harp-config --libdir)    (one line)
//   harp-run -n 3 ./allreduce
//
// (<harp>/include: include/ of a source checkout, or harp/include in the
// installed package.) harp-run hands every rank HARP_RANK, HARP_WORLD_SIZE and
// the hex of a unique id it made (HARP_UNIQUE_ID); a program without harp-run
// makes the id on one rank (harp::api::UniqueId::create()) and passes id.hex()
// to the others itself. Rank r contributes r + 1 in every element; every rank
// checks the sum and rank 0 prints it.
#include <harp/harp.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

int main() {
  namespace hp = harp::api;
  const char* r = std::getenv("HARP_RANK");
  const char* n = std::getenv("HARP_WORLD_SIZE");
  const char* hex = std::getenv("HARP_UNIQUE_ID");
  if (!r || !n || !hex) {
    std::fprintf(stderr, "run me under harp-run (HARP_RANK, HARP_WORLD_SIZE, HARP_UNIQUE_ID)\n");
    return 2;
  }
  try {
    hp::Comm comm = hp::Comm::create(hp::UniqueId::fromHex(hex), std::atoi(r), std::atoi(n));
    const int p = comm.size();
    std::vector<float> x(1 << 16, static_cast<float>(comm.rank() + 1));
    comm.allreduce(x.data(), x.data(), x.size(), hp::DataType::kFloat32, hp::ReduceOp::kSum);  // in place
    const float want = p * (p + 1) / 2.0f;
    for (float v : x)
      if (v != want) {
        std::fprintf(stderr, "rank %d: got %g, want %g\n", comm.rank(), v, want);
        return 1;
      }
    if (comm.rank() == 0) std::printf("%d ranks, sum = %g everywhere\n", p, want);
    comm.destroy();
  } catch (const hp::Error& e) {
    std::fprintf(stderr, "harp error (kind %d): %s\n", static_cast<int>(e.kind()), e.what());
    return 1;
  }
  return 0;
}
