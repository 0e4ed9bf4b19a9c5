// src/core/softmax.h — the softmax algebra every implementation shares (host and device, no CUDA):
// the weight of a partial state when rows merge, and the exact final normalisation with the sink.
//
// A partial state of a row is (m, l, O): the running max m (score units) it was accumulated
// against, l = sum_j 2^((s_j - m) * scale_log2) and O = sum_j 2^((s_j - m) * scale_log2) v_j. With
// lazy rescaling (FlashAttention-4, arXiv 2603.05451, Sec. 3) m may be stale (below the true max
// by up to tau log2 units); every formula here is exact for any m, so a stale max only changes
// rounding. Used by the CPU implementation (online update, finalize), the Hopper forward
// (finalize) and its stream-K merge of partials.
#pragma once

#include <cmath>

#include "core/constants.h"
#include "core/macros.h"

namespace fa4::detail {

/// Weight 2^((m_part - m) * scale_log2) that a partial state accumulated against max m_part takes
/// in a row of max m >= m_part (online update: the old state against the new max; a merge: each
/// part against the merged max). 0 for a part that saw no visible key (m_part = -inf), never
/// NaN. `exp2` is the exponential to use (the GPU passes its MUFU instruction).
template <class Exp2>
FA4_HD float merge_weight(float m_part, float m, float scale_log2, Exp2 exp2) {
  return m_part == -INFINITY ? 0.f : exp2((m_part - m) * scale_log2);
}

/// The final normalisation of a row: out = O * o_scale, and lse in natural log.
struct RowNorm {
  float o_scale;
  float lse;
};

/// m_log2: the row's max in log2 units (-inf if it saw no key); l: its sum against that max;
/// sink: the head's sink logit in natural-log units (score units), or -inf without a sink. The
/// sink joins the denominator only: l' = l 2^(m - M) + 2^(sink log2 e - M), M = max(m, sink log2 e),
/// so neither term overflows. A row with no visible key (l = 0) gets o_scale 0 and lse = sink
/// (-inf without one); a NaN in l (from the data) propagates to both.
FA4_HD RowNorm finalize_row(float m_log2, float l, float sink) {
  if (l == 0.f) return {0.f, sink};
  if (sink == -INFINITY) return {1.f / l, (m_log2 + log2f(l)) * kLn2};
  const float sink_log2 = sink * kLog2e;
  const float mm = fmaxf(m_log2, sink_log2);
  const float f = exp2f(m_log2 - mm);
  const float denom = l * f + exp2f(sink_log2 - mm);
  return {f / denom, (mm + log2f(denom)) * kLn2};
}

}  // namespace fa4::detail
