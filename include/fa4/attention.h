// fa4/attention.h — exact attention, forward and backward (FlashAttention-4, arXiv 2603.05451).
//
// LAYOUTS (flash-attn's). Strides are free except that the last dim (headdim) must be contiguous.
//   batched:  q    (batch, seqlen_q, num_heads,    headdim)
//             k    (batch, seqlen_k, num_heads_kv, headdim)
//             v    (batch, seqlen_k, num_heads_kv, headdim_v)
//             out  (batch, seqlen_q, num_heads,    headdim_v)       same dtype as q
//             lse  (batch, num_heads, seqlen_q)                      fp32, natural log
//   varlen (options.cu_seqlens_q / cu_seqlens_k set): the batch dim is dropped and rows are packed
//             q    (total_q, num_heads, headdim)   rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1
//             k, v (total_k, num_heads_kv, ...)    rows cu_seqlens_k[b] .. (+ seqused_k[b] if given)
//             out  (total_q, num_heads, headdim_v)
//             lse  (num_heads, total_q)
// dtypes: q/k/v/out bf16, fp16 or fp32 (all the same); fp8_e4m3 is reserved and rejected.
//
// MATHS. s_ij = softmax_scale * <q_i, k_j>; with softcap > 0, s_ij = softcap * tanh(s_ij / softcap).
// Masked pairs are REPLACED by -inf (never added). P = softmax over visible keys, plus the optional
// sink: P_ij = exp(s_ij - lse_i), lse_i = log(sum_j exp(s_ij) + exp(sink_h)) (sink term only if
// given). out_i = sum_j P_ij v_j. The sink joins the denominator only; it has no value row.
//
// MASK (one predicate, src/core/mask.h, shared by every implementation, fwd and bwd):
// query i sees key j (0 <= j < seqlen_k of its sequence) iff
//     j >= i + seqlen_k - seqlen_q - window_size_left    (skipped when window_size_left  == -1)
//     j <= i + seqlen_k - seqlen_q + window_size_right   (skipped when window_size_right == -1)
// i.e. windows and causal are aligned BOTTOM-RIGHT. causal == window (-1, 0); causal together with
// a window_size_right other than -1 or 0 is an error. There is no top-left alignment option
// (PyTorch SDPA's is_causal is top-left; the two differ when seqlen_q != seqlen_k).
//
// EDGE SEMANTICS.
//   * A query row with no visible key (causal with seqlen_q > seqlen_k, windows, seqlen_k == 0,
//     zero-length varlen key sequence): out row = 0, lse = -inf (or = sink_h when a sink is
//     given), and zero gradients. Never NaN.
//   * NaN in q/k/v still propagates to the rows it reaches. NaN in a key/value row past the end
//     of its sequence (tile padding, seqused_k, the next varlen sequence) never does. On the CPU
//     a NaN in a key masked for some rows (causal/window) never reaches those rows either; on the
//     Hopper kernel a NaN in such a V row can (0 * NaN in the P.V matrix product). The Hopper
//     backward, varlen: a NaN in the rows just past a sequence's last key (or query) block's real
//     rows can reach that sequence's dq (dk, dv) the same way (src/hopper/bwd/README.md).
//   * batch == 0, seqlen_q == 0 or total_q == 0: forward reads and writes nothing; backward
//     writes zeros to dk/dv (and dsink), whose gradient is then exactly 0.
//   * varlen: rows of out/lse/dq/dk/dv outside every [cu_seqlens[b], cu_seqlens[b+1]) range, and
//     dk/dv rows past seqused_k, are left untouched.
//   * varlen on CUDA: device-resident cu_seqlens/seqused_k are checked by the kernel, not before
//     the call (see check_async_errors): a sequence breaking a rule is skipped and reported by the
//     next call on the device. Nothing is ever read or written out of bounds.
//
// ERRORS. fa4::Error (fa4/error.h). Every argument is validated before anything is written, except
// the contents of device-resident varlen indices (above). The other exception: ErrorCode::kInternal from the CPU backward's consistency check (P = exp(s - lse)
// must be <= 1, i.e. lse belongs to these inputs and options) is raised after dq/dk/dv were written.
#pragma once

#include <optional>

#include "fa4/error.h"
#include "fa4/tensor.h"

namespace fa4 {

/// Which implementation runs. kAuto: CUDA tensors -> the Hopper kernels, CPU tensors -> the CPU
/// FlashAttention-4 implementation. kCpuReference: the float64 naive reference (CPU tensors only).
enum class Backend : int32_t { kAuto = 0, kCpu = 1, kCpuReference = 2, kCuda = 3 };

/// Options shared by forward and backward. The backward must be given the options the forward used.
struct AttentionOptions {
  /// Multiplies q.k. Default 1/sqrt(headdim) (the real headdim of q, never a padded one, never
  /// headdim_v). Must be finite and > 0.
  std::optional<float> softmax_scale;
  bool causal = false;            ///< bottom-right aligned; same as window (-1, 0)
  int32_t window_size_left = -1;  ///< -1 = unbounded; any other negative value is an error
  int32_t window_size_right = -1; ///< -1 = unbounded; any other negative value is an error
  float softcap = 0.0f;           ///< 0 = off; else s -> softcap * tanh(s / softcap); must be >= 0

  /// Learnable sink: fp32 (num_heads,), a logit in the units of s (after softmax_scale/softcap).
  std::optional<TensorView> sink;

  // ---- varlen (both cu_seqlens set, or neither) ----
  std::optional<TensorView> cu_seqlens_q;  ///< int32 (batch + 1), non-decreasing, starts at 0
  std::optional<TensorView> cu_seqlens_k;  ///< int32 (batch + 1), non-decreasing, starts at 0
  std::optional<TensorView> seqused_k;     ///< int32 (batch,): keys used per sequence (<= its length)
  int32_t max_seqlen_q = 0;                ///< varlen: upper bound of the q lengths
  int32_t max_seqlen_k = 0;                ///< varlen: upper bound of the k lengths

  // ---- FlashAttention-4 softmax knobs (paper Sec. 3: software exp2, lazy rescaling) ----
  /// Lazy-rescaling threshold tau in log2 units: the running row max is only raised when it grows
  /// by more than tau; 0 = classic always-rescale. Must be in [0, 8] (P <= 2^tau must stay
  /// representable in bf16/fp16; the same bound applies to fp32); default 8.
  float rescale_threshold = 8.0f;
  /// Share of exp2 evaluations done by the FMA-pipe polynomial (fa4/exp2.h) instead of the
  /// hardware unit, picked by key-column position within a key tile. Must be a multiple of 1/16 in
  /// [0, 1]. Unset = the tuned default of the kernel that runs (hopper/fwd/tuning_fwd.h).
  std::optional<float> exp2_emulation_fraction;

  Backend backend = Backend::kAuto;
};

struct BackwardOptions : AttentionOptions {
  /// Bitwise-reproducible dq/dk/dv (fixed summation order).
  bool deterministic = false;
};

/// Forward. Writes out and lse. Throws fa4::Error (nothing written) on bad input.
void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
             const TensorView& lse, const AttentionOptions& options = {});

/// Backward. dout and out: layout of out; lse: as returned by forward(). Writes dq (layout of q),
/// dk (of k), dv (of v); dk/dv are summed over the query heads that share each KV head. dsink:
/// fp32 (num_heads,), required iff options.sink is set. Fully masked rows give zero gradients.
void backward(const TensorView& dout, const TensorView& q, const TensorView& k,
              const TensorView& v, const TensorView& out, const TensorView& lse,
              const TensorView& dq, const TensorView& dk, const TensorView& dv,
              const BackwardOptions& options = {},
              const std::optional<TensorView>& dsink = std::nullopt);

/// Reports invalid varlen indices met by an earlier kernel on CUDA device `device_index`.
/// Device-resident cu_seqlens_q/k and seqused_k are not read by the host (that would cost a sync
/// per call and break CUDA graph capture): the kernel checks them, computes nothing for a sequence
/// that breaks a rule (its out/lse rows stay unwritten) and records the rule in host-visible
/// memory. This throws fa4::Error(kInvalidArgument) naming the broken rules and clears the record
/// (a kernel still running may set it again: an error is reported at least once). It does not
/// wait for the GPU: synchronise the stream first to see the calls issued on it. Every CUDA
/// forward() that launches a kernel calls it first, so an earlier error fails the next such call
/// on the device (which then writes nothing), whichever stream or thread made the earlier one;
/// forward_support() does not report it. Without CUDA, or before any varlen CUDA call, a no-op.
void check_async_errors(int device_index);

/// Answers "would forward() run on these arguments, and with which kernel?" without running.
/// Returns an empty string if supported plus the kernel name in *kernel_name; otherwise the
/// message forward() would throw.
std::string forward_support(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out, const TensorView& lse,
                            const AttentionOptions& options = {},
                            std::string* kernel_name = nullptr);

}  // namespace fa4
