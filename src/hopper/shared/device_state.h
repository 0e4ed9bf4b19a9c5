// src/hopper/shared/device_state.h — the per-device state the Hopper launches keep across calls, so
// that a call neither synchronises nor reads the environment, and allocates only a pool block
// (large scratch) or where its stream's cached scratch is missing or too small:
//   * scratch: the dynamic schedule's claim counter and the stream-K flags and partials; and,
//     separately (ScratchKind), the backward's workspace and the decode's partials and arrival
//     counters.
//     Eager calls: scratch that must start zeroed (counters and flags, KBs; the kernels leave them
//     zero when they finish: the last claim resets the counter, a combiner the flags it consumed)
//     and overwritten scratch (the decode's partials at any size; the backward's workspace and the
//     stream-K partials up to kEagerCachedMaxBytes) is one buffer per (device, stream, kind),
//     zeroed once, when it is allocated (on the first call that needs it, then grown by doubling;
//     outgrown buffers are kept until release_cached_memory, so growth never waits). A larger
//     backward workspace (a training shape's, up to GBs; unless the caller gave one) or stream-K
//     partials (prefill shapes) are taken from fa4's stream-ordered memory pool of the device for the call
//     and given back to it after the launch (cudaMallocFromPoolAsync / cudaFreeAsync on the call's
//     stream): the pool keeps what it was given back, for any stream's next call, so the memory
//     held is the largest amount the device's calls used at once, not one buffer per stream.
//     release_cached_memory frees both.
//     Captured calls: a call made while its stream is being captured into a CUDA graph gets a buffer of its own, shared with
//     the calls captured after it on the same stream in the same capture (the capture orders them
//     as the stream orders eager calls; so a graph of 32 same-shaped layers' decode calls holds
//     one buffer per kind, not 32, plus one each time a later call needs a larger one; replacing a
//     stream's capture dependencies (cudaStreamSetCaptureDependencies) or editing the graph's
//     edges between the calls drops that order and is not supported): zeroed at capture for what
//     must start zeroed (a few KB of counters and flags), so a replay runs no memset, and for
//     scratch that every launch overwrites (split partials, a small backward's workspace) up to
//     kGraphOwnedScratchMaxBytes, so a replay runs no graph-memory allocation and free nodes
//     either: the serving shapes' graphs hold their kernels alone. Such a buffer is retained by
//     fa4 for the life of the process (never freed, never given to another capture) while the
//     device's retained buffers stay within kRetainedCaptureScratchBytes; past that it belongs to
//     the graph through a CUDA user object and is reused once the graph is destroyed. A graph
//     that holds a user object costs every replay GPU time (CUDA tracks the reference until the
//     launched work completes: about 1.3 us of idle GPU between replays on the H200, measured with
//     the same kernel; bench/results/history.md), which the serving shapes' replays, a few to
//     ten us, cannot afford; retained buffers cost nothing per replay but are never reclaimed. Larger
//     overwritten scratch (a training shape's backward workspace) is graph memory (allocation and
//     free nodes, memory CUDA shares between graphs). Not supported: two executable graphs
//     instantiated from one captured graph running at the same time (they would share the
//     buffers; the replays of one executable graph are ordered by CUDA). Where the graph also
//     holds graph memory, CUDA refuses the second instantiation itself.
//   * the asynchronous error record: a kernel that meets varlen or KV-cache indices breaking the
//     rules (cu_seqlens_q/k, seqused_k, cache_seqlens, cache_batch_idx, page_table; checked on the
//     device, where the host cannot read them without a sync) computes nothing for that sequence
//     and sets the rule's flag byte here, in mapped host memory; the next CUDA call on the device
//     (forward, backward, forward_with_kvcache), or fa4::check_async_errors, reports every rule
//     flagged (at least once: a kernel still running when the record is cleared may set its flag
//     again; calls on the device from several threads share the record, so the report may come
//     from another thread's call).
// Not supported: cudaDeviceReset while fa4 is loaded (the cached buffers would dangle).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <optional>

namespace fa4::hopper {

/// Overwritten scratch of a captured call up to this size is a buffer set aside at capture
/// (retained or graph-owned, see above): the automatic split-KV partials of serving shapes are KBs
/// to a few MB, d128 stream-K partials about 9 MB. A graph holds one such buffer per (stream, kind)
/// it captured calls on, plus one each time a later call there needed a larger one (graph-owned
/// buffers of destroyed graphs are reused, not freed). Larger scratch (d256 stream-K partials,
/// about 18 MB; a training shape's backward workspace; many explicit splits) becomes graph memory,
/// which graphs share.
inline constexpr size_t kGraphOwnedScratchMaxBytes = size_t(16) << 20;

/// Captured calls' scratch fa4 retains per device for the life of the process (see above), at most:
/// a serving engine's few dozen captured batch sizes take a few MB (arrival counters and flags,
/// a few KB each; split-KV partials of small batches, up to about a MB); past it, buffers are
/// graph-owned (user objects).
inline constexpr size_t kRetainedCaptureScratchBytes = size_t(64) << 20;

/// An eager backward workspace or stream-K partials up to this size are cached per (device,
/// stream, kind), no cost per call (a small backward's workspace); larger ones come from the
/// device's pool per call (about a microsecond of host time, small beside the kernels that need
/// that much). The decode's split partials are always cached per stream: a serving step's
/// eager calls pay no pool round trip. A stream that is destroyed leaves its buffers (for these
/// two kinds at most about twice this each, with the outgrown ones) until release_cached_memory.
inline constexpr size_t kEagerCachedMaxBytes = size_t(4) << 20;

/// Scratch of one launch (see above), given back by release_scratch after its launches.
struct LaunchScratch {
  char* ptr = nullptr;
  /// Stream-ordered (captured graph memory, or a pool allocation): release_scratch frees it with
  /// cudaFreeAsync on the launch's stream (a free node when captured).
  bool stream_ordered = false;
  /// The eager cache entry this launch holds (release_cached_memory leaves it alone until
  /// release_scratch); nullptr otherwise.
  void* cached = nullptr;
};

/// Which launches share a buffer. The forward's buffer must stay zero between launches (its kernels
/// leave the counter and flags zero); the backward's workspace (dQ accumulator, row statistics,
/// semaphores) is overwritten by every backward, so it has a buffer of its own.
/// The decode's split partials (decode/) are overwritten by every split-KV decode: a third buffer.
/// Its per-tile arrival counters must stay zero between launches (the last arriving split resets
/// its tile's) and their number varies with the shape, so they get a fourth buffer, all of it zero.
/// The forward's stream-K partials (overwritten by every split launch) have a buffer of their own
/// too, so the zeroed flags can be captured apart from them.
enum class ScratchKind : int { kForward = 0, kBackward = 1, kDecode = 2, kDecodeArrivals = 3, kForwardPartials = 4 };

/// At least `bytes` bytes for a launch on (device, stream), the first `zeroed_bytes` of them zero.
/// The current device must be `device`. Throws fa4::Error(kCudaError) if it cannot be had.
LaunchScratch acquire_scratch(int device, cudaStream_t stream, size_t bytes, size_t zeroed_bytes,
                              ScratchKind kind = ScratchKind::kForward);

/// After the launches that use `s` were enqueued, on the same stream. Throws fa4::Error(kCudaError)
/// if a stream-ordered free is refused (the cache entry is released first).
void release_scratch(const LaunchScratch& s, cudaStream_t stream);

/// Holds a launch's scratch and releases it when it goes out of scope, also when the launch code
/// throws (errors of that release are dropped; release() reports them on the normal path).
class ScratchHold {
 public:
  explicit ScratchHold(cudaStream_t stream) : stream_(stream) {}
  ~ScratchHold();
  ScratchHold(const ScratchHold&) = delete;
  ScratchHold& operator=(const ScratchHold&) = delete;
  /// Takes `s` (the hold must be empty).
  char* hold(const LaunchScratch& s) {
    s_ = s;
    return s_.ptr;
  }
  char* ptr() const { return s_.ptr; }
  /// release_scratch now (once).
  void release();

 private:
  cudaStream_t stream_;
  LaunchScratch s_{};
};

/// Whether `device`'s primary context is active (cuDevicePrimaryCtxGetState); nullopt where the
/// driver cannot be asked.
std::optional<bool> primary_context_state(int device);

/// primary_context_state, true where unknown. Making a device current creates its context
/// (hundreds of MiB on the GPU), so fa4 gives a thread its previous device back only where that
/// device has one: a thread that never used CUDA, calling on cuda:3, stays on device 3 instead of
/// getting a context on device 0 (PyTorch's device guard creates none either).
bool has_primary_context(int device);

/// Makes `device` current for the scope (launches, scratch and smem limits are per device) and
/// gives the thread's previous device back afterwards where that device has a context
/// (has_primary_context). status(): cudaSetDevice's error, if it failed (the scope then runs on
/// the previous device, and nothing is given back).
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) : cur_(device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (prev_ != device) status_ = cudaSetDevice(device);
    if (status_ != cudaSuccess) cur_ = prev_;
  }
  ~ScopedDevice() {
    if (prev_ >= 0 && prev_ != cur_ && has_primary_context(prev_)) cudaSetDevice(prev_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int prev_ = -1;
  int cur_;
  cudaError_t status_ = cudaSuccess;
};

/// fa4::release_cached_memory for the Hopper kernels: waits for `device` (cudaDeviceSynchronize),
/// then frees its eager scratch that no call holds (every stream's buffers, the outgrown ones) and
/// trims its pool to nothing in use. Captured calls' scratch is not touched. A no-op when nothing
/// was ever cached on `device`. Throws fa4::Error(kCudaError) if CUDA refuses (e.g. a stream of
/// the device is being captured: the wait is not allowed then).
void release_cached_memory(int device);

/// The eager scratch of `device` now (tests): cached buffers (per stream, and outgrown ones) and
/// their bytes, those a call holds, and the pool's reserved and used bytes.
struct EagerScratchStats {
  size_t cached = 0;
  size_t cached_bytes = 0;
  size_t held = 0;
  size_t pool_reserved_bytes = 0;
  size_t pool_used_bytes = 0;
};
EagerScratchStats eager_scratch_stats(int device);

/// The buffers of captured calls so far (tests): graph-owned ones created, reused after their graph
/// was destroyed, free now (given back by destroyed graphs; CUDA runs the give-back shortly after
/// the destruction, on a thread of its own); retained ones (count and bytes, all devices); and the
/// captured calls that shared the buffer of an earlier call on their stream in the same capture.
struct CaptureScratchStats {
  size_t created = 0;
  size_t reused = 0;
  size_t free = 0;
  size_t retained = 0;
  size_t retained_bytes = 0;
  size_t shared = 0;
};
CaptureScratchStats capture_scratch_stats();

/// Forward launches enqueued (eager or captured) that claim their tiles from the counter
/// (fwd/launch_fwd.cuh), so far: the tests check that the "schedule" override's dynamic choice ran.
void count_fwd_dynamic_launch();
/// Forward launches whose tiles packed a GQA group (fwd/launch_fwd.cuh): the tests check that a
/// pack-GQA comparison ran packed.
void count_fwd_pack_gqa_launch();
uint64_t fwd_pack_gqa_launches();
uint64_t fwd_dynamic_launches();

/// The broken rules a kernel can record (check_async_errors). Each is one byte of the device's
/// 8-byte error record in mapped host memory, set to 1 with a plain store (report_async_error):
/// PCIe need not carry atomics, and a read-modify-write of one shared word lost the bits another
/// CTA or another call set at the same moment; stores of 1 to separate bytes lose none.
enum AsyncError : uint32_t {
  kBadCuSeqlensQ = 1u << 0,  ///< cu_seqlens_q: not 0 at [0], decreasing, past total_q, or a length > max_seqlen_q
  kBadCuSeqlensK = 1u << 1,  ///< cu_seqlens_k: likewise with total_k, max_seqlen_k
  kBadSequsedK = 1u << 2,    ///< seqused_k[b] outside [0, cu_seqlens_k[b+1] - cu_seqlens_k[b]]
  kBadCacheSeqlens = 1u << 3,   ///< cache_seqlens[b] outside [0, key_capacity - seqlen_new]
  kBadCacheBatchIdx = 1u << 4,  ///< cache_batch_idx[b] outside [0, k_cache.shape[0])
  kBadPageTable = 1u << 5,      ///< a used page_table entry outside [0, num_pages)
};
static_assert(kBadPageTable < (1u << 8), "one flag byte per rule: the record holds 8");

/// Device address of `device`'s error record: 8 flag bytes of mapped host memory, byte i for
/// AsyncError bit i (allocated on first use).
uint8_t* async_error_record(int device);

#if defined(__CUDACC__)
/// Records the rules of `bits` (AsyncError) in an error record (async_error_record).
__device__ __forceinline__ void report_async_error(uint8_t* record, uint32_t bits) {
  volatile uint8_t* flags = record;
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (bits & (1u << i)) flags[i] = 1;
}
#endif

/// Throws fa4::Error(kInvalidArgument) describing the bits set by earlier kernels on `device`
/// and clears them; returns if none is set (or nothing was ever launched there). Reads host
/// memory only: a kernel still running is not waited for.
void check_async_errors(int device);

}  // namespace fa4::hopper
