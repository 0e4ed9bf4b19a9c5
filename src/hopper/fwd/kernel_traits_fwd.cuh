// src/hopper/fwd/kernel_traits_fwd.cuh — compile-time shapes, shared-memory layouts, MMA atoms, TMA types
// and the kernel's by-value parameter block, for one (dtype, headdim, headdim_v) instantiation.
//
// Why CuTe: the wgmma instructions read shared memory through 64-bit matrix descriptors whose
// swizzle mode must match the layout TMA wrote with; CuTe derives both the TMA box/swizzle and the
// wgmma descriptors from ONE layout object (GMMA::Layout_*_SW*_Atom tiled to the tile shape), so
// the two can never disagree. Hand-writing descriptors is the classic source of silent garbage.
// Q is the exception: its TMA descriptor is encoded by hand (launch_fwd.cuh; pack-GQA's boxes
// span two tensor modes with a runtime group), so the layout facts it relies on — W-column
// chunks of kBlockM rows, the swizzle width — are static_asserted from SmemLayoutQStage below.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "hopper/fwd/tuning_fwd.h"
#include "core/mask.h"
#include "core/params.h"
#include "core/exp2.h"
#include "hopper/shared/tile_scheduler.cuh"

namespace fa4::hopper {

using namespace cute;

/// kLocal: the kernel for causal masks and windows with a right edge of a bucket whose tuning row has local_kernel.
/// kGather: the kernel for a paged KV cache whose pages are not whole key blocks (launch_fwd.h
/// fwd_paged_load): producer warps 1-3 gather each block's rows with cp.async
/// (mainloop_fwd_load.cuh gather).
template <class Element_, int kHeadDim_, int kHeadDimV_, bool kLocal_ = false, bool kGather_ = false>
struct FwdKernelTraits {
  using Element = Element_;
  using ElementAccum = float;
  static constexpr detail::HopperFwdConfig kConfig = detail::hopper_fwd_config(kHeadDim_, kHeadDimV_);
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = kConfig.tile_m;
  static constexpr int kBlockN = kConfig.tile_n;
  static constexpr int kStages = kConfig.stages;
  static constexpr int kQStages = kConfig.q_stages;
  static constexpr int kNumMmaWarpGroups = kBlockM / 64;
  static constexpr int kNumMmaThreads = kNumMmaWarpGroups * cutlass::NumThreadsPerWarpGroup;
  static constexpr int kNumThreads = kNumMmaThreads + cutlass::NumThreadsPerWarpGroup;
  static constexpr int kExp2Period = kConfig.exp2_emulation.period;
  static constexpr int kExp2Emulated = kConfig.exp2_emulation.emulated;
  static constexpr bool kPingPong = kConfig.pingpong;
  static constexpr bool kExpFromRunningMax = kConfig.exp_from_running_max;  // softmax.cuh step_from_running_max
  /// Each consumer warpgroup walks only the key blocks its own 64 rows see (mainloop_fwd_mma.cuh):
  /// the local kernel (tuning_fwd.h local_kernel says where it exists and why).
  static constexpr bool kWarpgroupKeyRanges = kLocal_;
  static_assert(!kLocal_ || kConfig.local_kernel, "a local kernel only where the tuning row has one");
  static constexpr bool kGather = kGather_;
  /// Threads of the producer warpgroup that gather K/V (warps 1-3): each arrives once per stage
  /// on its full barrier, when its copies have landed (cp.async.mbarrier.arrive.noinc).
  static constexpr int kGatherThreads = kGather ? 96 : 0;
  static_assert(!(kLocal_ && kGather_), "the gathering kernel walks whole tiles (no local variant)");
  /// Pack-GQA (shared/tile_info.cuh tile_row) is compiled into the gathering kernels only: there it
  /// pays (launch_fwd.h fwd_packs_gqa). In the TMA-box kernels the runtime row map adds about 170
  /// integer instructions (IMAD / IADD3) and ptxas schedules the key loop differently even when no
  /// tile packs, so unpacked d128 measured slower with the map compiled in; their packed tiles
  /// measured slower than unpacked ones too (bench/results/history.md).
  static constexpr bool kPackGqa = kGather;
  static_assert(!kGather_ || kConfig.gather_kernel, "a gathering kernel only where the tuning row has one");
  static_assert(!kGather_ || (kBlockN % 8 == 0 && kBlockN / 8 <= 32 && kHeadDim_ % 32 == 0 && kHeadDimV_ % 32 == 0),
                "gathering: 8-key groups, one page-table entry per lane, 4 lanes of 16-byte pieces per key");
  // Every warpgroup waits for V of the tile's first block (the varlen tail zeroing) while it still
  // holds that block's K stage: the producer issues that V after the next block's K, which needs a
  // second stage.
  static_assert(!kWarpgroupKeyRanges || kStages >= 2, "per-warpgroup key ranges need two K/V stages");
  static_assert(kBlockM % 64 == 0 && (kNumMmaWarpGroups == 2 || kNumMmaWarpGroups == 3),
                "two or three consumer warpgroups of 64 query rows (named barrier ids in arch/arch.cuh)");
  /// Page-table entries in flight per lane of the producer's warp 0 while it checks a paged
  /// sequence's entries before publishing a tile (tuning_fwd.h kHopperPageCheckLoads).
  static constexpr int kPageCheckLoads = kGather ? detail::kHopperGatherPageCheckLoads : detail::kHopperPageCheckLoads;
  // setmaxnreg split. The gathering kernel's producer warps compute a row address per group of
  // keys and keep their rings' offsets across blocks: at the table's 24 registers they spilled
  // their loop state around every block, so there the producers take what the consumers leave
  // (tuning_fwd.h kHopperGatherConsumerRegs: 40 with two consumer warpgroups, 32 with three).
  static constexpr int32_t kConsumerRegs =
      kGather && kNumMmaWarpGroups == 2 ? detail::kHopperGatherConsumerRegs : kConfig.consumer_regs;
  static constexpr int32_t kProducerRegs =
      kGather ? (detail::hopper_cta_registers(kNumThreads) - kNumMmaThreads * kConsumerRegs) /
                    cutlass::NumThreadsPerWarpGroup / 8 * 8
              : kConfig.producer_regs;
  static_assert(kConsumerRegs % 8 == 0 && kProducerRegs % 8 == 0 && kConsumerRegs >= 24 && kProducerRegs >= 24 &&
                    kConsumerRegs <= 256 && kProducerRegs <= 256,
                "setmaxnreg takes multiples of 8 in [24, 256]");
  static_assert(kNumMmaThreads * kConsumerRegs + cutlass::NumThreadsPerWarpGroup * kProducerRegs <=
                    detail::hopper_cta_registers(kNumThreads),
                "setmaxnreg split over the registers the CTA holds (tuning_fwd.h hopper_cta_registers)");
  static_assert(kBlockN % 16 == 0, "tile_n is the k-extent of the PV wgmma (multiple of 16)");

  using TileShapeQK = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;    // (M, N, K=d)
  using TileShapePV = Shape<Int<kBlockM>, Int<kHeadDimV>, Int<kBlockN>>;   // (M, N=dv, K=n)

  // One wgmma atom covers 64 rows; the warpgroups stacked along M cover the tile (128 or 192 rows).
  using AtomLayout = Layout<Shape<Int<kNumMmaWarpGroups>, _1, _1>>;
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, ElementAccum, TileShapeQK>(), AtomLayout{}));
  // P comes from registers (RS): the S accumulator is converted to 16 bits in place, no smem trip.
  // V is stored row-major (dv contiguous) = MN-major for the B operand of O = P V.
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, ElementAccum, TileShapePV, GMMA::Major::K,
                           GMMA::Major::MN>(),
      AtomLayout{}));
  // One wgmma instruction per k-step must cover the whole key tile (and dv): CuTe otherwise falls
  // back to narrower atoms, e.g. 64x16 when the extended shapes are not enabled (hopper.cmake).
  static_assert(size<1>(typename TiledMmaQK::AtomShape_MNK{}) == kBlockN, "Q K^T wgmma atom is narrower than tile_n");
  static_assert(size<1>(typename TiledMmaPV::AtomShape_MNK{}) == kHeadDimV, "P V wgmma atom is narrower than headdim_v");

  // Swizzled layouts: the widest swizzle (128/64/32 B) that divides the row, so TMA writes and
  // wgmma reads are bank-conflict free.
  using SmemLayoutAtomQ = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                                   GMMA::Major::K, Element, Int<kBlockM>, Int<kHeadDim>>());
  using SmemLayoutQ = decltype(tile_to_shape(SmemLayoutAtomQ{},
                                             Shape<Int<kBlockM>, Int<kHeadDim>, Int<kQStages>>{}));
  using SmemLayoutAtomK = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                                   GMMA::Major::K, Element, Int<kBlockN>, Int<kHeadDim>>());
  using SmemLayoutK = decltype(tile_to_shape(
      SmemLayoutAtomK{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  // V^T view (dv, n, stage) with dv contiguous: what TMA writes from row-major V and what the PV
  // wgmma reads as an MN-major B operand.
  using SmemLayoutAtomVt = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                                    GMMA::Major::MN, Element, Int<kHeadDimV>, Int<kBlockN>>());
  using SmemLayoutVt = decltype(tile_to_shape(
      SmemLayoutAtomVt{}, Shape<Int<kHeadDimV>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{}));

  // The epilogue stages each warpgroup's 64 x dv slice of O (16-bit) in a buffer laid out like one
  // Q buffer — its own (o_buffer) or the tile's Q buffer, dead once that warpgroup's key loop is
  // done (its last Q K^T, and its last softmax, whose overflow path re-reads Q: softmax.cuh) — and
  // TMA-stores it from there. A warpgroup writes exactly the smem of ITS OWN 64 Q
  // rows (the Q layout restricted to those rows and the first dv columns), so it never races with
  // another warpgroup's Q K^T still reading a shared Q buffer.
  using SmemLayoutQStage = decltype(tile_to_shape(SmemLayoutAtomQ{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  static constexpr int kQStageElems = kBlockM * kHeadDim;
  static constexpr bool kOBuffer = kConfig.o_buffer;  // O staged in smem_o instead (same layout)
  static_assert(cosize_v<SmemLayoutQ> == kQStages * kQStageElems, "Q stages are back to back");
  static_assert(kHeadDimV <= kHeadDim, "O is staged in the Q buffer");
  using SmemLayoutOSlice = decltype(composition(
      SmemLayoutQStage{}, make_layout(Shape<_64, Int<kHeadDimV>>{}, Stride<_1, Int<kBlockM>>{})));
  // One warpgroup's O accumulators (64 x dv): the same per-thread fragment as its slice of the
  // tile's TiledMmaPV, used to partition the stmatrix copy.
  using TiledMmaPVWG = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, ElementAccum, Shape<_64, Int<kHeadDimV>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>()));
  using SmemCopyAtomO = Copy_Atom<SM90_U32x4_STSM_N, Element>;

  // Global tensors as TMA sees them: (rows, d, head, batch) with d contiguous. V is described
  // transposed, (d, rows, head, batch), to land in the V^T smem layout.
  using ShapeQKV = Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideQKV = Stride<int64_t, _1, int64_t, int64_t>;
  using StrideVt = Stride<_1, int64_t, int64_t, int64_t>;

  using TMA_O = decltype(make_tma_copy(
      SM90_TMA_STORE{}, make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)), ShapeQKV{}, StrideQKV{}),
      SmemLayoutOSlice{}, Shape<_64, Int<kHeadDimV>>{}, _1{}));
  using TMA_K = decltype(make_tma_copy(
      SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQKV{}),
      take<0, 2>(SmemLayoutK{}), Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  using TMA_V = decltype(make_tma_copy(
      SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideVt{}),
      take<0, 2>(SmemLayoutVt{}), Shape<Int<kHeadDimV>, Int<kBlockN>>{}, _1{}));

  // The Q load (mainloop_fwd_load.cuh load_q): one 4-D TMA box (W columns, heads per tile, tokens
  // per tile, 1 sequence) per W-column chunk of the Q buffer, W the swizzle atom's width: 1 head of
  // kBlockM tokens, or with pack-GQA the group's heads of kBlockM / group tokens. The box's rows
  // land (token, head) with the head fastest, each W columns wide, which is the swizzled Q layout
  // only if a chunk's kBlockM rows are consecutive W-element rows and the chunks follow each other
  // (tile_to_shape tiles the atom down the rows first): asserted here.
  static constexpr int kQChunkCols = int(size<1>(SmemLayoutAtomQ{}));
  static constexpr int kQChunks = kHeadDim / kQChunkCols;
  static_assert(kHeadDim % kQChunkCols == 0 && kQChunkCols * int(sizeof(Element)) % 16 == 0);
  static_assert(int(get_nonswizzle_portion(SmemLayoutQStage{})(1, 0)) == kQChunkCols &&
                    int(get_nonswizzle_portion(SmemLayoutQStage{})(kBlockM - 1, 0)) == (kBlockM - 1) * kQChunkCols &&
                    (kQChunks == 1 ||
                     int(get_nonswizzle_portion(SmemLayoutQStage{})(0, kQChunkCols)) == kBlockM * kQChunkCols),
                "the Q boxes assume W-column chunks of kBlockM consecutive rows");
  // The Q descriptor's swizzle (launch_fwd.cuh kQSwizzle): 16-byte units XORed within a span of
  // one W-column row, so the layout's swizzle must have log2(W * sizeof(Element) / 16) bits over
  // a shift of 3 (8 rows) — what CuTe's TMA would have derived from the same layout.
  using QSwizzle = decltype(get_swizzle_portion(SmemLayoutQStage{}));
  static constexpr int kQSwizzleBytes = QSwizzle::num_bits == 0 ? 0 : 16 << QSwizzle::num_bits;
  static_assert(kQSwizzleBytes == 0 || (kQSwizzleBytes == kQChunkCols * int(sizeof(Element)) && QSwizzle::num_shft == 3),
                "the Q layout's swizzle is not one a TMA box of one W-column row writes");

  // TMA always transfers (and counts) the full box, including out-of-bounds zero fill.
  static constexpr uint32_t kTmaBytesQ = uint32_t(size(take<0, 2>(SmemLayoutQ{})) * sizeof(Element));
  static constexpr uint32_t kTmaBytesK = uint32_t(size(take<0, 2>(SmemLayoutK{})) * sizeof(Element));
  static constexpr uint32_t kTmaBytesV = uint32_t(size(take<0, 2>(SmemLayoutVt{})) * sizeof(Element));

  using MainloopPipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = cutlass::PipelineState<kStages>;
  using PipelineQ = cutlass::PipelineTmaAsync<kQStages>;
  using PipelineStateQ = cutlass::PipelineState<kQStages>;

  /// O staging buffer of the TMA epilogue (laid out like one Q buffer); empty without o_buffer.
  template <bool kHas, class Dummy = void>
  struct SmemO {
    cute::array_aligned<Element, kQStageElems, 1024> buf;
    __device__ Element* data() { return buf.data(); }
  };
  template <class Dummy>
  struct SmemO<false, Dummy> {
    __device__ Element* data() { return nullptr; }
  };
  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> smem_q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> smem_k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutVt>, 1024> smem_v;
    SmemO<kOBuffer> smem_o;  // empty: 1 byte (sizeof is taken by the host compiler too)
    alignas(16) typename PipelineQ::SharedStorage pipeline_q;
    alignas(16) typename MainloopPipeline::SharedStorage pipeline_k;
    alignas(16) typename MainloopPipeline::SharedStorage pipeline_v;
    alignas(16) TileRing::SharedStorage tiles;  // tile indices, producer -> consumers
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "shared memory over the sm_90 per-CTA limit");

  /// Everything the kernel reads, passed by value as a __grid_constant__ (TMA descriptors must
  /// live in param/const/global memory).
  struct Params {
    TMA_K tma_k;
    TMA_V tma_v;
    TMA_O tma_o;        // valid only if out_tma
    ShapeQKV shape_k;
    ShapeQKV shape_vt;  // (real dv, rows, heads_kv, batch)
    ShapeQKV shape_o;   // (rows, real dv, heads, batch)

    void* out{};
    int64_t out_batch_stride{}, out_row_stride{}, out_head_stride{};
    bool out_aligned_pairs{};  // two adjacent output elements form one aligned 4-byte word
    bool out_tma{};            // O through smem + TMA store (batched layout, TMA-aligned out)
    float* lse{};
    int64_t lse_batch_stride{}, lse_head_stride{}, lse_row_stride{};

    // num_heads: the tile grid's heads (tile_scheduler.cuh tile_coord): the query heads, or with
    // pack_gqa the KV heads (a tile's rows are then (token, head) pairs of one KV head's group:
    // shared/tile_info.cuh tile_row; O leaves through direct stores).
    int32_t batch{}, num_heads{}, num_heads_kv{}, group_size{};  // group_size = query heads / num_heads_kv
    bool pack_gqa{};         // set only for a kernel with kPackGqa (launch_fwd.cuh)
    int32_t tile_queries{};  // tile_m, or tile_m / group_size with pack_gqa (read via queries_per_tile())
    /// Whether this launch packs: false at compile time in the kernels without kPackGqa, so their
    /// row map is the unpacked one's constants.
    __host__ __device__ __forceinline__ bool packed() const { return kPackGqa && pack_gqa; }
    __host__ __device__ __forceinline__ int32_t queries_per_tile() const { return packed() ? tile_queries : kBlockM; }
    // Q viewed as (d, query heads, rows, batch), box (kQChunkCols, heads per tile: group_size with
    // pack_gqa or 1, tile_queries, 1), one box per column chunk (mainloop_fwd_load.cuh load_q);
    // encoded by launch_fwd.cuh.
    cute::TmaDescriptor tma_q{};
    int32_t seqlen_q{}, seqlen_k{};  // batched: lengths; varlen: maxima (tile count only)
    int32_t headdim_v{};           // real dv: no store at or past it
    bool is_varlen{};
    const int32_t* cu_seqlens_q{};
    const int32_t* cu_seqlens_k{};
    const int32_t* seqused_k{};    // varlen: seqused_k; batched: a KV-cache call's cache_seqlens (or nullptr)
    int32_t seqlen_new{};          // batched KV-cache call: keys appended after cache_seqlens[b] (tile_info.cuh)
    // Paged KV-cache call (hopper_api.cu kvcache_on_forward): key j of sequence b is row
    // j % page_size of page page_table[b * page_table_batch_stride + j / page_size]; tma_k / tma_v
    // view the pool (num_pages, page_size, heads_kv, d) as (page rows, d, head, page), and with
    // page_size a multiple of kBlockN a key block is one box of one page (mainloop_fwd_load.cuh).
    // nullptr: k/v batched.
    const int32_t* page_table{};
    int64_t page_table_batch_stride{};
    int32_t page_size{}, num_pages{};
    // ... gathered (kGather): key j's row is at pool + page * stride.batch + (j % page_size) *
    // stride.row + head * stride.head (elements; the pool's page is its batch), page_size =
    // 2^page_shift.
    const Element* k_pool{};
    const Element* v_pool{};
    detail::RowStrides k_pool_stride{}, v_pool_stride{};
    int32_t page_shift{};
    int32_t total_q{}, total_k{};  // varlen: packed rows of q and k/v (the bounds cu_seqlens must keep)
    uint8_t* async_error{};        // varlen, KV cache: mapped error record (device_state.h) for invalid indices
    const float* sink{};

    float score_scale_log2{};    // multiplies raw q.k (or tanh(.) under softcap) into log2 units
    float softcap_inv_scale{};   // softmax_scale / softcap (0 when softcap is off)
    bool has_softcap{};
    float rescale_threshold{};   // lazy rescaling: tau, log2 units
    float rescale_sum_limit{};   // 2^rescale_threshold: step_from_running_max rescales above it
    detail::MaskSpec mask{};

    bool exp2_runtime{};         // true: exp2_emulation below, chosen per call; false: the table's
    Exp2Emulation exp2_emulation{};

    // Tile order (tile_scheduler.cuh).
    int32_t num_m_blocks{};
    int32_t num_tiles{};
    int32_t heads_per_section{};  // L2-aware grouping of (batch, head) pairs
    bool lpt{};                 // longest-processing-time first (reverse m-blocks)
    int32_t* tile_counter{};    // dynamic schedule: claim counter, zero at launch and left zero; nullptr: static stride
    detail::StreamKPlan sk{};   // static item order (grid, stream-K tail); core/stream_k.h
    float* sk_partial{};        // stream-K partials (stream_k.cuh), when sk.tail_ctas > 0
    int32_t* sk_flags{};        // zero at launch and left zero; one per (tail CTA, consumer warpgroup): partial stored
  };
};

/// Where the gathering kernel's copy (mainloop_fwd_load.cuh gather_block) writes the 16-byte piece
/// of key row `row`, columns [col, col + 8), of stage `stage` of Kt's K ring (kV false) or V ring:
/// the layout's element, swizzle included, where TMA would have written it. Copying thread
/// (warp w of 3, lane l) takes key l / 4 of the block's groups of 8 keys w, w + 3, ... and the
/// pieces at columns c0 + 32 i, c0 = 8 (l % 4). Swizzle atoms are 8 rows by at most 64 columns
/// and the layouts are linear in whole atoms (and stages), so a thread takes only its first
/// group's pieces 0 and 1 of stage 0 from the layout (`first`) and reaches the others by whole
/// atoms: piece i of its j-th group (rows + 24 j: 3 atom rows) of stage s lies s * stage_step() +
/// j * group_step() + (i / 2) * atom_step() (64 columns) from piece i % 2.
/// All are element offsets from the ring's start, the same for every ring at a 1024-byte aligned
/// address (the 128-byte swizzle permutes address bits 4-6 by bits 7-9; narrower swizzles fewer),
/// as the K and V rings are (SharedStorage): they are taken on a stand-in ring at such an address,
/// so the steps fold to constants and `first` needs no ring.
/// tests/gpu/test_hopper_gather_layout.cu checks every piece of every gathering bucket against the layout.
template <class Kt, bool kV>
struct GatherSmem {
  using Element = typename Kt::Element;
  static constexpr int kWidth = kV ? Kt::kHeadDimV : Kt::kHeadDim;
  static constexpr int kGroups = Kt::kBlockN / 8;  // 8-key groups a block
  static constexpr int kPieces = kWidth / 32;       // per lane per key
  static constexpr uintptr_t kRingAlign = 1024;     // the rings' alignment (SharedStorage)
  static_assert(Kt::kBlockN % 8 == 0 && kGroups >= 3 && kWidth % 32 == 0 && kPieces >= 2,
                "gathering: whole 8-key groups, one per copying warp at least, two pieces a lane at least");
  /// Element offset of (row, col) of stage `stage` from the start of a ring at a kRingAlign-aligned address.
  CUTE_HOST_DEVICE static int32_t at(int stage, int row, int col) {
    Element* const ring = reinterpret_cast<Element*>(kRingAlign);  // a stand-in: never dereferenced
    Element* e;
    if constexpr (kV) {
      e = &make_tensor(make_smem_ptr(ring), typename Kt::SmemLayoutVt{})(col, row, stage);
    } else {
      e = &make_tensor(make_smem_ptr(ring), typename Kt::SmemLayoutK{})(row, col, stage);
    }
    return int32_t(e - ring);
  }
  /// Copying thread `lane`'s key in each of its groups, and the first column of its pieces.
  CUTE_HOST_DEVICE static constexpr int key_in_group(int lane) { return lane / 4; }
  CUTE_HOST_DEVICE static constexpr int column(int lane) { return (lane % 4) * 8; }
  /// Piece `half` (0 or 1) of the first group of copying warp `warp` (0-2), lane `lane`, stage 0.
  CUTE_HOST_DEVICE static int32_t first(int warp, int lane, int half) {
    return at(0, 8 * warp + key_in_group(lane), column(lane) + 32 * half);
  }
  // (coordinates in range only where a thread takes the step)
  CUTE_HOST_DEVICE static int32_t stage_step() { return Kt::kStages > 1 ? at(1, 0, 0) - at(0, 0, 0) : 0; }
  CUTE_HOST_DEVICE static int32_t group_step() { return kGroups > 3 ? at(0, 24, 0) - at(0, 0, 0) : 0; }
  CUTE_HOST_DEVICE static int32_t atom_step() { return kPieces > 2 ? at(0, 0, 64) - at(0, 0, 0) : 0; }
  /// Piece i of the thread's j-th group of stage `stage`, from piece i % 2 of its first group in stage 0.
  CUTE_HOST_DEVICE static int32_t step(int stage, int j, int i) {
    return stage * stage_step() + j * group_step() + (i / 2) * atom_step();
  }
  /// Offset of piece i of the j-th group of stage `stage` of a thread whose first group's pieces 0
  /// and 1 (stage 0) are at first0, first1.
  CUTE_HOST_DEVICE static int32_t piece(int32_t first0, int32_t first1, int stage, int j, int i) {
    return (i % 2 ? first1 : first0) + step(stage, j, i);
  }
};

}  // namespace fa4::hopper
