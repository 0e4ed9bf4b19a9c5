// src/common/validate.h — the ONE step from user arguments to FwdParams / BwdParams.
//
// Every rule documented in include/fa4/attention.h is checked here, before any implementation
// runs, so bad input never writes a byte (fused-attention cases C20, C21, C28, C32, C34, C35).
// Violations throw fa4::Error whose message starts with `fn` and names the tensor and the rule,
// e.g. "fa4::forward: k.shape[3] (headdim) = 72 must equal q.shape[3] = 64".
//
// The contents of host-resident cu_seqlens_q/k and seqused_k are checked here too. Device-resident
// ones are not read (that would cost a host sync per call and break CUDA graph capture): the
// kernel checks the same rules per sequence, computes nothing for a sequence that breaks them and
// reports it asynchronously (fa4::check_async_errors); it never reads or writes out of bounds.
#pragma once

#include <optional>
#include <string>

#include "fa4/attention.h"
#include "core/params.h"

namespace fa4::detail {

/// Largest head dim (of q/k and of v) any implementation accepts. The CPU implementations handle
/// every value in [1, kMaxHeadDim]; the GPU selector narrows this further.
inline constexpr int32_t kMaxHeadDim = 256;
/// Upper bound of options.rescale_threshold (log2 units): P <= 2^tau must fit 16-bit inputs.
inline constexpr float kMaxRescaleThreshold = 8.0f;
/// options.exp2_emulation_fraction must be a multiple of 1/kExp2FractionDenominator.
inline constexpr int32_t kExp2FractionDenominator = 16;

/// Validates forward arguments and resolves defaults (softmax_scale, causal -> window right = 0,
/// exp2 emulation share); last, that the outputs out and lse share no memory with each other or
/// with an input (out may be q itself in a batched call). `fn` prefixes every message
/// ("fa4::forward"). Throws fa4::Error.
FwdParams make_fwd_params(const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& out, const TensorView& lse,
                          const AttentionOptions& options, const char* fn);

/// Validates backward arguments: what make_fwd_params checks of q/k/v/out/lse and the options,
/// but not its rule on the outputs' memory (out and lse are inputs here, which may share memory
/// with other inputs); plus dout (layout and dtype of out), dq/dk/dv (of q/k/v), dsink (fp32
/// (num_heads,), required iff options.sink), and last that the gradients share no memory with
/// each other or with an input (dq may be q itself). Throws fa4::Error.
BwdParams make_bwd_params(const TensorView& dout, const TensorView& q, const TensorView& k,
                          const TensorView& v, const TensorView& out, const TensorView& lse,
                          const TensorView& dq, const TensorView& dk, const TensorView& dv,
                          const BackwardOptions& options, const std::optional<TensorView>& dsink,
                          const char* fn);

/// Validates forward_with_kvcache arguments (src/common/validate_kvcache.cpp) and fills every
/// field of KVCacheParams (core/params.h): the FwdParams part as for a batched forward whose k/v
/// are the caches, plus the cache description. Host-resident cache_seqlens / cache_batch_idx /
/// page_table contents are checked here; device-resident ones by the kernel. Throws fa4::Error.
KVCacheParams make_kvcache_params(const TensorView& q, const TensorView& k_cache,
                                  const TensorView& v_cache, const TensorView& out,
                                  const TensorView& lse, const KVCacheOptions& options,
                                  const char* fn);

/// True when forward_with_kvcache has nothing to read or write: batch == 0, or no query and
/// nothing to append.
inline bool is_empty_kvcache_problem(const KVCacheParams& p) {
  return p.batch == 0 || (p.seqlen_q == 0 && p.seqlen_new == 0);
}

/// fa4::forward_with_kvcache_support with the ErrorCode forward_with_kvcache() would throw (the
/// C ABI reports it, as forward_support_code for forward).
ErrorCode kvcache_support_code(const TensorView& q, const TensorView& k_cache,
                               const TensorView& v_cache, const TensorView& out,
                               const TensorView& lse, const KVCacheOptions& options,
                               std::string* message, std::string* kernel_name);

/// fa4::forward_support with the ErrorCode forward() would throw (kOk: supported; *kernel_name
/// names what runs). The C ABI reports this code, so its status equals fa4_forward's.
ErrorCode forward_support_code(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse,
                               const AttentionOptions& options, std::string* message,
                               std::string* kernel_name);

/// True when there is nothing to compute or write (batch == 0, seqlen_q == 0, total_q == 0, ...).
bool is_empty_problem(const FwdParams& p);

}  // namespace fa4::detail
