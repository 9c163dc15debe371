// Python bindings: running an experiment config in memory (kvsim.run) and reading the registries.
// A run takes `kvsim run`'s road (run_config, one RunResult per sequence); its rows stay in memory
// (MemoryRows), and `save(dir)` writes the CLI's files (write_results: the same files ResultSpill
// writes, tests/unit/test_results.cpp) plus sequences.csv for several sequences.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <thread>

#include "bindings.hpp"
#include "kvsim/cli/bench.hpp"
#include "kvsim/core/blas.hpp"
#include "kvsim/cli/config.hpp"
#include "kvsim/cli/run.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/cuda/cuda.hpp"
#include "kvsim/io/files.hpp"
#include "kvsim/io/provenance.hpp"
#include "kvsim/io/results.hpp"
#include "kvsim/policies/registry.hpp"
#include "kvsim/replay/engine.hpp"
#include "kvsim/replay/kept.hpp"
#include "kvsim/replay/metrics.hpp"
#include "kvsim/replay/reference.hpp"

namespace kvsim::python {
namespace {

using ArrF = py::array_t<float, py::array::c_style | py::array::forcecast>;

/// kvsim's float32 exact reference pass (exact_attention_f32, the engine's blocks of 128 steps) over
/// every step of every query head: causal attention of Q [H, n, d] against K, V [H_kv, n, d] (query
/// head h reads KV head h / (H / H_kv)). The (head, block) units are shared by `threads` threads
/// dynamically (later blocks cost more). `window` > 0: a local layer's sliding-window attention (step t
/// reads keys t − window + 1 … t), as the replay's reference for `data.local_layers = "replay"`.
/// Returns (out [H, n, d] float32, seconds of the pass alone: the copies in and out are not timed).
/// For kvsim.compare_torch (issue "performance beside PyTorch") and tests/real_model/gemma3_test.py.
py::tuple exact_causal(const ArrF& q, const ArrF& k, const ArrF& v, double scale, int threads, int64_t window) {
  if (window < 0) throw Error("_exact_causal: window must be >= 0 (0 = every key)");
  if (q.ndim() != 3 || k.ndim() != 3 || v.ndim() != 3)
    throw Error("_exact_causal: q, k and v must be [heads, n, head_dim] arrays");
  const int64_t H = q.shape(0), n = q.shape(1), d = q.shape(2), Hkv = k.shape(0);
  if (n < 1 || Hkv < 1 || H % Hkv != 0 || k.shape(1) != n || k.shape(2) != d || v.shape(0) != Hkv ||
      v.shape(1) != n || v.shape(2) != d)
    throw Error("_exact_causal: shapes must be q [H, n, d], k and v [H_kv, n, d] with H a multiple of H_kv");
  auto copy = [&](const ArrF& a, int64_t h) { return MatF(Eigen::Map<const MatF>(a.data() + h * n * d, n, d)); };
  std::vector<MatF> Q, K, V;
  for (int64_t h = 0; h < H; ++h) Q.push_back(copy(q, h));
  for (int64_t h = 0; h < Hkv; ++h) K.push_back(copy(k, h)), V.push_back(copy(v, h));
  std::vector<int64_t> steps(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) steps[size_t(t)] = t + 1;
  std::vector<std::pair<size_t, size_t>> blocks;
  for (size_t b0 = 0; b0 < steps.size();) {
    const size_t b1 = reference_block_end(steps, b0, kReferenceRowsF32);
    blocks.emplace_back(b0, b1);
    b0 = b1;
  }
  py::array_t<float> out({py::ssize_t(H), py::ssize_t(n), py::ssize_t(d)});
  float* o = out.mutable_data();
  std::atomic<size_t> next{0};
  const size_t units = size_t(H) * blocks.size();
  double seconds = 0;
  {
    py::gil_scoped_release release;
    auto work = [&] {
      ReferenceBlock blk;
      for (size_t u; (u = next++) < units;) {
        const int64_t h = int64_t(u / blocks.size());
        const auto [b0, b1] = blocks[u % blocks.size()];
        const std::vector<int64_t> block(steps.begin() + int64_t(b0), steps.begin() + int64_t(b1));
        const int64_t g = h / (H / Hkv);
        exact_attention_f32(Q[size_t(h)], K[size_t(g)], V[size_t(g)], scale, block, blk, window);
        Eigen::Map<MatF>(o + (h * n + int64_t(b0)) * d, int64_t(b1 - b0), d) = blk.out.cast<float>();
      }
    };
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 1; t < std::max(1, threads); ++t) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return py::make_tuple(out, seconds);
}

/// A finished run: the experiment, and per sequence its single-sequence experiment and result.
struct PyRun {
  Experiment ex;
  std::vector<Experiment> seq_ex;
  std::vector<RunResult> runs;

  const RunResult& at(int s) const {
    if (s < 0 || s >= int(runs.size()))
      throw Error("sequence " + std::to_string(s) + " out of range [0, " + std::to_string(runs.size()) + ")");
    return runs[size_t(s)];
  }
};

/// kvsim.run's output (run_config's SequenceOutput): every sequence's rows kept in memory.
class InMemory final : public SequenceOutput {
 public:
  explicit InMemory(PyRun& run) : run_(run) {}
  RowSink* open(const Experiment&, int, int, const StreamSource&) override { return &rows_; }
  void close(const Experiment& one, int, RunResult&& r) override {
    rows_.take(r.policies);
    run_.runs.push_back(std::move(r));
    run_.seq_ex.push_back(one);
  }

 private:
  PyRun& run_;
  MemoryRows rows_;
};

/// Replays `ex` (all sequences) on `threads` workers with the GIL released (Python policies take it
/// back for each call; C++ policies run in parallel): the road `kvsim run` takes (run_config).
std::unique_ptr<PyRun> run_experiment_in_memory(Experiment ex, int threads) {
  if (ex.eval.device == Device::cuda) cuda::require_device();
  struct InFlight {
    InFlight() { ++runs_in_flight(); }
    ~InFlight() { --runs_in_flight(); }
  } in_flight;
  auto out = std::make_unique<PyRun>();
  const int nt = threads > 0 ? threads : int(std::max(1u, std::thread::hardware_concurrency()));
  {
    py::gil_scoped_release release;
    InMemory output(*out);
    run_config(ex, nt, output);
  }
  out->ex = std::move(ex);
  return out;
}

/// One policy's rows of sequence `s` as columns: layer, head, step, then every metric of the run.
py::dict columns(const PyRun& r, int s, int p) {
  const RunResult& rr = r.at(s);
  if (p < 0 || p >= int(rr.policies.size())) throw Error("policy index " + std::to_string(p) + " out of range");
  const auto& rows = rr.policies[size_t(p)].rows;
  const py::ssize_t n = py::ssize_t(rows.size());
  py::array_t<int32_t> layer(n), head(n);
  py::array_t<int64_t> step(n);
  auto L = layer.mutable_unchecked<1>();
  auto H = head.mutable_unchecked<1>();
  auto T = step.mutable_unchecked<1>();
  for (py::ssize_t i = 0; i < n; ++i) {
    L(i) = rows[size_t(i)].layer;
    H(i) = rows[size_t(i)].head;
    T(i) = rows[size_t(i)].step;
  }
  py::dict d;
  d["layer"] = layer;
  d["head"] = head;
  d["step"] = step;
  for (const auto& m : rr.metrics) {
    py::array_t<double> col(n);
    auto C = col.mutable_unchecked<1>();
    for (py::ssize_t i = 0; i < n; ++i) C(i) = rows[size_t(i)][m.index];
    d[py::str(m.name)] = col;
  }
  return d;
}

std::string summary_text(const PyRun& r, int s, bool per_head) {
  std::ostringstream o;
  if (per_head) write_cells_csv(r.at(s), o);
  else write_summary_csv(r.at(s), o);
  return o.str();
}

std::string sequences_text(const PyRun& r) {
  std::vector<std::vector<std::vector<Stat>>> overall;
  for (const auto& rr : r.runs) overall.push_back(overall_stats(rr));
  return sequences_csv(r.ex, r.runs.front().metrics, overall);
}

/// The CLI's files: one sequence → results.h5, summary.csv, cells.csv in `dir`; several → each in
/// dir/seq_NN/ and dir/sequences.csv.
void save(const PyRun& r, const std::string& dir) {
  if (r.runs.size() == 1) {
    write_results(r.runs[0], r.ex, dir);
    return;
  }
  for (size_t i = 0; i < r.runs.size(); ++i)
    write_results(r.runs[i], r.seq_ex[i], (std::filesystem::path(dir) / sequence_folder(int(i))).string());
  write_file_atomically((std::filesystem::path(dir) / "sequences.csv").string(), sequences_text(r));
}

py::list policy_specs(const PyRun& r) {
  py::list out;
  for (const auto& p : r.ex.policies) {
    py::dict params;
    for (const auto& [k, v] : p.params.values()) std::visit([&](const auto& x) { params[py::str(k)] = x; }, v);
    py::dict d;
    d["name"] = p.name;
    d["label"] = p.label;
    d["params"] = params;
    out.append(d);
  }
  return out;
}

py::list metric_list() {
  py::list out;
  for (const auto& m : metric_registry()) {
    py::dict d;
    d["name"] = m.name;
    d["unit"] = m.unit;
    d["description"] = m.description;
    d["source"] = m.source;
    out.append(d);
  }
  return out;
}

py::list policy_list() {
  py::list out;
  for (const auto* p : policy_registry()) {
    py::list params;
    for (const auto& q : p->params) {
      py::dict pd;
      pd["name"] = q.name;
      pd["kind"] = q.kind;
      pd["default"] = q.default_value;
      pd["doc"] = q.doc;
      pd["range"] = q.range;
      params.append(pd);
    }
    py::dict d;
    d["name"] = p->name;
    d["summary"] = p->summary;
    d["source"] = p->source;
    d["params"] = params;
    d["memory"] = p->memory ? p->memory->doc : std::string("refused (keeps the whole stream)");
    d["gpu"] = p->gpu;
    out.append(d);
  }
  return out;
}

py::dict meta_dict(const RecordingMeta& m) {
  py::dict d;
  d["model"] = m.model;
  d["source"] = m.source;
  d["rope"] = m.rope;
  d["n_layers"] = m.n_layers;
  d["n_heads"] = m.n_heads;
  d["n_kv_heads"] = m.n_kv_heads;
  d["head_dim"] = m.head_dim;
  d["n_tokens"] = m.n_tokens;
  d["softmax_scale"] = m.softmax_scale;
  if (m.rope_theta > 0) {  // the optional RoPE attributes (docs/recordings.md)
    d["rope_theta"] = m.rope_theta;
    d["rope_pairs"] = m.rope_halves ? "halves" : "adjacent";
  }
  if (!m.layer_windows.empty()) d["layer_windows"] = m.layer_windows;
  return d;
}

}  // namespace

std::atomic<int>& runs_in_flight() {
  static std::atomic<int> n{0};
  return n;
}

py::dict recording_meta_dict(const RecordingMeta& m) { return meta_dict(m); }

void bind_run(py::module_& m) {
  py::class_<PyRun>(m, "_Run")
      .def_property_readonly("sequences", [](const PyRun& r) { return int(r.runs.size()); })
      .def_property_readonly("name", [](const PyRun& r) { return r.ex.name; })
      .def_property_readonly("seed", [](const PyRun& r) { return r.ex.seed; })
      .def_property_readonly("config_text", [](const PyRun& r) { return r.ex.config_text; })
      .def_property_readonly("resolved_config", [](const PyRun& r) { return r.ex.resolved_text; })
      .def_property_readonly("policies", &policy_specs)
      .def("meta", [](const PyRun& r, int s) { return meta_dict(r.at(s).meta); })
      .def("source", [](const PyRun& r, int s) { return r.at(s).source; })
      .def("wall_seconds", [](const PyRun& r, int s) { return r.at(s).wall_seconds; })
      .def("threads", [](const PyRun& r, int s) { return r.at(s).threads; })
      .def("n_tokens", [](const PyRun& r, int s) { return r.at(s).n_tokens; })
      .def("columns", &columns)
      .def("summary_csv", [](const PyRun& r, int s) { return summary_text(r, s, false); })
      .def("cells_csv", [](const PyRun& r, int s) { return summary_text(r, s, true); })
      .def("sequences_csv", &sequences_text)
      .def("table", [](const PyRun& r, int s) { return summary_table(r.at(s)); })
      .def("save", [](const PyRun& r, const std::string& dir) {
        py::gil_scoped_release release;
        save(r, dir);
      });
  m.def(
      "_run",
      [](const std::string& config, bool is_path, const std::vector<std::string>& sets, int threads) {
        Experiment ex = is_path ? load_experiment(config, sets) : parse_experiment(config, "config dict", sets);
        return run_experiment_in_memory(std::move(ex), threads);
      },
      py::arg("config"), py::arg("is_path"), py::arg("sets"), py::arg("threads"));
  m.def(
      "_kept",
      [](const std::string& config, bool is_path, const std::vector<std::string>& sets,
         std::vector<std::pair<int, int>> cells, size_t policy, int64_t t) {
        Experiment ex = is_path ? load_experiment(config, sets) : parse_experiment(config, "config dict", sets);
        auto src = open_source(ex.data);
        if (cells.empty())  // every (layer, KV head) of the stream
          for (int l = 0; l < src->meta().n_layers; ++l)
            for (int h = 0; h < src->meta().n_kv_heads; ++h) cells.emplace_back(l, h);
        std::vector<std::pair<std::pair<int, int>, std::vector<std::vector<int64_t>>>> out;
        for (const auto& [l, h] : cells) out.emplace_back(std::make_pair(l, h), kept_tokens(ex, *src, l, h, policy, t));
        return out;
      },
      py::arg("config"), py::arg("is_path"), py::arg("sets"), py::arg("cells"), py::arg("policy"), py::arg("t"));
  m.def("_policies", &policy_list);
  m.def("_metrics", &metric_list);
  m.def("_version", [] { return kvsim_version(); });
  m.def("_git_commit", [] { return kvsim_git_commit(); });
  m.def(
      "_gemm_gflops",
      [](int n, bool f32) {
        py::gil_scoped_release release;
        return gemm_gflops(n, f32);
      },
      py::arg("n"), py::arg("f32"));
  m.def(
      "_reference_gemm_gflops",
      [](int n) {
        py::gil_scoped_release release;
        return reference_gemm_gflops(n);
      },
      py::arg("n"));
  m.def("_gemm_backend", [] { return reference_gemm_backend(); });
  m.def("_exact_causal", &exact_causal, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scale"),
        py::arg("threads"), py::arg("window") = 0);
}

}  // namespace kvsim::python
