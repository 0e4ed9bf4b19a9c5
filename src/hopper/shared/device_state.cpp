// src/hopper/shared/device_state.cpp — launch scratch and the asynchronous error word (device_state.h).
#include "hopper/shared/device_state.h"

#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

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
/// Eager scratch per (device, stream id, kind): cudaStreamGetId, unlike the handle, is unique for
/// the life of the process and tells each thread's per-thread default stream apart.
std::map<std::tuple<int, unsigned long long, int>, std::pair<char*, size_t>> g_eager;  // (ptr, bytes)
std::map<int, cudaStream_t> g_zero_stream;  // a private stream per device for the one-time memset
std::vector<char*> g_outgrown;              // kept, not freed: see acquire_scratch

/// cudaMalloc + (when `zero`) zero fill on a private non-blocking stream (never the caller's).
/// Called with g_mu held.
char* alloc_scratch(int device, size_t bytes, bool zero) {
  RelaxedCapture relaxed;  // another thread may be capturing in global mode
  char* p = nullptr;
  check(cudaMalloc(reinterpret_cast<void**>(&p), bytes), "cudaMalloc (launch scratch)");
  if (!zero) return p;  // (the backward's workspace: every launch writes what it reads)
  cudaStream_t& zs = g_zero_stream[device];
  if (!zs) {
    const cudaError_t e = cudaStreamCreateWithFlags(&zs, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      cudaFree(p);
      check(e, "cudaStreamCreate (scratch)");
    }
  }
  cudaError_t e = cudaMemsetAsync(p, 0, bytes, zs);
  if (e == cudaSuccess) e = cudaStreamSynchronize(zs);
  if (e != cudaSuccess) {
    cudaFree(p);
    check(e, "zeroing the launch scratch");
  }
  return p;
}

/// A buffer owned by a captured graph (see acquire_scratch). The destructor callback of the graph's
/// user object may make no CUDA call: it hands the buffer back through g_returned, and the next
/// captured call moves it to g_capture_free for reuse.
struct CaptureBuffer {
  int device;
  char* ptr;
  size_t bytes;
};
std::mutex g_returned_mu;
std::vector<CaptureBuffer> g_returned;      // given back by destroyed graphs (g_returned_mu)
std::vector<CaptureBuffer> g_capture_free;  // ready for the next capture (g_mu)

void give_back(void* record) {  // CUDA's internal thread, once the graph and its work are gone
  auto* b = static_cast<CaptureBuffer*>(record);
  {
    std::lock_guard<std::mutex> lock(g_returned_mu);
    g_returned.push_back(*b);
  }
  delete b;
}

/// Scratch for a call captured into `graph`: a plain device buffer (the smallest free one that
/// fits, else a new one), zeroed now, whose lifetime a user object ties to the graph. Replays then
/// run the kernel alone (no allocation, memset or free node): the kernels leave the zeroed part
/// zero for the next replay, and CUDA orders the replays of one executable graph. g_mu held.
char* capture_owned_scratch(int device, cudaGraph_t graph, size_t bytes, size_t zeroed_bytes) {
  {
    std::lock_guard<std::mutex> lock(g_returned_mu);
    g_capture_free.insert(g_capture_free.end(), g_returned.begin(), g_returned.end());
    g_returned.clear();
  }
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
    if (zeroed_bytes > 0) {  // zeroed again (its last graph's kernels should have left it zero)
      RelaxedCapture relaxed;
      cudaStream_t zs = g_zero_stream[device];  // exists: alloc_scratch made it with the buffer
      cudaError_t e = cudaMemsetAsync(buf.ptr, 0, zeroed_bytes, zs);
      if (e == cudaSuccess) e = cudaStreamSynchronize(zs);
      if (e != cudaSuccess) g_capture_free.push_back(buf);
      check(e, "zeroing the captured call's scratch");
    }
  } else {
    size_t size = 4096;
    while (size < bytes) size *= 2;
    buf = {device, alloc_scratch(device, size, true), size};
  }
  auto* record = new CaptureBuffer(buf);
  cudaUserObject_t owner = nullptr;
  const cudaError_t e = cudaUserObjectCreate(&owner, record, give_back, 1, cudaUserObjectNoDestructorSync);
  if (e != cudaSuccess) {
    delete record;
    g_capture_free.push_back(buf);
    check(e, "cudaUserObjectCreate (captured scratch)");
  }
  // The graph takes the only reference: the buffer comes back once the graph and every executable
  // made from it are destroyed and their launched work is done.
  check(cudaGraphRetainUserObject(graph, owner, 1, cudaGraphUserObjectMove), "cudaGraphRetainUserObject");
  return buf.ptr;
}

uint32_t* g_error_words = nullptr;  // mapped host memory, one word per device
int g_error_devices = 0;

}  // namespace

LaunchScratch acquire_scratch(int device, cudaStream_t stream, size_t bytes, size_t zeroed_bytes, ScratchKind kind) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  check(cudaStreamGetCaptureInfo(stream, &capture, nullptr, &graph), "cudaStreamGetCaptureInfo");
  if (capture == cudaStreamCaptureStatusActive && kind != ScratchKind::kBackward) {
    std::lock_guard<std::mutex> lock(g_mu);
    return {capture_owned_scratch(device, graph, bytes, zeroed_bytes), false};
  }
  if (capture != cudaStreamCaptureStatusNone) {
    // The backward's workspace (dQ accumulator, row statistics: large, never zeroed) is graph
    // memory instead: allocation and free become nodes of the graph, and CUDA shares the memory
    // between graphs and between the nodes of one graph (a workspace per captured layer may not
    // fit). An invalidated capture gets the same nodes; the capture fails and frees them.
    LaunchScratch s{nullptr, true};
    check(cudaMallocAsync(reinterpret_cast<void**>(&s.ptr), bytes, stream), "cudaMallocAsync (captured scratch)");
    const cudaError_t e = zeroed_bytes > 0 ? cudaMemsetAsync(s.ptr, 0, zeroed_bytes, stream) : cudaSuccess;
    if (e != cudaSuccess) {
      cudaFreeAsync(s.ptr, stream);
      check(e, "cudaMemsetAsync (captured scratch)");
    }
    return s;
  }
  unsigned long long stream_id = 0;
  check(cudaStreamGetId(stream, &stream_id), "cudaStreamGetId");
  std::lock_guard<std::mutex> lock(g_mu);
  std::pair<char*, size_t>& b = g_eager[{device, stream_id, static_cast<int>(kind)}];
  if (b.second >= bytes) return {b.first, false};
  // Grow to a power of two of at least 4 KiB, so a stream's buffer is replaced only a few times.
  // The old buffer is kept, not freed: kernels queued on the stream, or a call of another thread
  // that took it a moment ago, may still use it, and waiting for them would be a host sync. The
  // doublings cost at most as much again as the final size.
  size_t size = 4096;
  while (size < bytes) size *= 2;
  if (b.first) g_outgrown.push_back(b.first);
  b = {alloc_scratch(device, size, zeroed_bytes > 0), size};
  return {b.first, false};
}

void release_scratch(const LaunchScratch& s, cudaStream_t stream) {
  if (s.graph_owned && s.ptr) check(cudaFreeAsync(s.ptr, stream), "cudaFreeAsync (captured scratch)");
}

uint32_t* async_error_word(int device) {
  // Allocated once; with unified addressing (every 64-bit platform CUDA supports) the portable
  // mapped allocation has one address, valid on the host and on every device.
  static std::once_flag once;
  static uint32_t* device_words = nullptr;
  std::call_once(once, [] {
    RelaxedCapture relaxed;
    int count = 0;
    check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    void* h = nullptr;
    check(cudaHostAlloc(&h, size_t(count) * sizeof(uint32_t), cudaHostAllocPortable | cudaHostAllocMapped),
          "cudaHostAlloc (error word)");
    for (int i = 0; i < count; ++i) static_cast<volatile uint32_t*>(h)[i] = 0;
    void* d = nullptr;
    check(cudaHostGetDevicePointer(&d, h, 0), "cudaHostGetDevicePointer (error word)");
    device_words = static_cast<uint32_t*>(d);
    g_error_devices = count;
    __atomic_store_n(&g_error_words, static_cast<uint32_t*>(h), __ATOMIC_RELEASE);
  });
  return device_words + device;
}

void check_async_errors(int device) {
  uint32_t* words = __atomic_load_n(&g_error_words, __ATOMIC_ACQUIRE);
  if (!words || device < 0 || device >= g_error_devices) return;
  if (__atomic_load_n(&words[device], __ATOMIC_RELAXED) == 0) return;
  const uint32_t bits = __atomic_exchange_n(&words[device], 0u, __ATOMIC_ACQ_REL);
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
