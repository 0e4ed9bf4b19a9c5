// fa4/tensor.h — non-owning tensor view used by every fa4 entry point.
//
// A TensorView describes memory the caller owns: a data pointer, an element type, a shape and
// strides (both in ELEMENTS, int64), and where the memory lives (CPU, or a CUDA device with a
// stream on which fa4 enqueues its work). fa4 never allocates, frees or copies caller tensors.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace fa4 {

/// Element types. kFP8E4M3 is reserved: every entry point rejects it, with ErrorCode::kUnsupported
/// as q's dtype and with kInvalidArgument elsewhere (a tensor whose dtype must be q's, or fp32).
enum class DType : int32_t { kBF16 = 0, kFP16 = 1, kFP32 = 2, kFP8E4M3 = 3, kInt32 = 4 };

/// Bytes per element of `t`.
constexpr int64_t dtype_size(DType t) {
  switch (t) {
    case DType::kBF16: return 2;
    case DType::kFP16: return 2;
    case DType::kFP32: return 4;
    case DType::kFP8E4M3: return 1;
    case DType::kInt32: return 4;
  }
  return 0;
}

/// Lower-case name ("bf16", "fp16", "fp32", "fp8_e4m3", "int32").
const char* dtype_name(DType t);

enum class DeviceType : int32_t { kCPU = 0, kCUDA = 1 };

/// Where a tensor lives. `stream` is a cudaStream_t (nullptr = the legacy default stream); it is
/// ignored for CPU tensors. All tensors of one call must share one device (and one stream).
struct Device {
  DeviceType type = DeviceType::kCPU;
  int32_t index = 0;       ///< CUDA ordinal; 0 for CPU
  void* stream = nullptr;  ///< cudaStream_t for CUDA tensors

  static Device cpu() { return {}; }
  static Device cuda(int32_t index = 0, void* stream = nullptr) {
    return {DeviceType::kCUDA, index, stream};
  }
  friend bool operator==(const Device& a, const Device& b) {
    return a.type == b.type && (a.type == DeviceType::kCPU || a.index == b.index);
  }
};

/// Non-owning strided view. Up to kMaxDims dimensions; shape[i] >= 0; strides in elements, any
/// value >= 0 (0 broadcasts an input; any value, negative too, on size-1 dims, which fa4 ignores).
struct TensorView {
  static constexpr int kMaxDims = 4;

  void* data = nullptr;
  DType dtype = DType::kFP32;
  int32_t ndim = 0;
  int64_t shape[kMaxDims] = {0, 0, 0, 0};
  int64_t stride[kMaxDims] = {0, 0, 0, 0};
  Device device{};

  /// Row-major contiguous view of `shape`. Throws fa4::Error (kInvalidArgument) for more than
  /// kMaxDims dims or a negative extent.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = Device::cpu());
  /// View with explicit strides (elements). Throws fa4::Error (kInvalidArgument) where `shape` and
  /// `stride` differ in length, for more than kMaxDims dims or a negative extent.
  static TensorView strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                            std::initializer_list<int64_t> stride, Device device = Device::cpu());

  int64_t numel() const;
  int64_t size(int d) const { return shape[d]; }
  bool is_cuda() const { return device.type == DeviceType::kCUDA; }
  /// "(2, 128, 8, 64)" — used in error messages.
  std::string shape_string() const;
};

}  // namespace fa4
