// core/env.h — typed access to HARP_* environment variables.
// Parsing errors throw harp::Error naming the variable and the bad value.
#pragma once

#include <string>

namespace harp::env {

std::string str(const char* name, const std::string& def = "");
bool has(const char* name);
long long integer(const char* name, long long def);
double real(const char* name, double def);
// Sizes accept K/M/G suffixes (powers of two): "512K", "4M".
size_t bytes(const char* name, size_t def);
size_t parseBytes(const std::string& s, const char* what);

}  // namespace harp::env
