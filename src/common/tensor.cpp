// src/common/tensor.cpp — TensorView helpers and the names used in error messages.
#include "fa4/tensor.h"

#include <sstream>

#include "fa4/error.h"

namespace fa4 {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kBF16: return "bf16";
    case DType::kFP16: return "fp16";
    case DType::kFP32: return "fp32";
    case DType::kFP8E4M3: return "fp8_e4m3";
    case DType::kInt32: return "int32";
  }
  return "unknown_dtype";
}

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kCudaError: return "cuda_error";
    case ErrorCode::kNoDevice: return "no_device";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown_error";
}

namespace {

// The factories are the one place a TensorView gets its shape from a list, so they reject what
// would otherwise overflow the fixed-size arrays or describe a negative extent.
void check_shape_list(std::initializer_list<int64_t> shape, const char* fn) {
  if (shape.size() > static_cast<size_t>(TensorView::kMaxDims)) {
    std::ostringstream s;
    s << fn << ": " << shape.size() << " dims given; a TensorView holds at most "
      << TensorView::kMaxDims;
    throw Error(ErrorCode::kInvalidArgument, s.str());
  }
  int d = 0;
  for (int64_t n : shape) {
    if (n < 0) {
      std::ostringstream s;
      s << fn << ": shape[" << d << "] = " << n << " must be >= 0";
      throw Error(ErrorCode::kInvalidArgument, s.str());
    }
    ++d;
  }
}

}  // namespace

namespace {

/// The fields every factory sets; strides are left to the caller.
TensorView view_of(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device,
                   const char* fn) {
  check_shape_list(shape, fn);
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.ndim = static_cast<int32_t>(shape.size());
  int d = 0;
  for (int64_t n : shape) t.shape[d++] = n;
  return t;
}

}  // namespace

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  TensorView t = view_of(data, dtype, shape, device, "fa4::TensorView::contiguous");
  int64_t step = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    t.stride[i] = step;
    // A zero extent must not zero the outer strides: they stay well-defined for error messages.
    step *= t.shape[i] > 0 ? t.shape[i] : 1;
  }
  return t;
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               std::initializer_list<int64_t> stride, Device device) {
  constexpr const char* kFn = "fa4::TensorView::strided";
  TensorView t = view_of(data, dtype, shape, device, kFn);
  if (shape.size() != stride.size()) {
    std::ostringstream s;
    s << kFn << ": " << shape.size() << " shape entries but " << stride.size()
      << " strides; they must have the same length";
    throw Error(ErrorCode::kInvalidArgument, s.str());
  }
  int d = 0;
  for (int64_t s : stride) t.stride[d++] = s;
  return t;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim && i < kMaxDims; ++i) n *= shape[i];
  return n;
}

std::string TensorView::shape_string() const {
  std::ostringstream s;
  s << '(';
  for (int i = 0; i < ndim && i < kMaxDims; ++i) s << (i ? ", " : "") << shape[i];
  s << ')';
  return s.str();
}

}  // namespace fa4
