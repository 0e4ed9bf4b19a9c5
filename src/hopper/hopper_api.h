// src/hopper/hopper_api.h — host entry points of the Hopper (sm_90a) kernels. Compiled only when
// FA4_WITH_CUDA. Params pointers are device memory (cu_seqlens etc. included).
#pragma once

#include <cstdint>
#include <string>

#include "core/params.h"

namespace fa4::hopper {

/// The single selector: returns "" and the kernel name if a kernel exists for p on the current
/// device, else a message saying what is supported. forward() runs exactly what this picks.
std::string forward_support(const detail::FwdParams& p, std::string* kernel_name);

/// "" if cuda:index exists and answered its queries, else why not (no usable GPU: the selectors'
/// refusal is then NO_DEVICE, not UNSUPPORTED). Only a refused call asks.
std::string missing_device(int index);

/// Enqueues the forward on p.device.stream. Precondition: forward_support(p) == "" (fa4::forward's
/// selector checked it; it is not checked again here).
void forward(const detail::FwdParams& p);

/// The backward's selector: "" and the kernel name if a backward kernel exists for p on the
/// current device, else the reason. backward() runs exactly what this picks.
std::string backward_support(const detail::BwdParams& p, std::string* kernel_name);

/// Enqueues the backward (preprocess, main kernel, postprocess, dsink) on p.device.stream.
/// Precondition: backward_support(p) == "".
void backward(const detail::BwdParams& p);

/// The workspace bytes backward(p) lays out (bwd/launch_bwd.h BwdLaunchShape): what a caller's
/// BwdParams::workspace must hold. Precondition: backward_support(p) == "".
int64_t backward_workspace_bytes(const detail::BwdParams& p);

/// p.dsink (if any) set to zero on p's stream: the backward of a problem with no keys or no
/// sequence, which launches no kernel.
void zero_dsink(const detail::BwdParams& p);

/// Forward-kernel calls so far whose O left through the TMA store (fwd/epilogue_fwd.cuh), and
/// backward calls whose dK / dV did (bwd/mainloop_bwd_mma.cuh store_dkdv_tma): the tests check
/// that their comparisons with the direct stores took that path.
uint64_t fwd_tma_epilogue_calls();
uint64_t bwd_tma_epilogue_calls();

/// The KV-cache selector: "" and the kernel name if p runs on the current device, else the reason.
/// The decode kernel (decode/) must accept p (its launch also appends k_new / v_new); a call with
/// more than 128 query rows per KV head (chunked prefill; except where the decode kernel runs
/// the rows as one 8-warp split per tile, hopper_api.cu decode_one_split_wins) over a dense cache,
/// or a paged one whose
/// page size is a multiple of the forward's key tile or, on a bucket with a gathering kernel (d64,
/// d128, d256; from 96, 64 and any query tokens), a power of two from 8 rows (the gathering
/// kernel, "hopper::fwd_..._gather"), then attends on the forward kernel (fwd/,
/// "hopper::fwd_... (KV cache)" / "(KV cache, paged)"; hopper_api.cu kvcache_on_forward), as a
/// forward of that shape would. forward_kvcache() runs exactly what this picks.
std::string kvcache_support(const detail::KVCacheParams& p, std::string* kernel_name);

/// Enqueues forward_with_kvcache on p.device.stream: the append of k_new/v_new (if given), then the
/// split-KV decode kernel (with more than one split, the last split of a tile merges) or the
/// forward kernel (kvcache_support says which). Device-resident
/// cache_seqlens / cache_batch_idx / page_table are checked by the kernels (AsyncError bits):
/// a sequence breaking a rule gets no output and nothing is read or written out of bounds.
/// Precondition: kvcache_support(p) == "". `fn` names the call in CUDA errors (fa4::forward when
/// the selector sent a small-query forward here).
void forward_kvcache(const detail::KVCacheParams& p, const char* fn = "fa4::forward_with_kvcache");

}  // namespace fa4::hopper
