// Internal: the pieces of kvsim's Python extension module `kvsim._kvsim` (sim/python/module.cpp).
// The public Python API is the package sim/python/kvsim/ (docs/python.md); these functions bind the
// C++ engine, result writers, recordings and policy registry it calls.
#pragma once
#include <pybind11/pybind11.h>

#include <atomic>

namespace kvsim {
struct RecordingMeta;
}

namespace kvsim::python {
namespace py = pybind11;

/// kvsim.run calls replaying now (in other Python threads): the registry is not changed meanwhile.
std::atomic<int>& runs_in_flight();

/// A recording's attributes as a dict (kvsim.Recording.meta, Results.meta).
py::dict recording_meta_dict(const RecordingMeta& m);

/// `_run`, the in-memory result (`_Run`), `_policies`, `_metrics`, `_version`.
void bind_run(py::module_& m);
/// `_Source` (a recording or a synthetic stream), `_open_recording`, `_synth`.
void bind_sources(py::module_& m);
/// `Stream` (what a policy instance is built for), `_register_policy`, `attend`.
void bind_policies(py::module_& m);
/// `_Model` (a checkpoint and its tokenizer), `_gguf_dequantize`, `_gguf_tensors`, `_gguf_tensor`.
void bind_models(py::module_& m);

}  // namespace kvsim::python
