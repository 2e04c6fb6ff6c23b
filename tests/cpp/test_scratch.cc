// Scratch (core/engine/scratch.h): grows keeping its contents, and trim() gives a
// block above the cap back to the kernel (resident memory drops), one at or
// under the cap stays.
#include "core/engine/scratch.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace {

size_t residentBytes() {
  long pages = 0, rss = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  if (std::fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
  std::fclose(f);
  return static_cast<size_t>(rss) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

TEST(Scratch, GrowsKeepingContents) {
  harp::Scratch s;
  EXPECT_EQ(s.reserve(0), nullptr);
  auto* p = static_cast<char*>(s.reserve(100));
  ASSERT_NE(p, nullptr);
  std::memset(p, 7, 100);
  EXPECT_GE(s.capacity(), 100u);
  EXPECT_EQ(s.reserve(50), p);  // no smaller block for a smaller request
  auto* q = static_cast<char*>(s.reserve(1 << 20));
  for (int i = 0; i < 100; ++i) ASSERT_EQ(q[i], 7) << "byte " << i;
  EXPECT_GE(s.capacity(), 1u << 20);
}

TEST(Scratch, TrimReleasesOnlyAboveTheCap) {
  constexpr size_t kBig = 64u << 20, kCap = 16u << 20;
  harp::Scratch s;
  std::memset(s.reserve(kCap), 1, kCap);
  s.trim(kCap);
  EXPECT_EQ(s.capacity(), kCap) << "a block at the cap is kept";
  const size_t before = residentBytes();
  std::memset(s.reserve(kBig), 1, kBig);
  EXPECT_GE(residentBytes(), before + kBig / 2);
  s.trim(kCap);
  EXPECT_EQ(s.capacity(), 0u);
  EXPECT_LE(residentBytes(), before + (4u << 20)) << "the 64 MiB block is still resident after trim";
}

}  // namespace
