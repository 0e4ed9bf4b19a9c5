// fa4/error.h — the one exception type fa4 throws.
#pragma once

#include <stdexcept>
#include <string>

namespace fa4 {

enum class ErrorCode : int32_t {
  kOk = 0,
  kInvalidArgument = 1,  ///< a tensor or option breaks a documented rule (shape, dtype, stride...)
  kUnsupported = 2,      ///< valid, but this build/device has no kernel for it (message says what is)
  kCudaError = 3,        ///< a CUDA runtime call failed
  kNoDevice = 4,         ///< a CUDA tensor was passed but no usable GPU / no CUDA build
  kInternal = 5,         ///< a bug in fa4
};

const char* error_code_name(ErrorCode code);

/// Thrown by every fa4 entry point. Validation errors are thrown before anything is written, and
/// their message names the tensor and the rule, e.g.
///   "fa4::forward: k.shape[3] (headdim) = 72 must equal q.shape[3] = 64".
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace fa4
