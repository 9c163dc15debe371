// Python bindings: checkpoints, their tokenizers and GGUF dequantization (kvsim.model, docs/python.md).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>

#include "bindings.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/model/gguf.hpp"
#include "kvsim/model/llama.hpp"
#include "kvsim/model/retrieval.hpp"
#include "kvsim/model/tokenizer.hpp"

namespace kvsim::python {
namespace {

/// A loaded checkpoint with its tokenizer (kvsim.model.Model).
struct PyModel {
  LlamaModel model;
  Tokenizer tok;
  PyModel(const std::string& checkpoint, const std::string& tokenizer)
      : model(checkpoint), tok(load_tokenizer(checkpoint, tokenizer, model.config().vocab_size)) {}

  /// Teacher-forced logits [len(tokens), vocab] float32 (row t: the prediction after tokens[0..t]).
  py::array_t<float> logits(const std::vector<int>& tokens) {
    const int V = model.config().vocab_size;
    py::array_t<float> out({py::ssize_t(tokens.size()), py::ssize_t(V)});
    float* o = out.mutable_data();
    py::gil_scoped_release nogil;
    for (size_t t = 0; t < tokens.size(); ++t) {
      const auto& l = model.forward(tokens[t], int(t));
      std::memcpy(o + t * size_t(V), l.data(), size_t(V) * 4);
    }
    return out;
  }

  /// The batched prefill's (LlamaModel::prefill, `kvsim record`'s path) logits of the last `last`
  /// positions, float32 [last, vocab]: row i predicts the token after position len(tokens) − last + i.
  py::array_t<float> prefill_logits(const std::vector<int>& tokens, int last, int threads) {
    const int V = model.config().vocab_size, n = int(tokens.size());
    if (last < 1 || last > n) throw Error("prefill_logits: last = " + std::to_string(last) + " is outside [1, " + std::to_string(n) + "]");
    py::array_t<float> out({py::ssize_t(last), py::ssize_t(V)});
    float* o = out.mutable_data();
    py::gil_scoped_release nogil;
    model.prefill(tokens, std::max(1, threads), nullptr, [&](int r0, const MatF& L) {
      for (int64_t r = 0; r < L.rows(); ++r)
        if (r0 + r >= n - last) std::memcpy(o + size_t(r0 + r - (n - last)) * size_t(V), L.row(r).data(), size_t(V) * 4);
    });
    return out;
  }
};

py::dict config_dict(const LlamaConfig& c) {
  py::dict d;
  d["format"] = c.format_name();
  d["architecture"] = c.architecture;
  d["n_layers"] = c.n_layers;
  d["dim"] = c.dim;
  d["hidden_dim"] = c.hidden_dim;
  d["n_heads"] = c.n_heads;
  d["n_kv_heads"] = c.n_kv_heads;
  d["head_dim"] = c.head_dim();
  d["vocab_size"] = c.vocab_size;
  d["seq_len"] = c.seq_len;
  d["rope_theta"] = c.rope_theta;
  d["rms_eps"] = c.rms_eps;
  d["rope_halves"] = c.rope_halves;
  d["shared_classifier"] = c.shared_classifier;
  d["sha256"] = c.sha256;
  d["tensor_types"] = c.tensor_types;
  return d;
}

}  // namespace

void bind_models(py::module_& m) {
  py::class_<PyModel>(m, "_Model")
      .def(py::init<const std::string&, const std::string&>(), py::arg("checkpoint"), py::arg("tokenizer") = "")
      .def("config", [](const PyModel& p) { return config_dict(p.model.config()); })
      .def("encode", [](const PyModel& p, const std::string& text, bool bos) { return p.tok.encode(text, bos, false); },
           py::arg("text"), py::arg("bos") = false)
      .def("encode_document", [](const PyModel& p, const std::string& text) { return p.tok.encode_document(text); })
      .def("decode", [](const PyModel& p, const std::vector<int>& ids) {
             std::string s;
             for (size_t i = 0; i < ids.size(); ++i) {
               if (ids[i] < 0 || ids[i] >= p.tok.vocab_size()) throw Error("token id " + std::to_string(ids[i]) + " out of range");
               s += p.tok.decode(i ? ids[i - 1] : -1, ids[i]);
             }
             return py::bytes(s);
           })
      .def("bos_id", [](const PyModel& p) { return p.tok.bos_id(); })
      .def("eos_id", [](const PyModel& p) { return p.tok.eos_id(); })
      .def("tokenizer_kind", [](const PyModel& p) { return p.tok.kind_name(); })
      .def("logits", &PyModel::logits, py::arg("tokens"))
      .def("prefill_logits", &PyModel::prefill_logits, py::arg("tokens"), py::arg("last"), py::arg("threads"));

  py::class_<Tokenizer>(m, "_Tokenizer")
      .def(py::init([](const std::string& path) { return Tokenizer(gguf::File(path)); }), py::arg("gguf"))
      .def("encode", [](const Tokenizer& t, const std::string& text, bool bos) { return t.encode(text, bos, false); },
           py::arg("text"), py::arg("bos") = false)
      .def("kind", &Tokenizer::kind_name);

  // `kvsim task`'s scorer, so that another implementation's answers are scored by the same rule.
  m.def("_answer_matches", &answer_matches, py::arg("generated"), py::arg("answer"));
  m.def("_answer_score", &answer_score, py::arg("generated"), py::arg("answers"), py::arg("match"));
  m.def("_wilson_interval", &wilson_interval, py::arg("k"), py::arg("n"));
  m.def(
      "_gguf_dequantize",
      [](uint32_t type, py::bytes data, int64_t n) {
        const std::string b = data;
        const int bv = gguf::block_values(type), bb = gguf::block_bytes(type);
        if (bv == 0) throw Error("GGML type " + gguf::type_name(type) + " cannot be dequantized by kvsim");
        if (n < 0 || n % bv || int64_t(b.size()) != n / bv * bb)
          throw Error("dequantize: " + std::to_string(b.size()) + " bytes do not hold " + std::to_string(n) + " values of type " +
                      gguf::type_name(type));
        py::array_t<float> out(n);
        gguf::dequantize(type, reinterpret_cast<const uint8_t*>(b.data()), n, out.mutable_data());
        return out;
      },
      py::arg("type"), py::arg("data"), py::arg("n"));
  m.def(
      "_gguf_tensors",
      [](const std::string& path) {
        gguf::File f(path);
        py::list out;
        for (const auto& t : f.tensors())
          out.append(py::make_tuple(t.name, t.ne, gguf::type_name(t.type), t.type));
        return out;
      },
      py::arg("path"));
  m.def(
      "_gguf_tensor",
      [](const std::string& path, const std::string& name) {
        gguf::File f(path);
        const gguf::TensorInfo* t = f.find_tensor(name);
        if (!t) throw Error(path + ": no tensor '" + name + "'");
        std::vector<py::ssize_t> shape(t->ne.rbegin(), t->ne.rend());  // numpy order: ne[0] last
        py::array_t<float> out(shape);
        f.read(*t, out.mutable_data());
        return out;
      },
      py::arg("path"), py::arg("name"));
}

}  // namespace kvsim::python
