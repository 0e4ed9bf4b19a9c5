// src/cpu/cpu_attention.h — the CPU implementations behind fa4::forward / fa4::backward.
// All take validated params (include/fa4/detail/params.h) whose pointers are host memory.
#pragma once

#include "fa4/detail/params.h"

namespace fa4::cpu {

/// Naive float64 reference: materialises S and P per (batch, head). Any dtype in, result rounded
/// to the output dtype. The oracle for every other implementation.
void reference_forward(const detail::FwdParams& p);
void reference_backward(const detail::BwdParams& p);

/// FlashAttention-4 algorithm on the CPU (float32 accumulation): tiled online softmax in the log2
/// domain, lazy rescaling (threshold p.rescale_threshold), exp2 split between std::exp2 and the
/// software polynomial (fa4/exp2.h) by key-column position. Threaded with OpenMP over
/// (batch, head, query tile).
void flash_forward(const detail::FwdParams& p);
void flash_backward(const detail::BwdParams& p);

/// Key/query tile sizes the CPU implementation uses (the exp2 split rule is relative to a key tile).
inline constexpr int kCpuTileM = 64;
inline constexpr int kCpuTileN = 128;
/// Exp2 split used when the caller gives no fraction: 2 of every 16 8-column groups = 12.5%.
inline constexpr Exp2Split kCpuDefaultExp2Split{16, 2};

}  // namespace fa4::cpu
