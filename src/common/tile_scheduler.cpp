// src/common/tile_scheduler.cpp — persistent tile order (LPT + L2 sections). Policy: see
// include/fa4/tile_scheduler.h.
#include "fa4/tile_scheduler.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <string>
#include <utility>

#include "fa4/detail/params.h"
#include "fa4/error.h"

namespace fa4 {
namespace {

constexpr const char* kFn = "fa4::make_tile_schedule";
constexpr const char* kFnVarlen = "fa4::TileProblem::varlen";
constexpr const char* kFnBatched = "fa4::TileProblem::batched";

[[noreturn]] void invalid(const char* fn, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, std::string(fn) + ": " + what);
}

void require_positive(int64_t v, const char* name) {
  if (v <= 0) invalid(kFn, std::string(name) + " = " + std::to_string(v) + " must be > 0");
}

void validate(const TileProblem& pr, const TileSchedulerConfig& cfg) {
  require_positive(cfg.tile_m, "cfg.tile_m");
  require_positive(cfg.tile_n, "cfg.tile_n");
  require_positive(cfg.headdim, "cfg.headdim");
  require_positive(cfg.headdim_v, "cfg.headdim_v");
  require_positive(cfg.element_size, "cfg.element_size");
  require_positive(cfg.l2_bytes, "cfg.l2_bytes");
  require_positive(pr.num_heads, "problem.num_heads");
  require_positive(pr.num_heads_kv, "problem.num_heads_kv");
  if (pr.num_heads % pr.num_heads_kv != 0) {
    invalid(kFn, "problem.num_heads = " + std::to_string(pr.num_heads) +
            " must be a multiple of problem.num_heads_kv = " + std::to_string(pr.num_heads_kv));
  }
  for (size_t b = 0; b < pr.seqs.size(); ++b) {
    if (pr.seqs[b].seqlen_q < 0 || pr.seqs[b].seqlen_k < 0) {
      invalid(kFn, "problem.seqs[" + std::to_string(b) + "] = (" +
                       std::to_string(pr.seqs[b].seqlen_q) + ", " +
                       std::to_string(pr.seqs[b].seqlen_k) + ") must be non-negative");
    }
  }
}

int32_t ceil_div(int64_t a, int64_t b) { return int32_t((a + b - 1) / b); }

/// One L2 section of one sequence while it is being built.
struct Section {
  std::vector<TileWork> tiles;
  int32_t max_cost = 0;
  int64_t total_cost = 0;
};

}  // namespace

TileProblem TileProblem::batched(int32_t batch, int32_t seqlen_q, int32_t seqlen_k,
                                 int32_t num_heads, int32_t num_heads_kv, detail::MaskSpec mask) {
  if (batch < 0) invalid(kFnBatched, "batch = " + std::to_string(batch) + " must be >= 0");
  TileProblem p;
  p.num_heads = num_heads;
  p.num_heads_kv = num_heads_kv;
  p.seqs.assign(size_t(batch), SeqLens{seqlen_q, seqlen_k});
  p.mask = mask;
  return p;
}

TileProblem TileProblem::varlen(int32_t batch, const int32_t* cu_seqlens_q,
                                const int32_t* cu_seqlens_k, const int32_t* seqused_k,
                                int32_t num_heads, int32_t num_heads_kv, detail::MaskSpec mask) {
  if (batch < 0) invalid(kFnVarlen, "batch = " + std::to_string(batch) + " must be >= 0");
  if (cu_seqlens_q == nullptr || cu_seqlens_k == nullptr) {
    invalid(kFnVarlen, "needs host arrays cu_seqlens_q and cu_seqlens_k (batch + 1 entries)");
  }
  TileProblem p;
  p.num_heads = num_heads;
  p.num_heads_kv = num_heads_kv;
  p.is_varlen = true;
  p.mask = mask;
  p.seqs.reserve(size_t(batch));
  for (int32_t b = 0; b < batch; ++b) {
    const int32_t len_q = cu_seqlens_q[b + 1] - cu_seqlens_q[b];
    const int32_t len_k = cu_seqlens_k[b + 1] - cu_seqlens_k[b];
    if (len_q < 0 || len_k < 0) {
      invalid(kFnVarlen, std::string(len_q < 0 ? "cu_seqlens_q" : "cu_seqlens_k") +
                             " must be non-decreasing (entry " + std::to_string(b + 1) + ")");
    }
    int32_t used_k = len_k;
    if (seqused_k != nullptr) {
      used_k = seqused_k[b];
      if (used_k < 0 || used_k > len_k) {
        invalid(kFnVarlen, "seqused_k[" + std::to_string(b) + "] = " + std::to_string(used_k) +
                " must be in [0, " + std::to_string(len_k) + "] (the sequence's key count)");
      }
    }
    p.seqs.push_back({len_q, used_k});
  }
  return p;
}

TileProblem TileProblem::from_params(const detail::FwdParams& fp) {
  TileProblem p;
  p.num_heads = fp.num_heads;
  p.num_heads_kv = fp.num_heads_kv;
  p.is_varlen = fp.is_varlen;
  p.mask = fp.mask;
  p.seqs.reserve(size_t(std::max(fp.batch, 0)));
  for (int32_t b = 0; b < fp.batch; ++b) {
    const detail::SeqInfo s = detail::seq_info_host(fp, b);
    p.seqs.push_back({s.seqlen_q, s.seqlen_k});
  }
  return p;
}

NBlockRange n_block_range(int64_t row_begin, int64_t row_end, int32_t seqlen_q, int32_t seqlen_k,
                          int32_t tile_n, detail::MaskSpec mask) {
  row_begin = std::max<int64_t>(row_begin, 0);
  row_end = std::min<int64_t>(row_end, seqlen_q);
  if (seqlen_k <= 0 || row_begin >= row_end) return {0, 0};
  // visible_key_range(i) has non-decreasing ends in i (both follow diag(i) = i + seqlen_k -
  // seqlen_q), and a row can only be empty at the top, where its right bound diag + window_right
  // is left of key 0. (The bottom rows never are: diag - window_left <= seqlen_k - 1 for every
  // i < seqlen_q.) So the non-empty rows are [lo, row_end) and the union of their ranges is
  // [first(lo), last(row_end - 1)).
  const int64_t offset = int64_t(seqlen_k) - seqlen_q;
  int64_t lo = row_begin;
  const int64_t hi = row_end - 1;
  if (mask.window_right >= 0) lo = std::max(lo, -offset - mask.window_right);  // diag+wr+1 > 0
  if (lo > hi) return {0, 0};
  const detail::KeyRange first = detail::visible_key_range(lo, seqlen_q, seqlen_k, mask);
  const detail::KeyRange last = detail::visible_key_range(hi, seqlen_q, seqlen_k, mask);
  if (first.first >= first.last || last.first >= last.last) {
    throw Error(ErrorCode::kInternal, "fa4::n_block_range: empty boundary row (mask algebra bug)");
  }
  return {int32_t(first.first / tile_n), ceil_div(last.last, tile_n)};
}

int32_t kv_heads_per_l2_section(int32_t seqlen_k, int32_t num_heads_kv,
                                const TileSchedulerConfig& cfg) {
  const int64_t bytes_per_kv_head =
      int64_t(seqlen_k) * (int64_t(cfg.headdim) + cfg.headdim_v) * cfg.element_size;
  int32_t p = 1;
  while (int64_t(p) * 2 <= num_heads_kv && int64_t(p) * 2 * bytes_per_kv_head <= cfg.l2_bytes) {
    p *= 2;
  }
  return p;
}

TileSchedule make_tile_schedule(const TileProblem& pr, const TileSchedulerConfig& cfg) {
  validate(pr, cfg);
  TileSchedule out;
  out.lpt = cfg.order == TileOrder::kLpt ||
            (cfg.order == TileOrder::kAuto && (pr.is_varlen || pr.mask.is_local()));
  const int32_t group = pr.num_heads / pr.num_heads_kv;

  std::vector<Section> sections;
  std::vector<TileWork> empty_tiles;
  std::vector<int32_t> cost;  // per m_block of the current sequence (independent of the head)
  for (int32_t b = 0; b < int32_t(pr.seqs.size()); ++b) {
    const SeqLens s = pr.seqs[size_t(b)];
    if (s.seqlen_q == 0) continue;  // nothing to write
    const int32_t num_m = ceil_div(s.seqlen_q, cfg.tile_m);
    cost.resize(size_t(num_m));
    for (int32_t m = 0; m < num_m; ++m) {
      const NBlockRange r = n_block_range(int64_t(m) * cfg.tile_m, int64_t(m + 1) * cfg.tile_m,
                                          s.seqlen_q, s.seqlen_k, cfg.tile_n, pr.mask);
      cost[size_t(m)] = r.n_block_max - r.n_block_min;
    }
    const int32_t kv_per_section = kv_heads_per_l2_section(s.seqlen_k, pr.num_heads_kv, cfg);
    for (int32_t kv0 = 0; kv0 < pr.num_heads_kv; kv0 += kv_per_section) {
      const int32_t h_begin = kv0 * group;
      const int32_t h_end = std::min(kv0 + kv_per_section, pr.num_heads_kv) * group;
      Section sec;
      // LPT generates m_block descending so that equal-cost ties keep the upstream order.
      for (int32_t i = 0; i < num_m; ++i) {
        const int32_t m = out.lpt ? num_m - 1 - i : i;
        for (int32_t h = h_begin; h < h_end; ++h) {
          const TileWork t{b, h, m, cost[size_t(m)]};
          if (t.num_n_blocks == 0) {
            empty_tiles.push_back(t);
            continue;
          }
          sec.tiles.push_back(t);
          sec.max_cost = std::max(sec.max_cost, t.num_n_blocks);
          sec.total_cost += t.num_n_blocks;
        }
      }
      if (out.lpt) {
        std::stable_sort(sec.tiles.begin(), sec.tiles.end(),
                         [](const TileWork& a, const TileWork& c) {
                           return a.num_n_blocks > c.num_n_blocks;
                         });
      }
      if (!sec.tiles.empty()) sections.push_back(std::move(sec));
    }
  }
  if (out.lpt) {
    std::stable_sort(sections.begin(), sections.end(), [](const Section& a, const Section& c) {
      if (a.max_cost != c.max_cost) return a.max_cost > c.max_cost;
      return a.total_cost > c.total_cost;
    });
  }

  out.section_offsets.push_back(0);
  for (Section& sec : sections) {
    out.tiles.insert(out.tiles.end(), sec.tiles.begin(), sec.tiles.end());
    out.section_offsets.push_back(int64_t(out.tiles.size()));
    out.total_cost += sec.total_cost;
  }
  out.num_work_tiles = int64_t(out.tiles.size());
  std::sort(empty_tiles.begin(), empty_tiles.end(), [](const TileWork& a, const TileWork& c) {
    if (a.batch != c.batch) return a.batch < c.batch;
    if (a.head != c.head) return a.head < c.head;
    return a.m_block < c.m_block;
  });
  out.tiles.insert(out.tiles.end(), empty_tiles.begin(), empty_tiles.end());
  return out;
}

double simulate_makespan(const std::vector<TileWork>& order, int32_t num_workers,
                         double per_tile_overhead) {
  if (num_workers <= 0) {
    throw Error(ErrorCode::kInvalidArgument, "fa4::simulate_makespan: num_workers = " +
                                                 std::to_string(num_workers) + " must be > 0");
  }
  // (time the worker becomes free, worker index): the smallest pair is the next free worker.
  using Slot = std::pair<double, int32_t>;
  std::priority_queue<Slot, std::vector<Slot>, std::greater<Slot>> free_at;
  for (int32_t w = 0; w < num_workers; ++w) free_at.push({0.0, w});
  double makespan = 0.0;
  for (const TileWork& t : order) {
    const Slot s = free_at.top();
    free_at.pop();
    const double done = s.first + t.num_n_blocks + per_tile_overhead;
    makespan = std::max(makespan, done);
    free_at.push({done, s.second});
  }
  return makespan;
}

}  // namespace fa4
