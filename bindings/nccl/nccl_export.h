// bindings/nccl/nccl_export.h — how the API files export a function under both
// NCCL names: the definition is pncclX, and ncclX is an alias of it (NVIDIA's
// library does the same), so LD_PRELOAD interposes both.
#pragma once

#define HARP_NCCL_EXPORT extern "C" __attribute__((visibility("default")))
#define HARP_NCCL_ALIAS(ret, name, params) \
  HARP_NCCL_EXPORT ret name params __attribute__((alias("p" #name)));

// Every entry point starts with this: count the call, show the banner.
#define HARP_NCCL_ENTER()      \
  do {                         \
    ::harp::nccl::served();    \
    ::harp::nccl::banner();    \
  } while (0)
