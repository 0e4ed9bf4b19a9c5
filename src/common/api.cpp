// src/common/api.cpp — fa4::forward / fa4::backward / fa4::forward_with_kvcache and their
// *_support queries.
//
// Each entry point is: validate (common/validate.cpp: user arguments -> FwdParams/BwdParams, all
// errors thrown before anything is written) -> select (ONE function, below, that both answers
// "is it supported?" and decides which implementation runs) -> return early on an empty problem
// -> run. forward_support() runs the same two steps and reports instead of running, so it can
// never disagree with forward() (forward_with_kvcache_support likewise for forward_with_kvcache).
#include <algorithm>
#include <string>

#include "common/validate.h"
#include "cpu/cpu_attention.h"
#include "fa4/attention.h"

#if FA4_WITH_CUDA
#include "hopper/hopper_api.h"
#include "hopper/shared/device_state.h"
#endif

namespace fa4 {
namespace {

enum class Impl { kCpuFlash, kCpuReference, kHopper };
/// Which entry point asks: each has its own CPU implementations and its own Hopper selector.
enum class Direction { kForward, kBackward, kKVCache };

struct Selection {
  ErrorCode code = ErrorCode::kOk;  ///< kOk: `impl` runs; else `error` is the message to throw
  std::string error;
  Impl impl = Impl::kCpuFlash;
  std::string kernel;  ///< name of what runs (reported by forward_support)
};

/// Both spellings: the C++ enumerator and Python's name.
const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kAuto: return "kAuto ('auto')";
    case Backend::kCpu: return "kCpu ('cpu')";
    case Backend::kCpuReference: return "kCpuReference ('cpu_reference')";
    case Backend::kCuda: return "kCuda ('cuda')";
  }
  return "unknown";
}

Selection reject(ErrorCode code, const char* fn, const std::string& msg) {
  Selection s;
  s.code = code;
  s.error = std::string(fn) + ": " + msg;
  return s;
}

Selection accept(Impl impl, std::string kernel) {
  Selection s;
  s.impl = impl;
  s.kernel = std::move(kernel);
  return s;
}

/// THE selector. `p` is validated. Never throws for an unsupported configuration: it returns the
/// message, so forward_support can report exactly what forward would throw.
/// `bwd`: the backward's params (p is their forward part), required for Direction::kBackward;
/// `kv`: forward_with_kvcache's params (p is their forward part), required for kKVCache.
Selection select(const detail::FwdParams& p, Backend backend, Direction dir, const char* fn,
                 bool want_name = false, const detail::BwdParams* bwd = nullptr,
                 const detail::KVCacheParams* kv = nullptr) {
  switch (backend) {
    case Backend::kAuto: case Backend::kCpu: case Backend::kCpuReference: case Backend::kCuda:
      break;
    default:
      return reject(ErrorCode::kInvalidArgument, fn,
                    "options.backend = " + std::to_string(static_cast<int>(backend)) +
                        " is not a fa4::Backend value");
  }
  const bool cuda = p.device.type == DeviceType::kCUDA;

  if (!cuda) {
    switch (backend) {
      case Backend::kAuto:
      case Backend::kCpu:
        return accept(Impl::kCpuFlash, dir == Direction::kForward  ? "cpu::flash_forward"
                                       : dir == Direction::kBackward ? "cpu::flash_backward"
                                                                     : "cpu::flash_forward_with_kvcache");
      case Backend::kCpuReference:
        return accept(Impl::kCpuReference,
                      dir == Direction::kForward    ? "cpu::reference_forward"
                      : dir == Direction::kBackward ? "cpu::reference_backward"
                                                    : "cpu::reference_forward_with_kvcache");
      case Backend::kCuda:
        return reject(ErrorCode::kInvalidArgument, fn,
                      std::string("options.backend = ") + backend_name(backend) +
                          " needs CUDA tensors, but q is on the cpu");
    }
  }

  // CUDA tensors.
  if (backend == Backend::kCpu || backend == Backend::kCpuReference)
    return reject(ErrorCode::kInvalidArgument, fn,
                  std::string("options.backend = ") + backend_name(backend) +
                      " needs CPU tensors, but q is on cuda:" + std::to_string(p.device.index));
#if FA4_WITH_CUDA
  std::string kernel;  // named only for forward_support: the call path builds no strings
  std::string* name = want_name ? &kernel : nullptr;
  const std::string why = dir == Direction::kForward    ? hopper::forward_support(p, name)
                          : dir == Direction::kBackward ? hopper::backward_support(*bwd, name)
                                                        : hopper::kvcache_support(*kv, name);
  if (!why.empty()) {
    // No usable GPU is NO_DEVICE whatever else the selector found (e.g. an fp32 q on it).
    const std::string missing = hopper::missing_device(p.device.index);
    if (!missing.empty()) return reject(ErrorCode::kNoDevice, fn, missing);
    return reject(ErrorCode::kUnsupported, fn, why);
  }
  return accept(Impl::kHopper, kernel);
#else
  (void)want_name;
  (void)bwd;
  (void)kv;
  return reject(ErrorCode::kNoDevice, fn,
                "q is a CUDA tensor but fa4 was built without CUDA (configure with FA4_CUDA=ON)");
#endif
}

void throw_if_rejected(const Selection& s) {
  if (s.code != ErrorCode::kOk) throw Error(s.code, s.error);
}

/// A backward with no queries and no keys (or no sequence, no head): no implementation runs, only
/// dsink is zeroed. With no queries but some keys, dk/dv (and dsink) are exactly zero and must be
/// written (case C28: empty gradients, never garbage), which the implementations do.
bool backward_runs_nothing(const detail::BwdParams& p) {
  return detail::is_empty_problem(p) && (p.total_k == 0 || p.batch == 0 || p.num_heads == 0);
}

}  // namespace

void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
             const TensorView& lse, const AttentionOptions& options) {
  constexpr const char* kFn = "fa4::forward";
  const detail::FwdParams p = detail::make_fwd_params(q, k, v, out, lse, options, kFn);
  const Selection s = select(p, options.backend, Direction::kForward, kFn);
  throw_if_rejected(s);
  if (detail::is_empty_problem(p)) return;  // nothing to read or write (case C28)
  switch (s.impl) {
    case Impl::kCpuFlash: cpu::flash_forward(p); return;
    case Impl::kCpuReference: cpu::reference_forward(p); return;
    case Impl::kHopper:
#if FA4_WITH_CUDA
      hopper::forward(p);
      return;
#else
      break;
#endif
  }
  throw Error(ErrorCode::kInternal, std::string(kFn) + ": selector picked no implementation");
}

void backward(const TensorView& dout, const TensorView& q, const TensorView& k,
              const TensorView& v, const TensorView& out, const TensorView& lse,
              const TensorView& dq, const TensorView& dk, const TensorView& dv,
              const BackwardOptions& options, const std::optional<TensorView>& dsink) {
  constexpr const char* kFn = "fa4::backward";
  const detail::BwdParams p =
      detail::make_bwd_params(dout, q, k, v, out, lse, dq, dk, dv, options, dsink, kFn);
  const Selection s = select(p, options.backend, Direction::kBackward, kFn, false, &p);
  throw_if_rejected(s);
  // With neither queries nor keys, dk/dv have no element and only dsink (the sink's gradient,
  // num_heads zeros) is written.
  if (backward_runs_nothing(p)) {
    if (p.dsink && p.num_heads > 0) {
#if FA4_WITH_CUDA
      if (s.impl == Impl::kHopper) {
        hopper::zero_dsink(p);
        return;
      }
#endif
      std::fill(p.dsink, p.dsink + p.num_heads, 0.f);
    }
    return;
  }
  switch (s.impl) {
    case Impl::kCpuFlash: cpu::flash_backward(p); return;
    case Impl::kCpuReference: cpu::reference_backward(p); return;
    case Impl::kHopper:
#if FA4_WITH_CUDA
      hopper::backward(p);
      return;
#else
      break;
#endif
  }
  throw Error(ErrorCode::kInternal, std::string(kFn) + ": selector picked no implementation");
}

size_t backward_workspace_size(const TensorView& dout, const TensorView& q, const TensorView& k,
                               const TensorView& v, const TensorView& out, const TensorView& lse,
                               const TensorView& dq, const TensorView& dk, const TensorView& dv,
                               const BackwardOptions& options, const std::optional<TensorView>& dsink) {
  constexpr const char* kFn = "fa4::backward_workspace_size";
  const detail::BwdParams p =
      detail::make_bwd_params(dout, q, k, v, out, lse, dq, dk, dv, options, dsink, kFn);
  const Selection s = select(p, options.backend, Direction::kBackward, kFn, false, &p);
  throw_if_rejected(s);
  if (s.impl != Impl::kHopper || backward_runs_nothing(p)) return 0;
#if FA4_WITH_CUDA
  return size_t(hopper::backward_workspace_bytes(p));
#else
  throw Error(ErrorCode::kInternal, std::string(kFn) + ": selector picked no implementation");
#endif
}

void forward_with_kvcache(const TensorView& q, const TensorView& k_cache,
                          const TensorView& v_cache, const TensorView& out, const TensorView& lse,
                          const KVCacheOptions& options) {
  constexpr const char* kFn = "fa4::forward_with_kvcache";
  const detail::KVCacheParams p =
      detail::make_kvcache_params(q, k_cache, v_cache, out, lse, options, kFn);
  const Selection s = select(p, options.backend, Direction::kKVCache, kFn, false, nullptr, &p);
  throw_if_rejected(s);
  // No sequence, or no query and nothing to append: nothing to read or write. With no query but
  // an append, the append still runs (the implementations skip the attention then).
  if (detail::is_empty_kvcache_problem(p)) return;
  switch (s.impl) {
    case Impl::kCpuFlash: cpu::flash_forward_with_kvcache(p); return;
    case Impl::kCpuReference: cpu::reference_forward_with_kvcache(p); return;
    case Impl::kHopper:
#if FA4_WITH_CUDA
      hopper::forward_kvcache(p);
      return;
#else
      break;
#endif
  }
  throw Error(ErrorCode::kInternal, std::string(kFn) + ": selector picked no implementation");
}

void check_async_errors(int device_index) {
#if FA4_WITH_CUDA
  hopper::check_async_errors(device_index);
#else
  (void)device_index;  // no kernel ever ran
#endif
}

void release_cached_memory(int device_index) {
  if (device_index < 0)
    throw Error(ErrorCode::kInvalidArgument, "fa4::release_cached_memory: device_index = " +
                                                 std::to_string(device_index) + " must be >= 0");
#if FA4_WITH_CUDA
  hopper::release_cached_memory(device_index);
#endif  // (without CUDA nothing is ever cached)
}

namespace detail {
namespace {

/// The answer of a *_support query: `run` validates and selects (as the call would) and returns
/// the Selection; the message and code are those the call would throw. Never throws.
template <class Run>
ErrorCode answer_support(const char* fn, std::string* message, std::string* kernel_name, Run run) {
  if (kernel_name) kernel_name->clear();
  if (message) message->clear();
  try {
    const Selection s = run();
    if (s.code != ErrorCode::kOk) {
      if (message) *message = s.error;
      return s.code;
    }
    if (kernel_name) *kernel_name = s.kernel;
    return ErrorCode::kOk;
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  } catch (const std::exception& e) {  // documented to answer, never to throw
    if (message) *message = std::string(fn) + ": internal error: " + e.what();
    return ErrorCode::kInternal;
  }
}

}  // namespace

ErrorCode forward_support_code(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse,
                               const AttentionOptions& options, std::string* message,
                               std::string* kernel_name) {
  // Same function name as forward(): the answer is the error forward() would throw.
  constexpr const char* kFn = "fa4::forward";
  return answer_support(kFn, message, kernel_name, [&] {
    const FwdParams p = make_fwd_params(q, k, v, out, lse, options, kFn);
    return select(p, options.backend, Direction::kForward, kFn, kernel_name != nullptr);
  });
}

ErrorCode kvcache_support_code(const TensorView& q, const TensorView& k_cache,
                               const TensorView& v_cache, const TensorView& out,
                               const TensorView& lse, const KVCacheOptions& options,
                               std::string* message, std::string* kernel_name) {
  constexpr const char* kFn = "fa4::forward_with_kvcache";  // the answer is the call's error
  return answer_support(kFn, message, kernel_name, [&] {
    const KVCacheParams p = make_kvcache_params(q, k_cache, v_cache, out, lse, options, kFn);
    return select(p, options.backend, Direction::kKVCache, kFn, kernel_name != nullptr, nullptr, &p);
  });
}

}  // namespace detail

std::string forward_support(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out, const TensorView& lse,
                            const AttentionOptions& options, std::string* kernel_name) {
  std::string why;
  detail::forward_support_code(q, k, v, out, lse, options, &why, kernel_name);
  return why;
}

std::string forward_with_kvcache_support(const TensorView& q, const TensorView& k_cache,
                                         const TensorView& v_cache, const TensorView& out,
                                         const TensorView& lse, const KVCacheOptions& options,
                                         std::string* kernel_name) {
  std::string why;
  detail::kvcache_support_code(q, k_cache, v_cache, out, lse, options, &why, kernel_name);
  return why;
}

}  // namespace fa4
