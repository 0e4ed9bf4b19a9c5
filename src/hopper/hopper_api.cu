// src/hopper/hopper_api.cu — the Hopper selector (forward_support) and dispatcher (forward).
// Deliberately free of CuTe: it only sees the run_fwd<dtype, d, dv> declarations, so it compiles
// in seconds; the kernels live in src/hopper/fwd/instantiations/*.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/stream_k.h"
#include "hopper/bwd/launch_bwd.h"
#include "hopper/bwd/tuning_bwd.h"
#include "hopper/decode/launch_decode.h"
#include "hopper/decode/tuning_decode.h"
#include "hopper/fwd/tuning_fwd.h"
#include "fa4/error.h"
#include "common/overrides.h"
#include "hopper/shared/device_state.h"
#include "hopper/buckets.h"
#include "hopper/hopper_api.h"
#include "hopper/fwd/launch_fwd.h"

namespace fa4::hopper {
namespace {
std::atomic<uint64_t> g_fwd_tma_epilogue_calls{0};
std::atomic<uint64_t> g_bwd_tma_epilogue_calls{0};

/// Every block of query rows or keys the kernels walk is within the row limit's margin
/// (launch_context.h kMaxRows).
constexpr bool blocks_within_row_margin() {
  for (const auto& c : detail::kHopperFwdConfigs)
    if (c.tile_m > kMaxBlockRows || c.tile_n > kMaxBlockRows) return false;
  for (const auto& c : detail::kHopperBwdConfigs)
    if (c.tile_m > kMaxBlockRows || c.tile_n > kMaxBlockRows) return false;
  for (const auto& c : detail::kHopperDecodeConfigs)
    if (c.block_n > kMaxBlockRows) return false;
  return detail::kDecodeEightWarpKeys <= kMaxBlockRows && detail::kDecodeWideRows <= kMaxBlockRows;
}
static_assert(blocks_within_row_margin(), "a tile is longer than launch_context.h kMaxBlockRows");

constexpr int64_t kTmaAlignBytes = 16;   // TMA: global base and every stride, in bytes
constexpr int64_t kTmaMaxStrideBytes = int64_t(1) << 40;
constexpr int kHopperMajor = 9, kHopperMinor = 0;

struct DeviceFacts {
  bool queried = false;
  bool present = false;  // exists and answered the queries (error may still say: not sm_90)
  std::string error;     // non-empty: not usable
  int num_sms = 0;
  int64_t l2_bytes = 0;
};

/// Facts of one device, queried once. Returned BY VALUE: the cache may grow while another
/// thread reads its copy (first calls on several GPUs from several threads).
DeviceFacts device_facts(int index) {
  static std::mutex mu;
  static std::vector<DeviceFacts> cache;
  static const int count = [] {  // fixed for the life of the process
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      n = 0;
    }
    return n;
  }();
  std::lock_guard<std::mutex> lock(mu);
  if (index < 0 || index >= count) {
    DeviceFacts none;
    none.queried = true;
    none.error = "cuda:" + std::to_string(index) + " does not exist (" + std::to_string(count) +
                 " CUDA device(s) visible)";
    return none;
  }
  if (size_t(index) >= cache.size()) cache.resize(size_t(index) + 1);
  DeviceFacts& f = cache[size_t(index)];
  if (f.queried) return f;
  f.queried = true;
  int major = 0, minor = 0, l2 = 0;
  cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&f.num_sms, cudaDevAttrMultiProcessorCount, index);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, index);
  if (e != cudaSuccess) {
    f.error = std::string("cannot query cuda:") + std::to_string(index) + " (" + cudaGetErrorString(e) + ")";
    cudaGetLastError();
    return f;
  }
  f.l2_bytes = l2;
  f.present = true;
  if (major != kHopperMajor || minor != kHopperMinor)
    f.error = "the Hopper kernels need a compute capability 9.0 GPU (H100/H200); cuda:" +
              std::to_string(index) + " is " + std::to_string(major) + "." + std::to_string(minor);
  return f;
}

// CMake defines FA4_HOPPER_HAS_<d>_<dv> for every bucket: 1 where this build compiled it
// (FA4_HOPPER_HEADDIMS), else 0.
#define FA4_BUCKET_COMPILED(D, DV) \
  if (d == D && dv == DV) return FA4_HOPPER_HAS_##D##_##DV == 1;

/// Which buckets this build compiled.
bool bucket_compiled(int d, int dv) {
  FA4_HOPPER_BUCKETS(FA4_BUCKET_COMPILED)
  return false;
}
#undef FA4_BUCKET_COMPILED

/// An override's value (kernel_overrides: -1 the selector decides, 0 / 1 forced off / on) applied
/// to the selector's choice.
bool pick_override(int8_t forced, bool automatic) { return forced < 0 ? automatic : forced == 1; }

/// TMA rules for one of q/k/v: 16-byte aligned base, positive 16-byte-multiple strides on every
/// dimension of extent > 1 (size-1 dims are ignored, case C20).
std::string check_tma_tensor(const char* name, const void* ptr, const detail::RowStrides& s,
                             int64_t rows, int64_t heads, int64_t batch, bool varlen, int64_t elem,
                             const char* use = "the Hopper TMA loads") {
  if (reinterpret_cast<uintptr_t>(ptr) % kTmaAlignBytes != 0)
    return std::string(name) + ".data must be 16-byte aligned for " + use;
  struct Dim { const char* what; int64_t extent; int64_t stride; };
  const Dim dims[] = {{"row (sequence)", rows, s.row}, {"head", heads, s.head},
                      {"batch", varlen ? 1 : batch, s.batch}};
  for (const Dim& d : dims) {
    if (d.extent <= 1) continue;
    const int64_t bytes = d.stride * elem;
    if (d.stride <= 0 || bytes % kTmaAlignBytes != 0 || bytes >= kTmaMaxStrideBytes)
      return std::string(name) + " " + d.what + " stride = " + std::to_string(d.stride) +
             " elements must be positive and a multiple of 16 bytes (" +
             std::to_string(kTmaAlignBytes / elem) + " elements) for " + use;
  }
  return "";
}

std::string dtype_tag(DType t) { return t == DType::kBF16 ? "bf16" : "fp16"; }

/// The first checks of every selector: a 16-bit dtype, a usable sm_90 device.
std::string dtype_device_support(const detail::FwdParams& p) {
  if (p.dtype != DType::kBF16 && p.dtype != DType::kFP16)
    return std::string("the Hopper kernels support bf16 and fp16 only; q.dtype is ") +
           dtype_name(p.dtype) + " (use CPU tensors for fp32)";
  return device_facts(p.device.index).error;
}

/// Checks shared by both directions: dtype, device, head dims (multiples of 8), row counts and the
/// q/k/v TMA rules.
std::string common_support(const detail::FwdParams& p) {
  if (std::string why = dtype_device_support(p); !why.empty()) return why;
  if (p.headdim % 8 != 0 || p.headdim_v % 8 != 0)
    return "the Hopper kernels need headdim and headdim_v to be multiples of 8 (16-byte TMA rows); got " +
           std::to_string(p.headdim) + " and " + std::to_string(p.headdim_v);
  const int64_t elem = dtype_size(p.dtype);
  const int64_t rows_q = p.is_varlen ? p.total_q : p.seqlen_q;
  const int64_t rows_k = p.is_varlen ? p.total_k : p.seqlen_k;
  if (rows_q > kMaxRows || rows_k > kMaxRows)
    return "the Hopper kernels handle at most 2^31 - 512 rows of q and of k/v (seqlen, or the packed total "
           "for varlen); got " + std::to_string(rows_q) + " and " + std::to_string(rows_k);
  std::string why = check_tma_tensor("q", p.q, p.q_stride, rows_q, p.num_heads, p.batch, p.is_varlen, elem);
  if (why.empty()) why = check_tma_tensor("k", p.k, p.k_stride, rows_k, p.num_heads_kv, p.batch, p.is_varlen, elem);
  if (why.empty()) why = check_tma_tensor("v", p.v, p.v_stride, rows_k, p.num_heads_kv, p.batch, p.is_varlen, elem);
  return why;
}

std::string not_compiled(const char* direction, int d, int dv) {
  return std::string("the Hopper ") + direction + " kernel for headdim bucket " + std::to_string(d) + "x" +
         std::to_string(dv) + " was not compiled in this build (CMake FA4_HOPPER_HEADDIMS)";
}

std::string bucket_name(const detail::FwdParams& p, int d, int dv, const char* variant = "") {
  std::string name = dtype_tag(p.dtype) + "_hdim" + std::to_string(d) + (dv != d ? "x" + std::to_string(dv) : "") + variant;
  if (d != p.headdim || dv != p.headdim_v)
    name += " (padded from " + std::to_string(p.headdim) + "x" + std::to_string(p.headdim_v) + ")";
  return name;
}

/// ScopedDevice (device_state.h) for a call: fa4::Error(kCudaError) where `device` cannot be made
/// current.
class CallDevice {
 public:
  CallDevice(int device, const char* fn) : scope_(device) {
    if (scope_.status() != cudaSuccess)
      throw Error(ErrorCode::kCudaError, std::string(fn) + " (hopper): cudaSetDevice failed");
  }

 private:
  ScopedDevice scope_;
};

/// Whether the decode kernel (decode/) runs the KV-cache call p: "" and its name, else the reason.
std::string decode_support(const detail::KVCacheParams& p, std::string* kernel_name) {
  if (std::string why = dtype_device_support(p); !why.empty()) return why;
  if (p.headdim % 8 != 0 || p.headdim_v % 8 != 0)
    return "the Hopper decode kernel needs headdim and headdim_v to be multiples of 8 (16-byte rows); got " +
           std::to_string(p.headdim) + " and " + std::to_string(p.headdim_v);
  const detail::HopperDecodeConfig* c = detail::hopper_decode_bucket(p.headdim, p.headdim_v);
  if (!c)
    return "no Hopper decode kernel for headdim " + std::to_string(p.headdim) + ", headdim_v " +
           std::to_string(p.headdim_v) + " (supported: both <= 256, multiples of 8)";
  if (!bucket_compiled(c->headdim, c->headdim_v)) return not_compiled("decode", c->headdim, c->headdim_v);
  if (p.num_splits > detail::kDecodeMaxSplits)
    return "num_splits = " + std::to_string(p.num_splits) + " exceeds the decode kernel's maximum of " +
           std::to_string(detail::kDecodeMaxSplits);
  if (p.exp2_fraction_given && p.exp2_emulation.emulated > 0)
    return "exp2_emulation_fraction > 0 is not supported by the Hopper decode kernel (it is bandwidth-"
           "bound and computes every exponential on the MUFU unit); pass 0 or leave it unset";
  // Counted in narrow tiles: a wide tile's launch has fewer, and what the selector accepts does not
  // depend on the tile choice or its override.
  const int64_t row_tiles = decode_row_tiles(p, detail::kDecodeNarrowRows);
  if (p.batch > 65535 || p.num_heads_kv > 65535 || int64_t(p.num_heads_kv) * row_tiles > 65535)
    return "the Hopper decode kernel handles at most 65535 sequences and 65535 (kv head, 16-row query "
           "tile) pairs per sequence (num_heads_kv * ceil(seqlen_q * num_heads / num_heads_kv / 16))";
  if (int64_t(p.key_capacity) > kMaxRows)
    return "the Hopper decode kernel handles a key capacity (seqlen_cache, or max_pages * page_size) of "
           "at most 2^31 - 512 keys; got " + std::to_string(p.key_capacity);
  // 16-byte copies (cp.async, the append) and 8-byte stores of out: 16-byte aligned bases and
  // strides, the same rule as the TMA views of the forward.
  const int64_t elem = dtype_size(p.dtype);
  const int64_t cache_rows = p.paged ? p.page_size : p.key_capacity;
  const int64_t cache_batch = p.paged ? p.num_pages : p.batch_cache;
  constexpr const char* kUse = "the decode kernel's 16-byte copies";
  std::string why = check_tma_tensor("q", p.q, p.q_stride, p.seqlen_q, p.num_heads, p.batch, false, elem, kUse);
  if (why.empty()) why = check_tma_tensor("k_cache", p.k, p.k_stride, cache_rows, p.num_heads_kv, cache_batch, false, elem, kUse);
  if (why.empty()) why = check_tma_tensor("v_cache", p.v, p.v_stride, cache_rows, p.num_heads_kv, cache_batch, false, elem, kUse);
  if (why.empty()) why = check_tma_tensor("out", p.out, p.out_stride, p.seqlen_q, p.num_heads, p.batch, false, elem, kUse);
  if (why.empty() && p.k_new)
    why = check_tma_tensor("k_new", p.k_new, p.k_new_stride, p.seqlen_new, p.num_heads_kv, p.batch, false, elem, kUse);
  if (why.empty() && p.v_new)
    why = check_tma_tensor("v_new", p.v_new, p.v_new_stride, p.seqlen_new, p.num_heads_kv, p.batch, false, elem, kUse);
  if (!why.empty()) return why;
  if (kernel_name)
    *kernel_name = "hopper::decode_" + bucket_name(p, c->headdim, c->headdim_v) + (p.paged ? " (paged)" : "");
  return "";
}

/// Query rows per KV head (seqlen_q x group) up to which a batched forward may run on the decode
/// kernel (decode/: pack-GQA row tiles, keys split over CTAs); measured no further.
constexpr int64_t kSmallQMaxRows = 128;

/// Query rows per KV head up to which decode_one_split_wins may keep a call on the decode kernel
/// (measured up to 256: GQA 32/8, 64 queries; MHA, 129 queries).
constexpr int64_t kSmallQOneSplitMaxRows = 256;

/// Whether the decode kernel runs p as one 8-warp split per narrow row tile (decode/launch_decode.h
/// decode_full_tiles_one_split: full tiles that fit the SMs one each and fill more than half of them
/// at d64, a quarter at d128, over 2 to 16 64-key blocks, d64 or d128 unpadded), with up to
/// kSmallQOneSplitMaxRows rows per KV head. There it measured faster than the forward kernel also
/// above kSmallQMaxRows rows (prefill chunks of few KV heads, with tiles filling more than half the
/// SMs; bench/results/history.md), so both routes below keep such calls on the decode kernel.
/// Shapes first (no lock on the usual forward call), the device's SM count last; `o`: the caller's
/// overrides (decode_tile, decode_warps), read once per call.
bool decode_one_split_wins(const detail::KVCacheParams& p, const detail::KernelOverrides& o) {
  if (p.seqlen_q <= 1 || decode_rows(p) > kSmallQOneSplitMaxRows) return false;
  const detail::HopperDecodeConfig* dc = detail::hopper_decode_bucket(p.headdim, p.headdim_v);
  if (!dc || dc->eight_warp_stages == 0 || decode_key_blocks(p, *dc) > detail::kDecodeEightWarpMaxSplitBlocks ||
      !bucket_compiled(dc->headdim, dc->headdim_v))
    return false;
  const int32_t sms = std::max(1, device_facts(p.device.index).num_sms);
  return decode_full_tiles_one_split(p, *dc, sms, decode_tile(p, *dc, sms, o.decode_tile), o.decode_warps);
}

/// p as the decode kernel's call: k/v are a full dense cache (no cache_seqlens, no append), when
/// the selector sends p there (override "small_q" forces either way) and the decode kernel accepts
/// it (decode_support); else nothing. `name` gets the decode kernel's name.
///
/// The rule (bench/small_q_route.py, H200): a forward tile holds tile_m query rows of one head and
/// walks its keys alone at a fixed time per key block, so with T tiles the forward takes
/// ceil(T / SMs) such walks. The decode kernel walks every key once per row tile of a KV head's
/// rows (batch * num_heads_kv * row tiles walks, split over the SMs) at about the forward's time
/// per walk once it fills the GPU; the rule counts narrow 16-row tiles (what it was measured
/// with; the wide tile, decode/launch_decode.h decode_tile, only takes launches with far more
/// block steps than the SMs, where the decode kernel is the faster either way). It is taken when
/// its walks fit in the forward's waves: always for one row tile (decode steps: 1.7-3.1x faster),
/// and for up to 128 rows where the forward tiles leave SMs idle (1.4-1.6x at 8 forward tiles,
/// 1.0-1.1x at 16-32); at 64 forward tiles of 64 rows the decode kernel took 1.7x the forward's
/// time. Those forwards did not split their keys; one whose tiles all walk every key
/// (launch_fwd.h fwd_key_split_eligible: no mask, or a causal chunk, here of one tile per head) with
/// fewer tiles than SMs splits them over the idle SMs (stream-K), and then the decode kernel, which
/// re-reads a KV head's keys for every row tile, is taken only while its tiles are few
/// (launch_decode.h small_q_decode_beats_split_forward; always for one row tile per KV head).
/// "Splits" there means the coarse split that rule was measured against (core/stream_k.h
/// stream_k_splits_coarsely: tiles of about 14 key blocks and more). Shorter tiles, which the
/// launch's plan cuts into pieces of a few blocks and finishes in about one piece's time, go to the
/// forward once the decode's narrow tiles times the head dim are many (more than 64 columns per SM,
/// launch_decode.h small_q_decode_beats_fine_split_forward: above 66 narrow tiles at d128 and 33 at
/// d256 on 132 SMs); measured on an H100, the decode kernel stayed the faster with 64 narrow tiles
/// at d128 and 128 at d64 (the issue's prefill chunk, 128 queries x 1k keys, 8 heads, d64: 9.75
/// against 12.47 us), the split forward with 96 at d128 and 64 at d256. One row tile per KV head
/// (decode steps) always stays on the decode kernel (launch_decode.h small_q_split_forward_wins).
/// Before those rules: row tiles the decode kernel runs as one 8-warp split each stay on it at any
/// row count (decode_one_split_wins).
std::optional<detail::KVCacheParams> small_q_on_decode(const detail::FwdParams& p, std::string* name) {
  const detail::KernelOverrides o = detail::kernel_overrides();
  const int8_t forced = o.small_q_decode;
  if (forced == 0 || p.is_varlen || p.seqlen_q <= 0 || p.seqlen_k <= 0) return std::nullopt;
  if (p.exp2_fraction_given && p.exp2_emulation.emulated > 0) return std::nullopt;  // decode: MUFU only
  // Only where the forward kernel exists in this build too: what forward_support accepts must not
  // depend on seqlen_q.
  const detail::HopperFwdConfig* fc = detail::hopper_fwd_bucket(p.headdim, p.headdim_v);
  if (!fc || !bucket_compiled(fc->headdim, fc->headdim_v)) return std::nullopt;
  detail::KVCacheParams kp;
  static_cast<detail::FwdParams&>(kp) = p;
  kp.batch_cache = p.batch;
  kp.key_capacity = p.seqlen_k;
  kp.total_k = 0;
  if (forced < 0 && !decode_one_split_wins(kp, o)) {
    const int64_t rows = decode_rows(p);
    if (rows > kSmallQMaxRows) return std::nullopt;
    // Beyond one row tile the rule below was measured at unpadded widths only (d64, d128, d256).
    const detail::HopperDecodeConfig* dc = detail::hopper_decode_bucket(p.headdim, p.headdim_v);
    if (rows > detail::kDecodeNarrowRows && (!dc || dc->headdim != std::max(p.headdim, p.headdim_v)))
      return std::nullopt;
    const int64_t tile_m = fc->tile_m;
    const int64_t sms = std::max(1, device_facts(p.device.index).num_sms);
    const int64_t fwd_tiles = int64_t(p.batch) * p.num_heads * ((p.seqlen_q + tile_m - 1) / tile_m);
    const int64_t fwd_waves = (fwd_tiles + sms - 1) / sms;
    if (decode_tiles(p, detail::kDecodeNarrowRows) > sms * fwd_waves) return std::nullopt;  // the decode's walks
    // A forward whose tiles all walk every key (no mask, or a causal chunk, within 128 rows of one
    // query tile per head) with fewer tiles than SMs splits its keys over the idle ones (stream-K, as
    // launch_fwd.cuh plans it): then it is the faster unless the decode's tiles are few (above).
    if (fwd_key_split_eligible(p, (p.seqlen_q + tile_m - 1) / tile_m, fc->tile_m, fc->tile_n)) {
      const int32_t fwd_blocks = int32_t((int64_t(p.seqlen_k) + fc->tile_n - 1) / fc->tile_n);
      if (small_q_split_forward_wins(p, fwd_tiles, fwd_blocks, int32_t(sms), o.stream_k, o.stream_k_min_share))
        return std::nullopt;
    }
  }
  if (!decode_support(kp, name).empty()) return std::nullopt;
  return kp;
}

/// Whether the forward kernel (fwd/) runs p, which common_support accepted: "" and its name, else
/// the reason.
std::string forward_kernel_support(const detail::FwdParams& p, std::string* kernel_name) {
  const detail::HopperFwdConfig* c = detail::hopper_fwd_bucket(p.headdim, p.headdim_v);
  if (!c)
    return "no Hopper kernel for headdim " + std::to_string(p.headdim) + ", headdim_v " +
           std::to_string(p.headdim_v) + " (supported: both <= 256, multiples of 8)";
  if (!bucket_compiled(c->headdim, c->headdim_v)) return not_compiled("forward", c->headdim, c->headdim_v);
  // The persistent grid numbers tiles with int32 (launch_fwd.cuh); max_seqlen_q bounds the rows
  // (varlen: and the packed rows, fwd_query_rows).
  const int64_t m_blocks = (fwd_query_rows(p) + c->tile_m - 1) / c->tile_m;
  if (m_blocks * p.num_heads * p.batch > kMaxTiles)
    return "the Hopper kernels handle at most 2^31 - 2^16 query tiles (batch * num_heads * "
           "ceil(max_seqlen_q / " + std::to_string(c->tile_m) + ")); lower max_seqlen_q to the real maximum";
  // Exp2Emulation's rule counts 16 eight-column groups per key tile: a tile of another width could not
  // give an explicit share exactly, and fa4 never silently changes an option.
  if (p.exp2_fraction_given && p.exp2_emulation.emulated > 0 && c->tile_n % (8 * p.exp2_emulation.period) != 0)
    return "exp2_emulation_fraction > 0 is not supported on the Hopper headdim bucket " +
           std::to_string(c->headdim) + "x" + std::to_string(c->headdim_v) + " (key tile " +
           std::to_string(c->tile_n) + " is not a multiple of 128); pass 0 or leave it unset";
  if (kernel_name)
    *kernel_name = "hopper::fwd_" + bucket_name(p, c->headdim, c->headdim_v,
                                                fwd_runs_local_kernel(*c, p) ? "_local" : "");
  return "";
}

/// Whether the KV-cache call p runs on the forward kernel, after the decode launch's append
/// (forward_kvcache): the cache read in place, dense or paged (launch_fwd.h fwd_paged_load) with
/// a page size that is a multiple of the forward bucket's key tile (tile_n: 128 keys up to d128
/// and at 192 x 128, 96 at d192, 80 at d256; a key block is one TMA box of one page) or, on a
/// bucket with a gathering kernel (tuning_fwd.h gather_kernel: d64, d128, d256), a power of two of
/// at least 8 rows, from its gather_min_seqlen_q query tokens (hopper::fwd_<bucket>_gather,
/// launch_fwd.h kvcache_gathers; other page sizes and shorter chunks stay on the decode kernel, which
/// takes any) and a pool of at least one page, no cache_batch_idx, no explicit num_splits (the decode
/// kernel's), more than 128 query rows per KV head (chunked prefill; there a
/// forward of the same shape over the whole cache would not take the decode kernel either,
/// small_q_on_decode; override "small_q" forces either way, fwd then at any row count) unless the
/// decode kernel runs them as one 8-warp split per row tile (decode_one_split_wins), and the
/// forward kernel takes the layout. The decode kernel's own limits still apply: decode_support
/// accepts p first, for the append. (H100, bench/decode_tile_ab.py: 1.2-1.8x faster than the decode
/// kernel at 256-1024 rows per KV head; bench/results/history.md.) The forward plans its tiles and
/// split at the capacity, as the decode kernel does, and each sequence's tiles attend to its
/// cache_seqlens[b] + seqlen_new keys (tile_info.cuh seq_bounds, which checks cache_seqlens on the
/// device as the append does).
bool kvcache_on_forward(const detail::KVCacheParams& p, std::string* name) {
  if (p.cache_batch_idx || p.num_splits != 0 || p.seqlen_q == 0 || p.key_capacity == 0) return false;
  const detail::HopperFwdConfig* fc = detail::hopper_fwd_bucket(p.headdim, p.headdim_v);
  const FwdPagedLoad paged_load = p.paged && fc ? fwd_paged_load(p.page_size, fc->tile_n) : FwdPagedLoad::kNone;
  const bool gathered = p.paged && fc && fwd_runs_gather_kernel(*fc, p.page_size);
  // (An empty pool has no TMA view: the decode kernel. Small pages: on the buckets with a
  // gathering kernel, tuning_fwd.h gather_kernel.)
  if (p.paged && (paged_load == FwdPagedLoad::kNone || p.num_pages < 1 ||
                  (paged_load == FwdPagedLoad::kGather && !gathered)))
    return false;
  // Up to 128 rows per KV head (decode steps, speculative decoding, short chunks) the decode kernel
  // stays, as it did before this route was measured, and so do calls it runs as one 8-warp split
  // per tile (decode_one_split_wins); above them small_q_on_decode would decline too, and its decode
  // checks are kvcache_support's, already passed. Override "small_q" forces either way (fwd: at
  // any row count).
  const detail::KernelOverrides o = detail::kernel_overrides();
  const int8_t forced = o.small_q_decode;
  if (forced == 1 || (forced < 0 && (decode_rows(p) <= kSmallQMaxRows || decode_one_split_wins(p, o)))) return false;
  // Gathered pages from the bucket's gather_min_seqlen_q tokens (launch_fwd.h kvcache_gathers).
  if (gathered && forced < 0 && !kvcache_gathers(*fc, p.page_size, p.seqlen_q)) return false;
  // (Paged: common_support checks k / v's strides as a batched view's; decode_support checked the
  // pool's, the same TMA rule.)
  const detail::FwdParams& fp = p;
  if (!common_support(fp).empty() || !forward_kernel_support(fp, name).empty()) return false;
  if (name && gathered)  // (its own kernel, whatever the mask)
    *name = "hopper::fwd_" + bucket_name(fp, fc->headdim, fc->headdim_v, "_gather");
  if (name) *name += p.paged ? " (KV cache, paged)" : " (KV cache)";
  return true;
}

}  // namespace

std::string forward_support(const detail::FwdParams& p, std::string* kernel_name) {
  std::string why = common_support(p);
  if (!why.empty()) return why;
  if (small_q_on_decode(p, kernel_name)) {
    if (kernel_name) *kernel_name += " (small-query forward)";
    return "";
  }
  return forward_kernel_support(p, kernel_name);
}

std::string backward_support(const detail::BwdParams& p, std::string* kernel_name) {
  std::string why = common_support(p);
  if (!why.empty()) return why;
  const detail::HopperBwdConfig* b = detail::hopper_bwd_bucket(p.headdim, p.headdim_v);
  if (!b)
    return "the Hopper backward supports headdim and headdim_v up to 256 (buckets 64, 128, 192 x 128, 192 and 256); headdim " +
           std::to_string(p.headdim) + ", headdim_v " + std::to_string(p.headdim_v) +
           " has no backward kernel yet (run the backward on CPU tensors)";
  if (!bucket_compiled(b->headdim, b->headdim_v)) return not_compiled("backward", b->headdim, b->headdim_v);
  const int64_t elem = dtype_size(p.dtype);
  const int64_t rows_q = p.is_varlen ? p.total_q : p.seqlen_q;
  why = check_tma_tensor("dout", p.dout, p.dout_stride, rows_q, p.num_heads, p.batch, p.is_varlen, elem);
  if (!why.empty()) return why;
  // The pre/postprocess grids are (query blocks, heads, batch); varlen maxima are clamped to the
  // packed rows as launch_bwd.cuh does.
  const int64_t max_q = p.is_varlen ? std::min<int64_t>(p.seqlen_q, p.total_q) : p.seqlen_q;
  const int64_t max_k = p.is_varlen ? std::min<int64_t>(p.seqlen_k, p.total_k) : p.seqlen_k;
  const int64_t m_blocks = (max_q + b->tile_m - 1) / b->tile_m;
  const int64_t n_blocks = (max_k + b->tile_n - 1) / b->tile_n;
  if (p.batch > 65535 || p.num_heads > 65535)
    return "the Hopper backward handles at most 65535 sequences and 65535 heads per call";
  const int64_t chunks = p.is_varlen ? p.total_q / b->tile_m + p.batch : p.batch * m_blocks;
  if (n_blocks * p.num_heads_kv * p.batch > kMaxTiles || chunks * p.num_heads > INT32_MAX)
    return "the Hopper backward handles at most 2^31 - 2^16 key tiles (batch * num_heads_kv * "
           "ceil(max_seqlen_k / " + std::to_string(b->tile_n) + ")) and 2^31 - 1 query blocks of " +
           std::to_string(b->tile_m) + " rows (over all heads)";
  if (kernel_name) *kernel_name = "hopper::bwd_" + bucket_name(p, b->headdim, b->headdim_v);
  return "";
}

std::string missing_device(int index) {
  const DeviceFacts f = device_facts(index);
  return f.present ? std::string() : f.error;
}

/// The dispatch of one bucket (D, DV) for a direction, expanded once per bucket of the list inside
/// forward / backward / forward_kvcache (which define `c`, the selected row, `bf16`, `p`, `ctx`):
/// buckets without a row in the direction's table (FIND) or not compiled in this build emit no
/// call, so RUN is instantiated only where an instantiation file exists.
#define FA4_DISPATCH_ROW(FIND, RUN, D, DV)                                  \
  if constexpr (detail::FIND(D, DV) != nullptr) {                           \
    if (c->headdim == D && c->headdim_v == DV) {                            \
      if constexpr (FA4_HOPPER_HAS_##D##_##DV == 1) {                       \
        if (bf16) RUN<int(DType::kBF16), D, DV>(p, ctx);                    \
        else RUN<int(DType::kFP16), D, DV>(p, ctx);                         \
        return;                                                             \
      }                                                                     \
    }                                                                       \
  }

namespace {

/// The forward kernel's launch choices for p (device facts, tile order, epilogue, split).
/// gather_page_size: a KV-cache call's page size (0: not paged).
LaunchContext forward_context(const detail::FwdParams& p, const detail::KernelOverrides& o,
                              int32_t gather_page_size = 0) {
  const DeviceFacts f = device_facts(p.device.index);
  LaunchContext ctx;
  ctx.num_sms = f.num_sms;
  ctx.l2_bytes = f.l2_bytes;
  // LPT + L2 sections pay where tiles differ in cost (causal/window masks, varlen). For dense
  // non-causal problems the plain order (m fastest) already keeps one head's K/V hot in L2, and
  // interleaving heads measured 5% slower (bench/results, d128).
  const bool unequal_tiles = p.mask.is_local() || p.is_varlen;
  ctx.lpt = pick_override(o.lpt, unequal_tiles);
  // Causal/window tiles are claimed dynamically, longest first (H200, d128 causal 16k: 0.93x ->
  // 1.04x cuDNN). Varlen keeps the static stride: its tile grid (max m-blocks for every sequence)
  // is mostly empty tiles, and claiming those one atomic at a time measured 3% slower on the
  // benchmark's varlen batch.
  ctx.dynamic_schedule = pick_override(o.dynamic_schedule, p.mask.is_local() && !p.is_varlen);
  // O leaves through smem + TMA store (fwd/epilogue_fwd.cuh) where out obeys the same TMA rule as q/k/v
  // and is batched (a varlen box would cross into the next sequence's rows).
  // Pack-GQA (launch_fwd.h fwd_packs_gqa): by default on the gathering kernel of a tuning row with
  // pack_gqa_gather, for chunks filling at most half a row tile. Its tiles' rows belong to several
  // heads, so O leaves through direct stores.
  const detail::HopperFwdConfig* c = detail::hopper_fwd_bucket(p.headdim, p.headdim_v);
  const bool gathers = c && gather_page_size > 0 && fwd_runs_gather_kernel(*c, gather_page_size);
  ctx.pack_gqa = c && fwd_packs_gqa(c->tile_m, fwd_query_rows(p), p.num_heads, p.num_heads_kv, /*gathers=*/gathers,
                                     /*measured_gain=*/c->pack_gqa_gather, o.pack_gqa);
  ctx.tma_epilogue = pick_override(o.tma_epilogue, true) && !p.is_varlen && !ctx.pack_gqa &&
                     check_tma_tensor("out", p.out, p.out_stride, p.seqlen_q, p.num_heads, p.batch,
                                      false, dtype_size(p.dtype)).empty();
  // Stream-K split-KV (core/stream_k.h): automatic (-1) for problems whose tiles walk all or most
  // keys (launch_fwd.h fwd_key_split_eligible) with fewer tiles than SMs; the override forces it
  // off (0), or on for any partial last round of such a problem run in the static order (1; a
  // causal one with more tiles than SMs claims them dynamically and is not split).
  ctx.stream_k = o.stream_k;
  ctx.stream_k_min_share = o.stream_k_min_share;
  return ctx;
}

/// Runs p on the forward kernel (forward_kernel_support accepted it; p's device is current).
void dispatch_forward(const detail::FwdParams& p, const LaunchContext& ctx) {
  if (ctx.tma_epilogue) g_fwd_tma_epilogue_calls.fetch_add(1, std::memory_order_relaxed);
  const detail::HopperFwdConfig* c = detail::hopper_fwd_bucket(p.headdim, p.headdim_v);
  const bool bf16 = p.dtype == DType::kBF16;
#define FA4_DISPATCH_FWD(D, DV) FA4_DISPATCH_ROW(find_hopper_fwd_config, run_fwd, D, DV)
  FA4_HOPPER_BUCKETS(FA4_DISPATCH_FWD)
#undef FA4_DISPATCH_FWD
  throw Error(ErrorCode::kInternal, std::string(ctx.fn) + " (hopper): selector and dispatcher disagree");
}

/// Runs p's decode launch (decode_support accepted it; p's device is current): the append and the
/// decode kernel, or the append alone (ctx.decode_append_only).
void dispatch_decode(const detail::KVCacheParams& p, const LaunchContext& ctx) {
  const detail::HopperDecodeConfig* c = detail::hopper_decode_bucket(p.headdim, p.headdim_v);
  const bool bf16 = p.dtype == DType::kBF16;
#define FA4_DISPATCH_DECODE(D, DV) FA4_DISPATCH_ROW(find_hopper_decode_config, run_decode, D, DV)
  FA4_HOPPER_BUCKETS(FA4_DISPATCH_DECODE)
#undef FA4_DISPATCH_DECODE
  throw Error(ErrorCode::kInternal, "fa4::forward_with_kvcache (hopper): selector and dispatcher disagree");
}

}  // namespace

void forward(const detail::FwdParams& p) {
  // The selector (forward_support) has accepted p: fa4::forward calls it first, once.
  if (const std::optional<detail::KVCacheParams> kp = small_q_on_decode(p, nullptr))
    return forward_kvcache(*kp, "fa4::forward");
  // An earlier kernel on this device may have met invalid varlen indices: report it now (a read of
  // host memory, no sync), before this call writes anything.
  check_async_errors(p.device.index);
  LaunchContext ctx = forward_context(p, detail::kernel_overrides());
  ctx.fn = "fa4::forward";
  const CallDevice call_device(p.device.index, ctx.fn);
  if (p.is_varlen) ctx.async_error = async_error_record(p.device.index);  // on p's device
  dispatch_forward(p, ctx);
}

void zero_dsink(const detail::BwdParams& p) {
  if (!p.dsink || p.num_heads == 0) return;
  const CallDevice call_device(p.device.index, "fa4::backward");
  // Stream-ordered and capturable, as the kernels' launches.
  if (cudaMemsetAsync(p.dsink, 0, size_t(p.num_heads) * sizeof(float), static_cast<cudaStream_t>(p.device.stream)) !=
      cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorCode::kCudaError, "fa4::backward (hopper): cudaMemsetAsync of dsink failed");
  }
}

namespace {

/// The backward's bucket row and launch choices for p (accepted by backward_support): the device's
/// facts and the tile order. backward() and backward_workspace_bytes() both start here, so the
/// size reported is the size the launch lays out.
const detail::HopperBwdConfig& bwd_row_and_context(const detail::BwdParams& p, const detail::KernelOverrides& o,
                                                    LaunchContext& ctx) {
  const DeviceFacts f = device_facts(p.device.index);
  ctx.num_sms = f.num_sms;
  ctx.l2_bytes = f.l2_bytes;
  const detail::HopperBwdConfig* c = detail::hopper_bwd_bucket(p.headdim, p.headdim_v);
  if (c == nullptr) throw Error(ErrorCode::kInternal, "fa4::backward (hopper): no backward bucket for an accepted input");
  const detail::BwdOrder order = detail::bwd_order(*c, p.mask.is_local(), p.is_varlen, p.deterministic, o);
  ctx.lpt = order.lpt;
  ctx.bwd_lpt_band = order.band;
  ctx.bwd_descending = order.descending;
  ctx.dynamic_schedule = order.dynamic;
  return *c;
}

}  // namespace

int64_t backward_workspace_bytes(const detail::BwdParams& p) {
  LaunchContext ctx;
  const detail::HopperBwdConfig& c = bwd_row_and_context(p, detail::kernel_overrides(), ctx);
  return bwd_launch_shape(c, p, ctx).workspace_bytes();
}

void backward(const detail::BwdParams& p) {
  // The selector (backward_support) has accepted p. Earlier invalid varlen indices: report now.
  check_async_errors(p.device.index);
  const detail::KernelOverrides o = detail::kernel_overrides();
  LaunchContext ctx;
  const detail::HopperBwdConfig* c = &bwd_row_and_context(p, o, ctx);
  // dK / dV leave through smem + TMA stores (bwd/mainloop_bwd_mma.cuh store_dkdv_tma) where both
  // obey the TMA rule, not with shared keys (varlen: the kernel keeps direct stores for a
  // sequence's partial last block).
  const int64_t rows_k = p.is_varlen ? p.total_k : p.seqlen_k;
  const int64_t elem = dtype_size(p.dtype);
  ctx.tma_epilogue = pick_override(o.tma_epilogue, true) && !c->shared_keys && rows_k > 0 && p.dk && p.dv &&
                     check_tma_tensor("dk", p.dk, p.dk_stride, rows_k, p.num_heads_kv, p.batch, p.is_varlen, elem).empty() &&
                     check_tma_tensor("dv", p.dv, p.dv_stride, rows_k, p.num_heads_kv, p.batch, p.is_varlen, elem).empty();
  if (ctx.tma_epilogue) g_bwd_tma_epilogue_calls.fetch_add(1, std::memory_order_relaxed);
  const CallDevice call_device(p.device.index, "fa4::backward");
  if (p.is_varlen) ctx.async_error = async_error_record(p.device.index);

  const bool bf16 = p.dtype == DType::kBF16;
#define FA4_DISPATCH_BWD(D, DV) FA4_DISPATCH_ROW(find_hopper_bwd_config, run_bwd, D, DV)
  FA4_HOPPER_BUCKETS(FA4_DISPATCH_BWD)
#undef FA4_DISPATCH_BWD
  throw Error(ErrorCode::kInternal, "fa4::backward (hopper): selector and dispatcher disagree");
}

std::string kvcache_support(const detail::KVCacheParams& p, std::string* kernel_name) {
  std::string why = decode_support(p, kernel_name);  // (the append is the decode launch's)
  if (!why.empty()) return why;
  kvcache_on_forward(p, kernel_name);  // where the forward kernel attends, its name
  return "";
}

void forward_kvcache(const detail::KVCacheParams& p, const char* fn) {
  // The selector (kvcache_support) has accepted p. Earlier invalid indices: report now.
  check_async_errors(p.device.index);
  const detail::KernelOverrides overrides = detail::kernel_overrides();
  const bool on_forward = kvcache_on_forward(p, nullptr);
  LaunchContext ctx;
  if (on_forward) {
    ctx = forward_context(p, overrides, p.paged ? p.page_size : 0);
    ctx.cache_seqlens = p.cache_seqlens;
    ctx.seqlen_new = p.seqlen_new;
    if (p.paged) {
      ctx.page_table = p.page_table;
      ctx.page_table_batch_stride = p.page_table_batch_stride;
      ctx.page_size = p.page_size;
      ctx.num_pages = p.num_pages;
    }
  } else {
    const DeviceFacts f = device_facts(p.device.index);
    ctx.num_sms = f.num_sms;
    ctx.l2_bytes = f.l2_bytes;
  }
  ctx.fn = fn;
  ctx.decode_cluster = overrides.decode_cluster;
  ctx.decode_tile = overrides.decode_tile;
  ctx.decode_warps = overrides.decode_warps;
  ctx.decode_append_delay_us = overrides.decode_append_delay_us;
  const CallDevice call_device(p.device.index, fn);
  ctx.async_error = async_error_record(p.device.index);
  if (!on_forward) return dispatch_decode(p, ctx);
  // The append (the decode launch's), then the forward kernel reads the rows in stream order; the
  // forward launch calls it once everything that can fail on the host has passed.
  struct Append {
    const detail::KVCacheParams* p;
    LaunchContext ctx;
  };
  Append append{&p, ctx};
  append.ctx.decode_append_only = true;
  if (p.seqlen_new > 0) {
    ctx.before_kernel = [](const void* arg) {
      const Append& a = *static_cast<const Append*>(arg);
      dispatch_decode(*a.p, a.ctx);
    };
    ctx.before_kernel_arg = &append;
  }
  dispatch_forward(p, ctx);
}

uint64_t fwd_tma_epilogue_calls() { return g_fwd_tma_epilogue_calls.load(std::memory_order_relaxed); }
uint64_t bwd_tma_epilogue_calls() { return g_bwd_tma_epilogue_calls.load(std::memory_order_relaxed); }

}  // namespace fa4::hopper
