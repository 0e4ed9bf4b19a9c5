# Driver of the ctest test `package.find_package` (cmake -P):
#   1. cmake --install <FA4_BUILD_DIR> into a fresh prefix;
#   2. configure + build tests/package against that prefix with find_package(fa4);
#   3. run the consumer.
# Inputs (-D): FA4_BUILD_DIR, CONSUMER_SOURCE_DIR, WORK_DIR, GENERATOR, CXX_COMPILER, CUDA_ROOT (opt).
foreach(var FA4_BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_package_test.cmake: -D${var}=... is required")
  endif()
endforeach()

function(run_step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package test: step '${name}' failed (${rc}): ${ARGN}")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
run_step(install "${CMAKE_COMMAND}" --install "${FA4_BUILD_DIR}" --prefix "${prefix}")
set(extra_args)
if(CUDA_ROOT)
  list(APPEND extra_args "-DCUDAToolkit_ROOT=${CUDA_ROOT}")
endif()
run_step(configure "${CMAKE_COMMAND}" -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/build"
         -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_PREFIX_PATH=${prefix}"
         -DCMAKE_BUILD_TYPE=Release ${extra_args})
run_step(build "${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
run_step(run "${WORK_DIR}/build/fa4_consumer")
# The installed command-line tool (when built) must run from the prefix, finding libfa4 there.
if(EXISTS "${prefix}/bin/fa4")
  run_step(installed-cli "${prefix}/bin/fa4" check --seqlen-q 64 --seqlen-k 64)
endif()
