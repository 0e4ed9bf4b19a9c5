// src/hopper/shared/launch_common.cuh — host helpers every Hopper launch (fwd/, bwd/) uses: a CUDA
// error as fa4::Error, the strides of a (rows, d, heads, batch) TMA view of a caller's tensor, the
// once-per-device shared-memory limit, and the aligned-pair test of the direct 16-bit stores.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include <cute/tensor.hpp>

#include "core/params.h"
#include "fa4/error.h"

namespace fa4::hopper {

/// Throws fa4::Error(kCudaError) "<fn> (hopper): <what>: <CUDA's message>" unless e is success.
inline void check_cuda(cudaError_t e, const char* fn, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error so it is not reported against a later call
    throw Error(ErrorCode::kCudaError, std::string(fn) + " (hopper): " + what + ": " + cudaGetErrorString(e));
  }
}

/// TMA ignores the stride of an extent-1 dimension but still requires a positive multiple of 16
/// bytes; user strides of size-1 dims may be anything (case C20). Replace such a stride by the
/// span of the dimensions before it (what a contiguous tensor would have): valid and monotone.
inline int64_t tma_stride(int64_t extent, int64_t stride, int64_t span_before) {
  return extent <= 1 ? span_before : stride;
}

/// CuTe strides (row, 1, head, batch) of the TMA view of a tensor with `rows` rows, `heads` heads
/// and `batch` batch entries (1 for varlen, whose batch stride is then unused), its rows
/// kRowSpan elements wide (the padded bucket width, a multiple of 8).
template <int64_t kRowSpan>
inline auto tma_view_stride(const detail::RowStrides& s, int64_t rows, int64_t heads, int64_t batch, bool varlen) {
  const int64_t row = tma_stride(rows, s.row, kRowSpan);
  const int64_t head = tma_stride(heads, s.head, std::max<int64_t>(kRowSpan, rows * row));
  const int64_t bat = tma_stride(batch, varlen ? 0 : s.batch, std::max({kRowSpan, rows * row, heads * head}));
  return cute::make_stride(row, cute::_1{}, head, bat);
}

namespace {
/// Devices (bit per ordinal < 64) on which Kt's kernel has its shared-memory limit raised. Internal
/// linkage on purpose: a function-local static of a template has vague linkage, and the dynamic
/// linker unifies such symbols across every library of the process (STB_GNU_UNIQUE), so two
/// copies of libfa4 in one process (two builds, or two packages that ship it) would share the
/// flag while each has its own kernel: the second library's launch then fails.
template <class Kt>
std::atomic<uint64_t>& smem_raised_devices() {
  static std::atomic<uint64_t> devices{0};
  return devices;
}

/// Raises `kernel`'s dynamic shared-memory limit to `bytes` on `device` (the current device), once
/// per device: the limit is a property of the function in each device's context, and a driver
/// call costs more host time than a short kernel's launch. Returns the CUDA error, if any.
template <class Kt, class Kernel>
cudaError_t raise_smem_limit_once(Kernel kernel, int bytes, int device) {
  std::atomic<uint64_t>& raised = smem_raised_devices<Kt>();
  const uint64_t bit = uint64_t(1) << (device & 63);
  if (device < 64 && (raised.load(std::memory_order_acquire) & bit)) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess && device < 64) raised.fetch_or(bit, std::memory_order_release);
  return e;
}
}  // namespace

/// True when every pair of adjacent 16-bit elements a direct store writes (columns 2k, 2k+1 of a
/// row) is one aligned 4-byte word, for a tensor at `base` with strides `s`.
inline bool aligned_pairs(const void* base, const detail::RowStrides& s, bool varlen, int32_t batch, int64_t elem) {
  return reinterpret_cast<uintptr_t>(base) % (2 * elem) == 0 && (varlen || batch <= 1 || s.batch % 2 == 0) &&
         s.row % 2 == 0 && s.head % 2 == 0;
}

}  // namespace fa4::hopper
