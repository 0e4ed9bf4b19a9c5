// src/hopper/shared/launch_common.cuh — host helpers every Hopper launch (fwd/, bwd/, decode/) uses: a
// CUDA error as fa4::Error, the once-per-device shared-memory limit, a launch with one launch
// attribute, the programmatic dependent launch with its fallback, and the aligned-pair test of the
// direct 16-bit stores. No CuTe here (the TMA views are in tma_view.cuh): the decode
// instantiations, which use none, compile in a fraction of the time without its headers.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cassert>
#include <cstdint>
#include <string>

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

/// The launch configuration of a grid x block launch with `smem` bytes of dynamic shared memory on
/// `stream`, with the one launch attribute *attr (which must outlive the launch).
inline cudaLaunchConfig_t one_attribute_config(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                               cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

/// cudaLaunchKernelEx of `kernel` with one launch attribute (cooperative, programmatic stream
/// serialization, ...). Returns CUDA's error as it is (not cleared).
template <class... Args>
cudaError_t launch_with_attribute(void (*kernel)(Args...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                  cudaLaunchAttribute attr, const Args&... args) {
  const cudaLaunchConfig_t cfg = one_attribute_config(grid, block, smem, stream, &attr);
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

/// The cooperative-launch attribute: every CTA of the grid resident at once, or the launch is
/// refused (cudaErrorCooperativeLaunchTooLarge).
inline cudaLaunchAttribute cooperative_attribute() {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = 1;
  return attr;
}

/// The programmatic-stream-serialization attribute: the kernel may launch once the previous kernel
/// in the stream lets it (griddepcontrol.launch_dependents, arch.cuh launch_dependents), and reads
/// what that kernel wrote only after griddepcontrol.wait (wait_on_prerequisites).
inline cudaLaunchAttribute programmatic_attribute() {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  return attr;
}

/// cudaLaunchKernelEx of `kernel` with `cfg`, whose last attribute (of cfg.numAttrs >= 1) is
/// programmatic_attribute(): the kernel may start while the one before it on the stream finishes,
/// and waits for it before reading what it wrote (arch::launch_dependents / wait_on_prerequisites).
/// Where the driver refuses that attribute as unsupported (cudaErrorNotSupported), the launch is
/// repeated without it (stream order); any other refusal is returned, not cleared.
template <class... Args>
cudaError_t launch_programmatic_ex(const cudaLaunchConfig_t& cfg, void (*kernel)(Args...), const Args&... args) {
  assert(cfg.numAttrs >= 1 && cfg.attrs[cfg.numAttrs - 1].id == cudaLaunchAttributeProgrammaticStreamSerialization);
  cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
  if (e == cudaErrorNotSupported) {
    cudaGetLastError();
    cudaLaunchConfig_t plain = cfg;
    --plain.numAttrs;
    e = cudaLaunchKernelEx(&plain, kernel, args...);
  }
  return e;
}

/// launch_programmatic_ex of a plain launch (no other attribute).
template <class... Args>
cudaError_t launch_programmatic(void (*kernel)(Args...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                const Args&... args) {
  cudaLaunchAttribute attr = programmatic_attribute();
  const cudaLaunchConfig_t cfg = one_attribute_config(grid, block, smem, stream, &attr);
  return launch_programmatic_ex(cfg, kernel, args...);
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

/// True when every run of n adjacent elements starting at a column that is a multiple of n is one
/// aligned (n * elem)-byte access, for a tensor at `base` (element size `elem`) with strides `s`.
inline bool aligned_runs(const void* base, const detail::RowStrides& s, bool varlen, int32_t batch, int64_t elem,
                         int64_t n) {
  return reinterpret_cast<uintptr_t>(base) % (n * elem) == 0 && (varlen || batch <= 1 || s.batch % n == 0) &&
         s.row % n == 0 && s.head % n == 0;
}
/// Every pair of adjacent 16-bit elements a direct store writes (columns 2k, 2k+1 of a row) is one
/// aligned 4-byte word.
inline bool aligned_pairs(const void* base, const detail::RowStrides& s, bool varlen, int32_t batch, int64_t elem) {
  return aligned_runs(base, s, varlen, batch, elem, 2);
}
/// Every row of the tensor starts 16-byte aligned, so 8 adjacent 16-bit elements are one 16-byte
/// access (the real head dims are multiples of 8).
inline bool aligned_vec8(const void* base, const detail::RowStrides& s, bool varlen, int32_t batch, int64_t elem) {
  return elem == 2 && aligned_runs(base, s, varlen, batch, elem, 8);
}

}  // namespace fa4::hopper
