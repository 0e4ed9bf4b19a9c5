// tools/cli_case.h — one attention problem for the fa4 command-line tool: its description (what
// the flags say), random host inputs, TensorViews over them, the options struct fa4 consumes, and
// the accuracy check against the float64 oracle.
//
// Host buffers and the accuracy rule are the test suites' own (tests/test_util.h: HostTensor,
// check_accuracy), and the oracle / same-precision baseline is the library's shared naive maths
// (src/cpu/naive_attention.h), so `fa4 check` and the tests judge a result the same way.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fa4/attention.h"
#include "core/mask.h"
#include "test_util.h"

namespace fa4::cli {

using test::HostTensor;

/// Everything the `check` and `bench` flags describe. 0 in num_heads_kv / headdim_v means
/// "same as num_heads / headdim".
struct CaseSpec {
  int32_t batch = 2;
  int32_t seqlen_q = 256;
  int32_t seqlen_k = 256;
  int32_t num_heads = 4;
  int32_t num_heads_kv = 0;
  int32_t headdim = 64;
  int32_t headdim_v = 0;
  std::string dtype = "bf16";
  bool causal = false;
  std::vector<int32_t> window = {-1, -1};  ///< window_size_left, window_size_right
  float softcap = 0.0f;
  bool sink = false;                       ///< random per-head sink logits
  std::optional<float> softmax_scale;
  bool varlen = false;                     ///< random per-sequence lengths in [1, seqlen]
  std::vector<int32_t> lens_q;             ///< varlen: these query lengths (one per sequence) instead
  std::vector<int32_t> lens_k;             ///< varlen: these key lengths (one per sequence) instead
  std::vector<int32_t> used_k;             ///< varlen: seqused_k (one per sequence, <= its length)
  int32_t pad_rows = 0;  ///< varlen: packed rows after the last sequence (in none), NaN in q/k/v/dout;
                         ///< the outputs' must stay untouched
  float rescale_threshold = 8.0f;
  std::optional<float> exp2_emulation_fraction;
  std::string device = "cpu";
  uint64_t seed = 0;
  bool backward = false;
  bool deterministic = false;

  int32_t heads_kv() const { return num_heads_kv > 0 ? num_heads_kv : num_heads; }
  int32_t dim_v() const { return headdim_v > 0 ? headdim_v : headdim; }
  DType dtype_enum() const;
  /// The mask as fa4 resolves it (causal folded into window right = 0).
  detail::MaskSpec mask() const;
  /// The scale fa4 uses (default 1/sqrt(headdim)).
  float resolved_scale() const;
  /// One line, e.g. "b=2 sq=256 sk=256 h=4/4 d=64/64 bf16 causal device=cpu seed=0".
  std::string describe() const;
};

/// Sequence layout shared by the batched and varlen forms: rows are numbered contiguously, so
/// query row i of sequence b is row cu_q[b] + i in both (batched: cu_q[b] = b * seqlen_q).
struct SeqLayout {
  bool varlen = false;
  int32_t batch = 0;
  int32_t max_q = 0, max_k = 0;
  std::vector<int32_t> cu_q, cu_k;  ///< batch + 1 entries

  int32_t len_q(int32_t b) const { return cu_q[b + 1] - cu_q[b]; }
  int32_t len_k(int32_t b) const { return cu_k[b + 1] - cu_k[b]; }
  int64_t total_q() const { return cu_q.back(); }
  int64_t total_k() const { return cu_k.back(); }
};

/// Host tensors of one problem. Inputs are random N(0, 1) values already rounded to the dtype.
struct Problem {
  CaseSpec spec;
  SeqLayout seq;
  HostTensor q, k, v, dout;               ///< inputs (dout only with spec.backward)
  HostTensor out, lse, dq, dk, dv;        ///< outputs (gradients only with spec.backward)
  HostTensor sink, dsink;                 ///< fp32 (num_heads,) when spec.sink
  HostTensor cu_seqlens_q, cu_seqlens_k;  ///< int32 (batch + 1,) when spec.varlen
  HostTensor seqused_k;                   ///< int32 (batch,) when spec.used_k is given

  /// Builds the layout and draws the inputs from spec.seed; outputs are allocated and poisoned.
  static Problem make(const CaseSpec& spec);
  /// Query/key pairs visible under the mask, summed over the batch (per head).
  int64_t visible_pairs() const;
};

/// Where each tensor of a Problem lives for one run: host pointers for CPU runs, device copies
/// for CUDA runs (tools/cli_device.h).
struct Placement {
  Device device{};
  void *q = nullptr, *k = nullptr, *v = nullptr, *dout = nullptr;
  void *out = nullptr, *lse = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
  void *sink = nullptr, *dsink = nullptr, *cu_q = nullptr, *cu_k = nullptr, *used_k = nullptr;
  static Placement host(Problem& p);
};

/// View of host tensor t's shape over `ptr` on `device` (null for an empty tensor).
TensorView view_at(const HostTensor& t, void* ptr, Device device);
/// fa4 options for the problem, with sink / cu_seqlens views over `at`'s pointers.
BackwardOptions make_options(const Problem& p, const Placement& at, Backend backend);
void run_forward(const Problem& p, const Placement& at, Backend backend);
void run_backward(const Problem& p, const Placement& at, Backend backend);
/// Name of the kernel fa4 picks for the forward; throws fa4::Error (kUnsupported) if none. Call
/// it after a successful run_forward, so a bad case reports the library's own error code.
std::string forward_kernel_name(const Problem& p, const Placement& at);

/// Checks `tested` (outputs of the implementation under test, same shapes as `poisoned`, which
/// holds the outputs as they were before the run) against the float64 oracle with the project's
/// rule  max|out - ref64| <= 2 * max|naive_same_precision - ref64| + atol (+ the documented exp2
/// slack for fp32). One Accuracy per output: out, lse (+ dq, dk, dv, dsink).
std::vector<test::Accuracy> check_outputs(const Problem& tested, Problem& poisoned);

}  // namespace fa4::cli
