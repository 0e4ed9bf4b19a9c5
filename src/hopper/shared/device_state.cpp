// src/hopper/shared/device_state.cpp — launch scratch and the asynchronous error record (device_state.h).
#include "hopper/shared/device_state.h"

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/overrides.h"
#include "fa4/error.h"

namespace fa4::hopper {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorCode::kCudaError, std::string("fa4 (hopper): ") + what + ": " + cudaGetErrorString(e));
  }
}

/// Lets this thread allocate while some stream is being captured: cudaMalloc, cudaHostAlloc and a
/// synchronous wait on a private stream are refused in the default (global) capture mode, and
/// none of them touches the captured stream.
struct RelaxedCapture {
  cudaStreamCaptureMode prev = cudaStreamCaptureModeRelaxed;
  RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&prev); }
  ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&prev); }
};

std::mutex g_mu;
/// An eager call's cached buffer (device_state.h). `holds`: calls between acquire_scratch and
/// release_scratch, whose launches may not be enqueued yet (release_cached_memory skips them).
/// Raised under g_mu; lowered without it (release order: the holder's launches come before), as
/// the holder's last touch of the record, which a release_cached_memory seeing 0 may then delete.
struct CachedBuffer {
  int device;
  char* ptr;
  size_t bytes;
  std::atomic<int> holds{0};
};
/// Eager scratch per (device, stream id, kind): cudaStreamGetId, unlike the handle, is unique for
/// the life of the process and tells each thread's per-thread default stream apart.
std::map<std::tuple<int, unsigned long long, int>, CachedBuffer*> g_eager;
std::vector<CachedBuffer*> g_outgrown;      // replaced by a larger one, kept until release_cached_memory
std::map<int, cudaStream_t> g_zero_stream;  // a private stream per device for the one-time memset
std::map<int, cudaMemPool_t> g_pool;        // per device, made on first use; nullptr: no pool support

/// Zero fill of `bytes` at p on device's private non-blocking stream (never the caller's; made on
/// first use), waited for. Only when a buffer is allocated or handed to a new capture, never per
/// call. Called with g_mu held.
cudaError_t zero_on_private_stream(int device, char* p, size_t bytes) {
  RelaxedCapture relaxed;  // another thread may be capturing in global mode
  cudaStream_t& zs = g_zero_stream[device];
  if (!zs) {
    const cudaError_t e = cudaStreamCreateWithFlags(&zs, cudaStreamNonBlocking);
    if (e != cudaSuccess) return e;
  }
  const cudaError_t e = cudaMemsetAsync(p, 0, bytes, zs);
  return e == cudaSuccess ? cudaStreamSynchronize(zs) : e;
}

/// A scratch buffer's size for `bytes`: a power of two of at least 4 KiB, so a buffer that grows
/// is replaced only a few times (the doublings cost at most as much again as the final size).
size_t scratch_capacity(size_t bytes) {
  size_t size = 4096;
  while (size < bytes) size *= 2;
  return size;
}

/// cudaMalloc + (when `zero`) zero_on_private_stream. Called with g_mu held.
char* alloc_scratch(int device, size_t bytes, bool zero) {
  RelaxedCapture relaxed;  // another thread may be capturing in global mode
  char* p = nullptr;
  check(cudaMalloc(reinterpret_cast<void**>(&p), bytes), "cudaMalloc (launch scratch)");
  if (!zero) return p;  // (partials, the backward's workspace: every launch writes what it reads)
  const cudaError_t e = zero_on_private_stream(device, p, bytes);
  if (e != cudaSuccess) {
    cudaFree(p);
    check(e, "zeroing the launch scratch");
  }
  return p;
}

/// The device's pool for large eager scratch (device_state.h), made on first use; nullptr where the
/// device has no stream-ordered allocator or refuses a pool (that scratch is then cached per
/// stream too, as the rest). A block freed on one stream is not handed to another stream's call
/// before the free has run (no internal dependencies: they would make independent streams wait
/// for each other); the pool grows instead. It keeps
/// what is given back (release threshold: all), as PyTorch's cudaMallocAsync backend does: by
/// default a pool returns memory to the system at every synchronisation, and the next call maps it
/// again. g_mu held.
cudaMemPool_t scratch_pool(int device) {
  const auto found = g_pool.find(device);
  if (found != g_pool.end()) return found->second;
  RelaxedCapture relaxed;  // another thread may be capturing in global mode
  int supported = 0;
  check(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device),
        "cudaDeviceGetAttribute (memory pools)");
  cudaMemPool_t pool = nullptr;
  if (supported) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    uint64_t keep = UINT64_MAX;
    int no = 0;
    if (cudaMemPoolCreate(&pool, &props) != cudaSuccess) {
      cudaGetLastError();
      pool = nullptr;
    } else if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess ||
               cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &no) != cudaSuccess) {
      cudaGetLastError();
      cudaMemPoolDestroy(pool);
      pool = nullptr;
    }
  }
  g_pool[device] = pool;
  return pool;
}

/// A buffer owned by a captured graph (see acquire_scratch). The destructor callback of the
/// graph's user object may make no CUDA call: it hands the buffer back through the returned list,
/// and the next captured call moves it to g_capture_free for reuse.
struct CaptureBuffer {
  int device;
  char* ptr;
  size_t bytes;
};
/// Given back by destroyed graphs. On the heap and never freed: CUDA's thread may call give_back
/// while the process runs its static destructors.
struct ReturnedBuffers {
  std::mutex mu;
  std::vector<CaptureBuffer> list;
};
ReturnedBuffers& returned_buffers() {
  static ReturnedBuffers* r = new ReturnedBuffers;
  return *r;
}
std::vector<CaptureBuffer> g_capture_free;  // ready for the next capture (g_mu)
CaptureScratchStats g_capture_stats;        // (g_mu)

void give_back(void* record) {  // CUDA's internal thread, once the graph and its work are gone
  auto* b = static_cast<CaptureBuffer*>(record);
  ReturnedBuffers& r = returned_buffers();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.list.push_back(*b);
  }
  delete b;
}

/// Moves the buffers destroyed graphs gave back to g_capture_free. g_mu held.
void collect_returned() {
  ReturnedBuffers& r = returned_buffers();
  std::lock_guard<std::mutex> lock(r.mu);
  g_capture_free.insert(g_capture_free.end(), r.list.begin(), r.list.end());
  r.list.clear();
}

/// Scratch for the calls captured into `graph` on one stream (see g_captured): a plain device
/// buffer (the smallest free one that fits, else a new one), zeroed now when `zero`, whose lifetime
/// a user object ties to the graph.
/// A replay then launches the kernels alone: no memset node (the kernels leave zeroed scratch zero
/// for the next replay, and CUDA orders the replays of one executable graph) and no graph-memory
/// allocation and free nodes (together about 0.6 us of a replay on the H200). g_mu held.
CaptureBuffer capture_owned(int device, cudaGraph_t graph, size_t bytes, bool zero) {
  collect_returned();
  size_t best = g_capture_free.size();
  for (size_t i = 0; i < g_capture_free.size(); ++i) {
    const CaptureBuffer& b = g_capture_free[i];
    if (b.device == device && b.bytes >= bytes &&
        (best == g_capture_free.size() || b.bytes < g_capture_free[best].bytes))
      best = i;
  }
  CaptureBuffer buf{device, nullptr, 0};
  if (best < g_capture_free.size()) {
    buf = g_capture_free[best];
    g_capture_free.erase(g_capture_free.begin() + std::ptrdiff_t(best));
    // Zeroed again where asked (its last graph's kernels should have left what they zero zero).
    const cudaError_t e = zero ? zero_on_private_stream(device, buf.ptr, buf.bytes) : cudaSuccess;
    if (e != cudaSuccess) g_capture_free.push_back(buf);
    check(e, "zeroing the captured call's scratch");
    ++g_capture_stats.reused;
  } else {
    const size_t size = scratch_capacity(bytes);
    buf = {device, alloc_scratch(device, size, zero), size};
    ++g_capture_stats.created;
  }
  auto* record = new CaptureBuffer(buf);
  cudaUserObject_t owner = nullptr;
  cudaError_t e = cudaUserObjectCreate(&owner, record, give_back, 1, cudaUserObjectNoDestructorSync);
  if (e != cudaSuccess) {
    delete record;
    g_capture_free.push_back(buf);
    check(e, "cudaUserObjectCreate (captured scratch)");
  }
  // The graph takes the only reference: the buffer comes back once the graph and every executable
  // made from it are destroyed and their launched work is done.
  e = cudaGraphRetainUserObject(graph, owner, 1, cudaGraphUserObjectMove);
  if (e != cudaSuccess) cudaUserObjectRelease(owner, 1);  // give_back returns the buffer
  check(e, "cudaGraphRetainUserObject (captured scratch)");
  return buf;
}

std::map<int, size_t> g_retained_bytes;  // per device (g_mu)

/// Scratch for a captured call (see acquire_scratch): retained by fa4 (a plain buffer, never freed
/// or handed to another capture) while the device's retained bytes stay within
/// kRetainedCaptureScratchBytes (override "capture_scratch": "graph" never, "retained" always),
/// else owned by `graph` (capture_owned). g_mu held.
CaptureBuffer capture_buffer(int device, cudaGraph_t graph, size_t bytes, bool zero) {
  const int8_t mode = detail::kernel_overrides().capture_scratch;
  const size_t size = scratch_capacity(bytes);
  size_t& kept = g_retained_bytes[device];
  if (mode == 1 || (mode == -1 && kept + size <= kRetainedCaptureScratchBytes)) {
    const CaptureBuffer buf{device, alloc_scratch(device, size, zero), size};
    kept += size;
    ++g_capture_stats.retained;
    return buf;
  }
  return capture_owned(device, graph, bytes, zero);
}

/// The buffer (retained or graph-owned) the last captured call on (device, stream handle, kind) took, and the
/// capture sequence it belongs to: the next call captured on that stream in the same sequence
/// shares it (the capture orders the two calls as the stream would, so the first call's kernels
/// are done with it, and have left its zeroed part zero, before the second's start). Keyed by
/// the handle, not cudaStreamGetId, which a capturing stream may refuse; the capture id (unique
/// for the life of the process) tells apart a later stream with a reused handle, and two threads
/// capturing their per-thread default streams (one handle) only overwrite each other's entry.
struct CapturedShare {
  unsigned long long capture_id = 0;
  cudaGraph_t graph = nullptr;
  CaptureBuffer buf{0, nullptr, 0};
  bool zeroed = false;  ///< all of it zero at the next call's start
};
std::map<std::tuple<int, std::uintptr_t, int>, CapturedShare> g_captured;  // (g_mu)

uint64_t* g_error_records = nullptr;  // mapped host memory, one 8-byte record per device
int g_error_devices = 0;

}  // namespace

CaptureScratchStats capture_scratch_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  collect_returned();
  CaptureScratchStats s = g_capture_stats;
  s.free = g_capture_free.size();
  for (const auto& [device, bytes] : g_retained_bytes) s.retained_bytes += bytes;
  return s;
}

LaunchScratch acquire_scratch(int device, cudaStream_t stream, size_t bytes, size_t zeroed_bytes, ScratchKind kind) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  unsigned long long capture_id = 0;
  cudaGraph_t graph = nullptr;
  check(cudaStreamGetCaptureInfo(stream, &capture, &capture_id, &graph), "cudaStreamGetCaptureInfo");
  if (capture == cudaStreamCaptureStatusActive && (zeroed_bytes > 0 || bytes <= kGraphOwnedScratchMaxBytes)) {
    std::lock_guard<std::mutex> lock(g_mu);
    CapturedShare& share = g_captured[{device, reinterpret_cast<std::uintptr_t>(stream), static_cast<int>(kind)}];
    if (share.capture_id == capture_id && share.graph == graph && share.buf.ptr && share.buf.bytes >= bytes &&
        (zeroed_bytes == 0 || share.zeroed)) {
      ++g_capture_stats.shared;
      // A call that leaves part of it written (zeroed_bytes < bytes) ends the zero guarantee.
      if (zeroed_bytes < bytes) share.zeroed = false;
      return LaunchScratch{share.buf.ptr};
    }
    // A new capture, a larger need, or a zeroed need where the buffer may be written: a buffer of
    // its own (the earlier one stays as it was, retained or the graph's: earlier nodes use it).
    share = {capture_id, graph, capture_buffer(device, graph, bytes, zeroed_bytes > 0),
             zeroed_bytes > 0 && zeroed_bytes >= bytes};
    return LaunchScratch{share.buf.ptr};
  }
  if (capture != cudaStreamCaptureStatusNone) {
    // Larger scratch that every launch overwrites (the backward's dQ accumulator and row
    // statistics of a training shape, up to GBs, never zeroed) is graph memory: allocation and
    // free become nodes of the graph, and CUDA shares the memory between graphs and between the
    // nodes of one graph. (An invalidated capture takes this path too; the capture fails and
    // frees them.)
    LaunchScratch s;
    s.stream_ordered = true;
    check(cudaMallocAsync(reinterpret_cast<void**>(&s.ptr), bytes, stream), "cudaMallocAsync (captured scratch)");
    const cudaError_t e = zeroed_bytes > 0 ? cudaMemsetAsync(s.ptr, 0, zeroed_bytes, stream) : cudaSuccess;
    if (e != cudaSuccess) {
      cudaFreeAsync(s.ptr, stream);
      check(e, "cudaMemsetAsync (captured scratch)");
    }
    return s;
  }
  if (bytes > kEagerCachedMaxBytes && (kind == ScratchKind::kBackward || kind == ScratchKind::kForwardPartials)) {
    cudaMemPool_t pool = nullptr;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      pool = scratch_pool(device);
    }
    if (pool) {
      RelaxedCapture relaxed;  // another thread may be capturing in global mode
      LaunchScratch s;
      s.stream_ordered = true;
      check(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&s.ptr), bytes, pool, stream),
            "cudaMallocFromPoolAsync (launch scratch)");
      return s;
    }
  }
  unsigned long long stream_id = 0;
  check(cudaStreamGetId(stream, &stream_id), "cudaStreamGetId");
  std::lock_guard<std::mutex> lock(g_mu);
  CachedBuffer*& b = g_eager[{device, stream_id, static_cast<int>(kind)}];
  if (!b || b->bytes < bytes) {
    // The old buffer is kept, not freed: kernels queued on the stream, or a call of another thread
    // that took it a moment ago, may still use it, and waiting for them would be a host sync.
    const size_t size = scratch_capacity(bytes);
    char* p = alloc_scratch(device, size, zeroed_bytes > 0);
    auto* grown = new CachedBuffer{device, p, size};
    if (b) g_outgrown.push_back(b);
    b = grown;
  }
  b->holds.fetch_add(1, std::memory_order_relaxed);
  LaunchScratch s;
  s.ptr = b->ptr;
  s.cached = b;
  return s;
}

void release_scratch(const LaunchScratch& s, cudaStream_t stream) {
  if (s.cached) static_cast<CachedBuffer*>(s.cached)->holds.fetch_sub(1, std::memory_order_release);
  if (s.stream_ordered && s.ptr) {
    RelaxedCapture relaxed;  // (eager: another thread may be capturing in global mode)
    check(cudaFreeAsync(s.ptr, stream), "cudaFreeAsync (launch scratch)");
  }
}

ScratchHold::~ScratchHold() {
  try {
    release();
  } catch (...) {  // (an exception is already on its way, or release() reported it)
  }
}

void ScratchHold::release() {
  const LaunchScratch s = s_;
  s_ = LaunchScratch{};
  release_scratch(s, stream_);
}

void release_cached_memory(int device) {
  // Under g_mu: the device's buffers no call holds leave the cache (a later call allocates anew);
  // each one's launches were enqueued before its holder's release_scratch, so before this. The
  // wait and the frees come after g_mu is released: every other device's calls go on meanwhile.
  std::vector<CachedBuffer*> detached;
  cudaMemPool_t pool = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (auto it = g_eager.begin(); it != g_eager.end();) {
      CachedBuffer* b = it->second;  // (nullptr where the entry's allocation failed)
      if (b == nullptr || (b->device == device && b->holds.load(std::memory_order_acquire) == 0)) {
        if (b) detached.push_back(b);
        it = g_eager.erase(it);
      } else {
        ++it;
      }
    }
    std::vector<CachedBuffer*> kept;
    for (CachedBuffer* b : g_outgrown)
      (b->device == device && b->holds.load(std::memory_order_acquire) == 0 ? detached : kept).push_back(b);
    g_outgrown.swap(kept);
    const auto found = g_pool.find(device);
    if (found != g_pool.end()) pool = found->second;
  }
  if (detached.empty() && pool == nullptr) return;
  // A failure before the frees gives the buffers back to the cache (as outgrown ones, freed by a
  // later call): never freed under a kernel that may still use them, never lost.
  auto keep = [&] {
    std::lock_guard<std::mutex> lock(g_mu);
    g_outgrown.insert(g_outgrown.end(), detached.begin(), detached.end());
    detached.clear();
  };
  // (In the thread's capture mode: CUDA refuses the wait, rather than let it pass, while a
  // capture it would break is under way.)
  const ScopedDevice scope(device);
  cudaError_t e = scope.status();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    keep();
  } else {
    // A free CUDA refuses (another thread began a global-mode capture after the wait) keeps its
    // buffer in the cache too.
    std::vector<CachedBuffer*> unfreed;
    for (CachedBuffer* b : detached) {
      const cudaError_t f = cudaFree(b->ptr);
      if (f == cudaSuccess) {
        delete b;
      } else {
        unfreed.push_back(b);
        if (e == cudaSuccess) e = f;
      }
    }
    detached.swap(unfreed);
    if (!detached.empty()) keep();
    if (e == cudaSuccess && pool) e = cudaMemPoolTrimTo(pool, 0);
  }
  check(e, "release_cached_memory");
}

std::optional<bool> primary_context_state(int device) {
  // Through the runtime's driver entry points: libfa4 links the runtime only.
  using DeviceGet = CUresult (*)(CUdevice*, int);
  using PrimaryCtxGetState = CUresult (*)(CUdevice, unsigned int*, int*);
  struct Entries {
    DeviceGet get = nullptr;
    PrimaryCtxGetState state = nullptr;
  };
  static const Entries entries = [] {
    auto find = [](const char* symbol) -> void* {
      void* f = nullptr;
      cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
      const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &f, 12000, cudaEnableDefault, &found);
#else
      const cudaError_t e = cudaGetDriverEntryPoint(symbol, &f, cudaEnableDefault, &found);
#endif
      if (e != cudaSuccess) cudaGetLastError();
      return e == cudaSuccess && found == cudaDriverEntryPointSuccess ? f : nullptr;
    };
    Entries en;
    en.get = reinterpret_cast<DeviceGet>(find("cuDeviceGet"));
    en.state = reinterpret_cast<PrimaryCtxGetState>(find("cuDevicePrimaryCtxGetState"));
    return en;
  }();
  if (!entries.get || !entries.state) return std::nullopt;
  CUdevice dev{};
  unsigned int flags = 0;
  int active = 0;
  if (entries.get(&dev, device) != CUDA_SUCCESS || entries.state(dev, &flags, &active) != CUDA_SUCCESS)
    return std::nullopt;
  return active != 0;
}

bool has_primary_context(int device) { return primary_context_state(device).value_or(true); }

EagerScratchStats eager_scratch_stats(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  EagerScratchStats st;
  auto count = [&](const CachedBuffer* b) {
    if (b == nullptr || b->device != device) return;
    ++st.cached;
    st.cached_bytes += b->bytes;
    st.held += b->holds.load(std::memory_order_relaxed) > 0;
  };
  for (const auto& [key, b] : g_eager) count(b);
  for (const CachedBuffer* b : g_outgrown) count(b);
  const auto pool = g_pool.find(device);
  if (pool != g_pool.end() && pool->second) {
    uint64_t v = 0;
    check(cudaMemPoolGetAttribute(pool->second, cudaMemPoolAttrReservedMemCurrent, &v), "cudaMemPoolGetAttribute");
    st.pool_reserved_bytes = size_t(v);
    check(cudaMemPoolGetAttribute(pool->second, cudaMemPoolAttrUsedMemCurrent, &v), "cudaMemPoolGetAttribute");
    st.pool_used_bytes = size_t(v);
  }
  return st;
}

namespace {
std::atomic<uint64_t> g_fwd_dynamic_launches{0};
std::atomic<uint64_t> g_fwd_pack_gqa_launches{0};
}  // namespace

void count_fwd_dynamic_launch() { g_fwd_dynamic_launches.fetch_add(1, std::memory_order_relaxed); }
void count_fwd_pack_gqa_launch() { g_fwd_pack_gqa_launches.fetch_add(1, std::memory_order_relaxed); }
uint64_t fwd_pack_gqa_launches() { return g_fwd_pack_gqa_launches.load(std::memory_order_relaxed); }

uint64_t fwd_dynamic_launches() { return g_fwd_dynamic_launches.load(std::memory_order_relaxed); }

uint8_t* async_error_record(int device) {
  // Allocated once; with unified addressing (every 64-bit platform CUDA supports) the portable
  // mapped allocation has one address, valid on the host and on every device.
  static std::once_flag once;
  static uint64_t* device_records = nullptr;
  std::call_once(once, [] {
    RelaxedCapture relaxed;
    int count = 0;
    check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    void* h = nullptr;
    check(cudaHostAlloc(&h, size_t(count) * sizeof(uint64_t), cudaHostAllocPortable | cudaHostAllocMapped),
          "cudaHostAlloc (error record)");
    for (int i = 0; i < count; ++i) static_cast<volatile uint64_t*>(h)[i] = 0;
    void* d = nullptr;
    check(cudaHostGetDevicePointer(&d, h, 0), "cudaHostGetDevicePointer (error record)");
    device_records = static_cast<uint64_t*>(d);
    g_error_devices = count;
    __atomic_store_n(&g_error_records, static_cast<uint64_t*>(h), __ATOMIC_RELEASE);
  });
  return reinterpret_cast<uint8_t*>(device_records + device);
}

void check_async_errors(int device) {
  uint64_t* records = __atomic_load_n(&g_error_records, __ATOMIC_ACQUIRE);
  if (!records || device < 0 || device >= g_error_devices) return;
  if (__atomic_load_n(&records[device], __ATOMIC_RELAXED) == 0) return;
  // One exchange takes every flag set so far; a kernel's store after it stays for the next check.
  const uint64_t flags = __atomic_exchange_n(&records[device], uint64_t(0), __ATOMIC_ACQ_REL);
  uint8_t bytes[sizeof(flags)];
  std::memcpy(bytes, &flags, sizeof(flags));
  uint32_t bits = 0;
  for (int i = 0; i < 8; ++i)
    if (bytes[i] != 0) bits |= 1u << i;
  if (bits == 0) return;
  std::string what;
  auto add = [&](uint32_t bit, const char* rule) {
    if (bits & bit) what += std::string(what.empty() ? "" : "; ") + rule;
  };
  add(kBadCuSeqlensQ, "cu_seqlens_q must start at 0, be non-decreasing, end within q.shape[0] (total_q) "
                      "and give no sequence longer than options.max_seqlen_q");
  add(kBadCuSeqlensK, "cu_seqlens_k must start at 0, be non-decreasing, end within k.shape[0] (total_k) "
                      "and give no sequence longer than options.max_seqlen_k");
  add(kBadSequsedK, "seqused_k[b] must be in [0, cu_seqlens_k[b+1] - cu_seqlens_k[b]]");
  add(kBadCacheSeqlens, "cache_seqlens[b] must be in [0, key capacity - seqlen_new] (key capacity: "
      "k_cache.shape[1], or page_table.shape[1] * page_size when paged)");
  add(kBadCacheBatchIdx, "cache_batch_idx[b] must be in [0, k_cache.shape[0])");
  add(kBadPageTable, "page_table[b][p] must be in [0, num_pages) for every page a sequence uses");
  throw Error(ErrorCode::kInvalidArgument,
              "fa4: an earlier varlen or KV-cache call on cuda:" + std::to_string(device) +
                  " found invalid indices on the device: " + what +
                  ". The sequences concerned were not computed (their out/lse rows were left unwritten); "
                  "a forward reporting this did not run");
}

}  // namespace fa4::hopper
