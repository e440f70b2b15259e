// torch_tern._C's compiler functions: a graph spec built in Python
// (torch_tern/compiler/_frontend.py) becomes the compiler's graph, checked by
// its shape and dtype inference, and is written as a graph file or compiled
// into an executable.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace torch_tern {

// Adds _compiler_write_graph(spec, path), _compiler_compile(spec, path,
// graph_path) -> stats dict and _compiler_known_ops() to the module.
// Thread-safety: called once, at module init.
void RegisterCompilerBindings(pybind11::module& module);

}  // namespace torch_tern
