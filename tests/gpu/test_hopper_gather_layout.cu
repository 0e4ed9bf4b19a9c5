// tests/gpu/test_hopper_gather_layout.cu — the gathering forward's shared-memory addresses
// (kernel_traits_fwd.cuh GatherSmem, used by mainloop_fwd_load.cuh gather_block) against the
// K / V rings as the kernel views them (indexed here, not through GatherSmem), for every bucket with a
// gathering kernel, on the host (no GPU needed: it runs on the CI machine too). For each stage,
// each of the 96 copying threads (warp w of 3, lane l: key l / 4 of the groups w, w + 3, ...,
// columns 8 (l % 4) + 32 i), the piece it writes must be the layout's element of that (key,
// column), its 8 elements contiguous and 16-byte aligned, and no two pieces may share an address
// (so, as many as the block has, they cover it once).
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <utility>

#include "hopper/fwd/kernel_traits_fwd.cuh"

namespace {

template <class Kt, bool kV>
void check_ring() {
  using Smem = fa4::hopper::GatherSmem<Kt, kV>;
  using Element = typename Smem::Element;
  using Layout = std::conditional_t<kV, typename Kt::SmemLayoutVt, typename Kt::SmemLayoutK>;
  constexpr int kWidth = kV ? Kt::kHeadDimV : Kt::kHeadDim;
  SCOPED_TRACE(std::string(kV ? "V" : "K") + " ring, d " + std::to_string(Kt::kHeadDim) + " dv " +
               std::to_string(Kt::kHeadDimV));
  alignas(1024) static Element ring[cute::cosize_v<Layout>];
  // (As the kernel sees it: a swizzled smem pointer over a 1024-byte aligned ring; the swizzle acts
  // on the address, so the layout's integer offsets alone are not the elements' places.)
  const auto view = cute::make_tensor(cute::make_smem_ptr(ring), Layout{});
  for (int stage = 0; stage < Kt::kStages; ++stage) {
    std::set<const Element*> covered;  // the first element of each piece written
    for (int warp = 0; warp < 3; ++warp) {
      for (int lane = 0; lane < 32; ++lane) {
        // The kernel's thread: key lane / 4 of groups warp, warp + 3, ...; columns c0 + 32 i.
        const int r = lane / 4, c0 = (lane % 4) * 8;
        const int32_t first0 = Smem::first(warp, lane, 0), first1 = Smem::first(warp, lane, 1);
        for (int g = warp, j = 0; g < Smem::kGroups; g += 3, ++j) {
          for (int i = 0; i < Smem::kPieces; ++i) {
            const int key = 8 * g + r, col = c0 + 32 * i;
            // The element the consumers' and TMA's view of the ring puts at (key, column): K is
            // (key, column, stage), V^T (column, key, stage).
            const auto element = [&](int c) { return kV ? &view(c, key, stage) : &view(key, c, stage); };
            Element* const want = element(col);
            // GatherSmem's offsets are taken on a stand-in ring: they must hold on this one.
            Element* const got = ring + Smem::piece(first0, first1, stage, j, i);
            ASSERT_EQ(got, want) << "stage " << stage << " key " << key << " column " << col;
            ASSERT_EQ(reinterpret_cast<uintptr_t>(got) % 16, 0u) << "key " << key << " column " << col;
            for (int e = 1; e < 8; ++e) ASSERT_EQ(element(col + e), got + e) << "key " << key << " column " << col;
            EXPECT_TRUE(covered.insert(got).second) << "key " << key << " column " << col << " written twice";
          }
        }
      }
    }
    // Every element of the stage's block written once: as many distinct 8-element pieces as it has.
    EXPECT_EQ(covered.size(), size_t(Kt::kBlockN) * (kWidth / 8)) << "stage " << stage;
  }
}

template <int kD, int kDv>
void check_bucket(int* checked) {
  if constexpr (fa4::detail::hopper_fwd_config(kD, kDv).gather_kernel) {
    using Kt = fa4::hopper::FwdKernelTraits<cutlass::bfloat16_t, kD, kDv, false, true>;
    check_ring<Kt, false>();
    check_ring<Kt, true>();
    ++*checked;
  }
}

TEST(HopperGatherLayout, PiecesAreTheLayoutsElements) {
  int checked = 0;
  check_bucket<64, 64>(&checked);
  check_bucket<96, 96>(&checked);
  check_bucket<128, 128>(&checked);
  check_bucket<192, 128>(&checked);
  check_bucket<192, 192>(&checked);
  check_bucket<256, 256>(&checked);
  int gathering = 0;  // every bucket of the tuning table with a gathering kernel was checked above
  for (const auto& c : fa4::detail::kHopperFwdConfigs) gathering += c.gather_kernel ? 1 : 0;
  EXPECT_EQ(checked, gathering);
  EXPECT_GT(checked, 0);
}

}  // namespace
