// tests/cpu/test_overlap.cpp — the memory rule on outputs (src/common/validate.cpp views_overlap):
// random pairs of strided views against the byte sets they cover, the search's step limit, and
// two outputs sliced from one buffer, overlapping and apart, through fa4::backward.
#include "common/validate_checks.h"
#include "validation_fixture.h"

#include <chrono>
#include <set>

namespace {

using namespace fa4::test::validation;
using fa4::detail::checks::views_overlap;

/// Every byte offset (from base) that an element of t covers.
std::set<int64_t> covered_bytes(const TensorView& t, const uint8_t* base) {
  std::set<int64_t> bytes;
  int64_t idx[TensorView::kMaxDims] = {};
  const int64_t elem = fa4::dtype_size(t.dtype);
  const int64_t first = static_cast<const uint8_t*>(t.data) - base;
  for (int64_t n = 0; n < t.numel(); ++n) {
    int64_t off = 0;
    for (int d = 0; d < t.ndim; ++d) off += idx[d] * t.stride[d];
    for (int64_t b = 0; b < elem; ++b) bytes.insert(first + off * elem + b);
    for (int d = t.ndim - 1; d >= 0 && ++idx[d] == t.shape[d]; --d) idx[d] = 0;
  }
  return bytes;
}

/// A random view into a 512-byte buffer: 1-4 dims of extent 1-5, strides 0-40 elements (repeats
/// and interleavings included: inputs may have any), fp32 or bf16, at a random aligned offset.
TensorView random_view(std::mt19937& g, uint8_t* base) {
  TensorView t;
  t.dtype = g() % 2 ? DType::kFP32 : DType::kBF16;
  const int64_t elem = fa4::dtype_size(t.dtype);
  t.ndim = 1 + int(g() % 4);
  int64_t span = 0;
  for (int d = 0; d < t.ndim; ++d) {
    t.shape[d] = 1 + int64_t(g() % 5);
    t.stride[d] = g() % 4 == 0 ? int64_t(g() % 3) : int64_t(g() % 41);
    span += (t.shape[d] - 1) * t.stride[d];
  }
  const int64_t room = 512 / elem - span;  // elements before the view's first one, at most
  t.data = base + elem * (room > 0 ? int64_t(g() % uint64_t(room)) : 0);
  return t;
}

TEST(Overlap, RandomStridedPairsAgainstTheirBytes) {
  std::vector<uint8_t> buf(4096);
  std::mt19937 g{std::random_device{}()};
  int64_t pairs = 0, overlapping = 0, both_strided_apart = 0;
  for (int it = 0; it < 40000; ++it) {
    const TensorView a = random_view(g, buf.data()), b = random_view(g, buf.data());
    const std::set<int64_t> sa = covered_bytes(a, buf.data()), sb = covered_bytes(b, buf.data());
    bool shared = false;
    for (int64_t x : sa) shared = shared || sb.count(x) != 0;
    ++pairs;
    overlapping += shared;
    // The case the search exists for: ranges that meet, neither view dense, no shared byte.
    const auto [alo, ahi] = std::minmax_element(sa.begin(), sa.end());
    const auto [blo, bhi] = std::minmax_element(sb.begin(), sb.end());
    both_strided_apart += !shared && *alo <= *bhi && *blo <= *ahi && int64_t(sa.size()) <= *ahi - *alo &&
                          int64_t(sb.size()) <= *bhi - *blo;
    ASSERT_EQ(views_overlap(a, b), shared) << "a " << a.shape_string() << " strides " << a.stride[0] << ","
                                           << a.stride[1] << "," << a.stride[2] << "," << a.stride[3] << " b "
                                           << b.shape_string() << " strides " << b.stride[0] << ","
                                           << b.stride[1] << "," << b.stride[2] << "," << b.stride[3];
    ASSERT_EQ(views_overlap(b, a), shared);
  }
  // The draw covers both answers, and interleaved apart views (which a range test calls overlapping).
  EXPECT_GT(overlapping, pairs / 10);
  EXPECT_GT(pairs - overlapping, pairs / 10);
  EXPECT_GT(both_strided_apart, pairs / 100);
}

// Slices of one packed (S, 3, H, D) buffer of a serving shape: apart where the slices are, shared
// where one is shifted by half a head dim; each answered in microseconds (the search takes a few
// steps per dim, not one per row).
TEST(Overlap, PackedSlicesAtServingSizes) {
  constexpr int64_t S = 8192, H = 32, D = 128;
  static uint16_t origin;  // only addresses are compared: nothing is read
  auto slice = [&](int64_t first) {
    return TensorView::strided(&origin + first, DType::kBF16, {S, H, D}, {3 * H * D, D, 1});
  };
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(views_overlap(slice(0), slice(H * D)));
  EXPECT_FALSE(views_overlap(slice(2 * H * D), slice(H * D)));
  EXPECT_TRUE(views_overlap(slice(0), slice(H * D - D / 2)));
  EXPECT_TRUE(views_overlap(slice(H * D), slice(3 * H * D + D / 2)));  // k row 0 against row 1
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(us, 1000.0);  // generous: a row-by-row walk takes tens of milliseconds
}

// Views whose strides do not nest into each other's: the search finds a shared element where one
// is near, and stops at its step limit where none is (all odd against all even elements), in
// microseconds; undecided and with neither view dense, the pair counts as apart (the rule refuses
// what it can prove).
TEST(Overlap, SearchStepLimit) {
  static float origin;  // only addresses are compared: nothing is read
  const TensorView every_third = TensorView::strided(&origin + 1, DType::kFP32, {60000, 1}, {3, 1});
  const TensorView pairs_of_five = TensorView::strided(&origin + 2, DType::kFP32, {40000, 2}, {5, 1});
  EXPECT_TRUE(views_overlap(pairs_of_five, every_third));  // element 7 is in both
  const auto t0 = std::chrono::steady_clock::now();
  const TensorView odd = TensorView::strided(&origin + 1, DType::kFP32, {50000}, {4});
  const TensorView even = TensorView::strided(&origin + 100000, DType::kFP32, {50000}, {6});
  EXPECT_FALSE(views_overlap(odd, even));
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(us, 5000.0);
}

// dq and dk as slices of one buffer: apart (rows of a packed dqk) they pass and give the separate
// buffers' bits; dk shifted by half a head dim onto dq's last head is refused before anything is
// written.
TEST(Overlap, GradientSlicesOfOneBuffer) {
  Problem p = batched(DType::kFP32, kB, kSq, kSq, kD, kD);
  p.opt.backend = Backend::kCpu;
  p.forward();
  for (Tensor* x : {&p.dq, &p.dk, &p.dv}) poison(*x);
  p.backward();
  Tensor both = make(DType::kFP32, {kB, kSq, (kH + kHkv) * kD + kD});  // room for the shifted dk
  auto slice = [&](int64_t first, int64_t heads) {
    Tensor x = both;
    x.t = TensorView::strided(static_cast<float*>(both.t.data) + first, DType::kFP32, {kB, kSq, heads, kD},
                              {both.t.stride[0], both.t.stride[1], kD, 1});
    return x;
  };
  auto row = [](const Tensor& x, int64_t b, int64_t i) {
    return static_cast<const float*>(x.t.data) + b * x.t.stride[0] + i * x.t.stride[1];
  };
  Problem s = p;
  s.dq = slice(0, kH);
  s.dk = slice(kH * kD, kHkv);
  poison(both);
  ASSERT_NO_THROW(s.backward());
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t i = 0; i < kSq; ++i) {
      EXPECT_EQ(std::memcmp(row(s.dq, b, i), row(p.dq, b, i), kH * kD * 4), 0) << b << " " << i;
      EXPECT_EQ(std::memcmp(row(s.dk, b, i), row(p.dk, b, i), kHkv * kD * 4), 0) << b << " " << i;
    }
  s.dk = slice(kH * kD - kD / 2, kHkv);
  poison(both);
  const std::vector<std::vector<uint8_t>> before = snapshot(s);
  try {
    s.backward();
    ADD_FAILURE() << "dk half a head dim into dq accepted";
  } catch (const fa4::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("dq and dk share memory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(snapshot(s), before);
}

}  // namespace
