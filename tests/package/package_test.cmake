# Registers `package.find_package` (included from tests/CMakeLists.txt): install this build to a
# temporary prefix, then build and run tests/package against it with find_package(fa4).
set(_fa4_cuda_root "")
if(FA4_WITH_CUDA AND CUDAToolkit_BIN_DIR)
  get_filename_component(_fa4_cuda_root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
endif()
add_test(NAME package.find_package
  COMMAND ${CMAKE_COMMAND}
    -DFA4_BUILD_DIR=${PROJECT_BINARY_DIR}
    -DCONSUMER_SOURCE_DIR=${CMAKE_CURRENT_LIST_DIR}
    -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/package_test
    -DGENERATOR=${CMAKE_GENERATOR}
    -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
    -DCUDA_ROOT=${_fa4_cuda_root}
    -P ${CMAKE_CURRENT_LIST_DIR}/run_package_test.cmake)
# Runs an install, a CMake configure and a compile: give it more time than a unit test.
set_tests_properties(package.find_package PROPERTIES LABELS "cpu;package" TIMEOUT 600)
