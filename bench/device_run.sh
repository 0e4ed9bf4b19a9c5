#!/bin/bash
# bench/device_run.sh — one device call: GPU tests + SASS check + quick timing vs torch SDPA.
# Runs from the repo root on the GPU machine; expects build-hopper/{src/libfa4.so,tests/fa4_gpu_tests}
# built here (carried), and falls back to building on the device (build-hopper/devcarry holds the
# CuTe and GoogleTest headers/libs for that). Writes logs to $OUT.
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader
B=build-hopper
export LD_LIBRARY_PATH=$PWD/$B/src:/usr/local/cuda/lib64:$LD_LIBRARY_PATH
if ! $B/tests/fa4_gpu_tests --gtest_list_tests > /dev/null 2>&1; then
  echo "prebuilt test binary does not run here:"; ldd $B/tests/fa4_gpu_tests | grep "not found"
  T0=$(date +%s)
  cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DFA4_BUILD_CLI=OFF \
    -DFA4_CUTLASS_INCLUDE_DIR=$PWD/$B/devcarry/include -DGTEST_ROOT=$PWD/$B/devcarry/gtest \
    -DFA4_HOPPER_HEADDIMS="${HD:-all}" > $OUT/cmake.log 2>&1 || tail -20 $OUT/cmake.log
  ninja -C build-dev fa4 fa4_gpu_tests > $OUT/build.log 2>&1 || grep -E "error" $OUT/build.log | head -20
  echo "device build: $(( $(date +%s) - T0 )) s"
  B=build-dev
  export LD_LIBRARY_PATH=$PWD/$B/src:/usr/local/cuda/lib64:$LD_LIBRARY_PATH
fi
echo "HGMMA in SASS: $(cuobjdump --dump-sass $B/src/libfa4.so 2>/dev/null | grep -c HGMMA)"
summ() { grep -E "^\[  (PASSED|FAILED)|^\[  FAILED|Failure|err |Expected|Which is|which is|actual|skipped|SKIPPED" | head -${1:-60}; }
timeout 90 $B/tests/fa4_gpu_tests --gtest_filter='HopperArch.*:HopperFwd.SanitizeSmall' > $OUT/smoke.log 2>&1
echo "smoke rc=$?"; summ 40 < $OUT/smoke.log
timeout ${TEST_TIMEOUT:-240} $B/tests/fa4_gpu_tests --gtest_filter='HopperFwd.*:-HopperFwd.SanitizeSmall' > $OUT/gpu_tests.log 2>&1
echo "tests rc=$?"; summ 80 < $OUT/gpu_tests.log; grep -E "^\[       OK|^\[  FAILED" $OUT/gpu_tests.log | head -30
if [ "${SANITIZE:-0}" = 1 ]; then
  timeout 120 compute-sanitizer --tool memcheck $B/tests/fa4_gpu_tests --gtest_filter='HopperFwd.SanitizeSmall' 2>&1 | tail -5
fi
PYTHONPATH=python FA4_LIBRARY=$PWD/$B/src/libfa4.so timeout ${BENCH_TIMEOUT:-150} python3 bench/bench_fwd.py $OUT/bench.json ${BENCH_ARGS:---quick} 2>&1 | tail -${BENCH_TAIL:-30}
