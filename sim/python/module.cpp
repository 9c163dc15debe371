// kvsim's Python extension module `kvsim._kvsim` (pybind11): the C++ engine behind the `kvsim`
// package (sim/python/kvsim/, docs/python.md). kvsim::Error becomes the Python exception
// kvsim.Error with the message the CLI prints after "kvsim: error: ".
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "kvsim/core/error.hpp"

PYBIND11_MODULE(_kvsim, m) {
  m.doc() = "kvsim's C++ engine (use the `kvsim` package, not this module)";
  pybind11::register_exception<kvsim::Error>(m, "Error", PyExc_RuntimeError);
  kvsim::python::bind_run(m);
  kvsim::python::bind_sources(m);
  kvsim::python::bind_policies(m);
  kvsim::python::bind_models(m);
}
