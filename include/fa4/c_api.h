/* fa4/c_api.h — the stable C ABI of libfa4 (exact attention, FlashAttention-4, arXiv 2603.05451).
 *
 * Use it from any language that can call C (Python ctypes, Rust, Julia, ...) without linking
 * against C++ or any framework. It wraps the C++ API of fa4/attention.h one to one; the layouts,
 * the maths, the mask, the edge semantics and the validation rules documented THERE hold
 * unchanged here. This header only adds the C calling convention.
 *
 * STABILITY AND VERSIONING
 *   * FA4_C_API_VERSION is bumped only for changes a caller can observe. Every version so far is
 *     additive: existing functions, struct fields, their offsets and enum values never change;
 *     new things are only ADDED: new functions, new enum values, new fields at the END of
 *     fa4_options (its `struct_size` field tells the library which fields the caller knows).
 *     Version 2 added fa4_check_async_errors. Version 3 added fa4_forward_with_kvcache,
 *     fa4_forward_with_kvcache_support, fa4_kvcache_args and fa4_kvcache_args_init. Version 4
 *     added fa4_release_cached_memory, fa4_backward_workspace_size and fa4_options.workspace.
 *   * fa4_abi_version() returns the version the library was built with. A caller compiled
 *     against version N works with any library whose fa4_abi_version() >= N.
 *   * Every exported symbol starts with "fa4_"; every macro with "FA4_".
 *
 * ERRORS
 *   Every function that can fail returns an fa4_status. On failure nothing was written (all
 *   arguments are validated first; the contents of device-resident varlen and KV-cache indices
 *   are checked by the kernel instead and reported by a later call, see fa4_check_async_errors;
 *   the one exception is FA4_STATUS_INTERNAL from the CPU backward's consistency check, raised
 *   after dq/dk/dv were written, as fa4/attention.h says under ERRORS), and
 *   fa4_last_error() returns a message that names the function, the tensor and the rule, e.g.
 *     "fa4::forward: k.shape[3] (headdim) = 72 must equal q.shape[3] = 64".
 *   The message is THREAD-LOCAL: it belongs to the calling thread's most recent fa4 call, stays
 *   valid until that thread's next fa4 call, and is "" after a successful call. No C++ exception
 *   ever crosses this ABI: every one is caught and turned into a status (unknown ones into
 *   FA4_STATUS_INTERNAL).
 *
 * TENSORS
 *   fa4_tensor is a non-owning view: data pointer, dtype, ndim (0..4), shape and strides in
 *   ELEMENTS (int64, strides >= 0 on dims of size > 1; the last dim must have stride 1 as
 *   fa4/attention.h says), and where the memory lives. For CUDA tensors `stream` is the
 *   cudaStream_t (NULL = the legacy default stream) on which the work is enqueued; the call returns
 *   without waiting for the GPU. All tensors of one call must live on one device. fa4 never
 *   allocates or frees caller memory, nor keeps a pointer to it past the call; CUDA tensors
 *   (options->workspace included) must stay allocated until the call's kernels have run, in stream
 *   order.
 *
 * THREADS: every function may be called from any thread at the same time.
 */
#ifndef FA4_C_API_H_
#define FA4_C_API_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define FA4_C_EXPORT __declspec(dllexport)
#else
#define FA4_C_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** Version of this ABI (see STABILITY above). */
#define FA4_C_API_VERSION 4

/** Most dimensions an fa4_tensor holds. */
#define FA4_MAX_DIMS 4

/** Status codes; equal to the C++ fa4::ErrorCode values. */
typedef enum fa4_status {
  FA4_STATUS_OK = 0,
  FA4_STATUS_INVALID_ARGUMENT = 1, /**< a tensor or option breaks a documented rule */
  FA4_STATUS_UNSUPPORTED = 2,      /**< valid, but this build/device has no kernel for it */
  FA4_STATUS_CUDA_ERROR = 3,       /**< a CUDA runtime call failed */
  FA4_STATUS_NO_DEVICE = 4,        /**< a CUDA tensor was passed but no usable GPU / no CUDA build */
  FA4_STATUS_INTERNAL = 5          /**< a bug in fa4 (or out of host memory) */
} fa4_status;

/** Element types; equal to the C++ fa4::DType values. FA4_DTYPE_FP8_E4M3 is reserved (rejected). */
typedef enum fa4_dtype {
  FA4_DTYPE_BF16 = 0,
  FA4_DTYPE_FP16 = 1,
  FA4_DTYPE_FP32 = 2,
  FA4_DTYPE_FP8_E4M3 = 3,
  FA4_DTYPE_INT32 = 4
} fa4_dtype;

typedef enum fa4_device_type { FA4_DEVICE_CPU = 0, FA4_DEVICE_CUDA = 1 } fa4_device_type;

/** Which implementation runs; equal to the C++ fa4::Backend values. AUTO: CUDA tensors -> Hopper
 *  kernels, CPU tensors -> the CPU FlashAttention-4 implementation. CPU_REFERENCE: the naive
 *  float64 reference (CPU tensors only). */
typedef enum fa4_backend {
  FA4_BACKEND_AUTO = 0,
  FA4_BACKEND_CPU = 1,
  FA4_BACKEND_CPU_REFERENCE = 2,
  FA4_BACKEND_CUDA = 3
} fa4_backend;

/** Non-owning strided view (enum-valued fields are int32_t so the layout never depends on the
 *  compiler's enum size). 96 bytes on LP64. */
typedef struct fa4_tensor {
  void* data;
  int32_t dtype;        /**< fa4_dtype */
  int32_t ndim;         /**< 0..FA4_MAX_DIMS */
  int64_t shape[FA4_MAX_DIMS];
  int64_t stride[FA4_MAX_DIMS]; /**< elements, not bytes */
  int32_t device_type;  /**< fa4_device_type */
  int32_t device_index; /**< CUDA ordinal; not read for CPU tensors (taken as 0) */
  void* stream;         /**< cudaStream_t for CUDA tensors; ignored for CPU */
} fa4_tensor;

/** Options shared by forward and backward (fa4::AttentionOptions + BackwardOptions).
 *
 *  ALWAYS initialise with fa4_options_init(&o, sizeof(o)): it writes the defaults and sets
 *  struct_size, so a caller compiled against this header keeps working with a newer library
 *  (fields it does not know get their defaults) and an older library rejects fields it does not
 *  know (non-zero bytes past its own struct) with FA4_STATUS_UNSUPPORTED instead of ignoring them.
 *  Fields added later are designed so that all-zero bytes mean "off / default" (has_* flags).
 *  A NULL options pointer means all defaults. Fields are booleans when named has_* / causal /
 *  deterministic (0 or 1; other values are an error). */
typedef struct fa4_options {
  uint32_t struct_size;           /**< sizeof(fa4_options) as the caller compiled it */
  int32_t has_softmax_scale;      /**< 0: default 1/sqrt(headdim) */
  float softmax_scale;            /**< finite, > 0; read only when has_softmax_scale */
  int32_t causal;                 /**< bottom-right aligned; same as window (-1, 0) */
  int32_t window_size_left;       /**< -1 = unbounded */
  int32_t window_size_right;      /**< -1 = unbounded */
  float softcap;                  /**< 0 = off */
  int32_t max_seqlen_q;           /**< varlen: upper bound of the q lengths */
  int32_t max_seqlen_k;           /**< varlen: upper bound of the k lengths */
  float rescale_threshold;        /**< lazy-rescaling tau, log2 units; default 8 */
  int32_t has_exp2_emulation_fraction; /**< 0: the running kernel's tuned default */
  float exp2_emulation_fraction;  /**< multiple of 1/16 in [0, 1]; read only with its has_ flag */
  int32_t backend;                /**< fa4_backend */
  int32_t deterministic;          /**< bitwise-reproducible dq/dk/dv (forwards: see fa4/attention.h) */
  const fa4_tensor* sink;         /**< nullable: fp32 (num_heads,) learnable sink logits */
  const fa4_tensor* cu_seqlens_q; /**< nullable: int32 (batch + 1); varlen iff both cu_seqlens */
  const fa4_tensor* cu_seqlens_k; /**< nullable: int32 (batch + 1) */
  const fa4_tensor* seqused_k;    /**< nullable: int32 (batch,) */
  /** Since ABI 4 (nullable): fa4::BackwardOptions::workspace, for fa4_backward (and its size
   *  query) only: fa4_forward, fa4_forward_support and the KV-cache calls refuse a non-NULL one
   *  with INVALID_ARGUMENT. Caller-owned device scratch of at least
   *  fa4_backward_workspace_size() bytes. */
  const fa4_tensor* workspace;
} fa4_options;

/** Writes the defaults into the first `struct_size` bytes of *options (pass sizeof(fa4_options))
 *  and sets options->struct_size. Fails (INVALID_ARGUMENT) on NULL or a size too small to hold the
 *  v1 fields. */
FA4_C_EXPORT int32_t fa4_options_init(fa4_options* options, size_t struct_size);

/** Forward: writes out and lse (layouts in fa4/attention.h). Returns an fa4_status. */
FA4_C_EXPORT int32_t fa4_forward(const fa4_tensor* q, const fa4_tensor* k, const fa4_tensor* v,
                                 const fa4_tensor* out, const fa4_tensor* lse,
                                 const fa4_options* options);

/** Backward: writes dq, dk, dv (and dsink, required iff options->sink is set, else must be NULL).
 *  Must be given the options the forward used. Returns an fa4_status. */
FA4_C_EXPORT int32_t fa4_backward(const fa4_tensor* dout, const fa4_tensor* q, const fa4_tensor* k,
                                  const fa4_tensor* v, const fa4_tensor* out, const fa4_tensor* lse,
                                  const fa4_tensor* dq, const fa4_tensor* dk, const fa4_tensor* dv,
                                  const fa4_tensor* dsink, const fa4_options* options);

/** Since ABI 4. fa4::backward_workspace_size (fa4/attention.h): writes to *bytes the size of the
 *  options->workspace fa4_backward needs with these arguments (0 where it needs none: the CPU; a
 *  problem with neither queries nor keys); ask with the backward's exact arguments and options
 *  (deterministic and the device change it). Validates as fa4_backward does (the same status
 *  and rule on failure, the message naming fa4::backward_workspace_size; options->workspace, if
 *  given, is checked except for its size); runs nothing. *bytes is written only on success; a NULL bytes is INVALID_ARGUMENT. */
FA4_C_EXPORT int32_t fa4_backward_workspace_size(const fa4_tensor* dout, const fa4_tensor* q,
                                                 const fa4_tensor* k, const fa4_tensor* v,
                                                 const fa4_tensor* out, const fa4_tensor* lse,
                                                 const fa4_tensor* dq, const fa4_tensor* dk,
                                                 const fa4_tensor* dv, const fa4_tensor* dsink,
                                                 const fa4_options* options, uint64_t* bytes);

/** Would fa4_forward run on these arguments, and with which kernel? Runs nothing, writes no
 *  tensor. FA4_STATUS_OK: supported, and the kernel's name is written to kernel_name (NUL-
 *  terminated, truncated to kernel_name_capacity; kernel_name may be NULL). Otherwise the status
 *  and fa4_last_error() say why: INVALID_ARGUMENT (with fa4_forward's message) for a broken rule,
 *  UNSUPPORTED (with the selector's message) when no kernel of this build/device takes them,
 *  NO_DEVICE for CUDA tensors without a usable GPU (or a build without CUDA), INTERNAL for a fault
 *  of fa4 itself: the status fa4_forward would return. */
FA4_C_EXPORT int32_t fa4_forward_support(const fa4_tensor* q, const fa4_tensor* k,
                                         const fa4_tensor* v, const fa4_tensor* out,
                                         const fa4_tensor* lse, const fa4_options* options,
                                         char* kernel_name, size_t kernel_name_capacity);

/** Since ABI 3. The KV-cache arguments of fa4_forward_with_kvcache (fa4::KVCacheOptions minus
 *  the fields it shares with fa4_options). Every pointer is nullable (= not given); layouts and
 *  rules in fa4/attention.h (forward_with_kvcache).
 *
 *  ALWAYS initialise with fa4_kvcache_args_init(&a, sizeof(a)): the same struct_size convention
 *  as fa4_options (fields added later at the end; all-zero bytes mean "not given / default"; a
 *  library older than the caller rejects non-zero bytes it does not know with UNSUPPORTED). A
 *  NULL args pointer means no append, no cache_seqlens (every sequence holds key_capacity keys),
 *  a dense cache and num_splits = 0. */
typedef struct fa4_kvcache_args {
  uint32_t struct_size;              /**< sizeof(fa4_kvcache_args) as the caller compiled it */
  const fa4_tensor* k_new;           /**< (batch, seqlen_new, num_heads_kv, headdim): appended in place */
  const fa4_tensor* v_new;           /**< (batch, seqlen_new, num_heads_kv, headdim_v); both or neither */
  const fa4_tensor* cache_seqlens;   /**< int32 (batch,): keys already cached; required with k_new */
  const fa4_tensor* cache_batch_idx; /**< int32 (batch,): dense cache only; cache row of sequence b */
  const fa4_tensor* page_table;      /**< int32 (batch, max_pages): paged cache */
  int32_t num_splits;                /**< 0 = automatic; >= 1 the exact CUDA split-KV count (at most 256 on CUDA) */
  int32_t reserved;                  /**< must be 0: fills what would be tail padding, so a field
                                          added later always grows sizeof (and struct_size) */
} fa4_kvcache_args;

/** Since ABI 3. Writes the defaults (all zero: nothing given, num_splits 0) into the first
 *  `struct_size` bytes of *args (pass sizeof(fa4_kvcache_args)) and sets args->struct_size.
 *  Fails (INVALID_ARGUMENT) on NULL or a size too small to hold the v3 fields. */
FA4_C_EXPORT int32_t fa4_kvcache_args_init(fa4_kvcache_args* args, size_t struct_size);

/** Since ABI 3. fa4::forward_with_kvcache: attention of q against the KV cache k_cache/v_cache
 *  (dense, or paged with args->page_table), after appending args->k_new/v_new in place at
 *  args->cache_seqlens. Writes the appended cache rows, out and lse. options: as for fa4_forward
 *  except that the varlen fields (cu_seqlens_q/k, seqused_k, max_seqlen_q/k) must be unset;
 *  options->deterministic is ignored (there is no backward). Returns an fa4_status; on failure
 *  nothing was written (device-resident index contents are checked by the kernel instead and
 *  reported through fa4_check_async_errors). */
FA4_C_EXPORT int32_t fa4_forward_with_kvcache(const fa4_tensor* q, const fa4_tensor* k_cache,
                                              const fa4_tensor* v_cache, const fa4_tensor* out,
                                              const fa4_tensor* lse, const fa4_options* options,
                                              const fa4_kvcache_args* args);

/** Since ABI 3. fa4_forward_support for fa4_forward_with_kvcache: runs nothing, writes no tensor;
 *  FA4_STATUS_OK and the kernel's name in kernel_name (NUL-terminated, truncated to
 *  kernel_name_capacity; may be NULL), or the status and message fa4_forward_with_kvcache would
 *  give. */
FA4_C_EXPORT int32_t fa4_forward_with_kvcache_support(const fa4_tensor* q, const fa4_tensor* k_cache,
                                                      const fa4_tensor* v_cache,
                                                      const fa4_tensor* out, const fa4_tensor* lse,
                                                      const fa4_options* options,
                                                      const fa4_kvcache_args* args,
                                                      char* kernel_name,
                                                      size_t kernel_name_capacity);

/** Since ABI 2. fa4::check_async_errors (fa4/attention.h): INVALID_ARGUMENT, with the message, if an earlier
 *  kernel on CUDA device `device_index` met invalid device-resident varlen (or, since ABI 3, KV-cache) indices (the record is
 *  then cleared); OK otherwise, including for an index no kernel ran on (negative, or no such
 *  device: nothing is recorded there). Does not wait for the GPU. */
FA4_C_EXPORT int32_t fa4_check_async_errors(int32_t device_index);

/** Since ABI 4. fa4::release_cached_memory (fa4/attention.h): waits for CUDA device `device_index`
 *  and frees the scratch fa4 keeps for eager calls there (not while a stream of the device is
 *  being captured: see fa4/attention.h). OK without waiting when fa4 never kept anything there;
 *  INVALID_ARGUMENT for a negative index; CUDA_ERROR if CUDA refuses the wait or a free. */
FA4_C_EXPORT int32_t fa4_release_cached_memory(int32_t device_index);

/** Message of the calling thread's most recent failed fa4 call; "" after a success. Never NULL. */
FA4_C_EXPORT const char* fa4_last_error(void);

/** Lower-case name of a status ("ok", "invalid_argument", ...); "unknown_error" for others. */
FA4_C_EXPORT const char* fa4_status_name(int32_t status);

/** Library version, "MAJOR.MINOR.PATCH" (the CMake project version). */
FA4_C_EXPORT const char* fa4_version(void);

/** FA4_C_API_VERSION the library was built with. */
FA4_C_EXPORT int32_t fa4_abi_version(void);

/** 1 if the library was built with the CUDA (Hopper) kernels, else 0. Says nothing about whether
 *  a GPU is present at run time (a CUDA tensor on a machine without one gives NO_DEVICE). */
FA4_C_EXPORT int32_t fa4_has_cuda(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FA4_C_API_H_ */
