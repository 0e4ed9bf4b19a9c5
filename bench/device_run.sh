#!/bin/bash
# bench/device_run.sh — one device call: build, GPU tests, sanitizers, same-process A/B, host time.
# Runs from the repo root on the GPU machine (nothing there can be downloaded): carry
# build-hopper/devcarry (include/ = the CuTe/CUTLASS headers of `pip install nvidia-cutlass`,
# gtest/{include,lib} = GoogleTest) and, for an A/B, the old tree in OLD (git archive of a commit).
# Switches (environment): HD buckets to build (default all), OLD=dir of the old tree (builds it
# too, buckets OLD_HD (default HD), and runs bench/ab_variants.py old vs new unless AB=0),
# VARIANTS="name=dir ..." (more trees, e.g. branches unpacked with git archive: each built into
# build-<name>, buckets VAR_HD (default OLD_HD, then HD), beside the others, and timed in the same
# A/B as name), SANITIZE=1, PYTEST=1 (python/tests against this
# build), HOST=1 (bench/host_overhead.py), GTEST_FILTER (of the GPU test run), TEST_TIMEOUT
# (seconds for it, default 400), SAN_FILTER (gtest
# filter of the sanitizer runs), SAN_TIMEOUT (seconds per sanitizer tool, default 150),
# BENCH=1 (bench/bench_fwd.py, BENCH_ARGS), BWD=1 (bench/bench_bwd.py, BWD_ARGS; both keep an exported
# PYTHONPATH, e.g. upstream FlashAttention-4's from ../shared/peers), DECODE=1
# (bench/bench_decode.py, DECODE_ARGS), DAB=1 (bench/ab_decode.py over OLD / new / VARIANTS,
# DAB_ARGS), KTIMES=1 (bench/kernel_times.py), SPLITS=1
# (bench/decode_split_sweep.py, SPLITS_ARGS), SMALLQ=1
# (bench/small_q_route.py), TRACE=1 (bench/host_trace.py: the runtime calls and host time of
# an eager call's parts), AB_ARGS (extra ab_variants.py arguments), NCU=1 (ncu over
# bench/profile_bwd.py, NCU_ARGS: its arguments, default "128 0 4096"), DNCU=1 (ncu over
# bench/profile_decode.py, DNCU_ARGS: its shapes), FNCU=1 (ncu over bench/profile_fwd.py, every
# contender's forward kernels, FNCU_ARGS: its arguments, default "64 1 512"), TL=1 (the decode
# phase timeline of this tree: bench/timeline/decode_timeline_patch.py on a copy in /tmp/tl,
# built with bucket 128 beside the others, then bench/timeline/decode_ts.py; TL_OLD=1 does the
# same for the OLD tree).
# BENCH_ARGS, BWD_ARGS and DECODE_ARGS default to --quick when unset; set one empty (DECODE_ARGS='')
# for the script's full run.
# Everything is logged under $OUT; the last lines printed are the summary.
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader
CARRY=$PWD/build-hopper/devcarry
configure() {  # src_dir build_dir buckets
  cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DFA4_BUILD_CLI=OFF -DFA4_HOPPER_PTXAS_VERBOSE=ON \
    -DFA4_CUTLASS_INCLUDE_DIR=$CARRY/include -DGTEST_ROOT=$CARRY/gtest -DFA4_HOPPER_HEADDIMS="$3"
}
T0=$(date +%s)
configure . build-dev "${HD:-all}" > $OUT/cmake.log 2>&1 || tail -20 $OUT/cmake.log
if [ -n "$OLD" ]; then
  configure $OLD build-old "${OLD_HD:-${HD:-all}}" > $OUT/cmake_old.log 2>&1 || tail -20 $OUT/cmake_old.log
  (ninja -C build-old fa4 > $OUT/build_old.log 2>&1 || grep -E "error" $OUT/build_old.log | head) &
fi
VAR_LIBS=""; VAR_LOGS=""
for v in $VARIANTS; do
  name=${v%%=*}; dir=${v#*=}
  configure $dir build-$name "${VAR_HD:-${OLD_HD:-${HD:-all}}}" > $OUT/cmake_$name.log 2>&1 || tail -20 $OUT/cmake_$name.log
  (ninja -C build-$name fa4 > $OUT/build_$name.log 2>&1 || grep -E "error" $OUT/build_$name.log | head) &
  VAR_LIBS="$VAR_LIBS $name=$PWD/build-$name/src/libfa4.so"; VAR_LOGS="$VAR_LOGS build_$name"
done
timeline_tree() {  # src_dir name: a patched copy in /tmp/<name>, built into build-<name> (bucket 128)
  rm -rf /tmp/$2 && mkdir -p /tmp/$2 && (cd $1 && tar --exclude='./build*' --exclude='./.br' --exclude='./.peers' -cf - .) | tar -x -C /tmp/$2
  # each tree's own patch script: its anchors are that tree's kernel text
  python3 $1/bench/timeline/decode_timeline_patch.py /tmp/$2 > $OUT/patch_$2.log 2>&1 || { cat $OUT/patch_$2.log; return 1; }
  configure /tmp/$2 build-$2 128 > $OUT/cmake_$2.log 2>&1 && ninja -C build-$2 fa4 > $OUT/build_$2.log 2>&1 || grep -E "error" $OUT/build_$2.log | head
}
[ "${TL:-0}" = 1 ] && timeline_tree . tl &
[ "${TL_OLD:-0}" = 1 ] && [ -n "$OLD" ] && timeline_tree $OLD tlold &
ninja -C build-dev fa4 fa4_gpu_tests > $OUT/build.log 2>&1 || grep -E "error" $OUT/build.log | head -20
wait
echo "device build: $(( $(date +%s) - T0 )) s"
for log in build ${OLD:+build_old} $VAR_LOGS; do  # ptxas: spill stores of each instantiation's kernels
  awk '/Building CUDA object.*instantiations/ {match($0, /([fb]wd|decode)_[a-z0-9]+_hdim[0-9x]+(_local|_gather)?/); f=substr($0, RSTART, RLENGTH)}
       /spill stores/ && f != "" {match($0, /[0-9]+ bytes spill stores/); s[f]=s[f] " " substr($0, RSTART, RLENGTH-19)}
       END {for (f in s) printf "%s:%s  ", f, s[f]}' $OUT/$log.log > $OUT/spills_$log.txt
done
# ptxas C7511 / C7512: wgmma serialised for want of registers (the d128 backward lost ~15% to one
# unnoticed, bench/results/history.md 2026-12-06 14:2x): every such kernel, per build
for log in build ${OLD:+build_old} $VAR_LOGS; do
  w=$(grep -h "C751[0-9]" $OUT/$log.log 2>/dev/null | grep -o "_ZN[A-Za-z0-9_]*" | sort | uniq -c | tr '\n' ' ')
  [ -n "$w" ] && echo "WGMMA SERIALIZED ($log): $w"
done
export LD_LIBRARY_PATH=$PWD/build-dev/src:/usr/local/cuda/lib64:$LD_LIBRARY_PATH
B=build-dev
echo "HGMMA in SASS: $(cuobjdump --dump-sass $B/src/libfa4.so 2>/dev/null | grep -c HGMMA)"
summ() { grep -E "^\[  (PASSED|FAILED)|^\[  FAILED|Failure|Expected|Which is|which is|actual|SKIPPED" | head -${1:-60}; }
timeout ${TEST_TIMEOUT:-400} $B/tests/fa4_gpu_tests ${GTEST_FILTER:+--gtest_filter="$GTEST_FILTER"} > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc=$?"; summ 60 < $OUT/gpu_tests.log
if [ "${SANITIZE:-0}" = 1 ]; then
  F=${SAN_FILTER:-'HopperArch.*:HopperFwd.Sanitize*:HopperBwd.Sanitize*:HopperDecode.Sanitize*'}
  for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
    timeout ${SAN_TIMEOUT:-150} compute-sanitizer --tool $tool $B/tests/fa4_gpu_tests --gtest_filter="$F" > $OUT/sanitize_$tool.log 2>&1
    echo "$tool rc=$?: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $OUT/sanitize_$tool.log | tr '\n' ' ')"
  done
fi
if [ "${PYTEST:-0}" = 1 ]; then
  PYTHONPATH=python FA4_LIBRARY=$PWD/$B/src/libfa4.so timeout 200 python3 -m pytest python/tests -q -rs -x > $OUT/pytest.log 2>&1
  echo "pytest rc=$?: $(tail -1 $OUT/pytest.log)"; grep -E "FAILED|Error" $OUT/pytest.log | head -10
fi
if [ "${HOST:-0}" = 1 ]; then
  PYTHONPATH=python FA4_LIBRARY=$PWD/$B/src/libfa4.so timeout 150 python3 bench/host_overhead.py $OUT/host_new.json > $OUT/host_new.log 2>&1
  echo "host_overhead (new) rc=$?"; tail -15 $OUT/host_new.log
  if [ -n "$OLD" ]; then
    PYTHONPATH=$OLD/python:bench FA4_LIBRARY=$PWD/build-old/src/libfa4.so timeout 150 python3 bench/host_overhead.py $OUT/host_old.json > $OUT/host_old.log 2>&1
    echo "host_overhead (old) rc=$?"; tail -15 $OUT/host_old.log
  fi
fi
if [ "${TRACE:-0}" = 1 ]; then
  PYTHONPATH=python:bench FA4_LIBRARY=$PWD/$B/src/libfa4.so timeout 200 python3 bench/host_trace.py $OUT/host_trace.json > $OUT/host_trace.log 2>&1
  echo "host_trace rc=$?"; cut -c1-1500 $OUT/host_trace.log | tail -8
fi
if [ -n "$OLD$VARIANTS" ] && [ "${AB:-1}" = 1 ]; then
  PYTHONPATH=${PYPKG:-python}:bench timeout ${AB_TIMEOUT:-300} python3 bench/ab_variants.py $OUT/ab.json \
    ${OLD:+old=$PWD/build-old/src/libfa4.so} new=$PWD/$B/src/libfa4.so $VAR_LIBS \
    ${AB_ARGS:---headdims 64,96,128,192,256} > $OUT/ab.log 2>&1
  echo "ab rc=$?"; tail -25 $OUT/ab.log
fi
if [ -n "$OLD$VARIANTS" ] && [ "${DAB:-0}" = 1 ]; then  # decode A/B (bench/ab_decode.py), same libraries
  PYTHONPATH=${PYPKG:-python}:bench timeout ${DAB_TIMEOUT:-300} python3 bench/ab_decode.py $OUT/ab_decode.json \
    ${OLD:+old=$PWD/build-old/src/libfa4.so} new=$PWD/$B/src/libfa4.so $VAR_LIBS ${DAB_ARGS:-} > $OUT/ab_decode.log 2>&1
  echo "ab_decode rc=$?"; grep -v -i warn $OUT/ab_decode.log | tail -20
fi
if [ "${BENCH:-0}" = 1 ]; then
  PYTHONPATH=python:${PYTHONPATH:-} FA4_LIBRARY=$PWD/$B/src/libfa4.so timeout ${BENCH_TIMEOUT:-300} python3 bench/bench_fwd.py $OUT/bench.json ${BENCH_ARGS---quick} > $OUT/bench.log 2>&1
  echo "bench rc=$?"; tail -${BENCH_TAIL:-30} $OUT/bench.log
fi
if [ "${BWD:-0}" = 1 ]; then
  PYTHONPATH=python:${PYTHONPATH:-} FA4_LIBRARY=$PWD/$B/src/libfa4.so timeout ${BWD_TIMEOUT:-300} python3 bench/bench_bwd.py $OUT/bench_bwd.json ${BWD_ARGS---quick} > $OUT/bench_bwd.log 2>&1
  echo "bench_bwd rc=$?"; tail -${BENCH_TAIL:-30} $OUT/bench_bwd.log
fi
if [ "${DECODE:-0}" = 1 ]; then
  PYTHONPATH=python:bench FA4_LIBRARY=$PWD/$B/src/libfa4.so timeout ${DECODE_TIMEOUT:-300} python3 bench/bench_decode.py $OUT/bench_decode.json ${DECODE_ARGS---quick} > $OUT/bench_decode.log 2>&1
  echo "bench_decode rc=$?"; tail -${BENCH_TAIL:-40} $OUT/bench_decode.log
fi
if [ "${KTIMES:-0}" = 1 ]; then
  PYTHONPATH=python:bench FA4_LIBRARY=$PWD/$B/src/libfa4.so timeout 200 python3 bench/kernel_times.py $OUT/kernel_times.json > $OUT/kernel_times.log 2>&1
  echo "kernel_times rc=$?"; tail -12 $OUT/kernel_times.log
fi
if [ "${SPLITS:-0}" = 1 ]; then
  PYTHONPATH=python:bench FA4_LIBRARY=$PWD/$B/src/libfa4.so timeout 240 python3 bench/decode_split_sweep.py $OUT/decode_split_sweep.json ${SPLITS_ARGS:-} > $OUT/decode_split_sweep.log 2>&1
  echo "decode_split_sweep rc=$?"; cut -c1-220 $OUT/decode_split_sweep.log | tail -16
fi
if [ "${SMALLQ:-0}" = 1 ]; then
  PYTHONPATH=python:bench FA4_LIBRARY=$PWD/$B/src/libfa4.so timeout 200 python3 bench/small_q_route.py $OUT/small_q_route.json > $OUT/small_q_route.log 2>&1
  echo "small_q_route rc=$?"; tail -20 $OUT/small_q_route.log
fi
if [ "${NCU:-0}" = 1 ]; then  # every kernel's time, and the main kernels' throughput and stalls
  PYTHONPATH=python FA4_LIBRARY=$PWD/$B/src/libfa4.so timeout 240 ncu --clock-control none \
    --metrics gpu__time_duration.sum python3 bench/profile_bwd.py ${NCU_ARGS:-128 0 4096} > $OUT/ncu_times.txt 2>&1
  echo "ncu times rc=$?"; grep -E "^  [^ ].*\(|gpu__time_duration" $OUT/ncu_times.txt | cut -c1-120 | tail -40
  PYTHONPATH=python FA4_LIBRARY=$PWD/$B/src/libfa4.so timeout 240 ncu --clock-control none -k regex:"bwd_kernel|bprop" \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --metrics regex:'^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$' \
    python3 bench/profile_bwd.py ${NCU_ARGS:-128 0 4096} > $OUT/ncu.txt 2>&1
  echo "ncu rc=$?"; grep -E "bwd_kernel|bprop|Duration|SM Busy|Issue Slots|Spilling Requests  |stalled_[a-z_]+_per" $OUT/ncu.txt | cut -c1-130 | head -60
fi
if [ "${DNCU:-0}" = 1 ]; then  # the decode kernel's throughput and stall reasons (bench/profile_decode.py)
  PYTHONPATH=python:bench FA4_LIBRARY=$PWD/$B/src/libfa4.so timeout 240 ncu --clock-control none -k regex:decode_kernel \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    --metrics regex:'^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$',smsp__inst_executed.sum,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum \
    python3 bench/profile_decode.py ${DNCU_ARGS:-1,1024,32,8,128,1 1,8192,32,8,128,0} > $OUT/ncu_decode.txt 2>&1
  echo "ncu decode rc=$?"; grep -E "decode_kernel|Duration|SM Busy|Issue Slots Busy|Memory Throughput|DRAM Throughput|L2 Hit Rate|Mem Pipes Busy|inst_executed|sectors_srcunit|dram__bytes|stalled_[a-z_]+_per" $OUT/ncu_decode.txt \
    | awk '$NF+0 >= 0.05 || !/stalled/' | cut -c1-120 | head -${DNCU_LINES:-70}
fi
if [ "${FNCU:-0}" = 1 ]; then  # every contender's forward kernels: launch shape, occupancy, throughput, stalls
  # (bench/profile_fwd.py; an exported PYTHONPATH, e.g. upstream FlashAttention-4's, is kept),
  # the attention kernels only (fa4's fwd_kernel, cuDNN's fprop, FA2's and upstream's flash ones)
  PYTHONPATH=python:bench:${PYTHONPATH:-} FA4_LIBRARY=$PWD/$B/src/libfa4.so timeout 240 ncu --clock-control none \
    -k regex:"fwd_kernel|fprop|flash" --section SpeedOfLight --section LaunchStats --section Occupancy \
    --section WarpStateStats --metrics regex:'^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$' \
    python3 bench/profile_fwd.py ${FNCU_ARGS:-64 1 512} > $OUT/ncu_fwd.txt 2>&1
  echo "ncu fwd rc=$?"; grep -E "^  [^ ].*\(|Duration|Grid Size|Block Size|Registers Per|Dynamic Shared Memory Per|Waves Per SM|Achieved Occupancy|Compute \(SM\) Throughput|Warp Cycles Per Issued|stalled_[a-z_]+_per" \
    $OUT/ncu_fwd.txt | awk '$NF+0 >= 0.1 || !/stalled/' | cut -c1-120 | head -${FNCU_LINES:-120}
fi
for t in $([ "${TL:-0}" = 1 ] && echo tl) $([ "${TL_OLD:-0}" = 1 ] && [ -n "$OLD" ] && echo tlold); do
  # the decode phase timeline (bench/timeline/README.md), with the tree's own decode_ts.py
  [ -f build-$t/src/libfa4.so ] || { echo "timeline $t: no library"; continue; }
  PYTHONPATH=/tmp/$t/python:/tmp/$t/bench FA4_LIBRARY=$PWD/build-$t/src/libfa4.so timeout 150 python3 /tmp/$t/bench/timeline/decode_ts.py \
    $OUT/ts_$t.json > $OUT/ts_$t.log 2>&1
  echo "timeline $t rc=$?"; grep cupti $OUT/ts_$t.log | grep -v tiny | sed 's/last merger.*| median/| median/' | cut -c1-300
done
echo "spills new: $(cat $OUT/spills_build.txt)"
[ -n "$OLD" ] && echo "spills old: $(cat $OUT/spills_build_old.txt)"
for l in $VAR_LOGS; do echo "spills ${l#build_}: $(cat $OUT/spills_$l.txt)"; done
