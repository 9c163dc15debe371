// Python bindings: policies written in Python (kvsim.Policy, kvsim.register_policy) and the exact
// attention kernel they may call (kvsim.attend).
//
// A registered Python class becomes a PolicyInfo in the C++ registry: configs name it like a
// built-in policy, `memory = M` maps to its declared token parameter, and the engine replays it with
// every metric. Each call into Python (construction, observe, attend, cache_tokens, ...) takes the
// GIL, so Python policies of different cells run one at a time while C++ policies keep their
// threads; a Python exception becomes kvsim::Error naming the policy, the exception and where it was
// raised.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstring>

#include "bindings.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/policies/registry.hpp"

namespace kvsim::python {
namespace {

/// "ValueError: message (file.py:12 in attend)" for the Python exception being handled.
std::string describe(py::error_already_set& e) {
  std::string msg = py::str(e.type().attr("__name__")).cast<std::string>() + ": " + py::str(e.value()).cast<std::string>();
  try {
    if (e.trace() && !e.trace().is_none()) {
      py::list frames = py::module_::import("traceback").attr("extract_tb")(e.trace());
      if (!frames.empty()) {
        py::object last = frames[frames.size() - 1];
        msg += " (" + py::str(last.attr("filename")).cast<std::string>() + ":" + py::str(last.attr("lineno")).cast<std::string>() +
               " in " + py::str(last.attr("name")).cast<std::string>() + ")";
      }
    }
  } catch (py::error_already_set&) {
  }
  return msg;
}

/// Runs `f` holding the GIL; Python errors become kvsim::Error("policy 'name': ...").
template <class F>
auto with_gil(const std::string& name, F&& f) {
  py::gil_scoped_acquire gil;
  try {
    return f();
  } catch (py::error_already_set& e) {
    throw Error("policy '" + name + "': " + describe(e));
  } catch (const py::cast_error& e) {
    throw Error("policy '" + name + "': " + e.what());
  }
}

using ArrD = py::array_t<double, py::array::c_style | py::array::forcecast>;
using ArrI = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

/// A Python policy instance behind the C++ Policy interface.
class PyPolicy final : public Policy {
 public:
  PyPolicy(std::string name, py::object obj, int d, int G, bool every, bool capacity)
      : name_(std::move(name)), obj_(std::move(obj)), d_(d), G_(G), every_(every), capacity_(capacity) {}
  ~PyPolicy() override {
    py::gil_scoped_acquire gil;
    obj_ = py::object();
  }
  void observe(int64_t i, const float* k, const float* v) override {
    with_gil(name_, [&] {
      py::array_t<float> K(d_, k), V(d_, v);  // copies: the policy may keep them
      obj_.attr("observe")(i, K, V);
    });
  }
  void attend(int64_t t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    if (!out && !every_) return;
    with_gil(name_, [&] {
      ArrD Q({py::ssize_t(q.rows()), py::ssize_t(q.cols())});
      std::memcpy(Q.mutable_data(), q.data(), sizeof(double) * size_t(q.size()));
      py::object r = obj_.attr("attend")(t, Q);
      if (out) to_answers(r, t, *out);
    });
  }
  bool needs_every_query() const override { return every_; }
  bool capacity_matched() const override { return capacity_; }
  int64_t cache_tokens() const override {
    return with_gil(name_, [&] { return obj_.attr("cache_tokens")().cast<int64_t>(); });
  }
  int64_t cache_vectors() const override {
    return with_gil(name_, [&] { return obj_.attr("cache_vectors")().cast<int64_t>(); });
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw Error("policy '" + name_ + "': attend() " + what); }

  /// Converts attend()'s return value: one kvsim.Answer (z [d] for one query head, [G, d] for the
  /// group: log_tau then a float or [G], kept shared), or a list of G of them.
  void to_answers(const py::object& r, int64_t t, std::vector<Answer>& out) const {
    const int G = int(out.size());
    if (py::isinstance<py::list>(r) || py::isinstance<py::tuple>(r)) {
      py::sequence seq = r;
      if (int(seq.size()) != G) fail("returned " + std::to_string(seq.size()) + " answers for " + std::to_string(G) + " query heads");
      for (int g = 0; g < G; ++g) fill(seq[size_t(g)], t, out, g, g + 1);
      return;
    }
    fill(r, t, out, 0, G);
  }

  void fill(const py::handle& a, int64_t t, std::vector<Answer>& out, int g0, int g1) const {
    if (!py::hasattr(a, "z")) fail("must return a kvsim.Answer (or a list of one per query head)");
    const ArrD z = ArrD::ensure(a.attr("z"));
    if (!z) fail("answer z is not a float array");
    const int rows = g1 - g0;
    const bool flat = z.ndim() == 1 && rows == 1 && z.shape(0) == d_;
    if (!flat && !(z.ndim() == 2 && z.shape(0) == rows && z.shape(1) == d_))
      fail("answer z has the wrong shape (want [" + (rows == 1 ? std::to_string(d_) + "] or [1, " : std::to_string(rows) + ", ") +
           std::to_string(d_) + "])");
    std::vector<double> log_tau(size_t(rows), std::nan(""));
    const py::object lt = a.attr("log_tau");
    if (!lt.is_none()) {
      const ArrD l = ArrD::ensure(lt);
      if (!l || l.size() != rows) fail("answer log_tau must be None or one value per query head (" + std::to_string(rows) + ")");
      for (int g = 0; g < rows; ++g) log_tau[size_t(g)] = l.data()[g];
    }
    std::vector<int64_t> kept;
    const py::object kp = a.attr("kept");
    if (!kp.is_none()) {
      const ArrI k = ArrI::ensure(kp);
      if (!k || k.ndim() != 1) fail("answer kept must be None or a 1-D array of token indices");
      std::vector<char> seen(size_t(t), 0);
      for (py::ssize_t j = 0; j < k.size(); ++j) {
        const int64_t i = k.data()[j];
        if (i < 0 || i >= t) fail("answer kept holds token " + std::to_string(i) + ", outside the " + std::to_string(t) + " observed");
        if (seen[size_t(i)]++) fail("answer kept holds token " + std::to_string(i) + " twice");
        kept.push_back(i);
      }
    }
    for (int g = 0; g < rows; ++g) {
      Answer& ans = out[size_t(g0 + g)];
      ans.z = Eigen::Map<const VecD>(z.data() + size_t(g) * size_t(d_), d_);
      ans.log_tau = log_tau[size_t(g)];
      ans.has_kept = !kp.is_none();
      ans.kept = kept;
    }
  }

  std::string name_;
  py::object obj_;
  int d_, G_;
  bool every_, capacity_;
};

/// One declared parameter of a Python policy (kvsim.Param).
struct PyParam {
  ParamInfo info;
  std::optional<ParamValue> def;  ///< nullopt = required
};

ParamValue to_param_value(const py::handle& v, const std::string& where) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>();
  if (py::isinstance<py::int_>(v)) return v.cast<int64_t>();
  if (py::isinstance<py::float_>(v)) return v.cast<double>();
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  throw Error(where + ": a default must be an int, float, bool or str");
}

/// Reads the declared parameters from `p` (marking them used) as keyword arguments.
py::dict read_params(const std::vector<PyParam>& decl, ParamReader& p, const StreamInfo& s) {
  std::vector<std::pair<std::string, ParamValue>> vals;
  for (const auto& d : decl) {
    const std::string& k = d.info.name;
    if (!p.has(k) && !d.def) throw Error("parameter '" + k + "' is required");
    const std::string& kind = d.info.kind;
    if (kind == "tokens") {
      vals.emplace_back(k, p.get_budget(k, s.n, d.def ? std::get<int64_t>(*d.def) : -1));
    } else if (kind == "int") {
      vals.emplace_back(k, p.get_int(k, d.def ? std::get<int64_t>(*d.def) : 0));
    } else if (kind == "float") {
      vals.emplace_back(k, p.get_double(k, d.def ? std::get<double>(*d.def) : 0.0));
    } else if (kind == "bool") {
      vals.emplace_back(k, p.get_bool(k, d.def ? std::get<bool>(*d.def) : false));
    } else {
      vals.emplace_back(k, p.get_string(k, d.def ? std::get<std::string>(*d.def) : std::string()));
    }
  }
  py::dict kw;
  for (const auto& [k, v] : vals) std::visit([&](const auto& x) { kw[py::str(k)] = x; }, v);
  return kw;
}

/// Registers class `cls` (leaked on purpose: the registry outlives the interpreter's teardown).
void register_python_policy(const std::string& name, py::object cls, const std::vector<py::tuple>& params,
                            const std::string& memory_param, bool capacity, const std::string& summary,
                            const std::string& source) {
  if (runs_in_flight() > 0)
    throw Error("kvsim.register_policy('" + name + "'): a kvsim.run is in progress in another thread (register before running)");
  auto decl = std::make_shared<std::vector<PyParam>>();
  bool memory_ok = memory_param.empty();
  for (const auto& t : params) {
    PyParam d;
    d.info.name = t[0].cast<std::string>();
    d.info.kind = t[1].cast<std::string>();
    d.info.doc = t[3].cast<std::string>();
    if (t.size() > 4) d.info.range = t[4].cast<std::string>();
    const std::string where = "kvsim.register_policy('" + name + "'): parameter '" + d.info.name + "'";
    const std::vector<std::string> kinds{"tokens", "int", "float", "bool", "string"};
    if (std::find(kinds.begin(), kinds.end(), d.info.kind) == kinds.end())
      throw Error(where + ": kind must be tokens, int, float, bool or string");
    if (!t[2].is_none()) {
      ParamValue v = to_param_value(t[2], where);
      if (d.info.kind == "float" && std::holds_alternative<int64_t>(v)) v = double(std::get<int64_t>(v));
      const bool ok = (d.info.kind == "tokens" || d.info.kind == "int") ? std::holds_alternative<int64_t>(v)
                      : d.info.kind == "float"                        ? std::holds_alternative<double>(v)
                      : d.info.kind == "bool"                         ? std::holds_alternative<bool>(v)
                                                                      : std::holds_alternative<std::string>(v);
      if (!ok) throw Error(where + ": the default does not match kind " + d.info.kind);
      d.def = v;
    }
    d.info.default_value = d.def ? param_to_string(*d.def) : "required";
    if (d.info.name == memory_param) {
      if (d.info.kind != "tokens") throw Error(where + ": the memory parameter must be of kind tokens");
      memory_ok = true;
    }
    decl->push_back(std::move(d));
  }
  if (!memory_ok) throw Error("kvsim.register_policy('" + name + "'): memory names '" + memory_param + "', not a declared parameter");
  PyObject* cls_ptr = cls.release().ptr();
  PolicyInfo info;
  info.name = name;
  info.summary = summary;
  info.source = source;
  for (const auto& d : *decl) info.params.push_back(d.info);
  info.gpu = "no (Python)";
  info.make = [name, cls_ptr, decl, capacity](ParamReader& p, const StreamInfo& s) -> std::unique_ptr<Policy> {
    return with_gil(name, [&]() -> std::unique_ptr<Policy> {
      py::dict kw = read_params(*decl, p, s);
      py::object obj = py::reinterpret_borrow<py::object>(cls_ptr)(py::cast(s), **kw);
      const bool every = obj.attr("needs_every_query").cast<bool>();
      return std::make_unique<PyPolicy>(name, std::move(obj), s.head_dim, s.n_queries, every, capacity);
    });
  };
  if (!memory_param.empty())
    info.memory = MemoryRule{memory_param + " = M (min(M, t) tokens at every step" + std::string(capacity ? ", as a capacity)" : ")"),
                             {memory_param},
                             [memory_param](int64_t M, const Params&, Params& out, const std::string& where) {
                               out.set(memory_param, M, where);
                             }};
  register_policy(std::move(info));
}

}  // namespace

void bind_policies(py::module_& m) {
  py::class_<StreamInfo>(m, "Stream", "What a policy instance is built for: one (layer, KV or query head) cache.")
      .def_readonly("n", &StreamInfo::n, "tokens in the stream (budgets given as fractions are of n)")
      .def_readonly("head_dim", &StreamInfo::head_dim)
      .def_readonly("n_queries", &StreamInfo::n_queries, "query heads this cache answers (the GQA group size in kv_head mode)")
      .def_property_readonly(
          "group_agg", [](const StreamInfo& s) { return std::string(to_string(s.group_agg)); },
          "\"mean\", \"max\" or \"sum\": how the group's scores combine")
      .def_readonly("seed", &StreamInfo::seed, "this instance's seed (config seed, layer, head, policy)")
      .def_readonly("prefill", &StreamInfo::prefill, "prompt tokens handed over before decoding (0: none)")
      .def_readonly("layer", &StreamInfo::layer)
      .def_readonly("kv_head", &StreamInfo::kv_head, "this cache's KV head (in query_head mode, its query head's)")
      .def_readonly("n_layers", &StreamInfo::n_layers)
      .def("__repr__", [](const StreamInfo& s) {
        return "kvsim.Stream(n=" + std::to_string(s.n) + ", head_dim=" + std::to_string(s.head_dim) +
               ", n_queries=" + std::to_string(s.n_queries) + ", layer=" + std::to_string(s.layer) + ")";
      });
  m.def("_register_policy", &register_python_policy, py::arg("name"), py::arg("cls"), py::arg("params"),
        py::arg("memory_param"), py::arg("capacity"), py::arg("summary"), py::arg("source"));
  m.def(
      "_attend",
      [](const ArrD& keys, const ArrD& values, const ArrD& q) {
        if (keys.ndim() != 2 || values.ndim() != 2 || q.ndim() != 2 || keys.shape(0) != values.shape(0) ||
            keys.shape(1) != q.shape(1) || values.shape(1) != q.shape(1))
          throw Error("kvsim.attend: keys [m, d], values [m, d] and q [G, d] must agree in m and d");
        const Eigen::Index m_ = keys.shape(0), d = keys.shape(1), G = q.shape(0);
        const MatD K = Eigen::Map<const MatD>(keys.data(), m_, d), V = Eigen::Map<const MatD>(values.data(), m_, d);
        const MatD Q = Eigen::Map<const MatD>(q.data(), G, d);
        ProbsD Pc;
        MatD Z;
        VecD ls;
        attend_cached_group(K, V, m_, Q, Pc, Z, ls);
        const MatD P = Pc;  // [m, G] row-major, as the array below is laid out
        ArrD z({py::ssize_t(G), py::ssize_t(d)}), p({py::ssize_t(m_), py::ssize_t(G)}), l(std::vector<py::ssize_t>{py::ssize_t(G)});
        if (Z.size()) std::memcpy(z.mutable_data(), Z.data(), sizeof(double) * size_t(Z.size()));
        if (P.size()) std::memcpy(p.mutable_data(), P.data(), sizeof(double) * size_t(P.size()));
        std::memcpy(l.mutable_data(), ls.data(), sizeof(double) * size_t(G));
        return py::make_tuple(z, p, l);
      },
      py::arg("keys"), py::arg("values"), py::arg("q"));
}

}  // namespace kvsim::python
