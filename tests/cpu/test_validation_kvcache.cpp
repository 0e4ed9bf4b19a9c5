// tests/cpu/test_validation_kvcache.cpp — the bad-input matrix of fa4::forward_with_kvcache.
//
// Every rule of include/fa4/attention.h (forward_with_kvcache) is broken once on an otherwise
// valid tiny problem (dense or paged, with an append). Each row asserts the fa4::Error code, that
// the message names the tensor/option and the rule, that forward_with_kvcache_support() answers
// the same message, and that EVERY buffer of the call (caches, outputs, inputs and a guard region
// after each) is byte-for-byte untouched. A few accepted edge cases follow.
#include "validation_fixture.h"

namespace {

using namespace fa4::test::validation;

constexpr int64_t kCap = 6;  // dense seqlen_cache; paged: kMaxPages * kPageSize
constexpr int64_t kPageSize = 2, kMaxPages = 3, kNumPages = 5;
constexpr int64_t kNew = 1;

/// A valid forward_with_kvcache problem: batch kB = 2, one query, kH = 4 heads on kHkv = 2 kv
/// heads, d = 8; cache_seqlens {2, 3} and one appended key per sequence.
struct KvProblem {
  Tensor q, kc, vc, out, lse;
  std::optional<Tensor> kn, vn, seqlens, bidx, table, sink;
  fa4::KVCacheOptions opt;

  std::vector<Tensor*> all() {
    std::vector<Tensor*> r{&q, &kc, &vc, &out, &lse};
    for (auto* o : {&kn, &vn, &seqlens, &bidx, &table, &sink})
      if (o->has_value()) r.push_back(&**o);
    return r;
  }
  void sync_options() {
    auto view = [](const std::optional<Tensor>& t) {
      return t ? std::optional<TensorView>(t->t) : std::nullopt;
    };
    opt.k_new = view(kn);
    opt.v_new = view(vn);
    opt.cache_seqlens = view(seqlens);
    opt.cache_batch_idx = view(bidx);
    opt.page_table = view(table);
    opt.sink = view(sink);
  }
  void call() {
    sync_options();
    fa4::forward_with_kvcache(q.t, kc.t, vc.t, out.t, lse.t, opt);
  }
  std::string support() {
    sync_options();
    return fa4::forward_with_kvcache_support(q.t, kc.t, vc.t, out.t, lse.t, opt);
  }
};

KvProblem dense(DType dt = DType::kBF16) {
  KvProblem p;
  p.q = make(dt, {kB, 1, kH, kD});
  p.kc = make(dt, {kB, kCap, kHkv, kD});
  p.vc = make(dt, {kB, kCap, kHkv, kDv});
  p.out = make(dt, {kB, 1, kH, kDv});
  p.lse = make(DType::kFP32, {kB, kH, 1});
  p.kn = make(dt, {kB, kNew, kHkv, kD});
  p.vn = make(dt, {kB, kNew, kHkv, kDv});
  p.seqlens = make_int32({2, 3});
  return p;
}

/// Paged: 5 pages of 2 slots, page_table {{0, 1, 2}, {3, 4, -1}} (the -1 is never read:
/// sequence 1 holds 3 + 1 = 4 keys = 2 pages).
KvProblem paged(DType dt = DType::kBF16) {
  KvProblem p = dense(dt);
  p.kc = make(dt, {kNumPages, kPageSize, kHkv, kD});
  p.vc = make(dt, {kNumPages, kPageSize, kHkv, kDv});
  p.table = make_int32({0, 1, 2, 3, 4, -1});
  p.table->t.ndim = 2;
  p.table->t.shape[0] = kB;
  p.table->t.shape[1] = kMaxPages;
  p.table->t.stride[0] = kMaxPages;
  p.table->t.stride[1] = 1;
  return p;
}

void set_table(KvProblem& p, std::vector<int32_t> v) {
  std::memcpy(p.table->t.data, v.data(), v.size() * sizeof(int32_t));
}

struct BadCase {
  const char* name;
  bool paged;
  std::function<void(KvProblem&)> mutate;
  ErrorCode code;
  std::vector<std::string> needles;
};

std::ostream& operator<<(std::ostream& os, const BadCase& c) { return os << c.name; }

constexpr ErrorCode kInv = ErrorCode::kInvalidArgument;

std::vector<BadCase> bad_cases() {
  return {
      // ---- options that do not apply, option combinations ----
      {"varlen_cu_seqlens_q", false, [](KvProblem& p) { p.opt.cu_seqlens_q = p.seqlens->t; },
       kInv, {"varlen q is not supported by forward_with_kvcache", "options.cu_seqlens_q is set"}},
      {"varlen_seqused_k", false, [](KvProblem& p) { p.opt.seqused_k = p.seqlens->t; },
       kInv, {"varlen q is not supported", "options.seqused_k is set"}},
      {"varlen_max_seqlen_k", false, [](KvProblem& p) { p.opt.max_seqlen_k = 6; },
       kInv, {"varlen q is not supported", "options.max_seqlen_k is set"}},
      {"k_new_without_v_new", false, [](KvProblem& p) { p.vn.reset(); },
       kInv, {"options.v_new is missing", "both k_new and v_new"}},
      {"v_new_without_k_new", false, [](KvProblem& p) { p.kn.reset(); },
       kInv, {"options.k_new is missing"}},
      {"append_without_cache_seqlens", false, [](KvProblem& p) { p.seqlens.reset(); },
       kInv, {"k_new/v_new need options.cache_seqlens"}},
      {"page_table_and_cache_batch_idx", true, [](KvProblem& p) { p.bidx = make_int32({0, 1}); },
       kInv, {"options.cache_batch_idx cannot be combined with options.page_table"}},
      {"num_splits_negative", false, [](KvProblem& p) { p.opt.num_splits = -1; },
       kInv, {"options.num_splits = -1 must be >= 0"}},
      // ---- ranks ----
      {"q_3d", false, [](KvProblem& p) { reshape(p.q, {kB, kH, kD}); },
       kInv, {"q.ndim = 3", "(batch, seqlen_q, num_heads, headdim)"}},
      {"paged_k_cache_3d", true, [](KvProblem& p) { reshape(p.kc, {kNumPages * kPageSize, kHkv, kD}); },
       kInv, {"k_cache.ndim = 3", "a paged k_cache is (num_pages, page_size, num_heads_kv, headdim)"}},
      {"page_table_1d", true, [](KvProblem& p) { p.table = make_int32({0, 1}); },
       kInv, {"page_table.ndim = 1", "(batch, max_pages)"}},
      {"k_new_3d", false, [](KvProblem& p) { reshape(*p.kn, {kB, kHkv, kD}); },
       kInv, {"k_new.ndim = 3"}},
      // ---- dtypes ----
      {"k_cache_dtype", false, [](KvProblem& p) { p.kc.t.dtype = DType::kFP16; },
       kInv, {"k_cache.dtype = fp16", "must equal q.dtype = bf16"}},
      {"v_cache_dtype", true, [](KvProblem& p) { p.vc.t.dtype = DType::kFP16; },
       kInv, {"v_cache.dtype = fp16", "must equal q.dtype = bf16"}},
      {"k_new_dtype", false, [](KvProblem& p) { p.kn->t.dtype = DType::kFP16; },
       kInv, {"k_new.dtype = fp16", "must equal q.dtype = bf16"}},
      {"v_new_dtype", false, [](KvProblem& p) { p.vn->t.dtype = DType::kFP16; },
       kInv, {"v_new.dtype = fp16"}},
      {"out_dtype", false, [](KvProblem& p) { p.out.t.dtype = DType::kFP16; },
       kInv, {"out.dtype = fp16"}},
      {"lse_not_fp32", false, [](KvProblem& p) { p.lse.t.dtype = DType::kBF16; },
       kInv, {"lse.dtype = bf16", "fp32"}},
      {"cache_seqlens_not_int32", false, [](KvProblem& p) { p.seqlens->t.dtype = DType::kFP32; },
       kInv, {"cache_seqlens.dtype = fp32 must be int32"}},
      {"cache_batch_idx_not_int32", false,
       [](KvProblem& p) { p.bidx = make_int32({0, 1}); p.bidx->t.dtype = DType::kFP32; },
       kInv, {"cache_batch_idx.dtype = fp32 must be int32"}},
      {"page_table_not_int32", true, [](KvProblem& p) { p.table->t.dtype = DType::kFP32; },
       kInv, {"page_table.dtype = fp32 must be int32"}},
      // ---- devices, strides ----
      {"cache_seqlens_on_cuda", false, [](KvProblem& p) { p.seqlens->t.device = Device::cuda(0); },
       kInv, {"cache_seqlens is on cuda:0 but q is on cpu"}},
      {"page_table_on_cuda", true, [](KvProblem& p) { p.table->t.device = Device::cuda(0); },
       kInv, {"page_table is on cuda:0"}},
      {"k_cache_on_cuda", false, [](KvProblem& p) { p.kc.t.device = Device::cuda(0); },
       kInv, {"k_cache is on cuda:0"}},
      {"k_new_on_cuda", false, [](KvProblem& p) { p.kn->t.device = Device::cuda(0); },
       kInv, {"k_new is on cuda:0"}},
      {"page_table_not_contiguous", true,
       [](KvProblem& p) {
         p.table = make_int32({0, 9, 1, 9, 2, 9, 3, 9, 4, 9, -1, 9});
         p.table->t.ndim = 2;
         p.table->t.shape[0] = kB;
         p.table->t.shape[1] = kMaxPages;
         p.table->t.stride[0] = 2 * kMaxPages;
         p.table->t.stride[1] = 2;
       },
       kInv, {"page_table.stride[1] = 2 must be 1"}},
      {"k_cache_stride0_with_append", false, [](KvProblem& p) { p.kc.t.stride[1] = 0; },
       kInv, {"k_cache.stride[1] = 0", "two elements to one address"}},
      {"v_cache_stride0_with_append", true, [](KvProblem& p) { p.vc.t.stride[0] = 0; },
       kInv, {"v_cache.stride[0] = 0", "two elements to one address"}},
      {"k_cache_last_dim_strided", false, [](KvProblem& p) { p.kc.t.stride[3] = 2; },
       kInv, {"k_cache.stride[3] = 2 must be 1"}},
      // Outputs apart from every other tensor (the caches are outputs when appended to).
      {"k_cache_appended_over_k_new", false, [](KvProblem& p) { p.kn->t.data = p.kc.t.data; },
       kInv, {"k_cache and k_new share memory"}},
      {"out_over_v_cache", true, [](KvProblem& p) { p.out.t.data = p.vc.t.data; },
       kInv, {"out and v_cache share memory"}},
      // ---- shapes ----
      {"heads_not_multiple", false,
       [](KvProblem& p) {
         reshape(p.kc, {kB, kCap, 3, kD});
         reshape(p.vc, {kB, kCap, 3, kDv});
         reshape(*p.kn, {kB, kNew, 3, kD});
         reshape(*p.vn, {kB, kNew, 3, kDv});
       },
       kInv, {"num_heads = 4", "multiple of num_heads_kv = 3 (k_cache.shape)"}},
      {"v_cache_heads", false, [](KvProblem& p) { reshape(p.vc, {kB, kCap, 1, kDv}); },
       kInv, {"v_cache.shape[2] (num_heads_kv) = 1 must equal k_cache.shape[2] = 2"}},
      {"v_cache_seqlen", false, [](KvProblem& p) { reshape(p.vc, {kB, kCap + 1, kHkv, kDv}); },
       kInv, {"v_cache.shape[1] (seqlen_cache) = 7 must equal k_cache.shape[1] = 6"}},
      {"paged_v_cache_page_size", true,
       [](KvProblem& p) { reshape(p.vc, {kNumPages, kPageSize + 1, kHkv, kDv}); },
       kInv, {"v_cache.shape[1] (page_size) = 3 must equal k_cache.shape[1] = 2"}},
      {"k_cache_headdim", false, [](KvProblem& p) { reshape(p.kc, {kB, kCap, kHkv, kD + 1}); },
       kInv, {"k_cache.shape[3] (headdim) = 9 must equal q.shape[3] = 8"}},
      {"out_headdim_v", false, [](KvProblem& p) { reshape(p.out, {kB, 1, kH, kDv + 2}); },
       kInv, {"out.shape[3] (headdim_v) = 10 must equal v_cache.shape[3] = 8"}},
      {"k_new_headdim", false, [](KvProblem& p) { reshape(*p.kn, {kB, kNew, kHkv, 4}); },
       kInv, {"k_new.shape[3] (headdim) = 4 must equal q.shape[3] = 8"}},
      {"k_new_batch", false, [](KvProblem& p) { reshape(*p.kn, {kB + 1, kNew, kHkv, kD}); },
       kInv, {"k_new.shape[0] (batch) = 3 must equal q.shape[0] = 2"}},
      {"v_new_seqlen_new", false, [](KvProblem& p) { reshape(*p.vn, {kB, kNew + 1, kHkv, kDv}); },
       kInv, {"v_new.shape[1] (seqlen_new) = 2 must equal k_new.shape[1] = 1"}},
      {"cache_seqlens_batch", false, [](KvProblem& p) { p.seqlens = make_int32({1, 1, 1}); },
       kInv, {"cache_seqlens.shape[0] (batch) = 3 must equal q.shape[0] = 2"}},
      {"cache_batch_idx_batch", false, [](KvProblem& p) { p.bidx = make_int32({0}); },
       kInv, {"cache_batch_idx.shape[0] (batch) = 1 must equal q.shape[0] = 2"}},
      {"page_table_batch", true,
       [](KvProblem& p) { p.table->t.shape[0] = 1; },
       kInv, {"page_table.shape[0] (batch) = 1 must equal q.shape[0] = 2"}},
      {"dense_batch_cache_without_idx", false,
       [](KvProblem& p) {
         reshape(p.kc, {kB + 1, kCap, kHkv, kD});
         reshape(p.vc, {kB + 1, kCap, kHkv, kDv});
       },
       kInv, {"k_cache.shape[0] (batch_cache) = 3 must equal q.shape[0] (batch) = 2",
              "cache_batch_idx"}},
      {"paged_page_size_0", true,
       [](KvProblem& p) {
         reshape(p.kc, {kNumPages, 0, kHkv, kD});
         reshape(p.vc, {kNumPages, 0, kHkv, kDv});
       },
       kInv, {"k_cache.shape[1] (page_size) = 0 must be >= 1"}},
      {"seqlen_new_over_capacity", false,
       [](KvProblem& p) {
         reshape(*p.kn, {kB, kCap + 1, kHkv, kD});
         reshape(*p.vn, {kB, kCap + 1, kHkv, kDv});
       },
       kInv, {"k_new.shape[1] (seqlen_new) = 7 exceeds the key capacity", "seqlen_cache"}},
      {"paged_seqlen_new_over_capacity", true,
       [](KvProblem& p) {
         reshape(*p.kn, {kB, 7, kHkv, kD});
         reshape(*p.vn, {kB, 7, kHkv, kDv});
       },
       kInv, {"k_new.shape[1] (seqlen_new) = 7 exceeds", "max_pages * page_size", "= 6"}},
      // ---- contents of host-resident indices ----
      {"cache_seqlens_negative", false, [](KvProblem& p) { p.seqlens = make_int32({-1, 0}); },
       kInv, {"cache_seqlens[0] = -1 must be in [0, 5]"}},
      {"cache_seqlens_too_large", true, [](KvProblem& p) { p.seqlens = make_int32({2, 6}); },
       kInv, {"cache_seqlens[1] = 6 must be in [0, 5]", "key_capacity 6 - seqlen_new 1"}},
      {"cache_seqlens_too_large_no_append", false,
       [](KvProblem& p) { p.kn.reset(); p.vn.reset(); p.seqlens = make_int32({7, 0}); },
       kInv, {"cache_seqlens[0] = 7 must be in [0, 6]"}},
      {"cache_batch_idx_out_of_range", false,
       [](KvProblem& p) {
         reshape(p.kc, {3, kCap, kHkv, kD});
         reshape(p.vc, {3, kCap, kHkv, kDv});
         p.bidx = make_int32({0, 3});
       },
       kInv, {"cache_batch_idx[1] = 3 must be in [0, 3)"}},
      {"cache_batch_idx_negative", false, [](KvProblem& p) { p.bidx = make_int32({-1, 0}); },
       kInv, {"cache_batch_idx[0] = -1 must be in [0, 2)"}},
      {"cache_batch_idx_duplicate_with_append", false,
       [](KvProblem& p) { p.bidx = make_int32({1, 1}); },
       kInv, {"cache_batch_idx[1] = 1 equals cache_batch_idx[0]", "distinct", "race"}},
      {"page_table_entry_too_large", true, [](KvProblem& p) { set_table(p, {0, 5, 2, 3, 4, -1}); },
       kInv, {"page_table[0][1] = 5 must be in [0, 5)", "sequence 0 holds 3 keys"}},
      {"page_table_used_entry_negative", true,
       [](KvProblem& p) { set_table(p, {0, 1, 2, -1, 4, -1}); },
       kInv, {"page_table[1][0] = -1 must be in [0, 5)"}},
      {"paged_appends_collide", true,
       [](KvProblem& p) { p.seqlens = make_int32({2, 2}); set_table(p, {0, 1, 2, 3, 1, -1}); },
       kInv, {"page_table: sequences 0 and 1 both append into page 1 slot 0", "distinct"}},
      // ---- backend ----
      {"backend_cuda_on_cpu_tensors", false, [](KvProblem& p) { p.opt.backend = Backend::kCuda; },
       kInv, {"options.backend = kCuda ('cuda') needs CUDA tensors"}},
      {"backend_not_an_enum", false,
       [](KvProblem& p) { p.opt.backend = static_cast<Backend>(7); },
       kInv, {"options.backend = 7 is not a fa4::Backend value"}},
  };
}

class KvBad : public ::testing::TestWithParam<BadCase> {};

TEST_P(KvBad, RejectsAndWritesNothing) {
  const BadCase& bc = GetParam();
  KvProblem p = bc.paged ? paged() : dense();
  bc.mutate(p);
  for (Tensor* x : {&p.out, &p.lse}) poison(*x);
  const auto before = [&] {
    std::vector<std::vector<uint8_t>> s;
    for (Tensor* x : p.all()) s.push_back(*x->mem);
    return s;
  }();
  std::string message;
  try {
    p.call();
    FAIL() << bc.name << ": no error";
  } catch (const fa4::Error& e) {
    EXPECT_EQ(e.code(), bc.code) << e.what();
    message = e.what();
    EXPECT_EQ(message.rfind("fa4::forward_with_kvcache: ", 0), 0u) << message;
    for (const std::string& n : bc.needles)
      EXPECT_NE(message.find(n), std::string::npos) << "missing \"" << n << "\" in: " << message;
  }
  EXPECT_EQ(p.support(), message) << "forward_with_kvcache_support disagrees";
  const std::vector<Tensor*> all = p.all();
  for (size_t i = 0; i < all.size(); ++i)
    EXPECT_TRUE(*all[i]->mem == before[i]) << bc.name << ": buffer " << i << " was written";
}

INSTANTIATE_TEST_SUITE_P(KvCache, KvBad, ::testing::ValuesIn(bad_cases()),
                         [](const ::testing::TestParamInfo<BadCase>& i) { return i.param.name; });

// ---- accepted edges ----

TEST(KvCacheEdges, ValidProblemsRun) {
  for (bool is_paged : {false, true}) {
    KvProblem p = is_paged ? paged() : dense();
    EXPECT_NO_THROW(p.call()) << (is_paged ? "paged" : "dense");
    EXPECT_EQ(p.support(), "");
  }
}

TEST(KvCacheEdges, DuplicateCacheBatchIdxWithoutAppend) {
  KvProblem p = dense();
  p.kn.reset();
  p.vn.reset();
  p.bidx = make_int32({1, 1});  // two sequences reading one cache row is fine
  EXPECT_NO_THROW(p.call());
}

TEST(KvCacheEdges, SharedPrefixPagesWithDistinctAppends) {
  KvProblem p = paged();
  p.seqlens = make_int32({2, 2});
  set_table(p, {0, 1, -1, 0, 2, -1});  // page 0 shared, appends into pages 1 and 2
  EXPECT_NO_THROW(p.call());
}

TEST(KvCacheEdges, InputCacheMayBroadcastWithoutAppend) {
  KvProblem p = dense();
  p.kn.reset();
  p.vn.reset();
  p.kc.t.stride[0] = 0;  // both sequences read cache row 0: an input may alias
  EXPECT_NO_THROW(p.call());
}

// num_splits >= 0 on every backend; the CPU needs no split, so any such count gives its result
// (the CUDA selector answers kUnsupported above kMaxNumSplits: src/hopper/hopper_api.cu).
TEST(KvCacheEdges, NumSplitsAnyNonNegativeOnCpu) {
  for (int32_t s : {0, 1, 7, fa4::kMaxNumSplits, 1 << 20}) {
    KvProblem p = paged();
    p.opt.num_splits = s;
    EXPECT_NO_THROW(p.call()) << s;
  }
}

#if FA4_WITH_CUDA
TEST(KvCacheEdges, CudaTensorsWithoutAGpuAreNoDevice) {
  KvProblem p = paged(DType::kFP32);
  for (Tensor* x : p.all()) x->t.device = Device::cuda(0);
  try {
    p.call();
    FAIL() << "no error";
  } catch (const fa4::Error& e) {
    expect_fp32_cuda_refusal(e);
  }
}
#else
TEST(KvCacheEdges, CudaTensorsWithoutCudaBuild) {
  KvProblem p = paged();
  for (Tensor* x : p.all()) x->t.device = Device::cuda(0);
  try {
    p.call();
    FAIL() << "no error";
  } catch (const fa4::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoDevice) << e.what();
    EXPECT_NE(std::string(e.what()).find("built without CUDA"), std::string::npos) << e.what();
  }
}
#endif

}  // namespace
