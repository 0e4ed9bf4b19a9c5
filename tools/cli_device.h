// tools/cli_device.h — CUDA helpers of the fa4 command-line tool: GPU discovery, moving a Problem
// to the GPU and back, and an L2-cache flush for timing. Everything is behind FA4_WITH_CUDA; in a
// CPU-only build only gpu_count() exists (it reports that CUDA was not built).
#pragma once

#include <string>
#include <vector>

#include "cli_case.h"

#if FA4_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace fa4::cli {

/// Number of usable CUDA GPUs; 0 with the reason in *why (no CUDA build, no driver, no device).
inline int gpu_count(std::string* why) {
#if FA4_WITH_CUDA
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device visible";
  return n;
#else
  if (why) *why = "fa4 was built without CUDA (FA4_CUDA=OFF or no nvcc at configure time)";
  return 0;
#endif
}

#if FA4_WITH_CUDA

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(ErrorCode::kCudaError, std::string("fa4 cli: ") + what + ": " + cudaGetErrorString(e));
}

/// Owns device copies of a Problem's tensors (freed on destruction). Each output is followed by
/// kGuardBytes of a known byte, checked when it is downloaded: a store past an output's last
/// element (a padded head dim's columns, a tail row) is an error even where the accuracy check
/// could not see it (inside the tensor a stray write may land before the element's own).
class DeviceProblem {
 public:
  static constexpr size_t kGuardBytes = 256;
  static constexpr unsigned char kGuardByte = 0xA5;

  /// Copies every input (and the poisoned outputs) of p to GPU 0, stream `stream`.
  DeviceProblem(Problem& p, cudaStream_t stream) : p_(p) {
    at_.device = Device::cuda(0, stream);
    at_.q = upload(p.q), at_.k = upload(p.k), at_.v = upload(p.v), at_.dout = upload(p.dout);
    at_.out = upload(p.out, true), at_.lse = upload(p.lse, true);
    at_.dq = upload(p.dq, true), at_.dk = upload(p.dk, true), at_.dv = upload(p.dv, true);
    at_.sink = upload(p.sink), at_.dsink = upload(p.dsink, true);
    at_.cu_q = upload(p.cu_seqlens_q), at_.cu_k = upload(p.cu_seqlens_k), at_.used_k = upload(p.seqused_k);
  }
  ~DeviceProblem() {
    for (void* ptr : allocs_) cudaFree(ptr);
  }
  DeviceProblem(const DeviceProblem&) = delete;
  DeviceProblem& operator=(const DeviceProblem&) = delete;

  const Placement& placement() const { return at_; }

  /// Waits for the stream, then copies the outputs back into the host Problem; throws if a call
  /// wrote into an output's guard.
  void download_outputs() {
    cuda_check(cudaStreamSynchronize(static_cast<cudaStream_t>(at_.device.stream)), "sync");
    download(p_.out, at_.out, "out"), download(p_.lse, at_.lse, "lse");
    download(p_.dq, at_.dq, "dq"), download(p_.dk, at_.dk, "dk"), download(p_.dv, at_.dv, "dv");
    download(p_.dsink, at_.dsink, "dsink");
  }

 private:
  static size_t bytes(const HostTensor& t) { return size_t(t.numel() * dtype_size(t.dtype())); }
  void* upload(HostTensor& t, bool output = false) {
    if (t.numel() == 0) return nullptr;
    void* ptr = nullptr;
    cuda_check(cudaMalloc(&ptr, bytes(t) + (output ? kGuardBytes : 0)), "cudaMalloc");
    allocs_.push_back(ptr);
    cuda_check(cudaMemcpy(ptr, t.data(), bytes(t), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    if (output) cuda_check(cudaMemset(static_cast<char*>(ptr) + bytes(t), kGuardByte, kGuardBytes), "guard");
    return ptr;
  }
  static void download(HostTensor& t, void* ptr, const char* name) {
    if (t.numel() == 0) return;
    cuda_check(cudaMemcpy(t.data(), ptr, bytes(t), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    unsigned char guard[kGuardBytes];
    cuda_check(cudaMemcpy(guard, static_cast<char*>(ptr) + bytes(t), kGuardBytes, cudaMemcpyDeviceToHost),
               "cudaMemcpy D2H (guard)");
    for (unsigned char b : guard)
      if (b != kGuardByte)
        throw Error(ErrorCode::kInternal, std::string("fa4 cli: the call wrote past the end of ") + name);
  }

  Problem& p_;
  Placement at_;
  std::vector<void*> allocs_;
};

/// A buffer of twice the GPU's L2 size; flush() overwrites it so the next timed run starts with
/// no input resident in L2 (the timing then includes reading q/k/v from HBM, as in training).
class L2Flusher {
 public:
  static constexpr int kL2Multiple = 2;
  L2Flusher() {
    int l2 = 0;
    cuda_check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0), "L2 size");
    bytes_ = static_cast<size_t>(l2) * kL2Multiple;
    if (bytes_ > 0) cuda_check(cudaMalloc(&buf_, bytes_), "cudaMalloc (L2 flush)");
  }
  ~L2Flusher() { cudaFree(buf_); }
  L2Flusher(const L2Flusher&) = delete;
  L2Flusher& operator=(const L2Flusher&) = delete;
  void flush(cudaStream_t stream) {
    if (buf_) cuda_check(cudaMemsetAsync(buf_, flip_ ^= 1, bytes_, stream), "L2 flush");
  }
  size_t bytes() const { return bytes_; }

 private:
  void* buf_ = nullptr;
  size_t bytes_ = 0;
  int flip_ = 0;
};

#endif  // FA4_WITH_CUDA

}  // namespace fa4::cli
