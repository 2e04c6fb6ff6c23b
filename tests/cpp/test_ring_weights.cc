// allreduce ring_weighted's layout (core/algorithms/ring.h, allreduce_ring_weighted.cc):
// the chunk fractions minimise the ring's time over its links, equal links keep
// equal chunks, and the element sizes add up.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/algorithms/ring.h"

namespace harp {
namespace {

double sum(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

// The best time over a grid of fractions (step 1/steps), for p = 3 or 4: a
// brute-force check of the solver's optimum.
double gridBest(const std::vector<double>& link, int steps) {
  const size_t p = link.size();
  double best = 1e300;
  std::vector<double> f(p);
  if (p == 3) {
    for (int a = 0; a <= steps; ++a)
      for (int b = 0; a + b <= steps; ++b) {
        f = {double(a) / steps, double(b) / steps, double(steps - a - b) / steps};
        best = std::min(best, ringLinkTime(f, link));
      }
  } else {
    for (int a = 0; a <= steps; ++a)
      for (int b = 0; a + b <= steps; ++b)
        for (int c = 0; a + b + c <= steps; ++c) {
          f = {double(a) / steps, double(b) / steps, double(c) / steps, double(steps - a - b - c) / steps};
          best = std::min(best, ringLinkTime(f, link));
        }
  }
  return best;
}

TEST(RingWeights, EqualLinksKeepEqualChunks) {
  for (size_t p : {1u, 2u, 3u, 5u, 8u, 64u}) {
    const std::vector<double> f = ringChunkFractions(std::vector<double>(p, 117e6), 1.10);
    ASSERT_EQ(f.size(), p);
    for (double x : f) EXPECT_EQ(x, 1.0 / p);
  }
}

TEST(RingWeights, LinksWithinTheToleranceKeepEqualChunks) {
  const std::vector<double> f = ringChunkFractions({100, 105, 109, 100}, 1.10);
  for (double x : f) EXPECT_EQ(x, 0.25);
  const std::vector<double> g = ringChunkFractions({100, 105, 112, 100}, 1.10);
  EXPECT_NE(g[0], 0.25);
}

TEST(RingWeights, TwoRanksNeverReweigh) {
  // Each rank sends n bytes whatever the layout.
  const std::vector<double> f = ringChunkFractions({1, 8}, 1.10);
  EXPECT_EQ(f[0], 0.5);
  EXPECT_EQ(f[1], 0.5);
}

// One host of four at half rate: its links in (2 -> 3) and out (3 -> 0) are
// slow. Equal chunks take 2 x 1.5/B = 3/B per byte of vector; the floor is 2/B
// (the slow host sends and receives the whole vector at B/2), and the solver
// reaches it.
TEST(RingWeights, OneHostAtHalfRateReachesTheFloor) {
  const double B = 1.0;
  const std::vector<double> link = {B, B, B / 2, B / 2};
  const std::vector<double> equal(4, 0.25);
  EXPECT_NEAR(ringLinkTime(equal, link), 3.0 / B, 1e-12);
  const std::vector<double> f = ringChunkFractions(link, 1.10);
  EXPECT_NEAR(sum(f), 1.0, 1e-12);
  EXPECT_NEAR(ringLinkTime(f, link), 2.0 / B, 1e-6);
}

TEST(RingWeights, SolverMatchesABruteForceGridAndNeverLoses) {
  std::mt19937_64 gen(12345);
  std::uniform_real_distribution<double> rate(0.1, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t p = 3 + trial % 2;
    std::vector<double> link(p);
    for (double& x : link) x = rate(gen);
    const std::vector<double> f = ringChunkFractions(link, 1.0);
    ASSERT_EQ(f.size(), p);
    for (double x : f) EXPECT_GE(x, 0.0);
    EXPECT_NEAR(sum(f), 1.0, 1e-9);
    const double t = ringLinkTime(f, link);
    const double lower = 1 / *std::min_element(link.begin(), link.end());  // every rank sends >= n
    EXPECT_GE(t, lower * (1 - 1e-9));
    EXPECT_LE(t, ringLinkTime(std::vector<double>(p, 1.0 / p), link) * (1 + 1e-9));
    // a grid of step 1/60 is within a few percent of the optimum; the solver must be at least as good
    EXPECT_LE(t, gridBest(link, 60) * (1 + 1e-6)) << "trial " << trial;
  }
}

TEST(RingWeights, ManyRanksStayValidAndBeatEqualChunks) {
  std::mt19937_64 gen(7);
  std::uniform_real_distribution<double> rate(0.5, 1.0);
  for (size_t p : {5u, 9u, 64u, 1024u}) {
    std::vector<double> link(p, 1.0);
    link[p / 3] = 0.5;
    for (size_t i = 0; i < p; i += 7) link[i] = rate(gen);
    const std::vector<double> f = ringChunkFractions(link, 1.10);
    for (double x : f) EXPECT_GE(x, 0.0);
    EXPECT_NEAR(sum(f), 1.0, 1e-9);
    EXPECT_LE(ringLinkTime(f, link), ringLinkTime(std::vector<double>(p, 1.0 / p), link) * (1 + 1e-12));
  }
}

TEST(RingWeights, ChunkSizesAddUpAndFollowTheFractions) {
  const std::vector<double> f = {0.5, 0.0, 0.125, 0.375};
  for (size_t count : {0ul, 1ul, 3ul, 4ul, 7ul, 1000003ul}) {
    const std::vector<size_t> s = ringChunkSizes(f, count);
    ASSERT_EQ(s.size(), f.size());
    EXPECT_EQ(std::accumulate(s.begin(), s.end(), size_t{0}), count);
    for (size_t i = 0; i < f.size(); ++i) EXPECT_LE(std::fabs(double(s[i]) - f[i] * double(count)), 1.0);
  }
  EXPECT_EQ(ringChunkSizes(f, 8), (std::vector<size_t>{4, 0, 1, 3}));
}

}  // namespace
}  // namespace harp
