// tools/fa4_cli.cpp — the `fa4` command-line tool.
//
//   fa4 check  run one case, compare O and LSE (and dq/dk/dv/dsink with --backward) against the
//              float64 reference (Backend::kCpuReference) under the accuracy rule
//                  max|out - ref| <= 2 * max|naive_same_precision - ref| + atol
//              (atol = one rounding of the largest reference value in the tensor's dtype);
//              prints PASS/FAIL, exit status 1 on FAIL.
//   fa4 bench  time one case; TFLOP/s with FLOPs = 2 * (headdim + headdim_v) per VISIBLE
//              (query, key) pair per head (= 4*b*h*sq*sk*d without a mask), x2.5 for --backward.
//   fa4 info   version, CUDA build, visible GPUs.
// Exit status: 0 ok/PASS, 1 FAIL, 2 bad arguments or an fa4::Error.
#ifndef FA4_WITH_CUDA
#define FA4_WITH_CUDA 0
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <omp.h>

#include "cli_case.h"
#include "cli_device.h"

#ifndef FA4_VERSION
#define FA4_VERSION "unknown"
#endif

namespace fa4::cli {
namespace {

using nlohmann::json;

constexpr int kExitFail = 1;
constexpr int kExitError = 2;

// Repetition defaults: CPU runs are long and steady, GPU runs short and noisy.
constexpr int kCpuWarmup = 1, kCpuReps = 5;
constexpr int kGpuWarmup = 10, kGpuReps = 50;

/// Flags of `check` / `bench` that need "was it given?" (CLI11 fills plain values).
struct CaseFlags {
  CaseSpec spec;
  float softmax_scale = 0.0f;
  float exp2_emulation_fraction = 0.0f;
  CLI::Option* scale_opt = nullptr;
  CLI::Option* exp2_opt = nullptr;

  CaseSpec resolve() const {
    CaseSpec s = spec;
    if (scale_opt->count() > 0) s.softmax_scale = softmax_scale;
    if (exp2_opt->count() > 0) s.exp2_emulation_fraction = exp2_emulation_fraction;
    return s;
  }
};

/// A decimal integer in [0, 2^64): CLI11 would wrap "-1" and clamp "2^64" into a uint64.
const CLI::Validator kSeedRule(
    [](std::string& v) -> std::string {
      const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
      if (!digits || v.size() > 20 || (v.size() == 20 && v > "18446744073709551615"))
        return "must be an integer in [0, 2^64)";
      return "";
    },
    "UINT64");

void add_case_options(CLI::App* app, CaseFlags& f) {
  CaseSpec& s = f.spec;
  // Sizes are checked here, so that an error names the option (the library's would name a tensor
  // dim or a stride, and a varlen batch < 0 would be an empty problem).
  app->add_option("--batch,-b", s.batch, "batch size")->check(CLI::Range(0, 1 << 30))->capture_default_str();
  app->add_option("--seqlen-q", s.seqlen_q, "query length (varlen: the maximum)")
      ->check(CLI::Range(0, INT32_MAX))->capture_default_str();
  app->add_option("--seqlen-k", s.seqlen_k, "key length (varlen: the maximum)")
      ->check(CLI::Range(0, INT32_MAX))->capture_default_str();
  app->add_option("--num-heads", s.num_heads, "query heads")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app->add_option("--num-heads-kv", s.num_heads_kv, "key/value heads (GQA/MQA); default num-heads")
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--headdim,-d", s.headdim, "head dim of q and k")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app->add_option("--headdim-v", s.headdim_v, "head dim of v and out; default headdim")
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--dtype", s.dtype, "element type of q/k/v/out")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}))->capture_default_str();
  app->add_flag("--causal", s.causal, "causal mask, aligned bottom-right");
  app->add_option("--window", s.window, "window_size_left window_size_right (-1 = unbounded)")
      ->expected(2)->capture_default_str();
  app->add_option("--softcap", s.softcap, "tanh logit cap (0 = off)")->capture_default_str();
  app->add_flag("--sink", s.sink, "add random per-head attention-sink logits");
  f.scale_opt = app->add_option("--softmax-scale", f.softmax_scale, "default 1/sqrt(headdim)");
  CLI::Option* varlen = app->add_flag("--varlen", s.varlen, "packed layout with random lengths in [1, seqlen]");
  app->add_option("--pad-rows", s.pad_rows,
                  "varlen: packed rows after the last sequence, NaN in the inputs; outputs there must stay untouched")
      ->check(CLI::Range(0, 1 << 30))->needs(varlen)->capture_default_str();
  app->add_option("--rescale-threshold", s.rescale_threshold, "lazy-rescaling threshold tau (log2 units)")
      ->capture_default_str();
  f.exp2_opt = app->add_option("--exp2-emulation-fraction", f.exp2_emulation_fraction,
                               "share of exp2 done by the FMA polynomial (multiple of 1/16); "
                               "default: the kernel's tuned value");
  app->add_option("--device", s.device, "where the implementation under test runs")
      ->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  app->add_option("--seed", s.seed, "random seed of the inputs")->check(kSeedRule)->capture_default_str();
  CLI::Option* backward = app->add_flag("--backward", s.backward, "also run/check the backward (dq, dk, dv)");
  app->add_flag("--deterministic", s.deterministic, "deterministic backward")->needs(backward);
}

json spec_json(const CaseSpec& s) {
  json j = {{"batch", s.batch}, {"seqlen_q", s.seqlen_q}, {"seqlen_k", s.seqlen_k},
            {"num_heads", s.num_heads}, {"num_heads_kv", s.heads_kv()}, {"headdim", s.headdim},
            {"headdim_v", s.dim_v()}, {"dtype", s.dtype}, {"causal", s.causal},
            {"window_size_left", s.window[0]}, {"window_size_right", s.window[1]},
            {"softcap", s.softcap}, {"sink", s.sink}, {"softmax_scale", s.resolved_scale()},
            {"varlen", s.varlen}, {"pad_rows", s.pad_rows}, {"rescale_threshold", s.rescale_threshold},
            {"device", s.device}, {"seed", s.seed}, {"backward", s.backward},
            {"deterministic", s.deterministic}};
  j["exp2_emulation_fraction"] = s.exp2_emulation_fraction ? json(*s.exp2_emulation_fraction) : json(nullptr);
  return j;
}

/// Throws unless the requested device can run (CUDA built and a GPU visible).
void require_device(const CaseSpec& s) {
  if (s.device != "cuda") return;
  std::string why;
  if (gpu_count(&why) == 0) throw Error(ErrorCode::kNoDevice, "fa4 cli: --device cuda: " + why);
}

/// Runs the implementation under test (kAuto on the requested device); outputs land in p.
/// Returns the name of the forward kernel that ran.
std::string run_under_test(Problem& p) {
  std::string kernel;
  if (p.spec.device == "cpu") {
    const Placement at = Placement::host(p);
    run_forward(p, at, Backend::kAuto);  // first: a bad case throws its own fa4::Error
    kernel = forward_kernel_name(p, at);
    if (p.spec.backward) run_backward(p, at, Backend::kAuto);
  }
#if FA4_WITH_CUDA
  else {
    DeviceProblem dp(p, nullptr);
    run_forward(p, dp.placement(), Backend::kAuto);
    kernel = forward_kernel_name(p, dp.placement());
    if (p.spec.backward) run_backward(p, dp.placement(), Backend::kAuto);
    dp.download_outputs();
  }
#endif
  return kernel;
}

// ---- check ---------------------------------------------------------------------------------------

int cmd_check(const CaseSpec& spec, bool as_json) {
  require_device(spec);
  Problem test = Problem::make(spec);
  Problem untouched = test;  // inputs + poisoned outputs, for the oracle and the untouched check
  const std::string kernel = run_under_test(test);
  const std::vector<test::Accuracy> acc = check_outputs(test, untouched);

  bool all_pass = true;
  int64_t checked = 0;  // elements compared over every output: 0 for an empty case
  json results = json::array();
  for (const test::Accuracy& a : acc) {
    all_pass = all_pass && a.ok();
    checked += a.checked;
    results.push_back({{"tensor", a.name}, {"max_err", a.err}, {"naive_max_err", a.naive_err},
                       {"atol", a.atol}, {"slack", a.extra}, {"bound", a.bound()},
                       {"checked", a.checked}, {"bad_nonfinite", a.bad_nonfinite},
                       {"naive_nonfinite", a.naive_nonfinite},
                       {"touched_outside", a.touched_outside}, {"pass", a.ok()}});
  }
  if (as_json) {
    const json j = {{"command", "check"}, {"case", spec_json(spec)}, {"forward_kernel", kernel},
                    {"results", results}, {"empty", checked == 0}, {"pass", all_pass}};
    std::cout << j.dump(2) << "\n";
    return all_pass ? 0 : kExitFail;
  }
  std::printf("fa4 check: %s\nforward kernel: %s\n", spec.describe().c_str(), kernel.c_str());
  std::printf("  %-6s %13s %14s %11s %11s %11s  %s\n", "tensor", "max|fa4-ref|", "max|naive-ref|",
              "atol", "slack", "bound", "result");
  for (const test::Accuracy& a : acc) {
    std::printf("  %-6s %13.4e %14.4e %11.3e %11.3e %11.4e  %s\n", a.name.c_str(), a.err,
                a.naive_err, a.atol, a.extra, a.bound(), !a.ok() ? "FAIL" : a.checked ? "PASS" : "EMPTY");
    if (a.bad_nonfinite || a.touched_outside || a.naive_nonfinite)
      std::printf("         %lld wrong NaN/inf, %lld elements written outside the sequences, "
                  "%lld non-finite naive\n", static_cast<long long>(a.bad_nonfinite),
                  static_cast<long long>(a.touched_outside), static_cast<long long>(a.naive_nonfinite));
  }
  if (all_pass && checked == 0)
    std::printf("EMPTY  (the case has no element to compare: nothing was checked)\n");
  else
    std::printf("%s  (rule: max|fa4-ref| <= 2*max|naive-ref| + atol + slack; ref = float64 oracle)\n",
                all_pass ? "PASS" : "FAIL");
  return all_pass ? 0 : kExitFail;
}

// ---- bench ---------------------------------------------------------------------------------------

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Timing {
  std::vector<double> ms;
  std::string timer;
  bool l2_flushed = false;
};

Timing time_cpu(Problem& p, int warmup, int reps, std::string* kernel) {
  const Placement at = Placement::host(p);
  run_forward(p, at, Backend::kAuto);  // the backward consumes out/lse; errors surface here
  *kernel = forward_kernel_name(p, at);
  auto once = [&] {
    if (p.spec.backward) run_backward(p, at, Backend::kAuto);
    else run_forward(p, at, Backend::kAuto);
  };
  for (int i = 0; i < warmup; ++i) once();
  Timing t{{}, "steady_clock", false};
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    once();
    const auto t1 = std::chrono::steady_clock::now();
    t.ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return t;
}

#if FA4_WITH_CUDA
Timing time_gpu(Problem& p, int warmup, int reps, std::string* kernel) {
  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreate(&stream), "cudaStreamCreate");
  Timing t{{}, "cuda_events", true};
  {
    DeviceProblem dp(p, stream);
    L2Flusher l2;
    const Placement& at = dp.placement();
    run_forward(p, at, Backend::kAuto);  // the backward consumes out/lse; errors surface here
    *kernel = forward_kernel_name(p, at);
    auto once = [&] {
      if (p.spec.backward) run_backward(p, at, Backend::kAuto);
      else run_forward(p, at, Backend::kAuto);
    };
    for (int i = 0; i < warmup; ++i) once();
    cudaEvent_t start, stop;
    cuda_check(cudaEventCreate(&start), "cudaEventCreate");
    cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
    for (int i = 0; i < reps; ++i) {
      l2.flush(stream);  // outside the timed range
      cuda_check(cudaEventRecord(start, stream), "cudaEventRecord");
      once();
      cuda_check(cudaEventRecord(stop, stream), "cudaEventRecord");
      cuda_check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0.0f;
      cuda_check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      t.ms.push_back(ms);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  cudaStreamDestroy(stream);
  return t;
}
#endif

int cmd_bench(const CaseSpec& spec, int warmup, int reps, bool as_json) {
  require_device(spec);
  if (reps < 1 || warmup < 0)
    throw Error(ErrorCode::kInvalidArgument, "fa4 cli: --reps must be >= 1 and --warmup >= 0");
  Problem p = Problem::make(spec);
  std::string kernel;
  Timing t;
  if (spec.device == "cpu") t = time_cpu(p, warmup, reps, &kernel);
#if FA4_WITH_CUDA
  else t = time_gpu(p, warmup, reps, &kernel);
#endif
  // FLOPs of the two matmuls (q.k^T and P.v) over visible pairs only; the backward does 2.5x the
  // forward's matmul work (5 matmuls instead of 2), the usual FlashAttention convention.
  constexpr double kBackwardFlopFactor = 2.5;
  const double pairs = static_cast<double>(p.visible_pairs()) * spec.num_heads;
  double flops = pairs * 2.0 * (spec.headdim + spec.dim_v());
  if (spec.backward) flops *= kBackwardFlopFactor;
  const double med = median(t.ms);
  const double tflops = med > 0 ? flops / (med * 1e-3) / 1e12 : 0.0;
  const double best = *std::min_element(t.ms.begin(), t.ms.end());

  if (as_json) {
    json j = {{"command", "bench"}, {"case", spec_json(spec)}, {"forward_kernel", kernel},
              {"direction", spec.backward ? "bwd" : "fwd"}, {"flops", flops},
              {"visible_pairs_per_head", p.visible_pairs()}, {"median_ms", med},
              {"min_ms", best}, {"tflops", tflops}, {"warmup", warmup}, {"reps", reps},
              {"timer", t.timer}, {"l2_flushed", t.l2_flushed}, {"times_ms", t.ms}};
    if (spec.device == "cpu") j["cpu_threads"] = omp_get_max_threads();
    std::cout << j.dump() << "\n";
  } else {
    std::printf("fa4 bench: %s\nforward kernel: %s  (timing the %s)\n", spec.describe().c_str(), kernel.c_str(),
                spec.backward ? "backward" : "forward");
    std::printf("  median %.4f ms  min %.4f ms  over %d reps (%d warm-up, %s%s)\n", med, best, reps,
                warmup, t.timer.c_str(), t.l2_flushed ? ", L2 flushed" : "");
    std::printf("  %.4g GFLOP  ->  %.3f TFLOP/s\n", flops * 1e-9, tflops);
  }
  return 0;
}

// ---- info ----------------------------------------------------------------------------------------

int cmd_info(bool as_json) {
  json j = {{"command", "info"}, {"version", FA4_VERSION},
            {"cuda_built", static_cast<bool>(FA4_WITH_CUDA)}, {"cpu_threads", omp_get_max_threads()},
            {"hardware_threads", std::thread::hardware_concurrency()}};
  std::string why;
  const int n = gpu_count(&why);
  json gpus = json::array();
#if FA4_WITH_CUDA
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    gpus.push_back({{"index", i}, {"name", prop.name},
                    {"compute_capability", std::to_string(prop.major) + "." + std::to_string(prop.minor)},
                    {"sms", prop.multiProcessorCount},
                    {"memory_gib", static_cast<double>(prop.totalGlobalMem) / (1ull << 30)},
                    {"l2_mib", static_cast<double>(prop.l2CacheSize) / (1 << 20)}});
  }
#endif
  j["gpus"] = gpus;
  if (n == 0) j["gpu_note"] = why;
  if (as_json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("fa4 %s\nCUDA kernels built: %s\nCPU threads (OpenMP): %d\nGPUs visible: %d\n",
              FA4_VERSION, FA4_WITH_CUDA ? "yes" : "no", omp_get_max_threads(), n);
  if (n == 0) std::printf("  (%s)\n", why.c_str());
  for (const json& g : gpus)
    std::printf("  [%d] %s  sm_%s  %d SMs  %.1f GiB  L2 %.0f MiB\n", g["index"].get<int>(),
                g["name"].get<std::string>().c_str(), g["compute_capability"].get<std::string>().c_str(),
                g["sms"].get<int>(), g["memory_gib"].get<double>(), g["l2_mib"].get<double>());
  return 0;
}

}  // namespace
}  // namespace fa4::cli

int main(int argc, char** argv) {
  using namespace fa4::cli;
  CLI::App app{"fa4 — exact attention with the FlashAttention-4 algorithm (CPU + Hopper sm_90a)"};
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", std::string("fa4 ") + FA4_VERSION);

  CaseFlags check_flags, bench_flags;
  bool check_json = false, bench_json = false, info_json = false;
  int warmup = -1, reps = -1;

  CLI::App* check = app.add_subcommand("check", "run a case and compare with the float64 reference");
  add_case_options(check, check_flags);
  check->add_flag("--json", check_json, "print one JSON object");

  CLI::App* bench = app.add_subcommand("bench", "time a case and print TFLOP/s");
  add_case_options(bench, bench_flags);
  CLI::Option* warmup_opt = bench->add_option("--warmup", warmup, "untimed runs first (default cpu 1, cuda 10)");
  CLI::Option* reps_opt = bench->add_option("--reps", reps, "timed runs; the median is reported (default cpu 5, cuda 50)");
  bench->add_flag("--json", bench_json, "print one JSON object");

  CLI::App* info = app.add_subcommand("info", "version, CUDA build, visible GPUs");
  info->add_flag("--json", info_json, "print one JSON object");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help/--version exit 0; every malformed command line exits kExitError, as documented.
    return app.exit(e) == 0 ? 0 : kExitError;
  }
  try {
    if (check->parsed()) return cmd_check(check_flags.resolve(), check_json);
    if (bench->parsed()) {
      const CaseSpec spec = bench_flags.resolve();
      const bool gpu = spec.device == "cuda";
      if (warmup_opt->count() == 0) warmup = gpu ? kGpuWarmup : kCpuWarmup;
      if (reps_opt->count() == 0) reps = gpu ? kGpuReps : kCpuReps;
      return cmd_bench(spec, warmup, reps, bench_json);
    }
    if (info->parsed()) return cmd_info(info_json);
  } catch (const fa4::Error& e) {
    std::fprintf(stderr, "error [%s]: %s\n", fa4::error_code_name(e.code()), e.what());
    return kExitError;
  } catch (const std::exception& e) {  // e.g. std::bad_alloc for a case too large for this machine
    std::fprintf(stderr, "error: %s\n", e.what());
    return kExitError;
  }
  std::cout << app.help();
  return 0;
}
