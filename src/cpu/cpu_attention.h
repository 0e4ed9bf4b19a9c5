// src/cpu/cpu_attention.h — the CPU implementations behind fa4::forward / fa4::backward.
// All take validated params (src/core/params.h) whose pointers are host memory.
#pragma once

#include "core/params.h"

namespace fa4::cpu {

/// Naive float64 reference: materialises S and P per (batch, head). Any dtype in, result rounded
/// to the output dtype. The oracle for every other implementation.
void reference_forward(const detail::FwdParams& p);
void reference_backward(const detail::BwdParams& p);

/// FlashAttention-4 algorithm on the CPU (float32 accumulation; for fp32 inputs the forward's row
/// sums and output accumulators are float64): tiled online softmax in the log2 domain, lazy
/// rescaling (threshold p.rescale_threshold), exp2 emulation share between std::exp2 and the
/// software polynomial (core/exp2.h) by key-column position. Threaded with OpenMP over (batch,
/// head, query tile).
void flash_forward(const detail::FwdParams& p);
void flash_backward(const detail::BwdParams& p);

/// forward_with_kvcache on the CPU (src/cpu/kvcache.cpp): (a) appends k_new/v_new into the cache
/// (bitwise copies; dense: cache row cache_batch_idx[b] or b, paged: through page_table), then
/// (b) per sequence b gathers its seqlen_k(b) keys/values into contiguous buffers and runs
/// flash_forward (resp. reference_forward) on a batch-1 problem, so the maths is exactly theirs.
/// p.num_splits has no effect (the CPU does not split keys). p.seqlen_q == 0: the append only.
void flash_forward_with_kvcache(const detail::KVCacheParams& p);
void reference_forward_with_kvcache(const detail::KVCacheParams& p);

/// Key/query tile sizes the CPU implementation uses (the exp2 emulation share rule is relative to a key tile).
inline constexpr int kCpuTileM = 64;
inline constexpr int kCpuTileN = 128;
/// Exp2 emulation share used when the caller gives no fraction: 2 of every 16 8-column groups = 12.5% for
/// bf16/fp16, whose P rounding (2^-8 / 2^-11) hides the polynomial's ~1e-4 relative error; none
/// for fp32, where that error would be ~20x plain fp32 attention's and break the accuracy rule.
inline constexpr Exp2Emulation kCpuDefaultExp2Emulation{16, 2};
constexpr Exp2Emulation default_exp2_emulation(DType dtype) {
  return dtype == DType::kFP32 ? Exp2Emulation{16, 0} : kCpuDefaultExp2Emulation;
}

}  // namespace fa4::cpu
