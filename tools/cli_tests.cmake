# CTest cases of the `fa4` tool (included from tests/CMakeLists.txt when the tool is built).
# Each `check` case fails if the CPU implementation misses the accuracy rule; the bench cases pin the
# FLOP count (visible pairs) with exact numbers worked out by hand.
set(_fa4 $<TARGET_FILE:fa4_cli>)

add_test(NAME cli.help COMMAND ${_fa4})
set_tests_properties(cli.help PROPERTIES PASS_REGULAR_EXPRESSION "Subcommands:.*check.*bench.*info")
add_test(NAME cli.version COMMAND ${_fa4} --version)
set_tests_properties(cli.version PROPERTIES PASS_REGULAR_EXPRESSION "^fa4 ${PROJECT_VERSION}\n$")
add_test(NAME cli.info COMMAND ${_fa4} info --json)
set_tests_properties(cli.info PROPERTIES PASS_REGULAR_EXPRESSION "\"cuda_built\"")
set_tests_properties(cli.help cli.version cli.info PROPERTIES LABELS "cpu;cli")

# Accuracy checks (exit status 1 on FAIL).
add_test(NAME cli.check.default COMMAND ${_fa4} check)
add_test(NAME cli.check.bwd_gqa_varlen_causal_sink
         COMMAND ${_fa4} check --backward --num-heads 4 --num-heads-kv 2 --varlen --causal --sink --seed 1)
add_test(NAME cli.check.fp32_window_softcap_bwd
         COMMAND ${_fa4} check --dtype fp32 --backward --window 32 8 --softcap 5 --seed 2)
add_test(NAME cli.check.fp16_sq_gt_sk_causal_dv
         COMMAND ${_fa4} check --dtype fp16 --seqlen-q 300 --seqlen-k 100 --causal --headdim 40
                 --headdim-v 72 --backward --seed 3)
add_test(NAME cli.check.exp2_all_emulated_tau0
         COMMAND ${_fa4} check --exp2-emulation-fraction 1 --rescale-threshold 0 --seed 4)
# Rows after the last varlen sequence hold NaN inputs; every output there must stay untouched.
add_test(NAME cli.check.varlen_pad_rows
         COMMAND ${_fa4} check --varlen --pad-rows 7 --backward --causal --sink --num-heads 4 --num-heads-kv 2 --seed 5)
set_tests_properties(cli.check.default cli.check.bwd_gqa_varlen_causal_sink cli.check.varlen_pad_rows
  cli.check.fp32_window_softcap_bwd cli.check.fp16_sq_gt_sk_causal_dv cli.check.exp2_all_emulated_tau0
  PROPERTIES LABELS "cpu;cli")

# A bad option is an fa4::Error naming the option, exit status 2.
add_test(NAME cli.check.bad_window COMMAND ${_fa4} check --window -5 0)
set_tests_properties(cli.check.bad_window PROPERTIES
  PASS_REGULAR_EXPRESSION "error \\[invalid_argument\\]: .*window_size_left" LABELS "cpu;cli")
# Sizes, the seed and option pairs are checked by the tool (the error names the option, exit 2):
# a varlen batch < 0 was an empty case that passed, a seed of -1 wrapped, --deterministic without
# --backward did nothing.
add_test(NAME cli.check.bad_varlen_batch COMMAND ${_fa4} check --varlen --batch -5)
add_test(NAME cli.check.bad_seed COMMAND ${_fa4} check --seed -1)
add_test(NAME cli.check.deterministic_needs_backward COMMAND ${_fa4} check --deterministic)
add_test(NAME cli.check.pad_rows_needs_varlen COMMAND ${_fa4} check --pad-rows 3)
set_tests_properties(cli.check.pad_rows_needs_varlen PROPERTIES
  PASS_REGULAR_EXPRESSION "--pad-rows requires --varlen" LABELS "cpu;cli")
set_tests_properties(cli.check.bad_varlen_batch PROPERTIES PASS_REGULAR_EXPRESSION "--batch" LABELS "cpu;cli")
set_tests_properties(cli.check.bad_seed PROPERTIES PASS_REGULAR_EXPRESSION "--seed" LABELS "cpu;cli")
set_tests_properties(cli.check.deterministic_needs_backward PROPERTIES
  PASS_REGULAR_EXPRESSION "--deterministic requires --backward" LABELS "cpu;cli")
# An empty case compares nothing and says so instead of PASS.
add_test(NAME cli.check.empty_case COMMAND ${_fa4} check --batch 0)
set_tests_properties(cli.check.empty_case PROPERTIES PASS_REGULAR_EXPRESSION "EMPTY"
  FAIL_REGULAR_EXPRESSION "PASS" LABELS "cpu;cli")

# FLOP count = visible pairs: causal 128x128 -> 128*129/2 = 8256 pairs per head;
# window (16, 0) on 128x128 -> (1 + ... + 16) + 17 * 112 = 136 + 1904 = 2040.
add_test(NAME cli.bench.causal_pairs
         COMMAND ${_fa4} bench --json --batch 1 --seqlen-q 128 --seqlen-k 128 --causal --warmup 0 --reps 1)
set_tests_properties(cli.bench.causal_pairs PROPERTIES
  PASS_REGULAR_EXPRESSION "\"visible_pairs_per_head\":8256[,}].*\"tflops\"|\"tflops\".*\"visible_pairs_per_head\":8256[,}]"
  LABELS "cpu;cli")
add_test(NAME cli.bench.window_pairs_bwd
         COMMAND ${_fa4} bench --json --batch 1 --seqlen-q 128 --seqlen-k 128 --window 16 0 --backward
                 --warmup 0 --reps 1)
set_tests_properties(cli.bench.window_pairs_bwd PROPERTIES
  PASS_REGULAR_EXPRESSION "\"visible_pairs_per_head\":2040[,}]" LABELS "cpu;cli")

# GPU: the same check on the Hopper kernels; skipped where no GPU is visible.
if(FA4_WITH_CUDA)
  add_test(NAME cli.check.cuda COMMAND ${_fa4} check --device cuda --headdim 128 --causal)
  add_test(NAME cli.check.cuda_bwd_gqa_varlen
           COMMAND ${_fa4} check --device cuda --backward --headdim 64 --num-heads 4 --num-heads-kv 2
                   --varlen --causal --sink --seed 5)
  set_tests_properties(cli.check.cuda cli.check.cuda_bwd_gqa_varlen PROPERTIES LABELS "gpu;cli"
    SKIP_REGULAR_EXPRESSION "no CUDA device visible|cudaGetDeviceCount")
endif()
