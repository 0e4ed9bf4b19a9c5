// tests/gpu/test_hopper_fwd_softmax.cu — the Hopper forward's online softmax where its rounding
// shows: logits so large that one fp32 ulp of the running max in log2 units is a visible weight.
//
// The kernels take each exponential against round(m * scale_log2) (one fma per score). A factor
// that moves O and l to a new max must then be 2^(difference of the two rounded shifts): the form
// 2^((m_old - m_new) * scale_log2) weighs every earlier key block off by the two shifts' roundings,
// up to 2^(one ulp of m * scale_log2), 19% per move at logits of 2^21. Scores here are exact in
// fp16 inputs and fp32 accumulation: q = (2^11, 1, 0, ...), k_j = (2^10, n_j / 4, 0, ...), so
// s_j = 2^21 + n_j / 4 (one fp32 ulp at 2^21 is 1/4; s * log2(e) has the same ulp), and the
// maximum rises by one ulp in 8 steps of K / 8 keys in the direction the key loop walks (or the
// other), so tau = 0 moves the max at the steps: 8 moves, the keys' weights within a factor e^2.5
// of each other.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fa4/attention.h"

#include "gpu_test_util.cuh"
#include "test_util.h"

namespace {

using fa4::DType;
using fa4::TensorView;
using fa4::test::DevBuf;

struct Route {
  const char* stream_k;  // "0": whole tiles; "1": the tile's keys split over CTAs and merged
  int seqlen_k;
};

TEST(HopperFwd, RisingMaxAtLargeLogitsKeepsTheBlocksWeights) {
  REQUIRE_HOPPER();
  const DType t = DType::kFP16;
  const int S = 64;  // query rows, all the same query: one row tile
  const fa4::test::ScopedOverride forward_kernel("small_q", "fwd");
  for (int D : {64, 128, 256}) {
    if (fa4::test::leave_out(D, D, fa4::test::kFwd)) continue;
    for (const Route route : {Route{"0", 1024}, Route{"1", 16384}})
      for (bool rise_in_loop_order : {true, false}) {
        const int K = route.seqlen_k, step_keys = K / 8;
        std::vector<uint16_t> hq(size_t(S) * D, 0), hk(size_t(K) * D, 0), hv(size_t(K) * D);
        std::vector<double> s(K), v(size_t(K) * D);
        for (int i = 0; i < S; ++i) {
          hq[size_t(i) * D] = fa4::test::to16(t, 2048.f);
          hq[size_t(i) * D + 1] = fa4::test::to16(t, 1.f);
        }
        double smax = -INFINITY;
        for (int j = 0; j < K; ++j) {
          // The kernels walk key blocks from the last to the first.
          const int step = rise_in_loop_order ? 7 - j / step_keys : j / step_keys;
          const int n = step + j % 4;
          hk[size_t(j) * D] = fa4::test::to16(t, 1024.f);
          hk[size_t(j) * D + 1] = fa4::test::to16(t, float(n) / 4.f);
          s[j] = 2097152.0 + n / 4.0;
          smax = std::max(smax, s[j]);
          for (int e = 0; e < D; ++e) {
            const float x = float((j / step_keys) % 4) + float(e % 8) / 8.f;  // exact in fp16
            hv[size_t(j) * D + e] = fa4::test::to16(t, x);
            v[size_t(j) * D + e] = x;
          }
        }
        double wsum = 0.0;
        std::vector<double> ref(D, 0.0);
        for (int j = 0; j < K; ++j) {
          const double w = std::exp(s[j] - smax);
          wsum += w;
          for (int e = 0; e < D; ++e) ref[e] += w * v[size_t(j) * D + e];
        }
        const double ref_lse = smax + std::log(wsum);
        DevBuf<uint16_t> q(hq.size()), k(hk.size()), vb(hv.size()), o(hq.size());
        DevBuf<float> l(S);
        q.upload(hq);
        k.upload(hk);
        vb.upload(hv);
        const fa4::test::ScopedOverride split("stream_k", route.stream_k);
        for (float tau : {0.f, 8.f})
          for (float fraction : {0.f, 0.5f}) {
            if (D == 256 && fraction > 0) continue;  // its 80-key tile has no emulation share (kUnsupported)
            SCOPED_TRACE("d" + std::to_string(D) + " sk " + std::to_string(K) + " stream_k " + route.stream_k +
                         (rise_in_loop_order ? " rising in loop order" : " falling in loop order") + " tau " +
                         std::to_string(tau) + " exp2 share " + std::to_string(fraction));
            o.upload(std::vector<uint16_t>(hq.size(), fa4::test::kPoison16));
            l.upload(std::vector<float>(S, NAN));
            const auto dev = fa4::Device::cuda(0);
            fa4::AttentionOptions opt;
            opt.backend = fa4::Backend::kCuda;
            opt.softmax_scale = 1.f;
            opt.rescale_threshold = tau;
            opt.exp2_emulation_fraction = fraction;
            fa4::forward(TensorView::contiguous(q.ptr, t, {1, S, 1, D}, dev),
                         TensorView::contiguous(k.ptr, t, {1, K, 1, D}, dev),
                         TensorView::contiguous(vb.ptr, t, {1, K, 1, D}, dev),
                         TensorView::contiguous(o.ptr, t, {1, S, 1, D}, dev),
                         TensorView::contiguous(l.ptr, DType::kFP32, {1, 1, S}, dev), opt);
            CUDA_OK(cudaDeviceSynchronize());
            const auto ho = o.download();
            const auto hl = l.download();
            // lse: one fp32 ulp at 2^21 is 1/4. out: fp16 rounding of out (2^-9 at 2..4) and of
            // P (2^-11 relative, averaged over the keys); the software exp2's 8.6e-5 relative
            // error where half the columns use it. Weights off by the rounding of m * scale_log2
            // at each move cost 0.02-0.05 (a float32 model of the key loop with that factor).
            const double atol = fraction > 0 ? 4e-3 : 3e-3;
            for (int i = 0; i < S; ++i) {
              ASSERT_NEAR(hl[i], ref_lse, 2 * 0.25) << "row " << i;
              for (int e = 0; e < D; ++e)
                ASSERT_NEAR(fa4::test::from16(t, ho[size_t(i) * D + e]), ref[e] / wsum, atol)
                    << "row " << i << " channel " << e;
            }
          }
      }
  }
}

}  // namespace
