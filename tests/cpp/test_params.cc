// tests/cpp/test_params.cc — the parameter registry (base/params.def) and
// the env readers that take their defaults from it.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <set>
#include <string>

#include "base/env.h"
#include "base/params.h"
#include "base/types.h"

using namespace harp;

namespace {

// Runs f with `name` set to `value` (nullptr: unset), then restores it.
template <class F>
void withEnv(const char* name, const char* value, F f) {
  const char* old = getenv(name);
  std::string saved = old ? old : "";
  if (value) setenv(name, value, 1);
  else unsetenv(name);
  f();
  if (old) setenv(name, saved.c_str(), 1);
  else unsetenv(name);
}

Error::Kind kindOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no harp::Error thrown";
  return Error::kInvalidArgument;
}

}  // namespace

TEST(Params, DefaultsComeFromTheRegistry) {
  withEnv("HARP_SEGMENT_BYTES", nullptr, [] { EXPECT_EQ(env::bytes("HARP_SEGMENT_BYTES"), 512u << 10); });
  withEnv("HARP_SPIN", nullptr, [] { EXPECT_EQ(env::integer("HARP_SPIN"), 64); });
  withEnv("HARP_DPDK_RTO_MIN_MS", nullptr, [] { EXPECT_EQ(env::real("HARP_DPDK_RTO_MIN_MS"), 5.0); });
  withEnv("HARP_TIMEOUT", nullptr, [] { EXPECT_EQ(env::timeout("HARP_TIMEOUT"), 300.0); });
  withEnv("HARP_SHM_CMA", nullptr, [] { EXPECT_TRUE(env::flag("HARP_SHM_CMA")); });
  withEnv("HARP_DPDK_MEMIF_DIR", "", [] { EXPECT_EQ(env::str("HARP_DPDK_MEMIF_DIR"), "/tmp"); });
  withEnv("HARP_SHM_SLOTS", nullptr, [] { EXPECT_EQ(env::integerOr("HARP_SHM_SLOTS", 12), 12); });
}

TEST(Params, EnvironmentOverridesTheDefault) {
  withEnv("HARP_SEGMENT_BYTES", "64K", [] { EXPECT_EQ(env::bytes("HARP_SEGMENT_BYTES"), 64u << 10); });
  withEnv("HARP_SPIN", "7", [] { EXPECT_EQ(env::integer("HARP_SPIN"), 7); });
  withEnv("HARP_TIMEOUT", "inf", [] { EXPECT_TRUE(std::isinf(env::timeout("HARP_TIMEOUT"))); });
  withEnv("HARP_SHM_SLOTS", "9", [] { EXPECT_EQ(env::integerOr("HARP_SHM_SLOTS", 12), 9); });
  for (const char* off : {"0", "false", "No", "OFF"})
    withEnv("HARP_SHM_CMA", off, [] { EXPECT_FALSE(env::flag("HARP_SHM_CMA")); });
  for (const char* on : {"1", "true", "YES", "on", "2"})
    withEnv("HARP_SHM_NO_MEMFD", on, [] { EXPECT_TRUE(env::flag("HARP_SHM_NO_MEMFD")); });
}

TEST(Params, BadValuesNameTheVariable) {
  auto check = [](const char* name, const char* value, const std::function<void()>& read) {
    withEnv(name, value, [&] {
      try {
        read();
        ADD_FAILURE() << name << "=" << value << " was accepted";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), Error::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      }
    });
  };
  check("HARP_SPIN", "12x", [] { env::integer("HARP_SPIN"); });
  check("HARP_SPIN", "99999999999999999999999", [] { env::integer("HARP_SPIN"); });
  check("HARP_SHM_CMA", "maybe", [] { env::flag("HARP_SHM_CMA"); });
  check("HARP_SEGMENT_BYTES", "4Q", [] { env::bytes("HARP_SEGMENT_BYTES"); });
  check("HARP_SEGMENT_BYTES", "1e30G", [] { env::bytes("HARP_SEGMENT_BYTES"); });
  check("HARP_TIMEOUT", "0", [] { env::timeout("HARP_TIMEOUT"); });
  check("HARP_DPDK_RTO_MIN_MS", "fast", [] { env::real("HARP_DPDK_RTO_MIN_MS"); });
}

TEST(Params, UndeclaredOrMistypedReadsFailLoudly) {
  // A misspelt name known only at run time (env::dynamic; with a literal,
  // env::str etc. do not compile: tests/test_params.py): every reader refuses it, naming it.
  for (auto read : std::initializer_list<std::function<void()>>{
           [] { env::dynamic::str("HARP_TRANSPRT"); }, [] { env::dynamic::has("HARP_TRANSPRT"); },
           [] { env::dynamic::raw("HARP_TRANSPRT"); }, [] { env::dynamic::integer("HARP_TRANSPRT"); },
           [] { env::dynamic::bytes("HARP_TRANSPRT"); }, [] { env::dynamic::integerOr("HARP_TRANSPRT", 1); }}) {
    try {
      read();
      ADD_FAILURE() << "an undeclared name was read";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), Error::kInternal);
      EXPECT_NE(std::string(e.what()).find("HARP_TRANSPRT is read but not declared"), std::string::npos) << e.what();
    }
  }
  // Declared, read as another type; an "auto" default read without one; a fixed default given twice.
  EXPECT_EQ(kindOf([] { env::dynamic::integer("HARP_SEGMENT_BYTES"); }), Error::kInternal);
  EXPECT_EQ(kindOf([] { env::dynamic::bytes("HARP_TIMEOUT"); }), Error::kInternal);
  withEnv("HARP_SHM_SLOTS", nullptr,
          [] { EXPECT_EQ(kindOf([] { env::dynamic::integer("HARP_SHM_SLOTS"); }), Error::kInternal); });
  EXPECT_EQ(kindOf([] { env::dynamic::integerOr("HARP_SPIN", 3); }), Error::kInternal);
  // Text access works for every declared type.
  withEnv("HARP_SPIN", nullptr, [] { EXPECT_EQ(env::str("HARP_SPIN"), "64"); });
}

TEST(Params, RegistryIsWellFormed) {
  std::set<std::string> names;
  ASSERT_GT(params::count(), 50u);
  for (const params::Param* p = params::begin(); p != params::end(); ++p) {
    EXPECT_TRUE(names.insert(p->name).second) << "declared twice: " << p->name;
    EXPECT_EQ(std::string(p->name).rfind("HARP_", 0), 0u) << p->name;
    EXPECT_GT(std::string(p->doc).size(), 10u) << p->name << " has no doc";
    EXPECT_EQ(params::find(p->name), p);
    if (p->type == params::Type::kEnum) {
      EXPECT_NE(std::string(p->choices), "") << p->name;
    }
    // Every fixed numeric default parses with its own reader.
    if (*p->def && std::string(p->def) != "auto") {
      withEnv(p->name, nullptr, [&] {
        switch (p->type) {
          case params::Type::kInt: env::dynamic::integer(p->name); break;
          case params::Type::kReal: env::dynamic::real(p->name); break;
          case params::Type::kSeconds: env::dynamic::timeout(p->name); break;
          case params::Type::kBytes: env::dynamic::bytes(p->name); break;
          case params::Type::kBool: env::dynamic::flag(p->name); break;
          default: break;
        }
      });
    }
  }
}

TEST(Params, NearestNameAndUnknownVariables) {
  EXPECT_EQ(params::editDistance("kitten", "sitting"), 3u);
  EXPECT_EQ(params::editDistance("", "abc"), 3u);
  EXPECT_EQ(params::nearest("HARP_TRANSPRT"), "HARP_TRANSPORT");
  EXPECT_EQ(params::nearest("HARP_TIMEUOT"), "HARP_TIMEOUT");
  EXPECT_EQ(params::nearest("HARP_SOCKET_IFNAM"), "HARP_SOCKET_IFNAME");
  char a[] = "HARP_TRANSPRT=tcp", b[] = "PATH=/bin", c[] = "HARP_TIMEOUT=5", d[] = "HARP_SEGMENT_BYTE=1M";
  char* envp[] = {a, b, c, d, nullptr};
  auto u = params::unknownVariables(envp);
  ASSERT_EQ(u.size(), 2u);
  EXPECT_EQ(u[0].first, "HARP_TRANSPRT");
  EXPECT_EQ(u[0].second, "HARP_TRANSPORT");
  EXPECT_EQ(u[1].first, "HARP_SEGMENT_BYTE");
  EXPECT_EQ(u[1].second, "HARP_SEGMENT_BYTES");
  EXPECT_EQ(params::unknownMessage("HARP_TRANSPRT", "HARP_TRANSPORT"),
            "HARP_TRANSPRT is not a HARP parameter (did you mean HARP_TRANSPORT?)");
}
