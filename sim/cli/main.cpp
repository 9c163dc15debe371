// kvsim command-line interface (CLI11): one add_* function per subcommand (options + callback).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <cmath>
#include <malloc.h>

#include <iostream>
#include <new>
#include <thread>

#include "kvsim/core/blas.hpp"
#include "kvsim/cli/allocate.hpp"
#include "kvsim/cli/bench.hpp"
#include "kvsim/cli/closed_loop.hpp"
#include "kvsim/cli/task.hpp"
#include "kvsim/analysis/clustering.hpp"
#include "kvsim/cli/config.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/replay/mpi.hpp"
#include "kvsim/cuda/cuda.hpp"
#include "kvsim/cli/inspect.hpp"
#include "kvsim/cli/run.hpp"
#include "kvsim/model/record.hpp"
#include "kvsim/io/provenance.hpp"
#include "kvsim/io/results.hpp"
#include "kvsim/io/synth.hpp"
#include "kvsim/policies/registry.hpp"
#include "kvsim/replay/engine.hpp"
#include "kvsim/replay/metrics.hpp"

using namespace kvsim;

namespace {

/// A subcommand's exit status other than 0, thrown out of its callback.
struct Exit {
  int code;
};

void add_run(CLI::App& app) {
  auto* run = app.add_subcommand("run", "replay an experiment config through exact attention and its policies");
  static RunOptions o;
  run->add_option("config", o.config, "experiment TOML file")->required();
  run->add_option("--out", o.out, "output folder (default results/<name>)");
  run->add_option("--threads", o.threads, "worker threads (default: all cores)");
  run->add_option("--set", o.sets, "override a config key, e.g. --set eval.every=4 (repeatable)");
  run->add_flag("--quiet", o.quiet, "print nothing but errors");
  run->add_option("--device", o.device, "cpu or cuda: where the exact reference runs (= --set eval.device=...)")
      ->check(CLI::IsMember(choice_list<Device>()));
  auto* resume = run->add_flag("--resume", o.resume, "continue the unfinished run in --out (its checkpointed cells are kept)");
  run->add_flag("--force", o.force, "discard an unfinished run in --out and start over")->excludes(resume);
  run->callback([] { cmd_run(o); });
}

void add_synth(CLI::App& app) {
  auto* synth = app.add_subcommand("synth", "write a seeded synthetic stream in the recording schema");
  static SynthParams sp;
  static std::string synth_out;
  synth->add_option("--preset", sp.preset, "gaussian | clustered | heavy_hitter")->required();
  synth->add_option("--n", sp.n, "tokens")->capture_default_str();
  synth->add_option("--d", sp.head_dim, "head_dim")->capture_default_str();
  synth->add_option("--layers", sp.n_layers, "layers")->capture_default_str();
  synth->add_option("--heads", sp.n_heads, "query heads")->capture_default_str();
  synth->add_option("--kv-heads", sp.n_kv_heads, "kv heads (default: = heads)");
  synth->add_option("--seed", sp.seed, "seed")->capture_default_str();
  synth->add_option("--cluster-gamma", sp.cluster_gamma, "clustered: m(n) = ceil(c n^gamma)")->capture_default_str();
  synth->add_option("--cluster-c", sp.cluster_c, "clustered: c")->capture_default_str();
  synth->add_option("--cluster-diameter", sp.cluster_diameter, "clustered: cluster diameter delta0")->capture_default_str();
  synth->add_option("--query-norm", sp.query_norm, "clustered: bound r on |scaled q|")->capture_default_str();
  synth->add_option("--n-heavy", sp.n_heavy, "heavy_hitter: number of heavy tokens")->capture_default_str();
  synth->add_option("--heavy-strength", sp.heavy_strength, "heavy_hitter: logit boost")->capture_default_str();
  synth->add_option("--out", synth_out, "output .h5")->required();

  synth->callback([synth] {
    if (!synth->count("--kv-heads")) sp.n_kv_heads = sp.n_heads;
    SynthSource src(sp);
    write_synthetic(src, synth_out);
    std::cout << "wrote " << synth_out << " (" << src.describe() << ")\n";
  });
}

void record_summary(const RecordOptions& ro, const RecordResult& r, bool print_text) {
  std::cout << "recorded " << r.tokens.size() << " tokens";
  if (!ro.out.empty()) std::cout << " into " << ro.out;
  std::cout << "\n";
  if (r.forward_seconds > 0)
    std::printf("forward (%s): %.2f s, %.1f tokens/s\n", r.path_taken.c_str(), r.forward_seconds,
                double(r.tokens.size()) / r.forward_seconds);
  if (!r.cross_entropy.empty())
    std::cout << "mean cross-entropy: " << r.mean_cross_entropy << " nats/token over " << r.cross_entropy.size()
              << " predictions\n";
  if (!ro.policy.empty() && !std::isnan(r.exact_cross_entropy))
    std::cout << "closed loop (" << ro.policy << "): cross-entropy " << r.mean_cross_entropy << " vs exact cache "
              << r.exact_cross_entropy << " (increase " << r.mean_cross_entropy - r.exact_cross_entropy << " nats/token)\n";
  if (!ro.policy.empty() && ro.generate > 0)
    std::cout << "closed loop (" << ro.policy << "): greedy output "
              << (r.diverge_at < 0 ? std::string("never differs from the exact cache's")
                                   : "first differs from the exact cache's at token " + std::to_string(r.diverge_at))
              << "\n";
  if (print_text) std::cout << "text: " << r.text << "\n";
}

void add_record(CLI::App& app) {
  auto* record = app.add_subcommand("record", "run a llama2.c or GGUF checkpoint and record q, k, v of every layer and head");
  static RecordOptions ro;
  record->add_option("--checkpoint", ro.checkpoint, "llama2.c model .bin, or a GGUF file of the llama architecture")
      ->required()->check(CLI::ExistingFile);
  record->add_option("--tokenizer", ro.tokenizer, "llama2.c tokenizer.bin (a GGUF file carries its own)")->check(CLI::ExistingFile);
  auto* text_opt = record->add_option("--text", ro.text_path, "teacher-forced: text file")->check(CLI::ExistingFile);
  auto* tokens_opt = record->add_option("--tokens", ro.tokens, "teacher-forced: tokens to record (<= seq_len)")->capture_default_str();
  record->add_option("--text-tail", ro.text_tail,
                     "teacher-forced: use only the last FRACTION of the text's tokens (a held-out split; shakespeare-q80: 0.05)")
      ->check(CLI::Range(0.0, 0.999999));
  static int windows = 0;
  static bool print_text = false;
  record->add_option("--windows", windows,
                     "teacher-forced: record N disjoint consecutive windows of --tokens tokens into OUT_w00.h5 ... (several sequences)");
  record->add_flag("--print-text", print_text, "also print the recorded text");
  auto* gen_opt = record->add_option("--generate", ro.generate, "greedy generation: positions to record");
  record->add_option("--prompt", ro.prompt, "generation prompt (default: BOS only)");
  record->add_option("--out", ro.out, "output .h5");
  record->add_flag("!--no-attn", ro.with_attn, "do not store the model's attention output");
  record->add_option("--deflate", ro.deflate,
                     "compress the tensors with shuffle + deflate at LEVEL 1-9 (default 0: uncompressed, ~15% larger, "
                     "~27% faster to record)")
      ->check(CLI::Range(0, 9))->capture_default_str();
  static std::vector<std::string> policy_params;
  record->add_option("--policy", ro.policy, "closed loop: a policy manages every (layer, KV head) cache");
  record->add_option("--param", policy_params, "policy parameter key=value (repeatable), e.g. --param budget=0.25");
  record->add_option("--gqa", "closed loop: kv_head (default) or query_head")
      ->check(CLI::IsMember(choice_list<GqaMode>()))
      ->each([&ro](const std::string& s) { ro.gqa = *parse_choice<GqaMode>(s); });
  record->add_option("--seed", ro.seed, "closed loop: policy seed");
  record->add_option("--prefill", ro.prefill,
                     "teacher-forced without --policy: batched (GEMM prefill, written layer by layer), per-token, or "
                     "auto (batched for GGUF, per-token for llama2.c)")
      ->check(CLI::IsMember({"auto", "batched", "per-token"}))->capture_default_str();
  record->add_option("--threads", ro.threads, "batched prefill threads (0 = all)")->capture_default_str();
  record->add_option("--layers", ro.layers,
                     "layers to store: all, global (those without a sliding window: Gemma 3's 5, 11, 17) or a list "
                     "such as 5,11,17; a subset is renumbered 0, 1, … (attribute subset_layers)")
      ->capture_default_str();

  text_opt->excludes(gen_opt);
  record->callback([tokens_opt] {
    if (ro.text_path.empty() && ro.generate <= 0) throw Error("kvsim record: give --text FILE or --generate N");
    if (!ro.text_path.empty() && tokens_opt->count() == 0)
      throw Error("kvsim record: --text needs --tokens N (how many tokens to record)");
    if (!policy_params.empty() && ro.policy.empty()) throw Error("kvsim record: --param needs --policy");
    for (const auto& kv : policy_params) {
      auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) throw Error("kvsim record: --param '" + kv + "': expected key=value");
      ro.policy_params.set(kv.substr(0, eq), parse_param_value(kv.substr(eq + 1)), "--param " + kv);
    }
    if (windows > 0) {
      const auto paths = record_windows(ro, windows);
      std::cout << "recorded " << windows << " windows of " << ro.tokens << " tokens: " << paths.front() << " ... "
                << paths.back() << "\n";
      return;
    }
    record_summary(ro, record_model(ro), print_text);
  });
}

void add_closed_loop(CLI::App& app) {
  auto* closed = app.add_subcommand("closed-loop", "closed-loop model quality for every policy of a config (and open-loop error on the same text)");
  static std::string cl2_config, cl2_out;
  static std::vector<std::string> cl2_sets;
  static int cl2_threads = 0;
  closed->add_option("config", cl2_config, "closed-loop TOML (e.g. experiments/closed_loop.toml)")->required();
  closed->add_option("--out", cl2_out, "output folder (default results/<name>)");
  closed->add_option("--threads", cl2_threads, "threads for the open-loop replay");
  closed->add_option("--set", cl2_sets, "override a config key (repeatable)");
  closed->callback([] {
    ClosedLoopConfig c = load_closed_loop(cl2_config, cl2_sets);
    if (cl2_threads <= 0) cl2_threads = std::max(1u, std::thread::hardware_concurrency());
    const std::string out = cl2_out.empty() ? "results/" + c.name : cl2_out;
    const auto rows = run_closed_loop(c, out, cl2_threads);
    std::cout << closed_loop_report(c, rows) << "wrote " << out << "/closed_loop.csv\n";
  });
}

void add_task(CLI::App& app) {
  auto* task = app.add_subcommand("task", "retrieval tasks (passkey, word needle) in the closed loop, linked to open-loop error");
  static std::string t_config;
  static std::vector<std::string> t_sets;
  static TaskRunOptions t_opt;
  task->add_option("config", t_config, "task TOML (e.g. experiments/smollm2_passkey.toml)")->required();
  task->add_option("--out", t_opt.out, "output folder (default results/<name>)");
  task->add_option("--threads", t_opt.threads, "threads for the prefill, the batched decode and the open loop");
  task->add_option("--set", t_sets, "override a config key (repeatable), e.g. --set task.trials=2");
  auto* resume = task->add_flag("--resume", t_opt.resume, "continue the unfinished run in --out (its finished trials are kept)");
  task->add_flag("--force", t_opt.force, "discard an unfinished run in --out and start over")->excludes(resume);
  task->add_flag("--quiet", t_opt.quiet, "no per-trial progress on stderr");
  task->add_flag("--open-loop", t_opt.open_loop_only,
                 "replay the policies open-loop at the question's steps only (no answers, no generation): "
                 "open_loop.csv with the link and the offline scores");
  static std::string t_prompts;
  task->add_option("--prompts", t_prompts, "write every trial's prompt tokens as JSON Lines to FILE and exit (nothing is run)")
      ->excludes(resume);
  task->callback([] {
    const TaskConfig c = load_task(t_config, t_sets);
    if (!t_prompts.empty()) {
      write_task_prompts(c, t_prompts);
      std::cout << "wrote " << t_prompts << "\n";
      return;
    }
    if (t_opt.threads <= 0) t_opt.threads = int(std::max(1u, std::thread::hardware_concurrency()));
    if (t_opt.out.empty()) t_opt.out = "results/" + c.name;
    const auto rows = run_task(c, t_opt);
    if (t_opt.open_loop_only) {
      std::cout << "wrote " << t_opt.out << "/open_loop.csv (" << rows.size() << " rows)\n";
      return;
    }
    std::cout << task_report(c, rows) << "wrote " << t_opt.out << "/trials.csv and accuracy.csv\n";
  });
}

void add_clusters(CLI::App& app) {
  auto* clusters = app.add_subcommand("clusters", "SubGen Fig. 1-style clusterability of a recording's keys and values");
  static std::string cl_config, cl_out;
  static std::vector<std::string> cl_sets;
  clusters->add_option("config", cl_config, "clusters TOML (e.g. experiments/clusterability.toml)")->required();
  clusters->add_option("--out", cl_out, "output folder (default results/<name>)");
  clusters->add_option("--set", cl_sets, "override a config key, e.g. --set clusters.delta_rel=0.3");

  clusters->callback([] {
    ClusterStudy st = load_cluster_study(cl_config, cl_sets);
    std::cout << run_cluster_study(st, cl_out.empty() ? "results/" + st.name : cl_out);
  });
}

void add_allocate(CLI::App& app) {
  auto* al = app.add_subcommand("allocate", "budgets per layer or (layer, KV head) from a budget sweep, minimizing a summed error");
  static AllocateOptions ao;
  al->add_option("sweeps", ao.sweeps, "kvsim run output folders (or results.h5 files) of one budget sweep")->required();
  al->add_option("--policy", ao.policy, "the policy whose measured curves are read")->required();
  al->add_option("--memory", ao.memory, "mean memory to allocate: a fraction of n or tokens (repeatable, or comma-separated)")
      ->required()->delimiter(',');
  al->add_option("--out", ao.out, "the budgets file to write (JSON; a policy's budgets_file)")->required();
  al->add_option("--objective", ao.objective, "rel_err, eps or kept_mass (1 - kept_mass is minimized)")->capture_default_str();
  al->add_option("--granularity", ao.granularity, "head: per (layer, KV head); layer: one budget per layer")->capture_default_str();
  al->callback([] { std::cout << cmd_allocate(ao); });
}

void add_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "throughput figures against this machine's GEMM rate");
  static BenchOptions bo;
  bench->add_flag("--quick", bo.quick, "small sizes (seconds)");
  bench->add_option("--threads", bo.threads, "N for the 1-vs-N threads comparison (default: all cores)");
  bench->add_option("--json", bo.json, "also write the figures as JSON");
  bench->add_option("--model", bo.model, "checkpoint of the `model` section (default models/SmolLM2-135M-Instruct.Q4_1.gguf)");
  static std::string device = "cpu";  // parsed once, into bo.device, as `run` parses eval.device
  bench->add_option("--device", device, "cpu (default) or cuda")->check(CLI::IsMember(choice_list<Device>()));
  bench->add_option("--only", bo.only, "run only these sections of the CPU bench (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember(kBenchSections));
  bench->add_option("--cell", bo.cell,
                    "section cell: replay this config at one thread, each policy's time beside its FMA bound "
                    "(e.g. experiments/cell_cost_llama3_8b.toml)");
  bench->add_option("--set", bo.cell_set, "override a key of the --cell config (KEY=VALUE, repeatable)");

  bench->callback([] {
    bo.device = *parse_choice<Device>(device);
    std::cout << run_bench(bo);
  });
}

void add_inspect(CLI::App& app) {
  auto* inspect = app.add_subcommand("inspect", "print schema, shapes, norms and logit ranges of a recording");
  static std::string inspect_path;
  inspect->add_option("file", inspect_path, "recording .h5")->required();
  static bool check_attn = false;
  static double attn_tol = 1e-4;
  static std::vector<int> check_layers;
  inspect->add_flag("--check-attn", check_attn,
                    "replay exact attention and compare it with the recording's /layer_*/attn (exit 1 above --attn-tol)");
  inspect->add_option("--attn-tol", attn_tol, "relative tolerance for --check-attn (default 1e-4)");
  inspect->add_option("--layers", check_layers, "layers for --check-attn (default: all)");

  inspect->callback([] {
    if (!check_attn) {
      std::cout << inspect_recording(inspect_path);
      return;
    }
    const AttentionCheck c = check_recorded_attention(inspect_path, check_layers);
    bool ok = true;
    for (size_t i = 0; i < c.layers.size(); ++i) {
      const bool pass = c.worst[i] <= attn_tol;
      ok &= pass;
      std::printf("layer %d: max relative difference %.3g between kvsim's exact attention and the recorded attn (%s %.1g)\n",
                  c.layers[i], c.worst[i], pass ? "within" : "ABOVE", attn_tol);
    }
    std::cout << (ok ? "attention check: PASS\n" : "attention check: FAIL\n");
    if (!ok) throw Exit{1};
  });
}

void add_policies(CLI::App& app) {
  auto* pol = app.add_subcommand("policies", "every policy with its parameters, defaults, memory rule and paper source");
  static bool markdown = false, colors = false;
  pol->add_flag("--markdown", markdown, "print docs/policies.md (the Markdown table generated from the registry)");
  pol->add_flag("--colors", colors, "print plots/policy_colors.json (each policy's figure colour, from the registry)")
      ->excludes("--markdown");
  pol->callback([] { std::cout << (colors ? policy_colors_json() : markdown ? policies_markdown() : policies_text()); });
}

void add_metrics(CLI::App& app) {
  auto* met = app.add_subcommand("metrics", "every metric with its unit, definition and paper source");
  static bool markdown = false;
  met->add_flag("--markdown", markdown, "print docs/metrics.md (generated from the metric registry)");
  met->callback([] {
    if (markdown) {
      std::cout << metrics_markdown();
      return;
    }
    for (const auto& m : metric_registry())
      std::cout << m.name << " [" << m.unit << "]  —  " << m.source << "\n  " << m.description << "\n";
  });
}

}  // namespace

/// "kvsim: error: " (rank 0 or a single process) or "kvsim: error (rank r): " (an MPI worker rank).
std::string error_prefix() {
  return mpi::size() > 1 && mpi::rank() > 0 ? "kvsim: error (rank " + std::to_string(mpi::rank()) + "): " : "kvsim: error: ";
}

int run_main(int argc, char** argv) {
  // glibc serves blocks ≥ 128 KiB-32 MiB by mmap and trims freed heap tops, so every reference block
  // (probabilities of 256 rows × t columns, t changing block to block) came back as fresh pages: page
  // faults cost as much as the block's second GEMM (measured with kvsim bench).
  // Keep freed memory for reuse instead; peak memory is unchanged.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  CLI::App app{"kvsim — KV-cache attention approximation simulator"};
  app.set_version_flag("--version", "kvsim " + kvsim_version() + " (git " + kvsim_git_commit() + "; MPI " +
                                        (mpi::built_with_mpi() ? "yes" : "no") + "; float32 GEMM " + gemm_backend() +
                                        "; float32 reference GEMM " + reference_gemm_backend() + ")");
  app.require_subcommand(1);
  add_run(app);
  add_synth(app);
  add_record(app);
  add_closed_loop(app);
  add_task(app);
  add_clusters(app);
  add_allocate(app);
  add_bench(app);
  add_inspect(app);
  add_policies(app);
  add_metrics(app);
  try {
    app.parse(argc, argv);  // the chosen subcommand's callback runs inside parse()
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {  // bad command line: one line, status 2 like every input error
    std::cerr << error_prefix() << e.what() << " (kvsim --help, kvsim SUBCOMMAND --help)\n";
    return 2;
  } catch (const Exit& e) {
    return e.code;
  } catch (const Error& e) {
    std::cerr << error_prefix() << e.what() << "\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << error_prefix() << "out of memory (an allocation failed outside a replay cell: the recording, "
                 "synthetic stream or result tables are larger than this machine holds)\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "kvsim: internal error: " << e.what() << "\n";
    return 3;
  }
  return 0;
}

int main(int argc, char** argv) {
  mpi::init(&argc, &argv);  // only under an MPI launcher (include/kvsim/replay/mpi.hpp)
  const int rc = run_main(argc, argv);
  if (rc != 0 && mpi::size() > 1) mpi::abort(rc);  // no rank waits for one that failed
  mpi::finalize();
  return rc;
}
