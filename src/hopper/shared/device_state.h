// src/hopper/shared/device_state.h — the per-device state the Hopper launches keep across calls, so
// that a call neither allocates (after the first one on its stream), synchronises nor reads the
// environment:
//   * scratch: the dynamic schedule's claim counter and the stream-K flags and partials; and,
//     separately (ScratchKind), the backward's workspace. The
//     kernels leave the counter and the flags zeroed when they finish (the last claim resets the
//     counter, a combiner resets the flags it consumed), so eager calls share one buffer per
//     (device, stream), zeroed once, when it is allocated (on the first call that needs it, then
//     grown by doubling; outgrown buffers are kept, not freed, so growth never waits). A call made
//     while its stream is being captured into a CUDA graph gets a buffer of its own, shared with
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
//   * the asynchronous error word: a kernel that meets varlen indices breaking the rules
//     (cu_seqlens_q/k, seqused_k; checked on the device, where the host cannot read them without a
//     sync) computes nothing for that sequence and sets a bit here, in mapped host memory; the next
//     forward on the device, or fa4::check_async_errors, reports it (at least once: bits set by
//     several CTAs at once may merge, and a kernel still running when the word is cleared may set
//     its bit again).
// Not supported: cudaDeviceReset while fa4 is loaded (the cached buffers would dangle).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

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

/// Scratch of one launch (see above).
struct LaunchScratch {
  char* ptr;
  bool graph_memory;  ///< captured graph memory (an allocation node): release_scratch frees it (a free node)
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

/// After the launch that used `s`, on the same stream.
void release_scratch(const LaunchScratch& s, cudaStream_t stream);

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

/// Bits of the asynchronous error word.
enum AsyncError : uint32_t {
  kBadCuSeqlensQ = 1u << 0,  ///< cu_seqlens_q: not 0 at [0], decreasing, past total_q, or a length > max_seqlen_q
  kBadCuSeqlensK = 1u << 1,  ///< cu_seqlens_k: likewise with total_k, max_seqlen_k
  kBadSequsedK = 1u << 2,    ///< seqused_k[b] outside [0, cu_seqlens_k[b+1] - cu_seqlens_k[b]]
  kBadCacheSeqlens = 1u << 3,   ///< cache_seqlens[b] outside [0, key_capacity - seqlen_new]
  kBadCacheBatchIdx = 1u << 4,  ///< cache_batch_idx[b] outside [0, k_cache.shape[0])
  kBadPageTable = 1u << 5,      ///< a used page_table entry outside [0, num_pages)
};

/// Device address of `device`'s error word (mapped host memory, allocated on first use).
uint32_t* async_error_word(int device);

/// Throws fa4::Error(kInvalidArgument) describing the bits set by earlier kernels on `device`
/// and clears them; returns if none is set (or nothing was ever launched there). Reads host
/// memory only: a kernel still running is not waited for.
void check_async_errors(int device);

}  // namespace fa4::hopper
