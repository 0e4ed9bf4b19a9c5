// tests/gpu/test_hopper_bwd_layouts.cu — the Hopper forward + backward on the layouts training
// code hands them, against the float64 oracle (the rule of test_hopper_bwd.cu): q/k/v as slices of
// one packed (b, s, h + 2 h_kv, d) buffer; dout with padded rows; out with rows of an odd element
// count (neither the forward's TMA epilogue nor the backward's 16-byte loads of out apply); lse
// laid out (b, s, h); dq/dk/dv as slices of one packed buffer starting 1, 2 or 8 elements in (the
// element, 4-byte and 16-byte stores of dq, dk and dv); one sequence and one head with odd strides
// on those size-1 dims. The memory around the outputs (out's row padding, the packed gradients'
// first elements and tail) must stay poisoned.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../tools/cli_case.h"
#include "gpu_test_util.cuh"
#include "hopper/bwd/tuning_bwd.h"

namespace {

using fa4::DType;
using fa4::TensorView;
using fa4::cli::CaseSpec;
using fa4::cli::Problem;
using fa4::test::HostTensor;

/// Where a tensor of a Problem (contiguous on the host) lives in a larger buffer: its first element
/// and its element strides, one per dim of the host tensor.
struct Place {
  int64_t first = 0;
  std::vector<int64_t> stride;
};

/// A buffer's image on the host (poisoned with 0xFF: NaN in bf16, fp16 and fp32) and its device copy.
struct Buffer {
  std::vector<uint8_t> host;
  fa4::test::DevBuf<uint8_t> device;
  explicit Buffer(size_t bytes) : host(bytes, 0xFF), device(bytes) {}
  bool upload() { return cudaMemcpy(device.ptr, host.data(), host.size(), cudaMemcpyHostToDevice) == cudaSuccess; }
  bool download() { return cudaMemcpy(host.data(), device.ptr, host.size(), cudaMemcpyDeviceToHost) == cudaSuccess; }
  TensorView view(const HostTensor& t, const Place& at) const {
    TensorView v;
    v.data = device.ptr + at.first * fa4::dtype_size(t.dtype());
    v.dtype = t.dtype();
    v.ndim = int32_t(t.shape().size());
    for (int d = 0; d < v.ndim; ++d) {
      v.shape[d] = t.shape()[d];
      v.stride[d] = at.stride[d];
    }
    v.device = fa4::Device::cuda(0, nullptr);
    return v;
  }
};

/// Calls f(contiguous element index, element index in the buffer) for every element of t at `at`.
template <class F>
void each_element(const HostTensor& t, const Place& at, F&& f) {
  const std::vector<int64_t>& shape = t.shape();
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t n = 0; n < t.numel(); ++n) {
    int64_t off = at.first;
    for (size_t d = 0; d < shape.size(); ++d) off += idx[d] * at.stride[d];
    f(n, off);
    for (int d = int(shape.size()) - 1; d >= 0 && ++idx[d] == shape[d]; --d) idx[d] = 0;
  }
}

void scatter(const HostTensor& t, const Place& at, Buffer& b, std::vector<bool>* owned = nullptr) {
  const int64_t e = fa4::dtype_size(t.dtype());
  each_element(t, at, [&](int64_t n, int64_t off) {
    std::memcpy(b.host.data() + off * e, static_cast<const uint8_t*>(t.data()) + n * e, e);
    if (owned) (*owned)[off] = true;
  });
}

void gather(HostTensor& t, const Place& at, const Buffer& b) {
  const int64_t e = fa4::dtype_size(t.dtype());
  each_element(t, at, [&](int64_t n, int64_t off) {
    std::memcpy(static_cast<uint8_t*>(t.data()) + n * e, b.host.data() + off * e, e);
  });
}

/// The elements of a buffer of `e`-byte elements that no tensor owns, each still all 0xFF bytes.
int64_t unowned_written(const Buffer& b, const std::vector<bool>& owned, int64_t e) {
  int64_t written = 0;
  for (size_t i = 0; i < owned.size(); ++i)
    if (!owned[i])
      for (int64_t j = 0; j < e; ++j) written += b.host[i * e + j] != 0xFF;
  return written;
}

/// `at` with stride 3 on every dim of extent 1 of t (a size-1 dim's stride is never used: case
/// C20, where an odd one was once taken for a misaligned layout).
Place odd_unit_strides(const HostTensor& t, Place at) {
  for (size_t d = 0; d < t.shape().size(); ++d)
    if (t.shape()[d] == 1) at.stride[d] = 3;
  return at;
}

/// One case: spec (batched, backward) on the packed and padded layouts above, dq/dk/dv `shift`
/// elements into their buffer; `odd_units`: every size-1 dim with stride 3.
void check_packed_layouts(CaseSpec spec, int64_t shift, bool odd_units = false) {
  if (fa4::test::leave_out(spec.headdim, spec.dim_v(), fa4::test::kFwd | fa4::test::kBwd)) return;
  spec.device = "cuda";
  spec.backward = true;
  spec.seed = fa4::test::next_seed();
  Problem p = Problem::make(spec);
  Problem untouched = p;
  const int64_t B = spec.batch, S = spec.seqlen_q, H = spec.num_heads, HK = spec.heads_kv();
  const int64_t d = spec.headdim, dv = spec.dim_v(), e = fa4::dtype_size(p.q.dtype());
  ASSERT_EQ(spec.seqlen_q, spec.seqlen_k) << "one packed buffer holds q, k and v rows";
  const int64_t row = H * d + HK * d + HK * dv;  // one token's q, k and v (and dq, dk, dv)
  const Place q_at{0, {S * row, row, d, 1}}, k_at{H * d, {S * row, row, d, 1}},
      v_at{H * d + HK * d, {S * row, row, dv, 1}};
  const int64_t dout_row = H * dv + 8, out_row = H * dv + 3;  // 16-byte rows; rows no TMA or uint4 can take
  const Place dout_at{0, {S * dout_row, dout_row, dv, 1}}, out_at{0, {S * out_row, out_row, dv, 1}};
  const Place lse_at{0, {S * H, 1, H}};  // (b, h, s) indices over a (b, s, h) buffer
  auto shifted = [&](const Place& at) { return Place{at.first + shift, at.stride}; };
  const Place dq_at = shifted(q_at), dk_at = shifted(k_at), dv_at = shifted(v_at);

  Buffer qkv(size_t(B * S * row * e)), dout(size_t(B * S * dout_row * e));
  Buffer out(size_t(B * S * out_row * e)), lse(size_t(B * S * H * 4)), grads(size_t((B * S * row + shift + 8) * e));
  ASSERT_TRUE(qkv.device.ptr && dout.device.ptr && out.device.ptr && lse.device.ptr && grads.device.ptr);
  scatter(p.q, q_at, qkv), scatter(p.k, k_at, qkv), scatter(p.v, v_at, qkv), scatter(p.dout, dout_at, dout);
  std::vector<bool> out_owned(out.host.size() / e), grads_owned(grads.host.size() / e);
  each_element(p.out, out_at, [&](int64_t, int64_t off) { out_owned[off] = true; });
  for (auto [t, at] : {std::pair{&p.dq, &dq_at}, {&p.dk, &dk_at}, {&p.dv, &dv_at}})
    each_element(*t, *at, [&](int64_t, int64_t off) { grads_owned[off] = true; });
  for (Buffer* b : {&qkv, &dout, &out, &lse, &grads}) ASSERT_TRUE(b->upload());

  fa4::cli::Placement at;
  at.device = fa4::Device::cuda(0, nullptr);
  const fa4::BackwardOptions opts = fa4::cli::make_options(p, at, fa4::Backend::kCuda);
  auto view = [&](const Buffer& b, const HostTensor& t, const Place& place) {
    return b.view(t, odd_units ? odd_unit_strides(t, place) : place);
  };
  const TensorView qv = view(qkv, p.q, q_at), kv = view(qkv, p.k, k_at), vv = view(qkv, p.v, v_at);
  const TensorView outv = view(out, p.out, out_at), lsev = view(lse, p.lse, lse_at);
  fa4::forward(qv, kv, vv, outv, lsev, opts);
  fa4::backward(view(dout, p.dout, dout_at), qv, kv, vv, outv, lsev, view(grads, p.dq, dq_at),
                view(grads, p.dk, dk_at), view(grads, p.dv, dv_at), opts);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (Buffer* b : {&out, &lse, &grads}) ASSERT_TRUE(b->download());
  EXPECT_EQ(unowned_written(out, out_owned, e), 0) << "bytes of out's row padding written: " << spec.describe();
  EXPECT_EQ(unowned_written(grads, grads_owned, e), 0)
      << "bytes before, between or after the packed gradients written (shift " << shift << "): " << spec.describe();
  gather(p.out, out_at, out), gather(p.lse, lse_at, lse);
  gather(p.dq, dq_at, grads), gather(p.dk, dk_at, grads), gather(p.dv, dv_at, grads);
  for (const fa4::test::Accuracy& a : fa4::cli::check_outputs(p, untouched))
    EXPECT_TRUE(a.ok()) << spec.describe() << " (packed layouts, gradients " << shift << " elements in)\n  " << a.str();
}

TEST(HopperBwdLayouts, PackedPaddedAndMisaligned) {
  REQUIRE_HOPPER();
  for (const fa4::detail::HopperBwdConfig& row : fa4::detail::kHopperBwdConfigs)  // every bucket
    for (int64_t shift : {1, 2, 8}) {  // dq, dk, dv stores: elements, 4-byte pairs, 16 bytes
      CaseSpec s;
      s.batch = 2;
      s.seqlen_q = s.seqlen_k = 200;  // tails of every tile
      s.num_heads = 4;
      s.num_heads_kv = 2;
      s.headdim = row.headdim;
      s.headdim_v = row.headdim_v;
      s.dtype = shift == 2 ? "fp16" : "bf16";
      s.causal = shift != 8;
      check_packed_layouts(s, shift);
    }
}

// One sequence and one head (q, k and v), every size-1 dim with stride 3: the TMA rules and the
// stores must ignore those strides (case C20). Every bucket, causal and not.
TEST(HopperBwdLayouts, SizeOneDimsWithOddStrides) {
  REQUIRE_HOPPER();
  for (const fa4::detail::HopperBwdConfig& row : fa4::detail::kHopperBwdConfigs)
    for (bool causal : {false, true}) {
      CaseSpec s;
      s.batch = 1;
      s.seqlen_q = s.seqlen_k = 200;
      s.num_heads = s.num_heads_kv = 1;
      s.headdim = row.headdim;
      s.headdim_v = row.headdim_v;
      s.causal = causal;
      check_packed_layouts(s, 8, true);
    }
}

}  // namespace
