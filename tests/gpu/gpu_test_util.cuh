// tests/gpu/gpu_test_util.cuh — what every GPU test file needs to decide whether it can run.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "common/overrides.h"

namespace fa4::test {

/// Forces one kernel choice (common/overrides.h: "lpt", "schedule", "epilogue", "stream_k") for
/// the scope, then returns it to the selector.
struct ScopedOverride {
  const char* name;
  ScopedOverride(const char* n, const char* value) : name(n) { fa4::detail::set_kernel_override(n, value); }
  ~ScopedOverride() { fa4::detail::set_kernel_override(name, "auto"); }
  ScopedOverride(const ScopedOverride&) = delete;
  ScopedOverride& operator=(const ScopedOverride&) = delete;
};

/// True when device 0 is a Hopper (compute capability 9.x) GPU the sm_90a kernels can run on.
inline bool have_hopper() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return false;
  }
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  return major == 9;
}

}  // namespace fa4::test

/// Skips the calling test, loudly, where no Hopper GPU exists (CI machines have none).
#define REQUIRE_HOPPER() \
  if (!fa4::test::have_hopper()) GTEST_SKIP() << "no sm_90 CUDA device: Hopper kernel tests skipped"
