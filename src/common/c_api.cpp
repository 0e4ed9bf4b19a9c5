// src/common/c_api.cpp — the C ABI (include/fa4/c_api.h) over the C++ API (include/fa4/attention.h).
//
// Every entry point runs its body inside guarded(), which turns each C++ exception into a status
// and the thread-local last-error message, so no exception ever crosses the ABI. The conversions
// here check only what the C layer itself adds (NULL pointers, enum and boolean ranges, the
// options struct size); every attention rule is left to the C++ validation (src/common/validate).
#include "fa4/c_api.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <new>
#include <optional>
#include <sstream>
#include <string>

#include "common/overrides.h"
#include "common/validate.h"
#include "fa4/attention.h"
#include "fa4/error.h"

#ifndef FA4_VERSION_STRING
#define FA4_VERSION_STRING "unknown"
#endif

namespace {

using fa4::ErrorCode;

// The C enums promise the C++ values (the header says so); keep them in lock-step.
static_assert(FA4_STATUS_INVALID_ARGUMENT == static_cast<int>(ErrorCode::kInvalidArgument));
static_assert(FA4_STATUS_UNSUPPORTED == static_cast<int>(ErrorCode::kUnsupported));
static_assert(FA4_STATUS_CUDA_ERROR == static_cast<int>(ErrorCode::kCudaError));
static_assert(FA4_STATUS_NO_DEVICE == static_cast<int>(ErrorCode::kNoDevice));
static_assert(FA4_STATUS_INTERNAL == static_cast<int>(ErrorCode::kInternal));
static_assert(FA4_DTYPE_BF16 == static_cast<int>(fa4::DType::kBF16));
static_assert(FA4_DTYPE_FP16 == static_cast<int>(fa4::DType::kFP16));
static_assert(FA4_DTYPE_FP32 == static_cast<int>(fa4::DType::kFP32));
static_assert(FA4_DTYPE_FP8_E4M3 == static_cast<int>(fa4::DType::kFP8E4M3));
static_assert(FA4_DTYPE_INT32 == static_cast<int>(fa4::DType::kInt32));
static_assert(FA4_DEVICE_CPU == static_cast<int>(fa4::DeviceType::kCPU));
static_assert(FA4_DEVICE_CUDA == static_cast<int>(fa4::DeviceType::kCUDA));
static_assert(FA4_BACKEND_AUTO == static_cast<int>(fa4::Backend::kAuto));
static_assert(FA4_BACKEND_CPU == static_cast<int>(fa4::Backend::kCpu));
static_assert(FA4_BACKEND_CPU_REFERENCE == static_cast<int>(fa4::Backend::kCpuReference));
static_assert(FA4_BACKEND_CUDA == static_cast<int>(fa4::Backend::kCuda));
static_assert(FA4_MAX_DIMS == fa4::TensorView::kMaxDims);

// The v1 struct (up to seqused_k; ABI 4 appended workspace) is the smallest options struct any
// caller can hand us.
constexpr size_t kOptionsV1Size = offsetof(fa4_options, workspace);
static_assert(kOptionsV1Size == 88 || sizeof(void*) != 8, "fa4_options v1 is 88 bytes on LP64");
// fa4_kvcache_args first appeared in ABI v3 with exactly its current fields.
constexpr size_t kKVCacheArgsV3Size = sizeof(fa4_kvcache_args);

// The last error of this thread: a fixed, trivially destructible buffer, so recording an error
// never allocates (it also reports std::bad_alloc) and foreign threads (Python's, a framework's)
// get no thread-exit destructor from libfa4.
constexpr size_t kLastErrorCapacity = 4096;  // messages are a few hundred bytes; longer are cut
thread_local char t_last_error[kLastErrorCapacity] = {};

void set_last_error(const char* message) noexcept {
  const size_t n = std::min(std::strlen(message), kLastErrorCapacity - 1);
  std::memcpy(t_last_error, message, n);
  t_last_error[n] = '\0';
}

void append_last_error(const char* message) noexcept {
  const size_t used = std::strlen(t_last_error);
  const size_t n = std::min(std::strlen(message), kLastErrorCapacity - 1 - used);
  std::memcpy(t_last_error + used, message, n);
  t_last_error[used + n] = '\0';
}

[[noreturn]] void fail(ErrorCode code, const std::string& message) {
  throw fa4::Error(code, message);
}

// Runs `body`; returns FA4_STATUS_OK or the status of the exception it threw, recording the message.
template <class Body>
int32_t guarded(const char* fn, Body&& body) noexcept {
  t_last_error[0] = '\0';
  try {
    body();
    return FA4_STATUS_OK;
  } catch (const fa4::Error& e) {
    set_last_error(e.what());
    return static_cast<int32_t>(e.code());
  } catch (const std::bad_alloc&) {
    set_last_error(fn);
    append_last_error(": out of host memory");
    return FA4_STATUS_INTERNAL;
  } catch (const std::exception& e) {
    set_last_error(fn);
    append_last_error(": internal error: ");
    append_last_error(e.what());
    return FA4_STATUS_INTERNAL;
  } catch (...) {
    set_last_error(fn);
    append_last_error(": internal error: unknown exception");
    return FA4_STATUS_INTERNAL;
  }
}

fa4::TensorView to_view(const fa4_tensor* t, const char* fn, const char* name) {
  if (t == nullptr) fail(ErrorCode::kInvalidArgument, std::string(fn) + ": " + name + " is NULL");
  if (t->ndim < 0 || t->ndim > FA4_MAX_DIMS) {
    std::ostringstream s;
    s << fn << ": " << name << ".ndim = " << t->ndim << " must be in [0, " << FA4_MAX_DIMS << "]";
    fail(ErrorCode::kInvalidArgument, s.str());
  }
  if (t->dtype < FA4_DTYPE_BF16 || t->dtype > FA4_DTYPE_INT32) {
    std::ostringstream s;
    s << fn << ": " << name << ".dtype = " << t->dtype << " is not an fa4_dtype value";
    fail(ErrorCode::kInvalidArgument, s.str());
  }
  if (t->device_type != FA4_DEVICE_CPU && t->device_type != FA4_DEVICE_CUDA) {
    std::ostringstream s;
    s << fn << ": " << name << ".device_type = " << t->device_type
      << " is not an fa4_device_type value (0 = CPU, 1 = CUDA)";
    fail(ErrorCode::kInvalidArgument, s.str());
  }
  fa4::TensorView v;
  v.data = t->data;
  v.dtype = static_cast<fa4::DType>(t->dtype);
  v.ndim = t->ndim;
  for (int d = 0; d < FA4_MAX_DIMS; ++d) {
    v.shape[d] = d < t->ndim ? t->shape[d] : 0;
    v.stride[d] = d < t->ndim ? t->stride[d] : 0;
  }
  v.device.type = static_cast<fa4::DeviceType>(t->device_type);
  v.device.index = t->device_type == FA4_DEVICE_CUDA ? t->device_index : 0;
  v.device.stream = t->stream;
  return v;
}

std::optional<fa4::TensorView> to_optional_view(const fa4_tensor* t, const char* fn,
                                                const char* name) {
  if (t == nullptr) return std::nullopt;
  return to_view(t, fn, name);
}

bool to_bool(int32_t value, const char* fn, const char* field) {
  if (value != 0 && value != 1) {
    std::ostringstream s;
    s << fn << ": options." << field << " = " << value << " must be 0 or 1";
    fail(ErrorCode::kInvalidArgument, s.str());
  }
  return value == 1;
}

void write_defaults(fa4_options* o) {
  std::memset(o, 0, sizeof(*o));
  const fa4::BackwardOptions d{};
  o->struct_size = sizeof(*o);
  o->has_softmax_scale = 0;
  o->softmax_scale = 0.0f;
  o->causal = d.causal ? 1 : 0;
  o->window_size_left = d.window_size_left;
  o->window_size_right = d.window_size_right;
  o->softcap = d.softcap;
  o->max_seqlen_q = d.max_seqlen_q;
  o->max_seqlen_k = d.max_seqlen_k;
  o->rescale_threshold = d.rescale_threshold;
  o->has_exp2_emulation_fraction = 0;
  o->exp2_emulation_fraction = 0.0f;
  o->backend = static_cast<int32_t>(d.backend);
  o->deterministic = d.deterministic ? 1 : 0;
}

// The caller's struct, read up to the size both sides know; bytes only a newer caller knows must
// be zero (= "default"), else they carry a request this library would silently ignore.
fa4_options read_options(const fa4_options* given, const char* fn) {
  fa4_options o;
  write_defaults(&o);
  if (given == nullptr) return o;
  const size_t size = given->struct_size;
  if (size < kOptionsV1Size) {
    std::ostringstream s;
    s << fn << ": options.struct_size = " << size << " is smaller than the v1 fa4_options ("
      << kOptionsV1Size << " bytes); initialise options with fa4_options_init(&o, sizeof(o))";
    fail(ErrorCode::kInvalidArgument, s.str());
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(given);
  for (size_t i = sizeof(fa4_options); i < size; ++i) {
    if (bytes[i] != 0) {
      std::ostringstream s;
      s << fn << ": options sets fields unknown to this library (fa4 " << FA4_VERSION_STRING
        << ", C ABI v" << FA4_C_API_VERSION << ", options struct of " << sizeof(fa4_options)
        << " bytes; byte " << i << " of " << size << " is non-zero); upgrade libfa4";
      fail(ErrorCode::kUnsupported, s.str());
    }
  }
  // An older caller's smaller struct: its fields only, the rest keep their defaults.
  std::memcpy(&o, given, std::min(size, sizeof(fa4_options)));
  o.struct_size = sizeof(fa4_options);
  return o;
}

fa4::BackwardOptions to_cpp_options(const fa4_options* given, const char* fn) {
  const fa4_options o = read_options(given, fn);
  fa4::BackwardOptions r;
  if (to_bool(o.has_softmax_scale, fn, "has_softmax_scale")) r.softmax_scale = o.softmax_scale;
  r.causal = to_bool(o.causal, fn, "causal");
  r.window_size_left = o.window_size_left;
  r.window_size_right = o.window_size_right;
  r.softcap = o.softcap;
  r.sink = to_optional_view(o.sink, fn, "sink");
  r.cu_seqlens_q = to_optional_view(o.cu_seqlens_q, fn, "cu_seqlens_q");
  r.cu_seqlens_k = to_optional_view(o.cu_seqlens_k, fn, "cu_seqlens_k");
  r.seqused_k = to_optional_view(o.seqused_k, fn, "seqused_k");
  r.max_seqlen_q = o.max_seqlen_q;
  r.max_seqlen_k = o.max_seqlen_k;
  r.rescale_threshold = o.rescale_threshold;
  if (to_bool(o.has_exp2_emulation_fraction, fn, "has_exp2_emulation_fraction")) {
    r.exp2_emulation_fraction = o.exp2_emulation_fraction;
  }
  if (o.backend < FA4_BACKEND_AUTO || o.backend > FA4_BACKEND_CUDA) {
    std::ostringstream s;
    s << fn << ": options.backend = " << o.backend
      << " is not an fa4_backend value (0 auto, 1 cpu, 2 cpu_reference, 3 cuda)";
    fail(ErrorCode::kInvalidArgument, s.str());
  }
  r.backend = static_cast<fa4::Backend>(o.backend);
  r.deterministic = to_bool(o.deterministic, fn, "deterministic");
  r.workspace = to_optional_view(o.workspace, fn, "options.workspace");
  return r;
}

/// The forwards' options: options.workspace belongs to the backward.
fa4::BackwardOptions to_cpp_forward_options(const fa4_options* given, const char* fn) {
  fa4::BackwardOptions r = to_cpp_options(given, fn);
  if (r.workspace)
    fail(ErrorCode::kInvalidArgument,
         std::string(fn) + ": options.workspace is given, but only fa4_backward takes a workspace");
  return r;
}

// The caller's KV-cache args, with the struct_size rules of read_options; NULL = all defaults.
fa4_kvcache_args read_kvcache_args(const fa4_kvcache_args* given, const char* fn) {
  fa4_kvcache_args a;
  std::memset(&a, 0, sizeof(a));
  a.struct_size = sizeof(a);
  if (given == nullptr) return a;
  const size_t size = given->struct_size;
  if (size < kKVCacheArgsV3Size) {
    std::ostringstream s;
    s << fn << ": args.struct_size = " << size << " is smaller than the v3 fa4_kvcache_args ("
      << kKVCacheArgsV3Size << " bytes); initialise args with fa4_kvcache_args_init(&a, sizeof(a))";
    fail(ErrorCode::kInvalidArgument, s.str());
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(given);
  for (size_t i = sizeof(fa4_kvcache_args); i < size; ++i) {
    if (bytes[i] != 0) {
      std::ostringstream s;
      s << fn << ": args sets fields unknown to this library (fa4 " << FA4_VERSION_STRING
        << ", C ABI v" << FA4_C_API_VERSION << ", fa4_kvcache_args of " << sizeof(fa4_kvcache_args)
        << " bytes; byte " << i << " of " << size << " is non-zero); upgrade libfa4";
      fail(ErrorCode::kUnsupported, s.str());
    }
  }
  std::memcpy(&a, given, sizeof(fa4_kvcache_args));
  if (a.reserved != 0) {
    std::ostringstream s;
    s << fn << ": args.reserved = " << a.reserved << " must be 0";
    fail(ErrorCode::kInvalidArgument, s.str());
  }
  return a;
}

/// fa4::KVCacheOptions from the shared options (the AttentionOptions part) and the KV-cache args.
fa4::KVCacheOptions to_cpp_kvcache_options(const fa4_options* options,
                                           const fa4_kvcache_args* given, const char* fn) {
  fa4::KVCacheOptions r;
  static_cast<fa4::AttentionOptions&>(r) = to_cpp_forward_options(options, fn);
  const fa4_kvcache_args a = read_kvcache_args(given, fn);
  r.k_new = to_optional_view(a.k_new, fn, "k_new");
  r.v_new = to_optional_view(a.v_new, fn, "v_new");
  r.cache_seqlens = to_optional_view(a.cache_seqlens, fn, "cache_seqlens");
  r.cache_batch_idx = to_optional_view(a.cache_batch_idx, fn, "cache_batch_idx");
  r.page_table = to_optional_view(a.page_table, fn, "page_table");
  r.num_splits = a.num_splits;
  return r;
}

void copy_kernel_name(const std::string& name, char* kernel_name, size_t capacity) {
  if (kernel_name != nullptr && capacity > 0) {
    const size_t n = name.size() < capacity - 1 ? name.size() : capacity - 1;
    std::memcpy(kernel_name, name.data(), n);
    kernel_name[n] = '\0';
  }
}

}  // namespace

extern "C" {

int32_t fa4_options_init(fa4_options* options, size_t struct_size) {
  return guarded("fa4_options_init", [&] {
    if (options == nullptr) fail(ErrorCode::kInvalidArgument, "fa4_options_init: options is NULL");
    if (struct_size < kOptionsV1Size) {
      std::ostringstream s;
      s << "fa4_options_init: struct_size = " << struct_size
        << " is smaller than the v1 fa4_options (" << kOptionsV1Size << " bytes)";
      fail(ErrorCode::kInvalidArgument, s.str());
    }
    fa4_options d;
    write_defaults(&d);
    // A caller compiled against a newer header has a larger struct: its extra fields are zeroed,
    // which every later field defines as its default.
    std::memset(options, 0, struct_size);
    std::memcpy(options, &d, std::min(struct_size, sizeof(d)));
    options->struct_size = static_cast<uint32_t>(struct_size);
  });
}

int32_t fa4_forward(const fa4_tensor* q, const fa4_tensor* k, const fa4_tensor* v,
                    const fa4_tensor* out, const fa4_tensor* lse, const fa4_options* options) {
  constexpr const char* fn = "fa4_forward";
  return guarded(fn, [&] {
    const fa4::BackwardOptions o = to_cpp_forward_options(options, fn);
    fa4::forward(to_view(q, fn, "q"), to_view(k, fn, "k"), to_view(v, fn, "v"),
                 to_view(out, fn, "out"), to_view(lse, fn, "lse"), o);
  });
}

int32_t fa4_backward(const fa4_tensor* dout, const fa4_tensor* q, const fa4_tensor* k,
                     const fa4_tensor* v, const fa4_tensor* out, const fa4_tensor* lse,
                     const fa4_tensor* dq, const fa4_tensor* dk, const fa4_tensor* dv,
                     const fa4_tensor* dsink, const fa4_options* options) {
  constexpr const char* fn = "fa4_backward";
  return guarded(fn, [&] {
    const fa4::BackwardOptions o = to_cpp_options(options, fn);
    fa4::backward(to_view(dout, fn, "dout"), to_view(q, fn, "q"), to_view(k, fn, "k"),
                  to_view(v, fn, "v"), to_view(out, fn, "out"), to_view(lse, fn, "lse"),
                  to_view(dq, fn, "dq"), to_view(dk, fn, "dk"), to_view(dv, fn, "dv"), o,
                  to_optional_view(dsink, fn, "dsink"));
  });
}

int32_t fa4_backward_workspace_size(const fa4_tensor* dout, const fa4_tensor* q, const fa4_tensor* k,
                                    const fa4_tensor* v, const fa4_tensor* out, const fa4_tensor* lse,
                                    const fa4_tensor* dq, const fa4_tensor* dk, const fa4_tensor* dv,
                                    const fa4_tensor* dsink, const fa4_options* options, uint64_t* bytes) {
  constexpr const char* fn = "fa4_backward_workspace_size";
  return guarded(fn, [&] {
    if (bytes == nullptr) fail(ErrorCode::kInvalidArgument, std::string(fn) + ": bytes is NULL");
    const fa4::BackwardOptions o = to_cpp_options(options, fn);
    *bytes = fa4::backward_workspace_size(
        to_view(dout, fn, "dout"), to_view(q, fn, "q"), to_view(k, fn, "k"), to_view(v, fn, "v"),
        to_view(out, fn, "out"), to_view(lse, fn, "lse"), to_view(dq, fn, "dq"), to_view(dk, fn, "dk"),
        to_view(dv, fn, "dv"), o, to_optional_view(dsink, fn, "dsink"));
  });
}

int32_t fa4_forward_support(const fa4_tensor* q, const fa4_tensor* k, const fa4_tensor* v,
                            const fa4_tensor* out, const fa4_tensor* lse,
                            const fa4_options* options, char* kernel_name,
                            size_t kernel_name_capacity) {
  constexpr const char* fn = "fa4_forward_support";
  if (kernel_name != nullptr && kernel_name_capacity > 0) kernel_name[0] = '\0';
  return guarded(fn, [&] {
    const fa4::BackwardOptions o = to_cpp_forward_options(options, fn);
    const fa4::TensorView tq = to_view(q, fn, "q"), tk = to_view(k, fn, "k"),
                          tv = to_view(v, fn, "v"), tout = to_view(out, fn, "out"),
                          tlse = to_view(lse, fn, "lse");
    // The status is the one fa4_forward would return for the same arguments.
    std::string name, why;
    const ErrorCode code = fa4::detail::forward_support_code(tq, tk, tv, tout, tlse, o, &why, &name);
    if (code != ErrorCode::kOk) fail(code, why);
    copy_kernel_name(name, kernel_name, kernel_name_capacity);
  });
}

int32_t fa4_kvcache_args_init(fa4_kvcache_args* args, size_t struct_size) {
  return guarded("fa4_kvcache_args_init", [&] {
    if (args == nullptr) fail(ErrorCode::kInvalidArgument, "fa4_kvcache_args_init: args is NULL");
    if (struct_size < kKVCacheArgsV3Size) {
      std::ostringstream s;
      s << "fa4_kvcache_args_init: struct_size = " << struct_size
        << " is smaller than the v3 fa4_kvcache_args (" << kKVCacheArgsV3Size << " bytes)";
      fail(ErrorCode::kInvalidArgument, s.str());
    }
    // Every default is all-zero bytes (nothing given, num_splits 0 = automatic), including the
    // fields of a newer caller's larger struct.
    std::memset(args, 0, struct_size);
    args->struct_size = static_cast<uint32_t>(struct_size);
  });
}

int32_t fa4_forward_with_kvcache(const fa4_tensor* q, const fa4_tensor* k_cache,
                                 const fa4_tensor* v_cache, const fa4_tensor* out,
                                 const fa4_tensor* lse, const fa4_options* options,
                                 const fa4_kvcache_args* args) {
  constexpr const char* fn = "fa4_forward_with_kvcache";
  return guarded(fn, [&] {
    const fa4::KVCacheOptions o = to_cpp_kvcache_options(options, args, fn);
    fa4::forward_with_kvcache(to_view(q, fn, "q"), to_view(k_cache, fn, "k_cache"),
                              to_view(v_cache, fn, "v_cache"), to_view(out, fn, "out"),
                              to_view(lse, fn, "lse"), o);
  });
}

int32_t fa4_forward_with_kvcache_support(const fa4_tensor* q, const fa4_tensor* k_cache,
                                         const fa4_tensor* v_cache, const fa4_tensor* out,
                                         const fa4_tensor* lse, const fa4_options* options,
                                         const fa4_kvcache_args* args, char* kernel_name,
                                         size_t kernel_name_capacity) {
  constexpr const char* fn = "fa4_forward_with_kvcache_support";
  if (kernel_name != nullptr && kernel_name_capacity > 0) kernel_name[0] = '\0';
  return guarded(fn, [&] {
    const fa4::KVCacheOptions o = to_cpp_kvcache_options(options, args, fn);
    const fa4::TensorView tq = to_view(q, fn, "q"), tk = to_view(k_cache, fn, "k_cache"),
                          tv = to_view(v_cache, fn, "v_cache"), tout = to_view(out, fn, "out"),
                          tlse = to_view(lse, fn, "lse");
    // The status is the one fa4_forward_with_kvcache would return for the same arguments.
    std::string name, why;
    const ErrorCode code =
        fa4::detail::kvcache_support_code(tq, tk, tv, tout, tlse, o, &why, &name);
    if (code != ErrorCode::kOk) fail(code, why);
    copy_kernel_name(name, kernel_name, kernel_name_capacity);
  });
}

const char* fa4_last_error(void) { return t_last_error; }

const char* fa4_status_name(int32_t status) {
  if (status < FA4_STATUS_OK || status > FA4_STATUS_INTERNAL) return "unknown_error";
  return fa4::error_code_name(static_cast<ErrorCode>(status));
}

const char* fa4_version(void) { return FA4_VERSION_STRING; }

int32_t fa4_abi_version(void) { return FA4_C_API_VERSION; }

int32_t fa4_check_async_errors(int32_t device_index) {
  return guarded("fa4_check_async_errors", [&] { fa4::check_async_errors(device_index); });
}

int32_t fa4_release_cached_memory(int32_t device_index) {
  return guarded("fa4_release_cached_memory", [&] { fa4::release_cached_memory(device_index); });
}

int32_t fa4_internal_set_override(const char* name, const char* value) {
  return guarded("fa4_internal_set_override", [&] { fa4::detail::set_kernel_override(name, value); });
}

int32_t fa4_has_cuda(void) {
#if defined(FA4_WITH_CUDA)
  return 1;
#else
  return 0;
#endif
}

}  // extern "C"
