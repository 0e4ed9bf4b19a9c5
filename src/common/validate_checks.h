// src/common/validate_checks.h — the building blocks of validation, shared by validate.cpp
// (make_fwd_params / make_bwd_params) and validate_kvcache.cpp (make_kvcache_params), so every
// entry point words the same rule the same way. Internal: not installed, not part of the API.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/params.h"
#include "fa4/attention.h"
#include "fa4/error.h"

namespace fa4::detail::checks {

inline constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

/// Builds messages "<fn>: <parts...>" and throws them.
class Checker {
 public:
  explicit Checker(const char* fn) : fn_(fn ? fn : "fa4") {}

  template <class... A>
  [[noreturn]] void fail(ErrorCode code, const A&... parts) const {
    std::ostringstream s;
    s << fn_ << ": ";
    (s << ... << parts);
    throw Error(code, s.str());
  }
  template <class... A>
  [[noreturn]] void invalid(const A&... parts) const {
    fail(ErrorCode::kInvalidArgument, parts...);
  }

 private:
  const char* fn_;
};

/// One checked tensor: its user-facing name and its view with size-1 strides normalised.
struct Named {
  const char* name;
  TensorView t;
};

/// Checks what a view must satisfy whatever its role, and returns it with the strides of size-0/1
/// dims replaced by the row-major value implied by the inner dims: such strides never move the
/// address (case C20: a transpose leaves odd strides on size-1 dims), and the replacement keeps
/// kernels that build TMA descriptors from the strides away from meaningless values.
/// Outputs (is_output) must not map two elements to one address: a stride of 0 on a dim of extent
/// > 1 would make threads race on one element (and silently keep the last write).
TensorView check_view(const Checker& c, const TensorView& t, const char* name,
                      bool is_output = false);

void check_dtype_is(const Checker& c, const Named& x, DType want, const char* why);
/// Same device (and, for CUDA, the same stream) as `ref`.
void check_same_device(const Checker& c, const Named& x, const Named& ref);
void check_ndim(const Checker& c, const Named& x, int want, const char* layout);
/// Implementations index the last dim (head dim, or a 1-D tensor) with unit stride.
void check_last_contiguous(const Checker& c, const Named& x);

/// Whether some byte of an element of a is a byte of an element of b (non-negative strides whose
/// spans fit int64, as check_view leaves them). Exact for: two dense views; one dense and one
/// whose dims nest; two views whose strides, merged (equal strides as one dim), leave each dim's
/// stride above the inner dims' span, or that take at most 2048 steps of a pruned search. Beyond
/// that (strides of the two views that interleave at no common period) it is true only when a
/// first or last element of one lies inside the other, dense, view. No allocation: every call runs it.
bool views_overlap(const TensorView& a, const TensorView& b);

/// An optional tensor of the options as a check_outputs_apart input (an empty view when unset).
inline Named named_option(const char* name, const std::optional<TensorView>& t) { return {name, t ? *t : TensorView{}}; }

/// The options' tensors every forward and backward kernel reads besides q/k/v: the sink and the
/// varlen indices (the CPU re-reads the indices per tile).
struct OptionInputs {
  Named sink, cu_seqlens_q, cu_seqlens_k, seqused_k;
  explicit OptionInputs(const AttentionOptions& o)
      : sink(named_option("sink", o.sink)),
        cu_seqlens_q(named_option("cu_seqlens_q", o.cu_seqlens_q)),
        cu_seqlens_k(named_option("cu_seqlens_k", o.cu_seqlens_k)),
        seqused_k(named_option("seqused_k", o.seqused_k)) {}
};

/// Outputs apart from every other tensor of the call, checked after the rules on each tensor's own
/// layout, shape and dtype: no two elements of an output share an address (its dims, by
/// increasing stride, each step past every element of the dims inside them; a sufficient rule),
/// and no output shares an address with another output or an input (views_overlap). Interleaved
/// views (q, k, v or dq, dk, dv as slices of one packed tensor) share no address and pass. Null
/// tensors (nullptr entries) and empty views are skipped. `in_place`: (output, input) pairs that
/// may be the same view exactly (same data, dtype, shape and strides), where every
/// implementation has read an input row before it writes the output row.
void check_outputs_apart(const Checker& c, std::initializer_list<const Named*> outputs,
                         std::initializer_list<const Named*> inputs,
                         std::initializer_list<std::pair<const Named*, const Named*>> in_place = {});

/// q.dtype is bf16, fp16 or fp32 (fp8 is reserved: kUnsupported), and every tensor of `same`
/// has q's dtype.
void check_float_dtypes(const Checker& c, const Named& q,
                        std::initializer_list<const Named*> same);

/// The named dims of a call (batch, seqlen_q, num_heads, headdim, ...): the first tensor that has
/// a dim defines it; every later one must agree. One table = one wording for every shape error.
class DimTable {
 public:
  explicit DimTable(const Checker& c) : c_(c) {}

  void visit(const Named& x, std::initializer_list<const char*> names) {
    int d = 0;
    for (const char* dim : names) {
      const Entry* e = find(dim);
      if (e == nullptr) {
        if (size_ == kMaxEntries) c_.fail(ErrorCode::kInternal, "DimTable holds at most ", kMaxEntries, " dims");
        entries_[size_++] = {dim, x.t.shape[d], x.name, d};
      } else if (e->value != x.t.shape[d]) {
        c_.invalid(x.name, ".shape[", d, "] (", dim, ") = ", x.t.shape[d], " must equal ",
                   source_of(*e), " = ", e->value);
      }
      ++d;
    }
  }
  int64_t get(const char* dim) const { return find(dim)->value; }
  /// "<tensor>.shape[<i>]": where the dim was first seen (for messages only, so built on demand).
  std::string source(const char* dim) const { return source_of(*find(dim)); }

 private:
  // A call names at most a dozen dims: a fixed array and pointer-then-strcmp lookups keep the
  // success path free of allocations (it runs on every call).
  static constexpr int kMaxEntries = 16;
  struct Entry {
    const char* name;
    int64_t value;
    const char* tensor;
    int index;
  };
  static std::string source_of(const Entry& e) {
    return std::string(e.tensor) + ".shape[" + std::to_string(e.index) + "]";
  }
  const Entry* find(const char* dim) const {
    for (int i = 0; i < size_; ++i)  // the linker merges equal literals: pointers match first
      if (entries_[i].name == dim) return &entries_[i];
    for (int i = 0; i < size_; ++i)
      if (std::strcmp(entries_[i].name, dim) == 0) return &entries_[i];
    return nullptr;
  }
  const Checker& c_;
  Entry entries_[kMaxEntries];
  int size_ = 0;
};

/// dims.get(dim) as int32 (kUnsupported past the int32 limit).
int32_t to_int32(const Checker& c, const DimTable& dims, const char* dim);

/// The contents of a host-resident 1-D int32 tensor (stride 1 checked).
std::vector<int32_t> read_int32_host(const Named& x);

/// Head counts and head dims (dims "num_heads", "num_heads_kv", "headdim", "headdim_v" visited):
/// each >= 1, num_heads a multiple of num_heads_kv, head dims <= kMaxHeadDim. Fills p.dtype from
/// q, p.device, p.num_heads, p.num_heads_kv, p.headdim, p.headdim_v. `k_name` is the tensor that
/// defines num_heads_kv ("k", "k_cache"), for the messages.
void resolve_heads(const Checker& c, const DimTable& dims, const Named& q, const char* k_name,
                   FwdParams& p);

/// The scalar options shared by every forward (softmax_scale with its default 1/sqrt(p.headdim),
/// softcap, windows and causal, rescale_threshold, exp2_emulation_fraction) into p.
/// p.headdim must be set.
void resolve_scalar_options(const Checker& c, const AttentionOptions& o, FwdParams& p);

/// options.sink: fp32 (num_heads,), on q's device; sets p.sink.
void resolve_sink(const Checker& c, const AttentionOptions& o, const Named& q, DimTable& dims,
                  FwdParams& p);

/// The element strides of a batched (non-varlen) call: q/k/v/out as (batch, row, head), lse as
/// (batch, head, row).
void set_batched_strides(const Named& q, const Named& k, const Named& v, const Named& out,
                         const Named& lse, FwdParams& p);

}  // namespace fa4::detail::checks
