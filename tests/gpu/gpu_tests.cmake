# tests/gpu/gpu_tests.cmake — included by tests/CMakeLists.txt when FA4_WITH_CUDA.
# Every tests/gpu/*.cu and tests/gpu/*.cpp goes into ONE executable, fa4_gpu_tests (label gpu).
# Each test GTEST_SKIP()s with a message where no CUDA device exists, so the suite also runs (and
# passes as skipped) on a build machine without a GPU.
file(GLOB FA4_GPU_TEST_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_LIST_DIR}/*.cu
  ${CMAKE_CURRENT_LIST_DIR}/*.cpp)
if(FA4_GPU_TEST_SOURCES)
  # The backward tests judge results with `fa4 check`'s case machinery (tools/cli_case.cpp: random
  # problems, the float64 oracle, the accuracy rule).
  add_executable(fa4_gpu_tests ${FA4_GPU_TEST_SOURCES} ${PROJECT_SOURCE_DIR}/tools/cli_case.cpp)
  # sm_90a: the 'a' target enables wgmma/setmaxnreg; CMAKE_CUDA_ARCHITECTURES is OFF (top level).
  target_compile_options(fa4_gpu_tests PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr>)
  # CuTe (test_hopper_wgmma_raw.cu compares the decode's hand-built wgmma descriptors with CuTe's).
  target_include_directories(fa4_gpu_tests PRIVATE
    ${PROJECT_SOURCE_DIR}/src ${CMAKE_CURRENT_LIST_DIR}/..)
  # (The library's trimmed copies of CuTe's wgmma headers first, src/hopper/hopper.cmake: the files
  # that include the forward's traits compile in about half the time.)
  target_include_directories(fa4_gpu_tests SYSTEM PRIVATE ${FA4_CUTE_OVERLAY_DIR} ${FA4_CUTLASS_INCLUDE_DIR})
  # As the library's kernels (hopper.cmake): the forward's kernel traits (test_hopper_gather_layout.cu)
  # use wgmma atoms of N = 80 and 96.
  target_compile_definitions(fa4_gpu_tests PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED>)
  target_link_libraries(fa4_gpu_tests PRIVATE fa4::fa4 GTest::gtest_main CUDA::cudart OpenMP::OpenMP_CXX)
  # A kernel that deadlocks (e.g. unbalanced named barriers) fails its test after 10 minutes
  # instead of hanging the run; the slowest GPU test takes well under a minute on an H200.
  gtest_discover_tests(fa4_gpu_tests DISCOVERY_TIMEOUT 120 PROPERTIES LABELS gpu TIMEOUT 600)
endif()
