// fa4/attention.h — exact attention, forward and backward (FlashAttention-4, arXiv 2603.05451).
//
// LAYOUTS (flash-attn's). Strides are free except that the last dim (headdim) must be contiguous
// and no stride may be negative (on a dim of size > 1).
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
//   * NaN in q/k/v (dout) still propagates to the rows it reaches. NaN in a row outside its
//     sequence (tile padding, seqused_k, the next varlen sequence) never does, forward or
//     backward. On the CPU a NaN in a key masked for some rows (causal/window) never reaches
//     those rows either; on the Hopper kernels it can, as 0 * NaN in a matrix product: a V row
//     in the forward, and K, Q and dO rows in the backward's gradients of that sequence.
//   * batch == 0, seqlen_q == 0 or total_q == 0: forward reads and writes nothing; backward
//     writes zeros to dk/dv (and dsink), whose gradient is then exactly 0.
//   * varlen: rows of out/lse/dq/dk/dv outside every [cu_seqlens[b], cu_seqlens[b+1]) range, and
//     dk/dv rows past seqused_k, are left untouched.
//   * outputs (forward: out, lse; backward: dq, dk, dv, dsink and options.workspace, whose out and
//     lse are inputs: they may share memory with other inputs and repeat elements, e.g. broadcast
//     with stride 0; the caches when appended to) must not overlap: no two
//     elements of one output share an address (its dims, by increasing stride, each step past the
//     elements of the dims inside them), and no output shares memory with another tensor of the
//     call (kInvalidArgument where the check finds a shared byte: exactly for dense views, and for
//     strided ones whose strides nest into each other's, as slices of one packed tensor do, where
//     interleaved views such as q, k, v or dq, dk, dv pass; two outputs with row strides of no
//     common period, e.g. 12288 and 12287 elements, may overlap unnoticed: src/common/
//     validate_checks.h views_overlap). Allowed in place: out = q (the same view;
//     forward() with the batched layout) and dq = q (the same view; backward()).
//   * varlen on CUDA: device-resident cu_seqlens/seqused_k are checked by the kernel, not before
//     the call (see check_async_errors): a sequence breaking a rule is skipped and reported by the
//     next call on the device. Nothing is ever read or written out of bounds.
//
// CUDA GRAPHS. Every CUDA call (forward, backward, forward_with_kvcache) can be captured: no host
// sync, no allocation once its stream has scratch. A captured call's scratch up to 16 MiB (tile
// counters and split flags, which its kernels leave zero; split-KV and stream-K partials; a
// backward workspace) is set aside at capture, so a replay launches the call's kernels alone: fa4
// keeps it for the life of the process while the device's kept scratch stays within 64 MiB, and
// past that the graph owns it (a CUDA user object, reused once the graph is destroyed; such a graph
// costs each replay about 1.3 us more on the H200); the calls captured on one stream in one capture
// share it, as eager calls on one stream do (the capture orders them; replacing a stream's capture
// dependencies, i.e. cudaStreamSetCaptureDependencies, or editing the graph's edges between the
// calls, is not supported). Larger scratch (a training-shaped backward workspace, d256 stream-K
// partials) is CUDA graph memory (allocation and free nodes). Run one executable instance of a
// captured graph at a time (CUDA orders the replays of one instance): two instances of one captured
// graph replayed concurrently would share that scratch.
//
// SCRATCH MEMORY (CUDA). Besides the caller's tensors, a CUDA call needs device scratch: tile
// counters and split flags (KBs), split-KV and stream-K partials, the backward's workspace (an fp32
// dQ accumulator and row statistics: about 4 * (D + 2) bytes per query row and head, D the
// backward's tile head dim (64 up to headdim 64, 128 up to 128, 256 above) and the query rows
// padded to its row tile; GBs for a training shape; backward_workspace_size() gives it exactly).
// A backward given BackwardOptions::workspace uses that instead (PyTorch's autograd path passes
// one above 4 MiB). Otherwise fa4 keeps it
// between eager calls, so that a call neither allocates nor waits: per (device, stream), what
// must start zeroed, the split-KV partials, and the backward's workspace and stream-K partials up
// to 4 MiB (a destroyed stream's stay allocated until released); a larger backward workspace or
// stream-K partials from a per-device stream-ordered memory pool (cudaMallocFromPoolAsync /
// cudaFreeAsync on the call's stream), which keeps what calls gave back for any stream's next
// call, so it holds the most that calls used at once (on a device without memory pools they are
// cached per stream too). release_cached_memory() gives all of it back to CUDA. Captured calls'
// scratch (CUDA GRAPHS above) is not part of it.
//
// ERRORS. fa4::Error (fa4/error.h). Every argument is validated before anything is written, except
// the contents of device-resident varlen indices (above) and of device-resident KV-cache indices
// (forward_with_kvcache). The other exception: ErrorCode::kInternal from the CPU backward's
// consistency check (P = exp(s - lse) must be <= 1, i.e. lse belongs to these inputs and options)
// is raised after dq/dk/dv were written. Codes: kInvalidArgument (a rule of this header),
// kUnsupported (valid, but no implementation for it: headdim or headdim_v above 256 on every
// backend, fp8 q, and the CUDA rules below), kNoDevice (CUDA tensors and no usable GPU, or a build
// without CUDA), kCudaError, kInternal.
//
// CUDA (the Hopper kernels). Valid inputs the CUDA kernels refuse with kUnsupported
// (forward_support() & co. name the rule):
//   * a GPU of compute capability 9.0 (H100 / H200); a device index no visible GPU has is kNoDevice;
//   * dtype bf16 or fp16 (fp32 runs on CPU tensors only);
//   * headdim and headdim_v multiples of 8 up to 256, run on the smallest compiled head-dim bucket
//     that holds both (padded): forward buckets 64, 96, 128, 192 x 128, 192 and 256, backward 64,
//     128, 192 x 128, 192 and 256, KV cache 64, 128 and 256 (src/hopper/buckets.h
//     and each direction's tuning table); a build configured with FA4_HOPPER_HEADDIMS lacks the
//     buckets it leaves out;
//   * q, k and v (the backward also dout; forward_with_kvcache q, k_cache, v_cache, out, k_new
//     and v_new) 16-byte aligned with positive strides that are multiples of 16 bytes on every
//     dimension of extent > 1 (TMA and 16-byte copies; the other outputs may be strided freely);
//   * an explicit exp2_emulation_fraction > 0 where the kernel has no FMA share (forward buckets
//     whose key tile is not a multiple of 128; the KV-cache kernel);
//   * size limits (at most 2^31 - 512 rows of q and of k/v, and keys of a KV cache; tile
//     counts in the messages).
// A CUDA call runs on q's device: it makes that device current for the call, then makes the
// thread's previous device current again, unless that device has no CUDA context yet (a thread
// that never used CUDA): restoring would create one there (hundreds of MiB), so the thread stays
// on q's device (cudaGetDevice then says so). release_cached_memory() does the same.
#pragma once

#include <cstddef>
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
  /// headdim_v). Must be finite, > 0 and at most FLT_MAX / log2(e) (about 2.36e38: the kernels
  /// scale in log2 units); with softcap, softmax_scale / softcap must be at least FLT_MIN.
  std::optional<float> softmax_scale;
  bool causal = false;            ///< bottom-right aligned; same as window (-1, 0)
  int32_t window_size_left = -1;  ///< -1 = unbounded; any other negative value is an error
  int32_t window_size_right = -1; ///< -1 = unbounded; any other negative value is an error
  float softcap = 0.0f;           ///< 0 = off; else s -> softcap * tanh(s / softcap); must be
                                  ///< >= 0 with softcap * log2(e) a finite float

  /// Learnable sink: fp32 (num_heads,), a logit in the units of s (after softmax_scale/softcap).
  std::optional<TensorView> sink;

  // ---- varlen (both cu_seqlens set, or neither) ----
  std::optional<TensorView> cu_seqlens_q;  ///< int32 (batch + 1), non-decreasing, starts at 0
  std::optional<TensorView> cu_seqlens_k;  ///< int32 (batch + 1), non-decreasing, starts at 0
  std::optional<TensorView> seqused_k;     ///< int32 (batch,): keys used per sequence (<= its length)
  int32_t max_seqlen_q = 0;                ///< varlen: upper bound of the q lengths, > 0 (batch > 0;
                                           ///< a batch of empty sequences passes 1); batched: 0 or
                                           ///< seqlen_q
  int32_t max_seqlen_k = 0;                ///< varlen: upper bound of the k lengths, > 0 likewise;
                                           ///< batched: 0 or seqlen_k

  // ---- FlashAttention-4 softmax knobs (paper Sec. 3: software exp2, lazy rescaling) ----
  /// Lazy-rescaling threshold tau in log2 units: the running row max is only raised when it grows
  /// by more than tau; 0 = classic always-rescale. Must be in [0, 8] (P <= 2^tau must stay
  /// representable in bf16/fp16; the same bound applies to fp32); default 8.
  float rescale_threshold = 8.0f;
  /// Share of exp2 evaluations done by FlashAttention-4's software exp2 (a degree-3 polynomial on
  /// the FMA pipe, src/core/exp2.h) instead of the hardware unit, picked by key-column position
  /// within a key tile. Must be a multiple of 1/16 in [0, 1]. Unset = the tuned default of the
  /// kernel that runs (src/hopper/fwd/tuning_fwd.h).
  std::optional<float> exp2_emulation_fraction;

  Backend backend = Backend::kAuto;
};

struct BackwardOptions : AttentionOptions {
  /// Bitwise-reproducible dq/dk/dv (fixed summation order). (forward() and forward_with_kvcache()
  /// are bitwise repeatable on one device without it: their partial results merge in a fixed
  /// order. The exception: a stream-K forward whose cooperative launch the device refuses, e.g.
  /// under MPS, runs whole tiles instead, which round differently.)
  bool deterministic = false;
  /// Device scratch for the CUDA backward from the caller, e.g. a framework's caching allocator,
  /// so the memory goes back to it after the call (PyTorch's autograd path passes one above 4 MiB):
  /// a 1-D contiguous tensor of any dtype on q's device whose data address is a multiple of 256,
  /// holding at least backward_workspace_size() bytes. Overwritten (its contents need not be
  /// anything); it must stay allocated until the backward's kernels have run (stream order) and
  /// share no memory with the call's other tensors. Unset: fa4 uses the scratch it keeps
  /// (SCRATCH MEMORY above). The CPU implementations need none: a workspace is then checked and
  /// not used.
  std::optional<TensorView> workspace;
};

/// The largest explicit KVCacheOptions::num_splits the CUDA decode kernel runs (its merge reads one
/// partial per split).
inline constexpr int32_t kMaxNumSplits = 256;

/// Options of forward_with_kvcache (flash-attn's flash_attn_with_kvcache): everything of
/// AttentionOptions except varlen (cu_seqlens_q/k, seqused_k, max_seqlen_q/k must stay unset),
/// plus the cache description below. See forward_with_kvcache for the layouts and the rules.
struct KVCacheOptions : AttentionOptions {
  /// (batch, seqlen_new, num_heads_kv, headdim), dtype of q: keys written into the cache, in
  /// place, at key positions cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 of sequence b
  /// BEFORE attending. k_new and v_new: both or neither; they require cache_seqlens.
  std::optional<TensorView> k_new;
  /// (batch, seqlen_new, num_heads_kv, headdim_v), dtype of q: the values appended with k_new.
  std::optional<TensorView> v_new;
  /// int32 (batch,): keys already in the cache per sequence, each in [0, key_capacity -
  /// seqlen_new]. Unset: every sequence holds key_capacity keys (then k_new is not allowed).
  /// The caller's tensor is never modified (advance it yourself after an append).
  std::optional<TensorView> cache_seqlens;
  /// int32 (batch,): dense cache only: q's sequence b uses cache sequence cache_batch_idx[b], in
  /// [0, batch_cache); with k_new the values must be distinct (two sequences appending into one
  /// cache row would race). Unset: sequence b uses cache sequence b (batch_cache == batch).
  /// An error together with page_table.
  std::optional<TensorView> cache_batch_idx;
  /// int32 (batch, max_pages), the page dim contiguous: paged cache. Key j of sequence b is slot
  /// j % page_size of page page_table[b][j / page_size]; entries for p >= ceil(seqlen_k(b) /
  /// page_size) are never read (may hold anything, e.g. -1).
  std::optional<TensorView> page_table;
  /// Split-KV count of the CUDA decode kernel: 0 = automatic, >= 1 exactly that many key splits
  /// (then combined). Must be >= 0; on CUDA at most kMaxNumSplits (above it kUnsupported). The
  /// CPU implementations need no split (any count >= 0 gives the same result, as a split count
  /// does up to rounding); on CUDA, results of different split counts agree up to rounding, and one
  /// count's result is bitwise repeatable on one device (the order in which the splits merge can
  /// depend on how many thread-block clusters the device schedules, so two GPU models may differ
  /// in the last bits).
  int32_t num_splits = 0;
};

/// Forward. Writes out and lse. Throws fa4::Error (nothing written) on bad input.
void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
             const TensorView& lse, const AttentionOptions& options = {});

/// Backward. dout and out: layout of out, dtype of q; lse: as returned by forward(). Writes dq
/// (layout and dtype of q), dk (of k), dv (of v); dk/dv are summed over the query heads that share
/// each KV head. dsink: fp32 (num_heads,), required iff options.sink is set. Fully masked rows give
/// zero gradients. Throws fa4::Error (nothing written; CPU kInternal: see ERRORS) on bad input.
/// Algorithm: FlashAttention-2's backward (Dao 2023) in FlashAttention-3's Hopper form (arXiv
/// 2407.08608), deterministic mode as in FlashAttention-4 (arXiv 2603.05451).
void backward(const TensorView& dout, const TensorView& q, const TensorView& k,
              const TensorView& v, const TensorView& out, const TensorView& lse,
              const TensorView& dq, const TensorView& dk, const TensorView& dv,
              const BackwardOptions& options = {},
              const std::optional<TensorView>& dsink = std::nullopt);

/// The bytes of BackwardOptions::workspace that backward() needs with these arguments: 0 where it
/// needs none (the CPU implementations; a problem with neither query rows nor keys; a batched one
/// without query rows). Ask with the
/// backward's exact arguments and options: deterministic mode and the device (its SM count) change
/// the size. Validates the arguments as backward() does (throws its errors, kUnsupported
/// included); options.workspace, if set, is checked as backward() checks it, except for its size.
/// Runs and writes nothing.
size_t backward_workspace_size(const TensorView& dout, const TensorView& q, const TensorView& k,
                               const TensorView& v, const TensorView& out, const TensorView& lse,
                               const TensorView& dq, const TensorView& dk, const TensorView& dv,
                               const BackwardOptions& options = {},
                               const std::optional<TensorView>& dsink = std::nullopt);

/// Attention of new queries against a KV cache, with an optional in-place append of new keys and
/// values first (flash-attn's flash_attn_with_kvcache; decoding and chunked prefill). Writes the
/// appended cache rows (k_new/v_new given), out and lse. Inference only: there is no backward.
///
/// LAYOUTS (the last dim contiguous, other strides free):
///   q     (batch, seqlen_q, num_heads, headdim)
///   out   (batch, seqlen_q, num_heads, headdim_v)      dtype of q
///   lse   (batch, num_heads, seqlen_q)                  fp32, natural log
///   dense cache (no page_table):
///     k_cache (batch_cache, seqlen_cache, num_heads_kv, headdim)
///     v_cache (batch_cache, seqlen_cache, num_heads_kv, headdim_v)
///     batch_cache == batch without cache_batch_idx; any batch_cache >= 1 with it.
///     key_capacity = seqlen_cache.
///   paged cache (options.page_table (batch, max_pages)):
///     k_cache (num_pages, page_size, num_heads_kv, headdim)     any page_size >= 1
///     v_cache (num_pages, page_size, num_heads_kv, headdim_v)
///     key_capacity = max_pages * page_size.
/// dtypes: q, k_cache, v_cache, k_new, v_new and out all equal (bf16, fp16 or fp32); index tensors
/// int32 on q's device. num_heads must be a multiple of num_heads_kv (GQA/MQA as in forward()).
///
/// SEMANTICS. With seqlen_new = k_new.shape[1] (0 without k_new), sequence b attends to keys
/// [0, seqlen_k(b)) of its cache sequence, where
///     seqlen_k(b) = (cache_seqlens ? cache_seqlens[b] : key_capacity - seqlen_new) + seqlen_new,
/// after rows k_new[b, t] / v_new[b, t] were copied (bitwise) to key position cache_seqlens[b] + t.
/// Cache rows outside those positions are never written. Masks (causal, windows) are bottom-right
/// aligned per sequence: query i sees key j iff key_visible(i, j, seqlen_q, seqlen_k(b), mask), so
/// with causal the last query sees every cached key. softmax_scale, softcap, sink,
/// rescale_threshold, exp2_emulation_fraction and backend: as in forward(), except that the CUDA
/// decode kernel takes no exp2 emulation share (exp2_emulation_fraction must be unset or 0 on CUDA
/// tensors, else kUnsupported; it is bandwidth-bound); the edge semantics of
/// forward() hold per sequence (seqlen_k(b) == 0: out row 0, lse -inf or the sink). batch == 0:
/// nothing is read or written; seqlen_q == 0 with k_new: only the append is done.
///
/// ERRORS. fa4::Error, nothing written, for every rule above plus: any varlen option set
/// ("varlen q is not supported by forward_with_kvcache"), k_new without v_new (or the reverse),
/// k_new without cache_seqlens, page_table together with cache_batch_idx, seqlen_new >
/// key_capacity, num_splits < 0, and (k_new given) a k_cache/v_cache stride of 0 on a dim of
/// size > 1 (they are outputs then).
/// CPU (host-resident) index tensors are checked before anything is written: cache_seqlens[b] in
/// [0, key_capacity - seqlen_new]; cache_batch_idx[b] in [0, batch_cache), distinct with k_new;
/// page_table[b][p] in [0, num_pages) for every p < ceil(seqlen_k(b) / page_size); with k_new and
/// page_table, no two sequences may append into the same (page, slot). CUDA (device-resident)
/// index tensors are NOT read by the host (a sync per call, and impossible under CUDA graph
/// capture): the kernels check the same rules per sequence, give a sequence that breaks one no
/// output, never read or write out of bounds, and record the rule for
/// check_async_errors() — as for device-resident varlen indices. A sequence so skipped is not
/// appended either. Not detected on CUDA (the caller's responsibility: they race): overlapping
/// paged appends and, with k_new, repeated cache_batch_idx values. The report names every rule
/// broken (each has its own flag); a sequence breaking several may be skipped at the first.
void forward_with_kvcache(const TensorView& q, const TensorView& k_cache,
                          const TensorView& v_cache, const TensorView& out, const TensorView& lse,
                          const KVCacheOptions& options = {});

/// Reports invalid device-resident indices met by an earlier kernel on CUDA device `device_index`:
/// varlen cu_seqlens_q/k and seqused_k, and forward_with_kvcache's cache_seqlens, cache_batch_idx
/// and page_table. They are not read by the host (that would cost a sync
/// per call and break CUDA graph capture): the kernel checks them, computes nothing for a sequence
/// that breaks a rule (its out/lse rows stay unwritten) and records the rule in host-visible
/// memory. This throws fa4::Error(kInvalidArgument) naming the broken rules and clears the record
/// (a kernel still running may set it again: an error is reported at least once). It does not
/// wait for the GPU: synchronise the stream first to see the calls issued on it. Every CUDA
/// forward() that launches a kernel calls it first, so an earlier error fails the next such call
/// on the device (which then writes nothing), whichever stream or thread made the earlier one;
/// (forward_with_kvcache() and backward() too); forward_support() does not report it. Without
/// CUDA, before any such CUDA call, or for an index no kernel ran on (negative, or no such device:
/// nothing is recorded there), a no-op.
void check_async_errors(int device_index);

/// Frees the scratch fa4 keeps for eager CUDA calls on device `device_index` (SCRATCH MEMORY
/// above), as torch.cuda.empty_cache() does for PyTorch's cache: it takes every stream's cached
/// buffers that no call in another thread is using at that moment out of the cache, waits for
/// the device (cudaDeviceSynchronize on its primary context; fa4 calls on other devices go on
/// meanwhile), frees them and trims the memory pool. Later calls allocate again (the next call on
/// each stream is slower). Captured calls' scratch is kept (graphs may still replay). Returns
/// without waiting when fa4 never kept anything for that device (without CUDA, or before any CUDA
/// call there); otherwise it may wait even if nothing is cached at the moment. If the wait is
/// refused, the buffers stay cached (kCudaError; a later call frees them).
/// Do not call it while a stream of the device is being captured into a graph (CUDA refuses the
/// wait and the capture is invalidated), while a kernel that never ends runs on the device (the
/// wait would not return), or while fa4 calls run on streams of another context of the device
/// (green contexts: the wait does not cover them). Errors: kInvalidArgument for device_index < 0;
/// kCudaError if CUDA refuses the wait or a free.
void release_cached_memory(int device_index);

/// Answers "would forward() run on these arguments, and with which kernel?" without running.
/// Returns an empty string if supported plus the kernel name in *kernel_name; otherwise the
/// message forward() would throw (the C ABI's fa4_forward_support also returns its ErrorCode).
/// Never throws; reads host-resident index contents as the call's validation does.
std::string forward_support(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out, const TensorView& lse,
                            const AttentionOptions& options = {},
                            std::string* kernel_name = nullptr);

/// forward_support() for forward_with_kvcache(): "" if it would run (the kernel name in
/// *kernel_name: "cpu::flash_forward_with_kvcache", "cpu::reference_forward_with_kvcache", the
/// CUDA decode kernel's, or for a chunk of more than 128 query rows per KV head (except a short one,
/// up to 256 rows over at most 1,024 keys, whose 16-row tiles number between half the SMs (a
/// quarter at head dim 128) and all of them: the decode kernel's) over a dense cache,
/// or a paged one whose page size is a multiple of the forward's key tile (128 keys up to head dim
/// 128 and at 192 x 128, 96 at 192, 80 at 256) or, on the 64, 128 and 256 buckets (head dims up to
/// 64, 97-128, 193-256; chunks of at least 96, 64 and any query tokens), another power of two from
/// 8 rows (then the gathering forward kernel, "hopper::fwd_..._gather"), the
/// forward kernel's, "hopper::fwd_...
/// (KV cache)" / "(KV cache, paged)"), otherwise the
/// message forward_with_kvcache() would throw. Reads host-resident index contents (as the call's
/// validation does), runs and writes nothing.
std::string forward_with_kvcache_support(const TensorView& q, const TensorView& k_cache,
                                         const TensorView& v_cache, const TensorView& out,
                                         const TensorView& lse, const KVCacheOptions& options = {},
                                         std::string* kernel_name = nullptr);

}  // namespace fa4
