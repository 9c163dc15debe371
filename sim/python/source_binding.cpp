// Python bindings: recordings and synthetic streams as numpy arrays (kvsim.Recording, kvsim.synth).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>

#include "bindings.hpp"
#include "kvsim/cli/config.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/io/recording.hpp"
#include "kvsim/io/synth.hpp"

namespace kvsim::python {
namespace {

/// A stream source: a recording file or a synthetic preset (generated on demand, never stored).
struct PySource {
  std::shared_ptr<StreamSource> src;
  std::string path;  ///< the recording file ("" for a synthetic stream)

  /// One head of one layer, [n_tokens, head_dim] float32; `which` is "q", "k", "v" or "attn".
  py::array_t<float> read(int layer, const std::string& which, int head) const {
    const RecordingMeta& m = src->meta();
    Tensor t;
    if (which == "q") t = Tensor::q;
    else if (which == "k") t = Tensor::k;
    else if (which == "v") t = Tensor::v;
    else if (which == "attn") t = Tensor::attn;
    else throw Error("tensor must be \"q\", \"k\", \"v\" or \"attn\", not \"" + which + "\"");
    const bool query = t == Tensor::q || t == Tensor::attn;
    const int heads = query ? m.n_heads : m.n_kv_heads;
    if (layer < 0 || layer >= m.n_layers)
      throw Error(describe() + ": layer " + std::to_string(layer) + " out of range [0, " + std::to_string(m.n_layers) + ")");
    if (head < 0 || head >= heads)
      throw Error(describe() + ": " + std::string(query ? "query" : "kv") + " head " + std::to_string(head) +
                  " out of range [0, " + std::to_string(heads) + ")");
    if (t == Tensor::attn) {
      auto* rec = dynamic_cast<const RecordingReader*>(src.get());
      if (!rec || !rec->has(layer, t)) throw Error(describe() + ": no recorded attention output (attn) for layer " + std::to_string(layer));
    }
    MatF a;
    {
      py::gil_scoped_release release;
      a = src->read(layer, t, head);
    }
    py::array_t<float> out({py::ssize_t(a.rows()), py::ssize_t(a.cols())});
    std::memcpy(out.mutable_data(), a.data(), sizeof(float) * size_t(a.size()));
    return out;
  }
  std::string describe() const { return src->describe(); }
};

}  // namespace

void bind_sources(py::module_& m) {
  py::class_<PySource>(m, "_Source")
      .def("read", &PySource::read, py::arg("layer"), py::arg("which"), py::arg("head"))
      .def("meta", [](const PySource& s) { return recording_meta_dict(s.src->meta()); })
      .def("describe", &PySource::describe)
      .def_readonly("path", &PySource::path)
      .def("tokens", [](const PySource& s) {
        auto* rec = dynamic_cast<const RecordingReader*>(s.src.get());
        std::vector<int32_t> t = rec ? rec->tokens() : std::vector<int32_t>{};
        py::array_t<int32_t> out(py::ssize_t(t.size()));
        if (!t.empty()) std::memcpy(out.mutable_data(), t.data(), sizeof(int32_t) * t.size());
        return out;
      });
  m.def("_open_recording", [](const std::string& path) {
    PySource s;
    s.src = std::make_shared<RecordingReader>(path);
    s.path = path;
    return s;
  });
  // `config` is a config's text whose [data] table names the synthetic preset (kvsim.synth builds
  // it), so the preset's parameters are validated and named exactly as in experiment configs.
  m.def("_synth", [](const std::string& config, const std::string& path) {
    const Experiment ex = parse_experiment(config, "kvsim.synth");
    PySource s;
    auto synth = std::make_shared<SynthSource>(ex.data.synth);
    if (path.empty()) {
      s.src = synth;
      return s;
    }
    {
      py::gil_scoped_release release;
      write_synthetic(*synth, path);
    }
    s.src = std::make_shared<RecordingReader>(path);
    s.path = path;
    return s;
  });
}

}  // namespace kvsim::python
